"""The torch adapter's first-use build (tripwire/_adapter_build.py, docs/install.md).

Fast tests drive the build with a stand-in compiler (a script that writes a file where the module
would go and logs each call): the cache key, the lock between processes, a corrupt or stale cache,
a cache directory others can write, a failing compiler, no compiler, the off switch. Real builds:
the suite's own loading of the adapter from the cache, ``doctor``, and (``install``, minutes) the
other install order: tripwire first into a fresh virtual environment, torch after.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import types
from pathlib import Path

import pytest

from tripwire import _adapter_build as ab

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[3]
FAKE_CXX = """\
#!{python}
import os, pathlib, sys, time
args = sys.argv[1:]
if "--version" in args:
    print("fake-c++ 1.0")
    sys.exit(0)
with open(os.environ["FAKE_CXX_LOG"], "a") as f:
    f.write(" ".join(args) + "\\n")
time.sleep(float(os.environ.get("FAKE_CXX_SLEEP", "0")))
if os.environ.get("FAKE_CXX_FAIL") == "signal":
    os.kill(os.getpid(), 9)
if os.environ.get("FAKE_CXX_FAIL"):
    print("fake.cpp:1:1: error: the stand-in compiler was told to fail", file=sys.stderr)
    sys.exit(1)
pathlib.Path(args[args.index("-o") + 1]).write_bytes(b"not a module " + os.urandom(16))
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A private cache directory and the stand-in compiler as $CXX; returns (cache, log)."""
    cache = tmp_path / "cache"
    log = tmp_path / "cxx.log"
    log.touch()
    cxx = tmp_path / "fake-c++"
    cxx.write_text(FAKE_CXX.format(python=sys.executable))
    cxx.chmod(0o755)
    monkeypatch.setenv("TRIPWIRE_CACHE_DIR", str(cache))
    monkeypatch.setenv("CXX", str(cxx))
    monkeypatch.setenv("FAKE_CXX_LOG", str(log))
    monkeypatch.delenv("FAKE_CXX_FAIL", raising=False)
    return cache, log


def calls(log: Path) -> int:
    return len(log.read_text().splitlines())


def build(**kw) -> ab.Build:
    return ab.ensure_built(torch, announce=io.StringIO(), **kw)


def fake_torch(**changes) -> types.SimpleNamespace:
    fields = {
        "__version__": "2.13.0+cpu",
        "git": "cf30153c",
        "cuda": None,
        "hip": None,
        "abi": True,
    }
    fields.update(changes)
    return types.SimpleNamespace(
        __version__=fields["__version__"],
        version=types.SimpleNamespace(git_version=fields["git"], cuda=fields["cuda"], hip=fields["hip"]),
        _C=types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=fields["abi"]),
    )


def test_the_key_covers_every_input(tmp_path) -> None:
    """Each input the module's code depends on gives another build directory; equal inputs the same."""
    root = ab.source_root()
    assert root is not None
    base = ab.key_name(ab.build_key(fake_torch(), root))
    assert base == ab.key_name(ab.build_key(fake_torch(), root))
    assert base.startswith("torch-2.13.0+cpu-" + sys.implementation.cache_tag + "-")
    others = [
        fake_torch(__version__="2.13.1+cpu"),
        fake_torch(git="0123abcd"),
        fake_torch(cuda="12.4"),
        fake_torch(hip="6.2"),
        fake_torch(abi=False),
    ]
    names = {ab.key_name(ab.build_key(t, root)) for t in others}
    assert len(names) == len(others) and base not in names
    # The sources: one byte of the header changes the key.
    copy = tmp_path / "src"
    for rel in ab._SOURCES:
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_bytes((root / rel).read_bytes())
    assert ab.key_name(ab.build_key(fake_torch(), copy)) == base
    header = copy / "runtime/tensors/adapter_abi.h"
    header.write_bytes(header.read_bytes() + b"\n")
    assert ab.key_name(ab.build_key(fake_torch(), copy)) != base
    # tripwire's own version.
    import tripwire

    key = ab.build_key(fake_torch(), root)
    assert key["tripwire"] == tripwire.__version__ and key["python"] == sys.implementation.cache_tag


@pytest.mark.parametrize("version", ['2.13.0"; int evil', "2.13.0\\", "2.13.0\n", "", "x" * 65])
def test_a_version_that_is_not_plain_is_refused_before_it_becomes_a_c_literal(fake, version) -> None:
    """torch.__version__ is pasted into -DTRIPWIRE_TORCH_VERSION="...": nothing may end the literal."""
    cache, log = fake
    with pytest.raises(ab.AdapterUnavailable, match="not a plain version string"):
        ab.ensure_built(fake_torch(__version__=version), announce=io.StringIO())
    assert calls(log) == 0


def test_a_build_is_private_verified_and_reused(fake) -> None:
    cache, log = fake
    first = build()
    assert first.built_now and calls(log) == 1
    d = first.path.parent
    assert d.parent == cache / "torch-adapter"
    for p in (cache, cache / "torch-adapter", d, first.path):
        st = os.lstat(p)
        assert st.st_uid == os.geteuid() and not st.st_mode & 0o022, p
    info = json.loads((d / "build.json").read_text())
    assert info["key"]["torch"] == torch.__version__ and info["compiler"] == "fake-c++ 1.0"
    again = build()
    assert again.path == first.path and not again.built_now and calls(log) == 1
    # The compile command: the flags the adapter needs (its version check, torch's C++ ABI).
    line = log.read_text()
    assert f'-DTRIPWIRE_TORCH_VERSION="{torch.__version__}"' in line
    assert f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}" in line
    assert "-ltorch_python" in line and all(unit in line for unit in ab._UNITS)
    assert not [p for p in d.parent.iterdir() if ".tmp-" in p.name]  # the temporary directory is gone


@pytest.mark.parametrize(
    "damage",
    ["bytes", "truncated", "hash", "no-hash", "stale-key", "bad-json", "symlink", "writable"],
)
def test_a_damaged_build_is_rebuilt_never_loaded(fake, damage, tmp_path) -> None:
    """A module whose bytes no longer hash to the recorded SHA-256, a build of another key, or
    files others can write are not used: the build is made again (and then verifies)."""
    cache, log = fake
    first = build()
    d, so = first.path.parent, first.path
    if damage == "bytes":
        data = bytearray(so.read_bytes())
        data[3] ^= 1
        so.write_bytes(bytes(data))
    elif damage == "truncated":
        so.write_bytes(so.read_bytes()[:5])
    elif damage == "hash":
        (d / "_torch_adapter.sha256").write_text("0" * 64)
    elif damage == "no-hash":
        (d / "_torch_adapter.sha256").unlink()
    elif damage == "stale-key":
        info = json.loads((d / "build.json").read_text())
        info["key"]["torch"] = "2.12.0"
        (d / "build.json").write_text(json.dumps(info))
    elif damage == "bad-json":
        (d / "build.json").write_text("{")
    elif damage == "symlink":
        other = tmp_path / "elsewhere.so"
        other.write_bytes(so.read_bytes())
        so.unlink()
        so.symlink_to(other)
    elif damage == "writable":
        so.chmod(0o777)
    assert ab._verified(d, ab.build_key(torch, ab.source_root())) is None
    second = build()
    assert second.built_now and calls(log) == 2 and second.path == so
    assert ab._verified(d, ab.build_key(torch, ab.source_root())) is not None
    assert not so.is_symlink()


def test_a_cache_others_can_write_is_refused(fake, tmp_path, monkeypatch) -> None:
    cache, log = fake
    build()
    cache.chmod(0o777)
    with pytest.raises(ab.AdapterUnavailable, match="not private"):
        build()
    cache.chmod(0o700)
    (cache / "torch-adapter").chmod(0o775)
    with pytest.raises(ab.AdapterUnavailable, match="not private"):
        build()
    (cache / "torch-adapter").chmod(0o700)
    # An ancestor others can write (and not sticky): they could swap the whole cache.
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    monkeypatch.setenv("TRIPWIRE_CACHE_DIR", str(open_dir / "cache"))
    with pytest.raises(ab.AdapterUnavailable, match="can be changed by others"):
        build()
    # Sticky (as /tmp is): others cannot rename what is ours inside it.
    open_dir.chmod(0o777 | stat.S_ISVTX)
    assert build().built_now
    # The cache directory itself a symbolic link (to a directory of ours): refused, not followed.
    link = tmp_path / "link"
    link.symlink_to(cache)
    monkeypatch.setenv("TRIPWIRE_CACHE_DIR", str(link))
    with pytest.raises(ab.AdapterUnavailable, match="symbolic link"):
        build()
    assert calls(log) == 2


def test_a_failed_build_is_not_repeated_by_every_process(fake, monkeypatch) -> None:
    cache, log = fake
    # A compiler killed by a signal (the OOM killer) may succeed next time: not recorded.
    monkeypatch.setenv("FAKE_CXX_FAIL", "signal")
    with pytest.raises(ab.AdapterUnavailable, match="did not compile"):
        build()
    assert not list((cache / "torch-adapter").glob("*.failed")) and calls(log) == 1
    log.write_text("")
    monkeypatch.setenv("FAKE_CXX_FAIL", "1")
    out = io.StringIO()
    with pytest.raises(ab.AdapterUnavailable, match="stand-in compiler was told to fail") as e:
        ab.ensure_built(torch, announce=out)
    assert "did not compile against torch" in str(e.value)
    assert out.getvalue().startswith("tripwire: building the torch adapter for torch ")
    assert "failed" in out.getvalue()
    with pytest.raises(ab.AdapterUnavailable, match="to try again"):
        build()
    assert calls(log) == 1
    assert not [p for p in (cache / "torch-adapter").iterdir() if p.is_dir()]  # nothing half-built
    # Another compiler is another attempt; its success clears the record.
    monkeypatch.delenv("FAKE_CXX_FAIL")
    monkeypatch.setenv("CXX", os.environ["CXX"] + " -DANOTHER")
    assert build().built_now and calls(log) == 2
    assert not list((cache / "torch-adapter").glob("*.failed"))


def test_hostile_records_and_settings_are_refused_or_ignored(fake, monkeypatch) -> None:
    """A failure record that is not one is ignored; a $CXX that is not a command is no compiler."""
    cache, log = fake
    key = ab.build_key(torch, ab.source_root())
    (cache / "torch-adapter").mkdir(parents=True, mode=0o700)
    for junk in ("[", "[1, 2]", '{"compiler": null}', "\x00\xff"):
        (cache / "torch-adapter" / f"{ab.key_name(key)}.failed").write_text(junk)
        assert ab._failure(cache / "torch-adapter" / f"{ab.key_name(key)}.failed") is None
    assert build().built_now and calls(log) == 1
    monkeypatch.setenv("CXX", "'unbalanced")
    assert ab.find_compiler() is None


def test_two_processes_build_once(fake, tmp_path) -> None:
    """The file lock: processes starting together build once; the others wait and load that build."""
    cache, log = fake
    code = textwrap.dedent(
        """
        import io, sys, torch
        from tripwire import _adapter_build as ab
        out = io.StringIO()
        b = ab.ensure_built(torch, announce=out)
        print(b.path, b.built_now, repr(out.getvalue()))
        """
    )
    env = dict(os.environ, FAKE_CXX_SLEEP="3", PYTHONPATH=os.pathsep.join(sys.path))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    lines = [out.split(maxsplit=2) for out, _ in results]
    assert len({path for path, _, _ in lines}) == 1
    assert sorted(built for _, built, _ in lines) == ["False", "False", "True"]
    assert calls(log) == 1


def test_reentry_during_the_build_does_not_wait_on_itself(tmp_path) -> None:
    """A collection (a __del__, a weakref callback) may run ensure_torch again on the thread that
    is building: it returns at once (the Python readers are registered) instead of waiting on the
    file lock its own thread holds."""
    code = textwrap.dedent(
        """
        import sys, torch, tripwire as tw
        from tripwire import _adapter_build as ab
        real = ab.load
        seen = []
        def load(t):
            seen.append(tw.tensors.ensure_torch())  # the re-entry
            return real(t)
        ab.load = load
        assert tw.tensors.ensure_torch() and seen == [True]
        x = torch.randn(3)
        b = tw.GuardBuilder({"x": x}); b.tensor_match("L['x']"); gs = b.build()
        assert gs.check({"x": torch.randn(3)}) and not gs.check({"x": torch.randn(4)})
        print(tw._core.torch_adapter_installed())
        """
    )
    r = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )
    assert r.returncode == 0 and r.stdout.split() == ["True"], r.stderr[-3000:]


def _run_guard(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """In a fresh process: switch torch on twice, build and check a tensor guard, print what was
    warned and the path taken."""
    code = textwrap.dedent(
        """
        import warnings, torch, tripwire as tw
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tw.tensors.ensure_torch()
            tw.tensors.ensure_torch()
            x = torch.randn(2, 3)
            b = tw.GuardBuilder({"x": x}); b.tensor_match("L['x']"); gs = b.build()
            assert gs.check({"x": torch.randn(2, 3)})
            assert not gs.check({"x": torch.randn(2, 3, dtype=torch.float64)})
            assert not gs.check({"x": torch.randn(3, 2)})
        for w in caught:
            print("WARNING", w.category.__name__, str(w.message).replace("\\n", " "))
        print("STATUS", tw.tensors.adapter_status())
        print("INSTALLED", tw._core.torch_adapter_installed())
        """
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def test_no_compiler_gives_one_warning_then_the_python_readers(tmp_path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "TRIPWIRE_TORCH_ADAPTER")}
    env.update(PATH=str(empty), TRIPWIRE_CACHE_DIR=str(tmp_path / "cache"))
    r = _run_guard(env)
    assert r.returncode == 0, r.stderr[-3000:]
    warned = [line for line in r.stdout.splitlines() if line.startswith("WARNING")]
    assert len(warned) == 1, r.stdout
    assert warned[0].startswith("WARNING RuntimeWarning tripwire: torch tensors are read through Python")
    assert "no C++ compiler was found" in warned[0] and "apt-get install g++" in warned[0]
    assert "TRIPWIRE_TORCH_ADAPTER=0" in warned[0]
    assert "STATUS python readers (no C++ compiler was found" in r.stdout
    assert "INSTALLED False" in r.stdout
    assert "building" not in r.stderr


def test_the_switch_turns_the_build_off_without_a_warning(tmp_path) -> None:
    env = dict(os.environ, TRIPWIRE_TORCH_ADAPTER="0", TRIPWIRE_CACHE_DIR=str(tmp_path / "cache"))
    r = _run_guard(env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "WARNING" not in r.stdout
    assert "STATUS python readers (the first-use build is off: TRIPWIRE_TORCH_ADAPTER=0)" in r.stdout
    assert "INSTALLED False" in r.stdout
    assert not (tmp_path / "cache").exists()


def test_a_refused_cache_gives_one_warning(tmp_path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o777)
    cache.chmod(0o777)
    env = dict(os.environ, TRIPWIRE_CACHE_DIR=str(cache))
    r = _run_guard(env)
    assert r.returncode == 0, r.stderr[-3000:]
    warned = [line for line in r.stdout.splitlines() if line.startswith("WARNING")]
    assert len(warned) == 1 and "is not private" in warned[0] and "chmod go-w" in warned[0], r.stdout
    assert "INSTALLED False" in r.stdout


def test_the_suite_loads_the_adapter_from_the_cache() -> None:
    """This process's adapter (the default cache, built on first use by scripts/setup's doctor or
    here) is a verified build for this torch; a second thread asking meanwhile gets the same."""
    import tripwire as tw

    results = []
    threads = [threading.Thread(target=lambda: results.append(tw.tensors.ensure_torch())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 4
    assert tw._core.torch_adapter_installed(), tw.tensors.adapter_status()
    module = sys.modules["tripwire._torch_adapter"]
    assert module.torch_version == torch.__version__
    path = Path(module.__file__)
    build = ab.loaded_build()
    assert build is not None and build.path == path
    assert path.parent.parent == ab.cache_root() / "torch-adapter"
    assert ab._verified(path.parent, ab.build_key(torch, ab.source_root())) is not None


def test_doctor_reports_every_path() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "tripwire", "doctor"],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {}
    for line in r.stdout.splitlines():
        name, _, text = line.strip().partition("  ")
        rows[name] = text.strip()
    out = r.stdout
    assert rows["torch adapter"].startswith(f"torch adapter (compiled against torch {torch.__version__})"), (
        out
    )
    assert rows["build"].startswith(str(ab.cache_root() / "torch-adapter")), out
    for name in ("tripwire", "python", "C++ compiler", "adapter cache", "array reader", "dict hints",
                 "dict versions", "frame layouts", "store: Directory", "store: Redis"):  # fmt: skip
        assert rows.get(name), (name, out)
    numpy = pytest.importorskip("numpy")
    import tripwire as tw

    tw.tensors.ensure_numpy()
    assert numpy and rows["array reader"] == tw.tensors.array_path(), out


@pytest.mark.install
def test_torch_installed_after_tripwire() -> None:
    """The other install order, as a user does it: a fresh virtual environment (no system site
    packages: nothing of this one's torch is visible), an isolated ``pip install`` of the checkout
    without torch, then torch; the first tensor guard builds the adapter and uses it, and
    ``doctor`` says so. Minutes: a whole build of tripwire (docs/install.md gives the command)."""
    # In the checkout's build/, not pytest's temporary directories: other pytest sessions on the
    # machine may clean those up during the minutes this takes.
    (ROOT / "build").mkdir(exist_ok=True)
    tmp_path = Path(tempfile.mkdtemp(prefix="install-test-", dir=ROOT / "build"))
    try:
        _install_after(tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _install_after(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "CXX")}
    env.update(TRIPWIRE_CACHE_DIR=str(tmp_path / "cache"), PIP_DISABLE_PIP_VERSION_CHECK="1")

    def run(*args: str, cwd: Path = tmp_path) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(list(args), capture_output=True, text=True, timeout=3600, env=env, cwd=cwd)
        assert r.returncode == 0, (args, r.stdout[-3000:], r.stderr[-3000:])
        return r

    # The wheel scripts/setup built and installed (build/dist), when it is this interpreter's: a
    # wheel built once and reused is a user's path, and building again costs CI minutes. Otherwise
    # an isolated build of the checkout, in its own build directory (build/<wheel tag> may be in use).
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    wheels = sorted((ROOT / "build" / "dist").glob(f"tripwire-*-{tag}-{tag}-*.whl"))
    if wheels:
        run(py, "-m", "pip", "install", "-q", str(wheels[-1]))
    else:
        run(py, "-m", "pip", "install", "-q", f"--config-settings=build-dir={tmp_path / 'build'}", str(ROOT))
    r = subprocess.run([py, "-c", "import torch"], capture_output=True, env=env, cwd=tmp_path)
    assert r.returncode != 0, "torch is visible in the fresh environment: the test proves nothing"
    r = run(py, "-m", "tripwire", "doctor")
    assert "not needed: torch is not installed" in r.stdout, r.stdout
    run(py, "-m", "pip", "install", "-q", f"torch=={torch.__version__.split('+')[0]}")
    code = textwrap.dedent(
        """
        import torch, tripwire as tw
        x = torch.randn(4, 5)
        b = tw.GuardBuilder({"x": x}); b.tensor_match("L['x']"); gs = b.build()
        assert gs.check({"x": torch.randn(4, 5)}) and not gs.check({"x": torch.randn(5, 4)})
        print(tw._core.torch_adapter_installed(), tw.tensors.adapter_status())
        print("[torch adapter]" in gs.explain())
        """
    )
    r = run(py, "-W", "error::RuntimeWarning", "-c", code)  # tripwire warns with RuntimeWarning
    assert r.stdout.splitlines()[0].startswith("True torch adapter (compiled against torch"), r.stdout
    assert r.stdout.splitlines()[1] == "True", r.stdout
    assert "tripwire: building the torch adapter for torch" in r.stderr and "done" in r.stderr, r.stderr
    r = run(py, "-m", "tripwire", "doctor")
    assert "torch adapter (compiled against torch" in r.stdout, r.stdout
    assert str(tmp_path / "cache" / "torch-adapter") in r.stdout, r.stdout
    assert "built " in r.stdout and "building" not in r.stderr, (r.stdout, r.stderr)  # from the cache now

"""The torch adapter, built on first use against the installed torch (docs/install.md).

``tripwire._torch_adapter`` is compiled against torch's C++ API, so it must match the torch that is
installed *now*, whatever the install order: tripwire before torch, torch upgraded later, a wheel
built on another machine. The package ships the adapter's sources (``_adapter_src``, laid out as
the checkout's ``cpp/``); the first time a process meets a tensor, ``load`` finds a build for this
torch in the user's cache directory or compiles one there (about 20-40 s, once per torch version),
then imports it. This module is the one description of how the adapter is built.

A build is keyed by everything its machine code depends on: tripwire's version, a hash of the
adapter's sources, the torch build (version, git commit, CUDA/HIP version, C++ ABI flag) and the
CPython ABI (cache tag and extension suffix). Builds go to a temporary directory renamed into
place under a file lock, so concurrent processes build once and none sees a half-written module.
The module is code: it is loaded only from directories the user owns that nobody else can write,
and only when its SHA-256 matches the one recorded beside it when it was built.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ._package import __version__, default_cache_dir

MODULE = "tripwire._torch_adapter"
ENV_SWITCH = "TRIPWIRE_TORCH_ADAPTER"  # "0": no first-use build (the Python readers)
ENV_CACHE = "TRIPWIRE_CACHE_DIR"
# The adapter's units (cpp/adapters/torch, by role), compiled and linked in one command.
_UNITS = tuple(
    f"adapters/torch/{unit}.cpp"
    for unit in ("module", "tensors", "global_state", "dispatch_keys", "devices", "compiled_module")
)
# Relative to the source root (-I); every one is hashed into the build key.
_SOURCES = (
    *_UNITS,
    "adapters/torch/adapter.hpp",
    "adapters/torch/hidden_symbol.hpp",
    "runtime/tensors/adapter_abi.h",
)
_SO_NAME = "_torch_adapter" + str(sysconfig.get_config_var("EXT_SUFFIX") or ".so")
_HASH_NAME = "_torch_adapter.sha256"
_INFO_NAME = "build.json"
_COMPILE_TIMEOUT = 900.0  # seconds; a hung compiler gives the lock back and a warning
_SLOW = "torch tensors are read through Python, about 12-25x slower than torch's own guards"
_OFF_HINT = f"(set {ENV_SWITCH}=0 to read them through Python without this warning)"
# torch.__version__ becomes a C string literal (-DTRIPWIRE_TORCH_VERSION): nothing that could end it.
_VERSION_RE = re.compile(r"[A-Za-z0-9.+_-]{1,64}")


class AdapterUnavailable(Exception):
    """The adapter cannot be had in this process: the message says why and how to fix it."""


class AdapterDisabled(Exception):
    """The first-use build is switched off (TRIPWIRE_TORCH_ADAPTER=0)."""


@dataclass(frozen=True)
class Build:
    """A verified build in the cache: the module's path and what build.json says of it."""

    path: Path
    info: dict[str, Any]
    built_now: bool


def disabled() -> bool:
    return os.environ.get(ENV_SWITCH, "").strip().lower() in ("0", "off", "false", "no")


def cache_root() -> Path:
    """tripwire's cache directory (``tripwire.store.default_cache_dir``: ``$TRIPWIRE_CACHE_DIR``,
    else ``$XDG_CACHE_HOME/tripwire``, else ``~/.cache/tripwire``); builds go under ``torch-adapter``."""
    return default_cache_dir().expanduser().absolute()


def source_root() -> Path | None:
    """The adapter's sources: the package's copy (an installed wheel) or the checkout's cpp/."""
    here = Path(__file__).resolve().parent
    for root in (here / "_adapter_src", here.parent.parent / "cpp"):
        if all((root / s).is_file() for s in _SOURCES):
            return root
    return None


def find_compiler() -> list[str] | None:
    """The C++ compiler command: ``$CXX`` (may carry arguments, e.g. ``ccache g++``), else the
    first of c++, g++, clang++ on PATH (torch.utils.cpp_extension's convention)."""
    env = os.environ.get("CXX", "").strip()
    if env:
        try:
            cmd = shlex.split(env)
        except ValueError:  # an unbalanced quote: not a command
            return None
        exe = shutil.which(cmd[0]) if cmd else None
        return [exe, *cmd[1:]] if exe else None
    for name in ("c++", "g++", "clang++"):
        exe = shutil.which(name)
        if exe:
            return [exe]
    return None


def compiler_version(cmd: list[str]) -> str:
    """The first line of ``CXX --version`` ('' when it does not answer)."""
    try:
        r = subprocess.run([*cmd, "--version"], check=False, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return (r.stdout.splitlines() or [""])[0].strip()


def _sources_hash(root: Path) -> str:
    h = hashlib.sha256()
    for rel in _SOURCES:
        data = (root / rel).read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def build_key(torch: Any, root: Path) -> dict[str, Any]:
    """Everything the adapter's machine code depends on (a change means another build)."""
    version = getattr(torch, "version", None)
    return {
        "tripwire": __version__,
        "sources": _sources_hash(root),
        "torch": str(torch.__version__),
        "torch_git": str(getattr(version, "git_version", "")),
        "torch_cuda": str(getattr(version, "cuda", None)),
        "torch_hip": str(getattr(version, "hip", None)),
        "cxx11_abi": int(bool(torch._C._GLIBCXX_USE_CXX11_ABI)),
        "python": sys.implementation.cache_tag,
        "ext_suffix": str(sysconfig.get_config_var("EXT_SUFFIX")),
    }


def key_name(key: dict[str, Any]) -> str:
    """The build's directory name: readable, then a hash of the whole key."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    torch = re.sub(r"[^A-Za-z0-9.+_-]", "_", key["torch"])[:40]
    return f"torch-{torch}-{key['python']}-{digest}"


# -- the cache directory: the module is code, so only the user may write on its way -----------------
def _check_private(path: Path, *, own: bool) -> None:
    """Refuse a path someone else could write to. ``own``: it must be the user's and writable by
    nobody else. Otherwise (an ancestor): owned by the user or root, and not writable by others
    unless sticky (/tmp: others cannot rename or remove what is ours inside it)."""
    try:
        st = os.lstat(path)
    except OSError as e:
        raise AdapterUnavailable(f"cannot inspect {path}: {e}") from None
    uid = os.geteuid()
    if stat.S_ISLNK(st.st_mode) and own:
        raise AdapterUnavailable(f"{path} is a symbolic link")
    if own:
        if st.st_uid != uid or st.st_mode & 0o022:
            raise AdapterUnavailable(
                f"{path} is not private (owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)}): "
                f"a compiled module must not load from where others can write; "
                f"use `chmod go-w {path}` or set {ENV_CACHE} to a directory of yours"
            )
        return
    if stat.S_ISLNK(st.st_mode):
        st = os.stat(path)
    if st.st_uid not in (uid, 0) or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
        raise AdapterUnavailable(
            f"{path} can be changed by others (owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)}): "
            f"a compiled module must not load from under it; set {ENV_CACHE} to a private directory"
        )


def _private_dir(root: Path) -> Path:
    """``root/torch-adapter``, made if missing (mode 0700), every directory on the way checked."""
    adapter_dir = root / "torch-adapter"
    try:
        os.makedirs(adapter_dir, mode=0o700, exist_ok=True)
    except OSError as e:
        raise AdapterUnavailable(
            f"cannot make the cache directory {adapter_dir}: {e}; set {ENV_CACHE}"
        ) from None
    for d in (adapter_dir, root):
        _check_private(d, own=True)
    # The path as given and as resolved: a symbolic link on the way lives in its own parent.
    for d in {*root.parents, *root.resolve().parents}:
        _check_private(d, own=False)
    return adapter_dir


def _file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _verified(build_dir: Path, key: dict[str, Any]) -> Build | None:
    """The build in ``build_dir`` when it is complete, private, of this key, and its module's
    bytes hash to what was recorded when it was built; None otherwise (missing, stale, corrupt)."""
    so = build_dir / _SO_NAME
    try:
        if not build_dir.is_dir() or build_dir.is_symlink():
            return None
        for p in (build_dir, so, build_dir / _HASH_NAME, build_dir / _INFO_NAME):
            _check_private(p, own=True)
        info = json.loads((build_dir / _INFO_NAME).read_text())
        want = (build_dir / _HASH_NAME).read_text().strip()
        if not isinstance(info, dict) or info.get("key") != key or _file_hash(so) != want:
            return None
    except (OSError, ValueError, AdapterUnavailable):
        return None
    return Build(so, info, built_now=False)


def _failure(path: Path) -> dict[str, Any] | None:
    """The record of an earlier failed build (compiler, reason), or None."""
    try:
        if not path.exists():
            return None
        _check_private(path, own=True)
        record = json.loads(path.read_text())
    except (OSError, ValueError, AdapterUnavailable):
        return None
    if isinstance(record, dict) and isinstance(record.get("reason"), str):
        return record
    return None


def _compile_command(cxx: list[str], torch: Any, root: Path, out: Path) -> list[str]:
    """The adapter's build: torch's headers and libraries (torch.utils.cpp_extension's paths),
    Python's headers, torch's C++ ABI, the version the adapter checks at load time."""
    from torch.utils import cpp_extension  # a cold path: once per torch version on a machine

    py_include = sysconfig.get_paths()["include"]
    includes = [str(root), *cpp_extension.include_paths(), py_include]
    lib_dirs = cpp_extension.library_paths()
    for header, where, fix in (
        ("Python.h", [py_include], "install Python's development headers (Debian/Ubuntu: python3-dev)"),
        ("torch/csrc/autograd/python_variable.h", includes, "reinstall torch (its headers are missing)"),
    ):
        if not any(os.path.isfile(os.path.join(d, header)) for d in where):
            raise AdapterUnavailable(f"{header} was not found in {', '.join(where)}: {fix}")
    cmd = [
        *cxx,
        "-std=c++17",
        "-O2",
        "-DNDEBUG",
        "-fPIC",
        "-shared",
        "-w",  # torch's headers are not warning-clean; the adapter's own code is linted by scripts/lint
        # Only PyInit__torch_adapter is exported: calls inside bind directly.
        "-fvisibility=hidden",
        "-fvisibility-inlines-hidden",
        *(f"-I{d}" for d in includes),
        f'-DTRIPWIRE_TORCH_VERSION="{torch.__version__}"',
        f"-D_GLIBCXX_USE_CXX11_ABI={int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))}",
        *(str(root / unit) for unit in _UNITS),
        "-o",
        str(out),
        *(f"-L{d}" for d in lib_dirs),
        "-ltorch_python",
        "-ltorch",
        "-ltorch_cpu",
        "-lc10",
    ]
    # torch's OpenMP runtime: the adapter reads the thread count from the same omp_get_max_threads
    # at::get_num_threads() calls (global_state.cpp, ThreadLocals). No rpath: the module is only
    # ever loaded after `import torch`, whose libraries the loader then finds by their sonames.
    for d in lib_dirs:
        gomp = os.path.join(d, "libgomp.so.1")
        if os.path.isfile(gomp):
            cmd.append(gomp)
            break
    return cmd


@contextlib.contextmanager
def _locked(lock_path: Path, announce: Any) -> Any:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("tripwire: waiting for another process building the torch adapter...", file=announce)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def ensure_built(torch: Any, *, announce: Any = None) -> Build:
    """A verified build of the adapter for this torch: from the cache, else compiled now (one line
    on ``announce``, stderr by default). AdapterUnavailable says why there is none."""
    announce = sys.stderr if announce is None else announce
    version = str(torch.__version__)
    if not _VERSION_RE.fullmatch(version):
        raise AdapterUnavailable(f"torch's version {version!r} is not a plain version string")
    root = source_root()
    if root is None:
        raise AdapterUnavailable(
            "this tripwire install has no adapter sources (tripwire/_adapter_src): reinstall tripwire"
        )
    key = build_key(torch, root)
    name = key_name(key)
    adapter_dir = _private_dir(cache_root())
    final = adapter_dir / name
    found = _verified(final, key)
    if found is not None:
        return found
    cxx = find_compiler()
    if cxx is None:
        raise AdapterUnavailable(
            "no C++ compiler was found ($CXX, c++, g++ or clang++ on PATH) to build the torch adapter "
            f"for torch {version}: install one (Debian/Ubuntu: apt-get install g++), then restart"
        )
    failed = adapter_dir / f"{name}.failed"
    with _locked(adapter_dir / f"{name}.lock", announce):
        found = _verified(final, key)  # another process may have built it while we waited
        if found is not None:
            return found
        before = _failure(failed)
        if before is not None and before.get("compiler") == cxx:
            # The same compiler failed on the same key before: every process would fail again.
            raise AdapterUnavailable(f"{before['reason']} (delete {failed} to try again)")
        if final.exists() or final.is_symlink():  # stale or corrupt: never loaded, replaced
            if final.is_dir() and not final.is_symlink():
                shutil.rmtree(final)
            else:
                final.unlink()
        tmp = Path(tempfile.mkdtemp(prefix=f"{name}.tmp-", dir=adapter_dir))
        try:
            so = tmp / _SO_NAME
            cmd = _compile_command(cxx, torch, root, so)
            print(
                f"tripwire: building the torch adapter for torch {version} (once per torch build, ~30-90 s)...",
                end="",
                file=announce,
                flush=True,
            )
            start = time.monotonic()
            try:
                r = subprocess.run(
                    cmd,
                    check=False,
                    capture_output=True,
                    text=True,
                    timeout=_COMPILE_TIMEOUT,
                    stdin=subprocess.DEVNULL,
                )
                ok, output = r.returncode == 0 and so.is_file(), r.stdout + r.stderr
                # A compile error is recorded; a compiler killed by a signal, or a temporary
                # directory that vanished (a /tmp cleaner), may not happen again.
                lasting = r.returncode > 0 and tmp.is_dir()
            except (OSError, subprocess.SubprocessError) as e:
                ok, output, lasting = False, str(e), False
            seconds = time.monotonic() - start
            print(f" {'done' if ok else 'failed'} ({seconds:.0f} s)", file=announce, flush=True)
            if not ok:
                tail = "\n".join(output.strip().splitlines()[-12:])
                reason = (
                    f"the torch adapter did not compile against torch {version} with {cxx[0]} "
                    f"(tripwire is tested with torch 2.13): {tail}"
                )
                if lasting:
                    with contextlib.suppress(OSError):
                        failed.write_text(json.dumps({"compiler": cxx, "reason": reason, "command": cmd}))
                raise AdapterUnavailable(reason)
            os.chmod(so, 0o700)
            info = {
                "key": key,
                "built": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "seconds": round(seconds, 1),
                "compiler": compiler_version(cxx) or cxx[0],
                "torch_dir": str(Path(torch.__file__).parent),
            }
            (tmp / _INFO_NAME).write_text(json.dumps(info, indent=1, sort_keys=True))
            (tmp / _HASH_NAME).write_text(_file_hash(so) + "\n")
            os.rename(tmp, final)  # atomic: the build appears whole or not at all
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        with contextlib.suppress(FileNotFoundError):
            failed.unlink()
    found = _verified(final, key)
    if found is None:
        raise AdapterUnavailable(f"the adapter built in {final} does not verify")
    return Build(found.path, found.info, built_now=True)


# -- loading ---------------------------------------------------------------------------------------
_loaded: Build | None = None  # the build this process loaded (doctor reports it)


def loaded_build() -> Build | None:
    return _loaded


def load(torch: Any) -> ModuleType:
    """``tripwire._torch_adapter`` for the imported torch: already imported, else from a verified
    build in the cache (made now if needed). Raises AdapterDisabled or AdapterUnavailable. The
    module's own load-time checks run in its initialiser; the caller hands its table to _core,
    which checks the ABI and the torch version again."""
    global _loaded
    if MODULE in sys.modules:
        module = sys.modules[MODULE]
        if module is None:  # the import system's way to block a module (the tests use it)
            raise AdapterUnavailable(f"{MODULE} is blocked (None in sys.modules)")
        return module
    if disabled():
        raise AdapterDisabled(f"the first-use build is off: {ENV_SWITCH}=0")
    try:
        build = ensure_built(torch)
    # A full disk, a broken torch.utils, no home directory to put the cache in.
    except (OSError, subprocess.SubprocessError, ImportError, ValueError, RuntimeError) as e:
        raise AdapterUnavailable(f"the torch adapter could not be built: {e}") from None
    spec = importlib.util.spec_from_file_location(MODULE, build.path)
    if spec is None or spec.loader is None:
        raise AdapterUnavailable(f"{build.path} is not an extension module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module
    try:
        spec.loader.exec_module(module)
    except ImportError as e:
        sys.modules.pop(MODULE, None)
        raise AdapterUnavailable(f"the adapter built in {build.path.parent} did not load: {e}") from None
    package: Any = sys.modules["tripwire"]
    package._torch_adapter = module  # as an import of the submodule would
    _loaded = build
    return module


def unavailable_warning(reason: str) -> str:
    return f"tripwire: {_SLOW}: {reason} {_OFF_HINT}"

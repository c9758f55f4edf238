"""Packaging as the ecosystem expects it: license, metadata, supported interpreters, extras, the
console script's name, the wheel's typed package, and the public modules' ``__all__``.

The supported CPython versions are stated in four places that must agree: the layouts the engine
mirrors (cpp/runtime/frame/interp_frame.hpp), the build-time gate (cmake/python_version.cmake),
``requires-python`` and the classifiers.
"""

from __future__ import annotations

import email.parser
import importlib
import io
import re
import shutil
import subprocess
import tarfile
import tomllib
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from tripwire.__main__ import main

ROOT = Path(__file__).resolve().parents[3]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
GATE = ROOT / "cmake" / "python_version.cmake"


def supported_minors() -> list[int]:
    """The 3.x minors the frame layouts are compiled for, from interp_frame.hpp's guard."""
    text = (ROOT / "cpp/runtime/frame/interp_frame.hpp").read_text()
    m = re.search(r"PY_VERSION_HEX >= 0x030([0-9A-F])0000 && PY_VERSION_HEX < 0x030([0-9A-F])0000", text)
    assert m, "interp_frame.hpp's version guard moved"
    return list(range(int(m.group(1), 16), int(m.group(2), 16)))


def test_license_file_and_pep639_fields():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License")
    assert "the tripwire developers" in text
    assert PROJECT["license"] == "BSD-3-Clause"  # an SPDX expression, not a table (PEP 639)
    assert PROJECT["license-files"] == ["LICENSE"]
    # PEP 639: a license expression excludes License :: classifiers
    assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]


def test_supported_versions_agree():
    minors = supported_minors()
    assert minors == [11, 12, 13]
    assert PROJECT["requires-python"] == f">=3.{minors[0]},<3.{minors[-1] + 1}"
    listed = sorted(
        int(c.rsplit(".", 1)[1])
        for c in PROJECT["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    )
    assert listed == minors
    gate = GATE.read_text()
    assert f"set(TRIPWIRE_PYTHON_MIN 3.{minors[0]})" in gate
    assert f"set(TRIPWIRE_PYTHON_END 3.{minors[-1] + 1})" in gate
    assert (
        "include(${CMAKE_CURRENT_SOURCE_DIR}/cmake/python_version.cmake)"
        in (ROOT / "CMakeLists.txt").read_text()
    )


def test_classifiers_extras_scripts():
    classifiers = PROJECT["classifiers"]
    for c in (
        "Typing :: Typed",
        "Programming Language :: Python :: Implementation :: CPython",
        "Programming Language :: Python :: 3 :: Only",
    ):
        assert c in classifiers
    extras = PROJECT["optional-dependencies"]
    assert extras["torch"] and extras["numpy"] and extras["redis"]
    assert any(r.startswith("redis") for r in extras["redis"])
    assert PROJECT["scripts"] == {"tripwire": "tripwire.__main__:main"}
    assert (ROOT / "python/tripwire/py.typed").exists()


def test_build_requirements_are_the_versions_that_build():
    requires = PYPROJECT["build-system"]["requires"]
    # nanobind 2.8 has the wrapper API the bindings use (nb::list::empty(), ...), 2.4-2.7 do not;
    # scikit-build-core 0.11 reads a PEP 639 license expression, 0.10 refuses it.
    assert "nanobind>=2.8" in requires
    assert "scikit-build-core>=0.11" in requires


@pytest.mark.parametrize(
    ("interpreter", "version", "soabi", "ok"),
    [
        ("Python", "3.11.9", "cpython-311-x86_64-linux-gnu", True),
        ("Python", "3.13.1", "cpython-313-x86_64-linux-gnu", True),
        ("Python", "3.10.14", "cpython-310-x86_64-linux-gnu", False),
        ("Python", "3.14.0", "cpython-314-x86_64-linux-gnu", False),
        ("Python", "3.13.1", "cpython-313t-x86_64-linux-gnu", False),  # free-threaded
        ("PyPy", "3.11.0", "pypy311-pp73-x86_64-linux-gnu", False),
    ],
)
def test_cmake_refuses_unsupported_interpreters(interpreter, version, soabi, ok):
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake is not installed")
    proc = subprocess.run(
        [
            cmake,
            f"-DPython_INTERPRETER_ID={interpreter}",
            f"-DPython_VERSION={version}",
            f"-DPython_SOABI={soabi}",
            "-DPython_EXECUTABLE=/usr/bin/python-under-test",
            "-P",
            str(GATE),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if ok:
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode != 0
    message = " ".join(proc.stderr.split())
    assert "tripwire supports CPython 3.11, 3.12 and 3.13 (with the GIL)" in message
    assert f"{interpreter} {version}" in message and "/usr/bin/python-under-test" in message


def test_wheel_metadata_and_sdist(tmp_path):
    build = pytest.importorskip("scikit_build_core.build")
    dist_info = build.prepare_metadata_for_build_wheel(str(tmp_path / "meta"))
    meta_dir = tmp_path / "meta" / dist_info
    meta = email.parser.Parser().parsestr((meta_dir / "METADATA").read_text())
    assert meta["License-Expression"] == "BSD-3-Clause"
    assert meta["License-File"] == "LICENSE"
    assert (meta_dir / "licenses" / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    assert meta["Requires-Python"] in ("<3.14,>=3.11", ">=3.11,<3.14")
    assert {"torch", "numpy", "redis"} <= set(meta.get_all("Provides-Extra"))
    assert "Typing :: Typed" in meta.get_all("Classifier")
    sdist = build.build_sdist(str(tmp_path / "sdist"))
    with tarfile.open(tmp_path / "sdist" / sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"LICENSE", "cmake/python_version.cmake", "python/tripwire/py.typed", "pyproject.toml"} <= names
    # The extension module's stubs: a folder beside it, the module's and its testing submodule's.
    assert {"python/tripwire/_core/__init__.pyi", "python/tripwire/_core/testing.pyi"} <= names


def test_console_script_names_itself_tripwire():
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert out.getvalue().startswith("usage: tripwire ")
    assert "python -m tripwire" not in out.getvalue().splitlines()[0]


@pytest.mark.parametrize(
    "name", ["tripwire", "tripwire.frame", "tripwire.store", "tripwire.shapes", "tripwire.tensors"]
)
def test_all_names_exist_and_star_import(name):
    module = importlib.import_module(name)
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing
    namespace: dict[str, object] = {}
    exec(f"from {name} import *", namespace)
    assert set(module.__all__) <= set(namespace)


def test_frame_all_lists_its_public_api():
    import tripwire.frame as twf

    defined = {
        n
        for n, v in vars(twf).items()
        if not n.startswith("_") and getattr(v, "__module__", None) == "tripwire.frame"
    }
    assert defined <= set(twf.__all__), defined - set(twf.__all__)
    for n in ("SKIP", "RUN_ONLY", "Frame", "FrameOnLimit", "Hook", "hooked", "install", "cache_of", "status"):
        assert n in twf.__all__

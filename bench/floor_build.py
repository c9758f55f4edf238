"""Build and load the benchmark's floor, bench/floor.c, as the module ``_floor``.

The floor is hand-written CPython C-API guard checks, the yardstick of bench/guard_eval.py. It is
not part of tripwire: it is compiled here, for the running interpreter, into build/bench/ (rebuilt
when floor.c is newer), with the C compiler and flags Python itself was built with.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
import sysconfig
from types import ModuleType

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "floor.c")
OUT_DIR = os.path.join(
    os.path.dirname(HERE), "build", "bench", f"py{sys.version_info[0]}{sys.version_info[1]}"
)


def build() -> str:
    """Compile floor.c if the shared object is missing or older; returns its path."""
    target = os.path.join(OUT_DIR, "_floor" + sysconfig.get_config_var("EXT_SUFFIX"))
    if os.path.exists(target) and os.path.getmtime(target) >= os.path.getmtime(SOURCE):
        return target
    os.makedirs(OUT_DIR, exist_ok=True)
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    include = sysconfig.get_paths()["include"]
    cmd = [*cc, "-shared", "-fPIC", "-O3", "-Wall", "-Wextra", f"-I{include}", SOURCE, "-o", target]
    subprocess.run(cmd, check=True)
    return target


def load() -> ModuleType:
    """The ``_floor`` module, built first if needed."""
    if "_floor" in sys.modules:
        return sys.modules["_floor"]
    spec = importlib.util.spec_from_file_location("_floor", build())
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["_floor"] = module
    spec.loader.exec_module(module)
    return module

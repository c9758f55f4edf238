"""``python -m tripwire doctor``: every path tripwire takes in this environment, each with its reason.

It forces the first use of each optional path (it imports torch and numpy when they are installed,
which builds the torch adapter if no build for this torch is cached), so it reports the state a
program gets, not a guess. Each line is ``name: path (reason)``; ``report()`` returns them as
(name, text) pairs for the tests.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

import tripwire._core as _core

from . import _adapter_build, tensors
from ._package import __version__, default_cache_dir


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _torch_adapter() -> list[tuple[str, str]]:
    out = []
    cxx = _adapter_build.find_compiler()
    compiler = "none found ($CXX, c++, g++, clang++ on PATH)"
    if cxx is not None:
        compiler = f"{' '.join(cxx)} ({_adapter_build.compiler_version(cxx) or 'no --version'})"
    out.append(("C++ compiler", compiler))
    switch = os.environ.get(_adapter_build.ENV_SWITCH)
    out.append(
        (
            "adapter cache",
            f"{_adapter_build.cache_root() / 'torch-adapter'}"
            + (f" ({_adapter_build.ENV_SWITCH}={switch})" if switch is not None else ""),
        )
    )
    if not _installed("torch"):
        out.append(("torch adapter", "not needed: torch is not installed"))
        return out
    try:
        importlib.import_module("torch")
    except Exception as e:  # noqa: BLE001 - a broken torch install is what doctor is for
        out.append(("torch adapter", f"not in use: torch does not import ({type(e).__name__}: {e})"))
        return out
    tensors.ensure_torch()
    out.append(("torch adapter", tensors.adapter_status()))
    build = _adapter_build.loaded_build()
    if build is not None:
        info = build.info
        how = "built now" if build.built_now else f"built {info.get('built', '?')}"
        out.append(
            (
                "  build",
                f"{build.path} ({how}, for torch {info.get('key', {}).get('torch', '?')} in "
                f"{info.get('torch_dir', '?')}, with {info.get('compiler', '?')})",
            )
        )
    elif _core.torch_adapter_installed():
        module: Any = sys.modules.get(_adapter_build.MODULE)
        out.append(("  build", str(getattr(module, "__file__", "?"))))
    return out


def _arrays() -> list[tuple[str, str]]:
    if not _installed("numpy"):
        return [("array reader", "not needed: numpy is not installed")]
    try:
        importlib.import_module("numpy")
    except Exception as e:  # noqa: BLE001
        return [("array reader", f"not in use: numpy does not import ({type(e).__name__}: {e})")]
    tensors.ensure_numpy()
    return [("array reader", tensors.array_path())]


def _dicts() -> list[tuple[str, str]]:
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stamp = (
        "a dict watcher's stamps (3.12+)" if sys.version_info >= (3, 12) else "ma_version_tag (CPython 3.11)"
    )
    hints = _core._dict_hints_enabled()
    skip = _core._skip_enabled()
    return [
        (
            "dict hints",
            f"{'on' if hints else 'off'} (the entry layout of CPython {py} "
            f"{'verified at start-up' if hints else 'not verified: lookups hash every key'})",
        ),
        (
            "dict versions",
            f"{stamp}; skip of unchanged subtrees {'on' if skip else 'off (its tag reading was not verified)'}",
        ),
    ]


def _frames() -> list[tuple[str, str]]:
    ok, why = _core._frame_verify_layout()
    if ok:
        text = f"interpreter-frame layout of CPython {sys.version.split()[0]} verified (frames read in place)"
    else:
        text = f"layout not verified: {why} (the frame runtime refuses to install)"
    return [("frame layouts", text)]


def _stores() -> list[tuple[str, str]]:
    out = [("store: Directory", f"available (default {default_cache_dir()})")]
    if _installed("redis"):
        redis: Any = importlib.import_module("redis")
        out.append(("store: Redis", f"available (redis-py {getattr(redis, '__version__', '?')})"))
    else:
        out.append(("store: Redis", "unavailable: redis-py is not installed (pip install redis)"))
    return out


def report() -> list[tuple[str, str]]:
    """(name, path and reason) for every path, the optional ones forced to their first use."""
    head = [
        ("tripwire", f"{__version__} in {os.path.dirname(_core.__file__)}"),
        ("python", f"{sys.version.split()[0]} ({sys.executable})"),
    ]
    return head + _torch_adapter() + _arrays() + _dicts() + _frames() + _stores()


def run() -> int:
    rows = report()
    width = max(len(name) for name, _ in rows)
    for name, text in rows:
        print(f"{name.ljust(width)}  {text}")
    return 0

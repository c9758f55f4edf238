"""
Switches and hooks for tripwire's tests and benchmarks: process-wide engine switches (fast pass, skip, frame walks), probes of internal readers, timing loops. Not for other code.
"""

from collections.abc import Sequence
import types
from typing import Any

import tripwire._core


def frame_set_strategy(code: types.CodeType, backend: Any, strategy: int) -> None: ...

def frame_backends(code: types.CodeType) -> list[tuple[Any, tripwire._core.CacheCore | None, int]]:
    """(backend, cache, strategy) for each backend that has seen `code`."""

def frame_force_shadow(on: bool) -> bool:
    """
    Test hook: run every replacement in a shadow frame; returns the previous setting.
    """

def frame_floor_eval(on: bool) -> bool:
    """
    Benchmark floor: install (True) or remove (False) a pass-through PEP 523 eval-frame function; False when the interpreter's eval function is not the expected one.
    """

def shape_time(relations: Sequence[str], values: dict, iterations: int) -> tuple:
    """
    Benchmark hook: (ns per evaluation, first failing relation or -1, kept relations, symbols, operations) for relations over symbols whose values are given by printed source: the frame, the symbol stores and the relations, in a C++ loop (no Python call per iteration).
    """

def read_tensor_property(value: object, kind: tripwire._core.StepKind, index: int) -> object:
    """
    The C-level reader of a SIZE/STRIDE/STORAGE_OFFSET step: the int, 'missing', or None when it leaves the step to the generic (Python) path.
    """

def hide_torch_mode_flag(on: bool) -> bool:
    """
    Test switch: act as if torch's mode-flag getter had not been found (a stripped library). Returns the previous setting.
    """

def numpy_dtype_fields(dtype: object) -> object:
    """(simple,) for a numpy dtype once the struct is enabled, else None."""

def set_fast_pass(on: bool) -> bool:
    """
    Test hook: switch GuardSet.check's straight-line fast pass on or off process-wide; returns the previous setting. Off, every check takes the tree walk.
    """

def set_skip(on: bool) -> bool:
    """
    Test hook: switch the skip of unchanged subtrees (dict version tags) on or off process-wide; returns the previous setting. Off, every check evaluates every guard. On only where the tag reading was verified at start-up.
    """

def dict_watch_counts() -> tuple:
    """
    (dicts the 3.12+ dict watcher stamps, DICT_VERSION change flags armed on them); (0, 0) before 3.12.
    """

CHECKS_REGIONS: bool = False

"""The engine's test switches as context managers, shared by the tensor, array and torch-state tests:
the fast pass on or off, and reading tensors, arrays and torch's state through the Python readers
even where the adapter or the numpy struct is available. Each restores what it found. Also the
skip tests' four-way agreement (skipping engine, no skip, tree walk, reference)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import reference
from tripwire import _core


@contextlib.contextmanager
def switches(*, fast: bool = True, python: bool = False) -> Iterator[None]:
    """Guard sets built inside use the fast pass iff `fast` and the Python readers iff `python`."""
    was_fast = _core.testing.set_fast_pass(fast)
    was_python = _core._force_python_readers(python)
    try:
        yield
    finally:
        _core.testing.set_fast_pass(was_fast)
        _core._force_python_readers(was_python)


@contextlib.contextmanager
def python_readers(on: bool) -> Iterator[None]:
    """Only the reader switch (the fast pass as it is)."""
    was = _core._force_python_readers(on)
    try:
        yield
    finally:
        _core._force_python_readers(was)


@contextlib.contextmanager
def fast_pass(on: bool) -> Iterator[None]:
    """Only the fast-pass switch (the readers as they are)."""
    was = _core.testing.set_fast_pass(on)
    try:
        yield
    finally:
        _core.testing.set_fast_pass(was)


def assert_passes_on_the_fast_pass(gs: Any, f_locals: dict) -> None:
    """``gs`` uses the fast pass, and checking ``f_locals`` passes on it (its count moves by one)."""
    assert gs._uses_fast_pass, gs.explain()
    n = gs._fast_pass_count
    assert gs.check(f_locals)
    assert gs._fast_pass_count == n + 1


def fast_once(gs: Any, f_locals: dict) -> bool:
    """Whether one more passing check of ``f_locals`` is decided by the fast pass alone, no residue
    run (the first check of a set fills the inline caches through the walk)."""
    fast, slow = gs._fast_pass_count, gs._residue_pass_count
    assert gs.check(f_locals) is True
    return gs._fast_pass_count == fast + 1 and gs._residue_pass_count == slow


def agree_with_and_without_skip(gs: Any, specs: list, f_locals: dict, f_globals: dict | None = None) -> bool:
    """The decision on ``f_locals``, asserted equal four ways: the skipping engine, the engine with
    the skip off, the tree walk (fast pass off) and the reference."""
    skip = gs.check(f_locals)
    was = _core.testing.set_skip(False)
    try:
        noskip = gs.check(f_locals)
    finally:
        _core.testing.set_skip(was)
    with fast_pass(False):
        walk = gs.check(f_locals)
    ref = reference.check(specs, f_locals, f_globals)
    assert skip == noskip == walk == ref, (skip, noskip, walk, ref)
    return skip

"""GLOBAL_STATE torch_dual_level: tripwire's probe for Dynamo's DUAL_LEVEL_MATCH (forward-mode AD's
current dual level, torch.autograd.forward_ad._current_level) decides as torch's own leaf, through
the adapter and through the Python reader, imported with guards_of from a compiled function that
enters ``fwAD.dual_level()``, saved and loaded, on the fast pass; with the level rebound to
non-ints, deleted, served by a module ``__getattr__``, and changed from inside a check.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import reference
import tripwire as tw
from engine_switches import assert_passes_on_the_fast_pass, python_readers
from tripwire import _core

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

import torch.autograd.forward_ad as fwAD  # noqa: E402
from torch._C._dynamo import guards as torch_guards  # noqa: E402
from torch._dynamo.eval_frame import _debug_get_cache_entry_list  # noqa: E402

from tripwire.torch import guards_of  # noqa: E402

tw.tensors.ensure_torch()
ADAPTER = _core.torch_adapter_installed()
PROBE = "torch_dual_level"
_MISSING = object()


@contextlib.contextmanager
def level_bound_to(value: Any) -> Iterator[None]:
    """forward_ad._current_level rebound (or deleted: _MISSING) for the block."""
    old = fwAD.__dict__.get("_current_level", _MISSING)
    if value is _MISSING:
        fwAD.__dict__.pop("_current_level", None)
    else:
        fwAD._current_level = value
    try:
        yield
    finally:
        if old is _MISSING:
            fwAD.__dict__.pop("_current_level", None)
        else:
            fwAD._current_level = old


@contextlib.contextmanager
def nested_levels(n: int) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for _ in range(n):
            stack.enter_context(fwAD.dual_level())
        yield


@contextlib.contextmanager
def module_getattr_serving(value: Any) -> Iterator[None]:
    """The attribute deleted and a module __getattr__ answering for it (getattr finds it)."""
    with level_bound_to(_MISSING):
        fwAD.__getattr__ = lambda name: value if name == "_current_level" else _raise(name)
        try:
            yield
        finally:
            del fwAD.__getattr__


def _raise(name: str) -> Any:
    raise AttributeError(name)


STATES: dict[str, Callable[[], Any]] = {
    "outside": contextlib.nullcontext,
    "level_0": lambda: nested_levels(1),
    "level_1": lambda: level_bound_to(1),  # torch refuses nested levels; the module global can hold it
    "as_str": lambda: level_bound_to("-1"),
    "as_float": lambda: level_bound_to(-1.0),
    "as_true": lambda: level_bound_to(True),  # an int subclass: not an exact int
    "as_int_subclass": lambda: level_bound_to(type("I", (int,), {})(-1)),
    "as_huge_int": lambda: level_bound_to(2**70),
    "deleted": lambda: level_bound_to(_MISSING),
    "module_getattr_minus_1": lambda: module_getattr_serving(-1),
    "module_getattr_0": lambda: module_getattr_serving(0),
}
# torch reads PyLong_AsLongLong of an exact int without checking for overflow (a huge int reads
# as -1 with an error left set); tripwire fails on it: stricter, never laxer.
TORCH_UNDEFINED = {"as_huge_int"}


def torch_leaf(level: int) -> Callable[[], bool]:
    root = torch_guards.RootGuardManager()
    root.add_dual_level_match_guard(level, [f"torch.autograd.forward_ad._current_level == {level}"], None)
    return lambda: root.check({})


def probe_sets(level: int | None) -> list[tw.GuardSet]:
    """The probe through the adapter and through the Python reader (snapshot: now, or `level`)."""
    out = []
    for python in (False, True):
        with python_readers(python):
            b = tw.GuardBuilder({})
            if level is None:
                b.global_state(PROBE)
            else:
                b.global_state(PROBE, snapshot=level)
            out.append(tw.GuardSet(b.guards) if level is not None else b.build())
    return out


@pytest.mark.parametrize("built_in", ["outside", "level_0", "level_1"])
def test_decisions_match_torchs_leaf(built_in: str) -> None:
    with STATES[built_in]():
        level = fwAD._current_level
        theirs = torch_leaf(level)
        sets = probe_sets(None)
    for name, state in STATES.items():
        with state():
            for i, gs in enumerate(sets):
                got = gs.check({})
                where = (built_in, name, "python" if i else "adapter")
                assert reference.check(gs.guards, {}) == got, where
                if name not in TORCH_UNDEFINED:
                    assert got == theirs(), where
                else:
                    assert not got, where
                if not got:
                    f = gs.why_not({})
                    assert f is not None and f.kind == "GLOBAL_STATE" and "dual level" in f.reason, where


def test_reason_names_the_level() -> None:
    (gs, _) = probe_sets(None)
    with level_bound_to(1):
        f = gs.why_not({})
    assert "torch.autograd.forward_ad._current_level) expected -1, got 1" in f.reason
    with level_bound_to("x"):
        assert "got a str (not an int)" in gs.why_not({}).reason
    with level_bound_to(_MISSING):
        assert "got nothing (getattr raised)" in gs.why_not({}).reason


def test_snapshot_is_an_int() -> None:
    for bad in ("-1", -1.0, True, None, 2**64):
        with pytest.raises(tw.GuardBuildError, match="torch_dual_level"):
            tw.GuardBuilder({}).global_state(PROBE, snapshot=bad)


def test_probe_keeps_the_fast_pass_and_says_its_path() -> None:
    if not ADAPTER:
        pytest.skip(tw.tensors.adapter_status())
    (gs, python) = probe_sets(None)
    assert_passes_on_the_fast_pass(gs, {})
    assert "[torch adapter]" in gs.explain()
    assert "[python reader" in python.explain()


def test_level_changed_from_inside_a_check() -> None:
    """A predicate checked after the (ambient) probe enters a dual level while the check runs: that
    check passes (the probe read -1 first, as torch's root reads its global-state leaves first),
    and the next one reads the level anew and fails: nothing is cached between checks."""
    entered: list[int] = []
    calls: list[None] = []

    def enters(L: Any) -> bool:
        if not calls:
            entered.append(fwAD.enter_dual_level())
        calls.append(None)
        return True

    b = tw.GuardBuilder({})
    b.global_state(PROBE)
    b.predicate(enters, "enters a dual level")
    gs = tw.GuardSet(b.guards)
    try:
        assert gs.check({}) and entered == [0]
        assert fwAD._current_level == 0
        assert not gs.check({}) and not reference.check(gs.guards, {})
    finally:
        while entered:
            fwAD.exit_dual_level(level=entered.pop())
    assert gs.check({})


def test_serialization_round_trip() -> None:
    for level in (-1, 0, 3):
        b = tw.GuardBuilder({})
        b.global_state(PROBE, snapshot=level)
        gs = tw.GuardSet(b.guards)
        loaded = tw.GuardSet.from_bytes(gs.to_bytes())
        assert [s.args[:2] for s in loaded.guards] == [(PROBE, level)]
        for name in ("outside", "level_0", "level_1", "as_str", "deleted"):
            with STATES[name]():
                assert loaded.check({}) == gs.check({}) == reference.check(gs.guards, {}), (level, name)


# -- imported from a compiled function ---------------------------------------------------------------
def dual_fn(x: Any, t: Any) -> Any:
    with fwAD.dual_level():
        d = fwAD.make_dual(x, t)
        return fwAD.unpack_dual(d * 2).tangent


def test_guards_of_imports_dual_level_match() -> None:
    torch._dynamo.reset()
    x, t = torch.randn(3), torch.randn(3)
    with warnings.catch_warnings():  # make_dual's first call scripts decompositions (deprecated)
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.compile(dual_fn, backend="eager")(x, t)
    (entry,) = _debug_get_cache_entry_list(dual_fn.__code__)
    gm = entry.guard_manager
    # UnpackedDualTensor's class dict is reached through TypeDictGuardAccessor (unsupported)
    gs = guards_of(dual_fn, drop=["TypeDictGuardAccessor"])
    (rec,) = [g for g in gs.torch_import.guards if g.kind == "DUAL_LEVEL_MATCH"]
    assert rec.outcome == "native" and rec.code == "torch.autograd.forward_ad._current_level == -1"
    assert not [g for g in gs.torch_import.guards if g.outcome == "torch"]
    L = {"x": x, "t": t}
    for name, state in STATES.items():
        if name in TORCH_UNDEFINED:
            continue
        with state():
            assert gs.check(L) == gm.check(L), name
    # torch's other guards still decide: a different shape fails both
    L2 = {"x": torch.randn(4), "t": torch.randn(4)}
    assert gs.check(L2) == gm.check(L2) is False

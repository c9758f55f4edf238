"""TENSOR_MATCH and DIMENSION_MARKING on one tensor, as torch emits them for every tensor input: the
fast program decides the pair in one op when the record matches and the tensor is certainly
unmarked (the type's facts under its version tag, then no instance storage at all or an instance
dict in a state already proved to lack the flag; docs/cpp.md, "A tensor's pair"). Every way a
marking can appear after a run of passing checks (so with every memo made) is checked against
torch's own guard_manager.check and the oracle, with the fast pass on and off: mark_dynamic,
mark_static, maybe_mark_dynamic, the attributes set by hand, an instance dict created later or
changed otherwise, the attributes or a __getattr__ set on the class, on a plain tensor, a tensor
without a dict, a Parameter, a Parameter subclass and a tensor subclass."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import reference
import tripwire as tw
from engine_switches import assert_passes_on_the_fast_pass, fast_pass
from tripwire import _core

torch = pytest.importorskip("torch")

from torch_guard_managers import guard_manager_of, torch_decides  # noqa: E402


class TensorSub(torch.Tensor):
    """A tensor subclass: torch guards its exact type like any other."""


class ParamSub(torch.nn.Parameter):
    """A Parameter subclass."""


def _with_dict() -> Any:
    t = torch.ones(4, 3)
    t.note = "x"  # an instance dict holding another attribute, as on many model parameters
    return t


MAKERS: dict[str, Callable[[], Any]] = {
    "no dict": lambda: torch.ones(4, 3),
    "with dict": _with_dict,
    "parameter": lambda: torch.nn.Parameter(torch.ones(4, 3)),
    "parameter subclass": lambda: ParamSub(torch.ones(4, 3)),
    "tensor subclass": lambda: torch.ones(4, 3).as_subclass(TensorSub),
}


def _set_class(t: Any, name: str, value: Any) -> Callable[[], None]:
    cls = type(t)
    had = name in cls.__dict__
    old = cls.__dict__.get(name)
    setattr(cls, name, value)
    return lambda: setattr(cls, name, old) if had else delattr(cls, name)


def _flag_getattr(self: Any, name: str) -> Any:
    if name == "_has_dynamo_dim_marking":
        return True
    raise AttributeError(name)


def _mutate(how: str, t: Any) -> Callable[[], None] | None:
    """Apply marking `how` to `t`; the undo for a class-level change (None for the instance's)."""
    if how == "mark_dynamic":
        torch._dynamo.mark_dynamic(t, 0)
    elif how == "mark_static":
        torch._dynamo.mark_static(t, 0)
    elif how == "maybe_mark_dynamic":
        torch._dynamo.maybe_mark_dynamic(t, 0)
    elif how == "flag and indices by hand":
        t._has_dynamo_dim_marking = True
        t._dynamo_dynamic_indices = {0}
    elif how == "flag only":
        t._has_dynamo_dim_marking = True
    elif how == "indices only":
        t._dynamo_dynamic_indices = {0}  # no flag: no constraint (torch passes)
    elif how == "dict created":
        _ = t.__dict__  # an empty dict materialised: still unmarked
    elif how == "other attribute":
        t.other = 1  # another dict state: still unmarked
    elif how == "dict replaced":
        t.__dict__ = {"_has_dynamo_dim_marking": True, "_dynamo_dynamic_indices": {0}}
    elif how == "flag deleted":
        torch._dynamo.mark_dynamic(t, 0)
        del t._has_dynamo_dim_marking
    elif how == "flag on the class":
        return _set_class(t, "_has_dynamo_dim_marking", True)
    elif how == "indices on the class":
        t._has_dynamo_dim_marking = True
        undo_class = _set_class(t, "_dynamo_dynamic_indices", {0})

        def undo() -> None:
            undo_class()
            del t._has_dynamo_dim_marking

        return undo
    elif how == "__getattr__ on the class":
        return _set_class(t, "__getattr__", _flag_getattr)
    else:
        raise AssertionError(how)
    return None


MUTATIONS = ["mark_dynamic", "mark_static", "maybe_mark_dynamic", "flag and indices by hand", "flag only",
             "indices only", "dict created", "other attribute", "dict replaced", "flag deleted", "flag on the class",
             "indices on the class", "__getattr__ on the class"]  # fmt: skip
CLASS_LEVEL = {"flag on the class", "indices on the class", "__getattr__ on the class"}


def _add(x: Any, w: Any) -> Any:
    return x * 2 + w


def _decide(gs: Any, gm: Any, f_locals: dict) -> bool:
    """torch's decision, asserted to be the oracle's and the engine's (fast pass on, three times:
    the memos are made and then used; and off)."""
    want = torch_decides(gm, f_locals)
    assert reference.check(gs.guards, f_locals, gs._f_globals) is want
    for _ in range(3):
        assert gs.check(f_locals) is want
    with fast_pass(False):
        assert gs.check(f_locals) is want
    return want


# Every maker with every mutation, but no class attribute on torch.Tensor or Parameter themselves
# (every tensor of the process would see it): those are set on the subclasses only.
CASES = [
    (maker, how)
    for maker in MAKERS
    for how in MUTATIONS
    if how not in CLASS_LEVEL or maker in ("parameter subclass", "tensor subclass")
]


@pytest.mark.parametrize("maker, how", CASES)
def test_marking_after_passing_checks_decides_as_torch(maker: str, how: str) -> None:
    x, w = MAKERS[maker](), torch.ones(4, 3)
    gm = guard_manager_of(_add, x, w)
    gs = tw.torch.guards_of(_add)
    kinds = [g.kind.name for g in gs.guards if str(g.source) == "L['x']"]
    assert "TENSOR_MATCH" in kinds and "DIMENSION_MARKING" in kinds
    f_locals = {"x": x, "w": w}
    assert gs.check(f_locals)  # the first fills the caches (a subclass's __torch_function__ reads)
    for _ in range(3):
        assert_passes_on_the_fast_pass(gs, f_locals)
    undo = _mutate(how, x)
    try:
        want = _decide(gs, gm, f_locals)
        # A marking changes torch's answer; the rest leave the tensor unmarked for torch.
        assert want is (how in ("indices only", "dict created", "other attribute", "flag deleted")), (
            maker,
            how,
        )
    finally:
        if undo is not None:
            undo()
    if undo is not None:
        assert _decide(gs, gm, f_locals) is True
        assert_passes_on_the_fast_pass(gs, f_locals)


@pytest.mark.parametrize("maker", list(MAKERS))
def test_a_marked_tensor_in_place_of_an_unmarked_one(maker: str) -> None:
    """After passing checks on one tensor, another of the same type and fields (its own dict, or
    none): unmarked it passes on the fast pass, marked it fails; and the first still passes."""
    x, w = MAKERS[maker](), torch.ones(4, 3)
    gm = guard_manager_of(_add, x, w)
    gs = tw.torch.guards_of(_add)
    assert gs.check({"x": x, "w": w})
    for _ in range(3):
        assert_passes_on_the_fast_pass(gs, {"x": x, "w": w})
    y = MAKERS[maker]()
    assert_passes_on_the_fast_pass(gs, {"x": y, "w": w})
    z = MAKERS[maker]()
    torch._dynamo.mark_dynamic(z, 1)
    assert _decide(gs, gm, {"x": z, "w": w}) is False
    assert _decide(gs, gm, {"x": x, "w": w}) is True
    assert _decide(gs, gm, {"x": y, "w": w}) is True


def test_unmarked_pair_passes_with_every_guard_on_the_fast_pass() -> None:
    """The pair decided in one op still counts both guards as decided by the fast pass, with the
    skip on and off (the absence memo is off with the skip: the DIMENSION_MARKING op decides)."""
    x, w = _with_dict(), torch.ones(4, 3)
    guard_manager_of(_add, x, w)
    gs = tw.torch.guards_of(_add)
    f_locals = {"x": x, "w": w}
    # The first check fills the marking's inline cache for x's type through the walk (a fill may
    # run user code, which the fast pass never does); every later one is the fast pass's.
    assert gs.check(f_locals) is True
    for skip in (True, False):
        was = _core.testing.set_skip(skip)
        try:
            for _ in range(3):
                assert_passes_on_the_fast_pass(gs, f_locals)
                assert gs._last_fast_guards == len(gs)
            torch._dynamo.mark_dynamic(x, 0)
            assert gs.check(f_locals) is False
            for name in ("_has_dynamo_dim_marking", "_dynamo_dynamic_indices"):
                delattr(x, name)
            assert gs.check(f_locals) is True
        finally:
            _core.testing.set_skip(was)

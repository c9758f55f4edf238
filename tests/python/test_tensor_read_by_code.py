"""Tensors whose metadata is answered by code, and the Python-key mask.

A ``__torch_dispatch__`` wrapper subclass built with ``dispatch_sizes_strides_policy``,
``dispatch_device`` or ``dispatch_layout`` answers ``sizes()``, ``strides()``, ``dim()``,
``storage_offset()``, ``device()`` or ``layout()`` by calling its Python ``__torch_dispatch__``.
The engine's native readers run inside regions without user code (docs/cpp.md): they must never
ask such a tensor (its dispatch may collect garbage, free what the region borrows, mutate the
guarded dict or raise). TENSOR_MATCH reads it through the Python reader outside any region, so
the decision is still torch's. These tests build such subclasses whose dispatch does each of
those things and compare every decision with torch's own guard (``RootGuardManager``).
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any

import pytest

import tripwire as tw
from engine_switches import assert_passes_on_the_fast_pass, switches
from gc_stress import scaled
from tripwire import _core, reference

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
from torch._C._dynamo import guards as torch_guards  # noqa: E402
from torch._dynamo.guards import GuardManagerType  # noqa: E402

tw.tensors.ensure_torch()
aten = torch.ops.aten

# What the dispatch does besides answering: set per test, read by every Wrapper.
ACTION: dict[str, Any] = {"do": None}
CALLS: list[str] = []


class Wrapper(torch.Tensor):
    """A wrapper subclass around ``elem``; ``policy`` picks what torch asks its Python for."""

    elem: Any

    @staticmethod
    def __new__(cls, elem: Any, policy: str = "sizes") -> Any:
        kwargs: dict[str, Any] = {}
        if policy in ("sizes", "strides"):
            kwargs["dispatch_sizes_strides_policy"] = policy
        elif policy == "device":
            kwargs["dispatch_device"] = True
        elif policy == "layout":
            kwargs["dispatch_layout"] = True
        r = torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), dtype=elem.dtype, device=elem.device, **kwargs
        )
        r.elem = elem
        return r

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        CALLS.append(str(func))
        if ACTION["do"] is not None:
            ACTION["do"]()
        e = args[0].elem
        answers = {
            aten.sym_size.default: lambda: tuple(e.size()),
            aten.size.default: lambda: tuple(e.size()),
            aten.sym_stride.default: lambda: tuple(e.stride()),
            aten.stride.default: lambda: tuple(e.stride()),
            aten.dim.default: e.dim,
            aten.sym_storage_offset.default: e.storage_offset,
            aten.storage_offset.default: e.storage_offset,
            aten.sym_numel.default: e.numel,
            aten.numel.default: e.numel,
            torch.ops.prim.device.default: lambda: e.device,
            torch.ops.prim.layout.default: lambda: e.layout,
            aten.is_contiguous.default: e.is_contiguous,
            aten.is_contiguous.memory_format: e.is_contiguous,
            aten.detach.default: lambda: Wrapper(e.detach()),
        }
        if func in answers:
            return answers[func]()
        return NotImplemented


POLICIES = ["sizes", "strides", "device", "layout"]


@contextlib.contextmanager
def dispatch_does(action: Any) -> Any:
    ACTION["do"] = action
    try:
        yield
    finally:
        ACTION["do"] = None


def torch_root(example: Any, exp: tw.tensors.TensorExpectation) -> Any:
    """torch's TENSOR_MATCH leaf for ``example`` with the same unchecked dimensions."""
    root = torch_guards.RootGuardManager()
    m = root.getitem_manager(
        key="t", source="L['t']", example_value=example, guard_manager_enum=GuardManagerType.GUARD_MANAGER
    )
    m.add_tensor_match_guard(
        example, list(exp.sizes), list(exp.strides), "L['t']", ["tm"], None, type(example),
        torch._C._dispatch_keys(example),
    )  # fmt: skip
    return root


def build(example: Any) -> tuple[tw.GuardSet, Any]:
    b = tw.GuardBuilder({"t": example})
    spec = b.tensor_match("L['t']")
    return b.build(), spec.args[1]


def candidates(policy: str) -> list[Any]:
    return [
        Wrapper(torch.zeros(2, 3), policy),
        Wrapper(torch.zeros(2, 4), policy),
        Wrapper(torch.zeros(3, 2).t(), policy),
        Wrapper(torch.zeros(2, 3, dtype=torch.float64), policy),
        Wrapper(torch.zeros(6)[1:].view(5), policy),
        torch.zeros(2, 3),
    ]


@pytest.mark.parametrize("policy", POLICIES)
def test_decides_as_torch_without_asking_inside_a_region(policy: str) -> None:
    """Every decision equals torch's, on the fast pass and the walk, through the adapter."""
    example = Wrapper(torch.zeros(2, 3), policy)
    gs, exp = build(example)
    assert gs._guard_path(0) == "native"
    theirs = torch_root(example, exp)
    for v in candidates(policy):
        L = {"t": v}
        want = theirs.check(L)
        for fast in (True, False):
            with switches(fast=fast):
                assert gs.check(L) == want, (policy, v.shape, fast)
        assert (gs.why_not(L) is None) == want
        assert reference.check(gs.guards, L) == want


@pytest.mark.parametrize("policy", POLICIES)
def test_reading_by_code_goes_through_the_python_reader(policy: str) -> None:
    """The native reader answers "read by code" without one dispatch; the fields then come from
    the Python reader (the same ones), so the builder and the diagnostics still name them."""
    w = Wrapper(torch.zeros(2, 3), policy)
    CALLS.clear()
    with switches(python=True):
        by_python = _core.read_tensor_fields(w, False)
    assert _core.read_tensor_fields(w, True) == by_python
    assert by_python[4] == (2, 3)


def test_a_wrapper_without_custom_policies_is_read_natively() -> None:
    """A wrapper subclass that leaves its metadata to torch is read from its fields: no dispatch,
    and its guard passes on the fast pass (the Python keys masked as torch masks them)."""
    w = torch.Tensor._make_wrapper_subclass(Wrapper, (2, 3), dtype=torch.float32)
    w.elem = torch.zeros(2, 3)
    gs, exp = build(w)
    CALLS.clear()
    assert_passes_on_the_fast_pass(gs, {"t": w})
    assert CALLS == []
    assert torch_root(w, exp).check({"t": w})


@pytest.mark.parametrize("policy", POLICIES)
def test_dispatch_that_collects_garbage(policy: str) -> None:
    """The dispatch runs gc.collect() (finalizers, weakref callbacks) on every metadata read."""
    example = Wrapper(torch.zeros(2, 3), policy)
    gs, exp = build(example)
    theirs = torch_root(example, exp)
    with dispatch_does(gc.collect):
        for _ in range(scaled(5, 5)):
            for v in candidates(policy)[:3]:
                L = {"t": v}
                assert gs.check(L) == theirs.check(L)


@pytest.mark.parametrize("policy", POLICIES)
def test_dispatch_that_raises(policy: str) -> None:
    """A raising dispatch: torch's guard raises; tripwire's guard fails, no error left set."""
    example = Wrapper(torch.zeros(2, 3), policy)
    gs, _ = build(example)

    def boom() -> None:
        raise RuntimeError("dispatch says no")

    with dispatch_does(boom):
        for fast in (True, False):
            with switches(fast=fast):
                assert gs.check({"t": example}) is False
        assert gs.why_not({"t": example}) is not None
    assert gs.check({"t": example}) is True


@pytest.mark.parametrize("policy", POLICIES)
def test_dispatch_that_mutates_the_guarded_dict(policy: str) -> None:
    """The dispatch replaces a value the check has already fetched (the only reference to the old
    one): the check must not read the freed object (ASan), and the next check sees the new one."""
    example = Wrapper(torch.zeros(2, 3), policy)
    b = tw.GuardBuilder({"u": [1, 2], "t": example})
    b.type_match("L['u']")
    b.tensor_match("L['t']")
    b.length("L['u']")
    gs = b.build()
    for fast in (True, False):
        with switches(fast=fast):
            L: dict[str, Any] = {"u": [1, 2], "t": example}

            def swap(L: dict[str, Any] = L) -> None:
                L["u"] = [object() for _ in range(5)]  # frees the list the check fetched

            with dispatch_does(swap):
                got = gs.check(L)
            assert got in (True, False)
            assert gs.check(L) is reference.check(gs.guards, L) is False  # length 5 now


@pytest.mark.parametrize("policy", POLICIES)
def test_inside_disabled_torch_dispatch(policy: str) -> None:
    """Under _DisableTorchDispatch the Python key is excluded from the thread-local sets, so the key
    comparison no longer stops a wrapper before its sizes: the one-call reader must still not read
    them. Decided as torch's guard built and checked inside the same context. (No assertion
    message shows a Wrapper: its repr segfaults in torch with the dispatch disabled.)"""
    example = Wrapper(torch.zeros(2, 3), policy)
    other = Wrapper(torch.zeros(2, 4), policy)
    with torch._C._DisableTorchDispatch():
        gs, exp = build(example)
        theirs = torch_root(example, exp)
        for fast in (True, False):
            with switches(fast=fast):
                for v in (example, other):
                    same = gs.check({"t": v}) == theirs.check({"t": v})
                    assert same, (policy, fast)

"""TENSOR_MATCH's one-call comparison (the adapter's tensor_matches) field by field, against torch.

The adapter reads a tensor whose policies are all Default straight from the impl's fields (dtype,
device_opt_, the autograd meta's requires_grad, the key set's layout keys, sizes_and_strides_,
storage_offset_); every other tensor goes to the full reader. Each case here changes one field
(dtype, device, requires_grad, a size, a stride, the storage offset, the rank, the dispatch keys)
or takes a form the direct read special-cases (0-dim, more dims than the impl stores inline, an
as_strided view, in-place metadata changes on the same object, a subclass, a sparse tensor, a
view whose requires_grad comes from its base) and asserts the decision: the expected value, the
engine four ways and the reference (agree_with_and_without_skip), and torch's own
guard_manager.check on the same value, built on the same example.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

import reference
import tripwire as tw
from engine_switches import agree_with_and_without_skip
from gc_stress import scaled

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from torch_guard_managers import guard_manager_of, torch_decides  # noqa: E402

tw.tensors.ensure_torch()
ADAPTER = tw._core.torch_adapter_installed()


class Sub(torch.Tensor):
    pass


def _double(x: Any) -> Any:
    return x * 2  # defined for every case here, sparse tensors included


def _torch_manager(x: Any) -> Any:
    return guard_manager_of(_double, x, dynamic=False)


def _guards(x: Any) -> tw.GuardSet:
    b = tw.GuardBuilder({"x": x})
    b.tensor_match("L['x']")
    return b.build()


def _decides(gs: tw.GuardSet, gm: Any, v: Any, want: bool, field: str | None = None) -> None:
    """tripwire decides `want` on v every way (twice: the first check, then what it memoised),
    torch's guard manager agrees, and a failure names `field` when given."""
    L = {"x": v}
    for _ in range(2):
        assert agree_with_and_without_skip(gs, list(gs.guards), L) is want
    assert torch_decides(gm, {"x": v}) is want
    if not want and field is not None:
        f = gs.why_not(L)
        assert f is not None and field in f.reason, f


def _strided(size: tuple[int, ...], stride: tuple[int, ...], offset: int = 0) -> Any:
    return torch.zeros(64).as_strided(size, stride, offset)


# (name, example, variant maker, expected, the field the failure names)
CASES: list[tuple[str, Callable[[], Any], Callable[[], Any], bool, str | None]] = [
    ("same", lambda: torch.zeros(2, 3), lambda: torch.ones(2, 3), True, None),
    ("dtype", lambda: torch.zeros(2, 3), lambda: torch.zeros(2, 3, dtype=torch.float64), False, "dtype"),
    ("int dtype", lambda: torch.zeros(2, 3), lambda: torch.zeros(2, 3, dtype=torch.int32), False, "dtype"),
    (
        "requires_grad on",
        lambda: torch.zeros(2, 3),
        lambda: torch.zeros(2, 3, requires_grad=True),
        False,
        "requires_grad",
    ),
    (
        "requires_grad off",
        lambda: torch.zeros(2, 3, requires_grad=True),
        lambda: torch.zeros(2, 3),
        False,
        "requires_grad",
    ),
    (
        "non-leaf",
        lambda: torch.zeros(2, 3),
        lambda: torch.zeros(2, 3, requires_grad=True) * 2,
        False,
        "requires_grad",
    ),
    ("size", lambda: torch.zeros(2, 3), lambda: torch.zeros(2, 4), False, "size"),
    ("first size", lambda: torch.zeros(2, 3), lambda: _strided((3, 3), (3, 1)), False, "size"),
    ("rank", lambda: torch.zeros(2, 3), lambda: torch.zeros(2, 3, 1), False, None),
    ("stride", lambda: torch.zeros(2, 3), lambda: torch.zeros(3, 2).t(), False, "stride"),
    ("as_strided same", lambda: torch.zeros(2, 3), lambda: _strided((2, 3), (3, 1)), True, None),
    ("as_strided stride", lambda: torch.zeros(2, 3), lambda: _strided((2, 3), (4, 1)), False, "stride"),
    # torch's TENSOR_MATCH leaves the storage offset alone (test_the_storage_offset_when_asked).
    (
        "as_strided offset",
        lambda: torch.zeros(2, 3),
        lambda: _strided((2, 3), (3, 1), 5),
        True,
        None,
    ),
    ("sliced offset", lambda: torch.zeros(2, 3), lambda: torch.zeros(3, 3)[1:], True, None),
    ("meta device", lambda: torch.zeros(2, 3), lambda: torch.zeros(2, 3, device="meta"), False, None),
    (
        "inference keys",
        lambda: torch.zeros(2, 3),
        lambda: _inference(lambda: torch.zeros(2, 3)),
        False,
        "dispatch",
    ),
    (
        "inference both",
        lambda: _inference(lambda: torch.zeros(2, 3)),
        lambda: _inference(lambda: torch.zeros(2, 3)),
        True,
        None,
    ),
    ("sparse", lambda: torch.zeros(2, 3), lambda: torch.zeros(2, 3).to_sparse(), False, None),
    ("a subclass value", lambda: torch.zeros(2, 3), lambda: torch.zeros(2, 3).as_subclass(Sub), False, None),
    (
        "a subclass example",
        lambda: torch.zeros(2, 3).as_subclass(Sub),
        lambda: torch.ones(2, 3).as_subclass(Sub),
        True,
        None,
    ),
    (
        "a subclass example, size",
        lambda: torch.zeros(2, 3).as_subclass(Sub),
        lambda: torch.ones(2, 4).as_subclass(Sub),
        False,
        "size",
    ),
    (
        "a parameter value",
        lambda: torch.zeros(2, 3),
        lambda: torch.nn.Parameter(torch.zeros(2, 3), requires_grad=False),
        False,
        None,
    ),
    ("0-dim", lambda: torch.tensor(1.0), lambda: torch.tensor(2.0), True, None),
    ("0-dim against 1-dim", lambda: torch.tensor(1.0), lambda: torch.zeros(1), False, None),
    ("0-dim dtype", lambda: torch.tensor(1.0), lambda: torch.tensor(1), False, "dtype"),
    (
        "0-dim as_strided offset",
        lambda: torch.tensor(1.0),
        lambda: _strided((), (), 3),
        True,
        None,
    ),
    # More dims than SizesAndStrides keeps inline (5): sizes and strides out of line.
    ("6 dims", lambda: torch.zeros(1, 2, 1, 2, 1, 2), lambda: torch.ones(1, 2, 1, 2, 1, 2), True, None),
    (
        "9 dims",
        lambda: torch.zeros(2, 1, 2, 1, 2, 1, 2, 1, 2),
        lambda: torch.ones(2, 1, 2, 1, 2, 1, 2, 1, 2),
        True,
        None,
    ),
    (
        "9 dims, last size",
        lambda: torch.zeros(2, 1, 2, 1, 2, 1, 2, 1, 2),
        lambda: torch.zeros(2, 1, 2, 1, 2, 1, 2, 1, 3),
        False,
        "size",
    ),
    (
        "9 dims, a size-1 stride",
        lambda: torch.zeros(2, 1, 2, 1, 2, 1, 2, 1, 2),
        lambda: torch.zeros(2, 1, 2, 1, 2, 1, 2, 1, 2).as_strided(
            (2, 1, 2, 1, 2, 1, 2, 1, 2), (16, 99, 8, 8, 4, 4, 2, 2, 1)
        ),
        False,
        "stride",
    ),
    (
        "9 dims, permuted",
        lambda: torch.zeros(2, 1, 2, 1, 2, 1, 2, 1, 2),
        lambda: torch.zeros(2, 1, 2, 1, 2, 1, 2, 1, 2).transpose(0, 2),
        False,
        "stride",
    ),
    (
        "9 against 8 dims",
        lambda: torch.zeros(2, 1, 2, 1, 2, 1, 2, 1, 2),
        lambda: torch.zeros(2, 1, 2, 1, 2, 1, 2, 2),
        False,
        None,
    ),
]


def _inference(make: Callable[[], Any]) -> Any:
    with torch.inference_mode():
        return make()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_one_field_changed_decides_as_torch(case: tuple) -> None:
    _, example, variant, want, field = case
    x = example()
    gs = _guards(x)
    gm = _torch_manager(x)
    _decides(gs, gm, x, True)
    _decides(gs, gm, variant(), want, field)


# In-place changes to the guarded object itself: each is read anew on the next check.
INPLACE: list[tuple[str, Callable[[Any], Any], str | None]] = [
    ("resize_", lambda t: t.resize_(3, 2), "size"),
    ("t_", lambda t: t.t_(), "size"),
    ("as_strided_ stride", lambda t: t.as_strided_((2, 3), (1, 2)), "stride"),
    ("requires_grad_", lambda t: t.requires_grad_(), "requires_grad"),
    ("unsqueeze_", lambda t: t.unsqueeze_(0), None),
    ("resize_ to 9 dims", lambda t: t.resize_(1, 2, 1, 3, 1, 1, 1, 1, 1), None),
]


@pytest.mark.parametrize("change", INPLACE, ids=[c[0] for c in INPLACE])
def test_in_place_metadata_changes_on_the_guarded_object(change: tuple) -> None:
    _, mutate, field = change
    x = torch.zeros(64)[:6].view(2, 3)
    x = x.clone()  # a leaf of its own storage: every in-place change is allowed
    gs = _guards(x)
    gm = _torch_manager(x)
    _decides(gs, gm, x, True)
    mutate(x)
    _decides(gs, gm, x, False, field)


@pytest.mark.parametrize(
    "make", [lambda: torch.zeros(2, 3), lambda: torch.tensor(1.0), lambda: torch.zeros(2, 1, 2, 1, 2, 1, 2)]
)
def test_the_storage_offset_when_asked(make: Callable[[], Any]) -> None:
    # Beyond torch's check (it has no such field): decided against the reference alone.
    shape = make().shape
    x = _strided(shape, torch.empty(shape).stride())  # room in its storage to move in place
    b = tw.GuardBuilder({"x": x})
    b.tensor_match("L['x']", storage_offset=True)
    gs = b.build()
    moved = torch.zeros(64).as_strided(x.shape, x.stride(), 3)
    for v, want in [(x, True), (moved, False), (torch.zeros(64).as_strided(x.shape, x.stride(), 0), True)]:
        for _ in range(2):
            assert agree_with_and_without_skip(gs, list(gs.guards), {"x": v}) is want
    f = gs.why_not({"x": moved})
    assert f is not None and "storage_offset" in f.reason, f
    x.as_strided_(x.shape, x.stride(), 1)  # the guarded object itself, moved in place
    assert agree_with_and_without_skip(gs, list(gs.guards), {"x": x}) is False


def test_a_sparse_example_goes_to_the_full_reader() -> None:
    # No strides and a custom strides policy: never read by the one call. (torch.compile leaves no
    # cache entry for it, so the reference alone is the oracle.)
    gs = _guards(torch.zeros(2, 3).to_sparse())
    for v, want in [
        (torch.ones(2, 3).to_sparse(), True),
        (torch.ones(2, 4).to_sparse(), False),
        (torch.zeros(2, 3), False),
        (torch.zeros(2, 3, dtype=torch.float64).to_sparse(), False),
    ]:
        for _ in range(2):
            assert agree_with_and_without_skip(gs, list(gs.guards), {"x": v}) is want


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_impls_that_are_not_plain_tensor_impls() -> None:
    # torch.Tensor by type, with impls of their own: a functionalization wrapper (its own keys) and
    # a nested tensor (custom sizes: never read by the one call), as values (no guard is built on
    # either: their fields cannot be read). Decided four ways with the reference.
    def wrapped(*size: int) -> Any:
        return torch._to_functional_tensor(torch.zeros(*size))

    def nested(*rows: int) -> Any:
        return torch.nested.nested_tensor([torch.zeros(r, 3) for r in rows])

    cases = [
        (torch.zeros(2, 3), wrapped(2, 3), False),
        (torch.zeros(2, 3, 1), wrapped(2, 3, 1), False),
        (torch.zeros(2, 3), nested(2, 2), False),
        (torch.zeros(2, 3), torch.zeros(2, 3), True),
    ]
    for example, v, want in cases:
        gs = _guards(example)
        assert agree_with_and_without_skip(gs, list(gs.guards), {"x": example}) is True
        for _ in range(2):
            assert agree_with_and_without_skip(gs, list(gs.guards), {"x": v}) is want


def test_a_view_whose_base_starts_requiring_grad() -> None:
    # The view's own meta (a DifferentiableViewMeta: not the plain AutogradMeta the direct read
    # answers inline) says requires_grad through its base alone.
    base = torch.zeros(6)
    v = base.view(2, 3)
    gs = _guards(torch.zeros(2, 3))
    gm = _torch_manager(torch.zeros(2, 3))
    _decides(gs, gm, v, True)
    base.requires_grad_()
    _decides(gs, gm, v, False, "requires_grad")
    base.requires_grad_(False)
    _decides(gs, gm, v, True)


def test_keys_changed_by_the_thread_s_autocast_state() -> None:
    # Under autocast the thread's excluded set no longer holds the autocast keys, so the tensor's
    # applied keys differ from the example's (torch fails the same check, on its keys and on its
    # global state).
    x = torch.zeros(2, 3)
    gs = _guards(x)
    gm = _torch_manager(x)
    with torch.autocast("cpu"):
        assert gs.check({"x": x}) is False
        assert torch_decides(gm, {"x": x}) is False
        f = gs.why_not({"x": x})
        assert f is not None and "dispatch" in f.reason, f
    _decides(gs, gm, x, True)


def test_the_direct_requires_grad_route_was_verified_at_load() -> None:
    if not ADAPTER:
        pytest.skip("the torch adapter is not loaded in this build")
    import tripwire._torch_adapter as adapter

    # Found on a fresh tensor at load and checked against torch's accessor both ways; without it
    # every tensor takes torch's TensorImpl::requires_grad() (correct, slower).
    assert adapter.autograd_route == 1


def test_random_metadata_changes_decide_as_torch_and_the_reference() -> None:
    # Random in-place changes (resize_, as_strided_, t_, unsqueeze_, squeeze_, requires_grad_,
    # detach_) and replacements (a view, another dtype, an inference tensor) over a pool of
    # tensors; after each step every set decides every tensor as the reference and torch's guard
    # manager do.
    rng = random.Random(27)
    examples = {
        "2d": torch.zeros(2, 3),
        "0d": torch.tensor(1.0),
        "9d": torch.zeros(2, 1, 2, 1, 2, 1, 2, 1, 2),
        "leaf": torch.zeros(3, 2, requires_grad=True),
    }
    sets = {n: (_guards(x), _torch_manager(x)) for n, x in examples.items()}

    def fresh() -> dict[str, Any]:
        pool = {n: x.detach().clone().requires_grad_(x.requires_grad) for n, x in examples.items()}
        pool["big"] = torch.zeros(64)
        return pool

    pool = fresh()
    decided = set()
    for step in range(scaled(120, divisor=3)):
        if step % 40 == 0:
            pool = fresh()
        n = rng.choice(list(pool))
        t = pool[n]
        op = rng.randrange(10)
        try:
            if op == 0:
                t.resize_(rng.choice([(2, 3), (3, 2), (), (6,), (2, 1, 2, 1, 2, 1, 2, 1, 2)]))
            elif op == 1:
                shape = rng.choice([(2, 3), (3, 2), ()])
                t.as_strided_(shape, torch.empty(shape).stride()[::-1] if shape else (), rng.randrange(2))
            elif op == 2:
                t.t_()
            elif op == 3:
                t.unsqueeze_(0)
            elif op == 4:
                t.squeeze_()
            elif op == 5:
                t.requires_grad_(not t.requires_grad)
            elif op == 6:
                t.detach_()
            elif op == 7:
                pool[n] = t.view(-1).view(t.shape) if t.dim() else t.view(())
            elif op == 8:
                pool[n] = t.detach().to(rng.choice([torch.float32, torch.float64, torch.int64]))
            else:
                with torch.inference_mode():
                    pool[n] = torch.zeros(t.shape)
        except RuntimeError:
            pass  # torch refuses (a non-leaf's requires_grad_, a view's detach_, storage bounds)
        for name, (gs, gm) in sets.items():
            for m, v in pool.items():
                L = {"x": v}
                ours = gs.check(L)
                assert ours == reference.check(gs.guards, L, {}), (name, m, op)
                assert ours == torch_decides(gm, {"x": v}), (name, m, op)
                decided.add(ours)
    assert decided == {True, False}

"""requires_grad as TENSOR_MATCH reads it.

The torch adapter reads a tensor's requires_grad through torch's own TensorImpl::requires_grad()
(cpp/adapters/torch/tensors.cpp), which asks the impl's autograd meta (a view's
DifferentiableViewMeta also asks the view's base). These tests pin that TENSOR_MATCH decides as
torch does on every kind of meta, read anew on every check: flipped after
the guard was built (both ways, on a Tensor and a Parameter), a non-leaf (requires_grad through
its grad_fn only), views (through the base only: the view's own fields never change), detach, and
inference tensors. Each decision is asserted against the expected value, the reference, the
engine with and without the skip and the tree walk, and where it applies torch's own
guard_manager.check on the same value.
"""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
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


def _guards(x: Any) -> tw.GuardSet:
    b = tw.GuardBuilder({"x": x})
    b.tensor_match("L['x']")
    return b.build()


def _decides(gs: tw.GuardSet, x: Any, want: bool) -> None:
    """The set's decision on x is `want`, the same every way the engine can take, and its failure
    names requires_grad when that is the field that differs."""
    L = {"x": x}
    for _ in range(2):  # the first check, then whatever it memoised
        assert agree_with_and_without_skip(gs, list(gs.guards), L) is want
    f = gs.why_not(L)
    assert (f is None) is want, f


def _add_one(x: Any) -> Any:
    return x + 1


def _torch_manager(x: Any) -> Any:
    return guard_manager_of(_add_one, x)


def test_the_adapter_s_direct_routes_were_verified_at_load() -> None:
    if not ADAPTER:
        pytest.skip("the torch adapter is not loaded in this build")
    import tripwire._torch_adapter as adapter

    # read_by_code's "every policy Default" as one masked load was verified on a tensor whose
    # policies were set one by one through torch's public setters (the policies' tests are
    # test_tensor_read_by_code.py: wrapper subclasses whose sizes, strides, device or layout are
    # answered by their Python).
    assert adapter.policy_window == 1


@pytest.mark.parametrize(
    "make", [torch.zeros, lambda *s: torch.nn.Parameter(torch.zeros(*s))], ids=["tensor", "parameter"]
)
def test_requires_grad_flipped_after_build_is_seen_both_ways(make: Callable[..., Any]) -> None:
    x = make(2, 3)
    built = x.requires_grad
    gs = _guards(x)
    _decides(gs, x, True)
    x.requires_grad_(not built)  # the same object, its meta created or its flag cleared in place
    _decides(gs, x, False)
    assert f"requires_grad expected {built}, got {not built}" in gs.why_not({"x": x}).reason
    x.requires_grad_(built)  # back: a tensor keeps the meta its first flip created
    _decides(gs, x, True)
    x.requires_grad_(not built)
    _decides(gs, x, False)


def test_a_parameter_built_without_grad_and_one_with() -> None:
    p = torch.nn.Parameter(torch.zeros(2, 3), requires_grad=False)
    gs = _guards(p)
    _decides(gs, p, True)
    _decides(gs, torch.nn.Parameter(torch.zeros(2, 3)), False)
    _decides(_guards(torch.nn.Parameter(torch.zeros(2, 3))), p, False)


def test_a_non_leaf_requires_grad_through_its_grad_fn() -> None:
    leaf = torch.zeros(2, 3, requires_grad=True)
    y = leaf * 2  # its own requires_grad_ field is False: True only through grad_fn
    assert y.requires_grad and not y.is_leaf and y.grad_fn is not None
    plain = _guards(torch.zeros(2, 3))
    _decides(plain, y, False)
    _decides(_guards(y), y, True)
    _decides(_guards(y), leaf.detach() * 2, False)
    with torch.no_grad():
        z = leaf * 2  # no grad_fn under no_grad
    _decides(plain, z, True)
    gm = _torch_manager(torch.zeros(2, 3))
    assert torch_decides(gm, {"x": y}) is False and torch_decides(gm, {"x": z}) is True


def test_detach_drops_requires_grad() -> None:
    leaf = torch.zeros(2, 3, requires_grad=True)
    gs = _guards(leaf)
    _decides(gs, leaf.detach(), False)
    _decides(_guards(torch.zeros(2, 3)), leaf.detach(), True)
    _decides(_guards(torch.zeros(2, 3)), (leaf * 2).detach(), True)


def test_a_view_requires_grad_through_its_base_alone() -> None:
    # The view's own fields (requires_grad_, grad_fn_) never change here: only its base's flag. A
    # reader of the view's fields alone (AutogradMeta's rule on a DifferentiableViewMeta) would
    # pass it; torch fails it.
    base = torch.zeros(6)
    v = base.view(2, 3)
    gs = _guards(torch.zeros(2, 3))
    gm = _torch_manager(torch.zeros(2, 3))
    _decides(gs, v, True)
    assert torch_decides(gm, {"x": v}) is True
    base.requires_grad_()
    assert v.requires_grad and v.grad_fn is None
    _decides(gs, v, False)
    assert torch_decides(gm, {"x": v}) is False
    base.requires_grad_(False)
    _decides(gs, v, True)
    # A view of a leaf made under no_grad: no grad_fn, requires grad through the base.
    leaf = torch.zeros(6, requires_grad=True)
    with torch.no_grad():
        w = leaf.view(2, 3)
    assert w.requires_grad and w.grad_fn is None
    _decides(gs, w, False)
    _decides(_guards(w), w, True)
    leaf.requires_grad_(False)
    assert not w.requires_grad
    _decides(_guards(torch.zeros(2, 3)), w, True)
    # A view with its own grad_fn (made under grad mode), and a view of a view.
    leaf.requires_grad_(True)
    u = leaf.view(3, 2).view(2, 3)
    assert u.requires_grad and u.grad_fn is not None
    _decides(gs, u, False)
    _decides(_guards(u), u, True)


def test_inference_tensors_have_no_autograd_meta() -> None:
    with torch.inference_mode():
        t = torch.zeros(2, 3)
    assert t.is_inference() and not t.requires_grad
    gs = _guards(t)
    _decides(gs, t, True)
    _decides(gs, torch.zeros(2, 3), False)  # a normal tensor's keys carry autograd
    _decides(_guards(torch.zeros(2, 3)), t, False)
    with torch.inference_mode():
        u = torch.zeros(2, 3)
    _decides(gs, u, True)


def test_detach_in_place_after_build() -> None:
    leaf = torch.zeros(2, 3, requires_grad=True)
    y = leaf * 2
    gs = _guards(y)
    _decides(gs, y, True)
    y.detach_()  # the same object: grad_fn dropped, requires_grad False
    _decides(gs, y, False)
    _decides(_guards(torch.zeros(2, 3)), y, True)


def _world() -> dict[str, Any]:
    base = torch.zeros(6)
    leaf = torch.zeros(6, requires_grad=True)
    objs = {
        "base": base,
        "leaf": leaf,
        "param": torch.nn.Parameter(torch.zeros(6)),
        "view_of_base": base.view(2, 3),
        "view_of_leaf": leaf.view(2, 3),
        "view_of_view": leaf.view(2, 3).view(6),
        "non_leaf": leaf * 2,
        "detached": leaf.detach(),
    }
    with torch.no_grad():
        objs["view_no_grad"] = leaf.view(3, 2)
    with torch.inference_mode():
        objs["inference"] = torch.zeros(6)
    return objs


def test_random_requires_grad_states_decide_as_torch_reads_them() -> None:
    # Random flips, in-place detaches, new views (under grad and no_grad) and new non-leaves over
    # tensors of every meta kind; every set checked against every tensor after each step. The
    # reference reads x.requires_grad through torch's Python attribute, i.e. torch's own
    # TensorImpl::requires_grad(). (The same loop run for 30 s gives about 330,000 decisions, zero
    # disagreements.)
    rng = random.Random(20)
    decided = set()
    for _ in range(scaled(6, divisor=3)):
        objs = _world()
        names = list(objs)
        sets = {n: _guards(objs[n]) for n in names}
        for _ in range(25):
            n = rng.choice(names)
            t = objs[n]
            op = rng.randrange(5)
            try:
                if op == 0:
                    t.requires_grad_(not t.requires_grad)
                elif op == 1:
                    t.detach_()
                elif op == 2:
                    objs[n] = t.view(-1) if rng.random() < 0.5 else t.detach()
                elif op == 3:
                    with torch.no_grad():
                        objs[n] = objs[rng.choice(names)].view(-1)
                else:
                    objs[n] = objs[rng.choice(names)] * 1
            except RuntimeError:
                pass  # torch refuses (requires_grad_ on a non-leaf, detach_ of a view): no change
            for gs in sets.values():
                for m in names:
                    L = {"x": objs[m]}
                    ours = gs.check(L)
                    assert ours == reference.check(gs.guards, L, {}), (n, m, op)
                    decided.add(ours)
    assert decided == {True, False}


@pytest.mark.parametrize("context", ["torch.inference_mode()", "torch.no_grad()"])
def test_the_load_checks_pass_when_the_adapter_loads_inside_a_mode(context: str) -> None:
    # The adapter's load checks build tensors with autograd (a non-leaf needs grad mode, flips
    # need a non-inference tensor): they set their own modes and restore the caller's.
    if not ADAPTER:
        pytest.skip("the torch adapter is not loaded in this build")
    code = textwrap.dedent(f"""
        import torch
        with {context}:
            import tripwire
            tripwire.tensors.ensure_torch()
            import tripwire._torch_adapter as a
            print(a.policy_window, torch.is_grad_enabled(), torch.is_inference_mode_enabled())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    inference = "inference" in context
    assert out.stdout.split() == ["1", "False", str(inference)], out.stdout

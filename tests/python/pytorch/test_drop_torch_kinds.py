"""``to_bytes(drop=...)`` on sets imported with ``tripwire.torch.guards_of``: every torch kind name the
import lists (``torch_import.guards``) names the tripwire guards that implement it, as
``guards_of(drop=...)`` does (a name that is also a tripwire kind, GLOBAL_STATE or TENSOR_MATCH,
drops the guards of that tripwire kind as well): NO_TENSOR_ALIASING (a NO_ALIAS), STORAGE_OVERLAPPING,
DUAL_LEVEL_MATCH (GLOBAL_STATE torch_dual_level), the leaves below the C++ tensor steps
(TENSOR_SIZE / TENSOR_STRIDE / TENSOR_STORAGE_OFFSET / GRAD sources), and the others. Each drop is
checked on the saved bytes: exactly those guards are gone, ``GuardSet.dropped`` and ``explain()``
name them, and the rest still decide as before.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

import tripwire as tw

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
import torch.autograd.forward_ad as fwAD  # noqa: E402

from tensor_step_entry import entry_with_tensor_step_leaves, f_two  # noqa: E402

tw.tensors.ensure_torch()
needs_adapter = pytest.mark.skipif(
    not tw._core.torch_adapter_installed(), reason="the C++ tensor steps need the torch adapter"
)


def f_views(a: Any, b: Any, c: Any) -> Any:
    a.add_(1)
    return a + b.sum() + c.sum()


def dual_fn(x: Any, t: Any) -> Any:
    with fwAD.dual_level():
        d = fwAD.make_dual(x, t)
        return fwAD.unpack_dual(d * 2).tangent


def import_views() -> tuple[Any, dict]:
    torch._dynamo.reset()
    base = torch.randn(20)
    torch.compile(f_views, backend="aot_eager", dynamic=True)(base[0:6], base[4:10], base[12:18])
    fresh = torch.randn(20)
    return tw.torch.guards_of(f_views), {"a": fresh[0:6], "b": fresh[4:10], "c": fresh[12:18]}


def import_dual() -> tuple[Any, dict]:
    torch._dynamo.reset()
    x, t = torch.randn(3), torch.randn(3)
    with warnings.catch_warnings():  # make_dual's first call scripts decompositions (deprecated)
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.compile(dual_fn, backend="eager")(x, t)
    return tw.torch.guards_of(dual_fn, drop=["TypeDictGuardAccessor"]), {"x": x, "t": t}


def import_tensor_steps() -> tuple[Any, dict]:
    """An entry with leaves below torch's TensorPropertyGuardAccessor and GradGuardAccessor."""
    _, x, z = entry_with_tensor_step_leaves()
    return tw.torch.guards_of(f_two), {"x": x, "z": z}


def implementing(gs: Any, torch_kind: str) -> set[int]:
    return {i for g in gs.torch_import.guards if g.kind == torch_kind for i in g.guards}


def unserializable(gs: Any) -> list[str]:
    """The sources of the guards this import cannot save (they must be dropped by name too)."""
    try:
        gs.to_bytes()
    except tw.NotSerializable as e:
        return [str(src) for _, src, _ in e.guards]
    return []


def check_drop(gs: Any, L: dict, name: str) -> tw.GuardSet:
    """Save without `name`; the loaded set lacks exactly its guards and names them."""
    gone = implementing(gs, name)
    assert gone, f"{name} is implemented by no tripwire guard here"
    gone |= {s.index for s in gs.guards if s.kind.name == name}  # a tripwire kind of that name too
    also = unserializable(gs)
    gone_too = {s.index for s in gs.guards if s.source is not None and str(s.source) in also}
    loaded = tw.GuardSet.from_bytes(gs.to_bytes(drop=[name, *also]))
    kept = [s for s in gs.guards if s.index not in gone | gone_too]
    assert sorted(s.describe() for s in loaded.guards) == sorted(s.describe() for s in kept)
    want = sorted((s.kind.name, "" if s.source is None else str(s.source), s.describe()) for s in gs.guards
                  if s.index in gone)  # fmt: skip
    assert sorted(d for d in loaded.dropped if d[1] not in also) == want
    text = loaded.explain()
    for kind, src, _ in want:
        assert f"{kind} on {src or 'global state'}" in text, text
    assert loaded.check(L) is True
    return loaded


@needs_adapter
@pytest.mark.parametrize(
    "name", ["NO_TENSOR_ALIASING", "STORAGE_OVERLAPPING", "DIMENSION_DYNAMIC_MARKING_GUARD", "TENSOR_MATCH"]
)
def test_aliasing_and_overlap_kinds(name: str) -> None:
    gs, L = import_views()
    loaded = check_drop(gs, L, name)
    if name == "NO_TENSOR_ALIASING":
        assert {s.kind.name for s in gs.guards if s.index in implementing(gs, name)} == {"NO_ALIAS"}
        assert "NO_ALIAS" not in {s.kind.name for s in loaded.guards}


@needs_adapter
def test_every_torch_kind_of_an_import_is_nameable() -> None:
    gs, L = import_views()
    kinds = sorted({g.kind for g in gs.torch_import.guards if g.guards})
    assert "NO_TENSOR_ALIASING" in kinds and "GLOBAL_STATE" in kinds
    for name in kinds:
        check_drop(gs, L, name)
    with pytest.raises(ValueError, match="no guard of this set has"):
        gs.to_bytes(drop=["DUAL_LEVEL_MATCH"])  # a torch kind this entry does not have


def test_dual_level_match() -> None:
    gs, L = import_dual()
    (gi,) = implementing(gs, "DUAL_LEVEL_MATCH")
    assert gs.guards[gi].kind.name == "GLOBAL_STATE"
    loaded = check_drop(gs, L, "DUAL_LEVEL_MATCH")
    assert "torch_dual_level" in gs.guards[gi].describe()
    assert not [s for s in loaded.guards if "torch_dual_level" in s.describe()]
    with fwAD.dual_level():  # the level differs: the import fails on it
        assert "torch_dual_level" in str(gs.why_not(L))


@needs_adapter
def test_leaves_below_the_cpp_tensor_steps() -> None:
    gs, L = import_tensor_steps()
    by_source = {g.source: g for g in gs.torch_import.guards}
    steps = {str(gs.guards[i].source): gs.guards[i].source.steps[-1].kind.name
             for s in ("L['z'].size()[0]", "L['z'].stride()[1]", "L['z'].grad") for i in by_source[s].guards}  # fmt: skip
    assert steps == {
        "L['z'].size()[0]": "TENSOR_SIZE",
        "L['z'].stride()[1]": "TENSOR_STRIDE",
        "L['z'].grad": "GRAD",
    }
    loaded = check_drop(gs, L, "EQUALS_MATCH")  # torch's leaves below the size and stride accessors
    assert not any(s.source is not None and s.source.steps and s.source.steps[-1].kind.name != "GRAD"
                   for s in loaded.guards)  # fmt: skip
    check_drop(gs, L, "NONE_MATCH")  # the grad leaf
    # By the printed source of a C++ step (tripwire's and torch's print the same).
    loaded = tw.GuardSet.from_bytes(gs.to_bytes(drop=["L['z'].size()[0]"]))
    assert [d[1] for d in loaded.dropped] == ["L['z'].size()[0]"]

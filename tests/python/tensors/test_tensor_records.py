"""TENSOR_MATCH and DIMENSION_MARKING read from the fast program's own records.

The fast op of TENSOR_MATCH reads one contiguous record per guard (the expected type's address,
then the guard's data), laid out back to back for all the set's tensor guards, and that of
DIMENSION_MARKING its inline cache and absence memo side by side. A wrong offset would compare a
tensor against its neighbour's record: these tests put tensors of different ranks (records of
different lengths) side by side under a module-like tree the skip proves unchanged, change one
tensor's metadata (in place, through ``.data``, ``set_``, its type or its markings), and require
the skipping engine, the engine without the skip, the tree walk and the reference to fail alike,
while every other tensor still passes.
"""

from __future__ import annotations

from typing import Any

import pytest

import tripwire as tw
from engine_switches import agree_with_and_without_skip

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

SHAPES = [(3,), (2, 3), (2, 3, 4), (5,), (4, 1, 2, 3)]


class Module:
    def __init__(self) -> None:
        self.training = False
        self._modules: dict[str, Any] = {}
        self._parameters: dict[str, Any] = {}


P = "L['self'].__dict__['_modules']['m1'].__dict__['_parameters']"


def _world(uniform: bool = False) -> tuple[Module, dict, tw.GuardSet]:
    root = Module()
    for k in range(3):
        m = Module()
        m.k = k
        root._modules[f"m{k}"] = m
    params = root._modules["m1"]._parameters
    for i, shape in enumerate(SHAPES):
        p = torch.zeros(shape)
        params[f"p{i}"] = torch.nn.Parameter(p, requires_grad=i % 4 == 3) if i % 2 and not uniform else p
    f_locals = {"self": root}
    b = tw.GuardBuilder(f_locals)
    s = "L['self']"
    b.type_match(s)
    b.dict_keys(f"{s}.__dict__['_modules']")
    for k in range(3):
        m = f"{s}.__dict__['_modules']['m{k}']"
        b.type_match(m)
        b.false(f"{m}.__dict__['training']")
        b.equals(f"{m}.__dict__['k']")
    b.dict_keys(P)
    for i in range(len(SHAPES)):
        t = f"{P}['p{i}']"
        b.tensor_match(t)
        b.dimension_marking(t)
    gs = b.build()
    for _ in range(3):
        assert gs.check(f_locals)
    return root, f_locals, gs


def _param(root: Module, i: int) -> Any:
    return root._modules["m1"]._parameters[f"p{i}"]


def _mutations() -> dict[str, Any]:
    def data_dtype(t: Any) -> None:
        t.data = t.data.to(torch.float64)  # dtype through .data: no dict write

    def data_shape(t: Any) -> None:
        t.data = torch.zeros(7)

    def set_storage(t: Any) -> None:
        with torch.no_grad():
            t.set_(torch.zeros(11))

    # torch refuses to resize or restride a leaf that requires grad: drop the flag first (a
    # change too, and the one-field change is requires_grad_'s case).
    def resize(t: Any) -> None:
        t.requires_grad_(False)
        t.resize_(6)

    def strided(t: Any) -> None:
        t.requires_grad_(False)
        t.as_strided_((1,), (1,), 1)

    def grad(t: Any) -> None:
        t.requires_grad_(not t.requires_grad)

    def mark(t: Any) -> None:
        torch._dynamo.mark_dynamic(t, 0)

    return {
        "data_dtype": data_dtype,
        "data_shape": data_shape,
        "set_": set_storage,
        "resize_": resize,
        "as_strided_": strided,
        "requires_grad_": grad,
        "mark_dynamic": mark,
    }


@pytest.mark.parametrize("name", list(_mutations()))
@pytest.mark.parametrize("index", range(len(SHAPES)))
def test_one_tensor_changed_among_records_of_other_ranks_fails(name: str, index: int) -> None:
    root, f_locals, gs = _world()
    specs = list(gs.guards)
    assert agree_with_and_without_skip(gs, specs, f_locals) is True
    assert gs.check(f_locals)
    assert gs._last_skipped_guards > 0, gs.explain()  # the skip is at work around the tensors
    _mutations()[name](_param(root, index))
    for _ in range(3):  # the first check after the change, and whatever claims it made
        assert agree_with_and_without_skip(gs, specs, f_locals) is False


@pytest.mark.parametrize("index", range(len(SHAPES)))
def test_a_tensor_given_another_record_s_metadata_fails(index: int) -> None:
    # The attack on the records' offsets: tensor i takes exactly tensor j's metadata (same type,
    # dtype, shape, strides, flags), so that a record read at a neighbour's offset would pass it.
    root, f_locals, gs = _world(uniform=True)
    specs = list(gs.guards)
    for j, shape in enumerate(SHAPES):
        if SHAPES[j] == SHAPES[index]:
            continue
        _param(root, index).data = torch.zeros(shape)
        assert agree_with_and_without_skip(gs, specs, f_locals) is False, (index, j)
    _param(root, index).data = torch.zeros(SHAPES[index])
    assert agree_with_and_without_skip(gs, specs, f_locals) is True


@pytest.mark.parametrize("index", range(len(SHAPES)))
def test_a_tensor_swapped_for_its_other_type_fails(index: int) -> None:
    # The record's first word is the expected type's address: a Parameter where a Tensor was (or
    # back), same metadata, written into the dict (the dict's tag moves on too).
    root, f_locals, gs = _world()
    specs = list(gs.guards)
    old = _param(root, index)
    new = torch.zeros(old.shape) if isinstance(old, torch.nn.Parameter) else torch.nn.Parameter(old.detach())
    root._modules["m1"]._parameters[f"p{index}"] = new
    assert agree_with_and_without_skip(gs, specs, f_locals) is False


def test_marking_after_a_class_change_fails() -> None:
    # DIMENSION_MARKING's inline cache (its record) is keyed on the type's version tag: a class
    # attribute change moves the tag (the cache refills), and a marking made afterwards on the
    # instance must be seen through the refilled record.
    class Sub(torch.Tensor):
        pass

    root, f_locals, _ = _world()
    t = torch.zeros(3).as_subclass(Sub)
    root._modules["m1"]._parameters["p0"] = t
    b = tw.GuardBuilder(f_locals)
    b.tensor_match(f"{P}['p0']")
    b.dimension_marking(f"{P}['p0']")
    gs = b.build()
    specs = list(gs.guards)
    for _ in range(3):
        assert agree_with_and_without_skip(gs, specs, f_locals) is True
    Sub.unrelated = 1  # the type's version tag moves on
    for _ in range(2):
        assert agree_with_and_without_skip(gs, specs, f_locals) is True
    torch._dynamo.mark_dynamic(t, 0)
    for _ in range(2):
        assert agree_with_and_without_skip(gs, specs, f_locals) is False


def test_records_survive_a_save_load_round_trip() -> None:
    root, f_locals, gs = _world()
    loaded = tw.GuardSet.from_bytes(gs.to_bytes())
    specs = list(loaded.guards)
    assert agree_with_and_without_skip(loaded, specs, f_locals) is True
    _param(root, 2).data = torch.zeros(2, 3, 5)
    assert agree_with_and_without_skip(loaded, specs, f_locals) is False

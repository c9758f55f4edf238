"""A module class with its own ``__getattr__`` that calls ``super().__getattr__`` (aliases of
submodules), imported from torch whole: torch 2.13 guards ``getattr(L['self'], '__dict__')``,
``type(L['self']).aliases`` and ``type(L['self']).__mro__[1].__getattr__`` (and its ``__code__``)
here (``L['self'].__getattr__.__func__`` and its ``__class__`` cell's ``cell_contents`` in other
call shapes: tests/python/engine/test_type_attrs.py). Every guard is
decided by the fast pass (docs/cpp.md, "Class attributes and bound methods"), and each attack on
what those reads depend on is decided as torch's own ``guard_manager.check`` and the oracle decide
it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from test_torch_models import as_torch_and_fast_again, compile_and_import, set_attr

pytestmark = pytest.mark.torch


def _alias_model(nn: Any) -> Any:
    class AliasModule(nn.Module):
        aliases = {"proj": "lin", "gate": "g"}

        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(7, 7)
            self.gain = 1.5

        def __getattr__(self, name: str) -> Any:
            target = type(self).aliases.get(name)
            if target is not None:
                return super().__getattr__(target)
            return super().__getattr__(name)

        def forward(self, x: Any) -> Any:
            return self.proj(x) * self.gain

    return AliasModule()


def test_alias_getattr_model_is_on_the_fast_pass_and_decides_as_torch() -> None:
    torch = pytest.importorskip("torch")
    nn = torch.nn
    torch.manual_seed(0)
    model = _alias_model(nn)
    cls = type(model)
    gs, gm, f_locals = compile_and_import(model, torch.randn(2, 7))
    texts = {str(g.source) for g in gs.guards}
    for src in (
        "getattr(L['self'], '__dict__')",
        "type(L['self']).aliases",
        "type(L['self']).__mro__[1].__getattr__.__code__",
    ):
        assert any(src in t for t in texts), (src, sorted(texts))
    assert gs.check(f_locals) and gs._last_fast_guards == len(gs)
    module_getattr = nn.Module.__dict__["__getattr__"]
    own_getattr = cls.__dict__["__getattr__"]

    def other_getattr(self: Any, name: str) -> Any:
        return module_getattr(self, name)

    attacks: list[tuple[str, Callable[[], Callable]]] = [
        ("aliases replaced", set_attr(cls, "aliases", {"proj": "lin"})),
        ("Alias.__getattr__ replaced", set_attr(cls, "__getattr__", other_getattr)),
        ("Module.__getattr__ replaced", set_attr(nn.Module, "__getattr__", other_getattr)),
        ("an instance __getattr__ entry", set_attr(model, "__getattr__", own_getattr.__get__(model))),
        ("__getattr__'s __class__ cell", _set_cell(own_getattr.__closure__[0], nn.Module)),
        ("gain changed", set_attr(model, "gain", 2.5)),
    ]
    assert (
        as_torch_and_fast_again(gs, gm, f_locals, attacks) >= 4
    )  # the aliases, both __getattr__ functions and gain are guarded


def _set_cell(cell: Any, value: Any) -> Callable[[], Callable]:
    def mutate() -> Callable:
        old = cell.cell_contents
        cell.cell_contents = value
        return lambda: setattr(cell, "cell_contents", old)

    return mutate

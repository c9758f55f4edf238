"""Class-dict and MRO steps, deep sources and relational sources, against the oracle and torch.

The first part holds the TYPE_DICT and TYPE_MRO steps to ``the oracle (tests/oracle/reference.py)`` (which reads a
class's namespace and MRO on its own, through type's getsets) on classes that change under them:
a class attribute set and deleted, ``__defaults__`` replaced, ``__bases__`` reassigned, an
instance's ``__class__`` swapped, and metaclasses that define ``__getattribute__``, ``__dict__``
or ``__mro__``. The second holds ``guards_of`` to torch's own ``guard_manager.check`` on the
models of bench/torch_models.py whose guards read class dicts and MROs (a MultiheadAttention, a
TransformerEncoder with a padding mask, a forward hook, ``self.modules()``), a 25-module chain and
an LSTM (whose ``a is b`` guard reads ``_flat_weights[i]`` and ``_flat_weight_refs[i]()``): each
import is whole (no ``drop=``), native for at least 99.5% of torch's guards, and decides as torch
on every mutated input.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import pytest

import reference
import tripwire as tw
from engine_switches import fast_once
from tripwire import GuardKind, Source, StepKind

L = Source.local


def agree(gs: tw.GuardSet, f_locals: dict, serial: bool = True) -> bool:
    """The engine's answer is the oracle's, and so is the answer of the set saved and loaded
    (``serial``: the set names no class local to a test, which has no importable name)."""
    want = reference.check(gs.guards, f_locals)
    for _ in range(3):  # the adaptive order and the fast pass's claims
        assert gs.check(f_locals) is want
    if serial:
        loaded = tw.GuardSet.from_bytes(gs.to_bytes())
        assert loaded.check(f_locals) is want
    return want


# -- the steps, against the oracle ----------------------------------------------------------------
class Base:
    def forward(self, x, scale=2.0):
        return x * scale


class Child(Base):
    pass


class Other(Base):
    pass


_forward = Base.__dict__["forward"]


def class_set(o: Any) -> tw.GuardSet:
    """What Dynamo guards for ``o.forward`` found on ``type(o).__mro__[1]``: the classes in between
    do not define it, the one that does still holds the same function with the same defaults."""
    t = L("o").type()
    owner = t.type_mro().item(1)
    fn = owner.type_dict().dict_item("forward")
    b = tw.GuardBuilder({"o": o})
    b.type_match(L("o"))
    b.type_match(t.type_dict(), dict)
    b.dict_contains(t.type_dict(), "forward", False)
    b.type_match(t.type_mro(), tuple)
    b.length(t.type_mro(), 3)
    b.id_match(owner)
    b.id_match(fn)
    b.equals(fn.step(StepKind.DEFAULTS, 0), 2.0)
    return b.build()


def test_printed_as_torch_prints_and_read_back() -> None:
    s = L("o").type().type_mro().item(1).type_dict().dict_item("forward")
    assert str(s) == "dict.__getitem__(dict(type(L['o']).__mro__[1].__dict__), 'forward')"
    assert Source.parse(str(s)) == s
    # As torch prints the source itself (DictGetItemSource prints `[key]`).
    assert Source.parse("dict(type(L['o']).__dict__)['x']") == L("o").type().type_dict().item("x")
    # The attribute `__mro__` is not the step.
    assert str(L("o").attr("__mro__")) == "getattr(L['o'], '__mro__')"
    assert Source.parse("getattr(L['o'], '__mro__')").steps[0].kind is StepKind.ATTR


def test_class_attribute_set_and_deleted_is_seen() -> None:
    o = Child()
    gs = class_set(o)
    assert agree(gs, {"o": o})
    Child.forward = Base.forward  # the same function, now in Child's own dict
    try:
        assert not agree(gs, {"o": o})
        assert gs.why_not({"o": o}).kind == "DICT_CONTAINS"
    finally:
        del Child.forward
    assert agree(gs, {"o": o})
    Base.forward = lambda self, x, scale=2.0: x  # another function in Base's dict
    try:
        assert not agree(gs, {"o": o})
    finally:
        Base.forward = _forward
    assert agree(gs, {"o": o})


def test_defaults_mutated_is_seen() -> None:
    o = Child()
    gs = class_set(o)
    # EQUALS_MATCH is type-exact: the int 2 is not the float 2.0.
    for new, want in (((3.0,), False), ((2.0,), True), ((), False), (None, False), ((2,), False)):
        Base.forward.__defaults__ = new
        try:
            assert agree(gs, {"o": o}) is want, new
        finally:
            Base.forward.__defaults__ = (2.0,)
    assert agree(gs, {"o": o})


def test_bases_reassigned_and_class_swapped() -> None:
    class Mixin:
        pass

    class Local(Base):
        pass

    o = Local()
    gs = class_set(o)
    assert agree(gs, {"o": o}, serial=False)
    Local.__bases__ = (Mixin, Base)  # a new tp_mro: Local, Mixin, Base, object
    try:
        assert not agree(gs, {"o": o}, serial=False)
    finally:
        Local.__bases__ = (Base,)
    assert agree(gs, {"o": o}, serial=False)
    o.__class__ = Other
    assert not agree(gs, {"o": o}, serial=False)  # TYPE_MATCH on o; the class steps read Other's fields
    assert reference.first_failure(gs.guards, {"o": o})[0].kind is GuardKind.TYPE_MATCH


def test_steps_read_the_type_not_its_metaclass() -> None:
    calls = []

    class Meta(type):
        def __getattribute__(cls, name):
            calls.append(name)
            return super().__getattribute__(name)

        # What Python shows as `K.__dict__` and `K.__mro__`: not what the type holds.
        @property
        def __mro__(cls):
            calls.append("__mro__")
            return (cls,)

    class K(Base, metaclass=Meta):
        pass

    o = K()
    b = tw.GuardBuilder({"o": o})
    b.id_match(L("o").type().type_mro().item(1), Base)
    b.length(L("o").type().type_mro(), 3)
    b.dict_contains(L("o").type().type_dict(), "forward", False)
    b.dict_contains(L("o").type().type_mro().item(1).type_dict(), "forward", True)
    gs = b.build()
    del calls[:]
    assert agree(gs, {"o": o})
    assert calls == []  # neither the engine nor the oracle asked the metaclass
    K.forward = None
    try:
        assert not agree(gs, {"o": o})
    finally:
        del K.forward
    assert calls == []


def test_a_value_that_is_not_a_type_is_missing() -> None:
    class Liar:
        __class__ = type  # isinstance(Liar(), type) is True; it is no type
        __dict__ = {"forward": 1}
        __mro__ = (Base,)

    b = tw.GuardBuilder({"c": Base})
    b.type_match(L("c").type_dict(), dict)
    b.type_match(L("c").type_mro(), tuple)
    gs = b.build()
    assert agree(gs, {"c": Base})
    assert agree(gs, {"c": Child})
    for v in (Base(), Liar(), 1, None, {"forward": 1}):
        assert not agree(gs, {"c": v}), v
        why = gs.why_not({"c": v})
        assert why.source == "dict(L['c'].__dict__)" and "not a type" in why.reason


def test_builtin_and_static_types() -> None:
    b = tw.GuardBuilder({"c": int})
    b.dict_contains(L("c").type_dict(), "bit_length", True)
    b.id_match(L("c").type_mro().item(1), object)
    gs = b.build()
    assert agree(gs, {"c": int})
    assert agree(gs, {"c": bool}) is False  # bool's own dict has no bit_length
    assert agree(gs, {"c": type}) is False


def test_dict_of_a_class_dying_mid_check_is_kept_alive() -> None:
    # A class whose only reference is the instance's __class__: the walk keeps its own references
    # while user code (a property read later in the walk) swaps the class and collects the old one.
    def make():
        class Gone(Base):
            pass

        return Gone

    o = make()()

    class Swapper:
        @property
        def v(self):
            o.__class__ = Other
            gc.collect()
            return 1

    b = tw.GuardBuilder({"o": o, "s": Swapper()})
    b.dict_contains(L("o").type().type_dict(), "forward", False)
    b.id_match(L("o").type().type_mro().item(1), Base)
    b.equals(L("s").attr("v"), 1)
    b.id_match(L("o").type().type_mro().item(1).type_dict().dict_item("forward"), _forward)
    gs = b.build()
    assert gs.check({"o": o, "s": Swapper()}) in (True, False)  # no crash, no error left set
    o.__class__ = make()
    assert gs.check({"o": o, "s": Swapper()}) in (True, False)


def test_mro_replaced_by_user_code_inside_its_own_subtree() -> None:
    # A metaclass property read below `type(o).__mro__` reassigns `__bases__` (freeing the MRO tuple
    # the walk is reading) and collects; the guards read after it must see a live tuple.
    class Alt:
        def forward(self, x):
            return x

    class Meta(type):
        @property
        def hook(cls):
            Swapped.__bases__ = (Alt,) if Swapped.__bases__ == (Base,) else (Base,)
            gc.collect()
            return 1

    class Swapped(Base, metaclass=Meta):
        pass

    o = Swapped()
    mro = L("o").type().type_mro()
    b = tw.GuardBuilder({"o": o})
    b.equals(mro.item(0).attr("hook"), 1)
    b.type_match(mro, tuple)
    b.length(mro, 3)
    b.dict_contains(mro.item(1).type_dict(), "forward", True)
    b.type_match(mro.item(1).type_dict().dict_item("forward"), type(_forward))
    gs = b.build()
    for _ in range(6):
        assert gs.check({"o": o}) is True
        assert gs.why_not({"o": o}) is None
        assert reference.check(gs.guards, {"o": o}) is True


def test_depth_limit_names_the_source() -> None:
    depth = tw._core.MAX_SOURCE_DEPTH
    assert depth >= 256

    class Node:
        pass

    root = Node()
    n = root
    for _ in range(depth + 1):
        n.a = Node()
        n = n.a
    src = L("x")
    for _ in range(depth):
        src = src.attr("a")
    b = tw.GuardBuilder({"x": root})
    b.type_match(src, Node)
    gs = b.build()
    assert agree(gs, {"x": root}, serial=False)
    deeper = src.attr("a")
    b = tw.GuardBuilder({"x": root})
    b.type_match(deeper, Node)
    with pytest.raises(tw.GuardBuildError, match=r"deeper than \d+ steps \(\d+\): L\['x'\]\.a\.a"):
        b.build()


# -- torch's own guards ----------------------------------------------------------------------------
def _torch():
    return pytest.importorskip("torch")


def compile_and_import(model: Any, *args: Any) -> tuple[Any, Any, dict]:
    torch = _torch()
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    import tripwire.torch as twt
    from tripwire.torch._tree import resolve_target

    torch._dynamo.reset()
    torch.compile(model, backend="eager", dynamic=False)(*args)
    gs = twt.guards_of(model)  # whole: no drop=
    rec = gs.torch_import
    native = sum(1 for g in rec.guards if g.outcome == "native")
    assert native >= 0.995 * len(rec.guards), rec.report()
    assert not rec.dropped
    gm = _debug_get_cache_entry_list(resolve_target(model).code)[0].guard_manager
    f_locals = twt.frame_locals(model, *args)
    assert gm.check(f_locals) is True and gs.check(f_locals) is True
    return gs, gm, f_locals


def same_as_torch(
    gs: Any,
    gm: Any,
    f_locals: dict,
    mutations: list[tuple[str, Callable[[], Callable]]],
    stricter: tuple[str, ...] = (),
) -> None:
    """Each mutation applied alone: tripwire's answer is torch's; undone, both pass again. The
    mutations named in ``stricter`` pass torch's guards and fail tripwire's (a class attribute
    set on a class that an inlined ``obj.name`` resolves through: the importer's added guards,
    docs/torch.md "What Dynamo does not guard")."""
    failed = 0
    for name, mutate in mutations:
        undo = mutate()
        try:
            want = gm.check(f_locals)
            if name in stricter:
                assert want is True, f"{name}: torch's guards fail it (not stricter)"
                want = False
            for _ in range(2):
                assert gs.check(f_locals) is want, name
            failed += not want
        finally:
            undo()
        assert gm.check(f_locals) is True and gs.check(f_locals) is True, f"after undoing {name}"
    assert failed >= 2  # the mutations reach guarded values


def set_attr(obj: Any, name: str, value: Any) -> Callable[[], Callable]:
    def mutate() -> Callable:
        had = name in vars(obj)
        old = vars(obj).get(name)

        def undo() -> None:
            if had:
                setattr(obj, name, old)
            else:
                delattr(obj, name)

        setattr(obj, name, value)
        return undo

    return mutate


def set_defaults(fn: Any, value: Any) -> Callable[[], Callable]:
    def mutate() -> Callable:
        old = fn.__defaults__
        fn.__defaults__ = value
        return lambda: setattr(fn, "__defaults__", old)

    return mutate


def swap_class(obj: Any, cls: type) -> Callable[[], Callable]:
    def mutate() -> Callable:
        old = obj.__class__
        obj.__class__ = cls
        return lambda: setattr(obj, "__class__", old)

    return mutate


def add_hook(module: Any, kind: str = "forward") -> Callable[[], Callable]:
    def mutate() -> Callable:
        register = getattr(module, f"register_{kind}_hook")
        return register(lambda *a: None).remove

    return mutate


def module_hooks(nn: Any) -> list[tuple[str, Callable[[], Callable]]]:
    return [
        ("Module._compiled_call_impl", set_attr(nn.Module, "_compiled_call_impl", lambda *a: None)),
        ("Module.forward", set_attr(nn.Module, "forward", lambda self, *a: None)),
    ]


@pytest.mark.torch
def test_multihead_attention_defaults_and_class() -> None:
    torch = _torch()
    nn = torch.nn

    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(16, 4, batch_first=True)

        def forward(self, x):
            return self.attn(x, x, x)[0]

    class MHA2(nn.MultiheadAttention):
        pass

    torch.manual_seed(0)
    m = Attn()
    gs, gm, f_locals = compile_and_import(m, torch.randn(2, 5, 16))
    assert any("dict(type(" in g.source for g in gs.torch_import.guards)
    mha_forward = nn.MultiheadAttention.forward
    n = len(mha_forward.__defaults__)
    same_as_torch(
        gs,
        gm,
        f_locals,
        [
            ("defaults changed", set_defaults(mha_forward, (None, False) + mha_forward.__defaults__[2:])),
            ("defaults shortened", set_defaults(mha_forward, mha_forward.__defaults__[1:])),
            ("defaults equal copy", set_defaults(mha_forward, tuple(mha_forward.__defaults__))),
            ("defaults removed", set_defaults(mha_forward, None)),
            ("class swapped", swap_class(m.attn, MHA2)),
            ("forward in the subclass", set_attr(nn.MultiheadAttention, "forward", mha_forward)),
            ("hook on attn", add_hook(m.attn)),
            ("pre-hook on attn", add_hook(m.attn, "forward_pre")),
            *module_hooks(nn),
        ],
    )
    assert len(mha_forward.__defaults__) == n


def _encoder_with_padding_mask(norm_first: bool) -> tuple[Any, Any, Any, Any, dict]:
    """torch_models.Encoder compiled on a [2, 5, 16] input with a padding mask and its guards
    imported: (nn, the model, the GuardSet, torch's guard manager, f_locals)."""
    torch = _torch()
    import torch_models as tm

    torch.manual_seed(0)
    m = tm.Encoder(norm_first=norm_first)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    gs, gm, f_locals = compile_and_import(m, torch.randn(2, 5, 16), pad)
    return torch.nn, m, gs, gm, f_locals


@pytest.mark.torch
@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_with_padding_mask(norm_first: bool) -> None:
    nn, m, gs, gm, f_locals = _encoder_with_padding_mask(norm_first)
    layer = m.enc.layers[0]
    mha_forward = nn.MultiheadAttention.forward

    class Layer2(nn.TransformerEncoderLayer):
        pass

    same_as_torch(
        gs,
        gm,
        f_locals,
        [
            ("MHA defaults", set_defaults(mha_forward, (None, False) + mha_forward.__defaults__[2:])),
            ("MHA defaults equal", set_defaults(mha_forward, tuple(mha_forward.__defaults__))),
            ("layer norm_first", set_attr(layer, "norm_first", not norm_first)),
            ("layer class", swap_class(layer, Layer2)),
            ("hook on self_attn", add_hook(layer.self_attn)),
            ("encoder forward defaults", set_defaults(nn.TransformerEncoder.forward, (None, None, False))),
            *module_hooks(nn),
        ],
    )


def _replace_state_dict(module: Any, attr: str, make: Callable[[dict], Any]) -> Callable[[], Callable]:
    """`module.<attr>` (its `_modules`, `_parameters`, `_buffers`) replaced by make(old) in its
    instance dict: a new object under an unchanged module."""

    def mutate() -> Callable:
        old = module.__dict__[attr]
        module.__dict__[attr] = make(old)
        return lambda: module.__dict__.__setitem__(attr, old)

    return mutate


def _in_place(d: dict, key: str, value: Any) -> Callable[[], Callable]:
    def mutate() -> Callable:
        old = d[key]
        d[key] = value
        return lambda: d.__setitem__(key, old)

    return mutate


def _moved_to_end(d: dict, key: str) -> Callable[[], Callable]:
    def mutate() -> Callable:
        order = list(d)
        d[key] = d.pop(key)

        def undo() -> None:
            items = [(k, d.pop(k)) for k in order]
            d.update(items)

        return undo

    return mutate


@pytest.mark.torch
def test_module_state_dicts_under_the_skip() -> None:
    """The `_modules`, `_parameters` and `_buffers` dicts of every module are fetched and stamped
    by one op (fast_pass.cpp, SettleDictItemStamp), their TYPE_MATCH proved by their own unchanged
    tag. After a run of passing checks, each such dict replaced (by an equal dict, an OrderedDict,
    a dict subclass), written in place, or reordered: tripwire answers as torch does."""
    import collections

    torch = _torch()
    nn, m, gs, gm, f_locals = _encoder_with_padding_mask(False)
    for _ in range(5):
        assert gs.check(f_locals)
    # Claims in use (fewer on 3.13, whose instance dicts are embedded in their modules: no tag).
    assert gs._last_skipped_guards > 50, gs.explain()
    layer = m.enc.layers[0]

    class DictSub(dict):
        pass

    same_as_torch(
        gs,
        gm,
        f_locals,
        [
            ("_modules an equal dict", _replace_state_dict(layer, "_modules", dict)),
            ("_modules an OrderedDict", _replace_state_dict(layer, "_modules", collections.OrderedDict)),
            ("_modules a dict subclass", _replace_state_dict(layer, "_modules", DictSub)),
            (
                "_parameters an OrderedDict",
                _replace_state_dict(layer.linear1, "_parameters", collections.OrderedDict),
            ),
            ("_parameters an equal dict", _replace_state_dict(layer.linear1, "_parameters", dict)),
            ("_buffers a dict subclass", _replace_state_dict(layer.norm1, "_buffers", DictSub)),
            (
                "a weight replaced in place",
                _in_place(layer.linear1._parameters, "weight", nn.Parameter(torch.randn(4, 4))),
            ),
            (
                "a weight replaced, equal",
                _in_place(
                    layer.linear1._parameters, "weight", nn.Parameter(layer.linear1.weight.detach().clone())
                ),
            ),
            ("a submodule replaced in place", _in_place(layer._modules, "dropout", nn.Identity())),
            ("submodules reordered", _moved_to_end(layer._modules, "self_attn")),
            ("layers reordered", _moved_to_end(m.enc.layers._modules, "0")),
        ],
    )
    for _ in range(3):
        assert gs.check(f_locals) and gm.check(f_locals)


@pytest.mark.torch
def test_forward_hook_on_a_submodule() -> None:
    torch = _torch()
    import torch_models as tm

    nn = torch.nn
    torch.manual_seed(0)
    m = tm.Hooked()
    gs, gm, f_locals = compile_and_import(m, torch.randn(2, 16))
    hooks = m.a._forward_hooks

    def drop_hook() -> Callable:
        k, v = hooks.popitem()
        return lambda: hooks.__setitem__(k, v)

    class Linear2(nn.Linear):
        pass

    same_as_torch(
        gs,
        gm,
        f_locals,
        [
            ("hook removed", drop_hook),
            ("second hook", add_hook(m.a)),
            ("hook on b", add_hook(m.b)),
            ("class swapped", swap_class(m.a, Linear2)),
            ("Linear._compiled_call_impl", set_attr(nn.Linear, "_compiled_call_impl", None)),
            *module_hooks(nn),
        ],
        # nn.Module's None shadowed by an equal None on Linear: a harmless recompile
        stricter=("Linear._compiled_call_impl",),
    )


@pytest.mark.torch
def test_hook_closure_naming_its_module_is_an_alias() -> None:
    """A hook whose closure holds the module makes torch guard ``L['self'] is
    X._forward_hooks[list(dict.keys(X._forward_hooks))[0]].__closure__[0].cell_contents``: the
    dict value at a key position is read natively (DICT_VALUE), not by torch's leaf."""
    torch = _torch()
    nn = torch.nn

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.scale = nn.Linear(8, 8), nn.Linear(8, 8), 0.5
            self.b.register_forward_hook(lambda mod, inp, out: out * self.scale)

        def forward(self, x: Any) -> Any:
            return self.b(self.a(x))

    torch.manual_seed(0)
    m = Scaled()
    gs, gm, f_locals = compile_and_import(m, torch.randn(2, 8))
    aliasing = [g for g in gs.torch_import.guards if g.kind == "OBJECT_ALIASING"]
    assert aliasing and all(g.outcome == "native" for g in aliasing), gs.torch_import.report()
    hooks = m.b._forward_hooks
    key = next(iter(hooks))
    other = Scaled()

    def hook_of(owner: Any) -> Callable[[], Callable]:
        def mutate() -> Callable:
            old = hooks[key]
            hooks[key] = lambda mod, inp, out: out * owner.scale
            return lambda: hooks.__setitem__(key, old)

        return mutate

    def reorder() -> Callable:  # another hook first: position 0 holds a closure without self
        first = hooks.pop(key)
        h = m.b.register_forward_hook(lambda mod, inp, out: out)
        hooks[key] = first
        return h.remove

    same_as_torch(
        gs,
        gm,
        f_locals,
        [
            ("closure names another module", hook_of(other)),
            ("closure names the same module", hook_of(m)),
            ("another hook first", reorder),
            ("scale", set_attr(m, "scale", 0.25)),
        ],
    )


@pytest.mark.torch
def test_modules_inside_forward() -> None:
    torch = _torch()
    import torch_models as tm

    nn = torch.nn
    torch.manual_seed(0)
    m = tm.ModulesLoop()
    gs, gm, f_locals = compile_and_import(m, torch.randn(2, 16))
    assert any("__mro__" in g.source for g in gs.torch_import.guards)

    class Loop2(tm.ModulesLoop):
        pass

    same_as_torch(
        gs,
        gm,
        f_locals,
        [
            ("named_modules defaults", set_defaults(nn.Module.named_modules, (None, "x", True))),
            ("named_modules defaults equal", set_defaults(nn.Module.named_modules, (None, "", True))),
            ("modules in the class", set_attr(tm.ModulesLoop, "modules", nn.Module.modules)),
            ("class swapped", swap_class(m, Loop2)),
            ("submodule replaced", _replace_module(m, "act", nn.Linear(16, 16))),
            *module_hooks(nn),
        ],
        # nn.Module.modules shadowed by itself on the class: a harmless recompile
        stricter=("modules in the class",),
    )


@pytest.mark.torch
def test_chain_of_25_modules() -> None:
    torch = _torch()
    import torch_models as tm

    nn = torch.nn
    torch.manual_seed(0)
    m = tm.Chain(25)
    gs, gm, f_locals = compile_and_import(m, torch.randn(2, 4))
    inner = m
    while inner.inner is not None:
        inner = inner.inner
    assert max(len(Source.parse(str(g.source)).steps) for g in gs.guards if g.source is not None) > 64
    same_as_torch(
        gs,
        gm,
        f_locals,
        [
            ("innermost training", set_attr(inner, "training", False)),
            ("innermost Linear replaced", _replace_module(inner, "lin", nn.Linear(4, 4))),
            ("innermost weight frozen", _requires_grad(inner.lin.weight)),
            ("innermost hook", add_hook(inner.lin)),
            ("innermost Linear an Identity", _replace_module(inner, "lin", nn.Identity())),
            ("weight equal", _requires_grad(inner.lin.weight, True)),
        ],
    )


def _replace_module(parent: Any, name: str, new: Any) -> Callable[[], Callable]:
    def mutate() -> Callable:
        old = parent._modules[name]
        parent._modules[name] = new
        return lambda: parent._modules.__setitem__(name, old)

    return mutate


def _requires_grad(p: Any, value: bool = False) -> Callable[[], Callable]:
    def mutate() -> Callable:
        old = p.requires_grad
        p.requires_grad_(value)
        return lambda: p.requires_grad_(old)

    return mutate


@pytest.mark.torch
def test_lstm_aliasing_reads_list_items_and_weakref_calls() -> None:
    torch = _torch()
    import torch_models as tm

    with torch._dynamo.config.patch(allow_rnn=True):
        torch.manual_seed(0)
        m = tm.LSTMLM()
        gs, gm, f_locals = compile_and_import(m, torch.randint(0, 32, (2, 8)))
    rec = gs.torch_import
    aliasing = [g for g in rec.guards if g.kind == "OBJECT_ALIASING"]
    assert aliasing and all(g.outcome == "native" for g in aliasing)
    lstm = m.lstm
    alias = [s for s in gs.guards if s.kind is GuardKind.ALIAS]
    srcs = {str(s.source) for s in alias} | {str(s.args[0]) for s in alias}
    assert any("_flat_weight_refs" in s and s.endswith("[0]()") for s in srcs)
    assert any("_flat_weights" in s and s.endswith("[0]") for s in srcs)
    w0 = lstm._flat_weights[0]
    other = torch.nn.Parameter(w0.detach().clone())

    def set_item(seq: list, i: int, v: Any) -> Callable[[], Callable]:
        def mutate() -> Callable:
            old = seq[i]
            seq[i] = v
            return lambda: seq.__setitem__(i, old)

        return mutate

    dead = torch.nn.Parameter(w0.detach().clone())
    dead_ref = weakref.ref(dead)
    del dead
    gc.collect()
    same_as_torch(
        gs,
        gm,
        f_locals,
        [
            ("flat weight replaced", set_item(lstm._flat_weights, 0, other)),
            ("flat weight same object", set_item(lstm._flat_weights, 0, w0)),
            ("weakref to another", set_item(lstm._flat_weight_refs, 1, weakref.ref(other))),
            ("weakref to the same", set_item(lstm._flat_weight_refs, 1, weakref.ref(lstm._flat_weights[1]))),
            ("dead weakref", set_item(lstm._flat_weight_refs, 2, dead_ref)),
            ("flat weights shortened", set_attr(lstm, "_flat_weights", lstm._flat_weights[:3])),
            ("parameter replaced", _replace_param(lstm, "weight_hh_l0", other)),
        ],
    )


def _replace_param(module: Any, name: str, new: Any) -> Callable[[], Callable]:
    def mutate() -> Callable:
        old = module._parameters[name]
        module._parameters[name] = new
        return lambda: module._parameters.__setitem__(name, old)

    return mutate


@pytest.mark.torch
def test_drop_accepts_the_relational_kinds() -> None:
    torch = _torch()
    import torch_models as tm
    import tripwire.torch as twt

    torch._dynamo.reset()
    m = tm.Hooked()
    torch.compile(m, backend="eager", dynamic=False)(torch.randn(2, 16))
    for kind in ("OBJECT_ALIASING", "NO_TENSOR_ALIASING", "STORAGE_OVERLAPPING", "SOURCE_DEPTH"):
        gs = twt.guards_of(m, drop=[kind])  # a known kind: no ValueError, even with nothing to drop
        assert gs.check(twt.frame_locals(m, torch.randn(2, 16)))
    gs = twt.guards_of(m, drop=["NO_TENSOR_ALIASING"])
    assert all(g.kind != "NO_TENSOR_ALIASING" for g in gs.torch_import.guards if g.outcome == "native")


# -- torch._VF: its class __getattr__ read without the call (docs/cpp.md, "Module subclasses") ----
def _vf_attacks(torch: Any, name: str) -> list[tuple[str, Callable[[], Callable]]]:
    """Attacks on what `G[...]._VF.<name>` depends on, each undone by the callable it returns."""
    import builtins
    import types

    vf_module = torch._VF
    vf_class = type(vf_module)
    hook = vf_class.__dict__["__getattr__"]
    real = getattr(vf_module.vf, name)

    def set_class(attr: str, value: Any) -> Callable[[], Callable]:
        def mutate() -> Callable:
            had = attr in vf_class.__dict__
            old = vf_class.__dict__.get(attr)
            setattr(vf_class, attr, value)
            return lambda: setattr(vf_class, attr, old) if had else delattr(vf_class, attr)

        return mutate

    def set_item(d: dict, key: str, value: Any) -> Callable[[], Callable]:
        def mutate() -> Callable:
            had = key in d
            old = d.get(key)
            d[key] = value
            return lambda: d.__setitem__(key, old) if had else d.__delitem__(key)

        return mutate

    def set_code(code: Any) -> Callable[[], Callable]:
        def mutate() -> Callable:
            old = hook.__code__
            hook.__code__ = code
            return lambda: setattr(hook, "__code__", old)

        return mutate

    def other_answer(self: Any, n: str) -> Any:
        return abs

    def same_answer(self: Any, n: str) -> Any:
        return getattr(self.vf, n)  # the same body, another code object: recognised too

    def shadowing_getattr(o: Any, n: str, *default: Any) -> Any:
        return abs if n == name else builtins_getattr(o, n, *default)

    builtins_getattr = builtins.getattr

    class DataVF:
        def __get__(self, obj: Any, cls: Any = None) -> Any:
            return types.SimpleNamespace(**{name: abs})

        def __set__(self, obj: Any, value: Any) -> None:
            raise AttributeError("read-only")

    return [
        ("__getattr__ replaced", set_class("__getattr__", other_answer)),
        ("__getattr__ replaced, same answer", set_class("__getattr__", same_answer)),
        ("__code__ replaced", set_code(other_answer.__code__)),
        ("__code__ replaced, same body", set_code(same_answer.__code__)),
        ("_VF.vf replaced", set_attr(vf_module, "vf", types.SimpleNamespace(**{name: abs}))),
        ("_VF.vf replaced, same value", set_attr(vf_module, "vf", types.SimpleNamespace(**{name: real}))),
        ("a global getattr in torch._VF", set_item(hook.__globals__, "getattr", shadowing_getattr)),
        ("a global getattr, same answer", set_item(hook.__globals__, "getattr", builtins_getattr)),
        ("builtins.getattr replaced", set_item(builtins.__dict__, "getattr", shadowing_getattr)),
        (f"{name} in the module dict", set_item(vf_module.__dict__, name, abs)),
        (f"{name} in the module dict, same value", set_item(vf_module.__dict__, name, real)),
        (f"a class attribute {name}", set_class(name, abs)),
        ("a data descriptor vf on the class", set_class("vf", DataVF())),
    ]


def as_torch_and_fast_again(
    gs: Any, gm: Any, f_locals: dict, attacks: list[tuple[str, Callable[[], Callable]]]
) -> int:
    """Each attack alone: tripwire's answer is torch's and the oracle's (three checks); undone, all
    pass again and the fast pass decides every guard. Returns how many attacks torch failed."""
    failed = 0
    for what, mutate in attacks:
        undo = mutate()
        try:
            want = gm.check(f_locals)
            assert reference.check(gs.guards, f_locals, gs._f_globals) is want, what
            for _ in range(3):
                assert gs.check(f_locals) is want, what
            failed += not want
        finally:
            undo()
        assert gm.check(f_locals) is True and gs.check(f_locals) is True, f"after undoing {what}"
        assert gs.check(f_locals) and gs._last_fast_guards == len(gs), what
    return failed


def _vf_same_as_torch(torch: Any, gs: Any, gm: Any, f_locals: dict, name: str) -> None:
    """The attacks on a forwarding hook (the forwarded read learnt again after each)."""
    assert any(f"._VF.{name}" in str(g.source) for g in gs.guards)
    assert gs.check(f_locals) and gs._last_fast_guards == len(gs)
    assert as_torch_and_fast_again(gs, gm, f_locals, _vf_attacks(torch, name)) >= 7


@pytest.mark.torch
def test_lstm_vf_forwarding_attacked() -> None:
    torch = _torch()
    import torch_models as tm

    with torch._dynamo.config.patch(allow_rnn=True):
        torch.manual_seed(0)
        gs, gm, f_locals = compile_and_import(tm.LSTMLM(), torch.randint(0, 32, (2, 8)))
    _vf_same_as_torch(torch, gs, gm, f_locals, "lstm")


@pytest.mark.torch
def test_gru_vf_forwarding_attacked() -> None:
    torch = _torch()
    nn = torch.nn

    class GRUNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gru = nn.GRU(8, 8, batch_first=True)

        def forward(self, x: Any) -> Any:
            return self.gru(x)[0]

    with torch._dynamo.config.patch(allow_rnn=True):
        torch.manual_seed(0)
        gs, gm, f_locals = compile_and_import(GRUNet(), torch.randn(2, 5, 8))
    _vf_same_as_torch(torch, gs, gm, f_locals, "gru")


def _in_dict(d: dict, key: str, value: Any) -> Callable[[], Callable]:
    def mutate() -> Callable:
        d[key] = value
        return lambda: d.pop(key)

    return mutate


@pytest.mark.torch
def test_parametrized_module_hasattr_decided_without_module_getattr() -> None:
    # torch.nn.utils.parametrize guards `not hasattr(parametrizations.weight, '1')` on each
    # ParametrizationList (a second parametrization). nn.Module.__getattr__ is registered
    # (runtime/eval/dict_getattr.hpp): the fast pass decides those guards from the module's dicts,
    # and whatever puts '1' where nn.Module.__getattr__ (or the generic lookup) finds it fails.
    torch = _torch()
    nn = torch.nn
    import torch.nn.utils.parametrize as P

    class Symmetric(nn.Module):
        def forward(self, w: Any) -> Any:
            return w.triu() + w.triu(1).transpose(-1, -2)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.utils.parametrizations.orthogonal(nn.Linear(6, 6))
            self.b = nn.Linear(6, 6)
            P.register_parametrization(self.b, "weight", Symmetric())

        def forward(self, x: Any) -> Any:
            return torch.relu(self.b(self.a(x)))

    m = Net()
    gs, gm, f_locals = compile_and_import(m, torch.randn(3, 6))
    kinds = [g.kind for g in gs.torch_import.guards]
    assert kinds.count("NO_HASATTR") >= 2
    for _ in range(2):
        assert gs.check(f_locals) is True
    assert fast_once(gs, f_locals)  # no residue
    plist = m.b.parametrizations.weight
    extra = Symmetric()
    same_as_torch(
        gs,
        gm,
        f_locals,
        [
            ("'1' in _modules", _in_dict(plist._modules, "1", extra)),
            ("'1' in _parameters", _in_dict(plist._parameters, "1", nn.Parameter(torch.ones(1)))),
            ("'1' in _buffers", _in_dict(plist._buffers, "1", torch.ones(1))),
            ("'1' an instance attribute", set_attr(plist, "1", 1)),
            ("'1' a class attribute", set_attr(type(plist), "1", 1)),
            ("'2' added (no '1')", _in_dict(plist._modules, "2", extra)),
            ("__getattr__ replaced", set_attr(type(plist), "__getattr__", lambda self, n: 1)),
        ],
    )


@pytest.mark.torch
def test_buffer_assigned_in_forward_guards_the_non_persistent_set() -> None:
    # forward assigns a buffer: torch guards `'step' in _non_persistent_buffers_set` and the set's
    # value (SET_CONTAINS and a python_eq EQUALS_MATCH on a set of str), both on the fast pass
    # (set_contains_pure, python_equals.cpp), and decided as torch when the set changes.
    torch = _torch()
    nn = torch.nn

    class Counter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.register_buffer("step", torch.zeros(()), persistent=False)

        def forward(self, x: Any) -> Any:
            self.step = self.step + 1
            return self.fc(x)

    m = Counter()
    gs, gm, f_locals = compile_and_import(m, torch.randn(2, 4))
    kinds = {g.kind for g in gs.torch_import.guards}
    assert {"SET_CONTAINS", "EQUALS_MATCH"} <= kinds
    s = m._non_persistent_buffers_set

    def replace_set(value: Any) -> Callable[[], Callable]:
        def mutate() -> Callable:
            m._non_persistent_buffers_set = value
            return lambda: setattr(m, "_non_persistent_buffers_set", s)

        return mutate

    same_as_torch(
        gs,
        gm,
        f_locals,
        [
            ("'step' removed", lambda: (s.discard("step"), lambda: s.add("step"))[1]),
            ("another name added", lambda: (s.add("other"), lambda: s.discard("other"))[1]),
            ("a frozenset", replace_set(frozenset({"step"}))),
            ("a set with an int", replace_set({"step", 1})),
            ("an equal new set", replace_set({"step"})),
        ],
    )


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")  # Dynamo's own
def test_enum_static_forward_classmethod_and_super_on_the_fast_pass() -> None:
    # Everyday shapes whose guards read class attributes under other metaclasses (an enum member,
    # an autograd Function's static forward), `self.__class__` (a classmethod called on self) and
    # `type(self).__mro__[1].forward` (super().forward): every guard on the fast pass, and each
    # change decided as torch.
    import enum

    torch = _torch()
    nn = torch.nn

    class Mode(enum.Enum):
        A = 1
        B = 2

    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x * x

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            return g

    class Base(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.mode = Mode.B

        def forward(self, x: Any) -> Any:
            return self.fc(x)

    class Net(Base):
        @classmethod
        def scale(cls) -> float:
            return 2.0

        def forward(self, x: Any) -> Any:
            y = Square.apply(super().forward(x)) * self.scale()
            return y if self.mode is Mode.A else -y

    m = Net()
    gs, gm, f_locals = compile_and_import(m, torch.randn(2, 4))
    for _ in range(2):
        assert gs.check(f_locals) is True
    assert fast_once(gs, f_locals), gs.explain()
    same_as_torch(
        gs,
        gm,
        f_locals,
        [
            ("mode A", set_attr(m, "mode", Mode.A)),
            ("Square.forward replaced", set_attr(Square, "forward", staticmethod(lambda ctx, x: x))),
            ("Base.forward replaced", set_attr(Base, "forward", lambda self, x: x)),
            ("scale a classmethod of another function", set_attr(Net, "scale", classmethod(lambda cls: 3.0))),
            ("__class__ to a subclass", swap_class(m, type("Sub", (Net,), {}))),
        ],
        # torch's guards pass it and its code returns 2.0 * y where eager returns 3.0 * y
        stricter=("scale a classmethod of another function",),
    )

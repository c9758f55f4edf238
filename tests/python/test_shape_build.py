"""A SHAPE symbol's declaration as GuardSet builds it (guard_set.py, _symbol_decl): the same texts,
steps and constants as the general source encoding, once per Source object."""

from __future__ import annotations

import pytest

import tripwire as tw
from tripwire import _core, builder, guard_set
from tripwire.source import Source, Step, StepKind

_TEXTS = [
    "L['n']",
    "G['n']",
    "C['n']",
    "L['x'].size()[0]",
    "L['x'].stride()[3]",
    "L['x'].storage_offset()",
    "L['é名'].size()[1]",  # non-ASCII root name
    "L['x\\'y\"'].size()[0]",  # quotes in the name: repr picks its own
    "L['self'].n",
    "L['self'].layers[0].weight.size()[2]",
    "L['d']['k'].size()[0]",
    "getattr(L['x'], 'size')().n",  # prints through getattr(): more than one step
]


def _sources() -> list[Source]:
    out = [Source.parse(t, shape_is_size=True) for t in _TEXTS]
    x = Source.local("x")
    out += [x.tensor_size(0), x.tensor_stride(1), x.tensor_storage_offset(), x.attr("𝕊"), x.item(None)]
    out.append(Source.local("x").step(StepKind.ATTR, "size").step(StepKind.WEAKREF_CALL))
    # A positional step before the property: its read step has no operand, only an index.
    out.append(Source.local("f").step(StepKind.DEFAULTS, 2).step(StepKind.SIZE, 1))
    return out


@pytest.mark.parametrize("src", _sources(), ids=str)
def test_symbol_decl_matches_the_source_recipe(src: Source) -> None:
    fresh = Source(src.root, src.name, src.steps)  # nothing cached on it yet
    path, consts, cpp_tensor = guard_set._symbol_decl(fresh)
    name, recipe, texts, reads_cpp = guard_set._source_recipe(src)
    assert path.texts == texts == src.printed_prefixes()
    assert path.root == src.root and path.name == 0
    assert consts[0] == name
    assert len(path.steps) == len(recipe)
    operands = iter(consts[1:])
    for step, (kind, arg, index, has_operand) in zip(path.steps, recipe, strict=True):
        assert step.kind == kind
        if has_operand:
            assert consts[step.operand] is next(operands) is arg
        else:
            assert step.operand is None and step.index == index
    assert cpp_tensor is reads_cpp is src.reads_cpp_tensor
    # Made once per object: the second call answers the same entry.
    assert guard_set._symbol_decl(fresh) is guard_set._symbol_decl(fresh)


class _LyingSource(Source):
    """A subclass printing otherwise: its own printed_prefixes() are used, nothing is kept on it."""

    def __str__(self) -> str:
        return "lie"

    def printed_prefixes(self) -> list[str]:
        return ["L['x']", "also a lie"]


def test_a_source_subclass_is_declared_from_its_own_prefixes_and_not_kept() -> None:
    src = _LyingSource(tw.RootKind.LOCAL, "x", (Step(StepKind.SIZE, 0),))
    path, _, _ = guard_set._symbol_decl(src)
    assert path.texts == ["L['x']", "also a lie"]
    assert id(src) not in guard_set._SYMBOL_DECLS
    assert guard_set._symbol_decl(src) is not guard_set._symbol_decl(src)


def test_cold_sources_give_the_same_set_as_shared_ones() -> None:
    """Equal sources that are distinct objects (each with its own declaration) build the set that
    one shared object builds: same symbols, explain(), failure reasons."""
    rels = ["L['a'] + L['b'] <= 10", "L['a'] >= 1", "L['b'] * 2 != L['a']"]
    ex = {"a": 3, "b": 4}

    def build(share: bool) -> tw.GuardSet:
        b = tw.GuardBuilder(ex)
        for text in rels:
            rel = tw.shapes.parse(text)
            if not share:
                rel = tw.shapes.Relation(
                    rel.text, tuple(Source(s.root, s.name, s.steps) for s in rel.symbols)
                )
            b.shape(rel)
        return b.build()

    one, many = build(True), build(False)
    assert one._shape_info == many._shape_info
    assert one.explain().split("shape relations")[1] == many.explain().split("shape relations")[1]
    bad = {"a": 8, "b": 4}
    assert [f.reason for f in one.failures(bad)] == [f.reason for f in many.failures(bad)]
    assert one.failures(bad) and not one.check(bad)
    assert _core.SourcePath  # the engine's declaration type the templates are made of


class _OddStep(Step):
    """A Step subclass whose properties say otherwise: they decide, not the kind's rule."""

    @property
    def index(self) -> int:
        return 7


def test_a_step_subclass_is_read_through_its_properties() -> None:
    src = Source(tw.RootKind.LOCAL, "x", (_OddStep(StepKind.SIZE, 0),))
    path, _, _ = guard_set._symbol_decl(src)
    assert path.steps[0].index == 7


def _decl_fields(entry: tuple) -> tuple:
    path, consts, cpp_tensor = entry
    steps = [(st.kind, st.operand, st.index) for st in path.steps]
    return (path.root, path.name, steps, path.texts), consts, cpp_tensor


@pytest.mark.parametrize("src", _sources(), ids=str)
def test_the_cpp_template_answers_as_the_python_fields(src: Source) -> None:
    """_core._symbol_template (made in C++ from the fields) and _symbol_decl_of_fields agree on
    every part: the steps, constants, texts and C++ tensor flag."""
    made = _core._symbol_template(Source(src.root, src.name, src.steps), Step)
    assert made is not None
    assert _decl_fields(made) == _decl_fields(guard_set._symbol_decl_of_fields(src, True))


class _OwnStep(Step):
    """A Step subclass: the C++ template refuses it, the Python fields path reads its properties."""


def test_a_step_subclass_is_declared_in_python() -> None:
    steps = (Step(StepKind.ATTR, "w"), _OwnStep(StepKind.SIZE, 1))
    src = Source(tw.RootKind.LOCAL, "x", steps)
    assert _core._symbol_template(src, Step) is None
    path, consts, _ = guard_set._symbol_decl(src)
    assert consts == ("x", "w") and [st.index for st in path.steps] == [0, 1]
    assert path.texts == ["L['x']", "L['x'].w", "L['x'].w.size()[1]"]


class _ShortPrefixes(Source):
    """Prints fewer prefixes than it has steps."""

    def printed_prefixes(self) -> list[str]:
        return ["L['x']"]


def test_a_template_with_texts_that_do_not_match_its_steps_is_refused() -> None:
    src = _ShortPrefixes(tw.RootKind.LOCAL, "x", (Step(StepKind.ATTR, "w"), Step(StepKind.SIZE, 0)))
    with pytest.raises(ValueError, match="texts do not match"):
        _core._symbol_template(src, Step)


def _shape_specs_of(ex: dict, rels: list[str]) -> list:
    b = tw.GuardBuilder(ex)
    for text in rels:
        b.shape(tw.shapes.parse(text))
    return list(b.guards)


def test_shape_only_specs_out_of_index_order_keep_the_index_order() -> None:
    """GuardSet of SHAPE specs only, given out of order: guards and explain() in index order, and
    the same decisions (the encoding reads them in one call, _core._shape_specs)."""
    ex = {"a": 3, "b": 4}
    specs = _shape_specs_of(ex, ["L['a'] >= 1", "L['b'] <= 9", "L['a'] + L['b'] == 7"])
    gs = tw.GuardSet(list(reversed(specs)))
    assert [s.index for s in gs.guards] == sorted(s.index for s in specs)
    assert gs.check(ex) and not gs.check({"a": 3, "b": 5})
    assert gs.why_not({"a": 0, "b": 7}).guard.index == specs[0].index


def test_a_hand_made_shape_spec_with_list_arguments_takes_the_general_encoding() -> None:
    ex = {"a": 3}
    (spec,) = _shape_specs_of(ex, ["L['a'] >= 1"])
    text, symbols, types = spec.args
    assert _core._shape_specs([spec], type(spec), spec.kind) == ([spec.index], [spec.args])
    hand = tw.GuardSpec(spec.kind, None, [text, symbols, types], index=spec.index)
    assert _core._shape_specs([hand], type(spec), spec.kind) is None
    gs = tw.GuardSet([hand])
    assert gs.check(ex) and not gs.check({"a": 0})


# -- the symbols' templates in one C++ call (_core._shape_symbol_templates) ------------------------
def _decl_parts(gs: tw.GuardSet) -> list:
    """Per declaration: its id, and per SHAPE symbol (root, name id, steps, texts)."""
    out = []
    for d in gs._decls():
        syms = [
            (p.root, p.name, [(st.kind, st.operand, st.index) for st in p.steps], p.texts) for p in d.symbols
        ]
        out.append((d.id, syms))
    return out


def _shape_set(symbols: list, *, python: bool, monkeypatch: pytest.MonkeyPatch) -> tw.GuardSet:
    """A set of one SHAPE relation per symbol (a text of one symbol: the engine binds by position),
    through the C++ templates or, with ``python``, through Python's templates."""
    specs = [
        tw.GuardSpec(tw.GuardKind.SHAPE, None, ("L['v'] >= 0", (sym,), ("int",)), index=i)
        for i, sym in enumerate(symbols)
    ]
    made = []
    real = _core._shape_symbol_templates

    def spy(*a: object) -> object:
        made.append(real(*a))
        return made[-1]

    with monkeypatch.context() as m:
        m.setattr(_core, "_shape_symbol_templates", (lambda *a: None) if python else spy)
        gs = tw.GuardSet(specs)
    assert python or made[0] is not None  # the C++ templates were used
    return gs


def test_the_cpp_templates_give_the_python_templates_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every symbol form (plain, property, positional, C++ tensor steps, a float or None key, odd
    names): the set declared from _shape_symbol_templates equals the one Python's templates
    declare, constant ids included (the same constants, interned by the pool in the same order)."""
    srcs = _sources() + [Source.local("x").item(2).step(StepKind.SIZE, 0), Source.local("x").item(-7)]
    srcs += [Source.local("x").item(0.5), Source.local("x").item(True), Source.local("x").item(1)]
    # The C++ tensor steps are read through torch's adapter: without it (no torch, or a build
    # without the adapter, as scripts/asan-tests makes) a set naming them is refused.
    try:
        import torch  # noqa: F401

        tw.tensors.ensure_torch()
        has_adapter = _core.torch_adapter_installed()
    except ImportError:
        has_adapter = False
    if not has_adapter:
        srcs = [s for s in srcs if not s.reads_cpp_tensor]
    srcs += [Source(s.root, s.name, s.steps) for s in srcs]  # equal copies: their own templates
    _core._clear_symbol_templates()
    cold = _decl_parts(_shape_set(srcs, python=False, monkeypatch=monkeypatch))
    warm = _decl_parts(_shape_set(srcs, python=False, monkeypatch=monkeypatch))
    assert cold == warm == _decl_parts(_shape_set(srcs, python=True, monkeypatch=monkeypatch))


def test_template_constants_are_interned_by_the_pool() -> None:
    """The C++ templates give each symbol's constants (its root's name, then its step operands);
    the pool interns them as it interns every constant: a str by its interned self, anything else
    by exact type and value, so the int 1, the str '1', True and 1.0 stay four constants."""
    x = Source.local("x")
    syms = [x.item(1).step(StepKind.SIZE, 0), Source.local("1").item("1"), x.item(True), x.item(1.0)]
    args = [("L['v'] >= 0", (sym,), ("int",)) for sym in syms]  # one symbol: bound by position
    found = _core._shape_symbol_templates(args, Source, Step)
    assert found is not None
    got, _, consts, cpp_tensor = found
    assert got == syms and cpp_tensor is False
    assert consts == [["x", 1], ["1", "1"], ["x", True], ["x", 1.0]]
    assert [type(c[1]) for c in consts] == [int, str, bool, float]
    pool = guard_set._Pool()
    _, _, remaps = guard_set._ShapeDecls.symbol_templates(_args_decls(args), pool)
    assert pool.consts == ["x", 1, "1", True, 1.0]
    assert [type(c) for c in pool.consts] == [str, int, str, bool, float]
    assert remaps == [[0, 1], [2, 2], [0, 3], [0, 4]]
    # The set names four distinct sources (no two merged by an equal-but-different key).
    gs = tw.GuardSet([tw.GuardSpec(tw.GuardKind.SHAPE, None, a, index=i) for i, a in enumerate(args)])
    operands = [parts[1][0][2][0][1] for parts in _decl_parts(gs)]
    assert operands == [1, 2, 3, 4]


def _args_decls(args: list) -> guard_set._ShapeDecls:
    shape = guard_set._ShapeDecls()
    shape.args = list(args)
    return shape


def test_subclasses_take_the_python_declarations() -> None:
    """A Source subclass, a Step subclass: no C++ templates (None); the set still builds through
    Python's templates."""
    for sym in (
        _LyingSource(tw.RootKind.LOCAL, "x", (Step(StepKind.SIZE, 0),)),
        Source(tw.RootKind.LOCAL, "x", (_OwnStep(StepKind.SIZE, 1),)),
    ):
        args = [("L['v'] >= 0", (Source.local("a"), sym), ("int", "int"))]
        assert _core._shape_symbol_templates(args, Source, Step) is None
        spec = tw.GuardSpec(tw.GuardKind.SHAPE, None, ("L['v'] >= 0", (sym,), ("int",)), index=0)
        assert len(tw.GuardSet([spec])) == 1


def test_a_source_whose_kept_print_is_not_a_str_is_printed_by_str() -> None:
    """The print kept on an exact Source (``_text``) is read in C++ only when it is an exact str:
    otherwise str() decides, which refuses a print that is no str."""
    src = Source.local("x").step(StepKind.SIZE, 0)
    object.__setattr__(src, "_text", "L['x'].size()[0]")
    assert _decl_parts(tw.GuardSet(_one_shape_spec(src)))[0][1][0][3] == ["L['x']", "L['x'].size()[0]"]
    odd = Source.local("x").step(StepKind.SIZE, 0)
    object.__setattr__(odd, "_text", 42)
    with pytest.raises(TypeError):
        tw.GuardSet(_one_shape_spec(odd))


def _one_shape_spec(sym: Source) -> list:
    return [tw.GuardSpec(tw.GuardKind.SHAPE, None, ("L['v'] >= 0", (sym,), ("int",)), index=0)]


def test_the_template_memo_is_emptied_with_the_build_memos() -> None:
    """clear_build_memos empties the C++ templates too (cold builds start from nothing); a set
    built after it is the same."""
    ex = {"a": 3, "b": 4}
    specs = _shape_specs_of(ex, ["L['a'] >= 1", "L['a'] + L['b'] == 7"])
    before = _decl_parts(tw.GuardSet(specs))
    builder.clear_build_memos()
    assert _decl_parts(tw.GuardSet(specs)) == before
    # A template is the object's until the memos are emptied: a print changed behind the frozen
    # Source's back (what tripwire never does) is seen only once they are.
    src = Source.local("x").step(StepKind.SIZE, 0)
    object.__setattr__(src, "_text", "L['x'].size()[0]")

    def printed() -> str:
        return _decl_parts(tw.GuardSet(_one_shape_spec(src)))[0][1][0][3][1]

    assert printed() == "L['x'].size()[0]"
    object.__setattr__(src, "_text", "L['x'].size()[ 0 ]")
    assert printed() == "L['x'].size()[0]"
    builder.clear_build_memos()
    assert printed() == "L['x'].size()[ 0 ]"

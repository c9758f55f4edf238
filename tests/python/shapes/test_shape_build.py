"""A SHAPE symbol's declaration as GuardSet builds it: the declaration of any guard's source
(guard_set._source_decl), shared with the set's other guards on that source."""

from __future__ import annotations

import pytest

import tripwire as tw
from tripwire import guard_set
from tripwire.source import Source, StepKind

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


def _shape_decl_symbols(gs: tw.GuardSet) -> list:
    return [d.symbols for d in gs._decls() if d.kind == tw.GuardKind.SHAPE]


@pytest.mark.parametrize("src", _sources(), ids=str)
def test_a_shape_symbol_is_declared_as_its_source(src: Source) -> None:
    """The SHAPE symbol's path: the source's printed prefixes and steps, its constants those of
    the source, as a guard on the source declares it."""
    fresh = Source(src.root, src.name, src.steps)  # nothing cached on it yet
    spec = tw.GuardSpec(tw.GuardKind.SHAPE, None, ("L['v'] >= 0", (fresh,), ("int",)), index=0)
    pool = guard_set._Pool()
    (decl,) = guard_set.encode_decls([spec], pool)
    (path,) = decl.symbols
    name, recipe, texts, _reads_cpp = guard_set._source_recipe(src)
    assert path.texts == texts == src.printed_prefixes()
    assert path.root == src.root and pool.consts[path.name] == name
    assert len(path.steps) == len(recipe)
    for step, (kind, arg, index, has_operand) in zip(path.steps, recipe, strict=True):
        assert step.kind == kind
        if has_operand:
            assert pool.consts[step.operand] == arg
        else:
            assert step.operand is None and step.index == index


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


def _shape_specs_of(ex: dict, rels: list[str]) -> list:
    b = tw.GuardBuilder(ex)
    for text in rels:
        b.shape(tw.shapes.parse(text))
    return list(b.guards)


def test_shape_only_specs_out_of_index_order_keep_the_index_order() -> None:
    """GuardSet of SHAPE specs only, given out of order: guards and explain() in index order, and
    the same decisions."""
    ex = {"a": 3, "b": 4}
    specs = _shape_specs_of(ex, ["L['a'] >= 1", "L['b'] <= 9", "L['a'] + L['b'] == 7"])
    gs = tw.GuardSet(list(reversed(specs)))
    assert [s.index for s in gs.guards] == sorted(s.index for s in specs)
    assert gs.check(ex) and not gs.check({"a": 3, "b": 5})
    assert gs.why_not({"a": 0, "b": 7}).guard.index == specs[0].index


def test_a_hand_made_shape_spec_with_list_arguments_is_declared() -> None:
    ex = {"a": 3}
    (spec,) = _shape_specs_of(ex, ["L['a'] >= 1"])
    text, symbols, types = spec.args
    hand = tw.GuardSpec(spec.kind, None, [text, symbols, types], index=spec.index)
    gs = tw.GuardSet([hand])
    assert gs.check(ex) and not gs.check({"a": 0})


def test_a_symbol_that_is_also_a_guards_source_is_one_declaration() -> None:
    """A SHAPE symbol and a guard on the same Source object share one declaration (one node)."""
    ex = {"a": 3, "b": 4}
    b = tw.GuardBuilder(ex)
    b.shape("L['a'] + L['b'] == 7")
    b.equals(b.guards[0].args[1][0])
    gs = b.build()
    assert gs.node_count == 2
    assert gs.check(ex) and not gs.check({"a": 4, "b": 3})


def test_a_saved_sets_shape_declarations_are_the_built_sets() -> None:
    """to_bytes declares SHAPE relations through the engine's one declaration (add_shape_decls),
    as a GuardSet's constructor does: the same ids, texts, symbol paths and types, in the same
    places among the other guards; a bad symbol type is a GuardBuildError naming the types."""
    b = tw.GuardBuilder({"a": 3, "b": 4.5})
    b.equals("L['a']")
    b.shape("L['a'] + 1 <= 10")
    b.equals("L['b']")
    b.shape("L['b'] * 2 != L['a']")
    gs = b.build()

    def view(decls: list) -> list:
        return [(d.kind, d.id, d.relation, list(d.symbol_types), [p.texts for p in d.symbols]) for d in decls]

    _pool, saved = guard_set._encode_saved(list(gs._specs))
    assert [d.kind for d in saved].count(tw.GuardKind.SHAPE) == 2
    assert view(saved) == view(sorted(gs._decls(), key=lambda d: d.id))
    spec = tw.GuardSpec(tw.GuardKind.SHAPE, None, ("L['v'] >= 0", (Source.parse("L['v']"),), ("str",)), 0)
    with pytest.raises(tw.GuardBuildError, match="'int' or 'float'"):
        guard_set.encode_decls([spec], guard_set._Pool())

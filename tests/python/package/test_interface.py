"""The joins between the package, the engine and the oracle.

* One definition of the IR: the enums the package uses are the engine's own.
* The typed declarations carry each kind's operands in the slots the engine's table says.
* The oracle (tests/oracle/reference.py, not shipped) is independent: no production module imports it, and where the
  engine and the oracle each implement a rule (what a constant is, the built-in probes), they
  agree on generated inputs.
"""

from __future__ import annotations

import ast
import enum
import math
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference
import tripwire as tw
from gc_stress import examples
from tripwire import _core
from tripwire.catalogue import GuardSpec
from tripwire.guard_set import _Pool, encode_decls
from tripwire.source import Source

PACKAGE = pathlib.Path(tw.__file__).parent


def test_enums_are_the_engines_own():
    assert tw.GuardKind is _core.GuardKind
    assert tw.StepKind is _core.StepKind and tw.RootKind is _core.RootKind
    assert issubclass(tw.GuardKind, enum.IntEnum)
    assert [k.name for k in tw.RootKind] == ["LOCAL", "GLOBAL", "CLOSURE"]
    assert tw.GuardKind(6) is tw.GuardKind.EQUALS_MATCH
    # Every kind the catalogue page documents exists, and every kind is documented.
    text = (pathlib.Path(__file__).parents[3] / "docs" / "guards.md").read_text()
    for k in tw.GuardKind:
        assert k.name in text, f"{k.name} is not documented in docs/guards.md"


def _one_spec_per_kind():
    class O:
        pass

    o = O()
    ex = {
        "x": 3,
        "d": {"k": 1},
        "o": o,
        "f": _one_spec_per_kind,
        "w": __import__("weakref").ref(o),
        "s": {"k"},
    }
    ex["it"] = iter((1, 2))
    ex["r"] = iter(range(3))
    b = tw.GuardBuilder(ex)
    b.type_match("L['x']")
    b.id_match("L['o']")
    b.not_none("L['x']")
    b.equals("L['x']")
    b.length("L['d']")
    b.dict_keys("L['d']")
    b.dict_contains("L['d']", "k")
    b.hasattr("L['o']", "zz")
    b.set_contains("L['s']", "k")
    b.dict_version("L['d']")
    b.tuple_iterator_len("L['it']")
    b.range_iterator("L['r']")
    b.code_match("L['f']")
    b.weakref_alive("L['w']")
    b.global_state("recursion_limit")
    b.global_state(lambda: 1, name="one")
    b.predicate(lambda v: True, "always", source="L['x']")
    b.predicate(lambda loc: True, "always")
    b.shape("L['x'] > 0")
    b.alias("L['x']", "L['d']['k']")
    b.no_alias("L['x']", "L['o']", "L['f']")
    specs = list(b.guards)
    # Tensor and array kinds from their plain-data expectations (no torch or numpy needed to encode).
    exp = tw.tensors.TensorExpectation(1, 6, -1, False, (2, None), (None, 1))
    specs.append(GuardSpec(tw.GuardKind.TENSOR_MATCH, Source.parse("L['t']"), (O, exp), 103))
    arr = tw.tensors.ArrayExpectation("<f4", (3,), (4,), True, True, True, True)
    specs.append(GuardSpec(tw.GuardKind.ARRAY_MATCH, Source.parse("L['a']"), (O, arr), 104))
    marks = tw.tensors.DimensionMarkings((frozenset({0}), None, None, None, None))
    specs.append(GuardSpec(tw.GuardKind.DIMENSION_MARKING, Source.parse("L['t']"), (marks,), 105))
    others = (Source.parse("L['o']"), Source.parse("L['f']"))
    specs.append(GuardSpec(tw.GuardKind.STORAGE_OVERLAPPING, Source.parse("L['x']"), (others, 2), 106))
    # The raw bits of an applied key set, above 2**63: encoded as the engine's int64.
    specs.append(
        GuardSpec(tw.GuardKind.DISPATCH_KEY_SET_MATCH, Source.parse("L['x']"), ((1 << 63) + 5,), 107)
    )
    specs.append(GuardSpec(tw.GuardKind.NONE, Source.parse("L['n']"), (), 100))
    specs.append(GuardSpec(tw.GuardKind.TRUE, Source.parse("L['t']"), (), 101))
    specs.append(GuardSpec(tw.GuardKind.FALSE, Source.parse("L['f2']"), (), 102))
    return specs


def test_each_kinds_operands_sit_in_the_slots_the_engine_expects():
    # The catalogue's args table (catalogue.py), the encoder (guard_set._encode) and the engine's
    # kind table (its source and operand columns, tripwire.catalogue.KINDS) are three statements of
    # one layout: pin them together for every kind.
    specs = _one_spec_per_kind()
    assert {s.kind for s in specs} == set(tw.GuardKind)
    for spec, decl in zip(specs, encode_decls(specs, _Pool()), strict=True):
        facts = tw.catalogue.KINDS[spec.kind]
        needs_source, allows_source = facts.source == "required", facts.source != "absent"
        operand, operand2 = facts.operand != "none", facts.operand2
        assert decl.kind is spec.kind
        has_source = decl.source is not None
        assert (not needs_source or has_source) and (allows_source or not has_source), spec.kind
        if spec.kind is tw.GuardKind.GLOBAL_STATE:
            # Two forms (core::validate_decl): a built-in probe's id in n, or a Python probe and
            # its snapshot in both operands.
            builtin = isinstance(spec.args[0], str)
            assert (decl.operand is None and decl.operand2 is None) == builtin
            assert (decl.operand is not None and decl.operand2 is not None) == (not builtin)
        else:
            assert (decl.operand is not None) == operand, spec.kind
            assert (decl.operand2 is not None) == operand2, spec.kind
        # Per-kind plain data and the other sources of relational kinds.
        has_data = spec.kind in (
            tw.GuardKind.TENSOR_MATCH,
            tw.GuardKind.ARRAY_MATCH,
            tw.GuardKind.DIMENSION_MARKING,
        )
        assert bool(decl.data) == has_data, spec.kind
        others = {tw.GuardKind.ALIAS: 1, tw.GuardKind.NO_ALIAS: 2, tw.GuardKind.STORAGE_OVERLAPPING: 2}
        assert len(decl.more_sources) == others.get(spec.kind, 0)
        # STORAGE_OVERLAPPING's overlapping count travels in n, DISPATCH_KEY_SET_MATCH's bits too.
        assert decl.n == (2 if spec.kind is tw.GuardKind.STORAGE_OVERLAPPING else decl.n)
        if spec.kind is tw.GuardKind.DISPATCH_KEY_SET_MATCH:
            assert decl.n == 5 - (1 << 63)


def test_no_production_module_imports_the_oracle():
    # The oracle lives in tests/oracle and is not part of the package (nor of its wheel).
    assert not (PACKAGE / "reference.py").exists()
    for path in sorted(PACKAGE.rglob("*.py")):  # the subpackages too (tripwire.torch)
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = {a.name for a in node.names}
                assert node.module not in ("reference", "tripwire.reference"), path.name
                assert not (node.level and "reference" in names), path.name
            elif isinstance(node, ast.Import):
                assert all(a.name not in ("reference", "tripwire.reference") for a in node.names), path.name


def test_the_oracle_reads_relation_text_with_its_own_parser():
    # Shape relations name sources in text: the oracle reads them with Python's ast and its own
    # normal form (reference._symbol_form), never the engine's readers (Source.parse and its fast
    # plain-text reader, shapes' parser, _core.parse_relation): a bug there must show as a mismatch.
    engine_readers = {"parse", "_parse_text", "_parse_plain", "_parse_ast", "parse_relation"}
    tree = ast.parse(pathlib.Path(reference.__file__).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in engine_readers:
            assert not (
                isinstance(node.value, ast.Name) and node.value.id in ("Source", "_core", "shapes")
            ), ast.unparse(node)


def test_builtin_probes_agree():
    assert _core.builtin_probes() == list(reference.BUILTIN_PROBES)
    for name, read in reference.BUILTIN_PROBES.items():
        if name.startswith("torch_"):
            continue  # torch's probes: test_torch_state.py compares them with torch itself
        assert _core.read_builtin_probe(name) == read()
        assert type(_core.read_builtin_probe(name)) is type(read())


def test_plain_data_layouts_agree():
    """The package's names for the engine's plain-data layouts (core/kind_data.hpp)."""
    assert _core.MARKING_ATTRS == (
        "_dynamo_dynamic_indices",
        "_dynamo_weak_dynamic_indices",
        "_dynamo_unbacked_indices",
        "_dynamo_strict_unbacked_indices",
        "_dynamo_static_indices",
    )
    assert _core.TORCH_STATE_FIELDS[:3] == ("grad_mode", "torch_function", "torch_function_all_disabled")
    assert len(_core.TORCH_STATE_FIELDS) == 12 and _core.TORCH_STATE_FIELDS[-1] == "autocast_devices"
    exp = tw.tensors.TensorExpectation((1 << 64) - 1, 6, 0, True, (2, None), (None, 1), 3)
    assert exp.to_data() == [-1, 6, 0, 1, 2, 3, 2, _core.ANY_DIM, _core.ANY_DIM, 1]


def test_constant_depth_bounds_agree():
    assert reference.MAX_CONSTANT_DEPTH == _core.MAX_CONSTANT_DEPTH


class Color(enum.Enum):
    RED = 1


class Loud(int):
    pass


_scalars = st.one_of(
    st.integers(),
    st.floats(allow_nan=True),
    st.complex_numbers(),
    st.text(max_size=3),
    st.binary(max_size=3),
    st.booleans(),
    st.none(),
    st.just(Ellipsis),
    st.builds(range, st.integers(-3, 3), st.integers(-3, 3)),
    st.just(Color.RED),
    st.builds(Loud, st.integers()),  # an int subclass: not a constant
    st.builds(object),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.frozensets(st.one_of(st.integers(), st.text(max_size=2)), max_size=3),
        st.dictionaries(st.one_of(st.integers(), st.text(max_size=2)), inner, max_size=3),
        st.builds(slice, inner, inner),
    ),
    max_leaves=12,
)


@settings(max_examples=examples(400), deadline=None)
@given(_values)
def test_engine_and_oracle_agree_on_what_a_constant_is(v):
    assert _core.is_constant(v) == reference.is_constant(v)


@pytest.mark.parametrize("depth", [0, 1, _core.MAX_CONSTANT_DEPTH - 1, _core.MAX_CONSTANT_DEPTH])
def test_constant_depth_agrees_at_the_bound(depth):
    v = 0
    for _ in range(depth):
        v = [v]
    for start in (0, 1):
        assert _core.is_constant(v, start) == reference.is_constant(v, start)


@settings(max_examples=examples(400), deadline=None)
@given(_values, _values)
def test_engine_and_oracle_agree_on_equals_match(v, c):
    if not reference.is_constant(c):
        return
    assert _core.equals_match(v, c) == reference.equals_match(v, c)
    assert _core.equals_match(c, c) and reference.equals_match(c, c)


def test_read_source_is_what_the_builder_sees():
    class O:
        def __init__(self):
            self.a = {"k": [10, 20]}

    b = tw.GuardBuilder({"o": O()})
    assert b.value("L['o'].a['k'][1]") == 20
    with pytest.raises(
        tw.GuardBuildError, match=r"cannot read L\['o'\]\.b from the example: .*has no attribute"
    ):
        b.value("L['o'].b")
    with pytest.raises(tw.GuardBuildError, match="is not set"):
        b.value("L['nope']")
    assert math.isnan(_core.read_source(tw.RootKind.LOCAL, "x", [], {"x": float("nan")}, None, None))


def test_dict_hints_are_on_for_every_supported_version():
    # The fast paths (dict entry hints, inline attribute reads, str-keyed dict reads in the fast
    # pass) have a verified layout mirror for each supported CPython: on, not merely correct off.
    import sys

    assert sys.version_info[:2] in ((3, 11), (3, 12), (3, 13))
    assert _core._dict_hints_enabled()

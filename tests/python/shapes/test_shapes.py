"""SHAPE guards: the engine against the reference on generated relations, the text syntax and its
errors, the structured form, explain(), failures, inference, and hostile objects."""

from __future__ import annotations

import dataclasses
import gc
import math
import random
import sys
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference
import shape_cases
import tripwire as tw
from gc_stress import examples, scaled
from tripwire import _core
from tripwire.shapes import Range, sym

X0 = "L['x'].size()[0]"


class T:
    """A tensor-like object: size(), stride(), storage_offset() as torch has them."""

    def __init__(self, *sizes: int, strides: tuple | None = None, offset: int = 0) -> None:
        self._sizes = tuple(sizes)
        self._strides = strides if strides is not None else tuple(1 for _ in sizes)
        self._offset = offset

    def size(self) -> tuple:
        return self._sizes

    def stride(self) -> tuple:
        return self._strides

    def storage_offset(self) -> int:
        return self._offset


# -- the engine against the reference ------------------------------------------------------------
def test_generated_relation_sets_match_the_reference() -> None:
    # Bounded here; `python tests/python/support/shape_cases.py --pairs 100000` is the long run.
    stats = shape_cases.run_pairs(scaled(2000, 100), seed=20240611)
    assert stats["passed"] > 0 and stats["failed"] > 0
    if stats["pairs"] >= 1000:  # merges are frequent enough to show at this size
        assert stats["merged_or_implied"] > 0


def test_generated_single_relations_match_the_reference_on_both_paths() -> None:
    stats = shape_cases.run_relations(scaled(2000, 200), seed=7)
    assert stats["fast"] > 0 and stats["exact"] > 0


def test_generated_builder_checks_match_the_reference() -> None:
    # GuardBuilder.shape against the oracle (tests/oracle/reference.py); the long run is
    # shape_cases.py's.
    stats = shape_cases.run_builder(scaled(2000, 200), seed=21)
    assert stats["held"] > 0 and stats["refused"] > 0 and stats["wrong_type"] > 0
    if stats["relations"] >= 1000:  # unreadable frames are ~2% of the generated ones
        assert stats["unreadable"] > 0 and stats["type_errors"] > 0


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_builder_checks_match_for_any_seed(seed: int) -> None:
    shape_cases.run_builder(8, seed)


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_relation_sets_match_the_reference_for_any_seed(seed: int) -> None:
    shape_cases.run_pairs(8, seed)


@pytest.mark.parametrize(
    "text,values,holds",
    [
        ("L['a'] // L['b'] == -4", [-7, 2], True),
        ("L['a'] % L['b'] == -1", [7, -2], True),
        ("L['a'] * L['a'] > 2**125", [2**63 - 1], True),  # overflows int64: exact integers
        ("L['a'] - 1 == 2**64 - 1", [2**64], True),  # an input beyond int64
        ("L['a'] // L['b'] == 0", [1, 0], False),  # ZeroDivisionError: the relation fails
        ("L['b'] != 0 and L['a'] // L['b'] == 0", [1, 0], False),  # short-circuit: no error
        ("L['b'] == 0 or L['a'] % L['b'] == 1", [1, 0], True),
        ("L['a'] ** 70 > 0", [2], True),
        ("L['a'] ** L['b'] == 1", [2, -1], False),  # a natural exponent only
        ("float(L['a']) > 0", [10**400], False),  # OverflowError, as Python
        ("L['a'] > 9007199254740992.0", [2**53 + 1], True),  # exact int/float comparison
        ("L['a'] / L['b'] == 0.5", [1, 2], True),
        ("(10**30) / L['a'] == 3.333333333333333e+29", [3], True),
    ],
)
def test_int_semantics_are_pythons(text: str, values: list, holds: bool) -> None:
    rel = tw.shapes.parse(text)
    ordered = dict(zip(["L['a']", "L['b']"], values))
    vals = [ordered[str(s)] for s in rel.symbols]
    assert rel.evaluate(vals)[0] is holds
    assert (
        reference.shape_holds(
            rel.text, rel.symbols, ["int"] * len(vals), dict(zip(map(str, rel.symbols), vals))
        )
        is holds
    )


@pytest.mark.parametrize("s", [math.nan, math.inf, -math.inf, 0.0, -0.0, 5e-324, 1e308])
def test_float_semantics_and_nan(s: float) -> None:
    for text in ["not math.isnan(L['s'])", "L['s'] == L['s']", "L['s'] != L['s']", "L['s'] < 1 or L['s'] >= 1",
                 "L['s'] // 0.5 >= 0", "L['s'] % -2.0 <= 0", "math.floor(L['s']) >= 0"]:  # fmt: skip
        rel = tw.shapes.parse(text)
        want = reference.shape_holds(rel.text, rel.symbols, ["float"], {"L['s']": s})
        assert rel.evaluate([s])[0] is want, (text, s)


def test_bit_limit_is_the_references() -> None:
    assert reference.MAX_INT_BITS == 65536
    rel = tw.shapes.parse("L['a'] ** 65535 > 0")
    assert rel.evaluate([2])[0] is True
    holds, error = tw.shapes.parse("L['a'] ** 65536 > 0").evaluate([2])
    assert not holds and "65536 bits" in error
    assert not reference.shape_holds(
        "L['a'] ** 65536 > 0", tw.shapes.parse("L['a'] > 0").symbols, ["int"], {"L['a']": 2}
    )


# -- the text syntax -----------------------------------------------------------------------------
TORCH_PARTS = [
    "((6*L['x'].size()[0]) % 4) == 0  # z = x.reshape(-1, 4)  # t.py:4 in f (_prims_common/__init__.py:1118 in infer_size)",
    "(6*L['x'].size()[0]) == (4*((3*L['x'].size()[0]) // 2))  # z = x.reshape(-1, 4)",
    "((3*L['x'].size()[0]) // 2) != L['x'].size()[0]",
    "(L['x'].size()[0] % ((3*L['x'].size()[0]) // 2)) != 0",
    "((6*L['x'].size()[0]) // ((3*L['x'].size()[0]) // 2)) == 4",
    "(L['x'].size()[0] // 2) <= L['y'].size()[0]  # return z.sum() + y[: x.shape[0] // 2].sum()",
    "4 <= L['x'].size()[0]",
    "2 <= L['y'].size()[0]  # user code shown is first use of this value--the guard itself is not due user code but due to 0/1 specialization in the framework; to avoid specialization try torch._dynamo.decorators.mark_unbacked(tensor, dim)",
    "not math.isnan(L['s'])  # implicit guard for float input due to NaN specialization in the framework",
    "L['x'].stride()[0] == L['x'].size()[1]  # (unknown source L['x'].stride()[0], please file a bug)",
    "2 <= L['x'].size()[0] <= 1024  # a and b",
    "2 <= L['x'].size()[0] and L['x'].size()[0] <= 1024",
    "Eq(Mod(L['x'].size()[0], 8), 0)",
    "L['x'].shape[0] == L['y'].size(0)",
]


@pytest.mark.parametrize("part", TORCH_PARTS)
def test_torch_code_parts_parse(part: str) -> None:
    rels = tw.shapes.relations_from_torch(part)
    assert rels
    for rel in rels:
        assert "#" not in rel.text
        assert all(str(s).startswith("L[") for s in rel.symbols)
        assert ".shape[" not in rel.text and ".size(0)" not in rel.text
    if "#" in part:
        assert rels[0].comment == part.split("#", 1)[1].strip()


def test_top_level_conjunctions_split_and_chains_do_not() -> None:
    assert [
        r.text for r in tw.shapes.relations_from_torch("2 <= L['x'].size()[0] and L['x'].size()[0] <= 1024")
    ] == [
        "2 <= L['x'].size()[0]",
        "L['x'].size()[0] <= 1024",
    ]
    assert len(tw.shapes.relations_from_torch("2 <= L['x'].size()[0] <= 1024")) == 1


def test_symbols_are_canonical_and_distinct() -> None:
    rel = tw.shapes.parse("  L['x'].shape[0] + L['x'].size(0) == 2 * L['x'].size()[0]  # same symbol thrice")
    assert rel.text == "L['x'].size()[0] + L['x'].size()[0] == 2 * L['x'].size()[0]"
    assert [str(s) for s in rel.symbols] == [X0]
    assert rel.comment == "same symbol thrice"


@pytest.mark.parametrize(
    "text,offset,fragment",
    [
        ("", 0, "empty"),
        ("L['x'] >", 8, "expected an operand"),
        ("L['x'].size()[0] > (1 + 2", 25, "expected ')'"),
        ("foo(L['x']) > 1", 0, "unknown function"),
        ("L['x'] @ 1", 7, "unexpected '@'"),
        ("L['x'].size()[-1] > 0", 0, "non-negative"),  # a source Source.parse refuses: at the source
        ("1 < L['é'] + ", 13, "expected an operand"),  # offsets count characters, not bytes
        ("(" * 300 + "1" + ")" * 300 + " == 1", 100, "nested"),
    ],
)
def test_syntax_errors_have_offsets(text: str, offset: int, fragment: str) -> None:
    with pytest.raises(tw.ShapeSyntaxError) as info:
        tw.shapes.parse(text)
    assert info.value.offset == offset
    assert fragment in info.value.message
    assert isinstance(info.value, ValueError) and isinstance(info.value, tw.GuardBuildError)
    assert info.value.text == text


@pytest.mark.parametrize(
    "text,offset",
    [
        ("L['s'] ** 2 > 1", 7),
        ("  L['x'].shape[0] + 1", 18),  # offsets in the text as given, not the canonical one
        ("L['x'].shape[0] + (L['n'] < 1) > 0", 16),
        ("max(L['n'], L['s']) > 0", 0),
    ],
)
def test_type_errors_have_offsets_into_the_original_text(text: str, offset: int) -> None:
    b = tw.GuardBuilder({"x": T(4), "n": 3, "s": 0.5})
    with pytest.raises(tw.ShapeSyntaxError) as info:
        b.shape(text)
    assert info.value.offset == offset, info.value


_ALPHABET = st.sampled_from(list("L['x'].size()[0] +-*/%<>=!() 0123456789.,#\"\\éG_mathisnaorndif\t\n") + [
    "L['x']", "L['s']", ".size()", "[0]", "math.isnan(", "max(", "Eq(", " and ", " or ", " not ", " if ", " else ",
    "**", "//", "<=", "==", "1e400", "True", "getattr(", "'", ")", "(",
])  # fmt: skip


@settings(max_examples=examples(400), deadline=None)
@given(st.lists(_ALPHABET, max_size=40).map("".join))
def test_malformed_text_gives_one_clear_error(text: str) -> None:
    # Any text: a Relation, or a ShapeSyntaxError inside the text; nothing else, never a crash.
    try:
        rel = tw.shapes.parse(text)
    except tw.ShapeSyntaxError as e:
        assert 0 <= e.offset <= len(text)
        assert e.message
        return
    assert rel.text == rel.text.strip()
    # Parsing the canonical text again gives the same relation.
    again = tw.shapes.parse(rel.text)
    assert again.text == rel.text and again.symbols == rel.symbols


@settings(max_examples=examples(200), deadline=None)
@given(st.integers(0, 2**32), st.data())
def test_mutated_relations_give_one_clear_error(seed: int, data: st.DataObject) -> None:
    text = shape_cases.relation(random.Random(seed))
    pos = data.draw(st.integers(0, len(text)))
    op = data.draw(st.sampled_from(["delete", "insert", "swap"]))
    ch = data.draw(st.sampled_from(list("()[]'\",.+-*/%<>=!# 0aL")))
    if op == "delete" and pos < len(text):
        text = text[:pos] + text[pos + 1 :]
    elif op == "insert":
        text = text[:pos] + ch + text[pos:]
    elif pos < len(text):
        text = text[:pos] + ch + text[pos + 1 :]
    try:
        rel = tw.shapes.parse(text)
    except tw.ShapeSyntaxError as e:
        assert 0 <= e.offset <= len(text)
        return
    types = [shape_cases._symbol_type(s) for s in rel.symbols]
    values = [1 if t == "int" else 1.0 for t in types]
    try:
        rel.evaluate(values)
    except tw.ShapeSyntaxError as e:  # a type error, also with its offset in the text as given
        assert 0 <= e.offset <= len(text)


# -- the builder ---------------------------------------------------------------------------------
def test_relation_must_hold_on_the_example() -> None:
    b = tw.GuardBuilder({"x": T(9)})
    with pytest.raises(
        tw.GuardBuildError,
        match=r"\(\(6\*L\['x'\]\.size\(\)\[0\]\) % 4\) == 0 is false with L\['x'\]\.size\(\)\[0\] = 9",
    ):
        b.shape("((6*L['x'].size()[0]) % 4) == 0")
    with pytest.raises(tw.GuardBuildError, match="raised ZeroDivisionError"):
        b.shape("L['x'].size()[0] // 0 == 1")
    with pytest.raises(tw.GuardBuildError, match="is a str"):
        tw.GuardBuilder({"n": "3"}).shape("L['n'] > 0")
    with pytest.raises(tw.GuardBuildError, match="cannot read"):
        tw.GuardBuilder({}).shape("L['n'] > 0")
    assert len(b) == 0


def test_failure_names_the_relation_and_every_symbol() -> None:
    ex = {"x": T(8, 3), "y": T(10), "s": 0.5}
    b = tw.GuardBuilder(ex)
    b.shape("((L['x'].size()[1]*L['x'].size()[0]) % 4) == 0  # z = x.reshape(-1, 4)")
    b.shape("(L['x'].size()[0] // 2) <= L['y'].size()[0]")
    b.shape("not math.isnan(L['s'])")
    gs = b.build()
    f = gs.why_not({**ex, "x": T(9, 3)})
    assert f is not None and f.kind == "SHAPE"
    assert f.reason == (
        "((L['x'].size()[1]*L['x'].size()[0]) % 4) == 0 is false with L['x'].size()[1] = 3, L['x'].size()[0] = 9"
    )
    assert f.expected == "((L['x'].size()[1]*L['x'].size()[0]) % 4) == 0"
    assert f.actual == {"L['x'].size()[1]": 3, "L['x'].size()[0]": 9}
    assert f.source == "L['x'].size()[1], L['x'].size()[0]"
    assert f.guard.index == 0
    f = gs.why_not({**ex, "s": math.nan})
    assert f.reason == "not math.isnan(L['s']) is false with L['s'] = nan"
    f = gs.why_not({**ex, "y": [1, 2]})
    assert f.reason.startswith(
        "(L['x'].size()[0] // 2) <= L['y'].size()[0]: L['y'].size()[0] cannot be read ("
    )
    assert f.actual is None
    f = gs.why_not({**ex, "s": 1})
    assert (
        f.reason
        == "not math.isnan(L['s']): L['s'] has type int, not float (a shape symbol keeps the exact type of its example)"
    )
    assert [x.guard.index for x in gs.failures({**ex, "x": T(30, 3), "s": math.nan})] == [0, 1, 2]


def test_explain_reports_relations_before_and_after() -> None:
    b = tw.GuardBuilder({"x": T(8), "n": 5})
    b.shape(f"4 <= {X0}")
    b.shape(f"2 <= {X0}")  # implied by #0
    b.shape(f"4 <= {X0}  # a duplicate")  # merged into #0
    b.shape(f"{X0} % 2 == 0")
    b.shape("L['n'] * 2 < 100")
    gs = b.build()
    text = gs.explain()
    assert (
        "shape relations (checked after every source): 5 declared, 3 evaluated (1 merged as duplicates, 1 implied by earlier ones); 2 symbols"
        in text
    )
    assert "[dropped: implied by #0]" in text and "[merged: the same relation as #0]" in text
    assert f"{X0}   [shape symbol s0]" in text
    assert gs.check({"x": T(6), "n": 5})
    assert not gs.check({"x": T(3), "n": 5})
    assert "failed 1x" in gs.explain()


def test_structured_form_prints_the_text_syntax() -> None:
    x0, y0, n = sym("L['x'].shape[0]"), sym("L['y'].size(0)"), sym("L['n']")
    assert str(x0 // 2 <= y0) == "(L['x'].size()[0] // 2) <= L['y'].size()[0]"
    assert str(Range(2, x0, 1024)) == "2 <= L['x'].size()[0] <= 1024"
    assert str(Range(2, x0)) == "2 <= L['x'].size()[0]"
    assert str(tw.shapes.Eq(tw.shapes.Mod(6 * x0, 4), 0)) == "((6 * L['x'].size()[0]) % 4) == 0"
    assert str((x0 > 1) & ~(n == -3) | tw.shapes.IsNan(sym("L['s']"))) == (
        "((L['x'].size()[0] > 1) and (not (L['n'] == (-3)))) or math.isnan(L['s'])"
    )
    assert (
        str(tw.shapes.Max(x0, y0, 3) - tw.shapes.Min(n, 2))
        == "max(L['x'].size()[0], L['y'].size()[0], 3) - min(L['n'], 2)"
    )
    assert (
        str(tw.shapes.Pow(n, 2) + tw.shapes.IntTrueDiv(n, 3) > math.inf)
        == "((L['n'] ** 2) + IntTrueDiv(L['n'], 3)) > math.inf"
    )
    with pytest.raises(TypeError, match="truth value"):
        bool(x0 < 3)
    with pytest.raises(TypeError, match="sym"):
        x0 + "L['n']"
    ex = {"x": T(8), "y": T(4), "n": 5, "s": 0.5}
    b = tw.GuardBuilder(ex)
    b.shape(x0 // 2 <= y0)
    b.shape(Range(2, x0, 1024))
    b.shape(tw.shapes.Ne(n * n % 7, 0))
    gs = b.build()
    assert gs.check(ex) and not gs.check({**ex, "y": T(3)})


def test_relation_whose_texts_differ_only_in_spelling_merge() -> None:
    b = tw.GuardBuilder({"x": T(8)})
    b.shape("L['x'].shape[0] >= 4")
    b.shape("4 <= L['x'].size(0)")
    relations = b.build()._shape_info["relations"]
    assert [status for _, status, _, _ in relations] == ["kept", "merged"]


# -- symbols -------------------------------------------------------------------------------------
def test_symbol_is_read_once_per_check() -> None:
    calls = []

    class Counting(T):
        def size(self) -> tuple:
            calls.append(1)
            return super().size()

    x = Counting(8, 4)
    b = tw.GuardBuilder({"x": x})
    for text in [f"{X0} % 4 == 0", f"{X0} >= 2", f"{X0} // 2 != 3", "L['x'].size()[1] * 2 == 8"]:
        b.shape(text)
    gs = b.build()
    calls.clear()
    assert gs.check({"x": x})
    assert len(calls) == 2  # size()[0] and size()[1]: one call per symbol, not per relation


def test_int_inputs_and_attributes_take_the_fast_pass() -> None:
    class Cfg:
        def __init__(self) -> None:
            self.k = 4

    ex = {"n": 12, "cfg": Cfg()}
    b = tw.GuardBuilder(ex)
    b.type_match("L['cfg']")
    b.shape("L['n'] % L['cfg'].k == 0")
    b.shape("2 <= L['n'] <= 1024")
    gs = b.build()
    assert gs._uses_fast_pass
    for _ in range(3):
        assert gs.check(ex)
    assert gs._fast_pass_count >= 2
    assert not gs.check({**ex, "n": 13})
    assert not gs.check({**ex, "n": 2**80})  # beyond int64: decided exactly, false
    assert gs.check({**ex, "n": 1024})
    assert not gs.check({**ex, "n": True})  # not an int: fails closed


def test_numpy_arrays_read_shape_and_byte_strides() -> None:
    np = pytest.importorskip("numpy")
    a = np.zeros((6, 4), dtype=np.float32)
    b = tw.GuardBuilder({"a": a})
    b.shape("L['a'].size()[0] * L['a'].size()[1] == 24")
    b.shape("L['a'].stride()[0] == 16")  # bytes, as numpy counts them
    gs = b.build()
    assert gs.check({"a": np.zeros((3, 8), dtype=np.float32)}) is False  # stride 32
    assert gs.check({"a": np.zeros((12, 4), dtype=np.float32)[::2]}) is False  # stride 32
    assert gs.check({"a": np.ones((6, 4), dtype=np.float32)})
    with pytest.raises(tw.GuardBuildError, match="storage_offset"):
        tw.GuardBuilder({"a": a}).shape("L['a'].storage_offset() == 0")
    assert reference.fetch(tw.Source.parse("L['a'].stride()[1]"), {"a": a}) == 4


# -- the C-level size reader (runtime/tensors/property_reader.hpp) ---------------------------------
_PROPERTY_RELATIONS = [
    f"{X0} % 4 == 0",
    "2 <= L['x'].size()[1]",
    "L['x'].stride()[0] == L['x'].size()[1] * L['x'].stride()[1]",
    "L['x'].storage_offset() == 0",
]


def _reader_cases(torch):
    """(label, value) pairs on which the reader must answer exactly as Python's x.size() etc."""

    class Sub(torch.Tensor):
        pass

    class Lying(torch.Tensor):
        def size(self, dim=None):  # what x.size() calls for this type
            return torch.Size([12, 5])

    shadowed = torch.zeros(8, 4)
    shadowed.size = lambda: torch.Size([12, 4])  # an instance attribute: x.size() calls it
    base = torch.zeros(20, 4)
    return [
        ("tensor", torch.zeros(8, 4)),
        ("tensor 12x4", torch.ones(12, 4)),
        ("tensor 9x4", torch.zeros(9, 4)),
        ("tensor 8x1", torch.zeros(8, 1)),
        ("transposed", torch.zeros(4, 8).t()),
        ("offset view", base[4:12]),
        ("parameter", torch.nn.Parameter(torch.zeros(8, 4))),
        ("subclass", torch.zeros(8, 4).as_subclass(Sub)),
        ("lying subclass", torch.zeros(8, 4).as_subclass(Lying)),
        ("instance attribute", shadowed),
        ("sparse", torch.zeros(8, 4).to_sparse()),
        ("rank 1", torch.zeros(8)),
    ]


def _decisions_match_the_reference(gs, specs, values) -> None:
    for label, v in values:
        want = reference.first_failure(specs, {"x": v}) is None
        assert gs.check({"x": v}) == want, label
        f = gs.why_not({"x": v})
        assert (f is None) == want, label


def test_c_level_reader_reads_plain_tensors_and_arrays_only() -> None:
    """The reader answers for exact torch.Tensor / Parameter and exact numpy.ndarray values and
    leaves everything Python would resolve differently (a subclass, an overridden size(), an
    instance attribute, a layout without strides) to the Python path."""
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    tw.tensors.ensure_torch()
    tw.tensors.ensure_numpy()
    if not _core.torch_adapter_installed():
        pytest.skip("the torch adapter is not built")
    K = tw.StepKind
    read = _core.testing.read_tensor_property
    cases = dict(_reader_cases(torch))
    t = torch.zeros(20, 4)[4:12].t()
    assert [read(t, K.SIZE, 0), read(t, K.SIZE, 1), read(t, K.SIZE, 2)] == [4, 8, "missing"]
    assert [read(t, K.STRIDE, 0), read(t, K.STRIDE, 1), read(t, K.STORAGE_OFFSET, 0)] == [1, 4, 16]
    assert read(cases["parameter"], K.SIZE, 0) == 8
    for label in ("subclass", "lying subclass", "instance attribute"):
        assert read(cases[label], K.SIZE, 0) is None, label
    sparse = cases["sparse"]
    assert read(sparse, K.SIZE, 1) == 4 and read(sparse, K.STRIDE, 0) is None  # torch raises: Python's
    assert read(sparse, K.STORAGE_OFFSET, 0) is None
    a = np.zeros((6, 4), dtype=np.float32)[::2]
    if tw.tensors.array_path().startswith("array struct"):
        assert [read(a, K.SIZE, 0), read(a, K.STRIDE, 0), read(a, K.STORAGE_OFFSET, 0)] == [3, 32, "missing"]

    class ArraySub(np.ndarray):
        @property
        def shape(self):
            return (99, 99)

    assert read(a.view(ArraySub), K.SIZE, 0) is None
    assert read(3, K.SIZE, 0) is None and read(T(8, 4), K.SIZE, 0) is None

    # Under a torch-function mode x.size() calls the mode: left to Python.
    class PassThrough(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x = torch.zeros(8, 4)
    with PassThrough():
        assert read(x, K.SIZE, 0) is None
    assert read(x, K.SIZE, 0) == 8


def test_c_level_reader_decides_as_the_reference_on_both_paths() -> None:
    """Relations over sizes, strides and the storage offset of real tensors: the fast pass stores
    what the adapter reads, the walk (forced Python readers) calls the methods; both equal the
    reference (which calls x.size() in Python) on every value, including the ones Python resolves
    differently from the C accessors."""
    torch = pytest.importorskip("torch")
    values = _reader_cases(torch)
    b = tw.GuardBuilder({"x": torch.zeros(8, 4)})
    for text in _PROPERTY_RELATIONS:
        b.shape(text)
    gs = b.build()
    specs = list(gs.guards)
    if _core.torch_adapter_installed():
        assert gs._uses_fast_pass
        before = gs._fast_pass_count
        assert gs.check({"x": torch.zeros(8, 4)}) and gs.check({"x": torch.nn.Parameter(torch.zeros(12, 4))})
        assert gs._fast_pass_count == before + 2  # decided by the fast pass, no x.size() call
    _decisions_match_the_reference(gs, specs, values)
    _core._force_python_readers(True)
    try:
        _decisions_match_the_reference(gs, specs, values)
    finally:
        _core._force_python_readers(False)


def test_c_level_reader_follows_patched_and_restored_methods() -> None:
    """A size() assigned on torch.Tensor is what Python calls: the reader stands aside until it is
    removed again (the type's version tag changes; the methods are looked up again)."""
    torch = pytest.importorskip("torch")
    b = tw.GuardBuilder({"x": torch.zeros(8, 4)})
    b.shape(f"{X0} % 4 == 0")
    gs = b.build()
    x9 = torch.zeros(9, 4)
    assert not gs.check({"x": x9})
    torch.Tensor.size = lambda self, dim=None: torch.Size([12, 4])
    try:
        assert reference.first_failure(list(gs.guards), {"x": x9}) is None  # Python sees 12
        assert gs.check({"x": x9})
        assert _core.testing.read_tensor_property(x9, tw.StepKind.SIZE, 0) is None
    finally:
        del torch.Tensor.size
    assert not gs.check({"x": x9})
    if _core.torch_adapter_installed():
        assert _core.testing.read_tensor_property(x9, tw.StepKind.SIZE, 0) == 9
        before = gs._fast_pass_count
        assert gs.check({"x": torch.zeros(12, 4)}) and gs._fast_pass_count == before + 1


def test_c_level_reader_under_a_lying_torch_function_mode() -> None:
    torch = pytest.importorskip("torch")

    class LyingMode(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") == "size":
                return torch.Size([12, 4])
            return func(*args, **(kwargs or {}))

    b = tw.GuardBuilder({"x": torch.zeros(8, 4)})
    b.shape(f"{X0} % 4 == 0")
    gs = b.build()
    x9 = torch.zeros(9, 4)
    with LyingMode():
        want = reference.first_failure(list(gs.guards), {"x": x9}) is None
        assert want and gs.check({"x": x9})  # x.size() under the mode says 12, as Python sees it
    assert not gs.check({"x": x9})


def test_c_level_reader_on_numpy_arrays_matches_the_reference() -> None:
    np = pytest.importorskip("numpy")

    class ArraySub(np.ndarray):
        @property
        def shape(self):
            return (12, 4)

    b = tw.GuardBuilder({"x": np.zeros((8, 4), dtype=np.float32)})
    b.shape(f"{X0} % 4 == 0")
    b.shape("L['x'].stride()[0] == 4 * L['x'].size()[1]")
    gs = b.build()
    specs = list(gs.guards)
    z = np.zeros((24, 4), dtype=np.float32)
    values = [
        ("array", np.zeros((8, 4), dtype=np.float32)),
        ("9 rows", np.zeros((9, 4), dtype=np.float32)),
        ("strided", z[::2]),
        ("float64", np.zeros((8, 4))),
        ("fortran", np.asfortranarray(np.zeros((8, 4), dtype=np.float32))),
        ("subclass", np.zeros((9, 4), dtype=np.float32).view(ArraySub)),
    ]
    if tw.tensors.array_path().startswith("array struct"):
        assert gs._uses_fast_pass
        before = gs._fast_pass_count
        assert gs.check({"x": values[0][1]}) and gs._fast_pass_count == before + 1
    _decisions_match_the_reference(gs, specs, values)


def test_hostile_size_methods() -> None:
    state = {"mode": "ok", "gs": None}

    class Hostile(T):
        def size(self) -> tuple:
            mode = state["mode"]
            if mode == "raise":
                raise RuntimeError("boom")
            if mode == "float":
                return (8.0,)
            if mode == "bigint":
                return (2**100,)
            if mode == "reenter":
                state["mode"] = "ok"
                # A check of the same set from inside its own check: it has its own frame.
                assert state["gs"].check({"x": Hostile(3)}) is False
                state["mode"] = "reenter"
                return (8,)
            if mode == "mutate":
                self._sizes = (3,)
                return (8,)
            return self._sizes

    x = Hostile(8)
    b = tw.GuardBuilder({"x": x})
    b.shape(f"{X0} % 4 == 0")
    b.shape(f"{X0} >= 4")
    gs = b.build()
    state["gs"] = gs
    for mode, want in [
        ("raise", False),
        ("float", False),
        ("bigint", True),
        ("reenter", True),
        ("mutate", True),
    ]:
        state["mode"] = mode
        assert gs.check({"x": x}) is want, mode
        assert (gs.why_not({"x": x}) is None) is want, mode
    state["mode"] = "raise"
    assert "RuntimeError: boom" in gs.why_not({"x": x}).reason
    strict = tw.GuardSet(list(b.guards), strict=True)
    with pytest.raises(tw.GuardEvalError):
        strict.check({"x": x})


def test_lying_ints_and_interrupts() -> None:
    class MyInt(int):  # an int subclass: not the example's type, whatever it claims
        def __index__(self) -> int:
            return 4

        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    b = tw.GuardBuilder({"n": 4})
    b.shape("L['n'] % 4 == 0")
    gs = b.build()
    assert gs.check({"n": 8}) and not gs.check({"n": MyInt(5)})
    assert "has type MyInt, not int" in gs.why_not({"n": MyInt(5)}).reason

    class Interrupting(T):
        def size(self) -> tuple:
            raise KeyboardInterrupt

    b = tw.GuardBuilder({"x": T(4)})
    b.shape(f"{X0} >= 2")
    gs = b.build()
    with pytest.raises(KeyboardInterrupt):  # never turned into a failed guard
        gs.check({"x": Interrupting(4)})
    with pytest.raises(KeyboardInterrupt):
        gs.why_not({"x": Interrupting(4)})


def test_locals_mutated_by_a_size_call() -> None:
    # size() of the first tensor replaces the second one in the locals mid-check: the walk holds
    # what it read, and the relation is decided on the values read (as Python's lambda would).
    class Mutating(T):
        def __init__(self, f_locals: dict, *sizes: int) -> None:
            super().__init__(*sizes)
            self.f_locals = f_locals

        def size(self) -> tuple:
            self.f_locals["y"] = T(1)
            self.f_locals.pop("z", None)
            return super().size()

    ex = {"x": T(8), "y": T(4), "z": 3}
    b = tw.GuardBuilder(ex)
    b.shape("L['x'].size()[0] // 2 == L['y'].size()[0]")
    b.shape("L['z'] < L['x'].size()[0]")
    gs = b.build()
    for _ in range(scaled(50, 10)):
        f_locals: dict = {"y": T(4), "z": 3}
        f_locals["x"] = Mutating(f_locals, 8)
        # Whichever root the (adaptive) walk reads first, size() has replaced y or removed z
        # before it is read: False, never a crash or a stale pass.
        assert gs.check(f_locals) is False
        assert gs.why_not(f_locals) is not None


def test_threads_checking_one_set() -> None:
    # Symbols go to a frame per check: threads (size() may release the GIL) never mix values.
    b = tw.GuardBuilder({"x": T(8, 4), "n": 4})
    b.shape("L['x'].size()[0] == 2 * L['n']")
    b.shape("L['x'].size()[1] == L['n']")
    gs = b.build()
    errors = []

    def run(k: int) -> None:
        for i in range(scaled(300, 30)):
            n = 1 + (i + k) % 9
            good = {"x": T(2 * n, n), "n": n}
            bad = {"x": T(2 * n + 1, n), "n": n}
            if not gs.check(good) or gs.check(bad):
                errors.append((k, i))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors


class _Holder:
    def __init__(self, k: int) -> None:
        self.k = k


def _threaded_ref(x0: int, x1: int, n: int, k: int) -> bool:
    """The relations of test_threads_checking_while_another_mutates, in Python."""
    return x0 == 2 * n and x1 <= n and (x0 * x1) % 4 == 0 and k + n > 2


def test_threads_checking_while_another_mutates() -> None:
    """Four threads check one set of SHAPE relations on one shared frame while a fifth mutates it:
    it rebinds the int, reshapes the array in place (numpy: the C-level reader), replaces the
    tensor-like object's sizes in place (Python size() calls, which let other threads run), and
    sets an attribute. Every answer must be the reference decision for some state made of values
    each symbol held while that check ran (a symbol is read once per check: an answer no such
    state explains would mean a symbol read twice, or a value torn); no crash, no error."""
    np = pytest.importorskip("numpy")
    r = random.Random(5)
    # The states, applied in order; about half pass.
    states = []
    for _ in range(scaled(3000, 300)):
        n = r.choice([1, 2, 3, 4, 6])
        x0 = 2 * n if r.random() < 0.7 else 2 * n + r.choice([-1, 1, 2])
        x1 = r.choice([1, 2, n, n + 1]) if x0 > 0 else 1
        states.append((max(x0, 1), max(x1, 1), n, r.choice([0, 1, 5])))
    x0, x1, n, k = 8, 4, 4, 5
    arr = np.zeros((x0, x1))
    shared = {"x": arr, "t": T(x0, x1), "n": n, "o": _Holder(k)}
    b = tw.GuardBuilder(shared)
    for base in ("x", "t"):
        b.shape(f"L['{base}'].size()[0] == 2 * L['n']")
        b.shape(f"L['{base}'].size()[1] <= L['n']")
        b.shape(f"(L['{base}'].size()[0] * L['{base}'].size()[1]) % 4 == 0")
    b.shape("L['o'].k + L['n'] > 2")
    gs = b.build()
    done = [0]  # states[:done] fully applied; states[done] may be in progress
    history = [(x0, x1, n, k)]  # history[i]: the state after i applications
    stop = threading.Event()
    errors: list = []
    answers = {True: 0, False: 0}
    decisive = [0]  # checks whose window admits one answer only

    min_checks = scaled(2000, 200)
    min_decisive = 5

    def mutate() -> None:
        # Every state once, then on round again until the checkers have done enough checks, with
        # both answers and enough decisive windows (a slow build, ASan, --gc-stress: the checkers
        # may get few turns). Bounded by time, not by states: under --gc-stress the mutator once
        # ran its whole state budget while the checkers finished 33 checks. When the checkers lag
        # behind, the mutator yields for real (a sleep, not sleep(0)) so they get turns.
        i = 0
        deadline = time.monotonic() + 120.0

        def enough() -> bool:
            return (
                sum(answers.values()) >= min_checks
                and decisive[0] >= min_decisive
                and answers[True] > 0
                and answers[False] > 0
            )

        while (i < len(states) or not enough()) and time.monotonic() < deadline:
            state = states[i % len(states)]
            i += 1
            sx0, sx1, sn, sk = state
            arr.resize((sx0, sx1), refcheck=False)  # in place: the same object, new sizes
            shared["t"]._sizes = (sx0, sx1)
            shared["n"] = sn
            shared["o"].k = sk
            history.append(state)
            done[0] += 1
            # let the checkers run between states (else one side starves)
            time.sleep(0 if sum(answers.values()) >= i // 4 else 0.001)
        stop.set()

    def check() -> None:
        while not stop.is_set():
            lo = done[0]
            try:
                got = gs.check(shared)
            except Exception as e:  # must not happen
                errors.append(repr(e))
                return
            hi = done[0]
            window = history[lo : hi + 1] + [states[hi % len(states)]]
            # Per symbol, the values it held in the window (the array's and the object's sizes,
            # the int, the attribute): each symbol is read once, so some choice explains it.
            s0, s1 = {h[0] for h in window}, {h[1] for h in window}
            ns, ks = {h[2] for h in window}, {h[3] for h in window}
            explained = {
                _threaded_ref(a0, a1, m, q) and _threaded_ref(t0, t1, m, q)
                for a0 in s0 for a1 in s1 for t0 in s0 for t1 in s1 for m in ns for q in ks
            }  # fmt: skip
            if got not in explained:
                errors.append((got, lo, hi))
            answers[got] += 1
            decisive[0] += len(explained) == 1
            time.sleep(0)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=check) for _ in range(4)]
        for t in threads:
            t.start()
        mutate()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors[:5]
    assert answers[True] and answers[False], answers
    # Windows that admit one answer only: there a wrong answer fails.
    assert decisive[0] >= min_decisive, (decisive, answers)
    # And the set still decides each state exactly when nothing moves.
    for state in states[:50]:
        sx0, sx1, sn, sk = state
        frame = {"x": np.zeros((sx0, sx1)), "t": T(sx0, sx1), "n": sn, "o": _Holder(sk)}
        assert gs.check(frame) == _threaded_ref(*state), state


# -- inference -----------------------------------------------------------------------------------
def test_dynamic_dimensions_as_dynamo_declares_them() -> None:
    ex = {"x": T(8, 4, 1), "y": T(4)}
    rels = tw.shapes.dynamic_relations(ex, {"x": "all", "y": [0]})
    assert rels == [
        "2 <= L['x'].size()[0]",
        "2 <= L['x'].size()[1]",
        "L['x'].size()[2] == 1",  # 0/1 specialisation
        "L['y'].size()[0] == L['x'].size()[1]",  # duck sizing
    ]
    assert tw.shapes.dynamic_relations(ex, {"y": [0]}, duck=False, specialize_zero_one=False) == [
        "0 <= L['y'].size()[0]"
    ]
    with pytest.raises(tw.GuardBuildError, match="no dimension 3"):
        tw.shapes.dynamic_relations(ex, {"x": [3]})


def test_guards_for_takes_relations_and_dynamic_dimensions() -> None:
    ex = {"x": T(8, 4), "y": T(4), "n": 3}
    gs = tw.guards_for(
        ex,
        policy=tw.Policy(dynamic={"x": [0, 1], "y": [0]}, per_arg={"n": "type"}),
        relations=["L['x'].size()[0] % 4 == 0", sym("L['n']") < 10],
    )
    kinds = [g.kind for g in gs.guards]
    assert kinds.count(tw.GuardKind.SHAPE) == 5
    assert gs.check(ex)
    assert gs.check({"x": T(12, 5), "y": T(5), "n": 9})
    f = gs.why_not({"x": T(12, 5), "y": T(6), "n": 3})
    assert f.kind == "SHAPE" and "L['y'].size()[0] == L['x'].size()[1]" in f.reason
    assert not gs.check({"x": T(10, 5), "y": T(5), "n": 3})
    assert not gs.check({"x": T(12, 5), "y": T(5), "n": 10})
    assert not gs.check({"x": T(12, 1), "y": T(1), "n": 3})  # 2 <= size


def test_core_parse_relation_reports_symbol_spans() -> None:
    code_end, spans, symbols = _core.parse_relation("L['é'] + L['x'].size(0) > L['é']  # c")
    assert symbols == ["L['é']", "L['x'].size(0)"]
    assert spans == [(0, 6, 0), (9, 23, 1), (26, 32, 0)]
    assert code_end == 32


def test_core_raises_the_packages_syntax_error_class_as_found_when_raised(monkeypatch) -> None:
    """The engine's text errors are tripwire.ShapeSyntaxError, looked up when raised (no class is
    held in C++): a module attribute that is not a ValueError subclass, or a module that is gone,
    gives a plain ValueError with the same message, and nothing is left pinned or set."""
    import tripwire.errors as errors

    with pytest.raises(tw.ShapeSyntaxError) as e:
        _core.parse_relation("L['a'] +")
    assert e.value.offset == 8 and e.type is tw.ShapeSyntaxError
    monkeypatch.setattr(errors, "ShapeSyntaxError", 42)
    with pytest.raises(ValueError, match=r"expected an operand.*\(at offset 8\)") as e:
        _core.parse_relation("L['a'] +")
    assert e.type is ValueError
    monkeypatch.undo()
    monkeypatch.delitem(sys.modules, "tripwire.errors")
    with pytest.raises(ValueError) as e:
        _core.evaluate_relation("1 +", [], [])
    assert e.type is ValueError
    monkeypatch.undo()
    with pytest.raises(tw.ShapeSyntaxError):
        _core.evaluate_relation("1 +", [], [])


def test_explain_says_which_reader_each_symbol_uses() -> None:
    """explain() names each symbol's reader on the example (the C-level property reader for an
    exact numpy.ndarray, a Python size() call for anything else, a frame read for an int), and
    symbol_readers(f_locals) answers for another frame: the reader follows the value's type."""
    np = pytest.importorskip("numpy")

    class Sub(np.ndarray):
        pass

    ex = {"a": np.zeros((4, 2)), "t": T(6, 3), "n": 2, "s": np.zeros((5, 2)).view(Sub)}
    b = tw.GuardBuilder(ex)
    b.shape("L['a'].shape[0] == 2 * L['n']")
    b.shape("L['t'].size()[1] <= L['s'].shape[0]")
    gs = b.build()
    text = gs.explain()
    assert "symbol readers, on the example the set was built from" in text
    assert "L['a'].size()[0]: C-level property reader (exact numpy.ndarray: the array struct)" in text
    assert "L['t'].size()[1]: Python call: L['t'].size() (T:" in text
    assert "L['s'].size()[0]: Python: L['s'].shape (Sub is not exactly numpy.ndarray)" in text
    assert "L['n']: read from the frame" in text
    # Another frame: the array is now a tensor-like object, the object an exact array.
    other = gs.symbol_readers({"a": T(4, 2), "t": np.zeros((6, 3)), "n": 2, "s": np.zeros((5, 2))})
    assert other["L['a'].size()[0]"].startswith("Python call: L['a'].size()")
    assert other["L['t'].size()[1]"].startswith("C-level property reader (exact numpy.ndarray")
    assert other["L['s'].size()[0]"].startswith("C-level property reader (exact numpy.ndarray")
    assert gs.symbol_readers({})["L['a'].size()[0]"].startswith("L['a'] not readable here")
    # With the C-level readers switched off, the example's arrays are read through Python.
    was = _core._force_python_readers(True)
    try:
        assert (
            gs.symbol_readers(ex)["L['a'].size()[0]"] == "Python: L['a'].shape (C-level readers switched off)"
        )
    finally:
        _core._force_python_readers(was)
    # A set not built from an example (GuardSet(specs)) says the reader is chosen per check.
    assert "no example recorded" in tw.GuardSet(b.guards).explain()


def test_explain_names_the_torch_reader() -> None:
    torch = pytest.importorskip("torch")
    if not _core.torch_adapter_installed():
        pytest.skip("the C-level tensor reader needs the torch adapter")

    class Sub(torch.Tensor):
        pass

    ex = {
        "x": torch.randn(4, 3),
        "p": torch.nn.Parameter(torch.randn(2)),
        "s": torch.randn(3).as_subclass(Sub),
    }
    b = tw.GuardBuilder(ex)
    b.shape("L['x'].size()[0] + L['p'].size()[0] > L['s'].size()[0]")
    text = b.build().explain()
    assert "L['x'].size()[0]: C-level property reader (exact torch.Tensor: the torch adapter)" in text
    assert "L['p'].size()[0]: C-level property reader (exact torch.nn.parameter.Parameter" in text
    assert "L['s'].size()[0]: Python call: L['s'].size() (Sub:" in text


def test_collection_during_build_declares_and_empties_memos() -> None:
    """Finalizers run by collections in the middle of GuardBuilder.shape declare more relations on
    the same builder (re-entering the install-site walk and the engine's memos) and empty the
    memos: nothing is lost, the set decides both ways."""

    b = tw.GuardBuilder({"x": T(8, 4), "n": 4})
    errors: list = []

    class Finalizer:
        def __init__(self) -> None:
            self.me = self  # a cycle: freed by a collection

        def __del__(self) -> None:
            try:
                b.shape("L['n'] >= 1")
                _empty_every_memo()
            except Exception as e:  # recorded: must not happen
                errors.append(e)

    n = scaled(150, 30)
    old = gc.get_threshold()
    gc.set_threshold(1)
    try:
        for i in range(n):
            Finalizer()
            b.shape(f"(L['x'].size()[0] * {i + 1}) % {i + 1} == 0 and L['x'].size()[0] + {i} > L['n']")
        gs = b.build()
    finally:
        gc.set_threshold(*old)
    gc.collect()
    assert not errors
    assert len(b) >= n + 1  # the loop's relations and at least one from a finalizer
    assert gs.check({"x": T(8, 4), "n": 4}) and not gs.check({"x": T(3, 4), "n": 4})
    assert all(s.stack and "test_shapes.py" in s.stack[-1] for s in gs.guards)


@pytest.mark.parametrize(
    "text,example,values",
    [
        ("L['n'] + 1 > L['n']", {"n": 2**63 - 1}, [(2**63 - 1, True), (2**63, True), (-(2**63) - 1, True)]),
        ("L['n'] // L['d'] == 9223372036854775808", {"n": -(2**63), "d": -1},
         [((-(2**63), -1), True), ((-(2**63) + 1, -1), False), ((-(2**63), 0), False)]),
        ("L['n'] < 9223372036854775808", {"n": 1}, [(2**63 - 1, True), (2**63, False), (1.0, False)]),
        ("L['n'] < 9223372036854775808", {"n": 1.0}, [(float(2**63), False), (1.0, True), (1, False)]),
    ],
)  # fmt: skip
def test_relations_near_2_63_through_the_builder(text: str, example: dict, values: list) -> None:
    """The builder's memoised check and the set agree with Python at the int64 boundary (the memo
    keys on the symbols' types: an int and a float symbol with one text are two programs)."""
    b = tw.GuardBuilder(example)
    b.shape(text)
    gs = b.build()
    names = list(example)
    for v, want in values:
        frame = dict(zip(names, v if isinstance(v, tuple) else (v,), strict=True))
        assert gs.check(frame) is want, (text, frame)


def test_builder_reads_each_symbol_once_and_refuses_with_the_reason() -> None:
    """GuardBuilder.shape reads each symbol's source once, and a refusal names the source, type
    or values."""
    calls: list[str] = []

    class Counting(T):
        def size(self) -> tuple:
            calls.append("size")
            return super().size()

    b = tw.GuardBuilder({"x": Counting(8, 4), "n": 4, "f": 0.5, "s": "str", "y": T(3)})
    spec = b.shape("L['x'].size()[0] * L['x'].size()[1] > L['n'] + L['f']")
    assert calls == ["size", "size"]  # one read per symbol: x.size()[0] and x.size()[1]
    assert spec.args[2] == ("int", "int", "int", "float")
    with pytest.raises(tw.GuardBuildError, match="does not hold on the example"):
        b.shape("L['x'].size()[0] * L['x'].size()[1] < 0")
    assert calls == ["size"] * 4  # a refusal reads each symbol once too
    with pytest.raises(tw.GuardBuildError, match=r"does not hold on the example: L\['y'\]\.size\(\)\[0\] > 3 "
                       r"is false with L\['y'\]\.size\(\)\[0\] = 3"):  # fmt: skip
        b.shape("L['y'].size()[0] > 3")
    with pytest.raises(tw.GuardBuildError, match=r"shape symbol L\['s'\] is a str on the example"):
        b.shape("L['s'] > 3")
    with pytest.raises(tw.GuardBuildError, match=r"cannot read L\['missing'\] from the example"):
        b.shape("L['missing'] > 3")
    with pytest.raises(tw.GuardBuildError, match=r"raised ZeroDivisionError"):
        b.shape("L['n'] // (L['n'] - 4) == 1")
    with pytest.raises(tw.ShapeSyntaxError) as e:  # a type error: the offset in the text as given
        b.shape("  L['f'] ** 2 > 0  # a comment")
    assert e.value.offset == 9  # the '**', counted in the text as given (leading blanks too)
    assert len(b) == 1  # the refused relations declared nothing
    gs = b.build()
    assert gs.check({"x": T(8, 4), "n": 4, "f": 0.5, "s": "", "y": T(3)})
    assert not gs.check({"x": T(1, 4), "n": 4, "f": 0.5, "s": "", "y": T(3)})


# Relations on int locals at the edges of the int64 path: an overflow, an error in a branch a
# short circuit skips, INT64_MIN negated, a negative power, a bool compared, a float, a type error
# (with its offset), a big literal.
_SMALL_INT_CASES = [
    ("L['a'] * L['b'] > 0", (2**62, 2**62)),
    ("L['a'] * L['b'] > 0", (3, -4)),
    ("L['a'] + L['b'] < 0", (2**63 - 1, 1)),
    ("L['a'] - L['b'] < 0", (-(2**63), 1)),
    ("L['a'] == 0 or 10 // L['a'] > 1", (0, 0)),
    ("L['a'] == 0 or 10 // L['a'] > 1", (5, 0)),
    ("L['a'] != 0 and 10 % L['a'] == 1", (0, 0)),
    ("L['a'] != 0 and 10 % L['a'] == 1", (-3, 0)),
    ("-L['a'] < 0", (-(2**63), 0)),
    ("abs(L['a']) > L['b']", (-(2**63), 7)),
    ("abs(L['a']) > L['b']", (-8, 7)),
    ("L['a'] // L['b'] == -1", (-(2**63), -1)),
    ("L['a'] // L['b'] == -3", (7, -3)),
    ("L['a'] % L['b'] == 0", (-(2**63), -1)),
    ("L['a'] % L['b'] == 2", (-7, 3)),
    ("L['a'] ** 3 == 8", (2, 0)),
    ("L['a'] ** L['b'] >= 1", (2, -1)),
    ("L['a'] ** L['b'] > 0", (3, 40)),
    ("max(L['a'], L['b'], 3) == 3 and min(L['a'], L['b']) < 0", (-1, 2)),
    ("math.floor(L['a']) == L['a'] and round(L['b']) >= L['b']", (4, -5)),
    ("(L['a'] if L['b'] > 0 else L['b']) <= 2", (9, 1)),
    ("(L['a'] if L['b'] > 0 else L['b']) <= 2", (9, -1)),
    ("not L['a'] < L['b'] or L['a'] >= 0", (-2, 1)),
    ("(L['a'] == 1) == (L['b'] == 2)", (1, 3)),
    ("L['a'] / 2 == 1.5", (3, 0)),
    ("L['a'] > 99999999999999999999", (3, 0)),
    ("L['a'] > -99999999999999999999 == True", (3, 0)),
    ("L['a'] + (L['b'] == 1) > 0", (1, 1)),
    ("L['a'] + L['b']", (1, 1)),
    ("(L['a'] if L['b'] > 0 else L['b'] > 0) == True", (1, 1)),
    ("L['a'] > 0 and L['b']", (1, 1)),
]


@pytest.mark.parametrize(("text", "values"), _SMALL_INT_CASES)
def test_builder_on_small_ints_decides_as_the_reference(text: str, values: tuple) -> None:
    """GuardBuilder.shape decides as the compiled program on both paths (evaluate_relation) and the
    reference, with the same type errors and offsets."""
    rel = tw.shapes.parse(text)
    f_locals = dict(zip("ab", values, strict=True))
    codes = [0] * len(rel.symbols)
    got: object
    want: object
    try:
        got = tw.GuardBuilder(f_locals).shape(rel).args[2]
    except tw.ShapeSyntaxError as e:
        got = ("syntax", e.offset, e.message)
    except tw.GuardBuildError as e:
        assert "does not hold on the example" in str(e)
        got = None
    try:
        holds, _error, _path = _core.evaluate_relation(
            rel.text, codes, [f_locals[s.name] for s in rel.symbols]
        )
        want = ("int",) * len(rel.symbols) if holds else None
        ref = reference.shape_holds(rel.text, rel.symbols, ["int"] * len(rel.symbols),
                                    {str(s): f_locals[s.name] for s in rel.symbols})  # fmt: skip
        assert holds == ref
    except tw.ShapeSyntaxError as e:
        want = ("syntax", e.offset, e.message)
    assert got == want


def test_builder_a_read_that_raises_refuses_after_one_read() -> None:
    """A symbol source that raises on its first read: the builder says so after that one read
    (the user code runs once), declares nothing and gives the index back; the next declaration
    reads again."""
    state = {"raised": 0}

    class Flaky(T):
        def size(self) -> tuple:
            if not state["raised"]:
                state["raised"] += 1
                raise RuntimeError("first read")
            return super().size()

    b = tw.GuardBuilder({"x": Flaky(8)})
    with pytest.raises(tw.GuardBuildError, match="RuntimeError"):
        b.shape("L['x'].size()[0] == 8")
    assert state["raised"] == 1 and len(b) == 0 and b._next_index == 0
    assert b.shape("L['x'].size()[0] == 8").index == 0
    assert b.build().check({"x": T(8)})


def test_structured_and_text_relations_share_the_one_call() -> None:
    """A Relation from tripwire.shapes.parse, an Expr and the text build the same spec."""
    ex = {"x": T(8, 4)}
    b = tw.GuardBuilder(ex)
    rel = tw.shapes.parse(f"{X0} >= 2")
    a = b.shape(rel)
    c = b.shape(sym(X0) >= 2)
    d = b.shape(f"{X0} >= 2")
    assert a.args == c.args == d.args
    assert tw.shapes.relations_from_torch(f"{X0} >= 2  # why") == [tw.shapes.parse(f"{X0} >= 2  # why")]
    assert tw.shapes.relations_from_torch(f"{X0} >= 2  # why") is not tw.shapes.relations_from_torch(
        f"{X0} >= 2  # why"
    )  # a new list each call (the memo holds a tuple)


# -- the SHAPE declarations made in GuardSetCore's one call (bind_guard_set.cpp, add_shape_decls) --
def test_hand_made_shape_specs_are_refused_with_clear_errors() -> None:
    from tripwire.catalogue import GuardKind, GuardSpec

    xs = tw.Source.parse(X0)
    good = GuardSpec(GuardKind.SHAPE, None, (f"{X0} >= 2", (xs,), ("int",)), 0)
    assert tw.GuardSet([good]).check({"x": T(4)})
    # A list where a tuple is expected is accepted (a spec made by hand), with the same meaning.
    listed = GuardSpec(GuardKind.SHAPE, None, [f"{X0} >= 2", [xs], ["int"]], 0)
    gs = tw.GuardSet([listed])
    assert gs.check({"x": T(4)}) and not gs.check({"x": T(1)})
    bad_args = [
        ((f"{X0} >= 2", (xs,)), tw.GuardBuildError),  # two fields
        ((f"{X0} >= 2", (xs,), ("complex",)), tw.GuardBuildError),  # not a symbol type
        ((f"{X0} >= 2", (xs,), (0,)), tw.GuardBuildError),  # a code, not a name
        ((f"{X0} >= 2", (xs,), ()), tw.GuardBuildError),  # one type per symbol
        ((f"{X0} >= 2", xs, ("int",)), TypeError),  # symbols not a sequence
        ((b"L['x'].size()[0] >= 2", (xs,), ("int",)), TypeError),  # text not a str
    ]
    for args, err in bad_args:
        with pytest.raises(err):
            tw.GuardSet([GuardSpec(GuardKind.SHAPE, None, args, 0)])

    class LyingIndex(int):  # an index that runs code when read is never read as an int
        def __index__(self) -> int:
            raise AssertionError("ran")

    with pytest.raises(TypeError, match="index is an int"):
        tw.GuardSet([GuardSpec(GuardKind.SHAPE, None, good.args, LyingIndex(0))])
    with pytest.raises((tw.GuardBuildError, ValueError)):
        tw.GuardSet([GuardSpec(GuardKind.SHAPE, None, good.args, -1)])


def test_shape_declarations_keep_the_specs_order_and_sharing() -> None:
    # SHAPE relations interleaved with other guards on the same sources: ids, order, why_not and a
    # save/load round trip are those of the specs, and a symbol that is also a guard's source is
    # one node.
    ex = {"x": T(8, 4), "n": 4}
    b = tw.GuardBuilder(ex)
    b.equals("L['n']")
    b.shape(f"{X0} % L['n'] == 0")
    b.equals(X0)
    b.shape("L['x'].size()[1] <= L['n']")
    b.shape(f"{X0} % L['n'] == 0")  # a duplicate: merged
    gs = b.build()
    assert [s.index for s in gs.guards] == [0, 1, 2, 3, 4]
    assert not gs.check({"x": T(8, 5), "n": 4})
    f = gs.why_not({"x": T(8, 5), "n": 4})
    assert f.kind == "SHAPE" and f.guard.index == 3
    assert "L['x'].size()[1] = 5" in f.reason and "L['n'] = 4" in f.reason
    assert "3 declared, 2 evaluated (1 merged as duplicates" in gs.explain()
    assert gs.node_count == 4  # L['n'], L['x'] and its two sizes: X0 is one node
    loaded = tw.GuardSet.from_bytes(gs.to_bytes())
    for f_locals in ({"x": T(8, 4), "n": 4}, {"x": T(8, 5), "n": 4}, {"x": T(6, 4), "n": 4}):
        assert loaded.check(f_locals) is gs.check(f_locals)


def test_builder_survives_collections_and_threads() -> None:
    # The builder's C++ declaration path borrows the spec tuples; a collection (finalizers that
    # build other sets) and other threads building sets from the same relation objects never change
    # what a set decides.

    rels = [tw.shapes.parse(f"{X0} % {k} == 0") for k in (1, 2, 4)] + [tw.shapes.parse(f"{X0} >= 2")]

    class Finalizer:
        def __del__(self) -> None:
            bb = tw.GuardBuilder({"x": T(8)})
            for r in rels:
                bb.shape(r)
            bb.build()

    errors: list[BaseException] = []

    def build_many() -> None:
        try:
            for _ in range(scaled(40, 5)):
                b = tw.GuardBuilder({"x": T(8)})
                for r in rels:
                    b.shape(r)
                    Finalizer()  # a cycle-free object: its finalizer runs at once
                gs = b.build()
                assert gs.check({"x": T(16)}) and not gs.check({"x": T(6)})
        except BaseException as e:  # reported below
            errors.append(e)

    old = gc.get_threshold()
    gc.set_threshold(1)
    try:
        threads = [threading.Thread(target=build_many) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gc.set_threshold(*old)
    assert not errors, errors


def _empty_every_memo() -> None:
    """The parse memos of relations and sources emptied (builder.clear_build_memos): the next build
    reads every text again, as a process seeing these texts the first time does."""
    tw.builder.clear_build_memos()


_COLD_TEXTS = [
    "((L['x'].size()[1]*L['x'].size()[0]) % 4) == 0  # z = x.reshape(-1, 4)",
    "(L['x'].shape[0] // 2) <= L['y'].size(0)",  # spelled otherwise: the canonical text differs
    "2 <= L['x'].size()[0] and L['x'].size()[0] <= 1024",  # split into two relations
    "not math.isnan(L['s'])",
    "L['x'].stride()[0] == L['x'].size()[1]",
    "Eq(Mod(L['n'], 4), 1)",
]


def _cold_or_warm_set(ex: dict) -> tw.GuardSet:
    b = tw.GuardBuilder(ex)
    for text in _COLD_TEXTS:
        for rel in tw.shapes.relations_from_torch(text):
            b.shape(rel)
    return b.build()


def test_cold_and_warm_builds_give_the_same_guards_and_reasons() -> None:
    torch = pytest.importorskip("torch")  # torch is 3.11-only on this machine

    ex = {"x": torch.zeros(8, 3), "y": torch.zeros(10), "s": 0.5, "n": 5}
    _empty_every_memo()
    cold = _cold_or_warm_set(ex)
    warm = _cold_or_warm_set(ex)
    assert [(g.kind, g.args[0], tuple(map(str, g.args[1])), g.args[2]) for g in cold.guards] == [
        (g.kind, g.args[0], tuple(map(str, g.args[1])), g.args[2]) for g in warm.guards
    ]
    assert [g.args[1] for g in cold.guards] == [g.args[1] for g in warm.guards]  # equal Sources
    assert cold.explain() == warm.explain()
    for bad in ({"x": torch.zeros(9, 3)}, {"y": torch.zeros(2)}, {"s": math.nan}, {"n": 6}, {"s": 1}):
        frame = {**ex, **bad}
        assert cold.check(frame) is False and warm.check(frame) is False
        assert [f.reason for f in cold.failures(frame)] == [f.reason for f in warm.failures(frame)]
        assert all(f.kind == "SHAPE" for f in cold.failures(frame))
    assert cold.check(ex) and warm.check(ex)


@pytest.mark.parametrize(
    "text,offset,fragment",
    [
        ("L['x'].if > 1", 0, "invalid syntax"),  # not a plain form: Python's parser says why
        ("L['x'].size()[01] > 1", 0, "cannot parse source"),
        ("L['x'].__closure__ > 1", 0, "must be indexed"),
    ],
)
def test_malformed_symbols_give_the_same_error_cold(text: str, offset: int, fragment: str) -> None:
    _empty_every_memo()
    for _ in range(2):  # cold, then with the memos filled by the successful parts
        with pytest.raises(tw.ShapeSyntaxError) as info:
            tw.shapes.parse(text)
        assert info.value.offset == offset and fragment in info.value.message, info.value


@pytest.mark.parametrize(
    "text,count",
    [
        ("And(L['x'] > 1, L['y'] > 2)and(L['z'] > 3)  # c", 2),  # 'And(' alone: _conjuncts splits it
        ("(L['x'] > 1)and(L['z'] > 3)", 1),  # neither ' and ' nor 'And(': not split, as before
        ("And(L['x'] > 1, L['y'] > 2)", 1),  # a call, not a BoolOp
        ("L['x'] > 1 and L['z'] > 3", 2),
    ],
)
def test_relations_from_torch_splits_top_level_conjunctions(text: str, count: int) -> None:
    rels = tw.shapes.relations_from_torch(text)
    assert len(rels) == count
    assert all(r.comment == tw.shapes.parse(text).comment for r in rels)
    if count == 1:
        assert rels == [tw.shapes.parse(text)]


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.sampled_from(["", ".", "..", "a", "tripwire", "demo.py", "b.py", "é", "\udc80", "<frozen x>"]),
        max_size=5,
    ),
    st.sampled_from(["package", "/tmp", "relative", "<frozen "]),
)
def test_stack_walk_answers_machinery_as_is_machinery(parts: list, base: str) -> None:
    """The stack walk (install_site.cpp) asks builder._is_machinery, the one definition: a frame of
    code compiled under any filename (frozen, relative, not normal, not encodable) is left out
    exactly when _is_machinery says it is machinery."""
    import functools

    from tripwire import _package, builder

    head = {"package": _package._PKG_DIR, "relative": ""}.get(base, base)
    filename = "/".join([head, *parts]) if head else "/".join(parts)
    ns: dict = {}
    exec(compile("def inner(walk):\n    return walk()\n", filename, "exec"), ns)
    stack = ns["inner"](functools.partial(_core.user_stack, builder._is_machinery, 2))
    shown = stack[-1].startswith(f"{filename}:2 in inner")
    assert shown == (not builder._is_machinery(filename)), (filename, stack)


def test_shape_spec_is_an_ordinary_spec() -> None:
    """GuardBuilder.shape's spec is a GuardSpec like any other, its fields in __init__'s order,
    frozen, indexed in declaration order, its install site the caller's (the same as user_stack
    gives the line below it)."""

    b = tw.GuardBuilder({"x": T(8, 4), "n": 4})
    first = b.shape("L['x'].size()[0] > L['n']")
    second = b.shape("L['n'] >= 1")
    want_site = f"{__file__}:{sys._getframe().f_lineno - 1} in test_shape_spec_is_an_ordinary_spec"
    assert type(first) is tw.GuardSpec and type(second) is tw.GuardSpec
    assert list(vars(first)) == ["kind", "source", "args", "index", "stack"]
    assert (first.kind, first.source, first.index, second.index) == (tw.GuardKind.SHAPE, None, 0, 1)
    assert first.args == ("L['x'].size()[0] > L['n']", first.args[1], ("int", "int"))
    assert [str(s) for s in first.args[1]] == ["L['x'].size()[0]", "L['n']"]
    assert second.stack[-1] == want_site
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.index = 5  # type: ignore[misc]
    assert b.guards == [first, second]


def test_shape_index_is_taken_before_the_call_and_given_back_on_refusal() -> None:
    """GuardBuilder.shape takes its index before the C++ call (which makes the spec with it): a
    guard declared while the relation's symbols are read (user code) takes the next one, so no
    two guards share an index; a refused relation gives its index back when nothing took one
    since, so indices stay dense across refusals."""
    b = tw.GuardBuilder({"x": T(8, 4), "n": 4})

    class Declaring(T):
        def size(self) -> tuple:
            b.shape("L['n'] >= 1")  # declared in the middle of the outer declaration
            return super().size()

    b.f_locals["d"] = Declaring(5)
    outer = b.shape("L['d'].size()[0] == 5")
    inner = [s for s in b.guards if s is not outer]
    assert len(inner) == 1 and (outer.index, inner[0].index) == (0, 1)
    with pytest.raises(tw.GuardBuildError):
        b.shape("L['n'] > 100")
    with pytest.raises(tw.GuardBuildError):
        b.shape("L['missing'] > 1")
    after = b.shape("L['n'] == 4")
    assert after.index == 2
    # A refusal after a nested declaration took an index: the refused one stays a gap.
    b.f_locals["e"] = Declaring(3)
    with pytest.raises(tw.GuardBuildError):
        b.shape("L['e'].size()[0] == 5")
    last = b.shape("L['n'] == 4")
    indices = [s.index for s in b.guards]
    assert len(set(indices)) == len(indices) and last.index == max(indices)
    gs = b.build()
    assert [s.index for s in gs.guards] == sorted(indices)


# -- relations_from_torch: a new list per call ------------------------------------------------------
def test_relations_from_torch_gives_a_new_list_each_call() -> None:
    text = "L['x'].size()[1] * 4 == L['w'].stride()[0]  # c"
    first = tw.shapes.relations_from_torch(text)
    first.append("mutated")  # the caller's list
    again = tw.shapes.relations_from_torch(text)
    assert again == first[:1] and again[0] is first[0] and type(again) is list  # the parse memo's

    class S(str):
        pass

    for part in (S(text), tw.shapes.parse(text)):
        rels = tw.shapes.relations_from_torch(part)
        assert type(rels) is list and rels == again
    with pytest.raises(tw.ShapeSyntaxError):
        tw.shapes.relations_from_torch("L['x'].size()[0] +")


def test_the_timing_hook_refuses_a_value_that_does_not_store() -> None:
    # A frame's registers are uninitialised until stored: bench/shape_eval.py's testing.shape_time must
    # not run the program on a symbol it could not store (a bool is not the int it claims to be).
    ns, result, kept, n_symbols, _ops = _core.testing.shape_time(["L['a'] % 4 == 0"], {"L['a']": 8}, 10)
    assert (result, kept, n_symbols) == (-1, 1, 1) and ns >= 0
    assert _core.testing.shape_time(["L['a'] % 4 == 0"], {"L['a']": 7}, 10)[1] == 0
    with pytest.raises(TypeError, match="symbol 0 is not of its declared type"):
        _core.testing.shape_time(["L['a'] % 4 == 0"], {"L['a']": True}, 10)

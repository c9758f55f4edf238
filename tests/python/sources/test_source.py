"""Sources: Dynamo-style printing, parsing, and the round trip ``Source.parse(str(s)) == s``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tripwire as tw
from gc_stress import examples
from strategies import sources, steps
from tripwire.source import RootKind, Source, SourceParseError, Step, StepKind

L = Source.local


# -- every step kind and root, printed exactly as Dynamo prints it --------------------------------
PRINTED = [
    (L("x"), "L['x']"),
    (Source.global_("torch"), "G['torch']"),
    (Source.closure("cfg"), "C['cfg']"),
    (L("self").attr("layers").item(0).attr("weight"), "L['self'].layers[0].weight"),
    (Source.global_("torch").attr("nn"), "G['torch'].nn"),
    (L("f").step(StepKind.CLOSURE_CELL, 0), "L['f'].__closure__[0].cell_contents"),
    (L("d").step(StepKind.DICT_KEY, 1), "list(dict.keys(L['d']))[1]"),
    (L("d").step(StepKind.DICT_VALUE, 1), "L['d'][list(dict.keys(L['d']))[1]]"),
    (L("d").dict_item("k"), "dict.__getitem__(L['d'], 'k')"),
    (L("x").type(), "type(L['x'])"),
    (L("fn").step(StepKind.DEFAULTS, 0), "L['fn'].__defaults__[0]"),
    (L("fn").step(StepKind.KWDEFAULTS, "k"), "L['fn'].__kwdefaults__['k']"),
    (L("r").step(StepKind.WEAKREF_CALL), "L['r']()"),
    (L("o").step(StepKind.DICT), "L['o'].__dict__"),
    (L("fn").step(StepKind.CODE), "L['fn'].__code__"),
    (L("x").type().type_dict(), "dict(type(L['x']).__dict__)"),
    (L("x").type().type_mro(), "type(L['x']).__mro__"),
    (
        L("m").type().type_mro().item(1).type_dict().dict_item("forward").step(StepKind.DEFAULTS, 0),
        "dict.__getitem__(dict(type(L['m']).__mro__[1].__dict__), 'forward').__defaults__[0]",
    ),
    (L("c").attr("__mro__"), "getattr(L['c'], '__mro__')"),
    (L("xs").item(-1), "L['xs'][-1]"),
    (L("d").item(b"k"), "L['d'][b'k']"),
    (L("d").item(None), "L['d'][None]"),
    (L("d").item(True), "L['d'][True]"),
    (L("d").item(1.5), "L['d'][1.5]"),
    (L("d").item(-0.0), "L['d'][-0.0]"),
    (L("d").item("it's"), "L['d'][\"it's\"]"),
    (L("o").attr("not an identifier"), "getattr(L['o'], 'not an identifier')"),
    (L("o").attr("class"), "getattr(L['o'], 'class')"),  # a keyword
    (L("o").attr("__dict__"), "getattr(L['o'], '__dict__')"),  # not the DICT step
    (L("o").attr("__code__"), "getattr(L['o'], '__code__')"),  # not the CODE step
    (
        L("o").attr("__closure__").item(0).attr("cell_contents"),
        "getattr(L['o'], '__closure__')[0].cell_contents",
    ),
    (L("o").attr("__defaults__").item(0), "getattr(L['o'], '__defaults__')[0]"),
    (L("o").attr("__kwdefaults__").item("k"), "getattr(L['o'], '__kwdefaults__')['k']"),
    (L("o").attr("__len__"), "L['o'].__len__"),
    (L("o").attr("\U0001d54a"), "getattr(L['o'], '\U0001d54a')"),  # NFKC-normalises to 'S' as X.name
    (L("o").attr("\u00e9t\u00e9"), "L['o'].\u00e9t\u00e9"),  # a normalised non-ASCII name prints plainly
    (L("weird name"), "L['weird name']"),
    (L(""), "L['']"),
    (
        L("self").attr("m").step(StepKind.DICT).dict_item("_buffers").step(StepKind.DICT_VALUE, 2).type(),
        "type(dict.__getitem__(L['self'].m.__dict__, '_buffers')[list(dict.keys(dict.__getitem__(L['self'].m.__dict__, '_buffers')))[2]])",
    ),
    (
        L("f").step(StepKind.CODE).attr("co_consts").item(0),
        "L['f'].__code__.co_consts[0]",
    ),
    (
        L("mods").item(0).step(StepKind.WEAKREF_CALL).attr("training"),
        "L['mods'][0]().training",
    ),
    # Tensor and array properties, as Dynamo's TensorPropertySource prints them.
    (L("x").step(StepKind.SIZE, 0), "L['x'].size()[0]"),
    (L("x").step(StepKind.STRIDE, 1), "L['x'].stride()[1]"),
    (L("x").step(StepKind.STORAGE_OFFSET), "L['x'].storage_offset()"),
    (L("self").attr("w").step(StepKind.SIZE, 2), "L['self'].w.size()[2]"),
    # The method called by hand is not the property step.
    (L("x").attr("size").step(StepKind.WEAKREF_CALL).item(0), "getattr(L['x'], 'size')()[0]"),
    (L("x").attr("storage_offset").step(StepKind.WEAKREF_CALL), "getattr(L['x'], 'storage_offset')()"),
    (L("x").attr("shape").item(0), "L['x'].shape[0]"),  # an attribute outside shape relations
]


@pytest.mark.parametrize("source,text", PRINTED, ids=[t for _, t in PRINTED])
def test_printed_form_and_round_trip(source: Source, text: str) -> None:
    assert str(source) == text
    assert Source.parse(text) == source
    assert Source.parse(str(source)) == source
    assert hash(Source.parse(text)) == hash(source)
    assert repr(source) == f"Source({text!r})"


# The C++ tensor steps print as torch prints TensorPropertySource / GradSource, which is also how
# SIZE, STRIDE, STORAGE_OFFSET and the attribute ``grad`` print: parse() reads the text as those
# (the Python-level steps); the C++ steps are built with Source.tensor_size(), ..., grad().
PRINTED_ONE_WAY = [
    (L("x").tensor_size(0), "L['x'].size()[0]", L("x").step(StepKind.SIZE, 0)),
    (L("x").tensor_stride(1), "L['x'].stride()[1]", L("x").step(StepKind.STRIDE, 1)),
    (L("x").tensor_storage_offset(), "L['x'].storage_offset()", L("x").step(StepKind.STORAGE_OFFSET)),
    (L("p").grad(), "L['p'].grad", L("p").attr("grad")),
    (L("p").grad().tensor_size(1), "L['p'].grad.size()[1]", L("p").attr("grad").step(StepKind.SIZE, 1)),
]


@pytest.mark.parametrize("source,text,parsed", PRINTED_ONE_WAY, ids=[t for _, t, _ in PRINTED_ONE_WAY])
def test_cpp_tensor_steps_print_as_torch_and_parse_as_python_steps(
    source: Source, text: str, parsed: Source
) -> None:
    assert str(source) == text
    assert source.reads_cpp_tensor and not parsed.reads_cpp_tensor
    assert Source.parse(text) == parsed != source


def test_every_step_kind_and_root_is_covered() -> None:
    kinds = {s.kind for src, _ in PRINTED for s in src.steps} | {
        s.kind for src, _, _ in PRINTED_ONE_WAY for s in src.steps
    }
    assert kinds == set(StepKind)
    assert {src.root for src, _ in PRINTED} == set(RootKind)


@pytest.mark.parametrize(
    "alternative,canonical",
    [
        ("getattr(L['x'], 'a')", "L['x'].a"),
        ("L[ 'x' ] . a [ 0 ]", "L['x'].a[0]"),
        ('L["x"]', "L['x']"),
        ("  L['x']  ", "L['x']"),
        ("L['x'][0x10]", "L['x'][16]"),
        ("L['x'].size(0)", "L['x'].size()[0]"),
        ("L['x'].stride(2)", "L['x'].stride()[2]"),
        ("L['x'] . size ( ) [ 1 ]", "L['x'].size()[1]"),
    ],
)
def test_alternative_spellings_parse_to_the_canonical_source(alternative: str, canonical: str) -> None:
    assert str(Source.parse(alternative)) == canonical


def test_shape_is_size_only_in_shape_relations() -> None:
    assert Source.parse("L['x'].shape[1]").steps == (Step(StepKind.ATTR, "shape"), Step(StepKind.ITEM, 1))
    assert str(Source.parse("L['x'].shape[1]", shape_is_size=True)) == "L['x'].size()[1]"
    with pytest.raises(SourceParseError):
        Source.parse("L['x'].size()[-1]")  # dimensions are non-negative, as Dynamo prints them


def test_parse_accepts_a_source_and_rejects_other_types() -> None:
    s = L("x").attr("a")
    assert Source.parse(s) is s
    with pytest.raises(TypeError):
        Source.parse(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "x",
        "L",
        "L[0]",  # root names are str
        "Q['x']",
        "L['x'",
        "L['x'];",
        "L['x'] + 1",
        "L['x'][1:2]",
        "L['x']['a', 'b']",
        "L['x'][[1]]",
        "L['x'][y]",
        "L['x'][nan]",
        "L['x'][1e999]",  # inf does not print back as a literal
        "L['x'][-1e999]",
        "L['x'].__defaults__",
        "L['x'].__kwdefaults__",
        "L['x'].__closure__",
        "L['x'].__closure__[0]",
        "L['x'].__defaults__['a']",
        "L['x'].__defaults__[-1]",
        "L['x'].__defaults__[True]",
        "L['x'].__kwdefaults__[0]",
        "L['x'].__closure__[-1].cell_contents",
        "list(dict.keys(L['x']))[-1]",
        "list(dict.keys(L['x']))['a']",
        "L['d'][list(dict.keys(L['e']))[1]]",
        "dict.__getitem__(L['d'])",
        "dict.__getitem__(L['d'], 'k', 'j')",
        "dict.__getitem__(L['d'], x)",
        "type(L['x'], L['y'])",
        "type(L['x'], x=1)",
        "getattr(L['x'], 1)",
        "getattr(L['x'], '')",
        "getattr(L['x'])",
        "f(L['x'])",
        "L['x'](1)",
        "L['x'](k=1)",
        "(lambda: L['x'])()",
        "L['x'] if L['y'] else L['z']",
        "[L['x']]",
        "L['x'].a.__closure__[0].cell_contents.b()()[1j]",
        "import os",
        "L['x'] = 1",
    ],
)
def test_malformed_strings_raise_source_parse_error(text: str) -> None:
    with pytest.raises(SourceParseError):
        Source.parse(text)
    assert issubclass(SourceParseError, ValueError)
    assert tw.SourceParseError is SourceParseError


def test_builder_rejects_a_malformed_source() -> None:
    b = tw.GuardBuilder({"x": 1})
    with pytest.raises(SourceParseError):
        b.type_match("L['x'")


@pytest.mark.parametrize(
    "bad",
    [
        lambda: Step(StepKind.ATTR, ""),
        lambda: Step(StepKind.ATTR, 1),
        lambda: Step(StepKind.ITEM, [1]),
        lambda: Step(StepKind.ITEM, (1, 2)),
        lambda: Step(StepKind.ITEM, float("nan")),
        lambda: Step(StepKind.ITEM, float("inf")),
        lambda: Step(StepKind.DICT_ITEM, object()),
        lambda: Step(StepKind.DEFAULTS, -1),
        lambda: Step(StepKind.DEFAULTS, True),
        lambda: Step(StepKind.DEFAULTS, "0"),
        lambda: Step(StepKind.KWDEFAULTS, 0),
        lambda: Step(StepKind.TYPE, "x"),
        lambda: Step(StepKind.DICT_KEY, None),
        lambda: Source(RootKind.LOCAL, 0),
        lambda: Source(7, "x"),
    ],
)
def test_invalid_steps_are_rejected_at_construction(bad) -> None:
    with pytest.raises(ValueError):
        bad()


def test_keys_of_different_types_are_different_steps() -> None:
    # d[1], d[True] and d[1.0] may differ for a custom __getitem__; they print differently too.
    one, true, fone = L("d").item(1), L("d").item(True), L("d").item(1.0)
    assert len({one, true, fone}) == 3
    assert one != true and one != fone and true != fone
    assert Source.parse("L['d'][True]") == true
    assert Source.parse("L['d'][1]") != true
    assert L("d").item(-0.0) == L("d").item(-0.0)


def test_parent_and_prefixes() -> None:
    s = Source.parse("L['a'].b[0]")
    assert s.parent == Source.parse("L['a'].b")
    assert L("a").parent is None
    assert [str(p) for p in s.prefixes()] == ["L['a']", "L['a'].b", "L['a'].b[0]"]


@settings(max_examples=examples(400), deadline=None)
@given(sources())
def test_round_trip_generated_sources(s: Source) -> None:
    text = str(s)
    parsed = Source.parse(text)
    assert parsed == s
    assert hash(parsed) == hash(s)
    assert str(parsed) == text


@settings(max_examples=examples(200), deadline=None)
@given(sources(max_steps=3), sources(max_steps=3))
def test_distinct_sources_print_differently(a: Source, b: Source) -> None:
    if a != b:
        assert str(a) != str(b)
    else:
        assert str(a) == str(b) or a.steps  # equal sources: only -0.0/0.0 keys print apart


@settings(max_examples=examples(200), deadline=None)
@given(st.text(max_size=30))
def test_parse_of_arbitrary_text_returns_a_source_or_raises_source_parse_error(text: str) -> None:
    try:
        s = Source.parse(text)
    except SourceParseError:
        return
    assert Source.parse(str(s)) == s


@settings(max_examples=examples(200), deadline=None)
@given(sources(max_steps=4), st.integers(min_value=0, max_value=200))
def test_truncated_printed_sources_never_raise_anything_else(s: Source, cut: int) -> None:
    text = str(s)[:cut]
    try:
        parsed = Source.parse(text)
    except SourceParseError:
        return
    assert Source.parse(str(parsed)) == parsed


@given(steps())
@settings(max_examples=examples(100), deadline=None)
def test_steps_render_on_any_base(step: Step) -> None:
    s = Source(RootKind.GLOBAL, "g", (step,))
    assert Source.parse(str(s)).steps == (step,)


# -- the plain-form reader (source._parse_plain) agrees with Python's parser -----------------------
# Pieces of printed sources, plain and not: concatenations of them exercise the reader's grammar
# edges (blanks, other quotes, escapes, leading zeros, keywords, dunders, calls, long ints).
_PIECES = [
    "L['x']", "G['g']", "C['c']", "L['']", "L[\"x\"]", "L['a b']", "L['\\n']", "L['é']", "X['x']",
    ".size()[0]", ".size()[12]", ".size()[01]", ".size(1)", ".size()", ".size", ".stride()[3]",
    ".stride(0)", ".storage_offset()", ".storage_offset", ".shape[2]", ".shape", ".shape['k']",
    ".a", "._b1", ".if", ".True", ".__dict__", ".__code__", ".__closure__[0].cell_contents",
    ".match", "['k']", "[0]", "[00]", "[-1]", "[True]", "[None]", "[1.5]", "[ 0]", " .a", ".a ",
    "[123456789012345678]", "[1234567890123456789]", "()", "[b'k']", ".__defaults__[0]",
    "['it\\'s']", "['a]']", "['[']", " ", "\t",
]  # fmt: skip


@settings(max_examples=examples(600), deadline=None)
@given(st.lists(st.sampled_from(_PIECES), min_size=1, max_size=6), st.booleans())
def test_plain_reader_agrees_with_python_parser(pieces: list[str], shape_is_size: bool) -> None:
    from tripwire.source import _parse_ast, _parse_plain

    text = "".join(pieces)
    plain = _parse_plain(text, shape_is_size)
    try:
        full: Source | None = _parse_ast(text, shape_is_size)
    except SourceParseError:
        full = None
    if plain is None:
        return  # not a plain form: Source.parse asks Python's parser (full)
    assert full is not None, text
    assert plain == full and hash(plain) == hash(full), text
    assert str(plain) == str(full)
    assert str(plain) == plain._print()  # the print the reader may cache without printing
    assert [(s.kind, type(s.arg), s.arg) for s in plain.steps] == [
        (s.kind, type(s.arg), s.arg) for s in full.steps
    ]


_PLAIN_ROOTS = ["L['x']", "G['g']", "C['c']", "L['']", "L['a b']", "L['[]']", "L['#']"]
_PLAIN_STEPS = [
    ".size()[0]", ".size()[12]", ".size(1)", ".stride()[3]", ".stride(0)", ".storage_offset()", ".shape[2]",
    ".shape", ".shape['k']", ".shape[x]", ".a", "._b1", ".match", ".type", ".size", ".stride",
    ".storage_offset", "['k']", "[0]", "[7]", "['a]']", "['[']", "['']", "[123456789012345678]", "['\"']",
]  # fmt: skip


@settings(max_examples=examples(600), deadline=None)
@given(st.sampled_from(_PLAIN_ROOTS), st.lists(st.sampled_from(_PLAIN_STEPS), max_size=5), st.booleans())
def test_plain_reader_agrees_on_mostly_plain_text(root: str, steps: list[str], shape_is_size: bool) -> None:
    from tripwire.source import _parse_ast, _parse_plain

    text = root + "".join(steps)
    plain = _parse_plain(text, shape_is_size)
    try:
        full: Source | None = _parse_ast(text, shape_is_size)
    except SourceParseError:
        full = None
    if plain is not None:
        assert plain == full and str(plain) == str(full) == plain._print(), text
        assert [type(s.arg) for s in plain.steps] == [type(s.arg) for s in full.steps]


@settings(max_examples=examples(300), deadline=None)
@given(sources(max_steps=4), st.booleans())
def test_plain_reader_reads_generated_sources_as_python_does(s: Source, shape_is_size: bool) -> None:
    from tripwire.source import _parse_ast, _parse_plain

    text = str(s)
    plain = _parse_plain(text, shape_is_size)
    if plain is not None:
        assert plain == _parse_ast(text, shape_is_size)


def test_plain_reader_covers_what_torch_prints() -> None:
    from tripwire.source import _parse_plain

    for text in ["L['x'].size()[0]", "L['x'].stride()[1]", "L['x'].storage_offset()", "L['n']",
                 "L['self'].cfg.k", "L['x'].shape[0]", "G['t'].w.size()[2]", "L['d']['k'][3]"]:  # fmt: skip
        assert _parse_plain(text, True) is not None, text


@settings(max_examples=examples(300), deadline=None)
@given(sources(max_steps=5))
def test_printed_prefixes_are_the_prefixes_printed(s: Source) -> None:
    assert s.printed_prefixes() == [str(p) for p in s.prefixes()]


def test_printed_prefixes_of_a_property_method_call() -> None:
    s = L("x").attr("size").step(StepKind.WEAKREF_CALL).item(0)
    assert str(s) == "getattr(L['x'], 'size')()[0]"
    assert s.printed_prefixes() == ["L['x']", "L['x'].size", "getattr(L['x'], 'size')()", str(s)]


def test_a_pickled_source_hashes_as_the_loading_process_does() -> None:
    # The hash is cached on the object and seeded per process: a pickle must not carry it, or a
    # source loaded in another process would miss itself in every dict and set there.
    import pickle
    import subprocess
    import sys

    s = Source.parse("L['x'].cfg.size()[0]")
    hash(s), str(s)
    assert "_hash" not in pickle.loads(pickle.dumps(s)).__dict__
    code = (
        "import pickle, sys; from tripwire.source import Source; "
        "s = pickle.loads(sys.stdin.buffer.read()); t = Source.parse(\"L['x'].cfg.size()[0]\"); "
        "print(hash(s) == hash(t) and s in {t} and str(s) == str(t))"
    )
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            input=pickle.dumps(s),
            capture_output=True,
            env={**__import__("os").environ, "PYTHONHASHSEED": seed},
            check=True,
        )
        assert out.stdout.strip() == b"True", out


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("x", "did you mean L['x']?"),
        ("L[x]", "did you mean L['x']?"),
        ("G[cfg].mode", "did you mean G['cfg']?"),
        ("self.w[0]", "did you mean L['self'].w[0]?"),
        ("x + 1", "a source is L['name'], G['name'] or C['name']"),
        ("L['x'] + 1", "unsupported expression `L['x'] + 1`"),
    ],
)
def test_parse_errors_say_what_is_expected_without_an_ast_dump(text, hint):
    with pytest.raises(SourceParseError) as ei:
        Source.parse(text)
    msg = str(ei.value)
    assert hint in msg, msg
    assert "ctx=" not in msg and "BinOp(" not in msg and "Name(id=" not in msg

"""Hostile bytes and text: every load is refused with its documented error or loads, and is
linear in its input.

* ``GuardSet.from_bytes`` raises FormatError and nothing else, on single-byte mutations of real
  documents (hash recomputed so that they reach the decoder, or not) and on strings that are not
  UTF-8 wherever a string is named;
* a document naming one long string over and over is refused before the copies;
* the hostile documents of hostile_docs.py (bench/hostile_load.py times them per MB) load or are
  refused with FormatError;
* relation texts: a lone surrogate is a ShapeSyntaxError (not nanobind's TypeError), a literal
  over the 65,536-bit limit is refused before it is converted.

Timings are bench/hostile_load.py's; nothing here is timed.
"""

from __future__ import annotations

import hashlib
import random
import re
import struct
import sys
import types

import pytest

import hostile_docs as hd
import serial_fixtures as fx
import tripwire as tw
from tripwire import shapes
from tripwire.source import SourceParseError
from tripwire.store import ReferenceCodec, decode_entry, encode_entry


def rewrap(body: bytes) -> bytes:
    head = b"\x89TWG\r\n\x1a\n" + struct.pack("<HH16sI", 1, 0, b"test", len(body))
    return head + hashlib.sha256(body).digest() + body


def _shape_seed() -> bytes:
    b = tw.GuardBuilder({"a": 3, "b": 4})
    b.shape("L['a'] * 2 < L['b'] + 7  # a comment")
    b.shape("Eq(Mod(L['b'], 2), 0)")
    b.global_state("recursion_limit", name="limit")
    return b.build().to_bytes()


SEEDS = [tw.guards_for(f, fx.__dict__).to_bytes() for f in fx.frames()] + [_shape_seed()]


def loads_or_format_error(data: bytes) -> tw.GuardSet | None:
    """from_bytes, or None when it raised FormatError; any other exception fails the test. A set
    that loads is usable: check and explain run."""
    try:
        gs = tw.GuardSet.from_bytes(data)
    except tw.FormatError as e:
        assert isinstance(e, ValueError)
        assert e.offset is None or 0 <= e.offset <= len(data), (e.offset, len(data))
        return None
    gs.check({})
    gs.explain()
    return gs


def strings_section(body: bytes) -> list[tuple[int, int]]:
    """(offset in the body, length) of each string of the strings section (docs/format.md)."""

    def varint(at: int) -> tuple[int, int]:
        v = shift = 0
        while True:
            b = body[at]
            at += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return v, at

    assert body[2] == 1
    _length, at = varint(3)
    count, at = varint(at)
    out = []
    for _ in range(count):
        n, at = varint(at)
        out.append((at, n))
        at += n
    return out


# -- item 6: only FormatError ------------------------------------------------------------------------


def test_single_byte_mutations_raise_only_format_error() -> None:
    """A sweep like the review's: single-byte mutations of every seed (several values at every
    position; bodies with the hash recomputed so that they reach the decoder, headers as they are),
    about 9,000 documents. Each is refused with FormatError or loads a usable set."""
    rng = random.Random(25)
    outcomes = {"loaded": 0, "refused": 0}
    for blob in SEEDS:
        body = blob[64:]
        for i in range(len(body)):
            for value in {0xFF, 0xCA, body[i] ^ 0x80, rng.randrange(256)} - {body[i]}:
                gs = loads_or_format_error(rewrap(body[:i] + bytes([value]) + body[i + 1 :]))
                outcomes["loaded" if gs is not None else "refused"] += 1
        for i in range(64):
            for value in (0xFF, 0xCA, 0x02, 0x00):
                if blob[i] != value:  # only the version field (its padding is not read) may load
                    gs = loads_or_format_error(blob[:i] + bytes([value]) + blob[i + 1 :])
                    assert gs is None or 12 <= i < 28, (i, value)
    assert outcomes["refused"] > 5000 and outcomes["loaded"] > 100, outcomes


def test_a_header_of_another_version_with_a_stray_byte_in_its_writer() -> None:
    """The review's UnicodeDecodeError ('utf-8' codec can't decode byte 0xca): the version message
    quoted the writer field before it was checked. The field is checked first."""
    blob = bytearray(SEEDS[0])
    blob[8] = 2
    blob[14] = 0xCA
    with pytest.raises(tw.FormatError, match=r"not printable ASCII \(at byte 12\)") as e:
        tw.GuardSet.from_bytes(bytes(blob))
    assert e.value.offset == 12
    blob[14] = ord("x")
    with pytest.raises(tw.FormatError, match=r"format version 2 \(written by tripwire 0.x.0\)"):
        tw.GuardSet.from_bytes(bytes(blob))


@pytest.mark.parametrize("bad", [b"\xff", b"\xca", b"\xed\xa0", b"\xc0\x80", b"\xf4\x90\x80\x80"])
def test_every_string_that_is_not_utf8_is_a_format_error_at_its_offset(bad: bytes) -> None:
    """Every string a document names (constants, reference names, source texts, relation texts,
    labels, install sites) is in its strings section, validated as UTF-8 by the decoder. Each
    string of each seed, with its first bytes replaced by a sequence that is not UTF-8 (a stray
    continuation or lead byte, a truncated sequence, an overlong form, a code point over
    U+10FFFF), is refused with FormatError naming that string's offset."""
    kinds = set()
    for blob in SEEDS:
        body = blob[64:]
        for k, (at, n) in enumerate(strings_section(body)):
            if n < len(bad):
                continue
            kinds.add(body[at : at + n][:3])
            mutated = body[:at] + bad + body[at + len(bad) :]
            with pytest.raises(tw.FormatError, match=f"string {k} is not valid UTF-8") as e:
                tw.GuardSet.from_bytes(rewrap(mutated))
            assert e.value.offset == 64 + at - 1 - (n >= 128), (k, e.value.offset)
    # Names, texts, relations, labels and sites were all among them.
    assert {b"L['", b"bui", b"lim", b"Eq("} <= kinds, kinds


# -- linear loads ---------------------------------------------------------------------------------------


def test_a_string_named_over_and_over_is_refused() -> None:
    data = hd.named_over_and_over(200_000)
    with pytest.raises(tw.FormatError, match="names its strings for more than 64 bytes per byte"):
        tw.GuardSet.from_bytes(data)


def test_a_relation_named_over_and_over_is_refused() -> None:
    data = hd.shape_text_named_over_and_over(200_000)
    with pytest.raises(tw.FormatError, match="SHAPE relation texts add up to more than 2 bytes per byte"):
        tw.GuardSet.from_bytes(data)


def test_an_honest_deep_chain_is_within_the_string_budget() -> None:
    """The most an honest set names per byte: chains of 63 attributes, guarded at every prefix
    (18 bytes of strings per byte of body), loads."""
    frame = {}
    b_sources = []
    for c in range(8):
        root = o = types.SimpleNamespace()
        src = f"L['x{c}']"
        for i in range(63):
            name = f"n{i:02d}" + "a" * 17
            setattr(o, name, types.SimpleNamespace())
            o = getattr(o, name)
            src += "." + name
            b_sources.append(src)
        frame[f"x{c}"] = root
    b = tw.GuardBuilder(frame)
    for s in b_sources:
        b.not_none(s)
    gs = tw.GuardSet.from_bytes(b.build().to_bytes())
    assert gs.check(frame) and len(gs.guards) == len(b_sources)


@pytest.mark.parametrize("name", sorted(hd.DOCUMENTS))
def test_hostile_documents_load_or_are_refused(name: str) -> None:
    data = hd.DOCUMENTS[name](100_000)
    gs = loads_or_format_error(data)
    refused = {"named_over_and_over", "shape_text_named_over_and_over", "colliding_set"}
    assert (gs is None) == (name in refused), name


def test_a_store_entry_with_a_hostile_payload_is_a_format_error() -> None:
    """A reference payload nested past the recursion limit is a FormatError (json raised
    RecursionError, which the store's loader does not skip)."""
    entry = decode_entry(encode_entry(SEEDS[0], "reference", b"[" * 100_000))
    with pytest.raises(tw.FormatError, match="not a reference payload"):
        ReferenceCodec(["serial_fixtures"]).decode(entry.payload)


# -- relation texts ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "offset"),
    [("L['a'] < '\ud800'", 10), ("L['a\udcff'] < 3", 4), ("L['a'] < 3  # \udfff", 14), ("\ud800", 0)],
)
def test_a_lone_surrogate_in_a_relation_is_a_shape_syntax_error(text: str, offset: int) -> None:
    for parse in (shapes.parse, lambda t: tw.GuardBuilder({"a": 3}).shape(t), shapes.relations_from_torch):
        with pytest.raises(tw.ShapeSyntaxError, match=r"lone surrogate") as e:
            parse(text)
        assert e.value.offset == offset and e.value.text == text
        assert re.search(r"U\+D[89A-F][0-9A-F]{2}", e.value.message)


def test_a_lone_surrogate_in_the_builders_other_strings() -> None:
    """The other str arguments on the builder's path say what they are: a source (Python's parser
    reads UTF-8: a SourceParseError, as for any text that is not a source; it raised
    UnicodeEncodeError), a baseline's name (stored as text: refused when recorded, where to_bytes
    raised the binding's TypeError). A GLOBAL_STATE name is a label: NotSerializable at to_bytes
    (test_serialization)."""
    for src in ("L['a\ud800']", "L['a'].x\udcff", "L['d']['k\ud800']"):
        with pytest.raises(SourceParseError, match="surrogates not allowed"):
            tw.GuardBuilder({"a": 3, "d": {}}).equals(src)
        with pytest.raises(tw.ShapeSyntaxError, match="lone surrogate"):
            shapes.parse(src + " > 0")
    b = tw.GuardBuilder({"a": 3})
    with pytest.raises(tw.GuardBuildError, match="a name is text"):
        b.baseline("mode\ud800", 1)
    b.baseline("mode\u00e9", 1)
    b.equals("L['a']")
    assert tw.GuardSet.from_bytes(b.build().to_bytes()).baselines == {"mode\u00e9": 1}


@pytest.mark.parametrize("digits", [19_730, 200_000, 2_000_000])
def test_a_long_literal_is_refused_before_it_is_converted(digits: int) -> None:
    with pytest.raises(tw.ShapeSyntaxError, match="int literal over 65536 bits") as e:
        tw.GuardBuilder({"a": 3}).shape("L['a'] < " + "9" * digits)
    assert e.value.offset == 9


def test_the_largest_literal_converts_exactly() -> None:
    big = 2**65536 - 1
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # Python's own guard against quadratic int(str)
    try:
        text, over = str(big), str(big + 1)
    finally:
        sys.set_int_max_str_digits(limit)
    assert len(text) == 19_729 and len(over) == 19_729
    b = tw.GuardBuilder({"a": 3})
    b.shape(f"L['a'] < {text}")
    gs = b.build()
    assert gs.check({"a": 2**65535}) and not gs.check({"a": big})
    with pytest.raises(tw.ShapeSyntaxError, match="int literal over 65536 bits"):
        tw.GuardBuilder({"a": 3}).shape(f"L['a'] < {over}")


def test_many_symbols_parse_in_order() -> None:
    n = 3000
    frame = {f"a{i}": i for i in range(n)}
    rel = shapes.parse(" + ".join(f"L['a{i}']" for i in range(n)) + f" + L['a{n - 1}'] >= 0")
    assert [str(s) for s in rel.symbols] == [f"L['a{i}']" for i in range(n)]
    b = tw.GuardBuilder(frame)
    b.shape(rel)
    gs = tw.GuardSet.from_bytes(b.build().to_bytes())
    assert gs.check(frame) and not gs.check({**frame, "a0": -(10**9)})


@pytest.mark.parametrize("name", ["digits", "long_literals", "many_symbols", "mul_chain", "and_chain"])
def test_hostile_relation_texts_build_or_are_refused(name: str) -> None:
    text, frame = hd.relation_texts(50_000)[name]
    b = tw.GuardBuilder(frame)
    try:
        b.shape(text)
    except tw.GuardBuildError:  # ShapeSyntaxError, or the relation does not hold on the example
        return
    assert b.build().check(frame)


# -- SET_CONTAINS records ------------------------------------------------------------------------


def _set_contains_blob() -> bytes:
    b = tw.GuardBuilder({"s": {"k", 1}})
    b.set_contains("L['s']", "k")
    b.set_contains("L['s']", (2, "a"), present=False)
    return b.build().to_bytes()


def test_set_contains_records_under_single_byte_mutations() -> None:
    """Every position of a SET_CONTAINS set's body, several values each: refused with FormatError
    or loaded as a usable set, which never passes a value the original fails."""
    blob = _set_contains_blob()
    original = tw.GuardSet.from_bytes(blob)
    probes = [{"k", 1}, {"k", (2, "a")}, set(), frozenset({"k"}), {"k": 1}, ["k"], None]
    rng = random.Random(26)
    outcomes = {"loaded": 0, "refused": 0}
    body = blob[64:]
    for i in range(len(body)):
        for value in {0x00, 0x02, 0xFF, body[i] ^ 0x01, rng.randrange(256)} - {body[i]}:
            gs = loads_or_format_error(rewrap(body[:i] + bytes([value]) + body[i + 1 :]))
            outcomes["loaded" if gs is not None else "refused"] += 1
            if (
                gs is not None
                and all(g.kind is tw.GuardKind.SET_CONTAINS for g in gs.guards)
                and len(gs) == 2
            ):
                for p in probes:
                    gs.check({"s": p})  # any answer, but an answer: no error left behind
                    assert sys.exc_info() == (None, None, None)
    assert outcomes["refused"] > 100 and outcomes["loaded"] > 10, outcomes
    assert original.check({"s": {"k"}}) and not original.check({"s": {"k", (2, "a")}})


def _present_flag_at(body: bytes, item: bytes) -> int:
    """The offset of the present flag of the SET_CONTAINS record whose item is the constant at
    index ``item`` (the record's payload: varint constant index, u8 present)."""
    hits = [m.start() for m in re.finditer(re.escape(item + b"\x01"), body)]
    assert hits, item
    return hits[-1] + len(item)  # the caller asserts the byte is 1 and is refused as a present flag


def test_a_set_contains_record_with_a_bad_flag_or_constant_is_refused() -> None:
    # ... and a DICT_CONTAINS record with an unhashable key, which the loader refuses as well.
    from tripwire import _core

    def record(item: object, flag: bool = True, kind: tw.GuardKind = tw.GuardKind.SET_CONTAINS) -> bytes:
        decl = _core.GuardDecl(
            kind,
            _core.SourcePath(tw.RootKind.LOCAL, 0, [], ["L['v']"]),
            1,
            flag=flag,
            id=0,
        )
        consts = [
            "v",
            item,
        ]  # constants, no references (the writer's arguments as in test_untrusted_references)
        return _core.encode_guard_set(
            [decl],
            consts,
            [0] * len(consts),
            ["site"],
            [[]],
            [],
            lambda o: 0,
            None,
            [],
            [],
            False,
            "test",
            sys.version_info[:2],
        )

    good = record("k")
    gs = tw.GuardSet.from_bytes(good)
    assert gs.check({"v": {"k"}}) and not gs.check({"v": set()})
    # An unhashable item: the check could never pass; the builder and the loader refuse it.
    for item in ([1], {"a": 1}, (1, [2])):
        with pytest.raises(tw.FormatError, match=r"SET_CONTAINS guard: the item is unhashable: TypeError"):
            tw.GuardSet.from_bytes(record(item))
        with pytest.raises(tw.FormatError, match=r"DICT_CONTAINS guard: the key is unhashable: TypeError"):
            tw.GuardSet.from_bytes(record(item, kind=tw.GuardKind.DICT_CONTAINS))
    for flag in (True, False):  # a hashable key loads as itself, in both senses
        gs = tw.GuardSet.from_bytes(record("k", flag, kind=tw.GuardKind.DICT_CONTAINS))
        assert gs.check({"v": {"k": 1}}) is flag and gs.check({"v": {}}) is not flag
    # The present flag is a byte 0 or 1; the item a constant in range.
    body = good[64:]
    flag = _present_flag_at(body, b"\x01")
    assert body[flag] == 1
    for value, message in ((2, "present flag"), (0xFF, "present flag")):
        with pytest.raises(tw.FormatError, match=message):
            tw.GuardSet.from_bytes(rewrap(body[:flag] + bytes([value]) + body[flag + 1 :]))
    with pytest.raises(tw.FormatError, match="operand constant"):
        tw.GuardSet.from_bytes(rewrap(body[: flag - 1] + b"\x7f" + body[flag:]))
    # The other sense loads as itself.
    gs = tw.GuardSet.from_bytes(rewrap(body[:flag] + b"\x00" + body[flag + 1 :]))
    assert gs.guards[0].args == ("k", False) and gs.check({"v": set()}) and not gs.check({"v": {"k"}})

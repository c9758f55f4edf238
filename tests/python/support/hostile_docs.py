"""Hostile guard-set documents, written from docs/format.md (independently of the encoder).

Each builder takes a target body size in bytes and returns a whole document (header and SHA-256
included, so every byte reaches the decoder). They are the worst inputs found for each cost a
load has: long strings, strings named over and over, many tiny constants, deep constant trees,
many guards, long relation texts and many symbols. tests/python/serialization/test_hostile_bytes.py checks that
each loads or is refused with FormatError, and bench/hostile_load.py times them per MB.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def wrap(body: bytes) -> bytes:
    head = b"\x89TWG\r\n\x1a\n" + struct.pack("<HH16sI", 1, 0, b"hostile", len(body))
    return head + hashlib.sha256(body).digest() + body


def section(tag: int, content: bytes) -> bytes:
    return bytes([tag]) + varint(len(content)) + content


def body(
    strings: list[bytes],
    constants: bytes = b"",
    n_constants: int = 0,
    guards: bytes = b"",
    n_guards: int = 0,
    refs: bytes = b"",
    n_refs: int = 0,
) -> bytes:
    out = bytes([3, 11])
    out += section(1, varint(len(strings)) + b"".join(varint(len(s)) + s for s in strings))
    out += section(2, varint(n_refs) + refs)
    out += section(3, varint(n_constants) + constants)
    out += section(4, varint(n_guards) + guards)
    out += section(5, b"\x00\x00\x00\x00")  # not strict, no globals module, no baselines or drops
    return out


def source(name_const: int, text: int) -> bytes:
    """A root L[<constant name_const>] with no step; its one text is string `text`."""
    return b"\x00" + varint(name_const) + b"\x00" + varint(text)


def guard(kind: int, gid: int, src: bytes | None, payload: bytes = b"", label: int = 0) -> bytes:
    out = bytes([kind, 1]) + varint(gid)
    out += b"\x01" + src if src is not None else b"\x00"
    return out + varint(len(payload)) + payload + varint(label) + b"\x00"


# -- the documents ---------------------------------------------------------------------------------


def long_string(size: int) -> bytes:
    """One str constant of `size` bytes of multi-byte UTF-8 (the validator's worst text)."""
    s = ("\u00e9\u4e2d\U0001f600" * (size // 9 + 1)).encode()[: size // 9 * 9]
    return wrap(body([s], b"\x00\x07\x00", 1))


def named_over_and_over(size: int) -> bytes:
    """A string of half the body, then a tuple naming it from every remaining byte pair: a
    load copying it per use would copy size**2 / 4 bytes (refused by the string budget)."""
    s = b"x" * (size // 2)
    n = size // 4
    return wrap(body([s], b"\x00\x0a" + varint(n) + b"\x07\x00" * n, 1))


def tiny_constants(size: int) -> bytes:
    """`size / 2` constants, each None: the most Python objects per byte."""
    n = size // 2
    return wrap(body([], b"\x00\x00" * n, n))


def deep_constants(size: int) -> bytes:
    """A list of tuples nested 127 deep: the decoder's and the builder's recursions at their limit."""
    one = b"\x0a\x01" * 127 + b"\x00"
    n = size // len(one)
    return wrap(body([], b"\x00\x0b" + varint(n) + one * n, 1))


def many_guards(size: int) -> bytes:
    """NOT_NONE guards on L['x'], as many as fit (about 7 bytes each)."""
    one = guard(3, 0, source(0, 1))
    n = size // len(one)
    guards = b"".join(guard(3, i, source(0, 1)) for i in range(n))
    return wrap(body([b"x", b"L['x']"], b"\x00\x07\x00", 1, guards, n))


def _shape(relation: bytes, symbols: list[bytes], n_guards: int = 1) -> bytes:
    """SHAPE guards on the relation, symbol k being L['<symbols[k]>'] (int)."""
    strings = [relation] + symbols + [b"L['" + s + b"']" for s in symbols]
    consts = b"".join(b"\x00\x07" + varint(1 + k) for k in range(len(symbols)))
    payload = varint(0) + varint(len(symbols))
    payload += b"".join(source(k, 1 + len(symbols) + k) + b"\x00" for k in range(len(symbols)))
    guards = b"".join(guard(23, i, None, payload) for i in range(n_guards))
    return wrap(body(strings, consts, len(symbols), guards, n_guards))


def shape_many_symbols(size: int) -> bytes:
    """One SHAPE relation summing distinct symbols, as many as fit."""
    n = size // 40
    names = [b"a%d" % k for k in range(n)]
    return _shape(b" + ".join(b"L['" + s + b"']" for s in names) + b" >= 0", names)


def shape_long_literals(size: int) -> bytes:
    """A SHAPE relation adding the largest decimal literals under the limit (19,728 digits)."""
    lit = b"1" + b"0" * 19727
    n = max(1, size // (len(lit) + 3))
    return _shape(b"L['a'] < " + b" + ".join([lit] * n), [b"a"])


def shape_text_named_over_and_over(size: int) -> bytes:
    """A relation of half the body named by SHAPE guards filling the rest (refused by the budget:
    each would be parsed and compiled again)."""
    rel = b"L['a'] < " + b" + ".join([b"1"] * (size // 8))
    return _shape(rel, [b"a"], max(1, size // 2 // 12))


_M = (1 << 61) - 1  # the modulus of int hashing: h + k * _M hashes like h


def _int_set(values: list[int]) -> bytes:
    """A frozenset constant of ints of 9 bytes or more (tag 4), its items sorted by encoding."""
    items = sorted(
        b"\x04" + varint(n) + v.to_bytes(n, "little", signed=True)
        for v in values
        for n in [(v.bit_length() + 8) // 8]
    )
    return b"\x00\x0d" + varint(len(items)) + b"".join(items)


def colliding_set(size: int) -> bytes:
    """A frozenset of ints that all hash to 0: quadratic to build, refused past 16 per hash."""
    n = size // 11
    return wrap(body([], _int_set([i * _M for i in range(5, n + 5)]), 1))


def sixteen_per_hash(size: int) -> bytes:
    """A frozenset of ints, 16 per hash: the most collisions a load accepts."""
    n = size // 11
    return wrap(body([], _int_set([(i // 16) + (5 + i % 16) * _M for i in range(n)]), 1))


DOCUMENTS: dict[str, Callable[[int], bytes]] = {
    "long_string": long_string,
    "named_over_and_over": named_over_and_over,
    "tiny_constants": tiny_constants,
    "deep_constants": deep_constants,
    "many_guards": many_guards,
    "colliding_set": colliding_set,
    "sixteen_per_hash": sixteen_per_hash,
    "shape_many_symbols": shape_many_symbols,
    "shape_long_literals": shape_long_literals,
    "shape_text_named_over_and_over": shape_text_named_over_and_over,
}


# -- relation texts (GuardBuilder.shape) -------------------------------------------------------------


def relation_texts(size: int) -> dict[str, tuple[str, dict]]:
    """Hostile relation texts of about `size` bytes and the frame each is checked on."""
    k = size // 12
    lit = "1" + "0" * 19727
    return {
        "digits": ("L['a'] < " + "9" * size, {"a": 3}),
        "long_literals": ("L['a'] < " + " + ".join([lit] * max(1, size // 19731)), {"a": 3}),
        "many_symbols": (
            " + ".join(f"L['a{i}']" for i in range(k)) + " >= 0",
            {f"a{i}": 1 for i in range(k)},
        ),
        "mul_chain": ("L['a'] * " + " * ".join(["2"] * (size // 4)) + " >= 0", {"a": 3}),
        "add_chain": ("L['a'] + " + " + ".join(["1"] * (size // 4)) + " >= 0", {"a": 3}),
        "and_chain": (" and ".join(["L['a'] < 4"] * (size // 15)), {"a": 3}),
    }

"""The interpreter facts behind the engine's type_version (cpp/runtime/eval/fetch.hpp): the
attribute caches, the marking cache and the forwarding hooks compare a type's version tag with the
tag they were filled under, so every modification of a type must leave a tag that differs from
every earlier one (0, or a fresh value). Read here through ctypes, on every path that invalidates
a tag; then the engine itself after each path, against the oracle. (On 3.11/3.12 type_version also
tests Py_TPFLAGS_VALID_VERSION_TAG: a failed assign_version_tag can leave a tag without the flag,
which no modification then changes; that state needs the tag counter exhausted, so it is argued in
fetch.hpp, not reproduced here.)
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

import pytest

import reference
import tripwire as tw

VALID_VERSION_TAG = 1 << 19


def _flags_offset() -> int:
    found = [
        o
        for o in range(0, type.__basicsize__, 8)
        if ctypes.c_ulong.from_address(id(int) + o).value == int.__flags__
    ]
    assert len(found) == 1
    return found[0]


def _version_offset() -> int:
    # The one 32-bit field that a modification zeroes and the next lookup gives a fresh value.
    class Base:
        x = 1

    class Probe(Base):
        pass

    def snap() -> list[int]:
        return [ctypes.c_uint.from_address(id(Probe) + o).value for o in range(0, type.__basicsize__, 4)]

    Probe().x  # a lookup assigns the tag
    s1 = snap()
    Probe.y = 2
    s2 = snap()
    Probe().y
    s3 = snap()
    found = [4 * i for i, (a, b, c) in enumerate(zip(s1, s2, s3)) if a != 0 and b == 0 and c not in (0, a)]
    assert len(found) == 1
    return found[0]


FLAGS, VERSION = _flags_offset(), _version_offset()


def _tag(t: type) -> int:
    return ctypes.c_uint.from_address(id(t) + VERSION).value


def _valid(t: type) -> bool:
    return ctypes.c_ulong.from_address(id(t) + FLAGS).value & VALID_VERSION_TAG != 0


class _Other:
    pass


class _Meta(type):
    def mro(cls) -> list[type]:  # a metaclass mro: type_mro_modified's path
        return type.mro(cls)


def _setattr_on_base(c: type, base: type) -> None:
    base.q = 1  # type: ignore[attr-defined]


def _setattr_on_class(c: type, base: type) -> None:
    c.z = 2  # type: ignore[attr-defined]


def _delattr_on_class(c: type, base: type) -> None:
    del c.w  # type: ignore[attr-defined]


def _bases_assigned(c: type, base: type) -> None:
    c.__bases__ = (_Other,)


def _dunder_added(c: type, base: type) -> None:
    c.__getattr__ = lambda self, name: 0  # type: ignore[attr-defined]


MODIFICATIONS = [_setattr_on_base, _setattr_on_class, _delattr_on_class, _bases_assigned, _dunder_added]


@pytest.mark.parametrize("with_meta", [False, True])
@pytest.mark.parametrize("modify", MODIFICATIONS)
def test_a_modified_type_never_reads_its_old_tag(with_meta: bool, modify: Any) -> None:
    """Each path that invalidates a tag leaves one that differs from the old (0 until the next
    lookup, then a fresh one), and on 3.11/3.12 a tag with the VALID flag clear reads 0."""

    class Base:
        pass

    meta = _Meta if with_meta else type
    Cls = meta("Cls", (Base,), {"w": 0})
    assert Cls().w == 0  # the lookup assigns the tag
    old = _tag(Cls)
    assert old != 0
    modify(Cls, Base)
    assert _tag(Cls) != old
    if sys.version_info < (3, 13):
        assert _valid(Cls) or _tag(Cls) == 0  # CPython zeroes the tag where it clears the flag
    getattr(Cls(), "q", None)  # a lookup assigns a fresh tag, never the old one
    assert _tag(Cls) != old


def test_the_engine_sees_each_class_change_after_passing_checks() -> None:
    """An attribute fetched through the inline cache keyed on the class's tag: after passing
    checks, a class data descriptor shadowing the instance attribute, a `__getattribute__` and a
    `__bases__` assignment each change what getattr answers, and the check must see it."""

    class Base:
        pass

    class Other:
        pass

    class Obj(Base):
        pass

    o = Obj()
    o.a = 1
    f_locals = {"o": o}
    b = tw.GuardBuilder(f_locals)
    b.equals("L['o'].a", 1)
    gs = b.build()

    def agree(want: bool) -> None:
        assert reference.check(b.guards, f_locals) is want
        assert gs.check(f_locals) is want

    for _ in range(5):
        agree(True)
    Obj.a = property(lambda self: 2)
    agree(False)
    del Obj.a
    agree(True)
    Obj.__getattribute__ = lambda self, name: 3  # type: ignore[method-assign,assignment]
    agree(False)
    del Obj.__getattribute__
    agree(True)
    Other.a = property(lambda self: 4)  # type: ignore[attr-defined]
    Obj.__bases__ = (Other,)
    agree(False)
    Obj.__bases__ = (Base,)
    agree(True)

"""GuardBuilder.shape: it takes the index, makes the spec and appends it; a relation given as text
or as a Relation declares the same guard, and what Python reads is what the method uses (a
property added to the class, a subclass, a list or index replaced by user code mid-declaration)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import tripwire as tw
from tripwire import shapes


class T:
    """A tensor-like object: size() as torch has it."""

    def __init__(self, *sizes: int) -> None:
        self._sizes = tuple(sizes)

    def size(self) -> tuple:
        return self._sizes


def test_the_method_is_a_method_with_the_python_methods_signature_and_doc() -> None:
    method = tw.GuardBuilder.shape
    assert "relation" in inspect.signature(method).parameters
    assert method.__doc__ and "SHAPE: a relation among symbols" in method.__doc__
    b = tw.GuardBuilder({"n": 3})
    spec = b.shape(relation="L['n'] > 1")  # a keyword: the Python method
    assert spec.index == 0 and b.guards == [spec]


def test_a_relation_and_its_text_declare_the_same_spec() -> None:
    """shape(Relation) and shape(text) give equal specs, apart from the line of their install site."""
    ex = {"x": T(8, 4), "n": 4}
    b = tw.GuardBuilder(ex)
    rel = shapes.parse("L['x'].size()[0] > L['n']")
    fast = b.shape(rel)
    slow = b.shape("L['x'].size()[0] > L['n']")
    assert type(fast) is type(slow) is tw.GuardSpec
    assert list(vars(fast)) == list(vars(slow)) == ["kind", "source", "args", "index", "stack"]
    assert (fast.kind, fast.source, fast.args) == (slow.kind, slow.source, slow.args)
    assert (fast.index, slow.index) == (0, 1)
    assert fast.stack[:-1] == slow.stack[:-1] and fast.stack[-1] != slow.stack[-1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.index = 3  # type: ignore[misc]


def test_a_property_added_to_the_class_is_honoured() -> None:
    """A data descriptor assigned to GuardBuilder for an attribute the method reads is what the
    method reads (here globals in which the relation is false: refused, where the instance's own
    globals would make it hold); removed, the instance's own applies again."""
    b = tw.GuardBuilder({"n": 1}, {"k": 7})
    rel = shapes.parse("G['k'] == 7")
    assert b.shape(rel).index == 0
    tw.GuardBuilder.f_globals = property(lambda self: {"k": 1}, lambda self, v: None)  # type: ignore[assignment]
    try:
        with pytest.raises(tw.GuardBuildError, match="does not hold"):
            b.shape(rel)
    finally:
        del tw.GuardBuilder.f_globals
    assert b.shape(rel).index == 1
    assert [s.args[0] for s in b.guards] == ["G['k'] == 7", "G['k'] == 7"]


def test_subclasses_of_builder_and_relation_declare() -> None:
    class Builder(tw.GuardBuilder):
        @property
        def _specs(self) -> list:  # type: ignore[override]
            return self.__dict__.setdefault("_seen", [])

        @_specs.setter
        def _specs(self, value: list) -> None:
            self.__dict__["_seen"] = value

    b = Builder({"n": 3})
    spec = b.shape(shapes.parse("L['n'] > 1"))
    assert b.__dict__["_seen"] == [spec]

    @dataclasses.dataclass(frozen=True)
    class Rel(shapes.Relation):
        pass

    plain = tw.GuardBuilder({"n": 3})
    rel = shapes.parse("L['n'] > 2")
    sub = Rel(rel.text, rel.symbols, rel.comment, rel.original)
    assert plain.shape(sub).args[0] == "L['n'] > 2"


def test_user_code_replacing_the_builders_lists_and_index_mid_declaration() -> None:
    """A symbol read runs user code that replaces the builder's spec list and locals: the spec
    goes to the list the builder holds afterwards (self._specs is read after the check), and a
    non-int index is taken as it is."""
    b = tw.GuardBuilder({"n": 3})
    fresh: list = []

    class Swapping(T):
        def size(self) -> tuple:
            b._specs = fresh
            b.f_locals = {"gone": 1}  # the read in progress keeps the locals it started with
            return super().size()

    b.f_locals["t"] = Swapping(4)
    spec = b.shape(shapes.parse("L['t'].size()[0] == 4"))
    assert fresh == [spec]
    b._next_index = True  # a bool: not an exact int
    b.f_locals = {"n": 3}
    spec = b.shape(shapes.parse("L['n'] == 3"))
    assert spec.index is True  # taken as it is


def test_an_exception_outside_exception_propagates_from_a_read() -> None:
    """KeyboardInterrupt from a symbol read is not taken for a refusal: it propagates, nothing is
    appended, and the index is given back."""

    class Interrupting(T):
        def size(self) -> tuple:
            raise KeyboardInterrupt

    b = tw.GuardBuilder({"t": Interrupting(2)})
    with pytest.raises(KeyboardInterrupt):
        b.shape(shapes.parse("L['t'].size()[0] == 2"))
    assert b.guards == [] and b._next_index == 0


def test_refusals_say_why_and_give_the_index_back() -> None:
    b = tw.GuardBuilder({"n": 3, "f": 1.5, "s": "x"})
    with pytest.raises(tw.GuardBuildError, match="does not hold"):
        b.shape(shapes.parse("L['n'] > 5"))
    with pytest.raises(tw.GuardBuildError, match="is a str"):
        b.shape(shapes.parse("L['s'] > 5"))
    with pytest.raises(tw.GuardBuildError, match="cannot read"):
        b.shape(shapes.parse("L['missing'] > 5"))
    assert b.shape(shapes.parse("L['f'] > 1")).index == 0

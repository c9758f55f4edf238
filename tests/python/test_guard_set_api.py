"""GuardSet's Python surface: inputs that are not mappings, repr, stubs."""

from __future__ import annotations

import pathlib

import pytest

import tripwire as tw


@pytest.fixture
def gs() -> tw.GuardSet:
    b = tw.GuardBuilder({"x": 1, "y": "a"})
    b.equals("L['x']")
    b.type_match("L['y']")
    return b.build()


@pytest.mark.parametrize("bad", [None, [1], 3, "x", object()])
def test_non_mapping_locals_fail_without_raising(gs: tw.GuardSet, bad: object) -> None:
    assert gs.check(bad) is False
    f = gs.why_not(bad)
    assert f is not None and f.source == "L['x']" and "cannot be read" in f.reason


def test_repr_len_iter(gs: tw.GuardSet) -> None:
    assert len(gs) == 2
    assert [g.kind.name for g in gs] == ["EQUALS_MATCH", "TYPE_MATCH"]
    assert repr(gs) == "<tripwire.GuardSet 2 guards on 2 sources>"


def test_typed_stubs_are_installed() -> None:
    pkg = pathlib.Path(tw.__file__).parent
    stub = (pkg / "_core.pyi").read_text()
    assert "class GuardSetCore" in stub and "def _failures(self" in stub
    # check is a plain METH_O method (the hot path skips nanobind's dispatcher): the stub types it
    # as a method descriptor, and the public class declares its signature for type checkers.
    assert "check: types.MethodDescriptorType" in stub
    assert "def check(self, f_locals: Mapping[str, Any], /) -> bool:" in (pkg / "guard_set.py").read_text()
    assert (pkg / "py.typed").exists()

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
def test_non_mapping_locals_raise_type_error(gs: tw.GuardSet, bad: object) -> None:
    # Failing every guard silently (check False, why_not "cannot be read") hid the caller's bug.
    for call in (gs.check, gs.why_not, gs.failures):
        with pytest.raises(TypeError, match=r"f_locals must be a dict \(or a Mapping\).*, not "):
            call(bad)


def test_repr_len_iter(gs: tw.GuardSet) -> None:
    assert len(gs) == 2
    assert [g.kind.name for g in gs] == ["EQUALS_MATCH", "TYPE_MATCH"]
    assert repr(gs) == "<tripwire.GuardSet 2 guards on 2 sources>"


def test_typed_stubs_are_installed() -> None:
    pkg = pathlib.Path(tw.__file__).parent
    stub = (pkg / "_core" / "__init__.pyi").read_text()
    assert "class GuardSetCore" in stub and "def _failures(self" in stub
    # check is a plain METH_O method (the hot path skips nanobind's dispatcher): the stub types it
    # as a method descriptor, and the public class declares its signature for type checkers.
    assert "check: types.MethodDescriptorType" in stub
    assert "def check(self, f_locals: Mapping[str, Any], /) -> bool:" in (pkg / "guard_set.py").read_text()
    assert (pkg / "py.typed").exists()


def test_mappings_other_than_dict_are_still_locals():
    b = tw.GuardBuilder({"x": 3})
    b.type_match("L['x']")
    gs = b.build()
    from types import MappingProxyType

    assert gs.check(MappingProxyType({"x": 4})) and not gs.check(MappingProxyType({"x": "s"}))


def test_explain_counts_the_callers_checks_only():
    b = tw.GuardBuilder({"x": 3})
    b.type_match("L['x']")
    gs = b.build()
    assert "; 0 checks, 0 passed" in gs.explain().splitlines()[0]  # build()'s own check is not counted
    assert gs.explain().splitlines()[1] == "fast path: 1 of 1 guards (100.0%)"
    gs.check({"x": 1})
    assert gs.explain().splitlines()[0].endswith("; 1 check, 1 passed")
    assert "passes: 1 fast, 0 with residues" in gs.explain().splitlines()[1]
    gs.check({"x": "s"})
    assert gs.explain().splitlines()[0].endswith("; 2 checks, 1 passed")

"""Property test: the C++ engine answers exactly as the pure-Python reference evaluator.

For a random example frame, a random guard set over sources that exist in it, and random inputs
derived from the example (leaves changed, types changed, keys/attributes deleted or added, dicts
reordered, containers replaced, ambient state flipped), every input must give

* ``gs.check(x) == reference.check(gs.guards, x, ...)``,
* when it fails, the same first failing guard from ``gs.why_not(x)`` as
  ``reference.first_failure(...)`` (the smallest installation index), with the same source/kind,
* a ``gs.failures(x)`` list consistent with evaluating every guard in the reference,

and the answers must not change when the inputs are checked again in other orders (the engine
reorders guards adaptively after failures).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import reference
import tripwire as tw
from gc_stress import examples
from strategies import Frame, Mutation, frames, guard_plans, mutated_frames

_SETTINGS = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    derandomize=False,
)


@contextlib.contextmanager
def installed(example: Frame, m: Mutation) -> Iterator[None]:
    """Put mutation ``m`` in place: its globals into the example's globals dict and its closure
    contents into the example's cells (the set reads both live, as given at build time)."""
    saved_globals = dict(example.f_globals)
    saved_cells = {k: c.cell_contents for k, c in example.f_closure.items()}
    try:
        new_globals = dict(m.frame.f_globals)  # may be the example's own dict
        new_cells = {k: c.cell_contents for k, c in m.frame.f_closure.items()}
        example.f_globals.clear()
        example.f_globals.update(new_globals)
        for k, c in example.f_closure.items():
            c.cell_contents = new_cells[k]
        with m:
            yield
    finally:
        example.f_globals.clear()
        example.f_globals.update(saved_globals)
        for k, c in example.f_closure.items():
            c.cell_contents = saved_cells[k]


def reference_failing(
    specs: tuple[tw.GuardSpec, ...], example: Frame, f_locals: dict
) -> tuple[set[int], set[int]]:
    """(every failing guard index, failing indices whose source could be fetched)."""
    failing, fetched = set(), set()
    for spec in specs:
        if spec.source is None:
            v: Any = f_locals
        else:
            try:
                values = [
                    reference.fetch(s, f_locals, example.f_globals, example.f_closure) for s in spec.sources
                ]
            except reference.FetchError:
                failing.add(spec.index)
                continue
            relational = spec.kind in (tw.GuardKind.ALIAS, tw.GuardKind.NO_ALIAS)
            v = tuple(values) if relational else values[0]
        if not reference.evaluate(spec, v, f_locals):
            failing.add(spec.index)
            fetched.add(spec.index)
    return failing, fetched


def assert_agree(gs: tw.GuardSet, example: Frame, m: Mutation) -> bool:
    """Check one input against the reference; return the verdict."""
    L = m.frame.f_locals
    with installed(example, m):
        expected = reference.check(gs.guards, L, example.f_globals, example.f_closure)
        first = reference.first_failure(gs.guards, L, example.f_globals, example.f_closure)
        failing, fetched = reference_failing(gs.guards, example, L)
        got = gs.check(L)
        why = gs.why_not(L)
        all_failures = gs.failures(L)
    assert got == expected, f"check() = {got}, reference = {expected} for {m!r}"
    assert (first is None) == expected
    if expected:
        assert why is None
        assert all_failures == []
        assert failing == set()
        return True
    spec, _ = first
    event(f"first failure: {spec.kind.name}")
    assert why is not None
    assert why.guard.index == spec.index, f"why_not: {why.reason!r}; reference: {spec.describe()} for {m!r}"
    assert why.kind == spec.kind.name
    assert why.source == (str(spec.source) if spec.source is not None else None)
    assert min(failing) == spec.index
    engine = [f.guard.index for f in all_failures]
    assert engine == sorted(engine), "failures() must be in installation order"
    assert engine[0] == spec.index
    # The engine reports an unreadable source once (its smallest guard), the reference every
    # guard below it; guards whose value was read must match one to one.
    assert set(engine) <= failing
    assert fetched <= set(engine)
    return expected


def run_case(data: st.DataObject, mutations: int) -> None:
    example = data.draw(frames(), label="frame")
    plan = data.draw(guard_plans(example), label="plan")
    b = tw.GuardBuilder(example.f_locals, example.f_globals, example.f_closure)
    plan.apply(b)
    gs = b.build()  # must pass on its own example
    assert len(gs) == len(plan.calls)
    for kind in {g.kind.name for g in gs}:
        event(f"guard kind: {kind}")
    for step in {st_.kind.name for g in gs if g.source is not None for st_ in g.source.steps}:
        event(f"step kind: {step}")
    assert [g.index for g in gs] == list(range(len(plan.calls)))
    inputs = data.draw(mutated_frames(example, n=mutations), label="inputs")
    verdicts = [assert_agree(gs, example, m) for m in inputs]
    assert verdicts[0] is True  # the example itself
    # Adaptive reordering must never change an answer: check again in other orders.
    for _ in range(2):
        order = data.draw(st.permutations(range(len(inputs))), label="order")
        for i in order:
            with installed(example, inputs[i]):
                assert gs.check(inputs[i].frame.f_locals) == verdicts[i], inputs[i]
    # why_not after reordering still names the smallest failing guard.
    for i, m in enumerate(inputs):
        if not verdicts[i]:
            assert_agree(gs, example, m)


@settings(max_examples=examples(400), **_SETTINGS)
@given(st.data())
def test_engine_matches_reference(data: st.DataObject) -> None:
    run_case(data, mutations=6)


@pytest.mark.slow
@settings(max_examples=examples(1000), **_SETTINGS)
@given(st.data())
def test_engine_matches_reference_long(data: st.DataObject) -> None:
    run_case(data, mutations=10)


@settings(max_examples=examples(100), **_SETTINGS)
@given(st.data())
def test_equal_frames_after_mutation_roundtrip(data: st.DataObject) -> None:
    """A guard set built on a frame passes on an equal copy built independently, unless it holds
    identity or version guards (whose failure the reference must then agree with)."""
    example = data.draw(frames(), label="frame")
    plan = data.draw(guard_plans(example), label="plan")
    b = tw.GuardBuilder(example.f_locals, example.f_globals, example.f_closure)
    plan.apply(b)
    gs = b.build()
    import copy

    clone = Frame(copy.deepcopy(example.f_locals), example.f_globals, example.f_closure)
    m = Mutation(clone, "deepcopy of locals")
    ok = assert_agree(gs, example, m)
    identity_kinds = {tw.GuardKind.ID_MATCH, tw.GuardKind.DICT_VERSION}
    local_identity = any(
        g.kind in identity_kinds and g.source is not None and g.source.root is tw.RootKind.LOCAL for g in gs
    )
    if not local_identity:
        assert ok


def test_closure_cells_are_read_live() -> None:
    """Sanity check of the harness: C[...] sources read the build-time cell's current contents."""
    cell = types.CellType({"a": 1})
    b = tw.GuardBuilder({}, None, {"c": cell})
    b.equals("C['c']['a']")
    gs = b.build()
    assert gs.check({})
    cell.cell_contents = {"a": 2}
    assert not gs.check({})
    assert gs.why_not({}).source == "C['c']['a']"


# -- attribute inline cache: random class and instance mutations -----------------------------------


def _getattr_returning(v: Any, names: tuple[str, ...]) -> Any:
    def __getattr__(self: Any, name: str) -> Any:
        if name in names:
            return v
        raise AttributeError(name)

    return __getattr__


_ATTR_OPS = st.sampled_from(
    [
        "set_inst",
        "set_inst",
        "del_inst",
        "set_class",
        "del_class",
        "set_property",
        "set_base_property",
        "del_base",
        "set_getattr",
        "del_getattr",
        "replace_dict",
        "materialise_dict",
        "pad",
        "swap_class",
        "dict_write",
    ]
)


@settings(max_examples=examples(150), **_SETTINGS)
@given(st.data())
def test_attribute_cache_matches_reference_under_mutation(data: st.DataObject) -> None:
    """Instances and their classes change between checks; the engine's inline attribute cache
    (type version tags, instance dict entry hints) must answer exactly as a plain getattr."""

    class Base:
        pass

    class C(Base):
        pass

    class D(Base):
        pass

    names = ("a", "b")
    classes = (C, D)
    objs = []
    for _ in range(3):
        o = C()
        o.a, o.b = 1, 1
        objs.append(o)
    b = tw.GuardBuilder({"o": objs[0]})
    b.equals("L['o'].a")
    b.hasattr("L['o']", "b")
    b.equals("L['o'].b")
    gs = b.build()
    value = st.sampled_from([1, 1, 2, "x"])
    for _ in range(data.draw(st.integers(5, 25), label="steps")):
        op = data.draw(_ATTR_OPS, label="op")
        o = data.draw(st.sampled_from(objs), label="obj")
        name = data.draw(st.sampled_from(names), label="name")
        cls = data.draw(st.sampled_from(classes), label="class")
        v = data.draw(value, label="value")
        if op == "set_inst":
            o.__dict__[name] = v  # (setattr would hit a property's missing setter)
        elif op == "del_inst":
            o.__dict__.pop(name, None)
        elif op == "set_class":
            setattr(cls, name, v)
        elif op == "del_class":
            if name in cls.__dict__:
                delattr(cls, name)
        elif op == "set_property":
            setattr(cls, name, property(lambda self, v=v: v))
        elif op == "set_base_property":
            setattr(Base, name, property(lambda self, v=v: v))
        elif op == "del_base":
            if name in Base.__dict__:
                delattr(Base, name)
        elif op == "set_getattr":
            cls.__getattr__ = _getattr_returning(v, names)
        elif op == "del_getattr":
            if "__getattr__" in cls.__dict__:
                del cls.__getattr__
        elif op == "replace_dict":
            o.__dict__ = dict(reversed(list(o.__dict__.items())))
        elif op == "materialise_dict":
            assert type(o.__dict__) is dict
        elif op == "pad":
            for j in range(data.draw(st.integers(1, 40), label="pad")):
                o.__dict__[f"pad{j}"] = j
        elif op == "swap_class":
            o.__class__ = cls
        elif op == "dict_write":
            o.__dict__["".join([name])] = v
        for x in objs:
            want = reference.check(gs.guards, {"o": x})
            for _ in range(2):
                assert gs.check({"o": x}) is want, (op, vars(x), type(x).__name__)
            if not want:
                first = reference.first_failure(gs.guards, {"o": x})
                assert gs.why_not({"o": x}).guard.index == first[0].index

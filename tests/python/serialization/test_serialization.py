"""GuardSet.to_bytes / from_bytes: round trips kind by kind and for whole sets (also in a fresh
process), what is refused and why, and bad input (docs/format.md)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import re
import struct
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import hostile_docs
import reference
import serial_fixtures as fx
import shape_cases
import tripwire as tw
from gc_stress import examples
from strategies import frames, guard_plans, mutated_frames
from tripwire.catalogue import resolve

HERE = Path(__file__).parent
_SETTINGS = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
# Builder method -> kind, for the per-kind round trips.
_METHOD_KIND = {
    "type_match": "TYPE_MATCH",
    "id_match": "ID_MATCH",
    "none": "NONE",
    "not_none": "NOT_NONE",
    "true": "TRUE",
    "false": "FALSE",
    "equals": "EQUALS_MATCH",
    "length": "LENGTH",
    "dict_keys": "DICT_KEYS",
    "dict_contains": "DICT_CONTAINS",
    "hasattr": "HASATTR",
    "set_contains": "SET_CONTAINS",
    "tuple_iterator_len": "TUPLE_ITERATOR_LEN",
    "range_iterator": "RANGE_ITERATOR",
    "code_match": "CODE_MATCH",
    "weakref_alive": "WEAKREF_ALIVE",
    "global_state": "GLOBAL_STATE",
    "dict_version": "DICT_VERSION",
    "predicate": "LAMBDA",
    "alias": "ALIAS",
    "no_alias": "NO_ALIAS",
}
STORED_KINDS = [k for k in _METHOD_KIND.values() if k not in ("DICT_VERSION", "LAMBDA")]


def save_what_can_be_saved(gs: tw.GuardSet) -> tuple[bytes, set[str]]:
    """to_bytes(), dropping exactly the guards NotSerializable listed (by source, or by kind for
    ambient guards); returns the bytes and the drop list."""
    drop: set[str] = set()
    while True:
        try:
            return gs.to_bytes(drop=sorted(drop)), drop
        except tw.NotSerializable as e:
            assert e.guards, "NotSerializable lists the guards"
            new = {src if src is not None else kind for kind, src, _ in e.guards}
            assert not new <= drop, f"dropping {new} did not help"
            drop |= new


def kept_specs(gs: tw.GuardSet, drop: set[str]) -> list[tw.GuardSpec]:
    """The guards of ``gs`` that were not dropped, with their objects alive (a set's specs hold
    identity-held objects weakly)."""
    return [
        tw.GuardSpec(s.kind, s.source, tuple(resolve(a) for a in s.args), s.index, s.stack)
        for s in gs.guards
        if s.kind.name not in drop and (s.source is None or str(s.source) not in drop)
    ]


def answers(gs: tw.GuardSet, f_locals: dict) -> tuple:
    f = gs.why_not(f_locals)
    fails = [(x.source, x.kind) for x in gs.failures(f_locals)]
    return gs.check(f_locals), None if f is None else (f.source, f.kind, f.reason), fails


def roundtrip_against_live(data: Any, kind: str | None) -> None:
    example = data.draw(frames())
    plan = data.draw(guard_plans(example))
    if kind is not None:
        # A rare kind is drawn for few sources: several plans on one frame before the example is
        # discarded, rather than a new frame for each (a frame costs most of the drawing).
        for _ in range(7):
            if any(_METHOD_KIND[c[0]] == kind for c in plan.calls):
                break
            plan = data.draw(guard_plans(example))
        plan.calls = [c for c in plan.calls if _METHOD_KIND[c[0]] == kind]
        assume(plan.calls)
    b = tw.GuardBuilder(example.f_locals, example.f_globals, example.f_closure)
    plan.apply(b)
    gs = b.build()
    blob, drop = save_what_can_be_saved(gs)
    loaded = tw.GuardSet.from_bytes(blob, f_globals=example.f_globals, allow_modules=["strategies"])
    live = tw.GuardSet(kept_specs(gs, drop), example.f_globals, example.f_closure)
    assert len(loaded) == len(live)
    assert {d[1] or d[0] for d in loaded.dropped} == drop
    for m in data.draw(mutated_frames(example)):
        with m:
            x = m.frame.f_locals
            assert answers(loaded, x) == answers(live, x), m


@pytest.mark.parametrize("kind", STORED_KINDS)
@settings(max_examples=examples(15), **_SETTINGS)
@given(data=st.data())
def test_each_kind_alone_answers_as_the_live_set(kind: str, data: st.DataObject) -> None:
    roundtrip_against_live(data, kind)


@settings(max_examples=examples(100), **_SETTINGS)
@given(data=st.data())
def test_mixed_sets_answer_as_the_live_set(data: st.DataObject) -> None:
    roundtrip_against_live(data, None)


# -- whole sets from guards_for, loaded in a fresh process -------------------------------------------


def evaluate_all(sets: list[tw.GuardSet]) -> list:
    out = []
    for gs, frame in zip(sets, fx.frames(), strict=True):
        for x in fx.variants(frame):
            f = gs.why_not(x)
            out.append([gs.check(x), None if f is None else [f.source, f.kind]])
    return out


_CHILD = """
import json, sys
sys.path[:0] = [{here!r}, {here!r} + "/../support", {here!r} + "/../../oracle"]
import serial_fixtures as fx
import tripwire as tw
sets = [tw.GuardSet.from_bytes(open(p, "rb").read()) for p in {paths!r}]
out = []
for gs, frame in zip(sets, fx.frames()):
    for x in fx.variants(frame):
        f = gs.why_not(x)
        out.append([gs.check(x), None if f is None else [f.source, f.kind]])
print(json.dumps(out))
"""


def test_guards_for_sets_load_in_a_fresh_process(tmp_path: Path) -> None:
    sets = [tw.guards_for(frame, fx.__dict__) for frame in fx.frames()]
    paths = []
    for i, gs in enumerate(sets):
        p = tmp_path / f"set{i}.twg"
        p.write_bytes(gs.to_bytes())
        paths.append(str(p))
    expected = evaluate_all(sets)
    assert sum(1 for ok, _ in expected if ok) >= len(sets)  # each set passes at least its example
    assert sum(1 for ok, _ in expected if not ok) > len(expected) // 2
    child = _CHILD.format(here=str(HERE), paths=paths)
    out = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout) == json.loads(json.dumps(expected))


def test_globals_are_the_recorded_modules_in_a_fresh_process(tmp_path: Path) -> None:
    b = tw.GuardBuilder({}, fx.__dict__)
    b.id_match("G['CONFIG']")  # a module-level instance: re-resolves to *the* object
    b.equals("G['CONFIG'].mode")
    b.id_match("G['helper']")
    b.global_state(fx.probe_mode)
    blob = b.build().to_bytes()
    p = tmp_path / "g.twg"
    p.write_bytes(blob)
    child = f"""
import sys
sys.path.insert(0, {str(HERE.parent / "support")!r})
import serial_fixtures as fx, tripwire as tw
gs = tw.GuardSet.from_bytes(open({str(p)!r}, "rb").read(), allow_modules=["serial_fixtures"])
r = [gs.check({{}})]
fx.CONFIG.mode = "slow"; r.append(gs.why_not({{}}).source)
fx.CONFIG.mode = "fast"; fx.helper = fx.other_helper; r.append(gs.why_not({{}}).source)
print(r)
"""
    out = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[True, \"G['CONFIG'].mode\", \"G['helper']\"]"


# -- tensors, arrays, markings, aliasing, torch's state ----------------------------------------------


def _tensor_frame() -> tuple[dict, list[dict]]:
    """A frame of tensors (static, dynamic, a view with its storage offset checked, a Parameter)
    and mutations of it: shape, stride, dtype, requires_grad, views, aliasing, markings."""
    import torch

    x = torch.randn(4, 8)
    torch._dynamo.mark_dynamic(x, 0)
    base = torch.randn(10, 8)
    frame = {
        "x": x,
        "y": base[2:6].t(),
        "z": torch.ones(3, dtype=torch.int64),
        "u": torch.ones(3, dtype=torch.int64),
        "p": torch.nn.Parameter(torch.zeros(2)),
    }
    frame["w"] = frame["z"]
    variants = [dict(frame)]

    def v(**kw: Any) -> None:
        variants.append({**frame, **kw})

    v(x=torch.randn(9, 8))  # dynamic dim: passes TENSOR_MATCH, fails the markings (unmarked)
    m = torch.randn(9, 8)
    torch._dynamo.mark_dynamic(m, 0)
    v(x=m)
    m2 = torch.randn(4, 8)
    torch._dynamo.mark_dynamic(m2, 1)
    v(x=m2)  # marked on a dim not marked at build
    v(x=torch.randn(4, 9))
    v(y=base[3:7].t())  # same sizes and strides, another storage offset
    v(y=base[2:6].t().contiguous())
    v(y=torch.randn(8, 4, dtype=torch.float64))
    v(z=torch.ones(3, dtype=torch.int32), w=None)
    v(z=torch.ones(3, dtype=torch.int64, requires_grad=False).neg())
    v(w=torch.ones(3, dtype=torch.int64))  # ALIAS broken
    v(u=frame["z"])  # NO_ALIAS broken
    v(p=torch.zeros(2))  # a Tensor where a Parameter was
    v(x=torch.randn(4, 8, requires_grad=True))
    v(x=torch.randn(4, 8, dtype=torch.float16))
    return frame, variants


def _tensor_set(frame: dict) -> tw.GuardSet:
    b = tw.GuardBuilder(frame)
    b.tensor_match("L['x']", dynamic=(0,))
    b.dimension_marking("L['x']")
    b.tensor_match("L['y']", storage_offset=True)
    b.tensor_match("L['z']")
    b.tensor_match("L['u']")
    b.tensor_match("L['p']")
    b.alias("L['z']", "L['w']")
    b.no_alias("L['x']", "L['y']", "L['z']", "L['u']", "L['p']")
    b.global_state("torch_global_state")
    b.global_state("torch_function_mode_stack")
    b.global_state("torch_default_device")
    return b.build()


def _array_frame() -> tuple[dict, list[dict]]:
    import numpy as np

    rec = np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")])
    frame = {"a": np.zeros((3, 4), dtype=np.float32), "b": np.arange(12.0)[::2], "r": rec, "s": rec}
    variants = [dict(frame)]
    for kw in (
        {"a": np.zeros((3, 5), dtype=np.float32)},
        {"a": np.zeros((4, 3), dtype=np.float32).T},
        {"a": np.zeros((3, 4), dtype=np.float64)},
        {"a": np.zeros((3, 4), dtype=">f4")},
        {"a": np.zeros((3, 4), dtype=np.float32)[:, ::1].copy(order="F")},
        {"b": np.arange(6.0)},
        {"b": np.arange(12.0)[1::2]},
        {"r": np.zeros(3, dtype=[("a", "<i4"), ("c", "<f8")]), "s": None},
        {"s": rec.copy()},
        {"a": frame["b"]},
    ):
        variants.append({**frame, **kw})
    ro = frame["a"].copy()
    ro.flags.writeable = False
    variants.append({**frame, "a": ro})
    return frame, variants


def _array_set(frame: dict) -> tw.GuardSet:
    b = tw.GuardBuilder(frame)
    b.array_match("L['a']")
    b.array_match("L['b']", dynamic=(0,))
    b.array_match("L['r']")
    b.alias("L['r']", "L['s']")
    b.no_alias("L['a']", "L['b']", "L['r']")
    return b.build()


def _decisions(gs: tw.GuardSet, variants: list[dict], reasons: bool = True) -> list:
    """Per variant: the decision and the first failure (source, kind, and the reason, which may
    name object addresses: not comparable across processes)."""
    out = []
    for x in variants:
        f = gs.why_not(x)
        first = None if f is None else [str(f.source), f.kind] + ([f.reason] if reasons else [])
        out.append([gs.check(x), first])
    return out


def test_tensor_kinds_round_trip() -> None:
    """TENSOR_MATCH (static, dynamic, storage offset, a Parameter), DIMENSION_MARKING, ALIAS,
    NO_ALIAS and torch's three probes: the loaded set decides, and explains, as the live one."""
    pytest.importorskip("torch")
    frame, variants = _tensor_frame()
    gs = _tensor_set(frame)
    loaded = tw.GuardSet.from_bytes(gs.to_bytes())
    assert [s.kind for s in loaded.guards] == [s.kind for s in gs.guards]
    got, want = _decisions(loaded, variants), _decisions(gs, variants)
    assert got == want
    assert want[0][0] and sum(1 for ok, _ in want if not ok) == len(variants) - 3  # 3 that pass
    assert {w[1][1] for w in want if w[1]} >= {"TENSOR_MATCH", "DIMENSION_MARKING", "ALIAS", "NO_ALIAS"}
    import torch

    with torch.no_grad():  # the global state is stored too
        assert not loaded.check(frame)
        assert loaded.why_not(frame).kind == "GLOBAL_STATE"
        assert loaded.why_not(frame).reason == gs.why_not(frame).reason
    describe = tw.serialization.describe_bytes(gs.to_bytes())
    assert "check_tensor(L['x'], <type torch:Tensor>, float32[*, 8]" in describe
    assert "torch.build" in describe


def test_array_kinds_round_trip() -> None:
    pytest.importorskip("numpy")
    frame, variants = _array_frame()
    gs = _array_set(frame)
    loaded = tw.GuardSet.from_bytes(gs.to_bytes())
    want = _decisions(gs, variants)
    assert _decisions(loaded, variants) == want
    assert want[0][0] and sum(1 for ok, _ in want if not ok) == len(variants) - 2  # 2 that pass
    assert "torch.build" not in loaded.baselines  # nothing torch-coded: loads without torch


_TENSOR_CHILD = """
import json, sys
sys.path[:0] = [{here!r}, {here!r} + "/../support", {here!r} + "/../../oracle"]
import tripwire as tw
try:  # torch is not imported: refused, and the load does not import it
    tw.GuardSet.from_bytes(open({tpath!r}, "rb").read())
    raise SystemExit("loaded without torch")
except tw.FormatError as e:
    assert "torch" in str(e), e
assert "torch" not in sys.modules
import torch, numpy
import test_serialization as t
import tripwire as tw
out = []
for path, make in (({tpath!r}, t._tensor_frame), ({apath!r}, t._array_frame)):
    gs = tw.GuardSet.from_bytes(open(path, "rb").read())
    out.append(t._decisions(gs, make()[1], reasons=False))
print(json.dumps(out))
"""


def test_tensor_and_array_sets_load_in_a_fresh_process(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("numpy")
    tframe, tvariants = _tensor_frame()
    aframe, avariants = _array_frame()
    tgs, ags = _tensor_set(tframe), _array_set(aframe)
    (tmp_path / "t.twg").write_bytes(tgs.to_bytes())
    (tmp_path / "a.twg").write_bytes(ags.to_bytes())
    expected = [_decisions(tgs, tvariants, reasons=False), _decisions(ags, avariants, reasons=False)]
    child = _TENSOR_CHILD.format(here=str(HERE), tpath=str(tmp_path / "t.twg"), apath=str(tmp_path / "a.twg"))
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == json.loads(json.dumps(expected))


def test_torch_coded_guards_refuse_another_torch_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dispatch-key bits, scalar-type codes and the autocast device order are the writing torch
    build's: a load under another build (or with the baseline missing) is refused, naming them."""
    pytest.importorskip("torch")
    from tripwire import serialization

    frame, _ = _tensor_frame()
    gs = _tensor_set(frame)
    blob = gs.to_bytes()
    monkeypatch.setattr(serialization, "torch_build", lambda: "2.99.0+cpu+0000")
    with pytest.raises(tw.FormatError, match=r"TENSOR_MATCH guard\(s\) were saved by torch 2\.13"):
        tw.GuardSet.from_bytes(blob)
    monkeypatch.setattr(serialization, "torch_build", lambda: None)
    with pytest.raises(tw.FormatError, match="no torch imported"):
        tw.GuardSet.from_bytes(blob)
    monkeypatch.undo()
    # Without the torch-coded guards the rest loads anywhere.
    blob = gs.to_bytes(drop=["TENSOR_MATCH", "GLOBAL_STATE"])
    monkeypatch.setattr(serialization, "torch_build", lambda: "2.99.0+cpu+0000")
    assert tw.GuardSet.from_bytes(blob).check(frame)


def test_a_loaded_tensor_set_explains_as_the_live_one() -> None:
    """The device string of TENSOR_MATCH (messages only: the data holds the device index) is
    saved as the guard's label, so explain() and why_not of the loaded set are the live set's,
    line for line (issue 9 left the loaded set's without it)."""
    pytest.importorskip("torch")
    frame, variants = _tensor_frame()
    gs = _tensor_set(frame)
    loaded = tw.GuardSet.from_bytes(gs.to_bytes())
    assert loaded.check(frame)  # the live build checked its example once: the counts agree
    assert " cpu requires_grad" in gs.explain()
    assert loaded.explain().splitlines()[-1] == gs.explain().splitlines()[-1]
    for v in variants:
        a, b = gs.why_not(v), loaded.why_not(v)
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            assert (a.guard.index, str(a), a.guard.describe()) == (b.guard.index, str(b), b.guard.describe())


def test_a_crafted_device_label_is_a_format_error() -> None:
    """The label must be torch's device form with the stored index: a message cannot be made to
    name another device index than the one the guard checks."""
    pytest.importorskip("torch")
    frame, _ = _tensor_frame()
    blob = _tensor_set(frame).to_bytes()
    assert blob.count(b"\x03cpu") == 1  # the label, length-prefixed in the strings section
    for new in (b"cp:", b"c:9"):
        bad = rewrap(blob[64:].replace(b"\x03cpu", b"\x03" + new))
        with pytest.raises(tw.FormatError, match="device label"):
            tw.GuardSet.from_bytes(bad)


def test_a_tensor_kind_naming_a_non_tensor_type_is_refused_when_bound() -> None:
    """What a crafted TENSOR_MATCH / ARRAY_MATCH record could name instead of a tensor or array
    class: the engine refuses it before the adapter or the struct reader could read an arbitrary
    object as a tensor (decoded sets are bound by the same code)."""
    pytest.importorskip("torch")
    pytest.importorskip("numpy")
    frame, _ = _tensor_frame()
    aframe, _ = _array_frame()
    t = next(s for s in _tensor_set(frame).guards if s.kind is tw.GuardKind.TENSOR_MATCH)
    a = next(s for s in _array_set(aframe).guards if s.kind is tw.GuardKind.ARRAY_MATCH)
    for spec in (t, a):
        bad = tw.GuardSpec(spec.kind, spec.source, (int, spec.args[1]), 0, ())
        with pytest.raises(ValueError, match=r"needs a (torch tensor|numpy array) type"):
            tw.GuardSet([bad])


def test_what_tensor_kinds_cannot_store_is_refused() -> None:
    torch = pytest.importorskip("torch")

    class Mode(torch.overrides.TorchFunctionMode):
        pass

    b = tw.GuardBuilder({"x": 1, "c": 2})
    with Mode():
        b.global_state("torch_function_mode_stack")
        gs = b.build()
    with pytest.raises(tw.NotSerializable, match="mode stack snapshot is a tuple of classes"):
        gs.to_bytes()

    def f() -> Any:
        return cell_value

    cell_value = 3
    b = tw.GuardBuilder({"x": 3}, None, f)
    b.alias("L['x']", "C['cell_value']")
    with pytest.raises(tw.NotSerializable, match="closure cell"):
        b.build().to_bytes()


# -- references --------------------------------------------------------------------------------------


def one_guard(method: str, value: Any, *args: Any, f_globals: dict | None = None) -> tw.GuardSet:
    b = tw.GuardBuilder({"v": value}, f_globals)
    getattr(b, method)("L['v']", *args)
    return b.build()


def test_references_by_kind_round_trip() -> None:
    cases = [
        ("type_match", fx.Point(1, 2)),
        ("id_match", fx.Point),
        ("id_match", fx.helper),
        ("id_match", fx.wrapped_helper),  # a functools.wraps wrapper held by its module
        ("id_match", fx.decorated),  # a wrapper that carries the wrapped function's name
        ("id_match", len),
        ("id_match", fx),  # a module
        ("id_match", NotImplemented),
        ("id_match", None),
        ("equals", fx.Color.RED),
        ("equals", (fx.Mode.EVAL, frozenset({fx.Color.GREEN}))),
        ("code_match", fx.helper),
        ("code_match", fx.make_closure(3)),  # a closure's code: found in its function's constants
        ("code_match", fx.Point.norm),
        ("dict_contains", {fx.Point: 1}, fx.Point),
    ]
    for method, value, *extra in cases:
        gs = one_guard(method, value, *extra)
        loaded = tw.GuardSet.from_bytes(gs.to_bytes())
        assert loaded.check({"v": value}), (method, value)
        assert [s.describe() for s in loaded.guards] == [s.describe() for s in gs.guards]


@pytest.mark.parametrize(
    "method,value,why",
    [
        ("id_match", fx.Point(1, 2), "not held by any module attribute"),
        ("id_match", fx.make_closure(1), "closure or lambda"),
        ("id_match", 12345, "identity of a int cannot survive"),
        ("id_match", (1, 2), "identity of a tuple"),
        ("id_match", fx.decorated.__wrapped__, "names another object"),
        ("code_match", lambda: 0, "does not lead back to this code object"),
        ("dict_version", {}, "dict version"),
    ],
)
def test_unnameable_objects_are_refused_with_their_source(method: str, value: Any, why: str) -> None:
    gs = one_guard(method, value)
    with pytest.raises(tw.NotSerializable) as e:
        gs.to_bytes()
    assert [(k, s) for k, s, _ in e.value.guards] == [(gs.guards[0].kind.name, "L['v']")]
    assert why in str(e.value), str(e.value)
    # Dropping names it: by source, or by kind.
    for drop in (["L['v']"], [gs.guards[0].kind.name]):
        loaded = tw.GuardSet.from_bytes(gs.to_bytes(drop=drop))
        assert len(loaded) == 0 and loaded.dropped[0][:2] == (gs.guards[0].kind.name, "L['v']")
        assert "dropped at save (1)" in loaded.explain()


def test_a_class_defined_in_a_function_is_refused() -> None:
    class Local:
        pass

    with pytest.raises(tw.NotSerializable, match="defined inside a function"):
        one_guard("type_match", Local()).to_bytes()


def test_every_refused_guard_is_listed_and_drop_must_name_something() -> None:
    b = tw.GuardBuilder({"a": fx.Point(0, 0), "d": {}, "k": 1})
    b.id_match("L['a']")
    b.dict_version("L['d']")
    b.predicate(lambda v: True, source="L['k']")
    b.predicate(lambda f_locals: True)
    b.type_match("L['k']")
    gs = b.build()
    with pytest.raises(tw.NotSerializable) as e:
        gs.to_bytes()
    assert [(k, s) for k, s, _ in e.value.guards] == [
        ("ID_MATCH", "L['a']"),
        ("DICT_VERSION", "L['d']"),
        ("LAMBDA", "L['k']"),
        ("LAMBDA", None),
    ]
    with pytest.raises(ValueError, match="no guard of this set has"):
        gs.to_bytes(drop=["L['nope']", "LAMBDA", "L['a']", "DICT_VERSION"])
    before = gs.explain(), len(gs)
    loaded = tw.GuardSet.from_bytes(gs.to_bytes(drop=["LAMBDA", "L['a']", "DICT_VERSION"]))
    assert [s.kind.name for s in loaded.guards] == ["TYPE_MATCH"]
    assert len(loaded.dropped) == 4
    # Serializing never changes the live set.
    assert (gs.explain(), len(gs)) == before
    assert not gs.check({"a": fx.Point(0, 0), "d": {}, "k": "1"})


def test_a_closure_cell_source_is_refused() -> None:
    def f() -> Any:
        return cell_value

    cell_value = 3
    b = tw.GuardBuilder({}, None, f)
    b.equals("C['cell_value']")
    with pytest.raises(tw.NotSerializable, match="closure cell"):
        b.build().to_bytes()


def make_module(name: str, source: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__file__ = f"<{name}>"
    exec(compile(source, f"<{name}>", "exec"), mod.__dict__)  # test-only module, not data
    sys.modules[name] = mod
    return mod


def test_references_are_revalidated_on_load() -> None:
    mod = make_module("tw_serial_tmp_mod", "class K:\n    pass\ndef fn(x):\n    return x + 1\n")
    try:
        b = tw.GuardBuilder({"k": mod.K(), "f": mod.fn})
        b.type_match("L['k']")
        b.id_match("L['f']")
        blob = b.build().to_bytes()
        assert tw.GuardSet.from_bytes(blob).check({"k": mod.K(), "f": mod.fn})
        # A different function under the same name: a load error, not a silent match.
        exec("def fn(x):\n    return x + 2\n", mod.__dict__)
        with pytest.raises(tw.FormatError, match=r"tw_serial_tmp_mod:fn .*fingerprint") as e:
            tw.GuardSet.from_bytes(blob)
        assert e.value.offset is not None
        # A missing attribute.
        del mod.fn
        with pytest.raises(tw.FormatError, match=r"tw_serial_tmp_mod:fn .*does not resolve"):
            tw.GuardSet.from_bytes(blob)
        # A module that is not imported: refused unless allowed.
        del sys.modules["tw_serial_tmp_mod"]
        with pytest.raises(tw.FormatError, match="refused: module 'tw_serial_tmp_mod' is not imported"):
            tw.GuardSet.from_bytes(blob)
        with pytest.raises(tw.FormatError, match="cannot be imported"):
            tw.GuardSet.from_bytes(blob, allow_modules=["tw_serial_tmp_mod"])
        asked = []

        def resolve(module: str, qualname: str) -> Any:
            asked.append((module, qualname))
            return {"K": mod.K, "fn": fx.helper}[qualname]

        with pytest.raises(tw.FormatError, match="fingerprint"):  # resolve's answers are checked too
            tw.GuardSet.from_bytes(blob, resolve=resolve)
        assert asked == [("tw_serial_tmp_mod", "K"), ("tw_serial_tmp_mod", "fn")]
    finally:
        sys.modules.pop("tw_serial_tmp_mod", None)


def crafted(kind: int, module: str, qualname: str, guard: tw.GuardKind = tw.GuardKind.TYPE_MATCH) -> bytes:
    """Bytes with one guard on L['v'] whose operand is the reference given (the encoder does not
    check what a reference names: a hostile writer would not either)."""
    from tripwire import _core

    marker = object()
    decl = _core.GuardDecl(guard, _core.SourcePath(tw.RootKind.LOCAL, 0, [], ["L['v']"]), 1, id=0)
    return _core.encode_guard_set(
        [decl],
        ["v", marker],
        [0, 1],
        [""],
        [[]],
        [(kind, module, qualname, b"x" * 16)],
        lambda o: 0,
        None,
        [],
        [],
        False,
        "test",
        (3, 11),
    )


def test_a_reference_of_the_wrong_kind_is_refused_before_its_fingerprint() -> None:
    """A reference naming a function as a type (or a class as a function...) fails on its kind,
    before any attribute of the object is read for the fingerprint."""
    for kind, qualname, what in [
        (0, "helper", "function, not a type"),
        (1, "Point", "type, not a function"),
        (2, "CONFIG", "Config, not a function"),
    ]:
        with pytest.raises(tw.FormatError, match=what):
            tw.GuardSet.from_bytes(crafted(kind, "serial_fixtures", qualname))
    with pytest.raises(tw.FormatError, match="fingerprint"):  # the right kind, a made-up fingerprint
        tw.GuardSet.from_bytes(crafted(0, "serial_fixtures", "Point"))


def test_a_probe_reference_cannot_choose_what_every_check_runs() -> None:
    """A GLOBAL_STATE probe is called by every check. os.abort takes no argument and os is
    always imported: bytes naming it as a probe (with its true fingerprint) must not load unless
    the caller admits the module."""
    from tripwire import _core
    from tripwire.references import RefKind, fingerprint

    decl = _core.GuardDecl(tw.GuardKind.GLOBAL_STATE, None, 0, 1, id=0)
    data = _core.encode_guard_set(
        [decl],
        [os.abort, 0],
        [0, 0],
        ["probe"],
        [[]],
        [(int(RefKind.FUNCTION), "posix", "abort", fingerprint(RefKind.FUNCTION, os.abort))],
        lambda o: 0,
        None,
        [],
        [],
        False,
        "test",
        (3, 11),
    )
    with pytest.raises(tw.FormatError, match="called by every check"):
        tw.GuardSet.from_bytes(data)
    with pytest.raises(tw.FormatError, match="called by every check"):
        tw.GuardSet.from_bytes(data, f_globals=fx.__dict__)  # the caller's module is not posix
    # A probe of the caller's own module loads (the f_globals given), and runs.
    b = tw.GuardBuilder({}, fx.__dict__)
    b.global_state(fx.probe_mode)
    blob = b.build().to_bytes()
    with pytest.raises(tw.FormatError, match="called by every check"):
        tw.GuardSet.from_bytes(blob)
    assert tw.GuardSet.from_bytes(blob, f_globals=fx.__dict__).check({})
    assert tw.GuardSet.from_bytes(blob, allow_modules=["serial_fixtures"]).check({})


def test_no_metaclass_hook_runs_while_saving_or_loading() -> None:
    """References are named and resolved through type's own descriptors and __dict__ entries: a
    metaclass __getattribute__ or a property named __mro__ never runs (it could lie, or mutate)."""
    calls: list[str] = []

    class Meta(type):
        @property
        def __mro__(cls) -> Any:  # type: ignore[override]
            calls.append("__mro__ property")
            return (cls, object)

        def __getattribute__(cls, name: str) -> Any:
            calls.append(name)
            return type.__getattribute__(cls, name)

    mod = make_module("tw_serial_meta", "")
    try:
        K = Meta("K", (), {"__module__": "tw_serial_meta", "__qualname__": "K"})
        mod.K = K
        b = tw.GuardBuilder({"v": K(), "k": K})
        b.type_match("L['v']")
        b.id_match("L['k']")
        gs = b.build()
        calls.clear()
        data = gs.to_bytes()
        loaded = tw.GuardSet.from_bytes(data)
        assert calls == []
        assert loaded.check({"v": K(), "k": K})
    finally:
        sys.modules.pop("tw_serial_meta", None)


def test_an_edited_method_changes_the_class_fingerprint() -> None:
    mod = make_module("tw_serial_edit", "class K:\n    def m(self):\n        return 1\n")
    try:
        blob = one_guard("type_match", mod.K()).to_bytes()
        exec("class K:\n    def m(self):\n        return 2\n", mod.__dict__)
        with pytest.raises(tw.FormatError, match="fingerprint"):
            tw.GuardSet.from_bytes(blob)
    finally:
        sys.modules.pop("tw_serial_edit", None)


def test_only_enum_members_may_stand_inside_containers() -> None:
    """A reference nested in a constant is hashed when the set or dict is built: only enum
    members may be there (the decoder refuses any other kind, naming the offset)."""
    blob = one_guard("equals", (fx.Color.RED,)).to_bytes()
    body = bytearray(blob[64:])
    # Turn the enum-member reference (kind 3) into an object reference (kind 4).
    refs_at = body.index(b"\x02", 2 + body[3] + 2)  # after the strings section
    assert body[refs_at] == 2
    i = refs_at + 3  # tag, section length (1 byte), count (1 byte): the first reference's kind
    assert body[i] == 3
    body[i] = 4
    with pytest.raises(tw.FormatError, match="object reference inside a container"):
        tw.GuardSet.from_bytes(rewrap(bytes(body)))


def test_inspection_shows_references_inside_constants() -> None:
    """describe_bytes shows an enum member inside a constant (a tuple, a dict key) by name, as
    the load resolves it: inspection builds the constants with its stand-ins for references,
    which the engine admits inside containers only when they hash by identity."""
    b = tw.GuardBuilder({"t": (fx.Color.RED, 1), "d": {fx.Color.GREEN: 1, "k": 2}, "c": fx.Color.RED})
    b.equals("L['t']")
    b.dict_keys("L['d']")
    b.equals("L['c']")
    gs = b.build()
    listing = tw.serialization.guard_lines(gs.to_bytes())
    red, blue = "<enum_member serial_fixtures:Color.RED>", "<enum_member serial_fixtures:Color.GREEN>"
    assert listing == [
        f"EQUALS_MATCH: L['t'] == ({red}, 1)",
        f"DICT_KEYS: list(dict.keys(L['d'])) == [{blue}, 'k']",
        f"EQUALS_MATCH: L['c'] == {red}",
    ]
    loaded = tw.GuardSet.from_bytes(gs.to_bytes())
    assert loaded.check({"t": (fx.Color.RED, 1), "d": {fx.Color.GREEN: 0, "k": 0}, "c": fx.Color.RED})
    assert not loaded.check({"t": (fx.Color.GREEN, 1), "d": {fx.Color.GREEN: 0, "k": 0}, "c": fx.Color.RED})


def test_allow_modules_imports_only_admitted_prefixes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "twpkg_serial"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "types_mod.py").write_text("class T:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import twpkg_serial.types_mod as tm

    blob = one_guard("type_match", tm.T()).to_bytes()
    for name in ("twpkg_serial.types_mod", "twpkg_serial"):
        sys.modules.pop(name)
    with pytest.raises(tw.FormatError, match="refused"):
        tw.GuardSet.from_bytes(blob, allow_modules=["twpkg"])  # a prefix of the name, not of the package
    assert "twpkg_serial.types_mod" not in sys.modules
    loaded = tw.GuardSet.from_bytes(blob, allow_modules=["twpkg_serial"])
    import twpkg_serial.types_mod as tm2

    assert loaded.check({"v": tm2.T()}) and not loaded.check({"v": tm.T()})  # the re-imported class


def test_g_roots_need_a_module_or_f_globals() -> None:
    g = {"x": 1}
    b = tw.GuardBuilder({}, g)
    b.equals("G['x']")
    blob = b.build().to_bytes()
    with pytest.raises(tw.FormatError, match="pass f_globals"):
        tw.GuardSet.from_bytes(blob)
    assert tw.GuardSet.from_bytes(blob, f_globals={"x": 1}).check({})
    assert not tw.GuardSet.from_bytes(blob, f_globals={"x": 2}).check({})


def test_baselines_are_saved() -> None:
    b = tw.GuardBuilder({"x": 1})
    b.type_match("L['x']")
    b.baseline("dispatch", (frozenset({"CPU"}), frozenset()))
    b.baseline("mode", fx.Mode.EVAL)
    gs = b.build()
    loaded = tw.GuardSet.from_bytes(gs.to_bytes())
    assert dict(loaded.baselines) == dict(gs.baselines)
    assert loaded.baselines["mode"] is fx.Mode.EVAL


def test_strict_and_stacks_survive() -> None:
    b = tw.GuardBuilder({"x": 1})
    b.type_match("L['x']")
    gs = b.build(strict=True)
    loaded = tw.GuardSet.from_bytes(gs.to_bytes())
    assert loaded.strict and loaded.guards[0].stack == gs.guards[0].stack
    assert "test_serialization.py" in loaded.guards[0].stack[-1]


def test_a_set_that_can_never_pass_again_is_refused(collect: Any) -> None:
    mod = make_module("tw_serial_dying", "class K:\n    pass\n")
    try:
        gs = one_guard("type_match", mod.K())
    finally:
        del sys.modules["tw_serial_dying"]
    del mod
    collect()
    assert gs.invalid
    with pytest.raises(tw.NotSerializable, match=r"has died|never pass"):
        gs.to_bytes()


def test_the_bytes_are_proven_before_they_are_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    from tripwire import serialization

    gs = one_guard("equals", 5)
    real = serialization._spec

    def lying(*args: Any, **kwargs: Any) -> Any:
        s = real(*args, **kwargs)
        return tw.GuardSpec(s.kind, s.source, (6,), s.index, s.stack)

    monkeypatch.setattr(serialization, "_spec", lying)
    with pytest.raises(tw.FormatError, match="do not rebuild"):
        gs.to_bytes()


# -- SHAPE ---------------------------------------------------------------------------------------------


def _shape_set(seed: int) -> tuple[tw.GuardSet, dict, Any]:
    """A generated SHAPE relation set (tests/python/support/shape_cases.py) over L[...] and G['g']."""
    r = random.Random(seed)
    case = shape_cases.relation_set(r)
    f_globals: dict[str, Any] = {"g": 0}
    return tw.GuardSet(case.specs, f_globals), f_globals, r


@pytest.mark.parametrize("seed", range(examples(40)))
def test_shape_relation_sets_answer_as_the_live_set(seed: int) -> None:
    """Generated relation sets (ints near 2**63, negative divisors, NaN and infinities for float
    symbols, wrong-typed and missing values) answer after a round trip exactly as before: check,
    the first failure with its reason and values, every failure, and the merge/implication status
    of every relation."""
    live, f_globals, r = _shape_set(seed)
    loaded = tw.GuardSet.from_bytes(live.to_bytes(), f_globals=f_globals)
    assert [s.describe() for s in loaded.guards] == [s.describe() for s in live.guards]
    assert loaded._shape_info["relations"] == live._shape_info["relations"]
    for _ in range(6):
        f_locals, g = shape_cases.frame(r)
        f_globals.clear()
        f_globals.update(g)
        assert answers(loaded, f_locals) == answers(live, f_locals), f_locals
        f = loaded.why_not(f_locals)
        if f is not None and f.kind == "SHAPE":
            assert f.actual == live.why_not(f_locals).actual


_SHAPE_TEXTS = [
    "((6*L['x'].size()[0]) % 4) == 0",
    "2 <= L['x'].size()[1] <= 1024",
    "L['x'].stride()[0] == L['x'].size()[1] + L['x'].storage_offset()",
    "Ne(L['n'] // 3, -1)",
    "L['n'] <= 2**63",
    "not math.isnan(L['f'])",
    "L['f'] < L['n']",
]


def _shape_example() -> dict[str, Any]:
    return {"x": shape_cases.FakeTensor((8, 3), (3, 1), 0), "n": 7, "f": 2.5}


def _shape_variants() -> list[dict[str, Any]]:
    ft = shape_cases.FakeTensor
    return [
        _shape_example(),
        {"x": ft((9, 3), (3, 1), 0), "n": 7, "f": 2.5},
        {"x": ft((8, 1025), (1025, 1), 0), "n": 7, "f": 2.5},
        {"x": ft((8, 3), (5, 1), 1), "n": 7, "f": 2.5},
        {"x": ft((8, 3), (3, 1), 0), "n": -3, "f": -1e300},
        {"x": ft((8, 3), (3, 1), 0), "n": 2**63 + 1, "f": 2.5},
        {"x": ft((8, 3), (3, 1), 0), "n": 7, "f": float("nan")},
        {"x": ft((8, 3), (3, 1), 0), "n": 7, "f": float("inf")},
        {"x": ft((8, 3), (3, 1), 0), "n": 7.0, "f": 2.5},
        {"x": ft((8,), (3, 1), 0), "n": 7, "f": 2.5},
        {"n": 7, "f": 2.5},
    ]


def _shape_blob() -> bytes:
    b = tw.GuardBuilder(_shape_example())
    for text in _SHAPE_TEXTS:
        b.shape(text)
    b.type_match("L['n']", int)
    return b.build().to_bytes()


_SHAPE_CHILD = """
import json, sys
sys.path[:0] = [{here!r}, {here!r} + "/../support", {here!r} + "/../../oracle"]
import shape_cases, tripwire as tw
from test_serialization import _shape_variants
gs = tw.GuardSet.from_bytes(open({path!r}, "rb").read())
out = []
for x in _shape_variants():
    f = gs.why_not(x)
    out.append([gs.check(x), None if f is None else [f.source, f.kind, f.reason]])
print(json.dumps(out))
"""


def test_shape_relations_load_in_a_fresh_process(tmp_path: Path) -> None:
    blob = _shape_blob()
    gs = tw.GuardSet.from_bytes(blob)
    p = tmp_path / "shape.twg"
    p.write_bytes(blob)
    expected = []
    for x in _shape_variants():
        f = gs.why_not(x)
        expected.append([gs.check(x), None if f is None else [f.source, f.kind, f.reason]])
    assert expected[0] == [True, None] and sum(1 for ok, _ in expected if not ok) == len(expected) - 1
    assert "is false with L['f'] = nan" in str(expected[6][1])  # NaN fails Not(isnan(...))
    out = subprocess.run(
        [sys.executable, "-c", _SHAPE_CHILD.format(here=str(HERE), path=str(p))],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert json.loads(out.stdout) == json.loads(json.dumps(expected))
    listing = tw.serialization.describe_bytes(blob)
    for text in _SHAPE_TEXTS[:3]:
        assert f"SHAPE: {tw.shapes.parse(text).text}" in listing


def _replace_string(blob: bytes, old: str, new: str) -> bytes:
    """``blob`` with one string of its strings section replaced (same length, re-hashed)."""
    a, b = old.encode(), new.encode()
    assert len(a) == len(b) and blob.count(a) == 1, old
    return rewrap(blob[64:].replace(a, b))


@pytest.mark.parametrize(
    ("new", "why"),
    [
        # a text that does not parse (the codec compiles each relation alone)
        ("((6*L['x'].size()[0]) % 4) === ", "SHAPE relation is not valid"),
        # symbols that are not the stored ones: another size, another local, another spelling
        ("((6*L['x'].size()[1]) % 4) == 0", "relation names"),
        ("((6*L['y'].size()[0]) % 4) == 0", "relation names"),
        ("((6*L['x'].shape[0])  % 4) == 0", "relation names"),
        # the relation with a comment: not the text the builder stores (the loader's check)
        ("((6*L['x'].size()[0])%4)==0 #xx", "canonical"),
    ],
)
def test_a_corrupted_shape_text_is_a_format_error(new: str, why: str) -> None:
    blob = _shape_blob()
    bad = _replace_string(blob, _SHAPE_TEXTS[0], new)
    with pytest.raises(tw.FormatError, match=why):
        tw.GuardSet.from_bytes(bad)
    with pytest.raises(tw.FormatError, match=why):
        tw.serialization.describe_bytes(bad)


def test_a_swapped_symbol_order_is_a_format_error() -> None:
    """The stored symbols must be the text's, in the text's order: a relation whose symbols were
    swapped would read each value under the other's name."""
    blob = _shape_blob()
    text = "L['f'] < L['n']"
    bad = _replace_string(blob, text, "L['n'] > L['f']")
    with pytest.raises(tw.FormatError, match=r"symbol 0 is L\['f'\] but the relation names L\['n'\]"):
        tw.GuardSet.from_bytes(bad)


def test_every_corrupted_byte_of_a_shape_set_is_refused_or_answers_as_its_guards() -> None:
    """Every byte of a SHAPE set's body changed (re-hashed, so the parser sees it): the load
    raises FormatError, or the loaded set answers on every variant exactly as the reference does
    for the guards it says it has. Never a crash, never a decision its own guards do not make."""
    blob = _shape_blob()
    body = blob[64:]
    outcomes = {"ok": 0, "error": 0}
    step = 1 if examples(2) > 1 else 3
    for i in range(0, len(body), step):
        for delta in (1, 0x80):
            bad = bytearray(body)
            bad[i] = (bad[i] + delta) & 0xFF
            try:
                gs = tw.GuardSet.from_bytes(rewrap(bytes(bad)))
            except tw.FormatError as e:
                assert "at byte" in str(e) or "guard program" in str(e), str(e)
                outcomes["error"] += 1
                continue
            outcomes["ok"] += 1
            for x in _shape_variants():
                want = reference.first_failure(gs.guards, x)
                f = gs.why_not(x)
                assert gs.check(x) == (want is None), (i, delta, x)
                assert (None if f is None else f.guard.index) == (None if want is None else want[0].index)
    assert outcomes["error"] > outcomes["ok"]


# -- bad input ---------------------------------------------------------------------------------------


def sample_blob() -> bytes:
    return tw.guards_for(fx.frames()[1], fx.__dict__).to_bytes()


def rewrap(body: bytes, version: int = 1) -> bytes:
    """A header for ``body`` written from docs/format.md (independently of the encoder)."""
    head = b"\x89TWG\r\n\x1a\n" + struct.pack("<HH16sI", version, 0, b"test", len(body))
    return head + hashlib.sha256(body).digest() + body


def test_header_layout_matches_the_documented_format() -> None:
    blob = sample_blob()
    assert blob[:8] == b"\x89TWG\r\n\x1a\n"
    version, flags, writer, length = struct.unpack("<HH16sI", blob[8:32])
    assert (version, flags, writer.rstrip(b"\0").decode(), length) == (1, 0, tw.__version__, len(blob) - 64)
    assert blob[32:64] == hashlib.sha256(blob[64:]).digest()
    assert rewrap(blob[64:])[64:] == blob[64:]
    assert tw.GuardSet.from_bytes(rewrap(blob[64:])).check(fx.frames()[1])


def test_content_hash_is_sha256_on_every_length_around_the_blocks() -> None:
    """The encoder's digest is hashlib's on bodies of every length over three SHA-256 blocks (the
    padding boundaries at 55/56 and 119/120 bytes a block): the codec's own rounds, checked
    against an independent implementation."""
    seen = set()
    for n in range(200):
        b = tw.GuardBuilder({"x": "y" * n})
        b.equals(tw.Source.local("x"), "y" * n)
        blob = b.build().to_bytes()
        body = blob[64:]
        seen.add(len(body) % 64)
        assert blob[32:64] == hashlib.sha256(body).digest(), n
    assert len(seen) == 64  # every offset within the last block was reached


def raises_format_error(data: bytes) -> tw.FormatError:
    with pytest.raises(tw.FormatError) as e:
        tw.GuardSet.from_bytes(data)
    assert isinstance(e.value, ValueError)
    return e.value


def test_truncated_data_names_where() -> None:
    blob = sample_blob()
    for n in range(0, len(blob), max(1, len(blob) // 97)):
        e = raises_format_error(blob[:n])
        assert "truncated" in str(e) or "wrong magic" in str(e), (n, str(e))
        assert e.offset is not None and e.offset <= max(n, 28)


def test_flipped_bits_fail_the_content_hash() -> None:
    blob = sample_blob()
    for i in range(64, len(blob), 3):
        bad = bytearray(blob)
        bad[i] ^= 1 << (i % 8)
        e = raises_format_error(bytes(bad))
        assert "content hash mismatch" in str(e) and e.offset == 32


def test_wrong_magic_future_version_and_flags() -> None:
    blob = sample_blob()
    assert "wrong magic" in str(raises_format_error(b"\x80\x04\x95" + blob[3:]))  # a pickle
    future = rewrap(blob[64:], version=2)
    e = raises_format_error(future)
    assert "format version 2 (written by tripwire test)" in str(e) and "newer" in str(e) and e.offset == 8
    flags = bytearray(blob)
    flags[10] = 1
    assert "flags" in str(raises_format_error(bytes(flags)))


def test_huge_declared_lengths_allocate_nothing() -> None:
    # Python version, then the strings section declaring 2**63 strings in a 10-byte section.
    body = b"\x03\x0b" + b"\x01\x0a" + b"\xff" * 9 + b"\x00"
    e = raises_format_error(rewrap(body))
    assert "varint" in str(e) or "declares" in str(e)
    body = b"\x03\x0b" + b"\x01\x05" + b"\xff\xff\xff\xff\x0f"
    e = raises_format_error(rewrap(body))
    assert "declares 4294967295 items but only 0 bytes follow" in str(e) and e.offset == 68
    body = b"\x03\x0b" + b"\x01\xff\xff\xff\xff\x0f"
    assert "section declares 4294967295 bytes" in str(raises_format_error(rewrap(body)))


def test_deep_nesting_is_refused() -> None:
    value = b"\x0a\x01" * 300 + b"\x00"  # 300 nested one-element tuples around None
    body = (
        b"\x03\x0b"
        + hostile_docs.section(1, b"\x00")
        + hostile_docs.section(2, b"\x00")
        + hostile_docs.section(3, b"\x01\x00" + value)
        + hostile_docs.section(4, b"\x00")
        + hostile_docs.section(5, b"\x00\x00\x00\x00")
    )
    e = raises_format_error(rewrap(body))
    assert "nests deeper than 128" in str(e)
    shallow = (
        b"\x03\x0b"
        + hostile_docs.section(1, b"\x00")
        + hostile_docs.section(2, b"\x00")
        + hostile_docs.section(3, b"\x01\x00" + b"\x0a\x01" * 3 + b"\x00")
        + hostile_docs.section(4, b"\x00")
        + hostile_docs.section(5, b"\x00\x00\x00\x00")
    )
    assert len(tw.GuardSet.from_bytes(rewrap(shallow))) == 0  # the same layout, shallow: loads


def test_invalid_records_are_format_errors() -> None:
    blob = sample_blob()
    body = bytearray(blob[64:])
    # Corrupt every byte of the body in turn (re-hashed, so the parser sees it): each load either
    # succeeds or raises FormatError; nothing else, and never a crash.
    outcomes = {"ok": 0, "error": 0}
    for i in range(len(body)):
        for delta in (1, 0x80):
            bad = bytearray(body)
            bad[i] = (bad[i] + delta) & 0xFF
            try:
                gs = tw.GuardSet.from_bytes(rewrap(bytes(bad)))
                outcomes["ok"] += 1
                # Everything is checked at load: what loads builds its diagnostics (lazily, on
                # the first one) without an error.
                assert len(gs.guards) == len(gs)
                gs.explain()
                gs.failures({})
            except tw.FormatError as e:
                assert "at byte" in str(e) or "guard program" in str(e), str(e)
                outcomes["error"] += 1
    assert outcomes["error"] > outcomes["ok"]


# -- the lazy diagnostics of a loaded set (specs built on the first diagnostic) -----------------------


def test_a_source_text_that_lies_is_refused_at_load() -> None:
    """The printed texts of a source (what explain() and why_not show) are checked against its
    steps by from_bytes itself (runtime/serial/loaded.cpp), not when a diagnostic is first asked:
    bytes whose text says L['w'] for a guard that reads L['v'] do not load."""
    gs = one_guard("equals", 5)
    blob = gs.to_bytes()
    for new in ("L['w']", "G['v']", 'L["v"]'):
        bad = _replace_string(blob, "L['v']", new)
        with pytest.raises(tw.FormatError, match="source texts do not match"):
            tw.GuardSet.from_bytes(bad)
    b = tw.GuardBuilder({"d": {"k": fx.Point(1, 2)}})
    b.type_match("L['d']['k'].x")
    blob = b.build().to_bytes()
    bad = _replace_string(blob, "L['d']['k'].x", "L['d']['k'].y")  # the last step's text
    with pytest.raises(
        tw.FormatError, match=r"source texts do not match its steps \('L\['d'\]\['k'\]\.y' is"
    ):
        tw.GuardSet.from_bytes(bad)


def test_a_property_method_call_source_round_trips() -> None:
    """``getattr(X, 'size')()`` (an ATTR named like a tensor property, then a weakref call) prints
    through getattr so that it does not read back as the SIZE step; the loader's renderers (C++
    at load, Python on the first diagnostic) print it the same way (the Python one did not: such
    a set could not be saved)."""
    import weakref

    class Holder:
        pass

    t, target = Holder(), fx.Point(1, 2)
    t.size = weakref.ref(target)  # type: ignore[attr-defined]
    b = tw.GuardBuilder({"t": t})
    b.type_match("getattr(L['t'], 'size')()")
    gs = b.build()
    loaded = tw.GuardSet.from_bytes(gs.to_bytes())
    assert loaded.check({"t": t})
    assert str(loaded.guards[0].source) == "getattr(L['t'], 'size')()" == str(gs.guards[0].source)
    assert "getattr(L['t'], 'size')()" in loaded.explain()


def test_loaded_diagnostics_equal_the_live_ones_whatever_is_asked_first() -> None:
    def live(frame: dict) -> tw.GuardSet:  # one install site for every set (explain shows it)
        return tw.guards_for(frame, fx.__dict__)

    for frame in fx.frames():
        blob = live(frame).to_bytes()
        for first in ("guards", "explain", "why_not", "iter"):
            gs = live(frame)  # checked once on its example, as built
            loaded = tw.GuardSet.from_bytes(blob)
            assert loaded._built is None  # nothing built by the load
            assert loaded.check(frame)
            for v in fx.variants(frame)[:3]:
                assert loaded.check(v) == gs.check(v)
            if first == "guards":
                assert [s.describe() for s in loaded.guards] == [s.describe() for s in gs.guards]
            elif first == "explain":
                assert loaded.explain().splitlines()[2:] == gs.explain().splitlines()[2:]
            elif first == "why_not":
                for v in fx.variants(frame):
                    a, b = gs.why_not(v), loaded.why_not(v)
                    assert (a is None) == (b is None)
                    if a is not None and b is not None:
                        assert (a.guard.index, a.kind, a.source, a.reason) == (
                            b.guard.index,
                            b.kind,
                            b.source,
                            b.reason,
                        )
            else:
                assert [s.index for s in loaded] == [s.index for s in gs]


def test_a_load_moves_the_declarations_into_the_set() -> None:
    # from_bytes compiles the decoded declarations without a copy: the document gives them up
    # (and says so, rather than answering with an empty list), the set gives them back for its
    # diagnostics, exactly as decoded; install stacks come from the document's string table.
    from tripwire import _core, serialization

    frame = fx.frames()[0]
    gs = tw.guards_for(frame, fx.__dict__)
    blob = gs.to_bytes()
    doc = _core.decode_guard_set(blob)
    before = [(d.kind, d.id, d.operand, d.operand2, d.n) for d in doc.decls()]
    stacks = [stack for _, stack, _ in doc.guard_info()]
    assert all(stacks) and stacks == [list(s.stack) for s in gs.guards]
    loaded = serialization.loads(tw.GuardSet, blob)
    core = loaded._lazy[0]
    with pytest.raises(RuntimeError, match="moved into the guard set"):
        core.decls()
    with pytest.raises(RuntimeError, match="moved into the guard set"):
        core.decl(0)
    assert [(d.kind, d.id, d.operand, d.operand2, d.n) for d in loaded._decls()] == before
    assert [stack for _, stack, _ in core.guard_info()] == stacks
    # A second set from the same document is refused, never built from nothing.
    again = _core.GuardSetCore.__new__(tw.GuardSet)
    with pytest.raises(RuntimeError, match="moved into the guard set"):
        _core.GuardSetCore.__init__(again, core, list(loaded._lazy[1]), None, False, None)
    assert [s.describe() for s in loaded.guards] == [s.describe() for s in gs.guards]


def test_a_global_rebound_before_the_first_diagnostic() -> None:
    """The lazily built specs use the objects resolved at load, never a second lookup by name: a
    module global rebound between the load and the first diagnostic is reported as the guard
    failing, with the object the set was loaded with; once that object dies the set is invalid
    and the spec shows it dead (type name and address kept from the load)."""
    import gc

    mod = make_module("tw_serial_rebind_mod", "def fn(x):\n    return x + 1\ndef other(x):\n    return x\n")
    try:
        b = tw.GuardBuilder({}, mod.__dict__)
        b.id_match("G['fn']")
        blob = b.build().to_bytes()
        loaded = tw.GuardSet.from_bytes(blob)
        original = mod.fn
        address = id(original)
        mod.fn = mod.other  # rebound before any diagnostic
        assert not loaded.check({})
        f = loaded.why_not({})
        assert f is not None and (f.kind, f.source) == ("ID_MATCH", "G['fn']")
        assert f"{address:#x}" in loaded.guards[0].describe()  # the object loaded, not mod.other
        assert f"{id(mod.other):#x}" not in loaded.explain()
        # The object dies before a set's first diagnostic: shown dead, the set invalid.
        mod.fn = original
        second = tw.GuardSet.from_bytes(blob)
        mod.fn = mod.other
        del original, f, b  # the Failure holds what it expected, the builder its specs
        gc.collect()
        assert second.invalid and not second.check({})
        spec = second.guards[0]
        assert type(spec.args[0]) is tw.catalogue.Weak and spec.args[0].get() is None
        assert repr(spec.args[0]) == f"<dead function at {address:#x}>"
        assert "INVALID" in second.explain()
    finally:
        sys.modules.pop("tw_serial_rebind_mod", None)


def test_threads_diagnose_a_fresh_loaded_set_while_another_checks() -> None:
    """Several threads ask a fresh loaded set for explain(), why_not and guards at once (the lazy
    build races) while another thread checks: every answer is the one of a set diagnosed alone."""
    import threading

    frame = fx.frames()[0]
    gs = tw.guards_for(frame, fx.__dict__)
    blob = gs.to_bytes()
    variants = fx.variants(frame)
    reference_set = tw.GuardSet.from_bytes(blob)
    want_why = [
        None if (f := reference_set.why_not(v)) is None else (f.guard.index, f.reason) for v in variants
    ]
    want_guards = [s.describe() for s in reference_set.guards]
    for _ in range(gc_stress_scaled(20)):
        loaded = tw.GuardSet.from_bytes(blob)
        errors: list[BaseException] = []
        start = threading.Barrier(5)

        def diagnose(loaded: tw.GuardSet = loaded) -> None:
            try:
                start.wait()
                assert [s.describe() for s in loaded.guards] == want_guards
                got = [
                    None if (f := loaded.why_not(v)) is None else (f.guard.index, f.reason) for v in variants
                ]
                assert got == want_why
                assert "GuardSet:" in loaded.explain()
            except BaseException as e:
                errors.append(e)

        def check(loaded: tw.GuardSet = loaded) -> None:
            try:
                start.wait()
                for v in variants * 5:
                    assert loaded.check(v) == gs.check(v)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=diagnose) for _ in range(4)] + [threading.Thread(target=check)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert loaded._built is not None and loaded._lazy is None


def test_a_collection_during_the_lazy_build_reenters_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A collection that starts inside the lazy build (any allocation can start one) and runs
    code that diagnoses the same set builds it re-entrantly; both builds publish the same
    specs, and nothing is left half-built."""
    import gc

    from tripwire import serialization

    frame = fx.frames()[0]
    gs = tw.guards_for(frame, fx.__dict__)
    loaded = tw.GuardSet.from_bytes(gs.to_bytes())
    seen: list[int] = []
    inside = [0]
    real = serialization.loaded_specs

    def tracked(lazy: tuple, decls: list) -> list:
        inside[0] += 1
        try:
            return real(lazy, decls)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(serialization, "loaded_specs", tracked)

    def during_collection(phase: str, info: dict) -> None:
        if phase == "start" and inside[0] and not seen:
            seen.append(len(loaded.guards))  # re-enters the lazy build from inside the collection

    old = gc.get_threshold()
    gc.callbacks.append(during_collection)
    gc.set_threshold(1)
    try:
        text = loaded.explain()
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(during_collection)
    assert seen == [len(gs)]
    assert text.splitlines()[2:] == gs.explain().splitlines()[2:]
    assert [s.describe() for s in loaded.guards] == [s.describe() for s in gs.guards]


def gc_stress_scaled(n: int) -> int:
    from gc_stress import scaled

    return scaled(n)


@settings(max_examples=examples(300), **_SETTINGS)
@given(st.data())
def test_from_bytes_fuzz(data: st.DataObject) -> None:
    """Random edits of valid blobs (re-hashed so that they reach the parser) and random bytes:
    from_bytes returns a GuardSet or raises FormatError, and nothing else."""
    blob = _FUZZ_SEEDS[data.draw(st.integers(0, len(_FUZZ_SEEDS) - 1))]
    body = bytearray(blob[64:])
    for _ in range(data.draw(st.integers(1, 6))):
        op = data.draw(st.sampled_from(["set", "insert", "delete", "truncate"]))
        i = data.draw(st.integers(0, max(0, len(body) - 1)))
        if op == "set" and body:
            body[i] = data.draw(st.integers(0, 255))
        elif op == "insert":
            body[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and body:
            del body[i : i + data.draw(st.integers(1, 8))]
        elif op == "truncate":
            del body[i:]
    candidates = [rewrap(bytes(body)), bytes(body), data.draw(st.binary(max_size=200))]
    for c in candidates:
        try:
            gs = tw.GuardSet.from_bytes(c)
        except tw.FormatError:
            continue
        gs.check({})  # a loaded set is usable
        gs.explain()


_FUZZ_SEEDS = [tw.guards_for(f, fx.__dict__).to_bytes() for f in fx.frames()] + [_shape_blob()]


def test_a_name_or_label_pointing_at_a_lone_surrogate() -> None:
    """The string table takes lone surrogates (a str constant may hold one, an install site may name
    a file whose path is not UTF-8), so a corrupt index can make a name, a label or a text point at
    one; test_from_bytes_fuzz can reach it, and explain() would raise UnicodeDecodeError after a
    load that passed. The decoder refuses such an index where text is required, with the index's
    offset. Every one-byte edit of the seed whose constants hold 'café \\ud800' (string 4)
    to 4 or 5 (a label's index is one more) either is refused with FormatError or loads a set whose
    check and explain() work; refused names, labels and texts, and install sites shown with the
    surrogate, all occur."""
    lone = "café \ud800".encode("utf-8", "surrogatepass")
    blob = next(b for b in _FUZZ_SEEDS if lone in b)  # the fixture frame whose constants hold it
    body = blob[64:]
    refused: dict[str, int] = {}
    shown_site = 0
    assert b"\x08builtins\x04list\x03nan\x07negzero\t" + lone in body[:80]  # strings 0-4
    for i, byte in ((i, byte) for i in range(len(body)) for byte in (b"\x04", b"\x05")):
        edited = rewrap(body[:i] + byte + body[i + 1 :])
        try:
            gs = tw.GuardSet.from_bytes(edited)
        except tw.FormatError as e:
            m = re.search(r"(\w[\w ]*) string \d+ names a string that is not valid text", str(e))
            if m is not None:
                assert e.offset is not None and 64 <= e.offset < len(edited)
                refused[m.group(1)] = refused.get(m.group(1), 0) + 1
            continue
        gs.check({})
        shown_site += "\ud800" in gs.explain()
    assert shown_site, refused
    assert {"label", "reference module", "reference qualname"} <= set(refused), refused


def test_an_install_site_in_a_file_whose_path_is_not_utf8_round_trips(tmp_path: Any) -> None:
    """A guard installed from a file whose path holds bytes that are not UTF-8 (Python decodes them
    into lone surrogates) is saved and loaded with that site as it was; before, to_bytes raised a
    TypeError from the binding's strict string conversion."""
    folder = os.path.join(os.fsencode(tmp_path), b"dir\xff")
    os.makedirs(folder)
    with open(os.path.join(folder, b"site_module.py"), "w") as f:
        f.write("import tripwire as tw\n\ndef build():\n    b = tw.GuardBuilder({'x': 3})\n"
                "    b.equals(\"L['x']\")\n    return b.build()\n")  # fmt: skip
    spec = importlib.util.spec_from_file_location(
        "site_module", os.fsdecode(os.path.join(folder, b"site_module.py"))
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    gs = module.build()
    (site,) = [s for s in gs.guards[0].stack if "site_module.py" in s]
    assert "\udcff" in site
    loaded = tw.GuardSet.from_bytes(gs.to_bytes())
    assert loaded.guards[0].stack == gs.guards[0].stack
    assert "installed at dir\udcff/site_module.py:5 in build" in loaded.explain()
    assert loaded.explain().splitlines()[-1] == gs.explain().splitlines()[-1]
    assert loaded.check({"x": 3}) and not loaded.check({"x": 4})


def test_a_label_that_is_not_text_is_not_serializable() -> None:
    """A label is stored as text (the decoder refuses any other string there): a GLOBAL_STATE name
    holding a lone surrogate is refused by to_bytes, naming the guard, not by a binding's TypeError."""
    b = tw.GuardBuilder({"x": 3})
    b.global_state("recursion_limit", name="limit \udcff")
    with pytest.raises(tw.NotSerializable, match="label 'limit \\\\udcff' is not valid text"):
        b.build().to_bytes()
    assert tw.GuardSet.from_bytes(b.build().to_bytes(drop=["GLOBAL_STATE"])).check({"x": 3})


def _tensor_kind_seed() -> bytes:
    """A set with every tensor kind (TENSOR_MATCH, ARRAY_MATCH, DIMENSION_MARKING, ALIAS,
    NO_ALIAS, torch's probes), for the fuzz corpus (needs torch and numpy to regenerate)."""
    frame, _ = _tensor_frame()
    aframe, _ = _array_frame()
    b = tw.GuardBuilder({**frame, **aframe})
    for spec in [*_tensor_set(frame).guards, *_array_set(aframe).guards]:
        b.add(spec.kind, spec.source, tuple(resolve(a) for a in spec.args))
    return b.build().to_bytes()


def _storage_and_key_set_seed() -> bytes:
    """A set with kinds 24 and 25 (STORAGE_OVERLAPPING over three views, DISPATCH_KEY_SET_MATCH),
    for the fuzz corpus (needs torch with the adapter to regenerate)."""
    import torch

    base = torch.arange(20.0)
    L = {"a": base[0:6], "b": base[4:10], "c": base[12:18], "ks": torch._C._dispatch_keys(base)}
    b = tw.GuardBuilder(L)
    b.storage_overlapping(overlapping=["L['a']", "L['b']"], non_overlapping=["L['c']"])
    b.dispatch_key_set_match("L['ks']")
    return b.build().to_bytes()


def _set_contains_seed() -> bytes:
    """A set with kind 26 (SET_CONTAINS, both senses, on a set and a frozenset), for the fuzz corpus."""
    b = tw.GuardBuilder({"s": {"running", 1}, "f": frozenset({(1, "a")})})
    b.set_contains("L['s']", "running")
    b.set_contains("L['s']", "other", present=False)
    b.set_contains("L['f']", (1, "a"))
    return b.build().to_bytes()


def test_fuzz_seed_corpus_is_current() -> None:
    """tests/fuzz/corpus_codec holds the blobs of the fixture frames (mode byte 0: the whole
    file), so the libFuzzer run starts from real guard sets. Regenerate with
    ``python tests/python/serialization/test_serialization.py``."""
    corpus = HERE.parents[1] / "fuzz" / "corpus_codec"
    names = {p.name for p in corpus.iterdir()}
    for i in range(len(_FUZZ_SEEDS)):
        assert f"guards_for_{i}" in names
    assert {"tensor_kinds", "tensor_kinds_body"} <= names
    assert {"storage_and_key_set", "storage_and_key_set_body"} <= names
    assert {"set_contains", "set_contains_body"} <= names


if __name__ == "__main__":
    out = HERE.parents[1] / "fuzz" / "corpus_codec"
    out.mkdir(exist_ok=True)
    for i, blob in enumerate(_FUZZ_SEEDS):
        (out / f"guards_for_{i}").write_bytes(b"\x00" + blob)
        (out / f"guards_for_{i}_body").write_bytes(b"\x01" + blob[64:])
    blob = _tensor_kind_seed()
    (out / "tensor_kinds").write_bytes(b"\x00" + blob)
    (out / "tensor_kinds_body").write_bytes(b"\x01" + blob[64:])
    blob = _storage_and_key_set_seed()
    (out / "storage_and_key_set").write_bytes(b"\x00" + blob)
    (out / "storage_and_key_set_body").write_bytes(b"\x01" + blob[64:])
    blob = _set_contains_seed()
    (out / "set_contains").write_bytes(b"\x00" + blob)
    (out / "set_contains_body").write_bytes(b"\x01" + blob[64:])
    print(f"wrote {2 * len(_FUZZ_SEEDS) + 6} seeds to {out}")
    _ = os


def test_a_loaded_set_constant_prints_as_the_original_in_reasons() -> None:
    # Two equal sets can iterate in different orders (their tables have different histories; on
    # 3.12+ hash(None) is a constant that collides with 0's slot): reasons must not depend on it.
    s = set(range(64))
    s.add(None)
    for i in range(1, 64):
        s.discard(i)
    original = frozenset(s)
    b = tw.GuardBuilder({"x": original})
    b.equals("L['x']")
    gs = b.build()
    loaded = tw.GuardSet.from_bytes(gs.to_bytes())
    x = {"x": frozenset({0, 1})}
    assert gs.why_not(x).reason == loaded.why_not(x).reason
    assert "frozenset({None, 0})" in gs.why_not(x).reason

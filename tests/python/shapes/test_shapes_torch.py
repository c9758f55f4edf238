"""SHAPE against torch 2.13: the relations Dynamo's shape environment prints for functions compiled
with ``dynamic=True``, parsed with tripwire's syntax, decide exactly as torch's default (Python)
path decides on mutated inputs.

For each function, torch compiles it once (``backend="eager"``) and the cache entry's epilogue
lambda guard, which holds every shape relation as one Python function, is the oracle: it is
callable on the frame's locals, and its ``verbose_code_parts()`` are the relations with the
comments torch appends. tripwire imports each code part with ``tripwire.shapes.relations_from_torch``
(what ``tripwire.torch.guards_of`` will call) into a GuardSet of SHAPE guards only, and on every
mutated input ``gs.check(v) == torch_lambda(v)``.

The inputs keep every dynamic tensor's dtype, rank and contiguity (TENSOR_MATCH's part, which is
not the shape guard's) and draw sizes from 0, 1, 2, small, odd, even and large values, and float
inputs from NaN, infinities, -0.0 and ordinary values: the NaN case is where torch's optional C++
path (``enable_cpp_symbolic_shape_guards``) is wrong (``~std::isnan`` is always true) and the
Python path, which tripwire follows, is right.
"""

from __future__ import annotations

import math
import random
import zlib

import pytest

import tripwire as tw
from gc_stress import scaled

torch = pytest.importorskip("torch")

from torch._dynamo.eval_frame import _debug_get_cache_entry_list  # noqa: E402

pytestmark = pytest.mark.torch


def f_reshape(x, y):
    z = x.reshape(-1, 4)
    return z.sum() + y[: x.shape[0] // 2].sum()


def f_reshape2(x, y):
    return x.reshape(y.shape[0], -1) + 1


def f_slice(x, y):
    return x[: y.shape[0] - 1] * 2


def f_broadcast(a, b):
    return a + b


def f_branch(x):
    if x.shape[0] > 3:
        return x * 2
    return x + 1


def f_float(x, s):
    return x * s


def f_view_mod(x):
    return x.view(-1, 6).sum(1)


_COMPILED: dict = {}
# (fn, specialize_float) -> (tripwire.torch.guards_of's import of the entry, torch's guard manager)
_IMPORTED: dict = {}


def _compile(fn, example: dict, *, specialize_float: bool = True):
    # Once per function: compiling is most of these tests' time (minutes under --gc-stress).
    key = (fn, specialize_float)
    if key not in _COMPILED:
        _COMPILED[key] = _compile_now(fn, example, specialize_float)
    return _COMPILED[key]


def _compile_now(fn, example: dict, specialize_float: bool):
    torch._dynamo.reset()
    old = torch._dynamo.config.specialize_float
    torch._dynamo.config.specialize_float = specialize_float
    try:
        torch.compile(fn, backend="eager", dynamic=True)(**example)
    finally:
        torch._dynamo.config.specialize_float = old
    entries = _debug_get_cache_entry_list(fn.__code__)
    assert len(entries) == 1
    # Imported now: the next compile's reset() drops this entry from the code's cache (the guard
    # manager object stays usable through the reference kept here).
    imported = tw.torch.guards_of(fn)  # everything: tensor kinds import too
    _IMPORTED[(fn, specialize_float)] = (imported, entries[0].guard_manager)
    lambdas = entries[0].guard_manager.root.get_epilogue_lambda_guards()
    assert len(lambdas) == 1, "one epilogue lambda holds the shape guards"
    return lambdas[0]


def _tripwire_set(torch_lambda, example: dict) -> tuple[tw.GuardSet, list]:
    b = tw.GuardBuilder(example)
    parts = torch_lambda.verbose_code_parts()
    for part in parts:
        for rel in tw.shapes.relations_from_torch(part):
            b.shape(rel)
    return b.build(), parts


def _sizes(r: random.Random) -> int:
    return r.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 17, 24, 31, 32, 100, 128, 1000])


def _ones(example: dict) -> dict:
    """Every dynamic size 1: refused by the 0/1 specialisation ranges (``2 <= s``) of each case,
    so every run sees a failing input however few random ones it draws (--gc-stress)."""
    return {k: torch.randn(*([1] * t.dim())) for k, t in example.items()}


def _torch_decides(torch_lambda, f_locals: dict) -> bool:
    try:
        return bool(torch_lambda(f_locals))
    except Exception:
        return False


CASES = {
    "reshape": (f_reshape, lambda r: {"x": torch.randn(_sizes(r), _sizes(r)), "y": torch.randn(_sizes(r))},
                {"x": torch.randn(8, 3), "y": torch.randn(10)}),
    "reshape2": (f_reshape2, lambda r: {"x": torch.randn(_sizes(r), _sizes(r)), "y": torch.randn(_sizes(r))},
                 {"x": torch.randn(6, 4), "y": torch.randn(8)}),
    "slice": (f_slice, lambda r: {"x": torch.randn(_sizes(r), 3), "y": torch.randn(_sizes(r))},
              {"x": torch.randn(9, 3), "y": torch.randn(5)}),
    "broadcast": (f_broadcast, lambda r: {"a": torch.randn(_sizes(r), _sizes(r)), "b": torch.randn(_sizes(r))},
                  {"a": torch.randn(6, 4), "b": torch.randn(4)}),
    "branch": (f_branch, lambda r: {"x": torch.randn(_sizes(r), _sizes(r))}, {"x": torch.randn(5, 2)}),
    "view": (f_view_mod, lambda r: {"x": torch.randn(_sizes(r), _sizes(r))}, {"x": torch.randn(4, 9)}),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_relations_decide_as_torchs_python_path(name: str) -> None:
    fn, draw, example = CASES[name]
    torch_lambda = _compile(fn, example)
    gs, parts = _tripwire_set(torch_lambda, example)
    assert len(gs) >= len(parts)  # conjunctions split, nothing dropped on import
    assert gs.check(example) and _torch_decides(torch_lambda, example)
    r = random.Random(zlib.crc32(name.encode()))  # str hashes change per process
    outcomes = {True: 0, False: 0}
    for k in range(scaled(300, 40) + 2):
        v = example if k == 0 else _ones(example) if k == 1 else draw(r)
        want = _torch_decides(torch_lambda, v)
        assert gs.check(v) == want, (name, {k: tuple(t.shape) for k, t in v.items()}, parts)
        assert (gs.why_not(v) is None) == want
        outcomes[want] += 1
    assert outcomes[True] and outcomes[False], outcomes  # both decisions exercised


def test_reshape_relations_are_the_ones_torch_prints() -> None:
    torch_lambda = _compile(f_reshape, CASES["reshape"][2])
    gs, parts = _tripwire_set(torch_lambda, CASES["reshape"][2])
    texts = [g.args[0] for g in gs.guards]
    assert "((L['x'].size()[1]*L['x'].size()[0]) % 4) == 0" in texts
    assert "(L['x'].size()[0] // 2) <= L['y'].size()[0]" in texts
    assert 11 <= len(parts) <= 18
    v = {"x": torch.randn(9, 3), "y": torch.randn(10)}
    f = gs.why_not(v)
    assert f.kind == "SHAPE"
    assert (
        f.reason
        == "((L['x'].size()[1]*L['x'].size()[0]) % 4) == 0 is false with L['x'].size()[1] = 3, L['x'].size()[0] = 9"
    )
    assert "shape relations" in gs.explain()


def test_float_input_and_nan_agree_with_the_python_path() -> None:
    example = {"x": torch.randn(8, 3), "s": 0.5}
    torch_lambda = _compile(f_float, example, specialize_float=False)
    gs, parts = _tripwire_set(torch_lambda, example)
    assert any("math.isnan(L['s'])" in p for p in parts)
    r = random.Random(5)
    for s in [math.nan, -math.nan, math.inf, -math.inf, 0.0, -0.0, 5e-324, 1e308, 0.25, -3.0]:
        v = {"x": torch.randn(r.choice([2, 3, 8]), r.choice([2, 5])), "s": s}
        want = _torch_decides(torch_lambda, v)
        assert gs.check(v) == want, s
    nan = {"x": torch.randn(8, 3), "s": math.nan}
    assert _torch_decides(torch_lambda, nan) is False  # torch's Python path refuses NaN...
    assert gs.check(nan) is False  # ...and so does tripwire (torch's C++ path would accept it)
    assert gs.why_not(nan).reason == "not math.isnan(L['s']) is false with L['s'] = nan"


def test_torch_size_reads_are_one_call_per_symbol() -> None:
    # The generic path calls x.size() once per SIZE symbol (a fast C-level reader replaces it).
    example = CASES["reshape"][2]
    gs, _ = _tripwire_set(_compile(f_reshape, example), example)
    symbols = gs._shape_info["symbols"]
    assert symbols == len({str(s) for g in gs.guards for s in g.args[1]})


# -- through tripwire.torch.guards_of ---------------------------------------------------------------


def _imported(fn, example: dict, *, specialize_float: bool = True):
    _compile(fn, example, specialize_float=specialize_float)
    return _IMPORTED[(fn, specialize_float)]


def _torch_checks(gm, f_locals: dict) -> bool:
    try:
        return bool(gm.check(f_locals))
    except Exception:
        return False


@pytest.mark.parametrize("name", list(CASES))
def test_guards_of_imports_the_shape_lambda_as_relations(name: str) -> None:
    """guards_of turns torch's shape-environment lambda into SHAPE relations (no LAMBDA, no call
    into torch), and the whole imported set (nothing dropped: TENSOR_MATCH and the other tensor
    kinds import too) decides as torch's whole guard tree (its default Python path) on mutated
    inputs that keep what TENSOR_MATCH checks beyond sizes (dtype, rank, contiguity): every
    failure is a shape decision."""
    fn, draw, example = CASES[name]
    imported, gm = _imported(fn, example)
    torch_lambda = _compile(fn, example)
    shape = [g for g in imported.torch_import.guards if g.kind == "SHAPE_ENV"]
    assert len(shape) == 1 and shape[0].outcome == "native", imported.torch_import.guards
    by_index = {g.index: g for g in imported.guards}
    assert {by_index[i].kind.name for i in shape[0].guards} == {"SHAPE"}
    # No torch lambda is kept (the saved-tensor-hooks one is tripwire's probe).
    lambdas = {
        r.kind
        for r in imported.torch_import.guards
        if any(by_index[i].kind.name == "LAMBDA" for i in r.guards)
    }
    assert not lambdas, lambdas
    n_parts = len(torch_lambda.verbose_code_parts())
    assert len(shape[0].guards) >= n_parts  # one relation per part at least (conjunctions split)
    assert imported.check(example) and _torch_checks(gm, example)
    r = random.Random(zlib.crc32(name.encode()) ^ 0x5A5A)
    outcomes = {True: 0, False: 0}
    for k in range(scaled(200, 30) + 2):
        v = example if k == 0 else _ones(example) if k == 1 else draw(r)
        want = _torch_checks(gm, v)
        assert _torch_decides(torch_lambda, v) == want or not want  # only the shape part differs
        got = imported.check(v)
        assert got == want, (name, {k: tuple(t.shape) for k, t in v.items()})
        f = imported.why_not(v)
        assert (f is None) == want
        if f is not None:
            assert f.kind == "SHAPE", f
        outcomes[want] += 1
    assert outcomes[True] and outcomes[False], outcomes


def test_guards_of_reshape_failure_names_the_relation() -> None:
    imported, _ = _imported(f_reshape, CASES["reshape"][2])
    f = imported.why_not({"x": torch.randn(9, 3), "y": torch.randn(10)})
    assert f.kind == "SHAPE"
    assert f.reason == (
        "((L['x'].size()[1]*L['x'].size()[0]) % 4) == 0 is false with L['x'].size()[1] = 3, L['x'].size()[0] = 9"
    )
    text = imported.explain()
    assert "SHAPE_ENV: 1 = 1 native" in text and "shape relations" in text
    # A saved import loads as the same relations (the saved-tensor-hooks probe with it).
    loaded = tw.GuardSet.from_bytes(imported.to_bytes())
    for v in ({"x": torch.randn(8, 3), "y": torch.randn(10)}, {"x": torch.randn(9, 3), "y": torch.randn(10)}):
        assert loaded.check(v) == imported.check(v)


def test_guards_of_float_input_nan_follows_the_python_path() -> None:
    """specialize_float=False: the float input is a symbol, typed float from torch's TYPE_MATCH;
    NaN fails as in torch's Python path (its optional C++ path would pass it)."""
    example = {"x": torch.randn(8, 3), "s": 0.5}
    imported, gm = _imported(f_float, example, specialize_float=False)
    rels = [g.args for g in imported.guards if g.kind.name == "SHAPE"]
    assert any(text == "not math.isnan(L['s'])" and types == ("float",) for text, _, types in rels), rels
    r = random.Random(7)
    for s in [math.nan, -math.nan, math.inf, -math.inf, 0.0, -0.0, 5e-324, 1e308, 0.25, -3.0]:
        v = {"x": torch.randn(r.choice([2, 3, 8]), r.choice([2, 5])), "s": s}
        assert imported.check(v) == _torch_checks(gm, v), s
    nan = {"x": torch.randn(8, 3), "s": math.nan}
    assert _torch_checks(gm, nan) is False and imported.check(nan) is False
    assert imported.why_not(nan).reason == "not math.isnan(L['s']) is false with L['s'] = nan"


def test_guards_of_shape_text_outside_the_syntax_falls_back_to_torch() -> None:
    """A shape lambda with a part tripwire cannot parse is left whole to torch's own object
    (fallback="torch": exact) or reported (fallback="refuse"): never partly imported."""
    real = tw.shapes.relations_from_torch

    def refuse_one(part: str):
        if "% 4" in part:
            raise tw.ShapeSyntaxError("not in the syntax", 0, part)
        return real(part)

    fn, _, example = CASES["reshape"]
    _compile(fn, example)
    torch._dynamo.reset()
    torch.compile(fn, backend="eager", dynamic=True)(**example)
    try:
        tw.shapes.relations_from_torch = refuse_one
        imported = tw.torch.guards_of(fn)
        with pytest.raises(tw.GuardsNotImportable, match="SHAPE_ENV"):
            tw.torch.guards_of(fn, fallback="refuse")
    finally:
        tw.shapes.relations_from_torch = real
    rec = [g for g in imported.torch_import.guards if g.kind == "SHAPE_ENV"]
    assert rec[0].outcome == "torch" and "syntax" in rec[0].why
    by_index = {g.index: g for g in imported.guards}
    assert [by_index[i].kind.name for i in rec[0].guards] == ["LAMBDA"]  # torch's whole lambda
    assert "SHAPE" not in {g.kind.name for g in imported.guards}
    assert imported.check(example) and not imported.check({"x": torch.randn(9, 3), "y": torch.randn(10)})
    imported2 = tw.torch.guards_of(fn, drop=["SHAPE_ENV"])
    assert not {"LAMBDA", "SHAPE"} & {g.kind.name for g in imported2.guards}


def f_int_reshape(x, n):
    return x.reshape(n, -1) * 2


def test_guards_of_int_input_agrees_with_torch() -> None:
    """An int input is a symbol typed from torch's TYPE_MATCH; values of another type, divisors
    that do not divide, and ints beyond int64 decide as torch's whole guard check."""
    example = {"x": torch.randn(6, 4), "n": 3}
    imported, gm = _imported(f_int_reshape, example)
    rels = [g.args for g in imported.guards if g.kind.name == "SHAPE"]
    assert any(text == "L['n'] != 0" and types == ("int",) for text, _, types in rels), rels
    r = random.Random(11)
    cases = [example, {"x": torch.randn(6, 4), "n": 3.0}, {"x": torch.randn(6, 4), "n": True}]
    for n in [-3, -1, 0, 1, 2, 4, 5, 6, 8, 12, 24, 2**63 - 1, 2**63, 2**64, -(2**64)]:
        cases.append({"x": torch.randn(r.choice([2, 6, 12]), r.choice([2, 4])), "n": n})
    decisions = {True: 0, False: 0}
    for v in cases:
        want = _torch_checks(gm, v)
        assert imported.check(v) == want, v["n"]
        decisions[want] += 1
    assert decisions[True] >= 2 and decisions[False] >= 2, decisions


def f_cpp_path(x, y, s):
    return x.reshape(-1, 4).sum() * s + y[: x.shape[0] // 2].sum()


def _compile_entry(fn, example: dict, *, cpp: bool):
    """torch's guard manager for fn (dynamic=True, specialize_float=False), on torch's C++ shape
    path (enable_cpp_symbolic_shape_guards: runs a C++ compiler, cached on disk) or its default
    Python path, and guards_of's import of it."""
    torch._dynamo.reset()
    old = (torch._dynamo.config.specialize_float, torch._dynamo.config.enable_cpp_symbolic_shape_guards)
    torch._dynamo.config.specialize_float = False
    torch._dynamo.config.enable_cpp_symbolic_shape_guards = cpp
    try:
        torch.compile(fn, backend="eager", dynamic=True)(**example)
    finally:
        torch._dynamo.config.specialize_float, torch._dynamo.config.enable_cpp_symbolic_shape_guards = old
    entries = _debug_get_cache_entry_list(fn.__code__)
    assert len(entries) == 1
    return entries[0].guard_manager, tw.torch.guards_of(fn)


def test_guards_of_imports_torchs_cpp_shape_guard() -> None:
    """torch's optional C++ shape guard (SYMBOLIC_SHAPE_GUARD, one relational leaf under an
    IndexedGuardAccessor node per symbol) imports as the same SHAPE relations as the Python path's
    lambda, and decides as torch's Python path: on NaN too, where torch's C++ path passes
    (``~std::isnan(s)`` is always true; docs/torch.md, "Shape guards")."""
    example = {"x": torch.randn(8, 3), "y": torch.randn(10), "s": 0.5}
    gm_cpp, imported = _compile_entry(f_cpp_path, example, cpp=True)
    gm_py, imported_py = _compile_entry(f_cpp_path, example, cpp=False)
    assert not gm_cpp.root.get_epilogue_lambda_guards(), "the C++ path installs no shape lambda"
    records = [g for g in imported.torch_import.guards if g.kind == "SYMBOLIC_SHAPE_GUARD"]
    assert len(records) >= 2 and all(g.outcome == "native" for g in records), records
    assert len({g.guards for g in records}) == 1, "one import, shared by every symbol's node"
    by_index = {g.index: g for g in imported.guards}
    assert {by_index[i].kind.name for i in records[0].guards} == {"SHAPE"}
    assert not [g for g in imported.torch_import.guards if g.outcome not in ("native", "torch")]
    lambdas = {
        r.kind
        for r in imported.torch_import.guards
        if any(by_index[i].kind.name == "LAMBDA" for i in r.guards)
    }
    assert lambdas <= {"AUTOGRAD_SAVED_TENSORS_HOOKS"}, lambdas
    # The same relations as the Python path's import (torch prints both from one shape env).
    texts = sorted(by_index[i].args[0] for i in records[0].guards)
    py_shape = next(g for g in imported_py.torch_import.guards if g.kind == "SHAPE_ENV")
    py_by_index = {g.index: g for g in imported_py.guards}
    assert texts == sorted(py_by_index[i].args[0] for i in py_shape.guards)
    assert "not math.isnan(L['s'])" in texts
    r = random.Random(11)
    outcomes = {True: 0, False: 0}
    for k in range(scaled(60, 15) + 2):
        if k == 0:
            v = example
        elif k == 1:
            v = {"x": torch.randn(1, 1), "y": torch.randn(1), "s": 0.5}
        else:
            v = {"x": torch.randn(_sizes(r), _sizes(r)), "y": torch.randn(_sizes(r)),
                 "s": r.choice([0.5, -3.0, 0.0, -0.0, math.inf, -math.inf, 1e308])}  # fmt: skip
        want = _torch_checks(gm_py, v)
        assert _torch_checks(gm_cpp, v) == want  # no NaN here: torch's two paths agree
        assert imported.check(v) == want, {k: getattr(t, "shape", t) for k, t in v.items()}
        outcomes[want] += 1
    assert outcomes[True] and outcomes[False], outcomes
    nan = {"x": torch.randn(8, 3), "y": torch.randn(10), "s": math.nan}
    assert _torch_checks(gm_py, nan) is False
    assert _torch_checks(gm_cpp, nan) is True, "torch 2.13's C++ NaN guard (if fixed, update docs/torch.md)"
    assert imported.check(nan) is False
    assert imported.why_not(nan).reason == "not math.isnan(L['s']) is false with L['s'] = nan"


@pytest.mark.skipif(
    (tw.tensors.ensure_torch() or True) and not tw._core.torch_adapter_installed(),
    reason="the C++ tensor steps need the torch adapter",
)
def test_tensor_property_and_grad_accessors_are_named_imported_and_droppable() -> None:
    """torch 2.13 binds TensorPropertyGuardAccessor, GradGuardAccessor and IndexedGuardAccessor as
    plain ``GuardAccessor`` objects: the importer names them from their repr, so a guard below one
    imports through the C++ tensor steps (TENSOR_SIZE, GRAD; tests/python/tensors/test_cpp_tensor_steps.py)
    and ``drop=`` naming the accessor drops it, while the C++ shape guard below the same accessors
    stays imported (its relations are read from their printed text). The two extra leaves are
    added to torch's own tree: no torch 2.13 compile tried puts a guard other than the shape guard
    below a tensor-property accessor, and GradGuardAccessor needs an optimizer compile."""
    example = {"x": torch.randn(8, 3), "y": torch.randn(10), "s": 0.5}
    gm, _ = _compile_entry(f_cpp_path, example, cpp=True)
    x_node = next(c for c in gm.root.get_child_managers() if c.get_source() == "L['x']")
    prop = next(c for c in x_node.get_child_managers() if c.get_source() == "L['x'].size()[0]")
    prop.add_lambda_guard(lambda v: v >= 2, ["L['x'].size()[0] >= 2"], None)
    from torch._dynamo.guards import GuardManagerType

    grad = x_node.grad_manager(
        source="L['x'].grad", example_value=None, guard_manager_enum=GuardManagerType.GUARD_MANAGER
    )
    grad.add_lambda_guard(lambda v: v is None, ["L['x'].grad is None"], None)
    imported = tw.torch.guards_of(f_cpp_path)
    by_code = {g.code: g.outcome for g in imported.torch_import.guards}
    assert by_code["L['x'].size()[0] >= 2"] == by_code["L['x'].grad is None"] == "torch"
    gs = tw.torch.guards_of(f_cpp_path, drop=("TensorPropertyGuardAccessor", "GradGuardAccessor"))
    by_code = {g.code: g.outcome for g in gs.torch_import.guards}
    assert by_code["L['x'].size()[0] >= 2"] == by_code["L['x'].grad is None"] == "dropped"
    shape = [g for g in gs.torch_import.guards if g.kind == "SYMBOLIC_SHAPE_GUARD"]
    assert shape and all(g.outcome == "native" for g in shape), shape
    assert gs.check(example) and not gs.check({**example, "x": torch.randn(1, 3)})

#!/usr/bin/env python
"""SHAPE benchmark: ``python bench/shape_eval.py`` (bench/README.md, "Shape relations").

Three measurements, ratios taken in one run:

1. **Building 20 relations** (the code parts torch 2.13 prints for a function over three dynamic
   tensors): tripwire's whole builder path (``GuardBuilder.shape`` x 20 + ``build()``: parse,
   canonical sources, example check, compile, verification on the example) and the engine alone
   (``GuardSet(specs)``: parse, type-check, CSE, merge, validate in C++); against torch's Python
   path (``build_guard_function`` + ``exec`` + ``___make_guard_fn``, as
   ``add_python_lambda_leaf_guard_to_root`` does) and its C++ path
   (``enable_cpp_symbolic_shape_guards``: the extra wall time of the first compile, which runs a
   C++ compiler; measured once, in a fresh inductor cache).
2. **Checking the relations of a reshape over two dynamic tensors** (``x.reshape(-1, 4)`` and a
   slice by ``x.shape[0] // 2`` of ``y``): torch's Python path (the epilogue lambda that holds the
   relations, called on the locals), torch's whole guard check on the Python and on the C++ path
   (their difference is what the C++ shape guard saves), tripwire's SHAPE set on the tensors with
   sizes read by the C-level reader (runtime/tensors/property_reader.hpp: the torch adapter, in the
   fast pass; asserted to take it), the same set with the reader switched off
   (``_core._force_python_readers``: a Python call of ``x.size()`` per symbol, the generic path;
   the row includes the two switch calls), the whole entry imported with
   ``tripwire.torch.guards_of`` (TENSOR_MATCH and the other tensor kinds too: compare with torch's
   whole check), the same relations over int locals (symbols read by dict lookups), and the
   relation evaluation alone in a C++ loop (``_core.testing.shape_time``: frame, symbol stores,
   relations; no Python call).
3. **Per relation**: programs of 1 to 256 relations of the reshape kind over 4 symbols, evaluated
   in the C++ loop: ns per program, per relation (the slope), and per symbol.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import timeit
from collections.abc import Callable
from typing import Any

import _callgrind
import tripwire as tw
from tripwire import _core


# -- timing ---------------------------------------------------------------------------------------
def _per_call(fn: Callable[[], Any], target_s: float) -> tuple[int, Callable[[], float]]:
    timer = timeit.Timer(fn)
    n = 1
    while True:
        t = timer.timeit(n)
        if t >= target_s / 4 or n >= 1 << 24:
            break
        n *= 2
    n = max(1, int(n * target_s / max(t, 1e-9)))
    return n, lambda: timer.timeit(n) / n * 1e9


def _per_call_after(setup: Callable[[], Any], fn: Callable[[], Any], target_s: float) -> Callable[[], float]:
    """A runner of ``fn`` timed call by call, ``setup()`` before each call and not timed (the
    cold build's emptying of the memos); ns per call, the mean over about ``target_s``."""
    clock = time.perf_counter_ns

    def run(n: int) -> float:
        total = 0
        for _ in range(n):
            setup()
            t0 = clock()
            fn()
            total += clock() - t0
        return total / n

    t0 = time.perf_counter()
    run(1)
    n = max(1, int(target_s / max(time.perf_counter() - t0, 1e-9)))
    return lambda: run(n)


def measure(
    contenders: dict[str, Callable[[], Any]],
    repeat: int,
    target_s: float,
    setups: dict[str, Callable[[], Any]] | None = None,
) -> dict[str, list[float]]:
    """ns per call of each contender: `repeat` round-robin repeats (rotating order), GC off.
    A contender with an entry in ``setups`` is timed call by call, its set-up before each call
    untimed."""
    setups = setups or {}
    runners = {
        name: _per_call_after(setups[name], fn, target_s) if name in setups else _per_call(fn, target_s)[1]
        for name, fn in contenders.items()
    }
    out: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for k in range(repeat):
        for name in names[k % len(names) :] + names[: k % len(names)]:
            out[name].append(runners[name]())
    return out


def _fmt(ns: float) -> str:
    if ns >= 1e6:
        return f"{ns / 1e6:,.1f} ms"
    if ns >= 1e4:
        return f"{ns / 1e3:,.1f} us"
    return f"{ns:,.0f} ns"


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: (
        "| " + " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) + " |"
    )
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


# -- the functions torch compiles ------------------------------------------------------------------
def f_reshape(x, y):
    z = x.reshape(-1, 4)
    return z.sum() + y[: x.shape[0] // 2].sum()


def f_twenty(x, y, w):
    a = x.reshape(-1, 4)
    b = w.view(-1, 6)
    return a.sum() + b.sum() + y[: x.shape[0] // 2].sum() + w[: y.shape[0] - 1].sum()


def _torch_entry(fn, example: dict, *, cpp: bool = False):
    import torch
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    torch._dynamo.reset()
    torch._dynamo.config.enable_cpp_symbolic_shape_guards = cpp
    try:
        t0 = time.perf_counter()
        torch.compile(fn, backend="eager", dynamic=True)(**example)
        compile_s = time.perf_counter() - t0
    finally:
        torch._dynamo.config.enable_cpp_symbolic_shape_guards = False
    gm = _debug_get_cache_entry_list(fn.__code__)[0].guard_manager
    lambdas = gm.root.get_epilogue_lambda_guards()
    return gm, (lambdas[0] if lambdas else None), compile_s


def _fresh(parts: list[str], example: dict, k: int) -> tuple[list[str], dict]:
    """The parts and example with every local renamed (``L['x']`` -> ``L['x_k']``): texts this
    process has not seen for a new ``k``, so that every memo keyed by text misses (a cold build)."""
    for name in example:
        parts = [p.replace(f"L['{name}']", f"L['{name}_{k}']") for p in parts]
    return parts, {f"{name}_{k}": v for name, v in example.items()}


def _tripwire_set(parts: list[str], example: dict) -> tuple[tw.GuardSet, tw.GuardBuilder]:
    b = tw.GuardBuilder(example)
    for part in parts:
        for rel in tw.shapes.relations_from_torch(part):
            b.shape(rel)
    return b.build(), b


# -- 1. building -----------------------------------------------------------------------------------
def build_contenders() -> tuple[dict[str, Callable[[], Any]], tw.GuardSet]:
    """What building the 20 relations costs, per contender (each call builds once)."""
    import torch
    import torch._dynamo.guards as dg

    example = {"x": torch.randn(8, 3), "y": torch.randn(10), "w": torch.randn(4, 9)}
    _gm, lam, _ = _torch_entry(f_twenty, example)
    parts = list(lam.verbose_code_parts())[:20]
    code_parts = [p.split("  #")[0] for p in parts]
    assert len(parts) == 20, len(parts)

    def tw_builder() -> tw.GuardSet:
        return _tripwire_set(parts, example)[0]

    fresh: list = [0, None]  # the next k, and the fresh (parts, example) the set-up made

    def next_fresh() -> None:
        fresh[0] += 1
        fresh[1] = _fresh(parts, example, fresh[0])

    def tw_builder_cold() -> tw.GuardSet:
        # Texts never built before (the set-up, untimed, renames the locals): every parse and
        # compile is a first one (what a JIT pays for a new function's guards).
        return _tripwire_set(*fresh[1])[0]

    gs, b = _tripwire_set(parts, example)
    specs = list(b.guards)

    def tw_engine() -> tw.GuardSet:
        return tw.GuardSet(specs)

    closure_vars = {**dg.SYMPY_INTERP, **dg._get_closure_vars()}

    def torch_python() -> Any:
        _body, pycode = dg.build_guard_function(code_parts, ", ".join(closure_vars))
        out: dict[str, Any] = {}
        exec(pycode, {"G": {}}, out)
        return out["___make_guard_fn"](*closure_vars.values())

    fn = torch_python()
    assert fn(example) and gs.check(example)

    contenders = {
        "tw_builder": tw_builder,
        "tw_builder_cold": tw_builder_cold,
        "tw_engine": tw_engine,
        "torch_python": torch_python,
    }
    # The cold build's set-up is making texts it has not seen.
    return contenders, {"tw_builder_cold": next_fresh}, gs


def bench_build(args: argparse.Namespace, log: Callable[[str], None]) -> list[str]:
    contenders, setups, gs = build_contenders()
    samples = measure(contenders, args.repeat, args.time, setups)
    cpp_s = None
    if args.cpp_path:
        import torch

        log("  torch's C++ path: compiling with enable_cpp_symbolic_shape_guards (runs a C++ compiler)...")
        example = {"x": torch.randn(8, 3), "y": torch.randn(10), "w": torch.randn(4, 9)}
        _, _, plain_s = _torch_entry(f_twenty, example)
        _, _, cpp_total = _torch_entry(f_twenty, example, cpp=True)
        cpp_s = cpp_total - plain_s
    rows = []
    tw_min = min(samples["tw_builder"])
    for name, label in [("tw_builder", "tripwire: GuardBuilder.shape x20 + build()"),
                        ("tw_builder_cold", "tripwire: the same on texts never built before (cold)"),
                        ("tw_engine", "tripwire: engine only, GuardSet(specs)"),
                        ("torch_python", "torch Python path: build_guard_function + exec")]:  # fmt: skip
        s = samples[name]
        rows.append([label, _fmt(min(s)), _fmt(statistics.median(s)), f"{tw_min / min(s):.2g}"])
    if cpp_s is not None:
        rows.append(["torch C++ path: extra first-compile wall time (gcc)", _fmt(cpp_s * 1e9), "(one run)",
                     f"{tw_min / (cpp_s * 1e9):.1g}"])  # fmt: skip
    out = [
        f"### Building 20 relations ({len(gs._shape_info['relations'])} SHAPE guards on "
        f"{gs._shape_info['symbols']} symbols, {gs._shape_info['operations']} operations after CSE)",
        "",
        _table(rows, ["what", "min", "median", "tw builder / x"]),
        "",
        f"tripwire builder {_fmt(tw_min)} (min; median {_fmt(statistics.median(samples['tw_builder']))}), "
        f"cold {_fmt(min(samples['tw_builder_cold']))}, engine {_fmt(min(samples['tw_engine']))}",
    ]
    return out


# -- 2. checking -----------------------------------------------------------------------------------
def _int_locals(parts: list[str], example: dict) -> tuple[list[str], dict]:
    """The relations with every tensor-property symbol replaced by an int local of its value."""
    texts: list[str] = []
    values: dict[str, int] = {}
    names: dict[str, str] = {}
    for part in parts:
        for rel in tw.shapes.relations_from_torch(part):
            text = rel.text
            for s in sorted(rel.symbols, key=lambda s: -len(str(s))):
                if str(s) not in names:
                    names[str(s)] = f"s{len(names)}"
                    values[names[str(s)]] = tw.GuardBuilder(example).value(s)
                text = text.replace(str(s), f"L['{names[str(s)]}']")
            texts.append(text)
    return texts, values


def check_contenders(cpp_path: bool) -> tuple[dict[str, tuple[Callable[[Any], Any], Any]], dict]:
    """Each contender's check function and its argument (asserted right on a pass and a fail)."""
    import torch

    example = {"x": torch.randn(8, 3), "y": torch.randn(10)}
    gm_py, lam, _ = _torch_entry(f_reshape, example)
    # What tripwire.torch.guards_of imports from the whole entry: the shape lambda's relations, the
    # tensors' TENSOR_MATCH / DIMENSION_MARKING / NO_ALIAS, torch's state, and the saved-tensor-hooks
    # lambda (torch's own: no tripwire probe of it yet, so that set takes the walk).
    imported = tw.torch.guards_of(f_reshape)
    parts = list(lam.verbose_code_parts())
    gs, _ = _tripwire_set(parts, example)
    texts, int_values = _int_locals(parts, example)
    b = tw.GuardBuilder(int_values)
    for t in texts:
        b.shape(t)
    gs_int = b.build()
    for check in (gm_py.check, lam, gs.check, imported.check):
        assert check(example)
    shape_env = [r for r in imported.torch_import.guards if r.kind == "SHAPE_ENV"]
    assert len(shape_env) == 1 and shape_env[0].outcome == "native"
    # The sizes are read by the C-level reader, in the fast pass (not by x.size() calls).
    assert gs._uses_fast_pass and _core.testing.read_tensor_property(example["x"], tw.StepKind.SIZE, 0) == 8
    before = gs._fast_pass_count
    assert gs.check(example) and gs._fast_pass_count == before + 1

    def generic(v: Any) -> Any:
        _core._force_python_readers(True)
        try:
            return gs.check(v)
        finally:
            _core._force_python_readers(False)

    before = gs._fast_pass_count
    assert generic(example) and gs._fast_pass_count == before
    assert gs_int.check(int_values) and gs_int._uses_fast_pass
    bad = {"x": torch.randn(9, 3), "y": torch.randn(10)}
    assert not lam(bad) and not gs.check(bad) and not gm_py.check(bad) and not imported.check(bad)
    contenders: dict[str, tuple[Callable[[Any], Any], Any]] = {
        "torch_lambda": (lam, example),
        "torch_gm_py": (gm_py.check, example),
        "tw": (gs.check, example),
        "tw_generic": (generic, example),
        "tw_guards_of": (imported.check, example),
        "tw_int": (gs_int.check, int_values),
        "noop": (lambda _: None, None),
    }
    if cpp_path:
        gm_cpp, _, _ = _torch_entry(f_reshape, example, cpp=True)
        assert gm_cpp.check(example) and not gm_cpp.check(bad)
        contenders["torch_gm_cpp"] = (gm_cpp.check, example)
    info = {
        "parts": parts,
        "gs": gs,
        "symbol_values": {str(s): tw.GuardBuilder(example).value(s) for g in gs.guards for s in g.args[1]},
        "relation_texts": [g.args[0] for g in gs.guards],
    }
    return contenders, info


def bench_check(args: argparse.Namespace, log: Callable[[str], None]) -> list[str]:
    if args.cpp_path:
        log("  torch's C++ path for the reshape function (runs a C++ compiler)...")
    pairs, info = check_contenders(args.cpp_path)
    parts, gs = info["parts"], info["gs"]
    symbol_values, relation_texts = info["symbol_values"], info["relation_texts"]
    contenders = {name: (lambda f=f, a=a: f(a)) for name, (f, a) in pairs.items()}
    gm_cpp = "torch_gm_cpp" in pairs
    samples = measure(contenders, args.repeat, args.time)
    core_ns = [
        _core.testing.shape_time(relation_texts, symbol_values, args.iterations)[0]
        for _ in range(args.repeat)
    ]
    info = gs._shape_info
    lam_min = min(samples["torch_lambda"])
    rows = []

    def row(label: str, s: list[float]) -> None:
        rows.append([label, _fmt(min(s)), _fmt(statistics.median(s)), f"{min(s) / lam_min:.2f}"])

    row("torch Python path: the shape lambda alone (epilogue LAMBDA_GUARD)", samples["torch_lambda"])
    row("torch whole guard check, Python path (gm.check)", samples["torch_gm_py"])
    if gm_cpp:
        row("torch whole guard check, C++ path (gm.check)", samples["torch_gm_cpp"])
        # The C++ path's shape cost, estimated from medians (differences of minima are noise).
        med = {k: statistics.median(v) for k, v in samples.items()}
        cpp_shape = [med["torch_gm_cpp"] - (med["torch_gm_py"] - med["torch_lambda"])]
        row("torch C++ shape guard (estimate, medians: C++ gm - (Python gm - lambda))", cpp_shape)
    row("tripwire SHAPE set, sizes by the C-level reader (fast pass)", samples["tw"])
    row("tripwire SHAPE set, sizes by x.size() calls (reader off; + 2 switch calls)", samples["tw_generic"])
    row(
        "tripwire: guards_of import of the whole entry (vs torch's whole check)",
        samples["tw_guards_of"],
    )
    row("tripwire SHAPE set, symbols as int locals (fast pass)", samples["tw_int"])
    row("tripwire relations alone, C++ loop (_core.testing.shape_time)", core_ns)
    row("no-op Python call", samples["noop"])
    tw_min, tw_int_min = min(samples["tw"]), min(samples["tw_int"])
    lines = [
        f"### Checking the relations of a reshape over two dynamic tensors ({len(parts)} code parts, "
        f"{len(info['relations'])} relations, {sum(1 for r in info['relations'] if r[1] == 'kept')} after "
        f"merging, {info['symbols']} symbols, {info['operations']} operations)",
        "",
        _table(rows, ["what", "min", "median", "x / torch lambda"]),
        "",
        f"target >= 3x faster than torch's Python path: SHAPE set on the tensors {lam_min / tw_min:.1f}x "
        f"({'MET' if lam_min >= 3 * tw_min else 'missed'}), relations over int locals "
        f"{lam_min / tw_int_min:.1f}x ({'MET' if lam_min >= 3 * tw_int_min else 'missed'})",
    ]
    if gm_cpp:
        cpp_min = cpp_shape[0]
        lines.append(
            f"target faster than torch's C++ path (estimated {_fmt(cpp_min)}, medians): SHAPE set on the tensors "
            f"{'MET' if tw_min < cpp_min else 'missed'} ({cpp_min / tw_min:.1f}x), relations over int locals "
            f"{'MET' if tw_int_min < cpp_min else 'missed'} ({cpp_min / tw_int_min:.1f}x)"
        )
        nan_lines = bench_nan(log)
        lines += ["", *nan_lines]
    return lines


def bench_nan(log: Callable[[str], None]) -> list[str]:
    """The NaN case: torch's C++ path accepts NaN, its Python path does not."""
    import math

    import torch

    def f(x, s):
        return x * s

    torch._dynamo.config.specialize_float = False
    try:
        example = {"x": torch.randn(8, 3), "s": 0.5}
        gm_py, lam, _ = _torch_entry(f, example)
        gm_cpp, _, _ = _torch_entry(f, example, cpp=True)
    finally:
        torch._dynamo.config.specialize_float = True
    gs, _ = _tripwire_set(list(lam.verbose_code_parts()), example)
    nan = {"x": torch.randn(8, 3), "s": math.nan}
    return [
        "NaN float input (`specialize_float=False`, `f(x, s) = x * s`), check(s=nan): "
        f"torch Python path {gm_py.check(nan)}, torch C++ path {gm_cpp.check(nan)}, tripwire {gs.check(nan)}"
    ]


# -- 3. per relation -------------------------------------------------------------------------------
def bench_scaling(args: argparse.Namespace) -> list[str]:
    symbols = {"L['a']": 24, "L['b']": 3, "L['c']": 40, "L['d']": 17}
    forms = [
        "((6*L['a']) % 4) == 0",
        "(L['a'] // 2) <= L['c']",
        "(L['a']*L['b']) != ((L['a']*L['b']) // 4)",
        "2 <= L['d']",
        "(L['c'] % ((L['a']*L['b']) // 4)) != 0",
        "L['b']*((L['a']*L['b']) // L['c']) >= 0",
    ]
    rows = []
    points = []
    for n in (1, 4, 16, 64, 256):
        # Distinct relations (none merged or implied), all true: the six forms torch prints for a
        # reshape, then copies made distinct by a disjunct that is never needed.
        texts = [form if k < len(forms) else f"({form}) or L['d'] == {1000 + k}"
                 for k, form in ((k, forms[k % len(forms)]) for k in range(n))]  # fmt: skip
        ns = min(_core.testing.shape_time(texts, symbols, args.iterations)[0] for _ in range(args.repeat))
        _, result, kept, _nsym, ops = _core.testing.shape_time(texts, symbols, 10)
        assert result == -1, (n, result)
        points.append((kept, ns))
        rows.append([str(n), str(kept), str(ops), _fmt(ns), f"{ns / kept:.1f}"])
    # The slope between the largest programs: ns per additional relation.
    (k1, t1), (k2, t2) = points[-2], points[-1]
    slope = (t2 - t1) / (k2 - k1)
    return [
        "### Per relation (C++ loop: a frame, 4 symbol stores, the relations; fast path)",
        "",
        _table(
            rows, ["relations declared", "kept", "operations", "ns per check (min)", "ns per kept relation"]
        ),
        "",
        f"slope between {k1} and {k2} kept relations: {slope:.1f} ns per relation (target: about 5 ns); "
        "no allocation per symbol (tests/cpp/test_shape.cpp ShapeFrame.FastPathAllocatesNothing)",
    ]


# -- instruction counts ----------------------------------------------------------------------------
def _callgrind_child(section: str, contender: str, n: int) -> None:
    """Inside valgrind: build one contender, warm it up, run it n times inside
    ``_floor.repeat_call`` (the only function whose cost callgrind collects)."""
    import gc

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import floor_build

    _floor = floor_build.load()
    if section == "build":
        contenders, setups, _gs = build_contenders()
        fn0, setup = contenders[contender], setups.get(contender)
        if setup is None:
            fn, arg = (lambda _: fn0()), None
        else:

            def fn(_: object) -> None:
                _floor.toggle_collect()  # the set-up is not counted (collection is on in repeat_call)
                setup()
                _floor.toggle_collect()
                fn0()

            arg = None
    else:
        fn, arg = check_contenders(contender == "torch_gm_cpp")[0][contender]
    for _ in range(20):
        fn(arg)
    gc.collect()
    gc.disable()
    _floor.repeat_call(fn, arg, n)


def callgrind_count(section: str, contender: str, n: int) -> float | None:
    """Instructions per call of one contender, counted by callgrind (None if it failed)."""
    out = os.path.join(tempfile.mkdtemp(prefix="tw-shape-cg-"), f"callgrind.{section}.{contender}.out")
    code = (
        f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
        f"from shape_eval import _callgrind_child; _callgrind_child({section!r}, {contender!r}, {n})"
    )
    found = _callgrind.totals(["-c", code], out)
    return None if not found else found[0] / n


def bench_instructions(args: argparse.Namespace, log: Callable[[str], None]) -> list[str]:
    rows = []
    sections = [
        ("build", ["tw_builder", "tw_builder_cold", "tw_engine", "torch_python"], 20),
        ("check", ["torch_lambda", "torch_gm_py", "torch_gm_cpp", "tw", "tw_int", "noop"], 2000),
    ]
    for section, names, n in sections:
        for name in names:
            if name == "torch_gm_cpp" and not args.cpp_path:
                continue
            log(f"  callgrind: {section} {name}...")
            count = callgrind_count(section, name, n)
            rows.append([section, name, "failed" if count is None else f"{count:,.0f}"])
    return [
        "### Instructions per call (callgrind, deterministic)",
        "",
        _table(rows, ["section", "contender", "instructions"]),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--time", type=float, default=0.05, help="target seconds per repeat per contender")
    p.add_argument("--iterations", type=int, default=200_000, help="C++ loop iterations per sample")
    p.add_argument("--no-cpp-path", dest="cpp_path", action="store_false",
                   help="skip torch's C++ path (it runs a C++ compiler: tens of seconds)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="5 short repeats, no C++ path")
    p.add_argument(
        "--instructions", action="store_true", help="also count instructions with callgrind (slow)"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.repeat, args.time, args.iterations, args.cpp_path = 5, 0.01, 20_000, False
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="tw-shape-bench-"))
    log = lambda m: print(m, file=sys.stderr, flush=True)
    env = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
    )
    lines = [
        f"tripwire SHAPE benchmark: Python {sys.version.split()[0]}, torch {env.stdout.strip() or 'n/a'}, "
        f"{os.cpu_count()} CPUs, {args.repeat} repeats",
        "",
    ]
    log("building...")
    lines += [*bench_build(args, log), ""]
    log("checking...")
    lines += [*bench_check(args, log), ""]
    log("per relation...")
    lines += bench_scaling(args)
    if args.instructions:
        log("instructions...")
        lines += ["", *bench_instructions(args, log)]
    print(textwrap.dedent("\n".join(lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Tensor, array and framework-state guards: ``python bench/tensor_guards.py`` (bench/README.md).

Four measurements, each against its yardstick in the same run (round-robin repeats, min and median):

* ``T1`` TENSOR_MATCH per 2-D tensor, K tensors: tripwire (the adapter) against torch's guard
  manager holding the same K TENSOR_MATCH leaves (a ``RootGuardManager`` with one dict-item
  manager per tensor, as torch.compile builds for a function of K tensors). Per tensor =
  (check of K - check of an empty set) / K, each side against its own empty set.
* ``A1`` ARRAY_MATCH per 2-D numpy array, K arrays: tripwire (the array struct) against the C floor
  (bench/floor.c, a hand-written struct read) and tripwire's Python reader. Per array as above.
* ``G1`` torch's global state: GLOBAL_STATE("torch_global_state") through the adapter against
  torch's GLOBAL_STATE leaf (a RootGuardManager holding only it), each minus its empty set.
* ``P1`` the Python readers on purpose (the path without the torch adapter or the array struct):
  TENSOR_MATCH per 2-D tensor and ARRAY_MATCH per 2-D array, K values, in sets built with
  ``_force_python_readers(True)``, per value as above, against the same set through the adapter /
  the struct; and one call of ``tripwire.tensors._read_tensor`` / ``_read_array`` (minus a call of
  an empty lambda) on a plain tensor, a Tensor subclass (read inside DisableTorchFunction) and an
  array.
* ``D1`` Dynamo's ``dynamo_guard_eval`` workload: ``foo(x0..x99)`` compiled for sizes 10, 20, ...,
  100 (10 cache entries), called cycling through the sizes. Guards only: tripwire's
  ``Cache.lookup`` (entries built by ``guards_for`` plus the three torch probes) against torch's
  entries' guard managers tried most recently used first (its lookup order), from Python. Whole
  calls: ``@tw.specialize`` (the compiler returns foo itself) against ``torch.compile(foo,
  backend="eager")``, and foo itself (eager).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import contenders
import floor_build
import guard_eval
import tripwire as tw
from contenders import Contender, fmt_ns
from tripwire import _core


def measure(items: list[Contender], repeat: int, target_s: float) -> None:
    """contenders.measure with the collector off during each sample (tensors allocate)."""
    contenders.measure(items, repeat, target_s, gc_off=True, cap=5_000_000)


def per_unit(full: Contender, empty: Contender, k: int) -> tuple[float, float]:
    """(min, median) of (full - empty) / k, pairing the samples of the same repeat."""
    diffs = [(f - e) / k for f, e in zip(full.samples, empty.samples, strict=True)]
    return min(diffs), statistics.median(diffs)


def ratio(a: tuple[float, float], b: tuple[float, float]) -> str:
    return f"{a[0] / b[0]:.2f} (min), {a[1] / b[1]:.2f} (median)"


# -- T1: TENSOR_MATCH ------------------------------------------------------------------------------------
def torch_tensor_manager(tensors: dict[str, Any]) -> Any:
    import torch
    from torch._C._dynamo import guards as G
    from torch._dynamo.guards import GuardManagerType

    root = G.RootGuardManager()
    for name, t in tensors.items():
        m = root.getitem_manager(
            key=name,
            source=f"L['{name}']",
            example_value=t,
            guard_manager_enum=GuardManagerType.GUARD_MANAGER,
        )
        m.add_tensor_match_guard(
            t,
            list(t.shape),
            list(t.stride()),
            f"L['{name}']",
            ["tm"],
            None,
            type(t),
            torch._C._dispatch_keys(t),
        )
    return root


def bench_tensor_match(ks: list[int], repeat: int, target_s: float, log) -> list[str]:
    import torch

    out = []
    for k in ks:
        xs = {sys.intern(f"x{i}"): torch.randn(4, 8) for i in range(k)}  # frame locals: interned names
        b = tw.GuardBuilder(xs)
        for name in xs:
            b.tensor_match(f"L['{name}']")
        gs = b.build()
        empty_gs = tw.GuardBuilder({}).build()
        root, empty_root = torch_tensor_manager(xs), torch_tensor_manager({})
        bad = dict(xs, **{f"x{k - 1}": torch.randn(4, 9)})
        assert gs.check(xs) and not gs.check(bad) and root.check(xs) and not root.check(bad)
        items = [
            Contender("tripwire", lambda: gs.check(xs)),
            Contender("tripwire empty", lambda: empty_gs.check(xs)),
            Contender("torch", lambda: root.check(xs)),
            Contender("torch empty", lambda: empty_root.check(xs)),
        ]
        measure(items, repeat, target_s)
        tw_per = per_unit(items[0], items[1], k)
        torch_per = per_unit(items[2], items[3], k)
        out.append(
            f"| T1 K={k} | {fmt_ns(tw_per[0])} / {fmt_ns(tw_per[1])} | {fmt_ns(torch_per[0])} / {fmt_ns(torch_per[1])} | "
            f"{ratio(tw_per, torch_per)} | {fmt_ns(items[0].min)} vs {fmt_ns(items[2].min)} |"
        )
        log(out[-1])
    return out


# -- A1: ARRAY_MATCH -------------------------------------------------------------------------------------
def bench_array_match(ks: list[int], repeat: int, target_s: float, log) -> list[str]:
    import numpy as np

    out = []
    for k in ks:
        arrays = {sys.intern(f"a{i}"): np.zeros((4, 8), dtype=np.float32) for i in range(k)}
        b = tw.GuardBuilder(arrays)
        for name in arrays:
            b.array_match(f"L['{name}']")
        gs = b.build()
        was = _core._force_python_readers(True)
        try:
            gs_py = b.build()
        finally:
            _core._force_python_readers(was)
        empty_gs = tw.GuardBuilder({}).build()
        plan = guard_eval.floor_plan(list(gs.guards), arrays)
        empty_plan = floor_build.load().Plan([])
        bad = dict(arrays, **{f"a{k - 1}": np.zeros((4, 9), dtype=np.float32)})
        for check in (gs.check, gs_py.check, plan.check):
            assert check(arrays) is True and check(bad) is False
        items = [
            Contender("tripwire", lambda: gs.check(arrays)),
            Contender("tripwire empty", lambda: empty_gs.check(arrays)),
            Contender("C floor", lambda: plan.check(arrays)),
            Contender("C floor empty", lambda: empty_plan.check(arrays)),
            Contender("python reader", lambda: gs_py.check(arrays)),
        ]
        measure(items, repeat, target_s)
        tw_per = per_unit(items[0], items[1], k)
        floor_per = per_unit(items[2], items[3], k)
        py_per = per_unit(items[4], items[1], k)
        out.append(
            f"| A1 K={k} | {fmt_ns(tw_per[0])} / {fmt_ns(tw_per[1])} | {fmt_ns(floor_per[0])} / {fmt_ns(floor_per[1])} | "
            f"{ratio(tw_per, floor_per)} | python reader {fmt_ns(py_per[0])} / {fmt_ns(py_per[1])} |"
        )
        log(out[-1])
    return out


# -- G1: global state ------------------------------------------------------------------------------------
def bench_global_state(repeat: int, target_s: float, log) -> list[str]:
    import torch
    from torch._C._dynamo import guards as G

    b = tw.GuardBuilder({})
    b.global_state("torch_global_state")
    gs = b.build()
    was = _core._force_python_readers(True)
    try:
        gs_py = b.build()
    finally:
        _core._force_python_readers(was)
    empty_gs = tw.GuardBuilder({}).build()
    root = G.RootGuardManager()
    root.add_global_state_guard(G.GlobalStateGuard(), ["___check_global_state()"], None)
    empty_root = G.RootGuardManager()
    L: dict = {}
    with torch.no_grad():
        assert not gs.check(L) and not root.check(L) and not gs_py.check(L)
    assert gs.check(L) and root.check(L) and gs_py.check(L)
    items = [
        Contender("tripwire", lambda: gs.check(L)),
        Contender("tripwire empty", lambda: empty_gs.check(L)),
        Contender("torch", lambda: root.check(L)),
        Contender("torch empty", lambda: empty_root.check(L)),
        Contender("python reader", lambda: gs_py.check(L)),
    ]
    measure(items, repeat, target_s)
    tw_one = per_unit(items[0], items[1], 1)
    torch_one = per_unit(items[2], items[3], 1)
    py_one = per_unit(items[4], items[1], 1)
    line = (
        f"| G1 | {fmt_ns(tw_one[0])} / {fmt_ns(tw_one[1])} | {fmt_ns(torch_one[0])} / {fmt_ns(torch_one[1])} | "
        f"{ratio(tw_one, torch_one)} | python reader {fmt_ns(py_one[0])} / {fmt_ns(py_one[1])} |"
    )
    log(line)
    return [line]


# -- P1: the Python readers ------------------------------------------------------------------------------
def bench_python_readers(k: int, repeat: int, target_s: float, log) -> list[str]:
    import numpy as np
    import torch

    from tripwire import tensors

    class Sub(torch.Tensor):
        pass

    def built(values: dict, kind: str, python: bool) -> Any:
        b = tw.GuardBuilder(values)
        for name in values:
            getattr(b, kind)(f"L['{name}']")
        was = _core._force_python_readers(python)
        try:
            return b.build()
        finally:
            _core._force_python_readers(was)

    xs = {sys.intern(f"x{i}"): torch.randn(4, 8) for i in range(k)}
    arrays = {sys.intern(f"a{i}"): np.zeros((4, 8), dtype=np.float32) for i in range(k)}
    t_py, t_native = built(xs, "tensor_match", True), built(xs, "tensor_match", False)
    a_py, a_native = built(arrays, "array_match", True), built(arrays, "array_match", False)
    empty_gs = tw.GuardBuilder({}).build()
    for gs, vals in ((t_py, xs), (t_native, xs), (a_py, arrays), (a_native, arrays)):
        assert gs.check(vals) is True
    assert t_py._guard_path(0) == "python" and a_py._guard_path(0) == "python"
    t, sub, a = xs["x0"], torch.randn(4, 8).as_subclass(Sub), arrays["a0"]
    read_tensor, read_array = tensors._read_tensor, tensors._read_array
    assert read_tensor(t) is not None and read_tensor(sub) is not None and read_array(a) is not None
    items = [
        Contender("tensors, python reader", lambda: t_py.check(xs)),
        Contender("tensors, adapter", lambda: t_native.check(xs)),
        Contender("arrays, python reader", lambda: a_py.check(arrays)),
        Contender("arrays, struct", lambda: a_native.check(arrays)),
        Contender("empty set (tensors)", lambda: empty_gs.check(xs)),
        Contender("empty set (arrays)", lambda: empty_gs.check(arrays)),
        Contender("_read_tensor(tensor)", lambda: read_tensor(t)),
        Contender("_read_tensor(subclass)", lambda: read_tensor(sub)),
        Contender("_read_array(array)", lambda: read_array(a)),
        Contender("empty lambda", lambda: None),
    ]
    measure(items, repeat, target_s)
    t_per, tn_per = per_unit(items[0], items[4], k), per_unit(items[1], items[4], k)
    a_per, an_per = per_unit(items[2], items[5], k), per_unit(items[3], items[5], k)
    calls = [per_unit(items[i], items[9], 1) for i in (6, 7, 8)]
    lines = [
        f"| P1 TENSOR_MATCH per tensor, python reader, K={k} | {fmt_ns(t_per[0])} / {fmt_ns(t_per[1])} | "
        f"adapter {fmt_ns(tn_per[0])} / {fmt_ns(tn_per[1])} | {ratio(t_per, tn_per)} | "
        f"_read_tensor: tensor {fmt_ns(calls[0][0])} / {fmt_ns(calls[0][1])}, "
        f"subclass {fmt_ns(calls[1][0])} / {fmt_ns(calls[1][1])} |",
        f"| P1 ARRAY_MATCH per array, python reader, K={k} | {fmt_ns(a_per[0])} / {fmt_ns(a_per[1])} | "
        f"struct {fmt_ns(an_per[0])} / {fmt_ns(an_per[1])} | {ratio(a_per, an_per)} | "
        f"_read_array {fmt_ns(calls[2][0])} / {fmt_ns(calls[2][1])} |",
    ]
    for line in lines:
        log(line)
    return lines


# -- D1: dynamo_guard_eval ------------------------------------------------------------------------------------
ARGS = [sys.intern(f"x{i}") for i in range(100)]  # frame locals are interned names
FOO_SRC = (
    f"def foo({', '.join(ARGS)}):\n    n = {' + '.join(a + '.shape[0]' for a in ARGS)}\n    return x0 + n\n"
)


def bench_dynamo_guard_eval(repeat: int, target_s: float, log) -> list[str]:
    import torch
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    ns: dict[str, Any] = {}
    exec(compile(FOO_SRC, "<dynamo_guard_eval>", "exec"), ns)  # the microbenchmark's function
    foo = ns["foo"]
    inputs = [[torch.randn(n) for _ in range(100)] for n in range(10, 101, 10)]
    torch._dynamo.reset()
    torch._dynamo.config.cache_size_limit = 16
    compiled = torch.compile(foo, backend="eager", dynamic=False)
    for inp in inputs:
        compiled(*inp)
    entries = _debug_get_cache_entry_list(foo.__code__)
    assert len(entries) == 10, len(entries)
    managers = [e.guard_manager for e in entries]  # most recently used first

    def torch_lookup(L: dict) -> Any:
        # torch's lookup order (extra_state.cpp lookup): most recently used first, moved to the
        # front on a hit.
        for i, gm in enumerate(managers):
            if gm.check(L):
                if i:
                    managers.insert(0, managers.pop(i))
                return gm
        return None

    def compiler(fn: Any, example_args: Any, builder: tw.GuardBuilder) -> Any:
        for probe in ("torch_global_state", "torch_function_mode_stack", "torch_default_device"):
            builder.global_state(probe)
        return fn

    spec = tw.specialize(compiler=compiler, recompile_limit=16)(foo)
    cache = tw.Cache(recompile_limit=16)
    locals_list = [dict(zip(ARGS, inp, strict=True)) for inp in inputs]
    for L, inp in zip(locals_list, inputs, strict=True):
        b = tw.GuardBuilder(L)
        tw.infer_into(b)
        compiler(foo, L, b)
        cache.insert(b.build(), len(cache))
        spec(*inp)
    for L in locals_list:
        assert cache.lookup(L) is not None and torch_lookup(L) is not None
    n_guards_tw = len(cache.entries[0].guards)
    cycle = {"i": 0}

    def next_locals() -> dict:
        i = cycle["i"] = (cycle["i"] + 1) % 10
        return locals_list[i]

    def next_args() -> list:
        i = cycle["i"] = (cycle["i"] + 1) % 10
        return inputs[i]

    items = [
        Contender("tripwire lookup", lambda: cache.lookup(next_locals())),
        Contender("torch lookup", lambda: torch_lookup(next_locals())),
        Contender("dict cycle only", lambda: next_locals()),
        Contender("tripwire call", lambda: spec(*next_args())),
        Contender("torch call", lambda: compiled(*next_args())),
        Contender("eager call", lambda: foo(*next_args())),
    ]
    measure(items, repeat, target_s)
    base = items[2]
    tw_g = (items[0].min - base.min, items[0].median - base.median)
    th_g = (items[1].min - base.min, items[1].median - base.median)
    eager = items[5]
    tw_over = (items[3].min - eager.min, items[3].median - eager.median)
    th_over = (items[4].min - eager.min, items[4].median - eager.median)
    lines = [
        f"| D1 guards only (lookup per call) | {fmt_ns(tw_g[0])} / {fmt_ns(tw_g[1])} | {fmt_ns(th_g[0])} / {fmt_ns(th_g[1])} | "
        f"{ratio(tw_g, th_g)} | torch from Python (pybind per entry tried) |",
        f"| D1 whole call | {fmt_ns(items[3].min)} / {fmt_ns(items[3].median)} | {fmt_ns(items[4].min)} / {fmt_ns(items[4].median)} | "
        f"{ratio((items[3].min, items[3].median), (items[4].min, items[4].median))} | eager {fmt_ns(eager.min)} / {fmt_ns(eager.median)} |",
        f"| D1 call overhead (call - eager) | {fmt_ns(tw_over[0])} / {fmt_ns(tw_over[1])} | {fmt_ns(th_over[0])} / {fmt_ns(th_over[1])} | "
        f"{ratio(tw_over, th_over)} | tripwire entries: {n_guards_tw} guards each |",
    ]
    for line in lines:
        log(line)
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=11)
    p.add_argument("--time", type=float, default=0.02, help="seconds per repeat per contender")
    p.add_argument("--quick", action="store_true", help="3 short repeats")
    p.add_argument("-w", "--workload", action="append", choices=["T1", "A1", "G1", "P1", "D1"])
    args = p.parse_args(argv)
    if args.quick:
        args.repeat, args.time = 3, 0.005
    which = set(args.workload or ["T1", "A1", "G1", "P1", "D1"])
    log = print
    print(guard_eval.environment())
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        tw.tensors.ensure_torch()
    print(f"torch: {tw.tensors.adapter_status()}")
    try:
        import numpy  # noqa: F401

        tw.tensors.ensure_numpy()
    except ImportError:
        pass
    print(f"numpy: {tw.tensors.array_path()}")
    print(f"repeats {args.repeat}, {args.time}s each; ns, min / median\n")
    print("| what | tripwire | yardstick | tripwire / yardstick | note |")
    print("|---|---:|---:|---|---|")
    if "T1" in which and torch is not None:
        bench_tensor_match([1, 8, 64], args.repeat, args.time, log)
    if "A1" in which:
        bench_array_match([1, 8, 64], args.repeat, args.time, log)
    if "G1" in which and torch is not None:
        bench_global_state(args.repeat, args.time, log)
    if "P1" in which and torch is not None:
        bench_python_readers(64, args.repeat, args.time, log)
    if "D1" in which and torch is not None:
        bench_dynamo_guard_eval(args.repeat, args.time, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())

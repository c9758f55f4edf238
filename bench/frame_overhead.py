"""The frame runtime's costs (tripwire.frame), against their baselines, in one run.

    python bench/frame_overhead.py [--repeat 15] [--number 20000] [--no-torch] [--instructions]
    python bench/frame_overhead.py --only hit|unrelated|cycle

Three parts (bench/README.md, "Frame runtime"):

* ``hit``: the cost of a cache hit for 1-, 3- and 5-argument functions with 2, 6 and 10 guards:
  the hooked call (guards checked on the frame's fast locals, the replacement run in the frame)
  against calling the transformed code directly (a function object of the replacement code, no
  hook), with ``floor`` (the same direct call under a pass-through PEP 523 function: what PEP 523
  itself costs, since CPython stops inlining Python-to-Python calls while any eval-frame function
  is set), and the hit with every replacement forced into a shadow frame (what the frame costs when
  its data-stack chunk is full: a new chunk per call). With torch (3.11 here): the same 3-argument
  function on a small tensor, hooked against direct, and ``torch.compile(backend="eager")`` against
  the eager call.
* ``unrelated``: a plain 2-argument call made while the hook is installed, against the same call
  without it: the hook on this thread with the function SKIPped, the hook on another thread only,
  and the PEP 523 floor. ``--instructions`` adds callgrind instruction counts per call (stable
  where times are noisy; needs valgrind).
* ``cycle``: the shape of torch's ``dynamo_guard_eval`` microbenchmark: a 100-argument function,
  10 cache entries (arguments of sizes 10, 20, ..., 100), each run of 10 calls cycling through
  the sizes; against one entry hit 10 times, and against ``torch.compile(backend="eager",
  dynamic=False)`` on the same calls. The arguments are 1-D torch tensors when torch imports
  (numpy arrays otherwise); each entry guards every argument with ``GuardBuilder.tensor_match``
  when the builder has it (it is another branch's work) and otherwise with TYPE_MATCH and the
  size, either LENGTH (``len(x)``, no object made) or EQUALS on ``.shape[0]`` (a ``torch.Size``
  made on every check; the default, as torch's own benchmark guards sizes): 200 guards an entry.
  ``--size-guard length`` (repeatable) runs the other. Say which in any figure you quote.

Every repeat times each contender once, back to back (the machine is noisy). Printed: min and
median ns per call, and per contender the median over repeats of its ratio to the baseline
within the repeat. No assertions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import textwrap
import threading
import time
import types
from collections.abc import Callable
from typing import Any

import _callgrind
import tripwire as tw
from tripwire import _core
from tripwire import frame as twf

# -- functions -----------------------------------------------------------------------------------


def f1(x):
    return x


def f3(x, n, m):
    return x


def f5(a, b, c, d, e):
    return a


def f3t(x, n, m):
    return x + n


def unrelated(a, b):
    return a


def _twin(fn: Callable) -> types.FunctionType:
    """A function object running a copy of ``fn``'s code: "the transformed code called directly"."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__ + "_direct")


class Compiler:
    """Compile the target functions' frames to their twins' code under TYPE_MATCH on every
    argument and EQUALS on the int ones; SKIP everything else."""

    def __init__(self, targets: dict[types.CodeType, types.CodeType]) -> None:
        self.targets = targets

    def __call__(self, frame: twf.Frame) -> Any:
        code = self.targets.get(frame.code)
        if code is None:
            return twf.SKIP
        b = tw.GuardBuilder(frame.f_locals, f_globals=frame.f_globals)
        for name, v in frame.f_locals.items():
            b.type_match(f"L[{name!r}]")
            if type(v) is int:
                b.equals(f"L[{name!r}]")
        return code, b.build()


# -- timing --------------------------------------------------------------------------------------


_LOOPS: dict[int, Callable] = {}


def _loop(fn: Callable, args: tuple, number: int) -> float:
    """ns per ``fn(*args)``, the call spelt with positional arguments (``fn(a0, a1)``, which CPython
    inlines when no eval-frame function is set; ``fn(*args)`` never is)."""
    loop = _LOOPS.get(len(args))
    if loop is None:
        params = ", ".join(f"a{i}" for i in range(len(args)))
        src = f"def loop(fn, n, {params}):\n    for _ in range(n):\n        fn({params})\n"
        ns: dict[str, Any] = {}
        exec(src, ns)
        loop = _LOOPS[len(args)] = ns["loop"]
    t0 = time.perf_counter_ns()
    loop(fn, number, *args)
    return (time.perf_counter_ns() - t0) / number


class Row:
    def __init__(self, name: str, run: Callable[[int], float]) -> None:
        self.name = name
        self.run = run  # run(number) -> ns per call
        self.times: list[float] = []
        self.ratios: list[float] = []


def measure(title: str, rows: list[Row], number: int, repeat: int, *, base: int = 0) -> dict[str, Row]:
    """Time every row once per repeat, back to back; rows[base] is the baseline."""
    for _ in range(repeat):
        ts = [r.run(number) for r in rows]
        for r, t in zip(rows, ts, strict=True):
            r.times.append(t)
            r.ratios.append(t / ts[base])
    print(f"\n{title}")
    print(f"  {'':44s} {'min ns':>10s} {'median ns':>10s} {'x base (median)':>16s}")
    for r in rows:
        print(
            f"  {r.name:44s} {min(r.times):10.0f} {statistics.median(r.times):10.0f} "
            f"{statistics.median(r.ratios):16.2f}"
        )
    return {r.name: r for r in rows}


def _diff(rows: dict[str, Row], a: str, b: str) -> tuple[float, float]:
    """(min of a - min of b, median over repeats of a - b within the repeat)."""
    d = [x - y for x, y in zip(rows[a].times, rows[b].times, strict=True)]
    return min(rows[a].times) - min(rows[b].times), statistics.median(d)


def with_floor(fn: Callable, args: tuple) -> Callable[[int], float]:
    def run(number: int) -> float:
        assert _core.testing.frame_floor_eval(True)
        try:
            return _loop(fn, args, number)
        finally:
            assert _core.testing.frame_floor_eval(False)

    return run


def hooked(fn: Callable, args: tuple, hook: twf.Hook, *, shadow: bool = False) -> Callable[[int], float]:
    def run(number: int) -> float:
        was = _core.testing.frame_force_shadow(shadow)
        try:
            with twf.hooked(hook):
                return _loop(fn, args, number)
        finally:
            _core.testing.frame_force_shadow(was)

    return run


# -- part 1: hits --------------------------------------------------------------------------------


def part_hit(number: int, repeat: int, torch_ok: bool) -> None:
    cases = [
        ("f1(x): 1 argument, 2 guards", f1, (7,)),
        ("f3(x, n, m): 3 arguments, 6 guards", f3, (7, 8, 9)),
        ("f5(a, b, c, d, e): 5 arguments, 10 guards", f5, (1, 2, 3, 4, 5)),
    ]
    twins = {fn.__code__: _twin(fn) for _, fn, _ in cases}
    hook = twf.Hook(Compiler({c: t.__code__ for c, t in twins.items()}))
    with twf.hooked(hook):
        for _, fn, args in cases:
            fn(*args)  # compile
            fn(*args)
    for title, fn, args in cases:
        direct = twins[fn.__code__]
        rows = measure(
            f"hit: {title}",
            [
                Row("transformed code called directly (no hook)", lambda n, d=direct, a=args: _loop(d, a, n)),
                Row("same, under a pass-through PEP 523 (floor)", with_floor(direct, args)),
                Row("tripwire.frame hit", hooked(fn, args, hook)),
                Row("tripwire.frame hit, shadow frame forced", hooked(fn, args, hook, shadow=True)),
            ],
            number,
            repeat,
        )
        lo, med = _diff(rows, "tripwire.frame hit", "transformed code called directly (no hook)")
        slo, smed = _diff(rows, "tripwire.frame hit, shadow frame forced", "tripwire.frame hit")
        flo, fmed = _diff(rows, "tripwire.frame hit", "same, under a pass-through PEP 523 (floor)")
        print(
            f"  hit overhead: {lo:.0f} ns (difference of mins), {med:.0f} ns (median difference); "
            f"over the floor: {flo:.0f} / {fmed:.0f}"
        )
        print(f"  a shadow frame (a new chunk per call) instead of retargeting: +{slo:.0f} / +{smed:.0f} ns")
    cache = twf.cache_of(f5, hook.backend)
    print(f"  (f5's cache: {cache.stats['hits']} hits, {cache.stats['misses']} misses)")
    if torch_ok:
        part_hit_torch(number // 4, repeat)


def part_hit_torch(number: int, repeat: int) -> None:
    import torch

    x = torch.ones(4)
    args = (x, 2, 3)
    direct = _twin(f3t)
    hook = twf.Hook(Compiler({f3t.__code__: direct.__code__}))
    with twf.hooked(hook):
        f3t(*args)
    eager = _twin(f3t)
    compiled = torch.compile(_twin(f3t), backend="eager")
    compiled(*args)
    compiled(*args)
    rows = measure(
        "hit with a tensor: f3t(x, n, m) = x + n on a 4-element tensor (tripwire: TYPE_MATCH x, n, m; EQUALS n, m)",
        [
            Row("transformed code called directly (no hook)", lambda k: _loop(direct, args, k)),
            Row("tripwire.frame hit", hooked(f3t, args, hook)),
            Row("eager call (no compile)", lambda k: _loop(eager, args, k)),
            Row("torch.compile(backend='eager') hit", lambda k: _loop(compiled, args, k)),
        ],
        number,
        repeat,
    )
    lo, med = _diff(rows, "tripwire.frame hit", "transformed code called directly (no hook)")
    tlo, tmed = _diff(rows, "torch.compile(backend='eager') hit", "eager call (no compile)")
    print(f"  tripwire overhead: {lo:.0f} ns (difference of mins), {med:.0f} ns (median difference)")
    print(f"  torch overhead:    {tlo:.0f} ns (difference of mins), {tmed:.0f} ns (median difference)")
    print(f"  tripwire / torch (differences of mins): {lo / tlo:.3f}")


# -- part 2: unrelated calls ----------------------------------------------------------------------


def part_unrelated(number: int, repeat: int, instructions: bool) -> None:
    args = (1, 2)
    hook = twf.Hook(lambda frame: twf.SKIP)
    with twf.hooked(hook):
        unrelated(*args)  # SKIPped from now on
    other_ready, other_done = threading.Event(), threading.Event()

    def other_thread() -> None:
        twf.install(lambda frame: None)
        other_ready.set()
        other_done.wait()
        twf.uninstall()

    def on_other_thread(number: int) -> float:
        t = threading.Thread(target=other_thread)
        t.start()
        other_ready.wait()
        try:
            return _loop(unrelated, args, number)
        finally:
            other_done.set()
            t.join()
            other_ready.clear()
            other_done.clear()

    rows = measure(
        "unrelated: unrelated(1, 2), a plain Python call",
        [
            Row("no hook", lambda n: _loop(unrelated, args, n)),
            Row("pass-through PEP 523 function (floor)", with_floor(unrelated, args)),
            Row("hook on this thread, function SKIPped", hooked(unrelated, args, hook)),
            Row("hook on another thread only", on_other_thread),
        ],
        number * 5,
        repeat,
    )
    for name in (
        "pass-through PEP 523 function (floor)",
        "hook on this thread, function SKIPped",
        "hook on another thread only",
    ):
        lo, med = _diff(rows, name, "no hook")
        print(f"  added by {name}: {lo:.0f} ns (difference of mins), {med:.0f} ns (median difference)")
    if instructions:
        unrelated_instructions()


_CG_SCRIPT = textwrap.dedent(
    """
    import sys, threading
    import tripwire._core as c
    from tripwire import frame as twf
    def unrelated(a, b):
        return a
    def loop(n):
        for _ in range(n):
            unrelated(1, 2)
    mode, n = sys.argv[1], int(sys.argv[2])
    if mode == "floor":
        assert c.testing.frame_floor_eval(True)
    elif mode == "skip":
        twf.install(lambda fr: twf.SKIP); loop(1)
    elif mode == "other":
        ready = threading.Event(); done = threading.Event()
        def other():
            twf.install(lambda fr: None); ready.set(); done.wait()
        t = threading.Thread(target=other, daemon=True); t.start(); ready.wait()
    loop(n)
    """
)


def unrelated_instructions() -> None:
    """Instructions per unrelated call under callgrind: (count at N2 - count at N1) / (N2 - N1)."""
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "cg.py")
        with open(script, "w") as fh:
            fh.write(_CG_SCRIPT)

        def count(mode: str, n: int) -> int:
            found = _callgrind.totals(
                [script, mode, str(n)], os.path.join(d, f"cg.{mode}.{n}"), function=None
            )
            if found is None:
                raise SystemExit(f"callgrind failed for {mode}")
            return found[0]

        print("\n  instructions per unrelated call (callgrind, 100,000 calls):")
        base = None
        for mode in ("none", "floor", "skip", "other"):
            per = (count(mode, 101_000) - count(mode, 1_000)) / 100_000
            base = per if base is None else base
            print(f"    {mode:6s} {per:8.1f}   (+{per - base:.1f})")


# -- part 3: dynamo_guard_eval shape --------------------------------------------------------------

N_ARGS = 100
SIZES = [10 * (i + 1) for i in range(10)]


def _many_args_fn(name: str, body: str) -> types.FunctionType:
    params = ", ".join(f"a{i}" for i in range(N_ARGS))
    ns: dict[str, Any] = {}
    exec(f"def {name}({params}):\n    return {body}\n", ns)
    return ns[name]


GUARDS = {
    "length": "TYPE_MATCH + LENGTH",
    "shape": "TYPE_MATCH + EQUALS .shape[0]",
}


def _entry_guards(frame: twf.Frame, how: str) -> tw.GuardSet:
    """Per argument: tensor_match when the builder has it (another branch's), else TYPE_MATCH and
    the argument's size: LENGTH (len(x): no object made) or EQUALS on .shape[0] (.shape makes a
    torch.Size on every check). The arguments are 1-D, so both pin the size exactly."""
    b = tw.GuardBuilder(frame.f_locals, f_globals=frame.f_globals)
    tensor_match = getattr(b, "tensor_match", None)
    for i in range(N_ARGS):
        src = f"L['a{i}']"
        if tensor_match is not None and type(frame.f_locals[f"a{i}"]).__module__.startswith("torch"):
            tensor_match(src)
            continue
        b.type_match(src)
        if how == "length":
            b.length(src)
        else:
            b.equals(f"{src}.shape[0]")
    return b.build()


def part_cycle(number: int, repeat: int, torch_ok: bool, how: str) -> None:
    if torch_ok:
        import torch

        make = lambda size: [torch.randn(size) for _ in range(N_ARGS)]
        kind = "torch tensors"
    else:
        import numpy as np

        rng = np.random.default_rng(0)
        make = lambda size: [rng.standard_normal(size) for _ in range(N_ARGS)]
        kind = "numpy arrays"
    guard_kind = "tensor_match" if hasattr(tw.GuardBuilder, "tensor_match") else GUARDS[how]
    inputs = [make(s) for s in SIZES]
    fn = _many_args_fn("many", "a0 + 1")
    one = _many_args_fn("many_one", "a0 + 1")
    direct = _many_args_fn("many_direct", "a0 + 1")

    def compile_frame(frame: twf.Frame) -> Any:
        if frame.code in (fn.__code__, one.__code__):
            return direct.__code__, _entry_guards(frame, how)
        return twf.SKIP

    hook = twf.Hook(compile_frame, recompile_limit=16, accumulated_limit=16)
    with twf.hooked(hook):
        for args in inputs:
            fn(*args)  # 10 entries
        one(*inputs[0])  # 1 entry
    assert len(twf.cache_of(fn, hook.backend)) == 10 and len(twf.cache_of(one, hook.backend)) == 1

    def run_cycle(f: Callable) -> Callable[[int], float]:
        def run(n: int) -> float:
            t0 = time.perf_counter_ns()
            for _ in range(n):
                for args in inputs:
                    f(*args)
            return (time.perf_counter_ns() - t0) / (n * len(inputs))

        return run

    def run_same(f: Callable, args: list) -> Callable[[int], float]:
        def run(n: int) -> float:
            t0 = time.perf_counter_ns()
            for _ in range(n * len(inputs)):
                f(*args)
            return (time.perf_counter_ns() - t0) / (n * len(inputs))

        return run

    def under_hook(run: Callable[[int], float]) -> Callable[[int], float]:
        def r(n: int) -> float:
            with twf.hooked(hook):
                return run(n)

        return r

    rows = [
        Row("tripwire.frame: 1 entry, the same call", under_hook(run_same(one, inputs[0]))),
        Row("tripwire.frame: 10 entries, cycling", under_hook(run_cycle(fn))),
        Row("direct calls, cycling (no hook)", run_cycle(direct)),
    ]
    if torch_ok:
        import torch
        import torch._dynamo

        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 16)
        compiled = torch.compile(_many_args_fn("many_torch", "a0 + 1"), backend="eager", dynamic=False)
        for args in inputs:
            compiled(*args)
        rows.append(Row("torch.compile(backend='eager'), cycling", run_cycle(compiled)))
    res = measure(
        f"cycle: {N_ARGS} arguments ({kind}), 10 entries, per call; guards {guard_kind}",
        rows,
        max(1, number // 200),
        repeat,
    )
    ratio = statistics.median(
        c / o
        for c, o in zip(
            res["tripwire.frame: 10 entries, cycling"].times,
            res["tripwire.frame: 1 entry, the same call"].times,
            strict=True,
        )
    )
    print(f"  cycling / single-entry hit (median of per-repeat ratios): {ratio:.2f}")
    if torch_ok:
        speed = statistics.median(
            t / c
            for t, c in zip(
                res["torch.compile(backend='eager'), cycling"].times,
                res["tripwire.frame: 10 entries, cycling"].times,
                strict=True,
            )
        )
        print(f"  torch / tripwire, cycling (median of per-repeat ratios): {speed:.1f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--number", type=int, default=20000)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--instructions", action="store_true", help="callgrind instruction counts (unrelated)")
    ap.add_argument("--only", choices=("hit", "unrelated", "cycle"), action="append")
    ap.add_argument(
        "--size-guard",
        choices=tuple(GUARDS),
        action="append",
        help="cycle: how each argument's size is guarded without tensor_match (default: shape; repeatable)",
    )
    a = ap.parse_args(argv)
    a.size_guard = a.size_guard or ["shape"]
    torch_ok = False
    if not a.no_torch:
        try:
            import torch  # noqa: F401
        except Exception as e:  # noqa: BLE001 - optional
            print(f"(torch not available: {type(e).__name__}: {e})")
        else:
            torch_ok = True
    print(
        f"Python {sys.version.split()[0]}, tripwire {tw.__version__}, frame layout verified: {twf.status()['layout_verified'] or _core._frame_verify_layout()[0]}"
    )
    parts = a.only or ["hit", "unrelated", "cycle"]
    if "hit" in parts:
        part_hit(a.number, a.repeat, torch_ok)
    if "unrelated" in parts:
        part_unrelated(a.number, a.repeat, a.instructions)
    if "cycle" in parts:
        for how in a.size_guard:
            part_cycle(a.number, a.repeat, torch_ok, how)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The per-call paths (a @specialize hit, Cache.lookup) in one run: time (min and median, interleaved) and
instructions counted by callgrind.

    python bench/per_call.py [--repeat 15] [--number 20000] [--instructions [N]]

* ``specialize``: a ``@tripwire.specialize`` hit on ``f(x, n, cfg)`` (3 arguments: two ints and a
  small dict, 6 inferred guards) against a plain call of the same function. Target: at most 2x.
* ``cache``: ``Cache.lookup`` in a cache of 1,024 entries (EQUALS_MATCH on ``L['x']`` = i and on
  ``L['y']``), the inputs a random permutation of all 1,024 keys cycled (each lookup hits another
  entry), against a lookup in a cache of one entry that hits its most recent entry. Target: at
  most 1.5x.

Timing: each repeat times every contender once, back to back (``--number`` calls each, from a C
loop: ``_floor.repeat_vectorcall`` / ``repeat_call_each``); printed min and median ns per call and
the ratios. ``--instructions`` runs each contender again under ``valgrind --tool=callgrind``,
collecting only inside that C loop, and prints instructions per call (deterministic). No
assertions: bench/README.md reports the figures.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _callgrind  # noqa: E402
import floor_build  # noqa: E402

N_ENTRIES = 1024


def body(x, n, cfg):
    return x + n


def _specialize_case(which: str) -> tuple[Any, Any, str]:
    """(callable, args tuple, loop kind) for the specialize contenders."""
    import tripwire as tw

    args = (3, 4, {"mode": "fast", "unroll": 4})
    if which == "plain":
        return body, args, "vectorcall"
    spec = tw.specialize(body, backend="bench")
    spec(*args)  # compile
    spec(*args)  # the first hit
    return spec, args, "vectorcall"


def _cache_case(which: str, seed: int = 0) -> tuple[Any, Any, str]:
    """(lookup, list of f_locals, loop kind) for the cache contenders."""
    import tripwire as tw

    n = 1 if which == "one" else N_ENTRIES
    cache = tw.Cache(recompile_limit=n + 1, accumulated_limit=n + 1)
    inputs = []
    for i in range(n):
        f_locals = {"x": i, "y": "mode"}
        b = tw.GuardBuilder(f_locals)
        b.equals("L['x']")
        b.equals("L['y']")
        cache.insert(b.build(), i)
        inputs.append(f_locals)
    if which == "cycling":
        random.Random(seed).shuffle(inputs)
    for f in inputs:  # each must hit; warms the index
        assert cache.lookup(f) is not None
    return cache.lookup, inputs, "each"


CASES = {
    ("specialize", "plain"): lambda: _specialize_case("plain"),
    ("specialize", "hit"): lambda: _specialize_case("hit"),
    ("cache", "one"): lambda: _cache_case("one"),
    ("cache", "cycling"): lambda: _cache_case("cycling"),
}
TARGETS = {"specialize": ("hit", "plain", 2.0), "cache": ("cycling", "one", 1.5)}


def _loop(floor: Any, fn: Any, arg: Any, kind: str, calls: int) -> None:
    if kind == "vectorcall":
        floor.repeat_vectorcall(fn, arg, calls)
    else:
        floor.repeat_call_each(fn, arg, max(1, calls // len(arg)))


def _calls_per_run(arg: Any, kind: str, calls: int) -> int:
    return calls if kind == "vectorcall" else max(1, calls // len(arg)) * len(arg)


def measure(repeat: int, number: int) -> dict[tuple[str, str], list[float]]:
    floor = floor_build.load()
    built = {k: make() for k, make in CASES.items()}
    samples: dict[tuple[str, str], list[float]] = {k: [] for k in CASES}
    keys = list(CASES)
    for r in range(repeat):
        for j in range(len(keys)):
            k = keys[(r + j) % len(keys)]
            fn, arg, kind = built[k]
            calls = _calls_per_run(arg, kind, number)
            t0 = time.perf_counter_ns()
            _loop(floor, fn, arg, kind, number)
            samples[k].append((time.perf_counter_ns() - t0) / calls)
    return samples


def _callgrind_child(group: str, which: str, calls: int) -> None:
    import gc

    floor = floor_build.load()
    fn, arg, kind = CASES[(group, which)]()
    for _ in range(2):  # warm, outside the collected C loop
        for a in arg if kind == "each" else [arg] * 25:
            fn(a) if kind == "each" else fn(*a)
    gc.collect()
    gc.disable()
    _loop(floor, fn, arg, kind, calls)


def instructions(group: str, which: str, calls: int, out_dir: str) -> float | None:
    fn_name = "tw_bench_repeat_vectorcall" if group == "specialize" else "tw_bench_repeat_call_each"
    code = f"import sys; sys.path.insert(0, {HERE!r}); import per_call; per_call._callgrind_child({group!r}, {which!r}, {calls})"
    found = _callgrind.totals(
        ["-c", code], os.path.join(out_dir, f"callgrind.{group}.{which}.out"), function=fn_name
    )
    total = found[0] if found else None
    if total is None:
        return None
    _, arg, kind = (
        (None, [None] * (N_ENTRIES if which == "cycling" else 1), "each")
        if group == "cache"
        else (None, None, "vectorcall")
    )
    n_calls = calls if kind == "vectorcall" else max(1, calls // len(arg)) * len(arg)
    return total / n_calls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--number", type=int, default=20000, help="calls per contender per repeat")
    ap.add_argument("--instructions", type=int, nargs="?", const=4096, default=0, metavar="N")
    a = ap.parse_args(argv)
    import platform

    print(f"Python {platform.python_version()}, {os.cpu_count()} CPUs")
    samples = measure(a.repeat, a.number)
    ir: dict[tuple[str, str], float | None] = {}
    if a.instructions:
        out_dir = tempfile.mkdtemp(prefix="tripwire-percall-")
        print(f"callgrind outputs in {out_dir}")
        for k in CASES:
            ir[k] = instructions(*k, a.instructions, out_dir)
    print(f"{'contender':<22}{'min ns':>9}{'median ns':>11}{'instr/call':>12}")
    for k, s in samples.items():
        instr = f"{ir[k]:,.0f}" if ir.get(k) else "-"
        print(f"{k[0] + ' ' + k[1]:<22}{min(s):>9.1f}{statistics.median(s):>11.1f}{instr:>12}")
    for group, (num, den, bound) in TARGETS.items():
        a_s, b_s = samples[(group, num)], samples[(group, den)]
        r_min = min(a_s) / min(b_s)
        r_med = statistics.median([x / y for x, y in zip(a_s, b_s, strict=True)])
        line = f"{group}: {num}/{den} = {r_min:.2f} (mins), {r_med:.2f} (median of per-repeat ratios)"
        if ir.get((group, num)) and ir.get((group, den)):
            r_ir = ir[(group, num)] / ir[(group, den)]
            line += f", {r_ir:.2f} by instructions"
            line += f" -> target <= {bound}: {'MET' if r_ir <= bound else 'MISSED'} (instructions)"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Lookup scaling of tripwire.Cache against a linear scan (Dynamo's way), in one run.

For N = 1, 8, 64, 256, 1024 entries that differ by a constant (EQUALS_MATCH on L['x']), by a
type (TYPE_MATCH on L['x']), by a float (EQUALS_MATCH on L['x'] = i + 0.5) or by a constant below a
root (EQUALS_MATCH on L['cfg']['mode']), time one lookup hitting entries spread over the whole
cache, with:
  cache   tripwire.Cache.lookup (probes, dispatch index, candidates MRU first)
  scan    the same GuardSets checked in order with GuardSet.check until one passes (a Python loop)
Prints min and median per lookup in nanoseconds and the ratio to N=1; asserts nothing.

    python bench/cache_lookup.py [--repeat 15] [--number 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import tripwire as tw

SIZES = (1, 8, 64, 256, 1024)
SAMPLES = 16  # distinct inputs per timing loop, spread over the entries


def _entries(kind: str, n: int) -> tuple[list[tw.GuardSet], list[dict[str, Any]]]:
    sets, inputs = [], []
    for i in range(n):
        if kind == "constant":
            value: Any = i
        elif kind == "float":
            value = i + 0.5
        elif kind == "nested":
            value = {"mode": f"m{i}", "other": 1}
        else:
            value = type(f"T{i}", (), {})()
        name = "cfg" if kind == "nested" else "x"
        b = tw.GuardBuilder({name: value, "y": "mode"})
        if kind == "type":
            b.type_match("L['x']")
        elif kind == "nested":
            b.equals("L['cfg']['mode']")
        else:
            b.equals("L['x']")
        b.equals("L['y']")
        sets.append(b.build())
        inputs.append({name: value, "y": "mode"})
    step = max(1, n // SAMPLES)
    return sets, [inputs[i] for i in range(0, n, step)][:SAMPLES]


def _time(fn: Callable[[], None], loops: int, repeat: int) -> tuple[float, float]:
    """(min, median) seconds per call of fn, where fn runs `loops` lookups."""
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t0) / loops)
    return min(runs), statistics.median(runs)


def measure(kind: str, n: int, number: int, repeat: int) -> dict[str, tuple[float, float]]:
    sets, inputs = _entries(kind, n)
    cache = tw.Cache(recompile_limit=n + 1, accumulated_limit=n + 1)
    for i, gs in enumerate(sets):
        cache.insert(gs, i)
    rounds = max(1, number // len(inputs))
    loops = rounds * len(inputs)
    lookup = cache.lookup
    for f in inputs:  # each must hit, and warm the index
        assert lookup(f) is not None

    def run_cache() -> None:
        for _ in range(rounds):
            for f in inputs:
                lookup(f)

    def run_scan() -> None:
        for _ in range(rounds):
            for f in inputs:
                for gs in sets:
                    if gs.check(f):
                        break

    return {"cache": _time(run_cache, loops, repeat), "scan": _time(run_scan, loops, repeat)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--number", type=int, default=2000, help="lookups per timing run")
    args = ap.parse_args()
    print(
        f"{'kind':<9}{'N':>6}  {'cache min':>10} {'median':>8} {'xN=1':>6}  {'scan min':>10} {'median':>10} {'xN=1':>7}"
    )
    for kind in ("constant", "type", "float", "nested"):
        base: dict[str, float] = {}
        for n in SIZES:
            # The scan at large N is slow: fewer lookups per run keep the whole benchmark short.
            number = args.number if n <= 64 else max(50, args.number * 64 // n)
            r = measure(kind, n, number, args.repeat)
            if n == 1:
                base = {k: v[1] for k, v in r.items()}
            c, s = r["cache"], r["scan"]
            print(
                f"{kind:<9}{n:>6}  {c[0] * 1e9:>10.0f} {c[1] * 1e9:>8.0f} {c[1] / base['cache']:>6.2f}"
                f"  {s[0] * 1e9:>10.0f} {s[1] * 1e9:>10.0f} {s[1] / base['scan']:>7.1f}"
            )
    print("ns per lookup; xN=1: median relative to N=1 of the same column.")


if __name__ == "__main__":
    main()

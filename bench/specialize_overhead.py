"""The cost of a ``@tripwire.specialize`` hit, against the alternatives, in one run.

    python bench/specialize_overhead.py [--repeat 15] [--number 20000]

Calls ``f(x, n, cfg)`` (an int, an int and a small dict) that many times per repeat, and prints
the minimum and median ns per call of:

* plain: the function itself;
* lru_cache: ``functools.lru_cache`` on a function of the same hashable arguments (the dict
  passed as a tuple of items, since lru_cache cannot hash it);
* specialize hit: ``tw.specialize`` (identity compiler) after the first call compiled;
* torch.compile(backend="eager"), when torch imports (its guards on the same arguments).

* Cache.lookup alone: the same cache looked up from Python on a fresh ``f_locals`` dict per call
  (what the hit pays inside the runtime, plus a Python call and the dict display).

Issue 3's target is a specialize hit at <= 2x a plain call. A hit of a function whose parameters
are all positional, called positionally, takes the C++ vectorcall path (``_core.FastDispatch``:
f_locals, lookup and the payload call in C++). No assertions.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time


def body(x, n, cfg):
    return x + n


def measure(call, args, number, repeat):
    per = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        for _ in range(number):
            call(*args)
        per.append((time.perf_counter_ns() - t0) / number)
    return min(per), statistics.median(per)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--number", type=int, default=20000)
    a = ap.parse_args(argv)

    import tripwire as tw

    cfg = {"mode": "fast", "unroll": 4}
    args = (3, 4, cfg)
    rows = []

    rows.append(("plain call", body, args))

    @functools.lru_cache(maxsize=None)
    def cached(x, n, cfg_items):
        return x + n

    rows.append(("functools.lru_cache", cached, (3, 4, tuple(cfg.items()))))

    spec = tw.specialize(body, backend="bench")
    spec(*args)
    rows.append(("tw.specialize hit", spec, args))
    lookup = spec.cache.lookup

    def lookup_only(x, n, cfg):
        return lookup({"x": x, "n": n, "cfg": cfg})

    rows.append(("  Cache.lookup alone (fresh dict)", lookup_only, args))

    try:
        import torch  # noqa: F401
    except Exception as e:  # noqa: BLE001 - optional
        print(f"(torch not available: {type(e).__name__}: {e})")
    else:
        import torch

        def tbody(x, n, cfg):
            return x + n

        compiled = torch.compile(tbody, backend="eager", dynamic=False)
        compiled(*args)
        rows.append(("torch.compile(backend='eager')", compiled, args))

    base = None
    print(f"{'':34s} {'min ns':>9s} {'median ns':>10s} {'x plain (min)':>14s}")
    for name, call, cargs in rows:
        mn, med = measure(call, cargs, a.number, a.repeat)
        base = mn if base is None else base
        print(f"{name:34s} {mn:9.0f} {med:10.0f} {mn / base:14.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

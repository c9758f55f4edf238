"""The cost of a ``@tripwire.specialize`` hit, against the alternatives, in one run.

    python bench/specialize_overhead.py [--repeat 15] [--number 20000]

Cases (each with its own plain-call baseline, measured interleaved with it):

* ``f(x, n, cfg)`` -- an int, an int and a small dict: 6 inferred guards (EQUALS x2, TYPE_MATCH,
  DICT_KEYS, EQUALS on two dict items);
* ``g(x, n)`` -- two ints: 2 guards;
* ``f(x=..., n=..., cfg=...)`` -- the first case called with keywords (bound in C++);
* ``h(x, *rest, k=1)`` -- ``*args`` and a keyword-only default.

Contenders per case: the plain function, ``functools.lru_cache`` (first case only, on a function of
the same hashable arguments: the dict passed as a tuple of items), the ``tw.specialize`` hit
(identity compiler, after the first call compiled) and, for the first case,
``torch.compile(backend="eager")`` when torch imports.

The machine is noisy, so every repeat times each contender once, back to back. Printed: min and
median ns per call of each contender, the ratio of its min to the plain call's min, and the median
over repeats of the ratio to the plain call taken within each repeat. Issue 3's target is a
specialize hit at <= 2x a plain call. No assertions.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any


def body(x, n, cfg):
    return x + n


def body2(x, n):
    return x + n


def body3(x, *rest, k=1):
    return x + k


def _time(call: Callable, args: tuple, kwargs: dict, number: int) -> float:
    t0 = time.perf_counter_ns()
    if kwargs:
        for _ in range(number):
            call(*args, **kwargs)
    else:
        for _ in range(number):
            call(*args)
    return (time.perf_counter_ns() - t0) / number


def run_case(title: str, rows: list[tuple[str, Callable, tuple, dict]], number: int, repeat: int) -> None:
    """rows[0] is the plain-call baseline."""
    times: dict[str, list[float]] = {name: [] for name, *_ in rows}
    ratios: dict[str, list[float]] = {name: [] for name, *_ in rows}
    for _ in range(repeat):
        base = None
        for name, call, args, kwargs in rows:
            t = _time(call, args, kwargs, number)
            times[name].append(t)
            base = t if base is None else base
            ratios[name].append(t / base)
    print(f"\n{title}")
    print(f"  {'':32s} {'min ns':>8s} {'median ns':>10s} {'x plain (mins)':>15s} {'x plain (median)':>17s}")
    base_min = min(times[rows[0][0]])
    for name, *_ in rows:
        ts, rs = times[name], ratios[name]
        print(
            f"  {name:32s} {min(ts):8.0f} {statistics.median(ts):10.0f} {min(ts) / base_min:15.2f} "
            f"{statistics.median(rs):17.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--number", type=int, default=20000)
    a = ap.parse_args(argv)

    import tripwire as tw

    cfg = {"mode": "fast", "unroll": 4}
    args = (3, 4, cfg)

    @functools.cache
    def cached(x, n, cfg_items):
        return x + n

    spec = tw.specialize(body, backend="bench")
    spec(*args)
    rows: list[tuple[str, Callable, tuple, dict]] = [
        ("plain call", body, args, {}),
        ("functools.lru_cache", cached, (3, 4, tuple(cfg.items())), {}),
        ("tw.specialize hit", spec, args, {}),
    ]
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - optional
        print(f"(torch not available: {type(e).__name__}: {e})")
    else:

        def tbody(x, n, cfg):
            return x + n

        compiled: Any = torch.compile(tbody, backend="eager", dynamic=False)
        compiled(*args)
        rows.append(("torch.compile(backend='eager')", compiled, args, {}))
    run_case("f(3, 4, {'mode': 'fast', 'unroll': 4})  -- 6 guards", rows, a.number, a.repeat)

    spec2 = tw.specialize(body2, backend="bench")
    spec2(3, 4)
    run_case(
        "g(3, 4)  -- 2 guards",
        [("plain call", body2, (3, 4), {}), ("tw.specialize hit", spec2, (3, 4), {})],
        a.number,
        a.repeat,
    )

    kw = {"x": 3, "n": 4, "cfg": cfg}
    spec(**kw)
    run_case(
        "f(x=3, n=4, cfg={...})  -- keywords, bound in C++",
        [("plain call", body, (), kw), ("tw.specialize hit", spec, (), kw)],
        a.number,
        a.repeat,
    )

    spec3 = tw.specialize(body3, backend="bench")
    spec3(3, 5, 6)
    run_case(
        "h(3, 5, 6)  -- *args tuple and a keyword-only default",
        [("plain call", body3, (3, 5, 6), {}), ("tw.specialize hit", spec3, (3, 5, 6), {})],
        a.number,
        a.repeat,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the benchmarks share: a :class:`Contender` (a named check and what it is called with), the
round-robin :func:`measure`, and the plain-text results table.

Used by bench/guard_eval.py (W1-W3), bench/real_models.py (guard sets imported
from torch.compile) and bench/tensor_guards.py (T1, A1, G1). Importing it imports nothing heavy.
"""

from __future__ import annotations

import gc
import statistics
import timeit
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NO_ARGUMENT", "Contender", "fmt_ns", "measure", "ratio_columns", "table"]

NO_ARGUMENT: Any = object()  # Contender.f_locals for a check called with no argument


@dataclass
class Contender:
    """One column of a comparison: ``check(f_locals)`` (or ``check()`` when ``f_locals`` is
    NO_ARGUMENT), timed in ns per call, one sample per repeat."""

    name: str
    check: Callable[..., Any]
    f_locals: Any = NO_ARGUMENT
    guards: int | None = None
    note: str = ""
    samples: list[float] = field(default_factory=list)  # ns per call, one per repeat
    number: int = 0  # calls per sample (calibrated)
    instructions: float | None = None  # per check, from callgrind (--instructions)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def timer(self) -> timeit.Timer:
        if self.f_locals is NO_ARGUMENT:
            return timeit.Timer(self.check)
        return timeit.Timer("f(L)", globals={"f": self.check, "L": self.f_locals})


def _calibrate(c: Contender, target_s: float, cap: int) -> None:
    t = c.timer()
    n = 1
    while True:
        dt = t.timeit(n)
        if dt >= target_s / 5 or n >= cap:
            break
        n *= 4
    c.number = max(1, int(n * target_s / max(dt, 1e-9)))


def measure(
    contenders: list[Contender], repeat: int, target_s: float, *, gc_off: bool = False, cap: int = 10_000_000
) -> None:
    """Round-robin: each repeat times every contender once, in a rotating order, so machine noise
    spreads over all of them instead of hitting one column. Each sample takes about ``target_s``.
    ``gc_off``: collect before each sample and keep the collector off during it."""
    for c in contenders:
        _calibrate(c, target_s, cap)
    timers = [c.timer() for c in contenders]
    k = len(contenders)
    for r in range(repeat):
        for j in range(k):
            i = (r + j) % k
            c = contenders[i]
            if gc_off:
                gc.collect()
            was = gc.isenabled()
            if gc_off:
                gc.disable()
            try:
                dt = timers[i].timeit(c.number)
            finally:
                if gc_off and was:
                    gc.enable()
            c.samples.append(dt / c.number * 1e9)


def fmt_ns(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}"


def ratio_columns(tw: Contender, c: Contender) -> list[str]:
    """The ``tw/x (min)`` and ``tw/x (med)`` cells: the tripwire column's time over ``c``'s."""
    return [f"{tw.min / c.min:.3f}", f"{tw.median / c.median:.3f}"]


def table(rows: list[list[str]], header: list[str], right: set[int]) -> str:
    """A plain-text table; columns in ``right`` are right-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(r: list[str]) -> str:
        return "  ".join(
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), sep] + [line(r) for r in rows])

"""What every cache in the process holds: ``tripwire.summary()``.

::

    import tripwire as tw
    print(tw.summary())        # one block per cache: entries, hits, misses, compiles, reasons
    s = tw.summary()
    s.caches[0].misses, s.caches[0].compiles[-1].reasons

A cache is listed when it holds entries or has compiled: the cache of each ``@specialize``'d
function, of each code object the frame runtime (:mod:`tripwire.frame`) compiled, and each
:class:`tripwire.Cache` made by hand. ``compiles`` are the compiles ``specialize`` and the frame
runtime recorded (the last 64 per cache), each with how long it took and, while
:func:`tripwire.record_recompiles` is on (or the ``tripwire.recompiles`` log is enabled), why every
entry then cached did not match the call that caused it. A summary is a snapshot made of numbers and strings: it keeps no cached
object, guard set or argument alive. :func:`tripwire.report` renders the same data as HTML.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Literal, cast

from .cache import Cache, CompileRecord, live_caches
from .guard_set import GuardSet

__all__ = ["CacheSummary", "EntrySummary", "Summary", "summarize_cache", "summary"]

CacheKind = Literal["specialize", "frame", "cache"]


@dataclass(frozen=True)
class EntrySummary:
    """One cached entry: its name, hits, number of guards and (when asked for) its guard tree."""

    name: str | None
    hits: int
    guards: int
    explain: str | None  # GuardSet.explain(): each guard with where it was installed


@dataclass(frozen=True)
class CacheSummary:
    """One cache. ``kind`` says whose: ``"specialize"`` (``name`` is the function),
    ``"frame"`` (the code object the frame runtime compiled) or ``"cache"`` (made by hand)."""

    kind: CacheKind
    name: str
    where: str | None  # file:line of the function or code object
    backend: str | None
    entries: tuple[EntrySummary, ...]  # most recently used first
    hits: int
    misses: int
    recompiles: int
    evictions: int
    invalidations: int
    compile_count: int  # every compile recorded, including those no longer in ``compiles``
    compile_seconds: float
    compiles: tuple[CompileRecord, ...]  # the last 64, oldest first

    @property
    def title(self) -> str:
        text = f"{self.kind} {self.name}"
        if self.where:
            text += f" ({self.where})"
        if self.backend:
            text += f" backend={self.backend}"
        return text

    def describe(self, *, guards: bool = False, reasons: int | None = None) -> str:
        """Readable text: the counts, the entries (with their guard trees when ``guards`` and
        the summary has them), the compiles (the last ``reasons`` of them, all when None) with
        why each cached entry did not match."""
        lines = [
            self.title,
            f"  {len(self.entries)} entries, {self.hits} hits, {self.misses} misses, "
            f"{self.compile_count} compiles in {self.compile_seconds:.3f} s, {self.recompiles} recompiles, "
            f"{self.evictions} evictions, {self.invalidations} invalidations",
        ]
        for e in self.entries:
            lines.append(f"  entry {e.name}: {e.hits} hits, {e.guards} guards")
            if guards and e.explain is not None:
                lines.extend("      " + line for line in e.explain.splitlines())
        shown = self.compiles if reasons is None else self.compiles[-reasons:] if reasons > 0 else ()
        if len(shown) < self.compile_count:
            lines.append(f"  compiles (the last {len(shown)} of {self.compile_count}):")
        elif shown:
            lines.append("  compiles:")
        for c in shown:
            took = "" if c.seconds is None else f" in {c.seconds * 1000:.1f} ms"
            if c.reasons is None:
                note = " (reasons not recorded: tripwire.record_recompiles())"
            else:
                note = "" if c.reasons else " (first compile)"
            lines.append(f"    {_clock(c.at)} {c.entry}{took}{note}")
            for r in c.reasons or ():
                why = "matched (another entry was preferred)" if r.reason is None else r.reason
                lines.append(f"      - {r.entry}: {why}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe(reasons=3)


@dataclass(frozen=True)
class Summary:
    """Every cache with entries or compiles (``caches``, oldest first) and the totals."""

    caches: tuple[CacheSummary, ...]
    empty: int  # live caches with no entry and no compile (e.g. code the frame runtime skipped)

    @property
    def entries(self) -> int:
        return sum(len(c.entries) for c in self.caches)

    @property
    def hits(self) -> int:
        return sum(c.hits for c in self.caches)

    @property
    def misses(self) -> int:
        return sum(c.misses for c in self.caches)

    @property
    def compile_count(self) -> int:
        return sum(c.compile_count for c in self.caches)

    @property
    def compile_seconds(self) -> float:
        return sum(c.compile_seconds for c in self.caches)

    @property
    def recompiles(self) -> int:
        return sum(c.recompiles for c in self.caches)

    def __str__(self) -> str:
        head = (
            f"tripwire: {len(self.caches)} caches, {self.entries} entries, {self.hits} hits, "
            f"{self.misses} misses, {self.compile_count} compiles in {self.compile_seconds:.3f} s, "
            f"{self.recompiles} recompiles"
        )
        if self.empty:
            head += f" ({self.empty} empty caches not shown)"
        return "\n\n".join([head, *(str(c) for c in self.caches)])


def summarize_cache(cache: Cache, *, guards: bool = False) -> CacheSummary:
    """The summary of one cache; ``guards`` adds each entry's guard tree (``explain()``)."""
    kind, name, where, backend = cache._owner
    hits, misses, recompiles, invalidations, evictions = cache._counters
    entries = []
    for e in cache.entries:
        gs = cast(GuardSet, e.guards)
        entries.append(EntrySummary(e.name, e.hits, len(gs), gs.explain() if guards else None))
    compiles = tuple(cache.compiles)
    return CacheSummary(
        kind=kind if kind in ("specialize", "frame") else "cache",  # type: ignore[arg-type]
        name=name,
        where=where,
        backend=backend,
        entries=tuple(entries),
        hits=hits,
        misses=misses,
        recompiles=recompiles,
        evictions=evictions,
        invalidations=invalidations,
        compiles=compiles,
        compile_count=cache._compile_count,  # read after the list (Cache counts before listing)
        compile_seconds=cache._compile_seconds,
    )


def summary(*, guards: bool = False) -> Summary:
    """Every live cache of the process: entries, hits, misses, compile time, recompile reasons.
    ``guards`` adds each entry's guard tree. ``print(tw.summary())`` shows the last 3 compiles of
    each cache; ``describe()`` on a :class:`CacheSummary` shows them all."""
    listed = []
    empty = 0
    for cache in live_caches():
        if len(cache) or cache._compile_count:
            listed.append(summarize_cache(cache, guards=guards))
        else:
            empty += 1
    return Summary(tuple(listed), empty)


def _clock(at: float) -> str:
    return datetime.datetime.fromtimestamp(at).strftime("%H:%M:%S")

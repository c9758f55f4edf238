"""Cache: the per-function cache of compiled entries (a Python face on the C++ ``CacheCore``).

One Cache belongs to one (function, backend) pair. ``lookup`` and ``lookup_entry`` are the C++
methods themselves: global-state probes once, the dispatch index, then the candidate entries most
recently used first. This module adds the conveniences that run only when asked: probe names,
the limit exception with reasons, ``why_not`` and ``stats``. See docs/cache.md.
"""

from __future__ import annotations

import collections
import functools
import itertools
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, NamedTuple, cast

import tripwire._core as _core

from .catalogue import GuardKind, GuardSpec, short_repr
from .errors import RecompileLimitExceeded
from .failure import Failure
from .guard_set import GuardSet

__all__ = ["Cache", "CacheEntry", "CompileRecord", "OnLimit", "RecompileReason", "record_recompiles"]

CacheEntry = _core.CacheEntry

OnLimit = Literal["raise", "fallback", "evict"]
"""What ``Cache.insert`` does at a limit (see :class:`Cache`)."""

_LIMIT_NAMES = {1: "recompile_limit", 2: "accumulated_limit"}

# How many compiles each cache remembers (the oldest are forgotten first; the counts stay whole).
HISTORY = 64


class RecompileReason(NamedTuple):
    """Why one cached entry did not match the call that caused a compile."""

    entry: str | None  # the entry's name
    reason: str | None  # the failing guard's reason; None: the entry would have matched
    installed_at: tuple[str, ...]  # where the failing guard was installed (innermost last)


class CompileRecord(NamedTuple):
    """One compile that inserted an entry: what was compiled, how long it took, and why each entry
    already cached did not match (empty for the first compile; None when the reasons were not
    computed: see :func:`record_recompiles`). Strings only: a record keeps no value of the call
    alive."""

    entry: str | None  # the new entry's name
    seconds: float | None  # the compile's wall time (None when the inserter did not time it)
    at: float  # time.time() when it was inserted
    reasons: tuple[RecompileReason, ...] | None


# A miss explains itself only when asked (DESIGN: why_not is computed when asked or logged).
_RECORD_REASONS = False


def record_recompiles(enabled: bool = True) -> bool:
    """Compute and keep, at every recompile of ``specialize`` and the frame runtime from now on,
    why each cached entry did not match (shown by :func:`tripwire.summary`,
    :func:`tripwire.report` and ``Specialized.explain()``). Off by default: the reasons cost one
    ``why_not`` over the cached entries per recompile. They are kept whenever the
    ``tripwire.recompiles`` log is enabled as well. Returns the previous setting."""
    global _RECORD_REASONS
    previous, _RECORD_REASONS = _RECORD_REASONS, bool(enabled)
    return previous


def recording_recompiles() -> bool:
    """Whether recompile reasons are being recorded (:func:`record_recompiles`)."""
    return _RECORD_REASONS


# Every live Cache, for tripwire.summary() and tripwire.report(): insertion-ordered weak
# references under a counter key. A plain dict, so that a snapshot (dict.copy) is one C call
# that a garbage collection running __del__ or weakref callbacks cannot interleave with.
_LIVE: dict[int, weakref.ref[Cache]] = {}
_LIVE_KEYS = itertools.count()


def _forget(key: int, live: dict[int, Any] = _LIVE) -> Callable[[Any], None]:
    # Bound eagerly: at interpreter teardown the module's globals may already be None.
    return lambda _ref: live.pop(key, None)


def live_caches() -> list[Cache]:
    """Every Cache alive in this process, oldest first."""
    out = []
    for ref in _LIVE.copy().values():
        cache = ref()
        if cache is not None:
            out.append(cache)
    return out


class Cache(_core.CacheCore):
    """Compiled entries for one function, each a GuardSet and a payload.

    ``lookup(f_locals, default=None)`` returns the payload of the first entry, most recently used
    first, whose guards hold, or ``default``. Since a payload may be None, tell a hit from a miss
    with ``lookup_entry(f_locals)`` (the entry or None) or a sentinel ``default``.

    ``on_limit`` says what ``insert`` does beyond ``recompile_limit`` (entries sharing the new
    entry's ID_MATCH'd objects reached from the locals, ``L[...]``) or ``accumulated_limit`` (all entries): ``"raise"``
    RecompileLimitExceeded, ``"fallback"`` insert nothing and return False (lookups keep missing;
    the caller runs the original function), ``"evict"`` drop the least recently used entry of the
    group concerned, then insert.

    ``probes`` are global-state probes (callables of no arguments, or built-in probe names such
    as ``"recursion_limit"``), evaluated once per lookup; an entry only matches under the probe
    values it was inserted under.
    """

    def __init__(
        self,
        recompile_limit: int = 8,
        accumulated_limit: int = 256,
        on_limit: OnLimit = "raise",
        *,
        probes: Iterable[str | Callable[[], Any]] = (),
    ) -> None:
        super().__init__(recompile_limit, accumulated_limit, on_limit)
        for p in probes:
            self.add_probe(p)
        # What the cache belongs to, for summary() and report(): (kind, name, where, backend);
        # set by specialize and the frame runtime.
        self._owner: tuple[str, str, str | None, str | None] = ("cache", "Cache", None, None)
        self._history: collections.deque[CompileRecord] = collections.deque(maxlen=HISTORY)
        self._compile_count = 0
        self._compile_seconds = 0.0
        key = next(_LIVE_KEYS)
        _LIVE[key] = weakref.ref(self, _forget(key))

    def add_probe(self, probe: str | Callable[[], Any], *, name: str | None = None) -> None:
        """Add a global-state probe. Only on an empty cache: existing entries hold no snapshot
        of it (raises ValueError otherwise)."""
        fn: Callable[[], Any]
        label: str
        if isinstance(probe, str):
            if probe not in _core.builtin_probes():
                raise ValueError(f"unknown built-in probe {probe!r}; known: {sorted(_core.builtin_probes())}")
            fn, label = functools.partial(_core.read_builtin_probe, probe), name or probe
        else:
            if not callable(probe):
                raise TypeError("a probe must be a built-in probe name or a callable")
            fn, label = probe, name or str(getattr(probe, "__qualname__", None) or repr(probe))
        if not self._add_probe(fn, label):
            raise ValueError("add_probe needs an empty cache: existing entries have no snapshot of the probe")

    def insert(
        self,
        guards: GuardSet,
        payload: Any,
        *,
        name: str | None = None,
        f_locals: Mapping[str, Any] | None = None,
    ) -> bool:
        """Add an entry at the front (most recently used). Returns True if inserted, False when a
        limit was hit under ``on_limit="fallback"``. Under ``"raise"`` a limit raises
        RecompileLimitExceeded; its ``reasons`` are why the existing entries failed on
        ``f_locals`` when given (the locals that caused this compile)."""
        code = self._insert(guards, payload, name)
        if code == 0:
            return True
        if self.on_limit == "raise":
            limit = _LIMIT_NAMES[code]
            reasons = (
                [str(f) for f in self.why_not(f_locals) if f is not None] if f_locals is not None else []
            )
            raise RecompileLimitExceeded(limit, getattr(self, limit), reasons)
        return False

    def __iter__(self) -> Iterator[CacheEntry]:
        """The entries, most recently used first."""
        return iter(self._entries())

    @property
    def entries(self) -> list[CacheEntry]:
        """The entries, most recently used first."""
        return self._entries()

    def why_not(self, f_locals: Mapping[str, Any]) -> list[Failure | None]:
        """Per entry (most recently used first), why it does not match these locals: a probe
        whose value changed since the entry was inserted, or its guard set's first failing
        guard. None for an entry that would match. Computed on demand; counts no hit or miss."""
        if type(f_locals) is not dict and not isinstance(f_locals, Mapping):  # as lookup: no silent miss
            raise TypeError(
                f"Cache.why_not: f_locals must be a dict (or a Mapping) of the frame's locals by name, "
                f"not {type(f_locals).__name__}"
            )
        entries = self._entries()
        current = self._probe_values()
        out: list[Failure | None] = []
        for e in entries:
            f = None
            snapshot = e._snapshot
            if current is not None and snapshot is not None and not self._snapshot_matches(e, current):
                f = self._probe_failure(snapshot, current)
            if f is None:
                f = cast(GuardSet, e.guards).why_not(f_locals)
            out.append(f)
        return out

    def _probe_failure(self, snapshot: tuple, current: tuple) -> Failure | None:
        for name, then, now in zip(self.probe_names, snapshot, current, strict=True):
            if not _core.equals_match(now, then):
                spec = GuardSpec(GuardKind.GLOBAL_STATE, None, (name, then, name), -1)
                reason = f"global state {name!r} changed: expected {short_repr(then)}, got {short_repr(now)}"
                return Failure(None, "GLOBAL_STATE", then, now, reason, spec)
        return None

    def _record_compile(
        self,
        name: str | None,
        seconds: float | None,
        names: Sequence[str | None],
        failures: Sequence[Failure | None] | None,
    ) -> None:
        """Remember a compile that inserted entry ``name``: ``names`` and ``failures`` are the
        entries cached before it and why each did not match (``why_not``), both empty for the
        first compile; ``failures`` is None when they were not computed."""
        reasons = None
        if failures is not None:
            reasons = tuple(
                RecompileReason(n, None if f is None else f.reason, () if f is None else tuple(f.stack))
                for n, f in zip(names, failures, strict=False)
            )
        # Counted before it is listed: a summary taken on another thread reads the list first and
        # the count after, so it never lists more compiles than it counts.
        self._compile_count += 1
        self._history.append(CompileRecord(name, seconds, time.time(), reasons))
        if seconds is not None:
            self._compile_seconds += seconds

    @property
    def compiles(self) -> list[CompileRecord]:
        """The compiles that inserted entries, oldest first (the last 64; ``specialize`` and the
        frame runtime record them, an entry inserted by hand is not a compile)."""
        return list(self._history)

    @property
    def stats(self) -> dict[str, Any]:
        """hits, misses, recompiles (inserts after the first), invalidations (entries dropped
        because an identity-held object died, each once), evictions, compiles and
        compile_seconds (the compiles recorded by specialize or the frame runtime, and their
        total time), entries (per-entry hits as (name, hits), most recently used first)."""
        hits, misses, recompiles, invalidations, evictions = self._counters
        return {
            "hits": hits,
            "misses": misses,
            "recompiles": recompiles,
            "invalidations": invalidations,
            "evictions": evictions,
            "compiles": self._compile_count,
            "compile_seconds": self._compile_seconds,
            "entries": [(e.name, e.hits) for e in self._entries()],
        }

    def __repr__(self) -> str:
        return (
            f"<tripwire.Cache {len(self)} entries, on_limit={self.on_limit!r}, index={self.index_source!r}>"
        )

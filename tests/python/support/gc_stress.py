"""Garbage collections that run user code at the worst moment.

On CPython 3.11 allocating a GC-tracked object (a list, a dict, a tuple, an iterator) can start a
collection, and a collection runs the finalizers (``__del__``) and weakref callbacks of cyclic
garbage: arbitrary user code, inside whatever C code allocated. The engine promises regions
without user code (docs/cpp.md, "Regions without user code"); these tools try to break that promise.

* :class:`Finalizer` puts an object with a ``__del__`` in a reference cycle, so that only a
  collection frees it, and runs an action on the k-th collection after :meth:`Finalizer.arm`.
* :func:`drain_free_lists` empties CPython's free lists of dicts, lists and tuples: an allocation
  served from a free list does not count towards a collection, so without draining, a collection
  rarely starts inside a short C region.
* :class:`SuiteStress` is the whole-suite mode (``pytest --gc-stress``): ``gc.set_threshold(1)``
  and a finalizer in a cycle that re-arms itself on every collection and mutates state each time
  (address reuse, drained free lists, live caches purged, a throwaway guard set built and
  checked), without changing what any test observes.

On 3.12+ a collection runs only at the interpreter's eval breaker, not inside C allocations, so
these tools mostly exercise the 3.11 hazard; they stay useful on every version (a finalizer still
runs where the engine drops the last reference to something).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class _Cycle:
    """Garbage only a collection can free; its ``__del__`` calls ``owner._collected()``."""

    def __init__(self, owner: Finalizer | SuiteStress) -> None:
        self.owner = owner
        self.me = self  # the reference cycle

    def __del__(self) -> None:
        self.owner._collected()


class Finalizer:
    """Runs ``action`` from a finalizer on the k-th collection after ``arm(k, action)``
    (k = 0: the next one). Re-arms itself on every earlier collection."""

    def __init__(self) -> None:
        self._countdown = -1
        self._action: Callable[[], None] | None = None
        self.fired = 0

    def arm(self, k: int, action: Callable[[], None]) -> None:
        self._countdown = k
        self._action = action
        _Cycle(self)

    def disarm(self) -> None:
        self._countdown = -1
        self._action = None

    def _collected(self) -> None:
        if self._countdown < 0:
            return
        if self._countdown == 0:
            action, self._action, self._countdown = self._action, None, -1
            self.fired += 1
            if action is not None:
                action()
            return
        self._countdown -= 1
        _Cycle(self)


_drained: list = []


def drain_free_lists() -> None:
    """Empty the free lists of dicts and lists (80 each on 3.11; kept until the next drain), so
    the next such allocation comes from the allocator and counts towards a collection."""
    _drained.clear()
    _drained.extend([{} for _ in range(80)])
    _drained.extend([[] for _ in range(80)])


@contextmanager
def collecting_often(threshold: int = 1) -> Iterator[None]:
    """A collection after every ``threshold`` (+1) GC allocations inside the block."""
    old = gc.get_threshold()
    gc.set_threshold(threshold)
    try:
        yield
    finally:
        gc.set_threshold(*old)


def hit_every_allocation(
    run: Callable[[], object],
    action: Callable[[], None],
    *,
    setup: Callable[[], object] | None = None,
    ks=range(4),
    phases=range(2),
):
    """Call ``run()`` repeatedly with a finalizer armed to fire ``action`` on the k-th collection,
    for every k in ``ks`` and allocation phase (0 or 1 GC allocation made between arming and the
    call): with ``gc.set_threshold(1)`` a collection starts at every second GC allocation, so over
    the sweep the collection lands on each allocation inside ``run``. ``setup()`` runs before
    arming (allocate the inputs there, not in ``run``). Yields each result with whether the action
    fired. Nothing between arming and ``run()`` allocates but the phase's one list."""
    fin = Finalizer()
    for k in ks:
        for phase in phases:
            if setup is not None:
                setup()
            fired = fin.fired
            drain_free_lists()
            old = gc.get_threshold()
            fin.arm(k, action)
            gc.set_threshold(1)
            if phase:
                _drained.append([])
            try:
                result = run()
            finally:
                gc.set_threshold(*old)
            fin.disarm()
            yield result, fin.fired > fired


ACTIVE = False  # set by conftest.py in --gc-stress mode
# The finalizer's heavier mutations (purging caches, re-entering the engine, draining free lists)
# run on every HEAVY_EVERY-th collection: each allocates, and the allocations a finalizer makes
# all but guarantee that the very next allocation starts another collection.
HEAVY_EVERY = 8


def scaled(n: int, divisor: int = 50) -> int:
    """``n`` iterations normally; ``n // divisor`` (at least 1) in --gc-stress mode, where every
    second allocation runs a collection and a finalizer, so long loops would take hours."""
    return max(1, n // divisor) if ACTIVE else n


def examples(n: int) -> int:
    """A hypothesis example count: ``n`` normally, ``n // 10`` under --gc-stress (generating
    examples is allocation-heavy Python, where the mode costs the most and tests the least)."""
    return scaled(n, 10)


class SuiteStress:
    """The ``--gc-stress`` mode of the test suite (see the module docstring)."""

    def __init__(self) -> None:
        self.caches: weakref.WeakSet = weakref.WeakSet()
        self.collections = 0
        self._ring: list = [None] * 64
        self._active = False
        self._old_threshold = gc.get_threshold()

    def start(self) -> None:
        self._active = True
        self._old_threshold = gc.get_threshold()
        _Cycle(self)
        gc.set_threshold(1)

    def stop(self) -> None:
        global _throwaway
        gc.set_threshold(*self._old_threshold)
        self._active = False
        gc.collect()  # run the pending finalizer once more, inactive
        _throwaway = None  # no guard set outlives the session (nanobind reports leaks at exit)
        self._ring = [None] * len(self._ring)
        _drained.clear()

    def _collected(self) -> None:
        if not self._active:
            return
        self.collections += 1
        # Objects of common sizes, freed soon: a new object often lands at a dead one's address.
        i = self.collections % len(self._ring)
        self._ring[i] = (object(), {"k": i}, [i], _Blob())
        if self.collections % HEAVY_EVERY == 0:
            # Caches drop entries whose guarded objects died (the cache changed mid-check). A
            # lookup or insert would change what the tests observe (hits, recency); purging
            # does not.
            for cache in _snapshot(self.caches):
                len(cache)
            # The engine re-entered from inside whatever allocated.
            _throwaway_check(self.collections)
            # Empty free lists: the next allocations start collections again.
            drain_free_lists()
        _Cycle(self)  # re-arm for the next collection


def _snapshot(caches: weakref.WeakSet) -> list:
    """The live caches. Another thread may add one while this copies (the GIL can switch inside
    the copy, and a WeakSet then raises "Set changed size during iteration"): copy again."""
    while True:
        try:
            return list(caches)
        except RuntimeError:
            continue


class _Blob:
    def __init__(self) -> None:
        self.a = 1
        self.b = "two"


_throwaway = None


def _throwaway_check(n: int) -> None:
    import tripwire as tw

    global _throwaway
    if _throwaway is None:
        b = tw.GuardBuilder({"x": {1, 2.5, "s"}, "o": _Blob()})
        b.equals("L['x']")
        b.type_match("L['o'].__dict__")
        b.dict_keys("L['o'].__dict__", ordered=False)
        _throwaway = b.build()
    _throwaway.check({"x": {"s", 1, 2.5}, "o": _Blob()} if n % 2 else {"x": {1}, "o": None})

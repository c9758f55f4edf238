"""tripwire.summary(), record_recompiles(), and Specialized.why_not / explain.

Every live cache is listed (specialize, the frame runtime, caches made by hand) with entries,
hits, misses, compile counts and time, and (while recording) why each cached entry did not match
the call that caused each compile. Records are strings: they keep no argument alive.
"""

from __future__ import annotations

import gc
import logging
import threading
import weakref

import pytest

import tripwire as tw
from frame_helpers import Compiler, guards
from tripwire import frame as twf


@pytest.fixture
def recording():
    previous = tw.record_recompiles(True)
    yield
    tw.record_recompiles(previous)


def caches_named(name):
    return [c for c in tw.summary().caches if c.name == name]


def scale(x, n=3):
    return x * n


def pick(cfg):
    return cfg["mode"]


def frame_target(x, n):
    return x + n


def test_counts_compile_time_and_reasons(recording):
    f = tw.specialize(scale)
    g = tw.specialize(pick)
    for v in (1, 2, 2, 2, "a"):
        f(v)
    f(1, n=4)
    g({"mode": "fast"})
    g({"mode": "slow"})
    g({"mode": "slow"})

    (cf,) = [c for c in tw.summary().caches if c.name == "scale" and len(c.entries) == 4]
    assert cf.kind == "specialize"
    assert cf.where == f"{scale.__code__.co_filename}:{scale.__code__.co_firstlineno}"
    assert cf.backend == "_identity_compiler"
    assert (cf.hits, cf.misses, cf.recompiles, cf.compile_count) == (2, 4, 3, 4)
    assert [e.name for e in cf.entries] == ["scale#3", "scale#2", "scale#1", "scale#0"]
    assert [e.hits for e in cf.entries] == [0, 0, 2, 0]
    assert cf.compile_seconds > 0
    assert all(r.seconds is not None and r.seconds > 0 for r in cf.compiles)
    assert cf.compile_seconds == pytest.approx(sum(r.seconds for r in cf.compiles))
    first, second, third, fourth = cf.compiles
    assert first.entry == "scale#0" and first.reasons == ()
    assert [r.entry for r in second.reasons] == ["scale#0"]
    assert second.reasons[0].reason == "L['x']: EQUALS_MATCH expected 1, got 2 (L['x'] == 1 is false)"
    assert second.reasons[0].installed_at and __file__ in second.reasons[0].installed_at[-1]
    assert [r.entry for r in third.reasons] == ["scale#1", "scale#0"]
    assert "expected 2, got 'a'" in third.reasons[0].reason
    # the last call differs from scale#0 in n only: that entry's reason names L['n']
    assert fourth.reasons[-1].entry == "scale#0" and fourth.reasons[-1].reason.startswith("L['n']")

    (cg,) = [c for c in tw.summary().caches if c.name == "pick" and len(c.entries) == 2]
    assert (cg.hits, cg.misses, cg.compile_count) == (1, 2, 2)
    assert "expected 'fast', got 'slow'" in cg.compiles[1].reasons[0].reason

    text = str(tw.summary())
    assert text.startswith("tripwire: ")
    assert "specialize scale (" in text and "4 entries, 2 hits, 4 misses, 4 compiles" in text
    assert "expected 'fast', got 'slow'" in text


def test_reasons_only_when_asked(caplog):
    previous = tw.record_recompiles(False)
    try:
        f = tw.specialize(scale)
        f(1)
        f(2)
        c = f.cache.compiles
        assert [r.reasons for r in c] == [(), None]  # first compile: nothing to explain
        assert "reasons not recorded" in f.explain()
        # the recompiles log computes them anyway: they are kept as well
        with caplog.at_level(logging.INFO, logger="tripwire.recompiles"):
            f(3)
        assert f.cache.compiles[-1].reasons is not None
        assert len(f.cache.compiles[-1].reasons) == 2
    finally:
        tw.record_recompiles(previous)


def test_records_keep_no_argument_alive(recording):
    class Thing:
        pass

    f = tw.specialize(lambda t, k: k)
    f(Thing(), 1)
    victim = Thing()
    ref = weakref.ref(victim)
    f(victim, 2)  # recompile: the reason mentions the call's values
    del victim
    f.cache.clear()
    gc.collect()
    assert ref() is None
    assert len(f.cache.compiles) == 2
    for record in f.cache.compiles:
        assert isinstance(record.entry, str) and isinstance(record.at, float)
        for r in record.reasons or ():
            assert isinstance(r.reason, str) and all(isinstance(s, str) for s in r.installed_at)


def test_dead_caches_leave_the_summary():
    def local_fn(x):
        return x

    f = tw.specialize(local_fn)
    f(1)
    assert caches_named("test_dead_caches_leave_the_summary.<locals>.local_fn")
    del f
    gc.collect()
    assert not caches_named("test_dead_caches_leave_the_summary.<locals>.local_fn")


def test_bare_cache_and_empty_caches():
    b = tw.GuardBuilder({"x": 1})
    b.equals("L['x']")
    cache = tw.Cache()
    cache.insert(b.build(), "payload", name="by-hand")
    assert cache.lookup({"x": 1}) == "payload"
    assert cache.lookup({"x": 2}) is None
    mine = [c for c in tw.summary().caches if c.entries and c.entries[0].name == "by-hand"]
    assert len(mine) == 1
    c = mine[0]
    assert (c.kind, c.name, c.hits, c.misses, c.compile_count, c.compiles) == ("cache", "Cache", 1, 1, 0, ())
    empty = tw.Cache()
    before = tw.summary().empty
    del empty
    gc.collect()
    assert tw.summary().empty == before - 1


def test_frame_caches_are_listed(recording):
    comp = Compiler(frame_target, plan=lambda fr: (fr.code, guards(fr, equals=["L['n']"])))
    with twf.hooked(comp):
        frame_target(1, 2)
        frame_target(5, 2)
        frame_target(1, 3)
    (c,) = [c for c in tw.summary().caches if c.kind == "frame" and c.name == "frame_target"]
    assert c.where == f"{frame_target.__code__.co_filename}:{frame_target.__code__.co_firstlineno}"
    assert c.backend == "Compiler" or "Compiler" in c.backend
    assert len(c.entries) == 2 and c.hits == 1 and c.compile_count == 2
    assert c.compiles[1].reasons[0].reason.startswith("L['n']: EQUALS_MATCH expected 2, got 3")
    assert c.compiles[1].seconds is not None
    twf.reset(frame_target)


def test_frame_cache_with_a_lying_backend(recording):
    class Lying:
        def __getattr__(self, name):
            raise RuntimeError("no attributes here")

        def __repr__(self):
            raise RuntimeError("no repr either")

        def __hash__(self):
            return 1

    comp = Compiler(frame_target, plan=lambda fr: (fr.code, guards(fr, equals=["L['n']"])))
    backend = Lying()
    with twf.hooked(comp, backend=backend):
        assert frame_target(1, 2) == 3
    (c,) = [c for c in tw.summary().caches if c.kind == "frame" and c.backend.endswith(".Lying")]
    assert c.name == "frame_target" and len(c.entries) == 1
    twf.reset(frame_target)


def test_history_is_bounded(recording):
    f = tw.specialize(scale, on_limit="evict", recompile_limit=4, accumulated_limit=4)
    for i in range(70):
        f(i)
    assert f.cache.stats["compiles"] == 70
    assert len(f.cache.compiles) == 64
    assert f.cache.compiles[-1].entry == "scale#69"
    (c,) = [c for c in tw.summary().caches if c.entries and c.entries[0].name == "scale#69"]
    assert c.compile_count == 70 and len(c.compiles) == 64 and len(c.entries) == 4
    assert "compiles (the last 3 of 70)" in str(c)
    assert "compiles (the last 64 of 70)" in c.describe()


def test_why_not(recording):
    f = tw.specialize(scale)
    assert f.why_not(1) == []
    f(1)
    f(2)
    before = dict(f.cache.stats)
    out = f.why_not(2)
    assert [x is None for x in out] == [True, False]  # f#1 (most recent) matches, f#0 does not
    assert out[1].reason == "L['x']: EQUALS_MATCH expected 1, got 2 (L['x'] == 1 is false)"
    assert [x.source for x in f.why_not(7, n=4)] == ["L['x']", "L['x']"]
    assert f.cache.stats == before  # nothing counted, nothing compiled
    with pytest.raises(TypeError):
        f.why_not(1, 2, 3)
    with pytest.raises(TypeError):
        f.why_not(1, m=2)


def test_why_not_on_a_method(recording):
    class Model:
        @tw.specialize
        def forward(self, y):
            return y

    m = Model()
    m.forward(1)
    (failure,) = Model.forward.why_not(m, 2)
    assert failure.source == "L['y']"
    assert Model.forward.why_not(m, 1) == [None]


def test_explain(recording):
    f = tw.specialize(pick)
    f({"mode": "fast"})
    f({"mode": "<b>slow</b>"})
    text = f.explain()
    lines = text.splitlines()
    assert lines[0].startswith("specialize pick (") and "backend=_identity_compiler" in lines[0]
    assert "2 entries, 0 hits, 2 misses, 2 compiles" in lines[1]
    assert "entry pick#1: 0 hits" in text and "entry pick#0: 0 hits" in text
    assert "EQUALS_MATCH: L['cfg']['mode'] == 'fast'" in text  # the guard tree
    assert "installed at" in text
    assert "- pick#0: L['cfg']['mode']: EQUALS_MATCH expected 'fast', got '<b>slow</b>'" in text


def test_summary_under_threads(recording):
    """Caches made and dropped on other threads while summaries are taken: no error, and every
    listed cache is whole."""
    stop = threading.Event()
    errors = []

    def churn():
        try:
            while not stop.is_set():
                f = tw.specialize(lambda x: x)
                f(1)
                f(2)
                del f
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=churn) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(200):
            s = tw.summary(guards=True)
            for c in s.caches:
                assert c.compile_count >= len(c.compiles)
            str(s)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors


def test_cache_made_by_a_finalizer_during_summary():
    """A garbage collection inside summary() may run __del__ that makes (and drops) caches."""
    made = []

    class Maker:
        def __del__(self):
            made.append(tw.Cache())

    for _ in range(50):
        a = Maker()
        a.cycle = a
        del a
        tw.summary()
    gc.collect()
    assert made

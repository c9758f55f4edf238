"""Threads: one GuardSet checked concurrently, with inputs changing underneath and user code that
releases the GIL in the middle of a check.

The GIL serialises C code, but a check runs user code (a __getattr__, a predicate) that can switch
threads mid-walk, so another thread may enter the same set's check while the first is suspended
inside it. Adaptive reordering and the walk state must survive that: no guard is ever skipped.
No assertion depends on timing: each thread runs a fixed number of iterations and every result
is compared with what it must be for the input that thread passed.
"""

from __future__ import annotations

import gc
import random
import sys
import threading
import time

import pytest

import reference
import tripwire as tw
from gc_stress import scaled


@pytest.fixture
def fast_switching():
    """Switch threads as often as CPython allows, to interleave checks as much as possible."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def run_threads(targets) -> None:
    """Run each callable in its own thread; re-raise the first failure in the main thread."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(targets))

    def wrap(fn):
        def run():
            try:
                start.wait()
                fn()
            except BaseException as e:
                errors.append(e)

        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def node_guard_sets(gs: tw.GuardSet) -> dict[str, list[int]]:
    """Each source's guard ids in their current (adaptive) order."""
    return {text: sorted(ids) for _, text, ids, _, _, _ in gs._tree()}


# -- snapshots published while other threads check ------------------------------------------


def _variant(rng: random.Random) -> dict:
    """A fresh input that passes or fails on a random subset of the guards below."""
    return {
        "x": rng.choice([1, 2, "1", 1.0]),
        "n": rng.choice([3, 3, -1, 3.0]),
        "cfg": rng.choice(
            [{"mode": "fast", "k": 1}, {"mode": "slow", "k": 1}, {"k": 1, "mode": "fast"}, {"mode": "fast"}]
        ),
        "xs": rng.choice([[1, 2, 3], [1, 2], (1, 2, 3), [3, 2, 1]]),
        "t": rng.choice([(1, "a"), (1, "b"), [1, "a"], (True, "a")]),
    }


def _snapshot_set() -> tuple[tw.GuardBuilder, tw.GuardSet]:
    good = {"x": 1, "n": 3, "cfg": {"mode": "fast", "k": 1}, "xs": [1, 2, 3], "t": (1, "a")}
    b = tw.GuardBuilder(good)
    b.type_match("L['x']")
    b.equals("L['x']")
    b.predicate(lambda n: n >= 0, "n >= 0", source="L['n']")  # Python code: a switch point
    b.type_match("L['n']")
    b.dict_keys("L['cfg']")
    b.equals("L['cfg']['mode']")
    b.type_match("L['xs']")
    b.length("L['xs']")
    b.equals("L['xs'][0]")
    b.equals("L['t']")
    return b, b.build()


def test_concurrent_checks_on_published_snapshots(fast_switching):
    b, gs = _snapshot_set()
    before = node_guard_sets(gs)
    current = [b.f_locals]
    stop = threading.Event()

    def publisher():
        rng = random.Random(1)
        for _ in range(4000):
            current[0] = _variant(rng)  # a new dict each time; never mutated once published
        stop.set()

    def checker(seed):
        def run():
            count = 0
            while not stop.is_set() or count < 200:
                snap = current[0]
                got = gs.check(snap)
                want = reference.check(gs.guards, snap)
                assert got is want, (snap, got, want)
                f = gs.why_not(snap)
                first = reference.first_failure(gs.guards, snap)
                assert (f is None) == (first is None) == got
                if f is not None:
                    assert f.guard.index == first[0].index, (snap, f, first)
                count += 1

        return run

    run_threads([publisher] + [checker(i) for i in range(3)])
    # The adaptive order moved guards around, but every node still has exactly its own guards.
    assert node_guard_sets(gs) == before
    assert gs.check(b.f_locals) is True


def test_concurrent_checks_while_a_shared_input_is_mutated_in_place(fast_switching):
    b, gs = _snapshot_set()
    shared = {"x": 1, "n": 3, "cfg": {"mode": "fast", "k": 1}, "xs": [1, 2, 3], "t": (1, "a")}
    stop = threading.Event()

    def mutator():
        rng = random.Random(2)
        for _ in range(scaled(20_000)):
            op = rng.randrange(6)
            if op == 0:
                shared["cfg"]["mode"] = rng.choice(["fast", "slow"])
            elif op == 1:
                shared["xs"].append(4) if len(shared["xs"]) < 5 else shared["xs"].pop()
            elif op == 2:
                shared["x"] = rng.choice([1, "1"])
            elif op == 3:
                shared.pop("t", None) if rng.random() < 0.5 else shared.__setitem__("t", (1, "a"))
            elif op == 4:
                shared["cfg"] = rng.choice([{"mode": "fast", "k": 1}, {"k": 1}])
            else:
                shared["xs"] = [1, 2, 3]
        stop.set()

    results = []

    def checker():
        count = 0
        while not stop.is_set() or count < 50:
            count += 1
            r = gs.check(shared)
            assert type(r) is bool
            f = gs.why_not(shared)
            assert f is None or isinstance(f, tw.Failure)
            results.append(r)

    run_threads([mutator, checker, checker])
    assert results
    # Settle the input: the answer is exact again.
    shared.update(x=1, n=3, cfg={"mode": "fast", "k": 1}, xs=[1, 2, 3], t=(1, "a"))
    assert gs.check(shared) is True
    shared["cfg"]["mode"] = "slow"
    assert gs.check(shared) is False


# -- user code that releases the GIL in the middle of a check -------------------------------


class Sleepy:
    """Attributes v<N> are computed by __getattr__, which yields the GIL first."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __getattr__(self, name):
        time.sleep(0)  # release the GIL: other threads run inside the same set's check
        hook = self.__dict__.get("hook")
        if hook is not None:
            hook()
        if name.startswith("v") and name[1:].isdigit():
            return int(name[1:])
        raise AttributeError(name)


def _sleepy_set():
    good = {"o": Sleepy(a=1, b=2), "p": Sleepy(c=3), "n": 5}
    b = tw.GuardBuilder(good)
    b.equals("L['o'].v1")
    b.equals("L['o'].a")
    b.equals("L['o'].v2")
    b.equals("L['o'].b")
    b.type_match("L['o']")
    b.equals("L['p'].v3")
    b.equals("L['p'].c")
    b.predicate(lambda n: time.sleep(0) or n > 0, "n > 0 (sleeps)", source="L['n']")
    b.equals("L['n']")
    return b, b.build()


# Inputs that each fail exactly one guard (by source), and inputs that pass.
FAILING = {
    "L['o'].a": lambda: {"o": Sleepy(a=9, b=2), "p": Sleepy(c=3), "n": 5},
    "L['o'].b": lambda: {"o": Sleepy(a=1, b=9), "p": Sleepy(c=3), "n": 5},
    "L['o'].v2": lambda: {"o": Sleepy(a=1, b=2, v2=9), "p": Sleepy(c=3), "n": 5},
    "L['p'].c": lambda: {"o": Sleepy(a=1, b=2), "p": Sleepy(c=9), "n": 5},
    "L['n']": lambda: {"o": Sleepy(a=1, b=2), "p": Sleepy(c=3), "n": 6},
    "L['p'].v3": lambda: {"o": Sleepy(a=1, b=2), "p": Sleepy(c=3, v3="3"), "n": 5},
}


def test_gil_released_inside_check_never_skips_a_guard(fast_switching):
    b, gs = _sleepy_set()
    before = node_guard_sets(gs)
    passing = b.f_locals
    assert gs.check(passing) is True
    for source, make in FAILING.items():
        f = gs.why_not(make())
        assert f is not None and f.source == source  # each input fails exactly where intended
        assert len(gs.failures(make())) == 1

    def failing_thread(source, make):
        def run():
            f_locals = make()
            for i in range(300):
                assert gs.check(f_locals) is False, (source, i)
                if i % 10 == 0:
                    f = gs.why_not(f_locals)
                    assert f is not None and f.source == source

        return run

    def passing_thread():
        f_locals = {"o": Sleepy(a=1, b=2), "p": Sleepy(c=3), "n": 5}
        for i in range(300):
            assert gs.check(f_locals) is True, i
            if i % 10 == 0:
                assert gs.why_not(f_locals) is None

    run_threads([failing_thread(s, m) for s, m in FAILING.items()] + [passing_thread, passing_thread])
    assert node_guard_sets(gs) == before
    assert gs.check_count > 0
    for source, make in FAILING.items():
        assert gs.check(make()) is False
        assert gs.why_not(make()).source == source
    assert gs.check(passing) is True


def test_reentrant_check_from_a_thread_switching_getattr(fast_switching):
    """A __getattr__ that yields the GIL and re-enters check on the same set (another input) while
    other threads are also inside it."""
    b, gs = _sleepy_set()
    inner_results: list[tuple[str, bool]] = []
    depth = threading.local()

    def reenter():
        if getattr(depth, "n", 0) == 0:
            depth.n = 1
            try:
                inner_results.append(("pass", gs.check({"o": Sleepy(a=1, b=2), "p": Sleepy(c=3), "n": 5})))
                inner_results.append(("fail", gs.check(FAILING["L['n']"]())))
            finally:
                depth.n = 0

    def outer(fail: bool):
        def run():
            for _ in range(100):
                f_locals = {"o": Sleepy(a=1, b=2, hook=reenter), "p": Sleepy(c=3 if not fail else 4), "n": 5}
                assert gs.check(f_locals) is (not fail)

        return run

    run_threads([outer(False), outer(True), outer(False), outer(True)])
    assert inner_results
    for kind, r in inner_results:
        assert r is (kind == "pass")


def test_invalidation_seen_by_every_thread(fast_switching):
    class Helper:
        pass

    g = {"helper": Helper()}
    b = tw.GuardBuilder({"n": 1}, f_globals=g)
    b.id_match("G['helper']")
    b.predicate(lambda n: time.sleep(0) or True, "yield", source="L['n']")
    gs = b.build()
    del b
    killed = threading.Event()

    def killer():
        for _ in range(50):
            time.sleep(0)
        g["helper"] = Helper()  # the old helper dies here; a new one may reuse its address
        gc.collect()
        killed.set()

    def checker():
        for _ in range(400):
            was_killed = killed.is_set()
            r = gs.check({"n": 1})
            assert type(r) is bool
            if was_killed:
                assert r is False  # once the helper is dead, never a pass again

    run_threads([killer, checker, checker, checker])
    assert gs.invalid
    assert gs.check({"n": 1}) is False
    assert "died" in gs.why_not({"n": 1}).reason

"""DICT_VERSION: change detection through the one dict watcher and per-guard change flags (3.12+),
ma_version_tag (3.11). The same behaviour is asserted on every version."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import pytest

import tripwire as tw
from frame_helpers import Compiler, tagged
from tripwire import _core
from tripwire import frame as twf

WATCHED = sys.version_info >= (3, 12)


def _version_guard(d: dict) -> tw.GuardSet:
    b = tw.GuardBuilder({"d": d})
    b.dict_version("L['d']")
    return b.build()


MUTATIONS = {
    "set": lambda d: d.__setitem__("new", 1),
    "replace": lambda d: d.__setitem__("a", 99),
    "delete": lambda d: d.__delitem__("a"),
    "clear": lambda d: d.clear(),
    "update": lambda d: d.update(z=0),
    "setdefault": lambda d: d.setdefault("q", 2),
    "pop": lambda d: d.pop("a"),
    "popitem": lambda d: d.popitem(),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_any_change_fails_the_guard_for_good(mutation):
    d = {"a": 1, "b": 2}
    gs = _version_guard(d)
    for _ in range(3):
        assert gs.check({"d": d})  # armed by the first pass, then decided by the flag
    snapshot = dict(d)
    MUTATIONS[mutation](d)
    assert not gs.check({"d": d})
    d.clear()
    d.update(snapshot)  # the same contents again: still a changed dict
    assert not gs.check({"d": d})
    assert not gs.check({"d": d})


def test_unchanged_writes_do_not_count_and_a_copy_is_another_dict():
    d = {"a": 1}
    gs = _version_guard(d)
    assert gs.check({"d": d})
    assert not gs.check({"d": dict(d)})  # another dict: its stamp differs
    assert gs.check({"d": d})
    d["a"] = d["a"]  # the same value object: CPython reports no change (3.11 keeps the tag too)
    assert gs.check({"d": d})


def test_one_change_flips_every_guard_armed_on_the_dict():
    d = {"a": 1}
    sets = [_version_guard(d) for _ in range(5)]
    assert all(gs.check({"d": d}) for gs in sets)
    if WATCHED:
        assert _core.testing.dict_watch_counts()[1] >= 5
    d["b"] = 2
    assert not any(gs.check({"d": d}) for gs in sets)


@pytest.mark.skipif(not WATCHED, reason="change flags are the 3.12+ dict watcher's")
def test_flags_are_unregistered_with_their_guard_sets():
    gc.collect()
    _, armed_before = _core.testing.dict_watch_counts()
    d = {"a": 1}
    sets = [_version_guard(d) for _ in range(10)]
    for gs in sets:
        assert gs.check({"d": d})
    assert _core.testing.dict_watch_counts()[1] == armed_before + 10
    del sets, gs
    gc.collect()
    assert _core.testing.dict_watch_counts()[1] == armed_before
    # The dict changes after its guards died: the watcher touches no freed flag (ASan checks).
    d["b"] = 2


def test_a_new_dict_at_a_dead_dicts_address_fails():
    d = {"a": 1}
    gs = _version_guard(d)
    assert gs.check({"d": d})
    address = id(d)
    del d
    gc.collect()
    fresh = [{"a": 1} for _ in range(2000)]
    same = [x for x in fresh if id(x) == address]
    for x in same:  # usually one: freed memory is reused first
        assert not gs.check({"d": x})
    assert not any(gs.check({"d": x}) for x in fresh[:50])


@pytest.mark.skipif(not WATCHED, reason="dict watchers are 3.12+")
def test_tripwire_takes_exactly_one_dict_watcher():
    script = textwrap.dedent(
        """
        import ctypes
        api = ctypes.pythonapi
        CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.py_object, ctypes.py_object, ctypes.py_object)
        api.PyDict_AddWatcher.argtypes = [CB]
        api.PyDict_AddWatcher.restype = ctypes.c_int
        api.PyDict_ClearWatcher.argtypes = [ctypes.c_int]
        def noop(event, d, k, v):
            return 0
        cb = CB(noop)
        def free_watchers():
            ids = []
            while True:
                try:
                    i = api.PyDict_AddWatcher(cb)  # raises once the interpreter has none left
                except RuntimeError:
                    break
                ids.append(i)
            for i in ids:
                api.PyDict_ClearWatcher(i)
            return len(ids)
        before = free_watchers()
        import tripwire as tw
        from tripwire import frame as twf
        for k in range(20):
            b = tw.GuardBuilder({"d": {"k": k}}); b.dict_version("L['d']"); b.build().check({"d": {}})
        def f(x): return x
        with twf.hooked(lambda fr: (fr.code, tw.GuardBuilder(fr.f_locals).build()) if fr.code is f.__code__ else None):
            f(1); f(2)
        after = free_watchers()
        print(before, after)
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    before, after = map(int, r.stdout.split())
    assert after == before - 1


CONFIG = {"mode": "fast", "scale": 2}


def scaled(x):
    return ("orig", x * CONFIG["scale"])


def test_a_frame_guarded_on_a_global_dicts_version_recompiles_when_it_changes():
    def plan(frame):
        b = tw.GuardBuilder(frame.f_locals, f_globals=frame.f_globals)
        b.type_match("L['x']")
        b.dict_version("G['CONFIG']")
        return tagged(scaled, "new"), b.build()

    comp = Compiler(scaled, plan=plan)
    try:
        with twf.hooked(comp):
            assert scaled(3) == ("new", 6)
            assert scaled(4) == ("new", 8)
            CONFIG["scale"] = 3
            assert scaled(4) == ("new", 12)
            assert scaled(5) == ("new", 15)
    finally:
        CONFIG["scale"] = 2
    assert len(comp.calls) == 2

"""The frame runtime's per-call pieces: the recursive skip, the per-call scope (a C callable), the
suspended call and the pre-compile limit query (docs/frame.md)."""

from __future__ import annotations

import sys
import threading

import pytest

import tripwire as tw
from tripwire import _core
from tripwire import frame as twf


def leaf(x):
    return x + 1


def middle(x):
    return leaf(x) * 2


def top(x):
    return middle(x) + 3


def recorder(decide=lambda frame: None):
    seen: list[str] = []

    def cb(frame):
        seen.append(frame.code.co_name)
        return decide(frame)

    return seen, twf.Hook(cb, backend=object())


def test_skip_recursive_suspends_the_whole_extent():
    seen, hook = recorder(lambda f: twf.SKIP_RECURSIVE if f.code is middle.__code__ else None)
    s = twf.scoped(top, hook)
    assert s(1) == 7
    assert seen == ["top", "middle"]  # leaf ran inside middle's extent: never offered
    assert twf.strategy_of(middle, hook.backend) == "skip_recursive"
    seen.clear()
    assert s(2) == 9
    assert seen == ["top"]  # middle is skipped for good, and leaf still not offered
    seen.clear()
    assert twf.scoped(leaf, hook)(1) == 2
    assert seen == ["leaf"]  # outside middle's extent leaf is an ordinary frame
    assert twf.current() is None


def test_scope_sets_the_hook_for_one_call_and_restores_the_previous():
    seen, hook = recorder()
    other_seen, other = recorder()
    s = twf.scoped(top, hook)
    with twf.hooked(other):
        assert s(1) == 7
        assert twf.current() is other
        leaf(0)
    assert seen == ["top", "middle", "leaf"]
    assert "leaf" in other_seen and "top" not in other_seen and "middle" not in other_seen
    assert twf.current() is None
    assert twf.status()["active_threads"] == 0


def test_scope_restores_on_an_exception_and_calls_on_error_suspended():
    seen, hook = recorder()
    states = []

    def boom(x):
        raise KeyError(x)

    def on_error(state):
        states.append(state)
        leaf(1)  # not offered: on_error runs with the hook suspended

    s = twf.scoped(boom, hook, enter=lambda: "st", on_error=on_error)
    with pytest.raises(KeyError):
        s(5)
    assert states == ["st"]
    assert seen == ["boom"]
    assert twf.current() is None


def test_on_error_that_raises_does_not_replace_the_calls_exception():
    _, hook = recorder()
    hits = []

    def failing_cleanup(state):
        raise RuntimeError("cleanup")

    def boom():
        raise KeyError("call")

    old = sys.unraisablehook
    sys.unraisablehook = lambda u: hits.append(u.exc_value)
    try:
        with pytest.raises(KeyError):
            twf.scoped(boom, hook, on_error=failing_cleanup)()
    finally:
        sys.unraisablehook = old
    assert len(hits) == 1 and isinstance(hits[0], RuntimeError)


def test_enter_not_implemented_diverts_to_the_fallback():
    seen, hook = recorder()
    s = twf.scoped(top, hook, fallback=lambda x: ("fallback", x), enter=lambda: NotImplemented)
    assert s(4) == ("fallback", 4)
    assert seen == []
    # Without a fallback the call runs unhooked.
    assert twf.scoped(top, hook, enter=lambda: NotImplemented)(1) == 7
    assert seen == []
    with pytest.raises(ZeroDivisionError):
        twf.scoped(top, hook, enter=lambda: 1 / 0)(1)


def test_foreign_hook_calls_the_fallback_or_raises():
    seen, hook = recorder()
    assert _core.testing.frame_floor_eval(True)
    try:
        assert twf.scoped(top, hook, fallback=lambda x: -x)(3) == -3
        with pytest.raises(tw.FrameError):
            twf.scoped(top, hook)(3)
    finally:
        assert _core.testing.frame_floor_eval(False)
    assert seen == []
    assert twf.scoped(top, hook)(1) == 7 and seen == ["top", "middle", "leaf"]


def test_suspended_call_and_a_scope_inside_it():
    seen, hook = recorder()
    sus = twf.suspended(middle)
    inner = twf.scoped(leaf, recorder()[1])

    def outer(x):
        return sus(x) + inner(x)

    with twf.hooked(hook):
        assert outer(1) == 6
    assert (
        "outer" in seen and "middle" not in seen and "leaf" not in seen
    )  # middle and its leaf suspended; inner's leaf went to its own hook


def test_scope_binds_as_a_method_and_carries_attributes():
    _, hook = recorder()

    class C:
        def __init__(self):
            self.k = 10

        def add(self, x):
            return self.k + x

        add_scoped = twf.scoped(add, hook)

    assert C().add_scoped(5) == 15
    s = twf.scoped(leaf, hook)
    s.__name__ = "named"
    assert s.__dict__ == {"__name__": "named"}
    assert s.fn is leaf and s.handler is hook and s.backend is hook.backend
    with pytest.raises(TypeError):
        twf.scoped(leaf, object())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _core.FrameScope(1, None, None)


def test_scope_per_thread():
    seen, hook = recorder()
    s = twf.scoped(top, hook)
    out = []

    def run():
        out.append(s(1))
        out.append(twf.current())

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out.count(7) == 4 and out.count(None) == 4
    assert twf.current() is None


class Obj:
    pass


def test_limit_reached_before_compiling():
    a, b = Obj(), Obj()
    asked = []

    def fn(o, n):
        return n

    def cb(frame):
        asked.append(frame.limit_reached())
        if asked[-1] is not None:
            return None  # declined before compiling: this call runs the original
        bld = tw.GuardBuilder(frame.f_locals)
        bld.id_match("L['o']")
        bld.equals("L['n']")
        return fn.__code__, bld.build()

    hook = twf.Hook(cb, backend=object(), recompile_limit=2, accumulated_limit=3)
    s = twf.scoped(fn, hook)
    for o, n in ((a, 1), (a, 2), (a, 3), (b, 1), (b, 2)):
        assert s(o, n) == n
    # a: 2 entries then refused before compiling; b has its own budget until the total (3) is hit.
    assert asked == [None, None, "recompile_limit", None, "accumulated_limit"]


def test_limit_reached_is_none_when_the_cache_evicts():
    def fn(n):
        return n

    got = []

    def cb(frame):
        got.append(frame.limit_reached())
        bld = tw.GuardBuilder(frame.f_locals)
        bld.equals("L['n']")
        return fn.__code__, bld.build()

    s = twf.scoped(fn, twf.Hook(cb, backend=object(), recompile_limit=1, on_limit="evict"))
    for n in range(3):
        assert s(n) == n
    assert got == [None, None, None]


def test_scope_dropping_its_last_reference_during_the_call():
    seen, hook = recorder()
    holder = {}
    errors = []

    def fn(x):
        holder.clear()  # the only other reference to the scope goes
        import gc

        gc.collect()
        raise ValueError(x)

    holder["s"] = twf.scoped(fn, hook, enter=lambda: "state", on_error=errors.append)
    call = holder["s"].__call__  # a bound method-wrapper holds the scope; drop our name for it
    with pytest.raises(ValueError):
        call(1)
    del call
    assert errors == ["state"]
    assert twf.current() is None

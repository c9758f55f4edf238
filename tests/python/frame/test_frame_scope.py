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


def test_divert_reads_rebound_globals_in_c_before_enter():
    import types

    seen, hook = recorder()
    mod = types.SimpleNamespace(state=types.SimpleNamespace(mode="default"), flag=False)
    entered = []

    def enter():
        entered.append(1)
        return "state"

    s = twf.scoped(
        top,
        hook,
        fallback=lambda x: ("fallback", x),
        divert=((mod, "state.mode", "eager"), (mod, "flag", True)),
        enter=enter,
    )
    assert s(1) == 7 and seen == ["top", "middle", "leaf"] and entered == [1]
    seen.clear()
    # Rebound, not mutated (as torch's set_stance replaces its stance object): read afresh.
    mod.state = types.SimpleNamespace(mode="eager")
    assert s(2) == ("fallback", 2)
    assert seen == [] and entered == [1]  # diverted before enter, the hook never set
    mod.state = types.SimpleNamespace(mode="default")
    mod.flag = True
    assert s(3) == ("fallback", 3)
    mod.flag = False
    assert s(1) == 7 and entered == [1, 1]
    # Without a fallback a diverted call runs unhooked.
    mod.flag = True
    seen.clear()
    assert twf.scoped(top, hook, divert=((mod, "flag", True),))(1) == 7
    assert seen == []
    assert twf.current() is None


def test_divert_errors_propagate_before_anything_ran():
    import types

    seen, hook = recorder()
    ran = []
    mod = types.SimpleNamespace()

    def fn():
        ran.append(1)

    s = twf.scoped(fn, hook, fallback=lambda: ran.append("fallback"), divert=((mod, "missing.mode", 1),))
    with pytest.raises(AttributeError, match="missing"):
        s()

    class Lying:
        def __eq__(self, other):
            raise ValueError("lying __eq__")

        __hash__ = object.__hash__

    mod.missing = types.SimpleNamespace(mode=Lying())
    with pytest.raises(ValueError, match="lying"):
        s()
    assert ran == [] and seen == [] and twf.current() is None


def test_divert_whose_comparison_drops_the_scope_and_collects():
    import gc
    import types

    seen, hook = recorder()
    holder = {}

    class Dropper:
        def __eq__(self, other):
            # The scope's every other reference dies and the collector runs while the scope reads
            # its tests: the call holds the scope (and the tests tuple) until it returns.
            holder.clear()
            gc.collect()
            return False

        __hash__ = object.__hash__

    mod = types.SimpleNamespace(v=Dropper())
    s = twf.scoped(top, hook, divert=((mod, "v", 1), (mod, "v", 2)), enter=lambda: "state")
    s.cycle = s  # a cycle through its __dict__: collectable once holder lets go
    holder["s"] = s
    del s
    assert holder["s"](1) == 7
    assert holder == {}
    gc.collect()
    assert twf.current() is None


@pytest.mark.parametrize(
    "divert",
    [
        [(sys.flags, "optimize", -1)],  # a list, not a tuple
        ((1, "a"),),
        ((1, "", 2),),
        ((1, "a..b", 2),),
        ((1, "a.1", 2),),
    ],
)
def test_divert_shapes_are_checked_when_the_scope_is_made(divert):
    _, hook = recorder()
    if isinstance(divert, list):
        # scoped() takes any sequence; FrameScope itself takes only a tuple of 3-tuples.
        assert twf.scoped(top, hook, divert=divert)(1) == 7
        with pytest.raises(TypeError, match="divert"):
            twf._FrameScope(top, hook, hook.backend, None, None, None, False, divert)
        return
    with pytest.raises((TypeError, ValueError)):
        twf.scoped(top, hook, divert=divert)
    with pytest.raises(TypeError, match="divert"):
        twf._FrameScope(top, hook, hook.backend, None, None, None, False, ((1, ("a", 2), 2),))


def test_divert_on_a_module_reads_as_getattr_does():
    """A plain module's first attribute is read from its __dict__ (what the generic read finds
    there): a rebound global, then a module __getattr__ once the global is gone; a ModuleType
    subclass (whose descriptors come first) is read generically."""
    import types

    seen, hook = recorder()
    m = types.ModuleType("divert_test_module")
    m.flag = False
    s = twf.scoped(top, hook, fallback=lambda x: "fallback", divert=((m, "flag", True),))
    assert s(1) == 7
    m.flag = True
    assert s(1) == "fallback"
    del m.flag
    m.__getattr__ = lambda name: name == "flag"  # PEP 562: only for names not in the dict
    assert s(1) == "fallback"
    m.flag = False  # the dict wins over __getattr__, as in getattr(m, "flag")
    assert s(1) == 7
    del m.flag, m.__getattr__
    with pytest.raises(AttributeError, match="flag"):
        s(1)

    class Sub(types.ModuleType):
        @property
        def flag(self):
            return True

    sub = Sub("divert_test_sub")
    sub.__dict__["flag"] = False  # the property wins: getattr(sub, "flag") is True
    assert (
        twf.scoped(top, hook, fallback=lambda x: "fallback", divert=((sub, "flag", True),))(1) == "fallback"
    )
    # A name ModuleType itself has (a descriptor on the type) is read generically too.
    assert twf.scoped(top, hook, fallback=lambda x: "fallback", divert=((m, "__dict__", None),))(1) == 7
    assert twf.current() is None


@pytest.mark.parametrize(
    ("read", "value", "diverts"),
    [
        ("force_eager", "force_eager", True),
        ("force_eagre", "force_eager", False),
        ("forcé_eager", "forcé_eager", True),  # a wider str kind, equal
        ("force_eager", "forcé_eager", False),
        ("€", "ɐ", False),  # same length, different kinds
        (True, True, True),
        (False, True, False),
        (1, True, True),  # the generic comparison: 1 == True
        (True, 1, True),
        (1.0, 1, True),
        (None, False, False),
    ],
)
def test_divert_compares_as_eq_does(read, value, diverts):
    import types

    _, hook = recorder()
    mod = types.SimpleNamespace(v=read)
    s = twf.scoped(top, hook, fallback=lambda x: "fallback", divert=((mod, "v", value),))
    assert (s(1) == "fallback") is diverts is (read == value)

    class Lying(str):  # a str subclass takes the generic comparison, which calls its __eq__
        def __eq__(self, other):
            return True

        __hash__ = str.__hash__

    mod.v = Lying("other")
    assert s(1) == "fallback"

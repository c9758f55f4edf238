"""tripwire.frame under stress: recursion, threads, exceptions, generators and coroutines, hooks
changed while frames run, collections that run user code inside the hook, data-stack chunks
running out, interpreter shutdown, and sys.monitoring (PEP 669) on 3.12+."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import textwrap
import threading

import pytest

import gc_stress
import tripwire as tw
from frame_helpers import Compiler, guards, tagged
from tripwire import _core
from tripwire import frame as twf


@pytest.fixture(params=["in_place", "shadow"])
def run_mode(request):
    was = _core.testing.frame_force_shadow(request.param == "shadow")
    yield request.param
    _core.testing.frame_force_shadow(was)


@pytest.fixture(autouse=True)
def _no_hook_left():
    yield
    assert twf.current() is None, "a test left a frame hook installed"


def add(x, n):
    return ("orig", x + n)


def recurse(n):
    if n == 0:
        return ("orig", 0)
    return ("orig", recurse(n - 1)[1] + 1)


def fails(x):
    raise KeyError(("orig", x))


def calls_gen(n):
    return ("orig", list(gen(n)))


def gen(n):
    yield from range(n)


async def coro(x):
    return ("orig", x)


def by_type(frame):
    return tagged(frame.function, "new"), guards(frame, types_=[f"L[{n!r}]" for n in frame.f_locals])


# -- recursion -------------------------------------------------------------------------------------


def test_recursion_hits_at_every_depth(run_mode):
    comp = Compiler(recurse, plan=by_type)
    with twf.hooked(comp):
        assert recurse(150) == ("new", 150)
        assert recurse(150) == ("new", 150)
    assert len(comp.calls) == 1  # one entry (TYPE_MATCH on n) serves every depth


def test_recursion_with_a_miss_per_depth_reaches_the_limit(run_mode):
    comp = Compiler(recurse, plan=lambda fr: (tagged(recurse, "new"), guards(fr, equals=["L['n']"])))
    with twf.hooked(comp, recompile_limit=8, accumulated_limit=8) as hook:
        # Each depth misses (EQUALS on n): 8 entries, then RUN_ONLY; results stay right.
        assert recurse(30)[1] == 30
        assert twf.strategy_of(recurse, hook.backend) == "run_only"
        assert recurse(30)[1] == 30
    assert len(comp.calls) == 9


def test_deep_recursion_fills_chunks_and_takes_the_shadow_path():
    # A replacement much larger than the original, run at every depth of a deep recursion: the
    # data-stack chunk runs out at some depth, and those frames run in shadow frames without any
    # forcing.
    def big_recurse(n):
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = a9 = 0
        b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = b8 = b9 = 1
        s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + b0 + b1 + b2 + b3 + b4 + b5 + b6 + b7 + b8 + b9
        if n == 0:
            return ("new", 0)
        return ("new", recurse(n - 1)[1] + s - 9)

    comp = Compiler(recurse, plan=lambda fr: (big_recurse.__code__, guards(fr, types_=["L['n']"])))
    before = twf.status()
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 3000))
    try:
        with twf.hooked(comp):
            assert recurse(400) == ("new", 400)
    finally:
        sys.setrecursionlimit(limit)
    after = twf.status()
    assert after["shadow"] > before["shadow"]
    assert after["in_place"] > before["in_place"]


# -- exceptions ------------------------------------------------------------------------------------


def test_exceptions_from_replacements_propagate_with_tracebacks(run_mode):
    comp = Compiler(fails, plan=by_type)
    with twf.hooked(comp):
        for _ in range(3):
            with pytest.raises(KeyError) as info:
                fails(7)
            assert info.value.args[0] == ("new", 7)
            assert any(tb.tb_frame.f_code.co_name == "fails" for tb in _walk(info.value.__traceback__))
    assert len(comp.calls) == 1


def _walk(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


def test_frames_are_disposed_of_on_every_path(run_mode):
    # Arguments must be released once per call whatever happened: hit, miss, an error from the
    # callback, an error raised by the replacement, the original run.
    class Arg:
        pass

    arg = Arg()
    state = {"mode": "compile"}

    def plus(x, n):
        return ("orig", n)

    def plan(frame):
        if state["mode"] == "error":
            raise RuntimeError("callback failed")
        return tagged(plus, "new"), guards(frame, types_=["L['x']"])

    comp = Compiler(plus, plan=plan)
    base = sys.getrefcount(arg)
    with twf.hooked(comp, raise_errors=True):
        for _ in range(20):
            plus(arg, 1)  # hits
        state["mode"] = "error"
        twf.reset(plus)
        for _ in range(20):
            with pytest.raises(RuntimeError):
                plus(arg, 1)  # the callback raised: the frame is disposed of, the error propagates
    comp.calls.clear()
    gc.collect()
    assert sys.getrefcount(arg) == base


# -- generators and coroutines ---------------------------------------------------------------------


def test_generators_and_coroutines_are_never_intercepted(run_mode):
    seen = []

    def cb(frame):
        seen.append(frame.code)
        if frame.code is calls_gen.__code__:
            return by_type(frame)
        return twf.SKIP

    with twf.hooked(cb):
        assert calls_gen(3) == ("new", [0, 1, 2])
        assert calls_gen(2) == ("new", [0, 1])
        assert asyncio.run(coro(5)) == ("orig", 5)
        g = gen(5)
        next(g)
        with pytest.raises(ValueError):
            g.throw(ValueError("unwinding"))  # throw_flag: let through
    assert gen.__code__ not in seen and coro.__code__ not in seen
    assert seen.count(calls_gen.__code__) == 1


def test_functions_called_from_generators_are_intercepted(run_mode):
    def gen_calls_add(n):
        for i in range(n):
            yield add(i, 1)

    comp = Compiler(add, plan=by_type)
    with twf.hooked(comp):
        assert list(gen_calls_add(3)) == [("new", 1), ("new", 2), ("new", 3)]


# -- threads ---------------------------------------------------------------------------------------


def test_hooks_are_per_thread():
    comp = Compiler(add, plan=by_type)
    results = {}

    def other():
        results["other"] = add(1, 2)  # this thread has no hook: the original runs

    with twf.hooked(comp):
        t = threading.Thread(target=other)
        t.start()
        t.join()
        results["main"] = add(1, 2)
    assert results == {"other": ("orig", 3), "main": ("new", 3)}


def test_threads_share_caches_and_hit_concurrently(run_mode):
    comp = Compiler(add, plan=by_type)
    errors = []
    n = gc_stress.scaled(2000, 20)
    barrier = threading.Barrier(4)

    def worker(i):
        try:
            with twf.hooked(comp):  # one backend (the Compiler): one cache per code object
                barrier.wait()
                for k in range(n):
                    r = add(k, i)
                    if r != ("new", k + i):
                        errors.append(r)
                    if k % 97 == 0:
                        sys.setswitchinterval(1e-6)
        except Exception as e:
            errors.append(e)

    old = sys.getswitchinterval()
    try:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == []
    assert 1 <= len(comp.calls) <= 4  # each thread may miss once before another's entry lands
    assert twf.status()["active_threads"] == 0


def test_a_thread_dying_with_a_hook_counts_out():
    ready = threading.Event()

    def worker():
        twf.install(Compiler(add, plan=by_type))
        assert add(1, 1) == ("new", 2)
        ready.set()  # exits without uninstalling

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert ready.is_set()
    s = twf.status()
    assert s["active_threads"] == 0 and s["eval_frame"] == "default"


# -- hooks changed while frames run ------------------------------------------------------------------


def test_uninstall_while_frames_are_running(run_mode):
    def outer(x):
        a = inner(x)  # intercepted
        twf.uninstall()  # from inside a running (replaced) frame
        b = inner(x)  # not intercepted any more
        return ("orig", a, b)

    def inner(x):
        return ("orig", x)

    comp = Compiler(outer, inner, plan=by_type)
    twf.install(comp)
    try:
        assert outer(1) == ("new", ("new", 1), ("orig", 1))
    finally:
        twf.uninstall()
    assert twf.status()["eval_frame"] == "default"
    assert outer(2) == ("orig", ("orig", 2), ("orig", 2))


def test_hook_replaced_and_caches_reset_from_the_callback(run_mode):
    other = Compiler(add, plan=lambda fr: (tagged(add, "other"), guards(fr, types_=["L['x']"])))

    def plan(frame):
        twf.reset(add)  # the cache being filled is cleared
        twf.install(other)  # this thread's hook replaced while its callback runs
        return by_type(frame)

    first = Compiler(add, plan=plan)
    twf.install(first)
    try:
        assert add(1, 2) == ("new", 3)  # the replacement returned still runs for this frame
        assert add(1, 2) == ("other", 3)  # the next call goes to the new hook
    finally:
        twf.uninstall()


def test_collections_inside_the_hook_run_user_code_safely(run_mode):
    # A finalizer fires on the k-th collection after arming, for every k, while calls go
    # through the hook (lookup, callback, replacement): it clears the caches, resets, toggles
    # the hook, or drops the callback's state. Results must stay right.
    comp = Compiler(add, recurse, plan=by_type)
    actions = {
        "reset": lambda: twf.reset(add),
        "clear": lambda: [
            c.clear() for _, c, _ in _core.testing.frame_backends(add.__code__) if c is not None
        ],
        "uninstall_install": lambda: (twf.uninstall(), twf.install(comp)),
        "nested_hook": lambda: _nested_call(),
    }
    twf.install(comp)
    try:
        for name, action in actions.items():
            for result, _fired in gc_stress.hit_every_allocation(
                lambda: (add(1, 2), recurse(3), add([1], [2])), action, ks=range(6)
            ):
                assert result == (("new", 3), ("new", 3), ("new", [1, 2])), name
                twf.install(comp)  # an action may have uninstalled it
    finally:
        twf.uninstall()


def _nested_call():
    with twf.hooked(Compiler(add, plan=lambda fr: None)):
        assert add(5, 5)[1] == 10


# -- shutdown --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "scenario",
    ["installed", "thread", "exit_inside", "exception", "daemon"],
)
def test_interpreter_shutdown_with_hooks_installed(scenario):
    script = textwrap.dedent(
        f"""
        import sys, threading, time
        import tripwire as tw
        from tripwire import frame as twf

        def f(x):
            return x + 1

        def compile_f(frame):
            if frame.code is not f.__code__:
                return twf.SKIP
            b = tw.GuardBuilder(frame.f_locals, f_globals=frame.f_globals)
            b.type_match("L['x']")
            return frame.code, b.build()

        scenario = {scenario!r}
        twf.install(compile_f)
        assert f(1) == 2 and f(2) == 3
        if scenario == "thread":
            def worker():
                twf.install(compile_f)
                f(3)
            t = threading.Thread(target=worker); t.start(); t.join()
        if scenario == "daemon":
            def spin():
                twf.install(compile_f)
                while True:
                    f(4)
            threading.Thread(target=spin, daemon=True).start()
            time.sleep(0.05)
        if scenario == "exit_inside":
            def g(x):
                sys.exit(0)
            compile_g = lambda fr: (fr.code, tw.GuardBuilder(fr.f_locals).build())
            twf.install(lambda fr: compile_g(fr) if fr.code is g.__code__ else compile_f(fr))
            g(1)
        if scenario == "exception":
            raise SystemExit(0)
        print("done")
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "leaked" not in r.stderr and "Fatal" not in r.stderr, r.stderr


# -- sys.monitoring (PEP 669) ------------------------------------------------------------------------


@pytest.mark.skipif(sys.version_info < (3, 12), reason="sys.monitoring is 3.12+")
def test_sys_monitoring_interplay(run_mode):
    # CPython #137178: a PEP 669 callback is an ordinary Python call, so it goes through the
    # eval-frame function like any other (our callback sees it; returning SKIP keeps it cheap).
    # Events of an intercepted call name the code that runs: the replacement. Local events set
    # on the original code therefore do not fire while a replacement runs.
    mon = sys.monitoring
    tool = 4
    events = []

    def on_start(code, offset):
        events.append(code)

    repl = tagged(add, "new")
    seen = []

    def cb(frame):
        seen.append(frame.code)
        if frame.code is add.__code__:
            return repl, guards(frame, types_=["L['x']"])
        return twf.SKIP

    mon.use_tool_id(tool, "tripwire-test")
    try:
        mon.register_callback(tool, mon.events.PY_START, on_start)
        mon.set_events(tool, mon.events.PY_START)
        with twf.hooked(cb):
            assert add(1, 2) == ("new", 3)
            assert add(1, 2) == ("new", 3)
        mon.set_events(tool, 0)
        assert repl in events and add.__code__ not in events
        assert on_start.__code__ in seen  # the monitoring callback's own frames are intercepted
        # Local events on the original code: silent while the replacement runs.
        events.clear()
        mon.set_local_events(tool, add.__code__, mon.events.PY_START)
        with twf.hooked(cb):
            assert add(1, 2) == ("new", 3)
        assert events == []
        assert add(1, 2) == ("orig", 3)  # the original, unhooked: its local event fires
        assert events == [add.__code__]
        mon.set_local_events(tool, add.__code__, 0)
    finally:
        mon.set_events(tool, 0)
        mon.register_callback(tool, mon.events.PY_START, None)
        mon.free_tool_id(tool)


@pytest.mark.skipif(sys.version_info < (3, 12), reason="sys.monitoring is 3.12+")
def test_sys_monitoring_toggled_while_hooked_frames_run(run_mode):
    mon = sys.monitoring
    tool = 4
    count = [0]

    def on_event(*args):
        count[0] += 1

    def body(x):
        mon.set_events(tool, mon.events.PY_START | mon.events.PY_RETURN | mon.events.LINE)
        y = add(x, 1)
        mon.set_events(tool, 0)
        return ("orig", y)

    mon.use_tool_id(tool, "tripwire-test")
    try:
        for ev in (mon.events.PY_START, mon.events.PY_RETURN, mon.events.LINE):
            mon.register_callback(tool, ev, on_event)
        with twf.hooked(Compiler(body, add, plan=by_type)):
            for _ in range(3):
                assert body(1) == ("new", ("new", 2))
        assert count[0] > 0
    finally:
        mon.set_events(tool, 0)
        for ev in (mon.events.PY_START, mon.events.PY_RETURN, mon.events.LINE):
            mon.register_callback(tool, ev, None)
        mon.free_tool_id(tool)


def test_settrace_and_setprofile_see_the_replacement(run_mode):
    seen = []

    def tracer(frame, event, arg):
        if event == "call":
            seen.append(frame.f_code)
        return None

    repl = tagged(add, "new")
    comp = Compiler(add, plan=lambda fr: (repl, guards(fr, types_=["L['x']"])))
    with twf.hooked(comp):
        sys.settrace(tracer)
        try:
            assert add(1, 2) == ("new", 3)
            assert add(1, 2) == ("new", 3)
        finally:
            sys.settrace(None)
    assert seen.count(repl) == 2


# -- adversarial guards: user code inside a full lookup ------------------------------------------


def _predicate_plan(action):
    """Entries whose guards include a predicate on f_locals that runs ``action`` (user code inside
    the full lookup: the fast pass cannot decide a LAMBDA)."""

    def plan(frame):
        b = tw.GuardBuilder(frame.f_locals, f_globals=frame.f_globals)
        b.type_match("L['x']")
        b.predicate(lambda f_locals: action() or True, "acts")
        return tagged(add, "new"), b.build()

    return plan


@pytest.mark.parametrize("what", ["reset", "uninstall", "clear", "recode", "reenter"])
def test_guards_that_change_the_runtime_during_the_lookup(run_mode, what):
    state = {"armed": False}
    original = add.__code__

    def action():
        if not state["armed"]:
            return
        state["armed"] = False
        if what == "reset":
            twf.reset(add)
        elif what == "uninstall":
            twf.uninstall()
        elif what == "clear":
            twf.cache_of(add, comp).clear()
        elif what == "recode":
            add.__code__ = recurse.__code__.replace(co_name="add")  # another function's body
        elif what == "reenter":
            assert add(10, 1) == ("orig", 11)  # inside the lookup: let through

    comp = Compiler(add, plan=_predicate_plan(action))
    twf.install(comp)
    try:
        assert add(1, 2) == ("new", 3)  # compiled
        state["armed"] = True
        # The lookup runs the action, and the entry still passes: this call runs the replacement.
        assert add(1, 2) == ("new", 3)
        assert add(1, 2)[1] == 3 if what != "recode" else True
    finally:
        twf.uninstall()
        add.__code__ = original


def test_a_keyboard_interrupt_in_a_guard_propagates_from_the_call(run_mode):
    state = {"armed": False}

    def action():
        if state["armed"]:
            state["armed"] = False
            raise KeyboardInterrupt

    with twf.hooked(Compiler(add, plan=_predicate_plan(action))):
        assert add(1, 2) == ("new", 3)
        state["armed"] = True
        with pytest.raises(KeyboardInterrupt):
            add(1, 2)
        assert add(1, 2) == ("new", 3)

"""tripwire.frame: the callback contract, locals by index, strategies, limits, per-backend caches.

Every test that runs replacement code runs twice: with frames retargeted in place (the common
path) and with every replacement forced into a shadow frame (the path taken when the data-stack
chunk is full), see the ``run_mode`` fixture.
"""

from __future__ import annotations

import logging
import sys
import types

import pytest

import tripwire as tw
from frame_helpers import Compiler, guards, tagged
from tripwire import _core
from tripwire import frame as twf


@pytest.fixture(params=["in_place", "shadow"])
def run_mode(request):
    was = _core.testing.frame_force_shadow(request.param == "shadow")
    before = twf.status()
    yield request.param
    _core.testing.frame_force_shadow(was)
    after = twf.status()
    # The mode was really the one exercised (when any replacement ran).
    if after["in_place"] + after["shadow"] > before["in_place"] + before["shadow"]:
        key = "shadow" if request.param == "shadow" else "in_place"
        assert after[key] > before[key]


@pytest.fixture(autouse=True)
def _no_hook_left():
    assert twf.current() is None
    yield
    assert twf.current() is None, "a test left a frame hook installed"
    assert twf.status()["active_threads"] == 0


# -- module-level functions the tests compile (one code object each: caches are per code) ---------


def add(x, n):
    return ("orig", x + n)


def kinds(a, b=2, *args, c, d=4, **kw):
    return ("orig", a, b, args, c, d, kw)


def make_closure(k):
    def inner(x):
        return ("orig", x + k)

    return inner


def cell_arg(a):
    def get():
        return a

    a = a + 1
    return ("orig", get())


def recurse(n):
    if n == 0:
        return ("orig", 0)
    return ("orig", recurse(n - 1)[1] + 1)


# -- the contract ----------------------------------------------------------------------------------


def test_hit_miss_recompile(run_mode):
    repl = tagged(add, "new")
    comp = Compiler(add, plan=lambda fr: (repl, guards(fr, equals=["L['n']"], types_=["L['x']"])))
    with twf.hooked(comp) as hook:
        assert add(1, 2) == ("new", 3)  # miss: compiled, the replacement ran
        assert add(5, 2) == ("new", 7)  # hit
        assert add(5, 3) == ("new", 8)  # L['n'] changed: recompile
        assert add(5.5, 3) == ("new", 8.5)  # L['x'] type changed: recompile
        assert add(7, 2) == ("new", 9)  # hit on the first entry
    assert add(1, 2) == ("orig", 3)  # uninstalled: the original runs
    assert comp.names == ["add", "add", "add"]
    cache = twf.cache_of(add, hook.backend)
    assert cache is not None and len(cache) == 3
    assert cache.stats["hits"] == 2
    assert all(isinstance(e.payload, twf.Replacement) and e.payload.code is repl for e in cache)
    assert cache.entries[0].payload.original is add.__code__


def test_frame_object_given_to_callback():
    seen = {}

    def plan(frame):
        seen.update(
            code=frame.code,
            locals=dict(frame.f_locals),
            g=frame.f_globals,
            b=frame.f_builtins,
            fn=frame.function,
            cache=frame.cache,
        )
        with pytest.raises(TypeError):
            frame.f_locals["x"] = 0  # read-only
        return None

    with twf.hooked(Compiler(kinds, plan=plan)):
        kinds(1, c=3, e=5)
    assert seen["code"] is kinds.__code__
    assert seen["locals"] == {"a": 1, "b": 2, "args": (), "c": 3, "d": 4, "kw": {"e": 5}}
    assert seen["g"] is globals()
    assert seen["b"] is __builtins__ or seen["b"] is getattr(__builtins__, "__dict__", None)
    assert seen["fn"] is kinds
    assert isinstance(seen["cache"], tw.Cache)


def test_none_runs_the_original_and_calls_back_again():
    comp = Compiler(add, plan=lambda fr: None)
    with twf.hooked(comp):
        assert add(1, 2) == ("orig", 3)
        assert add(1, 2) == ("orig", 3)
    assert comp.names == ["add", "add"]


def test_skip_is_never_called_back_again():
    comp = Compiler(add, plan=lambda fr: twf.SKIP)
    with twf.hooked(comp) as hook:
        for _ in range(3):
            assert add(1, 2) == ("orig", 3)
        assert twf.strategy_of(add, hook.backend) == "skip"
    assert comp.names == ["add"]


def test_run_only_uses_the_cache_but_never_calls_back(run_mode):
    repl = tagged(add, "new")
    state = {"n": 0}

    def plan(frame):
        state["n"] += 1
        if state["n"] == 1:
            return repl, guards(frame, equals=["L['n']"])
        return twf.RUN_ONLY

    comp = Compiler(add, plan=plan)
    with twf.hooked(comp) as hook:
        assert add(1, 2) == ("new", 3)  # compiled
        assert add(1, 3) == ("orig", 4)  # miss: the callback says RUN_ONLY
        assert add(1, 4) == ("orig", 5)  # miss: not called back
        assert add(9, 2) == ("new", 11)  # the cached entry still hits
        assert twf.strategy_of(add, hook.backend) == "run_only"
    assert comp.names == ["add", "add"]


def test_frames_inside_the_callback_are_not_intercepted(run_mode):
    repl = tagged(add, "new")

    def plan(frame):
        assert add(10, 10) == ("orig", 20)  # runs the original, no callback
        assert recurse(3) == ("orig", 3)
        return repl, guards(frame, types_=["L['x']"])

    comp = Compiler(add, recurse, plan=plan)
    with twf.hooked(comp):
        assert add(1, 2) == ("new", 3)
    assert comp.names == ["add"]


def test_callback_error_runs_the_original_and_logs(caplog):
    def plan(frame):
        raise ValueError("compiler bug")

    with caplog.at_level(logging.ERROR, logger="tripwire.frame"), twf.hooked(Compiler(add, plan=plan)):
        assert add(1, 2) == ("orig", 3)
    assert any("compiler bug" in (r.exc_text or "") or r.exc_info for r in caplog.records)
    assert any("add" in r.getMessage() for r in caplog.records)


def test_callback_error_reraised_with_raise_errors():
    def plan(frame):
        raise ValueError("compiler bug")

    with (
        twf.hooked(Compiler(add, plan=plan), raise_errors=True),
        pytest.raises(ValueError, match="compiler bug"),
    ):
        add(1, 2)
    # The frame was disposed of properly: the same function still works.
    assert add(1, 2) == ("orig", 3)


def test_base_exceptions_from_the_callback_propagate():
    class Stop(BaseException):
        pass

    def plan(frame):
        raise Stop

    with twf.hooked(Compiler(add, plan=plan)), pytest.raises(Stop):
        add(1, 2)


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda fr: "nonsense", "must return"),
        (lambda fr: (1, 2, 3), "must return"),
        (lambda fr: ("not code", guards(fr)), "code object"),
        (lambda fr: (fr.code, "not guards"), "GuardSet"),
    ],
)
def test_invalid_results_are_errors(bad, match):
    with twf.hooked(Compiler(add, plan=bad), raise_errors=True), pytest.raises(TypeError, match=match):
        add(1, 2)


def _other_layouts():
    def two_args_extra(x, n, m):
        return m

    def one_arg(x):
        return x

    def star(x, n, *rest):
        return rest

    def gen(x, n):
        yield x

    k = 1

    def free(x, n):
        return x + k

    async def coro(x, n):
        return x

    return {
        "positional parameters": two_args_extra,
        "one positional": one_arg,
        "*args": star,
        "generator": gen,
        "free variables": free,
        "coroutine": coro,
    }


@pytest.mark.parametrize("which", list(_other_layouts()))
def test_incompatible_replacements_are_refused(which):
    other = _other_layouts()[which]
    expected = {"one positional": "positional parameters", "coroutine": "generator"}.get(which, which)
    comp = Compiler(add, plan=lambda fr: (other.__code__, guards(fr)))
    with twf.hooked(comp, raise_errors=True) as hook:
        with pytest.raises(tw.IncompatibleCodeError, match=expected.replace("*", r"\*")):
            add(1, 2)
        assert twf.cache_of(add, hook.backend) is not None
        assert len(twf.cache_of(add, hook.backend)) == 0
    with pytest.raises(TypeError, match="cannot run in frames"):
        twf.Replacement(add.__code__, other.__code__)


def test_replacement_made_for_another_code_is_refused_at_the_hit():
    comp = Compiler(add, plan=lambda fr: (fr.code, guards(fr)))
    with twf.hooked(comp, raise_errors=True) as hook:
        assert add(1, 2) == ("orig", 3)
        cache = twf.cache_of(add, hook.backend)
        cache.clear()
        b = tw.GuardBuilder({"x": 1, "n": 2})
        b.type_match("L['x']")
        cache.insert(b.build(), "not a Replacement")
        with pytest.raises(TypeError, match=r"must hold a tripwire\.frame\.Replacement"):
            add(1, 2)
        cache.clear()
        cache.insert(b.build(), twf.Replacement(recurse.__code__, recurse.__code__))
        with pytest.raises(TypeError, match=r"must hold a tripwire\.frame\.Replacement"):
            add(1, 2)


# -- locals by index ---------------------------------------------------------------------------------


def test_defaults_keyword_only_star_args(run_mode):
    repl = tagged(kinds, "new")
    comp = Compiler(
        kinds,
        plan=lambda fr: (
            repl,
            guards(fr, equals=["L['b']", "L['d']", "L['args']", "L['kw']"], types_=["L['a']"]),
        ),
    )
    with twf.hooked(comp):
        assert kinds(1, c=3) == ("new", 1, 2, (), 3, 4, {})
        assert kinds(5, c=7) == ("new", 5, 2, (), 7, 4, {})  # hit
        assert kinds(1, 2, 9, c=3, z=1) == ("new", 1, 2, (9,), 3, 4, {"z": 1})  # recompile: args, kw
        assert kinds(1, 2, 9, c=0, z=1) == ("new", 1, 2, (9,), 0, 4, {"z": 1})  # hit
        assert kinds(a=1, b=3, c=3, d=4) == ("new", 1, 3, (), 3, 4, {})  # recompile: b
    assert len(comp.calls) == 3


def test_free_variables_are_read_from_the_frames_own_closure(run_mode):
    f1, f2 = make_closure(1), make_closure(2)
    assert f1.__code__ is f2.__code__
    repl = tagged(f1, "new")
    comp = Compiler(f1, plan=lambda fr: (repl, guards(fr, equals=["L['k']"], types_=["L['x']"])))
    with twf.hooked(comp):
        assert f1(10) == ("new", 11)
        assert f1(20) == ("new", 21)  # hit
        assert f2(10) == ("new", 12)  # another closure: L['k'] differs, recompile
        assert f2(20) == ("new", 22)
        assert f1(30) == ("new", 31)
    assert [dict(f.f_locals) for f in comp.calls] == [{"x": 10, "k": 1}, {"x": 10, "k": 2}]


def _argument_and_free(cell_value):
    """A function whose code has ``x`` both as its argument and as a free variable, as Dynamo's
    resume functions can (CPython's compiler never makes one). Its body returns the argument."""

    def g(x):
        return ("orig", x)

    code = g.__code__.replace(co_freevars=("x",))
    return types.FunctionType(code, globals(), "g", None, (types.CellType(cell_value),))


def test_a_name_both_argument_and_free_is_its_free_variable(run_mode):
    # f_locals (a dict filled in slot order) and torch's guards (get_framelocals_idx) read the last
    # slot of a name; a guard built on f_locals reads the same value, or it misses on every call
    # (or passes on the wrong value).
    g = _argument_and_free(7)
    assert g.__code__.co_varnames == ("x",) and g.__code__.co_freevars == ("x",)
    repl = tagged(g, "new")
    comp = Compiler(g, plan=lambda fr: (repl, guards(fr, equals=["L['x']"])))
    with twf.hooked(comp):
        assert g(1) == ("new", 1)
        assert g(2) == ("new", 2)  # hit: L['x'] is the free variable, still 7
        g.__closure__[0].cell_contents = 8
        assert g(3) == ("new", 3)  # miss: the free variable changed, the argument did not matter
        assert g(4) == ("new", 4)
    assert [dict(f.f_locals) for f in comp.calls] == [{"x": 7}, {"x": 8}]


def test_a_cell_argument_is_read_as_its_value(run_mode):
    repl = tagged(cell_arg, "new")
    comp = Compiler(cell_arg, plan=lambda fr: (repl, guards(fr, equals=["L['a']"])))
    with twf.hooked(comp):
        assert cell_arg(1) == ("new", 2)
        assert cell_arg(1) == ("new", 2)
        assert cell_arg(5) == ("new", 6)
    assert [dict(f.f_locals) for f in comp.calls] == [{"a": 1}, {"a": 5}]


def test_replacements_with_more_and_fewer_locals(run_mode):
    def big(x, n):
        a, b, c, d, e, f, g, h = range(8)
        t = [x, n, a + b + c + d + e + f + g + h]
        return ("big", sum(t))

    def small(x, n):
        return ("small", x)

    state = {"i": 0}

    def plan(frame):
        state["i"] += 1
        code = big.__code__ if frame.f_locals["n"] == 0 else small.__code__
        return code, guards(frame, equals=["L['n']"])

    with twf.hooked(Compiler(add, plan=plan)):
        for _ in range(3):
            assert add(1, 0) == ("big", 29)
            assert add(1, 5) == ("small", 1)


@pytest.mark.skipif(sys.version_info < (3, 12), reason="inlined comprehensions (PEP 709) are 3.12+")
def test_hidden_comprehension_locals_are_not_locals():
    def comp_fn(a):
        return [b * 2 for b in a]

    hidden = [n for n, k in zip(comp_fn.__code__.co_varnames, range(99), strict=False) if n == "b"]
    assert hidden == ["b"]  # `b` is a fast local of comp_fn itself on 3.12+
    seen = []

    def plan(frame):
        seen.append(dict(frame.f_locals))
        return frame.code, guards(frame, types_=["L['a']"])

    with twf.hooked(Compiler(comp_fn, plan=plan)):
        assert comp_fn([1, 2]) == [2, 4]
        assert comp_fn([3]) == [6]
    assert seen == [{"a": [1, 2]}]


def test_hits_build_no_dict_and_allocate_nothing():
    b_guards = {}

    def plan(frame):
        b_guards["gs"] = guards(frame, equals=["L['n']"], types_=["L['x']"])
        return frame.code, b_guards["gs"]

    def loop(n):
        for _ in range(n):
            add(1, 2)

    with twf.hooked(Compiler(add, plan=plan)):
        loop(50)
        before = sys.getallocatedblocks()
        loop(2000)
        after = sys.getallocatedblocks()
    # add() itself allocates its result (a tuple and an int) and frees it: nothing remains. A
    # dict per hit, or anything else kept, would show as ~2000 blocks.
    assert after - before < 50
    assert b_guards["gs"]._fast_pass_count > 1000  # decided without user code, by index


def test_lambda_on_f_locals_gets_the_frames_locals():
    seen = []

    def plan(frame):
        b = tw.GuardBuilder(frame.f_locals, f_globals=frame.f_globals)
        b.predicate(lambda f_locals: seen.append(dict(f_locals)) or True)
        return frame.code, b.build()

    with twf.hooked(Compiler(kinds, plan=plan)):
        kinds(1, c=2)
        kinds(3, c=4, q=5)
    assert {"a": 3, "b": 2, "args": (), "c": 4, "d": 4, "kw": {"q": 5}} in seen


# -- invalidation ----------------------------------------------------------------------------------

K = 10


def uses_global(x):
    return ("orig", x + K)


def test_a_global_guard_misses_after_the_global_changes(run_mode):
    global K
    comp = Compiler(uses_global, plan=lambda fr: (tagged(uses_global, "new"), guards(fr, equals=["G['K']"])))
    try:
        with twf.hooked(comp):
            assert uses_global(1) == ("new", 11)
            assert uses_global(2) == ("new", 12)
            K = 20
            assert uses_global(1) == ("new", 21)
            assert len(comp.calls) == 2
    finally:
        K = 10


def test_entries_die_with_the_objects_they_id_match(collect):
    class Model:
        pass

    def run(m):
        return ("orig", type(m).__name__)

    def plan(frame):
        b = tw.GuardBuilder(frame.f_locals)
        b.id_match("L['m']")
        return tagged(run, "new"), b.build()

    comp = Compiler(run, plan=plan)
    with twf.hooked(comp) as hook:
        m = Model()
        assert run(m) == ("new", "Model")
        assert run(m) == ("new", "Model")
        cache = twf.cache_of(run, hook.backend)
        assert len(cache) == 1
        comp.calls.clear()  # the recorded frames hold m in their f_locals
        del m
        collect()
        assert len(cache) == 0 and cache.stats["invalidations"] == 1
        m2 = Model()
        assert run(m2) == ("new", "Model")
    assert len(comp.calls) == 1


def test_same_code_under_other_globals_does_not_hit(run_mode):
    other = types.FunctionType(uses_global.__code__, {"K": 1000, "__builtins__": __builtins__})
    comp = Compiler(uses_global, plan=lambda fr: (tagged(uses_global, "new"), guards(fr, equals=["G['K']"])))
    with twf.hooked(comp):
        assert uses_global(1) == ("new", 11)
        assert other(1) == ("new", 1001)  # the entry reads this module's K: not for these globals
        assert uses_global(1) == ("new", 11)
        assert other(1) == ("new", 1001)
    assert [f.f_globals is globals() for f in comp.calls] == [True, False]


def test_guards_for_frames_reject_closure_roots_and_foreign_globals():
    def closure_plan(frame):
        b = tw.GuardBuilder(frame.f_locals, f_closure={"k": types.CellType(1)})
        b.equals("C['k']")
        return frame.code, b.build()

    with (
        twf.hooked(Compiler(add, plan=closure_plan), raise_errors=True),
        pytest.raises(ValueError, match=r"C\[\.\.\.\]"),
    ):
        add(1, 2)

    def foreign_plan(frame):
        b = tw.GuardBuilder(frame.f_locals, f_globals={"K": 1})
        b.equals("G['K']")
        return frame.code, b.build()

    with (
        twf.hooked(Compiler(add, plan=foreign_plan), raise_errors=True),
        pytest.raises(ValueError, match="f_globals"),
    ):
        add(1, 2)


# -- limits -----------------------------------------------------------------------------------------


def _every_n_compiles(frame):
    return tagged(add, "new"), guards(frame, equals=["L['n']"])


def test_limit_switches_to_run_only(caplog):
    comp = Compiler(add, plan=_every_n_compiles)
    with (
        caplog.at_level(logging.WARNING, logger="tripwire.recompiles"),
        twf.hooked(comp, recompile_limit=2, accumulated_limit=2) as hook,
    ):
        assert add(1, 1) == ("new", 2)
        assert add(1, 2) == ("new", 3)
        assert add(1, 3) == ("orig", 4)  # refused: RUN_ONLY from now on
        assert add(1, 4) == ("orig", 5)  # not called back
        assert add(1, 1) == ("new", 2)  # cached entries still run
        assert twf.strategy_of(add, hook.backend) == "run_only"
    assert len(comp.calls) == 3
    assert any("RUN_ONLY" in r.getMessage() for r in caplog.records)


def test_limit_raise():
    with twf.hooked(Compiler(add, plan=_every_n_compiles), accumulated_limit=1, on_limit="raise"):
        assert add(1, 1) == ("new", 2)
        with pytest.raises(tw.RecompileLimitExceeded):
            add(1, 2)
        assert add(1, 1) == ("new", 2)


def test_limit_fallback_and_evict():
    comp = Compiler(add, plan=_every_n_compiles)
    with twf.hooked(comp, accumulated_limit=1, on_limit="fallback"):
        assert add(1, 1) == ("new", 2)
        assert add(1, 2) == ("orig", 3)
        assert add(1, 2) == ("orig", 3)
    assert len(comp.calls) == 3  # called back each time
    twf.reset(add)
    comp = Compiler(add, plan=_every_n_compiles)
    with twf.hooked(comp, accumulated_limit=1, on_limit="evict") as hook:
        assert add(1, 1) == ("new", 2)
        assert add(1, 2) == ("new", 3)
        assert add(1, 1) == ("new", 2)  # evicted: compiled again
        assert len(twf.cache_of(add, hook.backend)) == 1
    assert len(comp.calls) == 3


def test_recompile_reasons_are_logged(caplog):
    tw.set_logs("recompiles")
    try:
        with (
            caplog.at_level(logging.INFO, logger="tripwire.recompiles"),
            twf.hooked(Compiler(add, plan=_every_n_compiles)),
        ):
            add(1, 1)
            add(1, 2)
    finally:
        tw.set_logs("")
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "Recompiling function add" in text and "L['n']" in text and "expected 1" in text


# -- backends, reset, hooks ------------------------------------------------------------------------------


def test_one_cache_per_backend():
    a = Compiler(add, plan=lambda fr: (tagged(add, "a"), guards(fr, types_=["L['x']"])))
    b = Compiler(add, plan=lambda fr: twf.SKIP)
    with twf.hooked(a):
        assert add(1, 2) == ("a", 3)
    with twf.hooked(b):
        assert add(1, 2) == ("orig", 3)
        assert add(1, 2) == ("orig", 3)
    with twf.hooked(a):
        assert add(1, 2) == ("a", 3)  # a's cache is untouched by b's SKIP
    assert twf.strategy_of(add, a) == "default" and twf.strategy_of(add, b) == "skip"
    assert len(a.calls) == 1 and len(b.calls) == 1
    backends = {bk for bk, _, _ in _core.testing.frame_backends(add.__code__)}
    assert {a, b} <= backends


def test_explicit_backend_key_shares_caches():
    a = Compiler(add, plan=lambda fr: (tagged(add, "shared"), guards(fr, types_=["L['x']"])))
    b = Compiler(add, plan=lambda fr: pytest.fail("b must hit a's entry"))
    with twf.hooked(a, backend="mine"):
        assert add(1, 2) == ("shared", 3)
    with twf.hooked(b, backend="mine"):
        assert add(1, 2) == ("shared", 3)
    assert twf.cache_of(add, "mine") is not None


def test_reset_forgets_caches_and_strategies():
    comp = Compiler(add, plan=lambda fr: twf.SKIP)
    with twf.hooked(comp) as hook:
        add(1, 2)
        add(1, 2)
        twf.reset(add)
        assert twf.strategy_of(add, hook.backend) == "default"
        add(1, 2)
    assert len(comp.calls) == 2


def test_hooked_nests_and_restores():
    outer = Compiler(add, plan=lambda fr: None)
    inner = Compiler(add, plan=lambda fr: None)
    with twf.hooked(outer) as h1:
        add(1, 2)
        with twf.hooked(inner) as h2:
            assert twf.current() is h2
            add(1, 2)
        assert twf.current() is h1
        add(1, 2)
    assert len(outer.calls) == 2 and len(inner.calls) == 1


def test_install_uninstall_and_status():
    comp = Compiler(add, plan=lambda fr: None)
    hook = twf.install(comp)
    try:
        assert twf.current() is hook
        s = twf.status()
        assert s["installed"] and s["eval_frame"] == "tripwire" and s["active_threads"] == 1
        assert s["layout_verified"] and s["layout_error"] == ""
        add(1, 2)
    finally:
        twf.uninstall()
    s = twf.status()
    assert not s["installed"] and s["eval_frame"] == "default" and s["active_threads"] == 0
    assert len(comp.calls) == 1
    twf.uninstall()  # clearing twice is harmless


def test_tripwire_machinery_is_never_compiled():
    seen = []

    def cb(frame):
        seen.append(frame.code.co_filename)
        return twf.SKIP

    with twf.hooked(cb):
        b = tw.GuardBuilder({"x": 1})
        b.type_match("L['x']")
        b.build().check({"x": 2})
    assert not any("tripwire" in f and "site-packages" in f for f in seen)


def test_a_foreign_eval_function_is_detected():
    assert _core.testing.frame_floor_eval(True)  # a stand-in for another JIT's PEP 523 hook
    try:
        with pytest.raises(tw.FrameError, match="another PEP 523"):
            twf.install(lambda fr: None)
        assert twf.status()["eval_frame"] == "foreign"
    finally:
        assert _core.testing.frame_floor_eval(False)
    # Installed over ours, it is left in place when ours goes, with a warning.
    twf.install(lambda fr: None)
    assert _core.testing.frame_floor_eval(True)
    try:
        with pytest.warns(RuntimeWarning, match="left in place"):
            twf.uninstall()
        assert twf.status()["eval_frame"] == "foreign"
    finally:
        assert _core.testing.frame_floor_eval(False)  # restores ours, which now lets everything through
    assert twf.status()["eval_frame"] == "tripwire"
    twf.install(lambda fr: None)
    twf.uninstall()
    assert twf.status()["eval_frame"] == "default"


def test_strict_guard_errors_propagate_from_the_call():
    class Bad:
        @property
        def attr(self):
            raise RuntimeError("property raised")

    def run(o):
        return "orig"

    bad = Bad.__new__(Bad)

    def plan(frame):
        b = tw.GuardBuilder(frame.f_locals)
        b.hasattr("L['o']", "attr")  # raises for a Bad, strictly
        return frame.code, b.build(strict=True)

    class Good:
        attr = 1

    with twf.hooked(Compiler(run, plan=plan)):
        assert run(Good()) == "orig"  # compiled for Good
        with pytest.raises(tw.GuardEvalError):
            run(bad)


def test_hook_skips_tripwires_own_files_and_not_the_demo() -> None:
    """The hook skips frames of tripwire's own modules on a miss, by the one definition the
    install-site walk also uses (_package.is_own_file); the demo plays the user, so its frames
    reach the callback."""
    from tripwire import _package, builder, demo

    seen: list[types.CodeType] = []
    hook = twf.Hook(lambda frame: seen.append(frame.code))
    own = builder._user_stack.__code__
    assert _package.is_own_file(own.co_filename) and builder._is_machinery(own.co_filename)
    assert hook(own, {}, builder.__dict__, {}, builder._user_stack) == 1
    assert seen == []
    assert not _package.is_own_file(demo.__file__) and not builder._is_machinery(demo.__file__)
    assert not _package.is_own_file(__file__) and builder._is_machinery("<frozen importlib._bootstrap>")
    assert not _package.is_own_file("<frozen importlib._bootstrap>")

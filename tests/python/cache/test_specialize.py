"""@tripwire.specialize: hits, misses, recompile reasons, compilers, binding, limits, threads, invalidation."""

from __future__ import annotations

import gc
import logging
import sys
import threading

import pytest

import tripwire as tw
from tripwire.specialized import Specialized, specialize


class Recorder:
    """A compiler that records its calls and returns a tagged wrapper of the function."""

    def __init__(self, extra=None):
        self.calls = []
        self.extra = extra

    def __call__(self, fn, example_args, builder):
        self.calls.append(dict(example_args))
        if self.extra is not None:
            self.extra(builder)
        n = len(self.calls)

        def compiled(*args, **kwargs):
            return ("compiled", n, fn(*args, **kwargs))

        return compiled


def add(x, n):
    return x + n


def test_hit_and_miss():
    comp = Recorder()
    f = specialize(add, compiler=comp, backend="test")
    assert isinstance(f, Specialized)
    assert f(1, 2) == ("compiled", 1, 3)
    assert f(1, 2) == ("compiled", 1, 3)  # hit: no new compile
    assert len(comp.calls) == 1 and comp.calls[0] == {"x": 1, "n": 2}
    assert f(1, 5) == ("compiled", 2, 6)  # EQUALS_MATCH on n failed: recompiled
    assert f(1, 2) == ("compiled", 1, 3)
    assert len(comp.calls) == 2 and len(f.cache) == 2
    assert f.__wrapped__ is add and f.__name__ == "add" and f.__qualname__ == "add"
    assert "backend='test'" in repr(f)


def test_decorator_forms_and_default_compiler():
    @specialize
    def g(x):
        return x * 2

    @specialize()
    def h(x):
        return x * 3

    assert g(2) == 4 and g(2) == 4 and len(g.cache) == 1
    assert h(2) == 6 and h(3) == 9 and len(h.cache) == 2


def test_policy_type_only_scalars():
    comp = Recorder()
    f = specialize(add, compiler=comp, policy=tw.Policy(scalars="type"))
    f(1, 2)
    f(10, 20)
    assert len(comp.calls) == 1
    f(1.5, 2)
    assert len(comp.calls) == 2


def recompile_reason_fn(x, cfg):
    return x


def test_recompile_reason_logged(caplog):
    comp = Recorder()
    f = specialize(recompile_reason_fn, compiler=comp)
    with caplog.at_level(logging.INFO, logger="tripwire.recompiles"):
        f(1, {"mode": "fast"})
        assert not caplog.records  # the first compile is not a recompile
        f(1, {"mode": "slow"})  # the call site that installed the guards is this line
    recs = [r for r in caplog.records if r.name == "tripwire.recompiles"]
    assert len(recs) == 1
    msg = recs[0].getMessage()
    code = recompile_reason_fn.__code__
    assert f"Recompiling function recompile_reason_fn in {code.co_filename}:{code.co_firstlineno}" in msg
    assert "entry 0 'recompile_reason_fn#0'" in msg
    assert "source: L['cfg']['mode']  kind: EQUALS_MATCH  expected: 'fast'  actual: 'slow'" in msg
    assert "guard installed at (innermost last):" in msg
    sites = [ln.strip() for ln in msg.splitlines() if ln.startswith("          ")]
    # the guard was installed by the first call, from this test; tripwire's frames are omitted
    assert sites[-1].startswith(f"{__file__}:") and sites[-1].endswith("in test_recompile_reason_logged")
    assert not any("tripwire/specialized.py" in s for s in sites)


def test_no_why_not_when_logging_disabled(caplog, monkeypatch):
    f = specialize(add, compiler=Recorder())
    f(1, 2)
    called = []
    monkeypatch.setattr(type(f.cache), "why_not", lambda self, fl: called.append(1) or [], raising=True)
    with caplog.at_level(logging.WARNING, logger="tripwire.recompiles"):
        f(1, 3)
    assert called == []


def test_error_on_recompile():
    comp = Recorder()
    f = specialize(add, compiler=comp, error_on_recompile=True)
    assert f(1, 2)[2] == 3
    with pytest.raises(tw.RecompileError) as ei:
        f(1, 3)
    assert "L['n']" in str(ei.value) and "Recompiling function add" in str(ei.value)
    assert len(ei.value.failures) == 1 and ei.value.failures[0].kind == "EQUALS_MATCH"
    assert len(comp.calls) == 1 and len(f.cache) == 1
    assert f(1, 2)[2] == 3  # hits still work


def test_compiler_adds_a_guard():
    state = {"mode": "a"}

    def extra(builder):
        builder.equals("G['_MODE']")

    globals()["_MODE"] = "a"
    try:
        comp = Recorder(extra)

        def uses_global(x):
            return (x, state["mode"])

        uses_global.__globals__["_MODE"] = "a"
        f = specialize(add, compiler=comp)
        f(1, 2)
        f(1, 2)
        assert len(comp.calls) == 1
        globals()["_MODE"] = "b"  # the compiler's guard on G['_MODE'] now fails
        f(1, 2)
        assert len(comp.calls) == 2
        kinds = {(g.kind.name, str(g.source)) for e in f.cache for g in e.guards}
        assert ("EQUALS_MATCH", "G['_MODE']") in kinds
    finally:
        del globals()["_MODE"]


def test_compiler_raising_caches_nothing_and_names_the_function():
    def bad(fn, example_args, builder):
        raise ValueError("backend exploded")

    f = specialize(add, compiler=bad)
    with pytest.raises(ValueError, match="backend exploded") as ei:
        f(1, 2)
    notes = getattr(ei.value, "__notes__", [])
    assert any("while compiling add" in n and __file__ in n for n in notes), notes
    assert len(f.cache) == 0


@pytest.mark.parametrize("result", [None, 42])
def test_compiler_returning_non_callable(result):
    f = specialize(add, compiler=lambda fn, ex, b: result)
    with pytest.raises(TypeError, match="must return a callable"):
        f(1, 2)
    assert len(f.cache) == 0


def fib(n):
    return n if n < 2 else fib_s(n - 1) + fib_s(n - 2)


def test_reentrant_compiler_and_recursion():
    seen = []

    def comp(fn, example_args, builder):
        # the compiler runs the function on the example: nested calls run the original
        seen.append(fn(**example_args))
        return fn

    global fib_s
    fib_s = specialize(fib, compiler=comp, accumulated_limit=64, recompile_limit=64)
    try:
        assert fib_s(10) == 55
        assert seen[0] == 55
        assert fib_s(10) == 55
    finally:
        del fib_s


def test_threads_calling_concurrently():
    comp = Recorder()
    f = specialize(add, compiler=comp, recompile_limit=64)
    errors = []
    barrier = threading.Barrier(4)

    def worker(k):
        try:
            barrier.wait()
            for i in range(200):
                n = i % 5
                r = f(k, n)
                assert r[0] == "compiled" and r[2] == k + n
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(comp.calls) == 20  # each (k, n) compiled exactly once
    assert len(f.cache) == 20


def kw_fn(a, b=10, *args, c, d=5, **kw):
    return (a, b, args, c, d, kw)


def test_binding_keywords_defaults_varargs():
    comp = Recorder()
    f = specialize(kw_fn, compiler=comp, recompile_limit=64)
    assert f(1, c=3)[2] == (1, 10, (), 3, 5, {})
    assert comp.calls[-1] == {"a": 1, "b": 10, "args": (), "c": 3, "d": 5, "kw": {}}
    assert f(a=1, c=3)[1] == 1  # same f_locals: a hit
    assert len(comp.calls) == 1
    assert f(1, 2, 7, 8, c=3, e="x")[2] == (1, 2, (7, 8), 3, 5, {"e": "x"})
    assert comp.calls[-1]["args"] == (7, 8) and comp.calls[-1]["kw"] == {"e": "x"}
    assert f(1, 2, 7, 9, c=3, e="x")[1] == 3  # *args element changed
    assert f(1, 2, 7, 8, c=3, e="y")[1] == 4  # **kwargs value changed
    assert f(1, 2, 7, 8, c=3, e="x")[1] == 2
    with pytest.raises(TypeError):
        f(1)  # c is missing: binding fails as the call would


def test_positional_fast_path_with_defaults():
    def g(x, y=2):
        return x + y

    comp = Recorder()
    f = specialize(g, compiler=comp)
    assert f(1)[2] == 3
    assert f(1, 2)[1] == 1  # same locals whether y came from the default or the call
    assert f(x=1, y=2)[1] == 1
    assert len(comp.calls) == 1


class Model:
    def __init__(self, k):
        self.k = k

    @specialize(compiler=Recorder(), recompile_limit=64)
    def forward(self, x):
        return self.k * x


def test_methods():
    m1, m2 = Model(2), Model(3)
    assert m1.forward(5)[2] == 10
    assert m2.forward(5)[2] == 15  # self is guarded by type: a hit, calling with m2 itself
    assert isinstance(Model.__dict__["forward"], Specialized)
    assert Model.forward is Model.__dict__["forward"]
    assert Model.forward(m1, 5)[2] == 10
    assert len(Model.forward.cache) == 1


def test_limit_raise():
    f = specialize(add, compiler=Recorder(), recompile_limit=2)
    f(1, 1)
    f(1, 2)
    with pytest.raises(tw.RecompileLimitExceeded):
        f(1, 3)
    assert len(f.cache) == 2
    assert f(1, 1)[2] == 2


def test_limit_fallback_runs_original():
    comp = Recorder()
    f = specialize(add, compiler=comp, recompile_limit=2, on_limit="fallback")
    assert f(1, 1)[0] == "compiled"
    assert f(1, 2)[0] == "compiled"
    assert f(1, 3) == 4  # the original function
    assert f(1, 4) == 5
    assert len(f.cache) == 2
    assert f(1, 2)[0] == "compiled"


def test_limit_fallback_accumulated_does_not_compile():
    comp = Recorder()
    f = specialize(add, compiler=comp, accumulated_limit=1, on_limit="fallback")
    f(1, 1)
    assert f(1, 3) == 4
    assert len(comp.calls) == 1


def test_limit_evict():
    comp = Recorder()
    f = specialize(add, compiler=comp, recompile_limit=2, on_limit="evict")
    f(1, 1)
    f(1, 2)
    f(1, 3)
    assert len(f.cache) == 2
    assert f(1, 3)[1] == 3 and f(1, 2)[1] == 2
    f(1, 1)  # evicted: compiled again
    assert len(comp.calls) == 4


class Net:
    pass


def run_net(net, x):
    return x


def test_invalidation_when_guarded_object_dies(collect):
    comp = Recorder(lambda b: b.id_match("L['net']"))
    f = specialize(run_net, compiler=comp)
    net = Net()
    assert f(net, 1)[1] == 1
    assert f(net, 1)[1] == 1
    assert len(comp.calls) == 1
    del net
    comp.calls.clear()
    collect()
    new = Net()
    assert f(new, 1)[0] == "compiled"
    assert len(comp.calls) == 1  # recompiled: the dead object's entry never hits
    assert comp.calls[0]["net"] is new


def test_cache_keeps_no_strong_reference_to_arguments(collect):
    import weakref

    def comp(fn, example_args, builder):
        builder.id_match("L['net']")
        return fn

    f = specialize(run_net, compiler=comp)
    net = Net()
    f(net, 1)
    r = weakref.ref(net)
    del net
    collect()
    assert r() is None


def test_bad_arguments():
    with pytest.raises(TypeError):
        specialize(3)
    with pytest.raises(TypeError):
        specialize(add, compiler=5)
    with pytest.raises(TypeError):
        specialize(add, policy={"scalars": "type"})
    gc.collect()


def test_demo_jit_section(capsys):
    from tripwire import demo

    assert demo.run() == 0
    out = capsys.readouterr().out
    assert "compiled 1 time(s), 1 hit(s)" in out
    assert "Recompiling function _jit_demo.<locals>.forward" in out
    assert "source: L['cfg']['mode']  kind: EQUALS_MATCH  expected: 'fast'  actual: 'slow'" in out
    assert "RecompileLimitExceeded: recompile_limit (3) reached" in out
    assert "compiled again (1 compile)" in out
    assert not [h for h in logging.getLogger("tripwire.recompiles").handlers]


def make_instance(cls):
    return cls


def test_invalidation_of_inferred_identity_guard(collect):
    # classes are inferred by identity (ID_MATCH, held weakly): a dead class's entry never hits
    comp = Recorder()
    f = specialize(make_instance, compiler=comp)
    cls = type("Temp", (), {})
    f(cls)
    f(cls)
    assert len(comp.calls) == 1
    comp.calls.clear()
    del cls
    collect()
    cls2 = type("Temp", (), {})
    assert f(cls2)[2] is cls2
    assert len(comp.calls) == 1
    assert f.cache.stats["invalidations"] >= 1


def test_compiler_guard_that_does_not_hold_caches_nothing():
    def comp(fn, example_args, builder):
        builder.equals("L['n']", value=99)  # false on the example: build() refuses it
        return fn

    f = specialize(add, compiler=comp)
    with pytest.raises(tw.GuardBuildError) as ei:
        f(1, 2)
    assert any("while building the guards of add" in n for n in ei.value.__notes__)
    assert len(f.cache) == 0


# -- the C++ hit path (tripwire._core.FastDispatch) ---------------------------------------------------


def test_fast_path_hit_goes_through_fast_dispatch():
    from tripwire._core import FastDispatch

    calls = []

    def compiler(fn, example_args, builder):
        def compiled(a, b):
            calls.append((a, b))
            return fn(a, b)

        return compiled

    @specialize(compiler=compiler)
    def f(a, b):
        return a * 10 + b

    assert isinstance(f, FastDispatch) and isinstance(f, Specialized)
    assert f(1, 2) == 12
    assert f(1, 3) == 13  # same guards (ints by type or value): a hit or a recompile, never wrong
    before = f.cache.stats["hits"]
    assert f(1, 2) == 12
    assert f.cache.stats["hits"] == before + 1
    assert calls[-1] == (1, 2)
    assert f.__wrapped__.__name__ == "f" and f.__name__ == "f"


def test_fast_path_binds_keywords_and_defaults_in_cpp():
    @specialize
    def f(a, b=5):
        return a + b

    assert f._bindable()
    assert f(1, 2) == 3
    assert f(1) == 6  # default applied by the C++ binder: a new entry (b=5)
    compiles = len(f.cache)
    hits = f.cache.stats["hits"]
    assert f(a=1, b=2) == 3  # keywords: the entry of f(1, 2)
    assert f(1, b=2) == 3
    assert f(b=5, a=1) == 6  # the entry of f(1)
    assert len(f.cache) == compiles and f.cache.stats["hits"] == hits + 3
    with pytest.raises(TypeError):
        f(1, 2, 3)  # not bindable: inspect raises the call's TypeError
    with pytest.raises(TypeError):
        f(1, c=2)
    with pytest.raises(TypeError):
        f(1, a=2)


def test_fast_path_varargs_and_kwargs_bound_in_cpp():
    from tripwire._core import FastDispatch

    @specialize
    def g(*args, **kwargs):
        return (args, kwargs)

    assert isinstance(g, FastDispatch) and g._bindable()
    assert g(1, k=2) == ((1,), {"k": 2})
    hits = g.cache.stats["hits"]
    assert g(1, k=2) == ((1,), {"k": 2})
    assert g.cache.stats["hits"] == hits + 1
    assert g(1, k=3) == ((1,), {"k": 3})  # a different kwargs value: a recompile, not a false hit
    assert g(1, 2, k=2) == ((1, 2), {"k": 2})
    assert len(g.cache) == 3


def test_fast_path_hit_runs_no_python_code_but_the_payload():
    """On a hit the only Python frame entered is the compiled callable's: binding, lookup and
    dispatch are all C++ (for keyword calls, *args and **kwargs too)."""

    def compiled_body(a, *rest, k=1, **kw):
        return a

    def compiler(fn, example_args, builder):
        return compiled_body

    @specialize(compiler=compiler)
    def f(a, *rest, k=1, **kw):
        return a

    calls = [((1, 2), {"k": 3, "z": 4}), ((5,), {}), ((6,), {"k": 2})]
    for args, kwargs in calls:
        f(*args, **kwargs)  # compile
    seen: list[str] = []
    # A collection may start anywhere and run finalizers (the --gc-stress mode has one) and
    # gc.callbacks (hypothesis registers one to time collections), with whatever they call: not
    # ours, so nothing run from inside them is counted.
    collector_code = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    inside_collector = 0

    def profile(frame, event, arg):
        nonlocal inside_collector
        if frame.f_code in collector_code or frame.f_code.co_filename.endswith("gc_stress.py"):
            if event == "call":
                inside_collector += 1
            elif event == "return":
                inside_collector -= 1
        elif event == "call" and not inside_collector:
            seen.append(frame.f_code.co_name)

    for args, kwargs in calls:
        sys.setprofile(profile)
        try:
            f(*args, **kwargs)
        finally:
            sys.setprofile(None)
    assert seen == ["compiled_body"] * 3, seen


def test_fast_path_unbindable_callable_uses_python_binding():
    class Adder:
        def __call__(self, x, y=1):
            return x + y

    g = specialize(Adder())
    assert not g._bindable()
    assert g(1) == 2 and g(1) == 2 and g(x=2, y=3) == 5
    assert g.cache.stats["hits"] == 1


def test_fast_path_code_replaced_after_decoration():
    def f(x):
        return x

    s = specialize(f)
    assert s(1) == 1

    def h(x, y=10):
        return x + y

    f.__code__ = h.__code__  # a different function: bound in Python from then on, cache emptied
    f.__defaults__ = (10,)
    assert len(s.cache) == 1
    assert s(1, 2) == 3
    assert s(1) == 11 and s(1) == 11
    assert len(s.cache) == 2 and s.cache.stats["hits"] == 1


def test_fast_path_defaults_reassigned_between_calls():
    def f(x, y=1):
        return x + y

    s = specialize(f)
    assert s(1) == 2
    f.__defaults__ = (5,)  # read from the function at each call, as the interpreter does
    assert s(1) == 6
    f.__kwdefaults__ = None
    assert s(2) == 7


def test_fast_path_kwonly_default_mutated_by_a_guard(collect):
    """A guard that mutates fn.__kwdefaults__ while the call is being checked cannot free the
    value the C++ binder handed to the check (it copies the dict)."""

    class Payload:
        pass

    def f(x, *, p=None):
        return p

    def compiler(fn, example_args, builder):
        def mutate(v):
            if armed[0]:
                f.__kwdefaults__.clear()
                gc.collect()
            return True

        builder.predicate(mutate, source="L['x']")
        return fn

    armed = [False]
    f.__kwdefaults__ = {"p": Payload()}
    s = specialize(f, compiler=compiler, policy=tw.Policy(per_arg={"p": "type"}))
    assert isinstance(s(1), Payload)
    armed[0] = True
    with pytest.raises(TypeError, match="keyword-only argument: 'p'"):
        s(1)  # no crash: the check saw the old default; the payload f(1) sees the emptied dict
    armed[0] = False


def test_fast_path_argument_refcounts_unchanged():
    @specialize
    def f(a, b):
        return None

    a, b = object(), [1, 2]
    f(a, b)
    ra, rb = sys.getrefcount(a), sys.getrefcount(b)
    for _ in range(10000):
        f(a, b)
    assert sys.getrefcount(a) == ra and sys.getrefcount(b) == rb
    hits = f.cache.stats["hits"]
    assert hits >= 10000


def test_fast_path_payload_exception_propagates():
    class Boom(Exception):
        pass

    def compiler(fn, example_args, builder):
        def compiled(x):
            if x < 0:
                raise Boom(x)
            return x

        return compiled

    @specialize(compiler=compiler)
    def f(x):
        return x

    assert f(1) == 1
    with pytest.raises(Boom):
        f(-1)
    with pytest.raises(Boom):
        f(-1)  # a hit now: raised by the payload called from C++
    assert f(2) == 2


def test_fast_path_reentrant_payload_and_methods():
    @specialize
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)

    assert fact(6) == 720
    assert fact(6) == 720

    class M:
        @specialize
        def scale(self, x):
            return x * 3

    m = M()
    assert m.scale(2) == 6
    assert m.scale(2) == 6
    assert M.scale(m, 4) == 12


def test_hit_counted_once_on_every_lookup_path():
    """A hit is counted exactly once whether it takes the most-recent-entry shortcut (fast pass),
    the full lookup (several entries: dispatch index), or a guard set the fast pass cannot take
    (a predicate: the tree walk)."""

    def with_predicate(fn, example_args, builder):
        builder.predicate(lambda v: v >= 0, source="L['x']")
        return fn

    for compiler, xs in [(None, [1]), (None, [1, 2, 3]), (with_predicate, [1]), (with_predicate, [1, 2])]:

        def f(x):
            return x * 2

        s = specialize(f) if compiler is None else specialize(f, compiler=compiler)
        for x in xs:
            assert s(x) == 2 * x  # compile
        entry_sets = [e.guards for e in s.cache]
        assert all(g._uses_fast_pass == (compiler is None) for g in entry_sets)
        before = s.cache.stats["hits"]
        checks_before = sum(g.pass_count for g in entry_sets)
        for _ in range(5):
            for x in xs:
                assert s(x) == 2 * x
        assert s.cache.stats["hits"] == before + 5 * len(xs)
        assert s.cache.stats["misses"] == len(xs)  # one per compile, never re-counted
        assert sum(g.pass_count for g in entry_sets) == checks_before + 5 * len(xs)

"""tripwire.torch.compile against torch.compile: the same models through both, outputs compared
(torch.equal for eager and aot_eager, a tolerance for inductor), inputs changed to hit and to
recompile, side-effect counters proving that no frame runs twice (docs/compile.md)."""

from __future__ import annotations

import copy
import inspect
import logging
import math
import os
import subprocess
import sys
import textwrap
import threading
import warnings

import pytest

torch = pytest.importorskip("torch")

import tripwire.torch as twt  # noqa: E402
from tripwire import frame as twf  # noqa: E402
from tripwire.torch import _compile  # noqa: E402

counters = torch._dynamo.utils.counters


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    # Every test leaves the thread without a hook and the interpreter's eval function as it was.
    assert twf.current() is None
    assert twf.status()["eval_frame"] == "default"


class Counter:
    """A side effect Dynamo does not trace (a torch.compiler.disable'd call runs at run time, each
    time the frame runs): counts how often a frame's code really ran."""

    def __init__(self):
        self.log = []
        self.bump = torch.compiler.disable(self.log.append)

    def clear(self):
        self.log.clear()


def graphs() -> int:
    return counters["stats"]["unique_graphs"]


def compiled_of(compiled):
    """The tripwire.torch.compile call behind a compiled function or module."""
    return (
        compiled._tripwire_compiled
        if hasattr(compiled, "_tripwire_compiled")
        else compiled.dynamo_ctx.compiled
    )


def backend_of(compiled):
    """The frame-runtime backend key naming a compile's caches."""
    return compiled_of(compiled).caches


def test_keywords_are_torch_compiles():
    assert _compile.SIGNATURE == inspect.signature(torch.compile)
    with pytest.raises(TypeError):
        twt.compile(lambda x: x, backnd="eager")
    deco = twt.compile(backend="eager")  # decorator form, as torch.compile(backend=...)

    @deco
    def f(x):
        return x + 1

    assert torch.equal(f(torch.ones(2)), torch.full((2,), 2.0))
    assert twt.compile(f, disable=True) is f  # torch.compile's disable: the function itself


def test_function_hits_recompiles_and_runs_each_frame_once():
    counter = Counter()
    calls = counter.log

    def f(x, n, scale):
        counter.bump(1)
        y = x * scale
        for i in range(n):
            y = y + i
        return torch.relu(y)

    cf = twt.compile(f, backend="eager")
    tf = torch.compile(f, backend="eager")
    inputs = [
        (torch.randn(8), 2, 1.5),
        (torch.randn(8), 2, 1.5),  # hit
        (torch.randn(8), 3, 1.5),  # n: recompile
        (torch.randn(8, dtype=torch.float64), 2, 1.5),  # dtype: recompile
        (torch.randn(8), 2, -2.0),  # scale: recompile
        (torch.randn(8), 2, 1.5),  # hit on the first entry
    ]
    for args in inputs:
        before = len(calls)
        a = cf(*args)
        assert len(calls) == before + 1  # the frame ran once (Dynamo's compile never runs it)
        b = tf(*args)
        assert torch.equal(a, b) and a.dtype == b.dtype
    c = compiled_of(cf)
    sizes = {
        code.co_name: len(twf.cache_of(code, c.caches)) for code in c.codes if twf.cache_of(code, c.caches)
    }
    # f breaks at the counter's call (a disabled function): its own entry, and the resume function's
    # four (one per n, dtype and scale seen).
    assert sizes == {"f": 1, **{k: 4 for k in sizes if "resume" in k}}, sizes
    assert len(sizes) == 2


def test_mutated_input_in_place_recompiles_on_what_the_guards_see():
    def f(x, cfg):
        return x * cfg["k"] + cfg["b"]

    cf = twt.compile(f, backend="eager")
    cfg = {"k": 2, "b": 1}
    x = torch.ones(3)
    assert torch.equal(cf(x, cfg), x * 2 + 1)
    cfg["k"] = 5  # mutated: the entry's guard on cfg['k'] fails
    assert torch.equal(cf(x, cfg), x * 5 + 1)
    x.add_(1)  # a tensor mutated in place: same guards, new values
    assert torch.equal(cf(x, cfg), x * 5 + 1)
    assert graphs() == 2


def test_a_zero_of_the_other_sign_recompiles():
    """Code Dynamo specialised for s = 0.0 computes 1 / (x * 0.0) = +inf; for -0.0 eager gives
    -inf. torch's guard (==) reuses the 0.0 entry there; tripwire's EQUALS_MATCH compares the
    sign, so the call compiles its own entry and matches eager (docs/compile.md)."""

    def f(x, s, pair):
        return torch.stack([1 / (x * s), 1 / (x * pair[0])])

    cf = twt.compile(f, backend="eager")
    x = torch.ones(3)
    for s, pair in [(0.0, (0.0, 1)), (-0.0, (0.0, 1)), (0.0, (-0.0, 1)), (-0.0, (-0.0, 1)), (0.0, (0.0, 1))]:
        assert torch.equal(cf(x, s, pair), f(x, s, pair)), (s, pair)
    assert graphs() == 4
    assert f(x, -0.0, (0.0, 1))[0, 0] == -math.inf


class _Base:
    scale = 2

    def m(self):
        return 1


class _Sub(_Base):
    pass


class _WithProperty:
    @property
    def v(self):
        return 4


class _SubOfProperty(_WithProperty):
    pass


def test_class_changes_dynamo_does_not_guard_recompile():
    """Dynamo inlines what ``obj.m()`` and ``obj.scale`` resolve to through the class and guards
    only that the names are not in ``obj.__dict__`` (and the base-class dict entry of a value it
    specialised on). A method replaced on the base class, or the attribute shadowed on the
    subclass (or a property shadowed there), passes torch's guards and torch.compile runs stale code; the importer adds the
    lookup's guards (docs/torch.md), so tripwire recompiles and matches eager."""
    obj = _Sub()

    def f(x):
        return x * obj.scale + obj.m()

    prop = _SubOfProperty()

    def g(x):
        return x * prop.v  # a property: Dynamo guards P.__dict__['v'], not its absence from Q

    x = torch.ones(2)
    try:
        for fn, change in [
            (f, lambda: setattr(_Base, "m", lambda self: 10)),
            (f, lambda: setattr(_Sub, "scale", 4)),
            (g, lambda: setattr(_SubOfProperty, "v", 11)),
        ]:
            torch._dynamo.reset()
            ours, theirs = twt.compile(fn, backend="eager"), torch.compile(fn, backend="eager")
            before = fn(x)
            assert torch.equal(ours(x), before) and torch.equal(theirs(x), before)
            change()
            assert not torch.equal(fn(x), before)
            assert torch.equal(ours(x), fn(x))
            assert torch.equal(theirs(x), before)  # torch 2.13: stale
    finally:
        _Base.m = lambda self: 1
        for cls, name in [(_Sub, "scale"), (_SubOfProperty, "v")]:
            if name in cls.__dict__:
                delattr(cls, name)


def test_a_builtin_shadowed_by_a_global_runs_as_torch_compile():
    """Dynamo guards the builtins dict entry of ``abs``, not the absence of ``abs`` in the
    function's globals: a global defined later shadows the builtin in eager, while both routes
    run the code compiled for the builtin (docs/torch.md, "What Dynamo does not guard"); eager
    differs, which keeps this test from agreeing vacuously."""
    namespace = {"torch": torch}
    exec("def g(x):\n    return x * abs(-2)\n", namespace)
    g = namespace["g"]
    x = torch.ones(2)
    ours, theirs = twt.compile(g, backend="eager"), torch.compile(g, backend="eager")
    before = g(x)
    assert torch.equal(ours(x), before) and torch.equal(theirs(x), before)
    namespace["abs"] = lambda v: 7
    assert not torch.equal(g(x), before)
    assert torch.equal(ours(x), before) and torch.equal(theirs(x), before)


def test_graph_breaks_compile_resume_functions_once_each():
    counter = Counter()
    log = counter.log

    def g(x, mode):
        counter.bump("before")
        y = x.sin()
        torch._dynamo.graph_break()
        counter.bump("after")
        if x.sum() > 0:
            y = y * 2
        return y + 1 if mode == "a" else y - 1

    cg = twt.compile(g, backend="eager")
    tg = torch.compile(g, backend="eager")
    for v in (torch.randn(5), -torch.ones(5), torch.ones(5), torch.ones(5)):
        for mode in "ab":
            log.clear()
            a = cg(v, mode)
            assert log == ["before", "after"]
            assert torch.equal(a, tg(v, mode))
    resumes = [c for c in compiled_of(cg).codes if "resume" in c.co_name]
    assert resumes  # the resume functions went through tripwire too


def test_module_behaves_like_optimized_module():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    cm = twt.compile(mlp, backend="eager")
    tm = torch.compile(mlp, backend="eager")
    assert isinstance(cm, torch._dynamo.eval_frame.OptimizedModule)
    assert list(cm.state_dict()) == list(tm.state_dict())
    assert [p is q for p, q in zip(cm.parameters(), mlp.parameters(), strict=True)] == [True] * 4
    assert cm._orig_mod is mlp and cm._orig_mod[0] is mlp[0]
    import inspect

    def params(obj):
        return [(p.name, p.kind) for p in inspect.signature(obj).parameters.values()]

    for of in (lambda m: m, lambda m: m.forward):  # introspection reads as torch's
        assert params(of(cm)) == params(of(tm))
    x = torch.randn(3, 4)
    assert torch.equal(cm(x), tm(x)) and torch.equal(cm(x), mlp(x))
    cm.eval()
    assert not mlp.training
    cm.train()
    assert mlp.training

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(6)
            self.lin = torch.nn.Linear(6, 6)
            self.drop = torch.nn.Dropout(0.5)
            self.scale = 0.5

        def forward(self, x):
            return x + self.drop(self.lin(self.norm(x))) * self.scale

    blk = Block()
    cb = twt.compile(blk, backend="eager")
    assert cb.scale == 0.5 and cb.lin is blk.lin
    cb.eval()
    x = torch.randn(2, 6)
    assert torch.equal(cb(x), blk(x))
    cb.train()  # dropout on: a recompile (torch guards .training here), still one frame run
    torch.manual_seed(1)
    a = cb(x)
    torch.manual_seed(1)
    assert torch.equal(a, blk(x))


def test_a_compiled_module_pickles_and_copies_as_optimized_module():
    # torch.save of the compiled module and copy.deepcopy, as torch's OptimizedModule allows: the
    # copy wraps a copy of the module, compiled again with the same keywords on tripwire's route.
    import copy
    import io

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    cm = twt.compile(mlp, backend="eager", dynamic=False)
    x = torch.randn(3, 4)
    y = cm(x)
    buf = io.BytesIO()
    torch.save(cm, buf)
    buf.seek(0)

    # A compiled function is a function to copy: copy.copy and copy.deepcopy return it.
    def twice(v):
        return v * 2

    cf = twt.compile(twice, backend="eager")
    assert isinstance(cf, twf._FrameScope)
    assert copy.copy(cf) is cf and copy.deepcopy([cf])[0] is cf
    copies = [torch.load(buf, weights_only=False), copy.deepcopy(cm)]
    for other in copies:
        assert type(other) is type(cm) and other is not cm
        assert other._orig_mod is not mlp and other.dynamo_ctx.options == cm.dynamo_ctx.options
        runs = sum(_compile._frame_runs())
        assert torch.equal(other(x), y)
        assert sum(_compile._frame_runs()) == runs + 1  # run by tripwire's frame runtime
        with torch.no_grad():
            other._orig_mod[0].weight.zero_()  # a copy: the original is untouched
        assert torch.equal(cm(x), y) and not torch.equal(other(x), y)


def test_module_hooks_and_forward_changed_after_compiling_apply_as_under_torch_compile():
    # A call with no hook anywhere enters the compiled forward directly; every later change that
    # torch's route would see must be seen here too.
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x) * 2

    torch.manual_seed(0)
    m = M()
    cm, tm = twt.compile(m, backend="eager"), torch.compile(m, backend="eager")
    x = torch.randn(2, 4)
    for _ in range(2):
        assert torch.equal(cm(x), m(x))
    # Hooks run under the hook, as under torch.compile: Dynamo compiles their frames (under
    # no_grad: tracing a hook that sees a non-leaf output warns about its .grad otherwise).
    with torch.no_grad():
        seen = []
        post = m.register_forward_hook(lambda mod, args, out: seen.append("post"))
        assert torch.equal(cm(x), tm(x))
        assert seen == ["post"] * 2
        pre = m.register_forward_pre_hook(lambda mod, args: (args[0] * 3,))
        assert torch.equal(cm(x), m(x)) and torch.equal(cm(x), tm(x))
        assert torch.equal(cm(x), m.lin(x * 3) * 2)
        assert seen == ["post"] * 7
        pre.remove()
        post.remove()
        assert torch.equal(cm(x), m.lin(x) * 2)
        on_wrapper = cm.register_forward_hook(lambda mod, args, out: out + 100)
        assert torch.equal(cm(x), m(x) + 100)
        on_wrapper.remove()
        assert torch.equal(cm(x), m(x))
        # A global hook fires for the wrapper and for the module, as under torch.compile (which warns).
        fired = []
        handle = torch.nn.modules.module.register_module_forward_hook(lambda mod, a, out: fired.append(mod))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                assert torch.equal(cm(x), tm(x))
        finally:
            handle.remove()
        n = len(fired) // 2
        assert n >= 2 and fired[:n].count(m) == fired[n:].count(m) and fired[:n].count(cm) == 1
        # A forward replaced on the instance runs (and is compiled), as torch's route reads it.
        m.forward = lambda x: x - 1
        try:
            assert torch.equal(cm(x), x - 1) and torch.equal(tm(x), x - 1)
        finally:
            del m.forward
        assert torch.equal(cm(x), m(x))
        # Module.compile()'s _compiled_call_impl is what torch's route calls for the inner module.
        m._compiled_call_impl = lambda *a: torch.zeros(1)
        try:
            assert torch.equal(cm(x), torch.zeros(1)) and torch.equal(tm(x), torch.zeros(1))
        finally:
            m._compiled_call_impl = None
        assert torch.equal(cm(x), m(x))
        # A module whose __dict__ is replaced wholesale: the new one's hooks apply.
        fresh = dict(m.__dict__)
        fresh["_forward_hooks"] = {0: lambda mod, args, out: out * 0}
        object.__setattr__(m, "__dict__", fresh)
        assert torch.equal(cm(x), torch.zeros(2, 4)) and torch.equal(tm(x), torch.zeros(2, 4))
        fresh["_forward_hooks"] = {}
        assert torch.equal(cm(x), m(x))
        # Calls sent to torch.compile's wrapper get the module's arguments, not the module.
        with torch.compiler.set_stance("force_eager"):
            assert torch.equal(cm(x), m(x))
        outer = torch.compile(lambda x: cm(x) + 1, backend="eager")  # torch's hook is set: fallback
        assert torch.equal(outer(x), m(x) + 1)


def test_in_optimized_module_is_set_for_the_call_and_restored_on_an_exception():
    flags = []
    probe = torch.compiler.disable(lambda: flags.append(torch._dynamo.eval_frame._is_in_optimized_module()))

    class M(torch.nn.Module):
        def forward(self, x):
            probe()
            if x.sum() > 100:
                raise ValueError("big")
            return x + 1

    cm = twt.compile(M(), backend="eager")
    for _ in range(2):
        assert torch.equal(cm(torch.ones(2)), torch.full((2,), 2.0))
    with pytest.raises(ValueError, match="big"):
        cm(torch.full((2,), 100.0))
    assert flags == [True, True, True]
    assert not torch._dynamo.eval_frame._is_in_optimized_module()


def test_compiled_code_calls_its_graphs_through_c_scopes_and_no_profiler_helpers(monkeypatch):
    def g(x):
        return x.sin() + 1

    entered = []
    real_enter = torch._dynamo.utils.record_pregraph_bytecode_enter

    def counting_enter():
        entered.append(1)
        return real_enter()

    # Dynamo's code imports the helper from torch._dynamo.utils on every call.
    monkeypatch.setattr(torch._dynamo.utils, "record_pregraph_bytecode_enter", counting_enter)
    before = set(g.__globals__)  # earlier tests' graphs may not be collected yet
    cg, tg = twt.compile(g, backend="eager"), torch.compile(g, backend="eager")
    x = torch.randn(3)
    for _ in range(3):
        assert torch.equal(cg(x), tg(x))
    assert len(entered) == 3  # torch's code only: tripwire compiles without the helpers
    assert torch._dynamo.config.record_runtime_overhead  # the compile's patch is undone
    names = [k for k in g.__globals__ if k.startswith("__compiled_fn") and k not in before]
    ours = [k for k in names if isinstance(g.__globals__[k], twf._FrameScope)]
    assert len(ours) == 1 and len(names) == 2  # torch's graph keeps its DisableContext wrapper
    # The graph's frames run with the hook suspended: nothing in them was offered to Dynamo.
    c = backend_of(cg)
    assert all(not code.co_filename.startswith("<eval_with_key>") for code in c.codes)


def test_bound_method():
    class Scaler:
        def __init__(self):
            self.k = 3.0

        def apply(self, x):
            return (x * self.k).tanh()

    s = Scaler()
    cm = twt.compile(s.apply, backend="eager")
    x = torch.randn(4)
    assert torch.equal(cm(x), s.apply(x))
    s.k = 4.0
    assert torch.equal(cm(x), s.apply(x))


def test_training_steps_match_torch_compile():
    torch.manual_seed(0)
    ours = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    theirs = copy.deepcopy(ours)
    c1 = twt.compile(ours, backend="eager")
    c2 = torch.compile(theirs, backend="eager")
    o1 = torch.optim.SGD(ours.parameters(), lr=0.1)
    o2 = torch.optim.SGD(theirs.parameters(), lr=0.1)
    for _ in range(4):
        x = torch.randn(6, 4)
        for c, o in ((c1, o1), (c2, o2)):
            o.zero_grad()
            loss = c(x).pow(2).mean()
            loss.backward()
            o.step()
        with torch.no_grad():  # an in-place update of a parameter between steps
            for p in (*ours.parameters(), *theirs.parameters()):
                p.mul_(0.99)
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(p, q)


def test_exceptions_inside_compiled_code():
    counter = Counter()
    log = counter.log

    def f(x, fail):
        counter.bump(1)
        y = x + 1
        torch._dynamo.graph_break()
        if fail:
            raise ValueError("inside")
        return y

    cf = twt.compile(f, backend="eager")
    depth = torch._C._functorch.get_dynamic_layer_stack_depth()
    include = torch._C._dispatch_tls_local_include_set()
    with pytest.raises(ValueError, match="inside"):
        cf(torch.ones(2), True)
    assert log == [1]
    assert twf.current() is None
    assert torch._C._functorch.get_dynamic_layer_stack_depth() == depth
    assert torch._C._dispatch_tls_local_include_set() == include
    assert torch.equal(cf(torch.ones(2), False), torch.full((2,), 2.0))
    assert log == [1, 1]


def _local_keys():
    return (torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set())


_entered_guards: list = []  # alive: a guard's destructor would put the keys back itself


def _leave_keys_changed():
    """What a graph or user code may leave behind: a dispatch-key guard entered and never exited."""
    include, exclude = _local_keys()
    # FuncTorchVmapMode excluded: inert outside vmap, so the rest of the call computes as before.
    extra = torch._C.DispatchKeySet(torch._C.DispatchKey.FuncTorchVmapMode)
    guard = torch._C._ForceDispatchKeyGuard(include, exclude | extra)
    guard.__enter__()
    _entered_guards.append(guard)
    assert _local_keys() != (include, exclude)


@pytest.fixture(autouse=True)
def _drop_entered_guards():
    yield
    while _entered_guards:
        _entered_guards.pop()  # newest first: each destructor restores what it saw


@pytest.mark.parametrize("raises", [False, True])
def test_dispatch_keys_are_restored_after_every_call_as_torch_compile_does(raises):
    def f(x, fail):
        y = x + 1
        leave()
        if fail:
            raise ValueError("inside")
        return y

    leave = torch.compiler.disable(_leave_keys_changed)
    before = _local_keys()
    for compiled in (torch.compile(f, backend="eager"), twt.compile(f, backend="eager")):
        for _ in range(2):  # the compiling call, then a hit
            if raises:
                with pytest.raises(ValueError, match="inside"):
                    compiled(torch.ones(2), True)
            else:
                assert torch.equal(compiled(torch.ones(2), False), torch.full((2,), 2.0))
            assert _local_keys() == before  # torch.compile's own answer is the oracle too


def test_on_error_undoes_a_pushed_functorch_layer_and_the_scope_restores_keys():
    depth = torch._C._functorch.get_dynamic_layer_stack_depth()
    got = []

    def boom():
        # In this order: the guard's destructor (at teardown) restores what it saw on entry.
        _leave_keys_changed()
        torch._C._functorch._vmap_increment_nesting(2, "error")  # a graph's pushed layer
        raise KeyError("boom")

    def on_error(saved_depth):
        got.append(saved_depth)
        _compile._undo_to(saved_depth)

    before = _local_keys()
    hook = twf.Hook(lambda frame: None, backend=object())
    s = twf.scoped(boom, hook, enter=_compile._depth, on_error=on_error, dispatch_keys=True)
    with pytest.raises(KeyError, match="boom"):
        s()
    assert got == [depth]
    assert torch._C._functorch.get_dynamic_layer_stack_depth() == depth
    assert _local_keys() == before
    assert twf.current() is None
    # Without dispatch_keys the scope leaves them as the call left them.
    plain = twf.scoped(_leave_keys_changed, hook)
    plain()
    assert _local_keys() != before
    _entered_guards.pop()
    assert _local_keys() == before


@pytest.mark.parametrize("route", ["tripwire", "torch"])
def test_exception_inside_a_graph_with_a_functorch_layer_pushed(route):
    """The scope's own enter/on_error (torch's C depth functions): a compiled frame's callee that
    pushes a functorch layer and raises leaves the stack at the call's depth, and the dispatch-key
    TLS as it was, as torch.compile's wrapper does (its answer is the oracle)."""

    @torch.compiler.disable
    def push_and_raise(y):
        _leave_keys_changed()
        torch._C._functorch._vmap_increment_nesting(2, "error")
        raise KeyError("boom")

    def f(x, fail):
        y = x + 1
        if fail:
            push_and_raise(y)
        return y * 2

    compile = twt.compile if route == "tripwire" else torch.compile
    cf = compile(f, backend="eager")
    depth = torch._C._functorch.get_dynamic_layer_stack_depth()
    before = _local_keys()
    assert torch.equal(cf(torch.ones(2), False), torch.full((2,), 4.0))
    for _ in range(2):  # the miss that compiles, then the hit
        with pytest.raises(KeyError, match="boom"):
            cf(torch.ones(2), True)
        assert torch._C._functorch.get_dynamic_layer_stack_depth() == depth
        assert _local_keys() == before
    assert torch.equal(cf(torch.ones(2), False), torch.full((2,), 4.0))


def test_stance_and_profiler_changed_between_calls_divert_hits():
    """The scope reads torch's stance and profiler flag in C on every call: a call that would hit
    goes to torch.compile's own wrapper once either is set between calls (no tripwire frame runs),
    and back to tripwire's entries once it is unset."""
    log = []

    def f(x):
        log.append("ran")
        return x * 3

    cf = twt.compile(f, backend="eager")
    x = torch.ones(2)
    cf(x)
    runs = sum(_compile._frame_runs())
    cf(x)
    assert sum(_compile._frame_runs()) == runs + 1  # a hit, run by tripwire's frame runtime
    own = graphs()
    with torch.compiler.set_stance("force_eager"):  # set_stance rebinds eval_frame._stance
        log.clear()
        assert torch.equal(cf(x), torch.full((2,), 3.0))
        assert log == ["ran"]  # eagerly, through torch.compile's wrapper
    assert sum(_compile._frame_runs()) == runs + 1 and graphs() == own
    cf(x)
    assert sum(_compile._frame_runs()) == runs + 2  # default again: tripwire's entry hits
    with torch.profiler.profile() as prof:
        assert torch.equal(cf(x), torch.full((2,), 3.0))
    assert sum(_compile._frame_runs()) == runs + 2  # torch.compile's wrapper ran it, compiled
    assert graphs() == own + 1  # by torch's own cache, which tripwire's entries are not in
    assert any(e.name.startswith("Torch-Compiled Region") for e in prof.events())
    cf(x)
    assert sum(_compile._frame_runs()) == runs + 3


def test_automatic_dynamic_and_mark_dynamic():
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    cm = twt.compile(mlp, backend="eager")
    for b in (8, 24, 40, 3):
        x = torch.randn(b, 4)
        assert torch.equal(cm(x), mlp(x))
    assert graphs() == 2  # static, then one dynamic graph that serves 24, 40 and 3

    def f(x):
        return x.cos() * 2

    cf = twt.compile(f, backend="eager")
    counters.clear()
    for t in (5, 9, 17):
        x = torch.randn(t)
        torch._dynamo.mark_dynamic(x, 0)
        assert torch.equal(cf(x), f(x))
    assert graphs() == 1


@pytest.mark.parametrize("dynamic", [True, False])
def test_the_dynamic_keyword_compiles_as_torch_compile(dynamic):
    # dynamic=True: one symbolic graph from the first call; dynamic=False: one graph per shape,
    # never automatic dynamic. The same graphs as torch.compile's, and the same outputs.
    def f(x):
        return (x * 2).sum(0)

    sizes = (4, 5, 6, 4, 7)
    made = []
    for compile_ in (torch.compile, twt.compile):
        torch._dynamo.reset()
        counters.clear()
        cf = compile_(f, backend="eager", dynamic=dynamic)
        for n in sizes:
            x = torch.randn(n, 3)
            assert torch.equal(cf(x), f(x))
        made.append(graphs())
    assert made == [1, 1] if dynamic else made == [4, 4], made


def test_generator_and_coroutine_functions_run_their_bodies_uncompiled():
    # Their bodies run when iterated or awaited, after the call returned: outside the call's
    # scope, and the frame runtime never intercepts such frames. A generator consumed inside a
    # compiled function is traced into its caller's graph by Dynamo, as under torch.compile.
    # (torch 2.13's own torch.compile of an async function crashes CPython 3.11 in a later
    # collection; this route runs it uncompiled.)
    import asyncio

    def gen(x, n):
        for i in range(n):
            yield x * i

    async def co(x):
        return x.sin() + 1

    def consumer(x):
        return sum(gen(x, 3))

    x = torch.randn(3)
    cg, cc, cu = (twt.compile(f, backend="eager") for f in (gen, co, consumer))
    for _ in range(2):
        assert all(torch.equal(a, b) for a, b in zip(cg(x, 3), gen(x, 3), strict=True))
        assert torch.equal(asyncio.run(cc(x)), x.sin() + 1)
    assert graphs() == 0
    for _ in range(2):
        assert torch.equal(cu(x), consumer(x))
    assert graphs() == 1


def test_fx_and_jit_traces_and_export_over_a_compiled_function_as_torch_compile():
    # compile_wrapper refuses an FX symbolic trace and a torch.jit.trace over a compiled function
    # (RuntimeError), runs it as is with error_on_nested_fx_trace=False, and inside an export's
    # trace: the scope sends those calls to it. Dynamo is never asked under them, so the function
    # still compiles afterwards (asked under an FX trace, it skipped the code for good).
    def f(x):
        return x.sin() + 1

    def traced(cf):
        class M(torch.nn.Module):
            def forward(self, x):
                return cf(x) * 2

        return M()

    x = torch.randn(3)
    messages = []
    for compile_ in (torch.compile, twt.compile):
        torch._dynamo.reset()
        cf = compile_(f, backend="eager")
        got = []
        for trace in (torch.fx.symbolic_trace, lambda m: torch.jit.trace(m, x)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.trace's own
                with pytest.raises(RuntimeError, match="Detected that you are using FX to") as e:
                    trace(traced(cf))
            got.append(str(e.value))
        with torch._dynamo.config.patch(error_on_nested_fx_trace=False):
            gm = torch.fx.symbolic_trace(traced(cf))
        assert torch.equal(gm(x), (x.sin() + 1) * 2)
        ep = torch.export.export(traced(cf), (x,))
        assert torch.equal(ep.module()(x), (x.sin() + 1) * 2)
        messages.append(got)
        if compile_ is twt.compile:
            runs = sum(_compile._frame_runs())
            assert graphs() == 0
            for _ in range(2):
                assert torch.equal(cf(x), f(x))
            assert graphs() == 1 and sum(_compile._frame_runs()) > runs  # compiled, run by tripwire
    assert messages[0] == messages[1]


def test_compiler_disable_suspends_the_hook_for_the_call():
    calls = []

    def deep(x):
        calls.append("deep")
        return x - 1

    @torch.compiler.disable
    def helper(x):
        calls.append("helper")
        return deep(x + 1)

    def g(x):
        return helper(x.sin()) * 2

    cg = twt.compile(g, backend="eager")
    for _ in range(2):
        calls.clear()
        assert torch.equal(cg(torch.ones(3)), g(torch.ones(3)))
        assert calls == ["helper", "deep", "helper", "deep"]
    c = compiled_of(cg)
    # Every disable wrapper runs one code: served by one entry, its call suspended (the helper and
    # what it calls were never offered to Dynamo).
    assert len(twf.cache_of(_compile._DISABLE_FN_CODE, c.caches)) == 1
    assert deep.__code__ not in c.codes and helper.__code__ not in c.codes


def test_fullgraph_errors():
    def h(x):
        torch._dynamo.graph_break()
        return x + 1

    ch = twt.compile(h, backend="eager", fullgraph=True)
    with pytest.raises(torch._dynamo.exc.Unsupported):
        ch(torch.ones(2))
    assert twf.status()["eval_frame"] == "default"


_PER_CALL_SEMANTICS = textwrap.dedent(
    """
    import os, torch, tripwire.torch as twt, tripwire.frame as twf
    route = torch.compile if os.environ["ROUTE"] == "torch" else twt.compile
    Unsupported = torch._dynamo.exc.Unsupported

    def step(name, fn, *args):
        try:
            out = "ok " + str(fn(*args).tolist())
        except Exception as e:
            out = "raises " + type(e).__name__ + ": " + str(e).splitlines()[0]
        print(name, "|", out)

    def g(x):
        y = x + 1
        torch._dynamo.graph_break()
        return y * 2

    # First: after a compile error torch's own fullgraph checks misbehave (its hook stays).
    with torch._dynamo.error_on_graph_break(False):
        step("eogb False under fullgraph", route(g, backend="eager", fullgraph=True), torch.ones(3))
    # error_on_graph_break: Dynamo reads it while it compiles, inside the call.
    cg = route(g, backend="eager")
    with torch._dynamo.error_on_graph_break(True):
        step("eogb context", cg, torch.ones(3))
    step("eogb decorator", route(torch._dynamo.error_on_graph_break(True)(g), backend="eager"), torch.ones(3))
    step("eogb back to False", cg, torch.ones(3))
    with torch._dynamo.error_on_graph_break(True):
        step("eogb on a compiled code: a hit", cg, torch.ones(3))

    # fullgraph=True's "found no compiled frames", per call.
    def h(x):
        return x * 3

    ch = route(h, backend="eager", fullgraph=True)
    with torch._dynamo.config.patch(disable=True):
        step("fullgraph config.disable", ch, torch.ones(2))
    step("fullgraph skipped for good", ch, torch.ones(2))
    with torch.compiler.set_stance("eager_on_recompile"):
        step("fullgraph other stance", ch, torch.ones(2))
    def k(x):  # not h: torch's compiles of one function share its skip (docs/compile.md)
        return x * 3

    ok = route(k, backend="eager", fullgraph=True)
    step("fullgraph compiles", ok, torch.ones(2))
    step("fullgraph hits", ok, torch.ones(2))
    print("tripwire's hook used:", twf.cache_of(k, getattr(getattr(ok, "_tripwire_compiled", None), "caches", None)) is not None)
    """
)


def _run_route(route: str, code: str) -> list[str]:
    # A subprocess per route: torch 2.13 leaves its frame hook installed after a compile error.
    env = dict(os.environ, ROUTE=route, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_error_on_graph_break_and_fullgraphs_per_call_check_as_torch_compile():
    """error_on_graph_break (the context manager and the decorator, as 2.13 applies them: read
    by Dynamo at compile time) and fullgraph=True's per-call "found no compiled frames" check:
    the same outcome, error type and message as torch.compile, step by step."""
    torch_lines = _run_route("torch", _PER_CALL_SEMANTICS)
    tw_lines = _run_route("tripwire", _PER_CALL_SEMANTICS)
    assert torch_lines[:-1] == tw_lines[:-1]
    assert tw_lines[-1] == "tripwire's hook used: True"
    got = dict(line.split(" | ", 1) for line in tw_lines[:-1])
    assert got["eogb context"].startswith("raises Unsupported: Call to `torch._dynamo.graph_break()`")
    assert got["eogb decorator"].startswith("raises Unsupported")
    assert got["eogb back to False"] == got["eogb on a compiled code: a hit"] == "ok [4.0, 4.0, 4.0]"
    assert got["eogb False under fullgraph"].startswith("raises Unsupported")
    assert got["fullgraph config.disable"] == (
        "raises RuntimeError: torch.compile with fullgraph=True found no compiled frames. Skipped frames:"
    )
    assert (
        got["fullgraph skipped for good"].startswith("raises RuntimeError")
        and "not attempted" in (got["fullgraph skipped for good"])
    )
    assert (
        got["fullgraph other stance"] == got["fullgraph compiles"] == got["fullgraph hits"] == "ok [3.0, 3.0]"
    )


def test_fullgraph_check_counts_a_frame_tripwire_ran_uncompiled(monkeypatch):
    """A frame Dynamo compiled but whose guards tripwire could not serve runs uncompiled with a
    warning: fullgraph's check counts it as compiled (torch.compile would have run it)."""

    def g(x):
        return x - 1

    monkeypatch.setattr(_compile, "_import_guards", lambda guarded, frame: None)
    cg = twt.compile(g, backend="eager", fullgraph=True)
    assert torch.equal(cg(torch.ones(2)), torch.zeros(2))


def test_compiles_of_one_function_share_caches_as_torch_compiles_do():
    """torch 2.13: every torch.compile call of a function shares the code object's entries and
    recompile budget when their backends are equal; isolate_recompiles=True separates them."""

    def f(x, n):
        return x + n

    def run(route):
        torch._dynamo.reset()
        counters.clear()
        seen = []
        a, b = route(f, backend="eager"), route(f, backend="eager")
        a(torch.ones(1), 1)
        b(torch.ones(1), 1)  # b hits a's entry
        seen.append(graphs())
        c = route(f, backend="aot_eager")  # another backend: its own entry
        assert torch.equal(c(torch.ones(1), 1), torch.full((1,), 2.0))
        seen.append(graphs())
        torch._dynamo.reset()  # (torch counts every backend's entries against one budget)
        with torch._dynamo.config.patch(recompile_limit=2):
            a(torch.ones(1), 1)
            a(torch.ones(1), 2)  # a's recompile: the code's entries reach the limit
            assert torch.equal(b(torch.ones(1), 3), torch.full((1,), 4.0))  # b: limited, eager
        seen.append(graphs())
        i, j = (
            route(f, backend="eager", isolate_recompiles=True),
            route(f, backend="eager", isolate_recompiles=True),
        )
        # (an input no shared entry takes: torch's isolated compiles would hit those, read-only)
        i(torch.ones(1, dtype=torch.float64), 5)
        j(torch.ones(1, dtype=torch.float64), 5)
        seen.append(graphs())
        return seen

    assert run(twt.compile) == run(torch.compile) == [1, 2, 4, 6]


def test_shared_caches_skip_for_every_compile_of_the_function():
    def f(x):
        return x * 2

    a = twt.compile(f, backend="eager")
    with torch._dynamo.config.patch(disable=True):
        a(torch.ones(1))  # Dynamo skips f for good
    b = twt.compile(f, backend="eager")
    assert torch.equal(b(torch.ones(1)), torch.full((1,), 2.0))
    assert graphs() == 0 and twf.strategy_of(f, backend_of(b)) == "skip"
    assert backend_of(a) is backend_of(b)
    other = twt.compile(f, backend="eager", isolate_recompiles=True)
    other(torch.ones(1))
    assert graphs() == 1 and backend_of(other) is not backend_of(a)


def test_reset_clears_shared_entries_after_the_compile_that_made_them_died():
    import gc

    def f(x):
        return x - 3

    a = twt.compile(f, backend="eager")
    a(torch.ones(1))
    del a
    gc.collect()
    b = twt.compile(f, backend="eager")
    b(torch.ones(1))
    assert graphs() == 1  # b hit the dead compile's entry
    twt.reset()
    assert len(twf.cache_of(f, backend_of(b)) or ()) == 0
    assert torch.equal(b(torch.ones(1)), torch.full((1,), -2.0))
    assert graphs() == 2


def test_a_backend_whose_eq_compiles_does_not_deadlock():
    """Backends are compared with == when a compile picks its caches: user code, which may compile."""
    inner = []

    class Reentrant:
        def __call__(self, gm, example_inputs):
            return gm.forward

        def __eq__(self, other):
            if isinstance(other, Reentrant) and not inner:
                inner.append(twt.compile(lambda x: x + 1, backend="eager"))
            return self is other

        __hash__ = object.__hash__

    def f(x):
        return x * 5

    first, second = Reentrant(), Reentrant()
    a = twt.compile(f, backend=first)
    b = twt.compile(f, backend=second)  # compares with a's backend: compiles inside __eq__
    assert inner and backend_of(a) is not backend_of(b)
    assert torch.equal(a(torch.ones(1)), b(torch.ones(1)))
    assert torch.equal(inner[0](torch.ones(1)), torch.full((1,), 2.0))


def test_stances():
    def k(x, n):
        return x * n

    ck = twt.compile(k, backend="eager")
    ck(torch.ones(2), 2)
    assert graphs() == 1
    with torch.compiler.set_stance("fail_on_recompile"):
        assert torch.equal(ck(torch.ones(2), 2), torch.full((2,), 2.0))  # a hit is fine
        with pytest.raises(RuntimeError, match="fail_on_recompile"):
            ck(torch.ones(2), 3)
    with torch.compiler.set_stance("eager_on_recompile"):
        assert torch.equal(ck(torch.ones(2), 5), torch.full((2,), 5.0))
        assert torch.equal(ck(torch.ones(2), 2), torch.full((2,), 2.0))
    assert graphs() == 1  # neither compiled
    with torch.compiler.set_stance("force_eager"):
        assert torch.equal(ck(torch.ones(2), 6), torch.full((2,), 6.0))
    assert graphs() == 1
    ck(torch.ones(2), 6)  # default again: compiles
    assert graphs() == 2


@torch._dynamo.config.patch(recompile_limit=3)
def test_recompile_limit_applies_before_compiling(caplog):
    def r(x, s):
        return x + len(s)

    cr = twt.compile(r, backend="eager")
    with caplog.at_level(logging.WARNING, logger="tripwire.recompiles"):
        for i in range(6):
            assert torch.equal(cr(torch.ones(1), "a" * i), torch.full((1,), 1.0 + i))
    assert graphs() == 3  # the 4th compile was never started
    assert counters["stats"]["recompile_limit_hit"] == 1
    assert "recompile_limit (3)" in caplog.text and "L['s']" in caplog.text
    assert twf.strategy_of(r, backend_of(cr)) == "run_only"
    limited = twt.compile(r, backend="eager", recompile_limit=1)
    limited(torch.ones(1), "x")
    limited(torch.ones(1), "yy")
    assert twf.strategy_of(r, backend_of(limited)) == "run_only"


def test_recompile_limit_is_read_on_each_miss_as_dynamo_reads_it():
    def r(x, s):
        return x + len(s)

    # Isolated: each compile has its own entries and budget (shared, the first limit would stop all).
    cr = twt.compile(r, backend="eager", isolate_recompiles=True)
    keyword = twt.compile(r, backend="eager", recompile_limit=3, isolate_recompiles=True)
    for i in range(2):
        cr(torch.ones(1), "a" * i)
        keyword(torch.ones(1), "a" * i)
    assert graphs() == 4
    with torch._dynamo.config.patch(recompile_limit=2, accumulated_recompile_limit=100):
        assert torch.equal(cr(torch.ones(1), "abc"), torch.full((1,), 4.0))  # runs eagerly
        assert graphs() == 4  # the config lowered after compile(): not compiled
        assert twf.strategy_of(r, backend_of(cr)) == "run_only"
        keyword(torch.ones(1), "abc")  # the keyword wins over the config, as in torch
        assert graphs() == 5
        assert twf.strategy_of(r, backend_of(keyword)) != "run_only"
    raised = twt.compile(r, backend="eager", isolate_recompiles=True)
    raised(torch.ones(1), "")
    with torch._dynamo.config.patch(accumulated_recompile_limit=1):
        raised(torch.ones(1), "a")
        assert twf.strategy_of(r, backend_of(raised)) == "run_only"


@torch._dynamo.config.patch(recompile_limit=1)
def test_recompile_limit_with_fullgraph_raises():
    def r(x, n):
        return x + n

    cr = twt.compile(r, backend="eager", fullgraph=True)
    cr(torch.ones(1), 1)
    with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
        cr(torch.ones(1), 2)


@torch._dynamo.config.patch(recompile_limit=2)
def test_torch_compiles_entries_do_not_use_up_tripwires_budget():
    def g(x, mode):
        return x + 1 if mode == "a" else x - 1

    tc = torch.compile(g, backend="eager")
    for mode in "abc":  # torch's route: two entries, then its limit
        tc(torch.ones(2), mode)
    counters.clear()
    cw = twt.compile(g, backend="eager")
    assert torch.equal(cw(torch.ones(2), "a"), torch.full((2,), 2.0))
    assert graphs() == 1  # tripwire's caches are its own: its first compile is a first compile


def test_a_refusal_by_the_recompile_limit_keyword_warns():
    # torch.compile's recompile_limit keyword is re-applied by Dynamo inside its callback, and
    # counts torch's own entries of the code: tripwire's compile is refused, loudly, not silently.
    def g(x, mode):
        return x + 1 if mode == "a" else x - 1

    tc = torch.compile(g, backend="eager", recompile_limit=2)
    for mode in "abc":
        tc(torch.ones(2), mode)
    cw = twt.compile(g, backend="eager", recompile_limit=2)
    with pytest.warns(RuntimeWarning, match="Dynamo refused to compile"):
        assert torch.equal(cw(torch.ones(2), "a"), torch.full((2,), 2.0))


def _break_then_generator(x):
    s = x.abs().mean()
    if s.item() > 0.0:  # graph break: the rest runs in a resume function
        x = x + 1
    return sum(torch.sin(x * i) for i in range(3))  # the generator closes over x


def test_resume_function_with_a_name_both_local_and_free_hits():
    x = torch.randn(3, 6)
    expected = torch.compile(_break_then_generator, backend="eager")(x)
    torch._dynamo.reset()
    counters.clear()
    cw = twt.compile(_break_then_generator, backend="eager")
    assert torch.equal(cw(x), expected)
    first = graphs()
    for _ in range(3):
        assert torch.equal(cw(x), expected)
    assert graphs() == first  # hits, as torch.compile's do


def test_recompile_reasons_in_torch_and_tripwire_logs():
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = _compile._TORCH_RECOMPILES
    handler = Keep()
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:

        def f(x):
            return x * 2

        cf = twt.compile(f, backend="eager")
        cf(torch.ones(3))
        cf(torch.ones(3, dtype=torch.float64))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    assert len(records) == 1
    assert records[0].startswith("Recompiling function f in ")
    assert "triggered by the following guard failure(s)" in records[0] and "L['x']" in records[0]


def test_reset_clears_entries():
    def f(x):
        return x + 1

    cf = twt.compile(f, backend="eager")
    cf(torch.ones(2))
    cache = twf.cache_of(f, backend_of(cf))
    assert cache is not None and len(cache) == 1
    twt.reset()
    assert len(cache) == 0
    cf(torch.ones(2))
    assert len(cache) == 1
    torch._dynamo.reset()
    assert len(cache) == 0
    torch.compiler.reset()
    assert torch.equal(cf(torch.ones(2)), torch.full((2,), 2.0))


def test_nesting_with_torch_compile_both_ways():
    def inner(x):
        return x.sin() + 1

    def outer_ours(x):
        return t_inner(x) * 2

    t_inner = torch.compile(inner, backend="eager")
    c_outer = twt.compile(outer_ours, backend="eager")
    expect = (torch.ones(3).sin() + 1) * 2
    assert torch.equal(c_outer(torch.ones(3)), expect)

    tw_inner = twt.compile(inner, backend="eager")

    def outer_torch(x):
        return tw_inner(x) * 2

    t_outer = torch.compile(outer_torch, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # falls back without a warning: torch's hook is in use
        assert torch.equal(t_outer(torch.ones(3)), expect)
        assert torch.equal(t_outer(torch.ones(3)), expect)


def test_threads():
    def f(x, k):
        return x * k + 1

    cf = twt.compile(f, backend="eager")
    errors: list[BaseException] = []

    def run(i):
        try:
            for j in range(15):
                x = torch.full((4,), float(i))
                assert torch.equal(cf(x, j % 3), f(x, j % 3))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_guards_of_a_manager_in_no_cache_entry():
    def f(x):
        return x * 2

    torch.compile(f, backend="eager")(torch.ones(3))
    entry = torch._dynamo.eval_frame._debug_get_cache_entry_list(f.__code__)[0]
    gs = twt.guards_of(entry.guard_manager)
    assert gs.check({"x": torch.ones(3)})
    assert not gs.check({"x": torch.ones(3, dtype=torch.float64)})
    with pytest.raises(twt.TorchImportError):
        twt.guards_of(entry.guard_manager, entry=1)


def test_unimportable_guards_are_decided_by_torchs_manager(monkeypatch):
    import tripwire.torch._guards_of as package

    def refuse(obj, **kw):
        raise twt.GuardsNotImportable("refused for the test", ())

    monkeypatch.setattr(package, "guards_of", refuse)

    def f(x):
        return x - 1

    cf = twt.compile(f, backend="eager")
    for dtype in (torch.float32, torch.float32, torch.float64):
        x = torch.ones(2, dtype=dtype)
        assert torch.equal(cf(x), x - 1)
    cache = twf.cache_of(f, backend_of(cf))
    assert len(cache) == 2  # torch's own manager told float32 from float64
    assert "torch's guard manager" in cache.entries[0].guards.explain()


def test_version_gate_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setattr(_compile, "VERIFIED_TORCH", ("0.0.",))
    monkeypatch.setattr(_compile, "_warned", set())

    def f(x):
        return x + 2

    with pytest.warns(RuntimeWarning, match="verified on torch 0.0.x"):
        cf = twt.compile(f, backend="eager")
    assert not hasattr(cf, "_tripwire_compiled")  # torch.compile's own wrapper
    assert torch.equal(cf(torch.ones(1)), torch.full((1,), 3.0))


def test_unsupported_features_fall_back(monkeypatch):
    monkeypatch.setattr(torch._dynamo.compiled_autograd, "compiled_autograd_enabled", True)
    monkeypatch.setattr(_compile, "_warned", set())
    with pytest.warns(RuntimeWarning, match="compiled autograd"):
        cf = twt.compile(lambda x: x + 1, backend="eager")
    assert not hasattr(cf, "_tripwire_compiled")


def test_without_the_torch_adapter_it_is_torch_compile_with_one_warning():
    # A subprocess: the adapter, once installed, stays for the process.
    code = textwrap.dedent(
        """
        import warnings, torch, tripwire.torch as twt
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            cf = twt.compile(lambda x: x + 1, backend="eager")
            twt.compile(lambda x: x + 2, backend="eager")
        assert not hasattr(cf, "_tripwire_compiled"), cf
        assert torch.equal(cf(torch.ones(1)), torch.full((1,), 2.0))
        mine = [str(x.message) for x in w if "needs the torch adapter" in str(x.message)]
        assert len(mine) == 1, [str(x.message) for x in w]
        print("ok")
        """
    )
    env = {**os.environ, "TRIPWIRE_TORCH_ADAPTER": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_torch_hook_left_by_a_torch_error_is_not_silent():
    # A subprocess: torch 2.13 leaves its frame hook installed for the rest of the process.
    code = textwrap.dedent(
        """
        import warnings, torch, tripwire.torch as twt, tripwire.frame as twf
        def h(x):
            torch._dynamo.graph_break()
            return x + 1
        try:
            torch.compile(h, backend="eager", fullgraph=True)(torch.ones(2))
        except Exception:
            pass
        left = twf.status()["eval_frame"]
        def q(x):
            return x * 3
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            cq = twt.compile(q, backend="eager")
            out = cq(torch.ones(2))
            cq(torch.ones(2))
        n = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        print(left, out.tolist(), n, sum("another frame hook" in str(x.message) for x in w))
        """
    )
    import os

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    left, values, n, warned = out.stdout.split(" ", 1)[0], *out.stdout.strip().split(" ", 1)[1].rsplit(" ", 2)
    assert values == "[3.0, 3.0]"
    # torch 2.13 leaves its hook installed: the calls then go through torch.compile (one graph,
    # compiled, not eager) and one warning says so.
    assert (left, n, warned) == ("foreign", "1", "1")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # inductor's import (torch.jit)
def test_backends_aot_eager_inductor_and_a_callable():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4)
    ca = twt.compile(m, backend="aot_eager")
    assert torch.equal(ca(x), torch.compile(m, backend="aot_eager")(x))
    ci = twt.compile(m, backend="inductor")
    assert torch.allclose(ci(x), torch.compile(m, backend="inductor")(x), rtol=1e-5, atol=1e-6)
    assert torch.allclose(ci(x), m(x), rtol=1e-4, atol=1e-5)
    seen = []

    def mine(gm, example_inputs):
        seen.append(len(example_inputs))
        return gm.forward

    cu = twt.compile(lambda t: (t + 1).relu(), backend=mine)
    assert torch.equal(cu(torch.ones(4)), torch.full((4,), 2.0))
    assert seen == [1]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # inductor's import (torch.jit), when first here
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_real_models_match_torch_compile(backend):
    """The bench's models through both routes, a few calls each with a shape change."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3] / "bench"))
    try:
        import torch_compile as bench
    finally:
        sys.path.pop(0)
    for name, make in bench.MODELS.items():
        torch.manual_seed(0)
        model, inputs = make()
        ours = twt.compile(model, backend=backend)
        theirs = torch.compile(model, backend=backend)
        for args in inputs:
            a, b = ours(*args), theirs(*args)
            if backend == "inductor":
                assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), name
            else:
                assert torch.equal(a, b), name
        torch._dynamo.reset()


def test_guards_that_cannot_be_served_run_the_frame_uncompiled_with_one_warning(monkeypatch):
    import tripwire.builder
    import tripwire.torch._guards_of as package

    def refuse(obj, **kw):
        raise twt.GuardsNotImportable("refused for the test", ())

    def no_build(self, **kw):
        raise RuntimeError("no guard set for the test")

    monkeypatch.setattr(package, "guards_of", refuse)
    monkeypatch.setattr(tripwire.builder.GuardBuilder, "build", no_build)
    monkeypatch.setattr(_compile, "_warned", set())
    counter = Counter()

    def f(x):
        counter.bump(1)
        return x * 3

    cf = twt.compile(f, backend="eager")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(3):
            assert torch.equal(cf(torch.ones(2)), torch.full((2,), 3.0))
    assert counter.log == [1, 1, 1]  # each call ran its frame once, uncompiled where it had to
    assert sum("cannot be served" in str(x.message) for x in w) >= 1
    assert len({str(x.message) for x in w if "cannot be served" in str(x.message)}) == len(
        [x for x in w if "cannot be served" in str(x.message)]
    )  # once per code


@pytest.mark.filterwarnings("ignore::UserWarning")  # Dynamo's own, tracing p.grad (torch.compile too)
def test_a_training_step_never_fails_halfway_on_an_import(monkeypatch):
    """The failure to rule out: backward ran (in the first frame), the update is in a resume
    function whose guards cannot be served. The step completes, uncompiled where it had to."""
    import tripwire.torch._guards_of as package

    real = package.guards_of

    def refuse_resumes(obj, **kw):
        if "resume" in obj.code.co_name:
            raise twt.GuardsNotImportable("refused for the test", ())
        return real(obj, **kw)

    monkeypatch.setattr(package, "guards_of", refuse_resumes)
    monkeypatch.setattr(_compile, "_warned", set())
    torch.manual_seed(0)
    ours = torch.nn.Linear(3, 1)
    ref = copy.deepcopy(ours)

    def step(model, x):
        loss = model(x).pow(2).sum()
        loss.backward()
        torch._dynamo.graph_break()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
                p.grad = None
        return loss.detach()

    cstep = twt.compile(step, backend="eager")
    tstep = torch.compile(step, backend="eager")  # (it differs from eager from the second step on)
    for _ in range(3):
        x = torch.randn(4, 3)
        a = cstep(ours, x)
        b = tstep(ref, x)
        assert torch.equal(a, b)
        for p, q in zip(ours.parameters(), ref.parameters(), strict=True):
            assert torch.equal(p, q)
    c = compiled_of(cstep)
    resumes = [code for code in c.codes if "resume" in code.co_name]
    assert resumes
    for code in resumes:  # served, with torch's own guard manager deciding
        assert "torch's guard manager" in twf.cache_of(code, c.caches).entries[0].guards.explain()

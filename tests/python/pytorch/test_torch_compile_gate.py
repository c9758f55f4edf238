"""The compiled module's per-call gate (``OptimizedModule.__call__``, the torch adapter's
``ModuleCall``): each call that torch's nn.Module machinery would apply something to (a hook, a
replaced ``forward`` or ``__dict__``, ``_compiled_call_impl``, a JIT trace) goes down torch's route,
every other call enters the compiled scope directly. Outputs and side-effect counters are compared
with torch.compile's on the same changes, and torch's route is counted (docs/compile.md)."""

from __future__ import annotations

import copy
import gc
import inspect
import sys
import threading
import warnings
import weakref

import pytest

torch = pytest.importorskip("torch")

import tripwire.torch as twt  # noqa: E402
from tripwire import frame as twf  # noqa: E402
from tripwire.torch import _compile  # noqa: E402

ef = torch._dynamo.eval_frame
modhooks = torch.nn.modules.module


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    assert twf.current() is None
    assert twf.status()["eval_frame"] == "default"
    assert ef._in_optimized_module is False


@pytest.fixture
def routes(monkeypatch):
    """The modules whose call went down torch's route (torch's OptimizedModule.__call__, which
    the gate reaches through super() as the Python method did)."""
    seen: list = []
    torch_call = ef.OptimizedModule.__call__

    def counted(self, *args, **kwargs):
        seen.append(self)
        return torch_call(self, *args, **kwargs)

    monkeypatch.setattr(ef.OptimizedModule, "__call__", counted)
    return seen


def gate():
    return _compile.OptimizedModule.__dict__["__call__"]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.calls = 0
        self.bump = torch.compiler.disable(self._bump)  # runs each time forward's frame runs

    def _bump(self):
        self.calls += 1

    def forward(self, x):
        self.bump()
        return self.lin(x).relu() * 2


def pair():
    """The same module compiled both ways (one module: both routes see each change)."""
    torch.manual_seed(0)
    m = Net()
    return m, twt.compile(m, backend="eager"), torch.compile(m, backend="eager")


def both(cm, tm, m, x):
    """One call of each route: outputs equal, forward ran once per call in each."""
    before = m.calls
    a = cm(x)
    mid = m.calls
    b = tm(x)
    assert torch.equal(a, b)
    assert mid - before == 1 and m.calls - mid == 1
    return a


def test_a_hit_is_the_gate_with_no_python_frame_of_tripwire(routes):
    m, cm, tm = pair()
    x = torch.randn(2, 4)
    both(cm, tm, m, x)
    assert type(type(cm).__dict__["__call__"]).__name__ == "ModuleCall"
    assert gate().route(cm) == "direct"
    frames: list = []

    def profile(frame, event, arg):
        if event == "call":
            frames.append((frame.f_code.co_filename, frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        out = cm(x)
    finally:
        sys.setprofile(None)
    assert torch.equal(out, m(x))
    assert routes.count(cm) == 0
    names = {name for _, name in frames}
    assert not names & {"__call__", "_wrapped_call_impl", "_call_impl"}, names
    # Only the replacement of the disabled bump's DisableContext._fn frame (torch runs its own).
    assert [n for f, n in frames if f.endswith("_compile.py")] == ["_fn"]


@pytest.mark.parametrize("on", ["module", "wrapper"])
def test_a_hook_registered_inside_forward_applies_from_the_next_call(routes, on):
    for compiled in (twt.compile, torch.compile):
        torch.manual_seed(0)
        m = Net()
        fired = []
        target = []  # the module the hook goes on: the original, or the compiled wrapper

        def register(fired=fired, target=target):
            if not target[0]._forward_hooks:
                target[0].register_forward_hook(lambda mod, args, out: fired.append(1) or out + 1)

        m.bump = torch.compiler.disable(lambda m=m, register=register: (m._bump(), register()))
        cm = compiled(m, backend="eager")
        target.append(m if on == "module" else cm)
        x = torch.randn(2, 4)
        with torch.no_grad():
            first = cm(x)
            second = cm(x)
            third = cm(x)
        assert fired == [1, 1], compiled  # the hook registered by the first call ran on the next two
        assert torch.equal(second, first + 1) and torch.equal(third, second)
        assert m.calls == 3
        if compiled is twt.compile:
            if on == "module":  # the wrapper has no hook: its scope, whose orig.__call__ runs it
                assert routes.count(cm) == 0 and gate().route(cm) == "scope"
            else:
                assert routes.count(cm) == 2 and gate().route(cm) == "torch"


def test_a_global_hook_added_and_removed(routes):
    m, cm, tm = pair()
    x = torch.randn(2, 4)
    both(cm, tm, m, x)
    fired = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.compile warns about global hooks
        for register in (
            modhooks.register_module_forward_pre_hook,
            modhooks.register_module_forward_hook,
        ):
            handle = register(lambda *a: fired.append(a[0]) and None)
            try:
                assert gate().route(cm) == "torch"
                n = len(routes)
                with torch.no_grad():
                    a, b = cm(x), tm(x)
                assert torch.equal(a, b)
                assert routes[n:].count(cm) == 1
                assert fired.count(cm) == 1 and fired.count(tm) == 1 and fired.count(m) == 2
                fired.clear()
            finally:
                handle.remove()
    assert gate().route(cm) == "direct"
    n = len(routes)
    both(cm, tm, m, x)
    assert routes[n:].count(cm) == 0 and not fired


def test_global_hook_dicts_rebound_or_not_dicts_take_torchs_route(routes, monkeypatch):
    m, cm, tm = pair()
    x = torch.randn(2, 4)
    both(cm, tm, m, x)
    # Read by name on every call: a dict rebound (torch does not, today) is the one read.
    fired = []
    rebound = type(modhooks._global_forward_hooks)({0: lambda mod, a, out: fired.append(mod)})
    monkeypatch.setattr(modhooks, "_global_forward_hooks", rebound)
    assert gate().route(cm) == "torch"
    monkeypatch.undo()
    assert gate().route(cm) == "direct"

    class Lying(dict):
        def __len__(self):
            return 1

    for value in (None, [], Lying()):
        monkeypatch.setattr(modhooks, "_global_backward_hooks", value)
        assert gate().route(cm) == "torch", value
        monkeypatch.undo()
    monkeypatch.delattr(modhooks, "_global_forward_pre_hooks")
    assert gate().route(cm) == "torch"
    monkeypatch.undo()
    assert gate().route(cm) == "direct"


def test_hook_values_that_are_not_dicts_are_not_guessed(routes):
    m, cm, tm = pair()
    x = torch.randn(2, 4)
    both(cm, tm, m, x)

    class Lying(type(m._forward_hooks)):
        def __len__(self):
            return 1

    for owner in (cm, m):
        for value in (None, Lying(), {}):
            saved = owner.__dict__["_backward_hooks"]
            owner.__dict__["_backward_hooks"] = value
            try:
                assert gate().route(cm) == ("direct" if type(value) is dict else "torch"), (owner, value)
                if type(value) is dict:
                    n = len(routes)
                    both(cm, tm, m, x)
                    assert routes[n:].count(cm) == 0
            finally:
                owner.__dict__["_backward_hooks"] = saved
        del owner.__dict__["_forward_pre_hooks"]
        try:
            assert gate().route(cm) == "torch"
        finally:
            owner.__dict__["_forward_pre_hooks"] = type(m._forward_hooks)()
    assert gate().route(cm) == "direct"


def test_forward_replaced_on_the_wrapper_on_the_module_and_on_its_class(routes):
    m, cm, tm = pair()
    x = torch.randn(2, 4)
    both(cm, tm, m, x)
    scope = cm.__dict__["forward"]
    # On the wrapper (OptimizedModule.__setattr__ keeps "forward" on it): torch's route calls it.
    cm.forward = lambda x: x - 1
    try:
        assert gate().route(cm) == "torch"
        n = len(routes)
        assert torch.equal(cm(x), x - 1)
        assert routes[n:].count(cm) == 1
    finally:
        cm.forward = scope
    assert gate().route(cm) == "direct"
    # On the original module's instance: the wrapper's scope, whose orig.__call__ reads it.
    m.forward = lambda x: x + 7
    try:
        assert gate().route(cm) == "scope"
        assert torch.equal(cm(x), x + 7) and torch.equal(tm(x), x + 7)
    finally:
        del m.forward
    assert gate().route(cm) == "direct"
    both(cm, tm, m, x)
    # On the original module's class.
    plain = Net.forward
    Net.forward = lambda self, x: self.lin(x) - 3
    try:
        assert gate().route(cm) == "scope"
        assert torch.equal(cm(x), m.lin(x) - 3) and torch.equal(tm(x), cm(x))
    finally:
        Net.forward = plain
    assert gate().route(cm) == "direct"
    both(cm, tm, m, x)
    assert routes.count(cm) == 1


def test_compiled_call_impl_on_the_module_and_on_the_wrapper(routes):
    m, cm, tm = pair()
    x = torch.randn(2, 4)
    both(cm, tm, m, x)
    m._compiled_call_impl = lambda *a: torch.ones(1)
    try:
        assert gate().route(cm) == "scope"
        assert torch.equal(cm(x), torch.ones(1)) and torch.equal(tm(x), torch.ones(1))
    finally:
        m._compiled_call_impl = None
    # The wrapper's own (set around OptimizedModule.__setattr__, which sends it to the module):
    # torch's route calls it.
    object.__setattr__(cm, "_compiled_call_impl", lambda *a: torch.zeros(1))
    try:
        assert gate().route(cm) == "torch"
        assert torch.equal(cm(x), torch.zeros(1))
    finally:
        object.__setattr__(cm, "_compiled_call_impl", None)
    assert gate().route(cm) == "direct"
    both(cm, tm, m, x)


def test_jit_trace_over_the_compiled_module(routes):
    # Neither route can be traced: both refuse with torch.compile's RuntimeError (tripwire's scope
    # sends a call made while a trace is in progress to torch.compile's wrapper). The gate takes
    # torch's route for it.
    m, cm, tm = pair()
    x = torch.randn(2, 4)
    both(cm, tm, m, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for compiled in (tm, cm):
            n = len(routes)
            with pytest.raises(RuntimeError, match=r"using FX to torch\.jit\.trace a dynamo-optimized"):
                torch.jit.trace(compiled, x, check_trace=False)
            assert routes[n:].count(compiled) == 1
    assert torch._C._get_tracing_state() is None
    assert gate().route(cm) == "direct"
    both(cm, tm, m, x)


def test_dict_replaced_wholesale_on_the_wrapper_and_on_the_module(routes):
    m, cm, tm = pair()
    x = torch.randn(2, 4)
    both(cm, tm, m, x)
    old = cm.__dict__
    fresh = dict(old)  # the same items, _tripwire_fast included: its state names the old dict
    object.__setattr__(cm, "__dict__", fresh)
    assert gate().route(cm) == "torch"
    fresh["_forward_hooks"] = type(m._forward_hooks)({0: lambda mod, a, out: out * 0})
    n = len(routes)
    with torch.no_grad():
        assert torch.equal(cm(x), torch.zeros(2, 4))
    assert routes[n:].count(cm) == 1
    object.__setattr__(cm, "__dict__", old)
    assert gate().route(cm) == "direct"
    # The module's: the scope (orig.__call__ reads the new dict's hooks).
    mold = m.__dict__
    mfresh = dict(mold)
    object.__setattr__(m, "__dict__", mfresh)
    try:
        assert gate().route(cm) == "scope"
        mfresh["_forward_hooks"] = type(m._forward_hooks)({0: lambda mod, a, out: out + 5})
        with torch.no_grad():
            assert torch.equal(cm(x), tm(x))
            assert torch.equal(cm(x), m.lin(x).relu() * 2 + 5)
    finally:
        object.__setattr__(m, "__dict__", mold)
    assert gate().route(cm) == "direct"
    both(cm, tm, m, x)
    # A forged state is not read.
    cm.__dict__["_tripwire_fast"] = (cm.__dict__, None, None, None, None, None)
    assert gate().route(cm) == "torch"
    with torch.no_grad():
        assert torch.equal(cm(x), tm(x))


def test_exceptions_inside_forward_restore_the_flag_on_every_route(routes):
    flags = []

    class Boom(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.probe = torch.compiler.disable(lambda: flags.append(ef._is_in_optimized_module()))

        def forward(self, x):
            self.probe()
            if x.sum() > 100:
                raise ValueError("big")
            return x + 1

    b = Boom()
    cm = twt.compile(b, backend="eager")
    ok, big = torch.ones(2), torch.full((2,), 100.0)
    for _ in range(2):
        assert torch.equal(cm(ok), ok + 1)
    for route in ("direct", "scope", "torch"):
        undo = []
        if route == "scope":
            b.forward = Boom.forward.__get__(b)
            undo.append(lambda: b.__dict__.pop("forward"))
        if route == "torch":
            h = cm.register_forward_pre_hook(lambda mod, a: None)
            undo.append(h.remove)
        try:
            assert gate().route(cm) == route
            flags.clear()
            with pytest.raises(ValueError, match="big"):
                cm(big)
            assert flags == [True] and ef._in_optimized_module is False
            assert torch.equal(cm(ok), ok + 1) and ef._in_optimized_module is False
        finally:
            for u in undo:
                u()


def test_a_module_whose_last_reference_goes_during_its_call(routes):
    torch.manual_seed(0)
    m = Net()
    holder = [twt.compile(m, backend="eager")]
    x = torch.randn(2, 4)
    expected = m.lin(x).relu() * 2
    assert torch.equal(holder[0](x), expected)
    dead = weakref.ref(holder[0])

    def drop():
        m._bump()
        holder.clear()
        gc.collect()

    m.bump = torch.compiler.disable(drop)
    assert torch.equal(holder[0](x), expected)  # the call's own reference keeps it to the end
    assert not holder and ef._in_optimized_module is False
    gc.collect()
    assert dead() is None  # the state's cycle (the wrapper's dict holds it, it holds the dict) goes
    assert routes == []


# Dynamo reads .grad of forward's (non-leaf) result as it traces the resume function of a
# module's own __call__ or _call_impl after the disabled bump's graph break, on both routes:
# torch's warning, not the tests' subject.
resume_reads_grad = pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")


@resume_reads_grad
def test_a_class_with_its_own_call_runs_it_on_every_route():
    # A module class that overrides __call__ (here: scales forward's result) is called through
    # that __call__ by torch.compile's OptimizedModule; the gate never enters forward directly
    # for it. Before and after a hook, and on the subclass of a subclass.
    class Scaled(Net):
        def __call__(self, x, scale=3.0):
            return super().__call__(x) * scale

    class Deeper(Scaled):
        pass

    for cls in (Scaled, Deeper):
        torch.manual_seed(0)
        m = cls()
        cm, tm = twt.compile(m, backend="eager"), torch.compile(m, backend="eager")
        x = torch.randn(2, 4)
        assert gate().route(cm) != "direct"
        for _ in range(2):
            out = both(cm, tm, m, x)
            assert torch.equal(out, m.lin(x).relu() * 2 * 3.0)
        handle = m.register_forward_hook(lambda mod, args, result: result + 1)
        out = both(cm, tm, m, x)
        assert torch.equal(out, (m.lin(x).relu() * 2 + 1) * 3.0)
        handle.remove()


class OwnCallImpl(Net):
    """A module class with its own _call_impl (nn.Module.__call__ calls self._call_impl)."""

    def _call_impl(self, *args, **kwargs):
        return super()._call_impl(*args, **kwargs) - 5


@resume_reads_grad
@pytest.mark.parametrize("patched", ["__call__", "_call_impl", "subclass"])
def test_nn_module_machinery_patched_or_overridden_applies_as_under_torch_compile(
    routes, monkeypatch, patched
):
    # Profilers and tracers patch nn.Module.__call__ or _call_impl; a module class may override
    # _call_impl. torch.compile's route runs them (its super().__call__ and self._call_impl are
    # looked up at each call): the gate never skips them, before or after the first call.
    torch.manual_seed(0)
    m = OwnCallImpl() if patched == "subclass" else Net()
    cm, tm = twt.compile(m, backend="eager"), torch.compile(m, backend="eager")
    x = torch.randn(2, 4)
    expect = m.lin(x).relu() * 2
    if patched == "subclass":
        for _ in range(2):
            assert torch.equal(both(cm, tm, m, x), expect - 5)
        assert gate().route(cm) != "direct"
        return
    both(cm, tm, m, x)
    assert gate().route(cm) == "direct"
    seen: list = []
    original = torch.nn.Module.__dict__[patched]

    def spy(self, *args, **kwargs):
        seen.append(type(self).__name__)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, patched, spy)
    assert not _compile._module_machinery_is_torchs()  # a gate made now would not be installed
    assert gate().route(cm) == "torch"
    seen.clear()
    assert torch.equal(cm(x), expect)
    ours = list(seen)
    seen.clear()
    assert torch.equal(tm(x), expect)
    assert ours == seen and "OptimizedModule" in seen, (ours, seen)
    monkeypatch.undo()
    assert _compile._module_machinery_is_torchs()
    assert gate().route(cm) == "direct"


def test_call_reassigned_on_the_class_during_a_call():
    m, cm, tm = pair()
    x = torch.randn(2, 4)
    both(cm, tm, m, x)
    held = gate()
    baseline = sys.getrefcount(held)

    def swap():
        m._bump()
        if "__call__" in _compile.OptimizedModule.__dict__:
            del _compile.OptimizedModule.__call__  # the gate's last class reference
            gc.collect()

    m.bump = torch.compiler.disable(swap)
    try:
        assert torch.equal(cm(x), m.lin(x).relu() * 2)
        # Without a gate, the class inherits torch's __call__.
        assert "__call__" not in _compile.OptimizedModule.__dict__
        assert torch.equal(cm(x), tm(x))
    finally:
        _compile.OptimizedModule.__call__ = held
    assert sys.getrefcount(held) == baseline  # the call's own reference was given back
    m.bump = torch.compiler.disable(m._bump)
    both(cm, tm, m, x)


def test_threads_calling_one_compiled_module(routes):
    m, cm, tm = pair()
    x = torch.randn(2, 4)
    expected = both(cm, tm, m, x)
    errors: list = []
    start = threading.Barrier(4)

    def run():
        try:
            start.wait()
            for _ in range(50):
                if not torch.equal(cm(x), expected):
                    errors.append("mismatch")
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # torch's own flag is a process global set and restored per call (as torch's __call__ does):
    # calls overlapping on threads may restore each other's value.
    ef._in_optimized_module = False
    assert not errors
    assert m.calls == 2 + 200 and routes.count(cm) == 0


def test_reentrant_calls_a_compiled_module_calling_another_and_itself():
    # (No route counter: Dynamo inlines torch's OptimizedModule.__call__, not a patched one.)
    for compiled in (twt.compile, torch.compile):
        torch.manual_seed(0)
        inner = Net()
        cinner = compiled(inner, backend="eager")

        class Outer(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(4, 4)

            def forward(self, x, n: int):
                y = cinner(self.lin(x))  # another compiled module
                if n > 0:
                    y = y + self_ref[0](x, n - 1)  # itself, recursively
                return y

        torch.manual_seed(1)
        outer = Outer()
        self_ref = [None]
        couter = compiled(outer, backend="eager")
        self_ref[0] = couter
        x = torch.randn(2, 4)
        with torch.no_grad():
            out = [couter(x, 2) for _ in range(3)]
            self_ref[0] = outer
            eager = outer(x, 2)
        assert all(torch.allclose(o, eager) for o in out), compiled
        assert inner.calls == 3 * 3 + 3, compiled  # three levels per call, then eager's
        assert ef._in_optimized_module is False
        if compiled is twt.compile:
            assert gate().route(couter) == "direct" and gate().route(cinner) == "direct"


def test_the_gate_as_a_method():
    m, cm, tm = pair()
    x = torch.randn(2, 4)
    both(cm, tm, m, x)
    g = gate()
    assert type(cm).__call__ is g
    assert torch.equal(type(cm).__call__(cm, x), m(x))
    assert torch.equal(cm.__call__(x), m(x))
    assert str(inspect.signature(cm)) == "(*args, **kwargs)"
    with pytest.raises(TypeError):
        type(cm).__call__()
    with pytest.raises(TypeError):  # super(OptimizedModule, obj): not an instance
        type(cm).__call__(object(), x)
    assert g.route(object()) == "torch"
    # A copy (torch's __reduce__ builds it anew): its own state, over its own dict and module.
    twin = copy.deepcopy(cm)
    assert twin.__dict__["_tripwire_fast"] is not cm.__dict__["_tripwire_fast"]
    assert g.route(twin) == "direct" and torch.equal(twin(x), cm(x))
    # Keyword arguments and more positional ones than a small stack, on the direct route.

    class Many(torch.nn.Module):
        def forward(self, *xs, scale=1.0):
            return sum(xs) * scale

    many = Many()
    cmany, tmany = twt.compile(many, backend="eager"), torch.compile(many, backend="eager")
    xs = [torch.full((2,), float(i)) for i in range(12)]
    for _ in range(2):
        assert torch.equal(cmany(*xs, scale=2.0), tmany(*xs, scale=2.0))
        assert torch.equal(cmany(*xs[:3]), tmany(*xs[:3]))
    assert g.route(cmany) == "direct"


def test_a_key_whose_eq_runs_inside_the_gates_reads(routes):
    # Any dict key of a colliding hash makes a lookup call its __eq__: user code inside the gate's
    # reads, which here adds a hook, drops the gate's state from the dict and collects.
    m, cm, tm = pair()
    x = torch.randn(2, 4)
    both(cm, tm, m, x)
    seen = []

    class Collides:
        def __hash__(self):
            return hash("_forward_hooks")

        def __eq__(self, other):
            seen.append(other)
            if len(seen) == 1:
                cm.__dict__["_forward_hooks"] = type(m._forward_hooks)({0: lambda mod, a, out: out + 1})
                cm.__dict__.pop("_tripwire_fast")
                gc.collect()
            return False

    key = Collides()
    cm.__dict__[key] = 1
    with torch.no_grad():
        out = cm(x)  # the lookup restarts on the mutated dict: the hook is found, torch's route
        assert torch.equal(out, m(x) + 1) and routes.count(cm) == 1
        assert seen and gate().route(cm) == "torch"  # no state any more: torch's route for good
        del cm.__dict__[key]
        cm.__dict__["_forward_hooks"] = type(m._forward_hooks)()
        assert torch.equal(cm(x), tm(x)) and routes.count(cm) == 2
    assert ef._in_optimized_module is False

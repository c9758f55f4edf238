"""GLOBAL_STATE torch_saved_tensors_hooks: tripwire's probe for Dynamo's AUTOGRAD_SAVED_TENSORS_HOOKS
lambda decides as torch's own leaf (imported with guards_of from a compiled function), through the
adapter and through the Python reader, under every hooks state a user can set up: none, plain
hooks, GraphModule hooks (also swapped, subclassed, half of a pair), hooks whose __class__ lies,
nested and disabled hooks, other threads, hooks pushed from inside a check.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import reference
import tripwire as tw
from engine_switches import python_readers
from tripwire import _core

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from torch._dynamo.eval_frame import _debug_get_cache_entry_list  # noqa: E402

from tripwire.torch import guards_of  # noqa: E402

tw.tensors.ensure_torch()
ADAPTER = _core.torch_adapter_installed()
PROBE = "torch_saved_tensors_hooks"


def _identity(x: Any) -> Any:
    return x


GM1 = torch.fx.symbolic_trace(_identity)
GM2 = torch.fx.symbolic_trace(_identity)


class SubGraphModule(torch.fx.GraphModule):
    pass


SUB1 = SubGraphModule(GM1, GM1.graph)
SUB2 = SubGraphModule(GM2, GM2.graph)


class LyingClass:
    """A hook whose __class__ claims GraphModule: isinstance() believes it (torch's guard too)."""

    reads = 0

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        LyingClass.reads += 1
        return torch.fx.GraphModule

    def __call__(self, x: Any) -> Any:
        return x


LIAR1, LIAR2 = LyingClass(), LyingClass()


def hooks(pack: Any, unpack: Any) -> Callable[[], Any]:
    return lambda: torch.autograd.graph.saved_tensors_hooks(pack, unpack)


@contextlib.contextmanager
def nested(*ctxs: Callable[[], Any]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for c in ctxs:
            stack.enter_context(c())
        yield


STATES: dict[str, Callable[[], Any]] = {
    "none": contextlib.nullcontext,
    "plain": hooks(_identity, _identity),
    "gm": hooks(GM1, GM2),
    "gm_swapped": hooks(GM2, GM1),
    "gm_subclass": hooks(SUB1, SUB2),
    "gm_pack_only": hooks(GM1, _identity),
    "gm_unpack_only": hooks(_identity, GM2),
    "liar": hooks(LIAR1, LIAR2),
    "plain_over_gm": lambda: nested(hooks(GM1, GM2), hooks(_identity, _identity)),
    "gm_over_plain": lambda: nested(hooks(_identity, _identity), hooks(GM1, GM2)),
    "disabled": lambda: torch.autograd.graph.disable_saved_tensors_hooks("tripwire test"),
}
# Where torch.compile runs (Dynamo refuses to trace under some of the others).
BUILD_STATES = ("none", "plain", "gm", "gm_subclass", "disabled")


def f(x: Any) -> Any:
    return x * 2 + 1


def compiled_in(state: str) -> tuple[Any, list[tw.GuardSet]]:
    """torch's guard manager for f compiled under `state`, and guards_of(f) through the adapter and
    through the Python reader."""
    torch._dynamo.reset()
    with STATES[state]():
        torch.compile(f, backend="eager", dynamic=False)(torch.randn(3))
        (entry,) = _debug_get_cache_entry_list(f.__code__)
        sets = []
        for python in (False, True):
            with python_readers(python):
                sets.append(guards_of(f))
    return entry.guard_manager, sets


@pytest.fixture(scope="module", params=BUILD_STATES)
def compiled(request: pytest.FixtureRequest) -> tuple[str, Any, list[tw.GuardSet]]:
    mgr, sets = compiled_in(request.param)
    return request.param, mgr, sets


def test_the_lambda_is_imported_as_the_probe(compiled: tuple[str, Any, list[tw.GuardSet]]) -> None:
    state, _, sets = compiled
    for gs in sets:
        probes = [s for s in gs.guards if s.kind is tw.GuardKind.GLOBAL_STATE and s.args[0] == PROBE]
        assert len(probes) == 1
        assert not any(s.kind is tw.GuardKind.LAMBDA for s in gs.guards)
        snapshot = probes[0].args[1]
        want = {"gm": (id(GM1), id(GM2)), "gm_subclass": (id(SUB1), id(SUB2))}.get(state)
        assert snapshot == want
    native, python = sets
    assert ("[torch adapter]" in native.explain()) == ADAPTER
    assert "[python reader" in python.explain()


@pytest.mark.parametrize("check_in", sorted(STATES))
def test_decides_as_torch(compiled: tuple[str, Any, list[tw.GuardSet]], check_in: str) -> None:
    build_in, mgr, sets = compiled
    L = {"x": torch.randn(3)}
    with STATES[check_in]():
        want = mgr.check(L)
        for i, gs in enumerate(sets):
            assert gs.check(L) == want, (build_in, check_in, ("adapter", "python")[i])
            assert reference.check(gs.guards, L) == want
            if not want:
                fail = gs.why_not(L)
                assert fail is not None and fail.kind == "GLOBAL_STATE"
                assert "torch_saved_tensors_hooks" in fail.reason and ", got " in fail.reason
    # Back outside: the build state's verdict again.
    with STATES[build_in]():
        assert all(gs.check(L) for gs in sets) and mgr.check(L)


def test_engine_reference_and_torch_read_the_same_value() -> None:
    for name, ctx in STATES.items():
        with ctx():
            now = reference.torch_saved_tensors_hooks()
            assert _core.read_builtin_probe(PROBE) == now, name
            assert tw.tensors._read_saved_tensors_hooks() == now, name


def test_reason_names_both_sides() -> None:
    b = tw.GuardBuilder({})
    b.global_state(PROBE)
    gs = b.build()
    with STATES["gm"]():
        fail = gs.why_not({})
    assert fail is not None
    assert f"pack {id(GM1):#x}, unpack {id(GM2):#x}" in fail.reason
    assert "expected no inlineable saved-tensor hooks" in fail.reason
    with STATES["plain"]():
        assert gs.why_not({}) is None  # torch does not inline plain hooks: its guard passes


def test_the_liar_is_believed_by_torch_and_by_tripwire() -> None:
    """isinstance() asks obj.__class__ after the type: the adapter cannot decide without user code,
    so the check takes the Python reader (the __class__ property runs) and decides as torch."""
    b = tw.GuardBuilder({})
    b.global_state(PROBE)
    gs = b.build()
    with STATES["liar"]():
        before = LyingClass.reads
        assert not gs.check({})
        assert LyingClass.reads > before
        assert reference.torch_saved_tensors_hooks() == (id(LIAR1), id(LIAR2))
    assert gs.check({})


def test_hooks_pushed_from_inside_a_check() -> None:
    """A lying __eq__ pushes GraphModule hooks during a check (DICT_CONTAINS compares a colliding
    key with it). The probe is ambient (decided before any source), as torch's root lambda leaf
    runs before its accessors: this check passes, the next one sees the hooks and fails."""
    pushed: list[bool] = []

    class Pusher:
        def __eq__(self, other: object) -> bool:
            if not pushed:
                torch._C._autograd._push_saved_tensors_default_hooks(GM1, GM2)
                pushed.append(True)
            return False

        def __hash__(self) -> int:
            return 1

    L = {"d": {Pusher(): 0}}
    b = tw.GuardBuilder(L)
    b.global_state(PROBE)
    b.dict_contains("L['d']", 1, present=False)  # hash(1) == 1: the lookup asks Pusher.__eq__
    gs = tw.GuardSet(b.guards)
    if pushed:  # the builder's own lookup ran the __eq__: start again from no hooks
        torch._C._autograd._pop_saved_tensors_default_hooks()
        pushed.clear()
    try:
        assert gs.check(L)
        assert pushed, "the __eq__ did not run"
        assert reference.torch_saved_tensors_hooks() == (id(GM1), id(GM2))
        assert not gs.check(L)
        fail = gs.why_not(L)
        assert fail is not None and fail.kind == "GLOBAL_STATE"
    finally:
        if pushed:
            torch._C._autograd._pop_saved_tensors_default_hooks()
    assert gs.check(L)


def test_hooks_are_per_thread() -> None:
    """The hooks stack is thread-local in torch: a set built in one thread decides in another by
    that thread's hooks."""
    mgr, sets = compiled_in("none")
    L = {"x": torch.randn(3)}
    seen: dict[str, Any] = {}
    ready, done = threading.Event(), threading.Event()

    def other() -> None:
        with STATES["gm"]():
            seen["in_thread"] = [gs.check(L) for gs in sets] + [mgr.check(L)]
            ready.set()
            done.wait(10)

    t = threading.Thread(target=other)
    t.start()
    ready.wait(10)
    seen["main"] = [gs.check(L) for gs in sets] + [mgr.check(L)]  # while the other holds its hooks
    done.set()
    t.join()
    assert seen["in_thread"] == [False, False, False]
    assert seen["main"] == [True, True, True]


def test_saved_and_loaded() -> None:
    """A None snapshot survives save/load; a snapshot of ids (process-local) is refused by name."""
    mgr, sets = compiled_in("none")
    L = {"x": torch.randn(3)}
    blob = sets[0].to_bytes()
    loaded = tw.GuardSet.from_bytes(blob, f_globals=f.__globals__)
    for state in ("none", "gm", "plain"):
        with STATES[state]():
            assert loaded.check(L) == mgr.check(L)
    b = tw.GuardBuilder({})
    b.global_state(PROBE, snapshot=(id(GM1), id(GM2)))
    with pytest.raises(tw.NotSerializable, match="saved-tensor-hooks snapshot names the ids"):
        tw.GuardSet(b.guards).to_bytes()


def test_bad_snapshots_are_refused() -> None:
    for bad in ((1,), (1, "2"), [1, 2], 3, (1, 2, 3)):
        with pytest.raises(tw.GuardBuildError, match="None or a tuple of two ids"):
            tw.GuardBuilder({}).global_state(PROBE, snapshot=bad)


def test_a_class_property_that_pops_the_hooks() -> None:
    """The hook's __class__ (asked by isinstance, after the stack was read) pops the hooks it sits
    in: torch's lambda and the Python reader both read the pair first, so both still see it."""
    popped: list[bool] = []

    class Popper(LyingClass):
        @property  # type: ignore[misc]
        def __class__(self) -> type:
            if not popped:
                popped.append(True)
                torch._C._autograd._pop_saved_tensors_default_hooks()
            return torch.fx.GraphModule

    mgr, sets = compiled_in("none")
    L = {"x": torch.randn(3)}
    a, b = Popper(), Popper()
    for gs in [*sets, mgr]:
        popped.clear()
        torch._C._autograd._push_saved_tensors_default_hooks(a, b)
        try:
            got = gs.check(L)
        finally:
            if not popped:
                torch._C._autograd._pop_saved_tensors_default_hooks()
        assert popped and got is False  # the pair was (a, b): GraphModule by __class__, not None
        assert reference.torch_saved_tensors_hooks() is None  # popped: nothing left


def test_grad_mode_and_hooks_per_thread_with_global_state() -> None:
    """Thread-local grad mode (GLOBAL_STATE) and hooks in one set, decided per thread as torch."""
    from torch._C._dynamo import guards as torch_guards

    b = tw.GuardBuilder({})
    b.global_state("torch_global_state")
    b.global_state(PROBE)
    with python_readers(True):
        b2 = tw.GuardBuilder({})
        b2.global_state("torch_global_state")
        b2.global_state(PROBE)
        python_set = b2.build()
    sets = [b.build(), python_set]
    state = torch_guards.GlobalStateGuard()
    seen: dict[str, list[bool]] = {}

    def run(name: str, ctx: Callable[[], Any]) -> None:
        with ctx():
            seen[name] = [gs.check({}) for gs in sets] + [state.check()]

    threads = [
        threading.Thread(target=run, args=("no_grad", torch.no_grad)),
        threading.Thread(target=run, args=("hooks", STATES["gm"])),
        threading.Thread(target=run, args=("plain", STATES["plain"])),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run("main", contextlib.nullcontext)
    assert seen["no_grad"] == [False, False, False]
    assert seen["hooks"] == [False, False, True]  # torch's GlobalStateGuard does not read hooks
    assert seen["plain"] == [True, True, True]
    assert seen["main"] == [True, True, True]


def test_the_probe_keeps_the_fast_pass() -> None:
    """Through the adapter the probe has a fast form: a passing check stays on the fast pass; with
    hooks only Python can classify (the liar) the fast form declines and the walk decides."""
    if not ADAPTER:
        pytest.skip(tw.tensors.adapter_status())
    b = tw.GuardBuilder({"x": torch.zeros(2)})
    b.global_state(PROBE)
    b.tensor_match("L['x']")
    gs = b.build()
    assert gs._uses_fast_pass
    n = gs._fast_pass_count
    assert gs.check({"x": torch.zeros(2)})
    assert gs._fast_pass_count == n + 1
    with STATES["plain"]():
        assert gs.check({"x": torch.zeros(2)})
        assert gs._fast_pass_count == n + 2
    with STATES["liar"]():
        assert not gs.check({"x": torch.zeros(2)})
        assert gs._fast_pass_count == n + 2

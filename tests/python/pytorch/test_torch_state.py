"""torch's global state, torch-function mode stack and default device: GLOBAL_STATE's torch probes
decide as torch's own GLOBAL_STATE, TORCH_FUNCTION_MODE_STACK and DEFAULT_DEVICE guards, through the
adapter and through the Python readers; the engine, the reference and torch read the same fields.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import gc_stress
import reference
import tripwire as tw
from engine_switches import assert_passes_on_the_fast_pass, fast_pass, python_readers
from tripwire import _core

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from torch._C._dynamo import guards as torch_guards  # noqa: E402
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack  # noqa: E402

tw.tensors.ensure_torch()
ADAPTER = _core.torch_adapter_installed()
PROBES = ("torch_global_state", "torch_function_mode_stack", "torch_default_device")


@contextlib.contextmanager
def setting(get: Callable[[], Any], put: Callable[[Any], None], value: Any) -> Iterator[None]:
    old = get()
    put(value)
    try:
        yield
    finally:
        put(old)


class ModeA(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class ModeB(ModeA):
    pass


def _matmul_precision(v: str) -> None:
    torch.backends.cuda.matmul.fp32_precision = v


def _fp16(pair: Any) -> None:
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = pair


def _bf16(pair: Any) -> None:
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = pair


def _deterministic(state: tuple[bool, bool]) -> None:
    torch.use_deterministic_algorithms(state[0], warn_only=state[1])


STATES: dict[str, Callable[[], Any]] = {
    "nothing": contextlib.nullcontext,
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "autocast_cpu": lambda: torch.autocast("cpu"),
    "autocast_cpu_fp16": lambda: torch.autocast("cpu", dtype=torch.float16),
    "autocast_dtype_only": lambda: setting(
        lambda: torch.get_autocast_dtype("cpu"), lambda d: torch.set_autocast_dtype("cpu", d), torch.float16
    ),
    "autocast_cache_off": lambda: setting(
        torch.is_autocast_cache_enabled, torch.set_autocast_cache_enabled, False
    ),
    "torch_function_subclasses_off": torch._C.DisableTorchFunctionSubclass,
    "torch_function_off": torch._C.DisableTorchFunction,
    "deterministic": lambda: setting(
        lambda: (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        ),
        _deterministic,
        (True, False),
    ),
    "deterministic_warn_only": lambda: setting(
        lambda: (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        ),
        _deterministic,
        (True, True),
    ),
    "tf32": lambda: setting(lambda: torch.backends.cuda.matmul.fp32_precision, _matmul_precision, "tf32"),
    "ieee": lambda: setting(lambda: torch.backends.cuda.matmul.fp32_precision, _matmul_precision, "ieee"),
    "fp16_reduce_off": lambda: setting(
        torch._C._get_cublas_allow_fp16_reduced_precision_reduction, lambda p: _fp16(p[0]), (False, True)
    ),
    "bf16_reduce_off": lambda: setting(
        torch._C._get_cublas_allow_bf16_reduced_precision_reduction, lambda p: _bf16(p[0]), (False, True)
    ),
    "one_thread": lambda: setting(torch.get_num_threads, torch.set_num_threads, 1),
    "default_float64": lambda: setting(torch.get_default_dtype, torch.set_default_dtype, torch.float64),
    "mode_a": ModeA,
    "mode_b": ModeB,
    "device_context_meta": lambda: torch.device("meta"),  # a mode on the stack; CURRENT_DEVICE unchanged
    "default_device_meta": lambda: setting(reference.torch_default_device, torch.set_default_device, "meta"),
    "default_device_cpu": lambda: setting(reference.torch_default_device, torch.set_default_device, "cpu"),
}


def torch_verdicts() -> Callable[[], tuple[bool, bool, bool]]:
    """torch's own three guards, built now; returns a function giving their verdicts."""
    state = torch_guards.GlobalStateGuard()
    root = torch_guards.RootGuardManager()
    root.add_torch_function_mode_stack_guard(_get_current_function_mode_stack(), ["modes"], None)
    root_dev = torch_guards.RootGuardManager()
    root_dev.add_default_device_guard(["device"], None)
    return lambda: (state.check(), root.check({}), root_dev.check({}))


def tripwire_sets() -> list[tw.GuardSet]:
    """One set per probe, through the adapter and (forced) through the Python readers."""
    out = []
    for python in (False, True):
        with python_readers(python):
            for probe in PROBES:
                b = tw.GuardBuilder({})
                b.global_state(probe)
                out.append(b.build())
    return out


@pytest.mark.parametrize("build_in", sorted(STATES))
@pytest.mark.parametrize(
    "check_in",
    [
        "nothing",
        "no_grad",
        "autocast_cpu",
        "mode_a",
        "default_device_meta",
        "one_thread",
        "torch_function_off",
    ],
)
def test_decisions_match_torch(build_in: str, check_in: str) -> None:
    with STATES[build_in]():
        theirs = torch_verdicts()
        sets = tripwire_sets()
    for name in ("nothing", check_in):
        with STATES[name]():
            want = theirs()
            for i, gs in enumerate(sets):
                got = gs.check({})
                assert got == want[i % 3], (build_in, name, PROBES[i % 3], "python" if i >= 3 else "adapter")
                assert reference.check(gs.guards, {}) == got
                if not got:
                    f = gs.why_not({})
                    assert f is not None and f.kind == "GLOBAL_STATE"


@pytest.mark.parametrize("name", sorted(STATES))
def test_engine_reference_and_torch_read_the_same_state(name: str) -> None:
    with STATES[name]():
        native = _core.read_builtin_probe("torch_global_state")
        python = tw.tensors._read_torch_state()
        assert python == reference.torch_global_state()
        if ADAPTER:
            assert native == python
        assert _core.read_builtin_probe("torch_function_mode_stack") == reference.torch_function_modes()
        dev = reference.torch_default_device()
        assert _core.read_builtin_probe("torch_default_device") == (None if dev is None else str(dev))


def test_reason_names_each_changed_field() -> None:
    b = tw.GuardBuilder({})
    b.global_state("torch_global_state")
    gs = b.build()
    # A thread count other than the one built with: an earlier import may have left it at 1
    # (bench/torch_compile.py sets 1 for its timings, and test_torch_compile imports it).
    threads = 2 if torch.get_num_threads() == 1 else 1
    with (
        torch.no_grad(),
        torch.autocast("cpu"),
        setting(torch.get_num_threads, torch.set_num_threads, threads),
    ):
        f = gs.why_not({})
    assert f.kind == "GLOBAL_STATE" and f.source is None
    assert "grad_mode expected True, got False" in f.reason
    assert "autocast(cpu)_enabled expected (False, 'bfloat16'), got (True, 'bfloat16')" in f.reason
    assert "num_threads expected" in f.reason
    with torch._C.DisableTorchFunction():
        f = gs.why_not({})
    # torch's own reason() never names torch_function_all_disabled; tripwire does.
    assert "torch_function expected True, got False" in f.reason
    assert "torch_function_all_disabled expected False, got True" in f.reason


def test_snapshot_given_as_torch_json() -> None:
    """The importer's path: torch's GlobalStateGuard JSON as the snapshot."""
    with torch.no_grad():
        blob = torch_guards.GlobalStateGuard().__getstate__()
    b = tw.GuardBuilder({})
    b.global_state("torch_global_state", snapshot=blob)
    with pytest.raises(tw.GuardBuildError, match="fails on the example"):
        b.build()  # built with grad mode on: the snapshot says off
    gs = tw.GuardSet(b.guards)
    assert not gs.check({})
    with torch.no_grad():
        assert gs.check({})
    b = tw.GuardBuilder({})
    b.global_state("torch_function_mode_stack", snapshot=(ModeA,))
    modes = tw.GuardSet(b.guards)
    assert not modes.check({})
    with ModeA():
        assert modes.check({})
    with ModeB():
        assert not modes.check({})  # the exact type, not isinstance
    b = tw.GuardBuilder({})
    b.global_state("torch_default_device", snapshot=torch.device("meta"))
    device = tw.GuardSet(b.guards)
    assert not device.check({})
    with STATES["default_device_meta"]():
        assert device.check({})
        assert not modes.check({})  # set_default_device pushes a DeviceContext mode
    with torch.device("meta"):  # a DeviceContext mode too, but CURRENT_DEVICE stays None
        assert not device.check({})


def test_torch_probes_keep_the_fast_pass() -> None:
    if not ADAPTER:
        pytest.skip(tw.tensors.adapter_status())
    b = tw.GuardBuilder({"x": torch.zeros(2)})
    for probe in PROBES:
        b.global_state(probe)
    b.tensor_match("L['x']")
    gs = b.build()
    assert_passes_on_the_fast_pass(gs, {"x": torch.zeros(2)})
    with torch.no_grad():
        assert not gs.check({"x": torch.zeros(2)})
    explained = gs.explain()
    assert explained.count("[torch adapter]") == 4


def test_probe_without_torch_imported_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "torch_global_state" in _core.builtin_probes()
    monkeypatch.setattr(tw.tensors, "ensure_torch", lambda: False)
    with pytest.raises(tw.GuardBuildError, match="needs torch"):
        tw.GuardBuilder({}).global_state("torch_global_state")


# -- whole compiled functions against torch.compile -----------------------------------------------------
def _compiled_guard_manager(fn: Callable[..., Any], *args: Any) -> Any:
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="eager", dynamic=False, fullgraph=True)
    # No collection while torch compiles: under --gc-stress a finalizer's frames entered while
    # Dynamo's frame hook is on are frames fullgraph=True counts as skipped, and torch then
    # raises "found no compiled frames". The test is about decisions after this.
    was = gc.isenabled()
    gc.disable()
    try:
        compiled(*args)
    finally:
        if was:
            gc.enable()
    entries = _debug_get_cache_entry_list(fn.__code__)
    assert len(entries) == 1
    return entries[0].guard_manager


def f2(x, y):
    return x * y + 1


def test_a_compiled_function_of_tensors_decides_as_torch() -> None:
    """tripwire's inferred set plus the three torch probes, against the guard manager torch.compile
    built for f(x, y), on mutated inputs and global-state changes."""
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    gm = _compiled_guard_manager(f2, x, y)
    b = tw.GuardBuilder({"x": x, "y": y})
    tw.infer_into(b)
    for probe in PROBES:
        b.global_state(probe)
    gs = b.build()
    inputs = [
        {"x": x, "y": y},
        {"x": torch.randn(4, 8), "y": torch.randn(4, 8)},
        {"x": torch.randn(5, 8), "y": y},
        {"x": x, "y": torch.randn(8, 4).t()},
        {"x": x.to(torch.float64), "y": y},
        {"x": x.clone().requires_grad_(), "y": y},
        {"x": x, "y": x},  # aliasing
        {"x": torch.nn.Parameter(x.clone()), "y": y},
        {"x": x.to("meta"), "y": y},
        {"x": x, "y": torch.randn(4, 8, dtype=torch.complex64).real},
    ]
    with torch.inference_mode():
        inputs.append({"x": torch.randn(4, 8), "y": torch.randn(4, 8)})
    marked = torch.randn(4, 8)
    torch._dynamo.mark_dynamic(marked, 0)
    inputs.append({"x": marked, "y": y})
    for L in inputs:
        assert gs.check(L) == gm.check(L), (L, gs.why_not(L))
    for state in (
        "no_grad",
        "autocast_cpu",
        "one_thread",
        "mode_a",
        "default_device_meta",
        "device_context_meta",
        "default_float64",
        "torch_function_off",
    ):
        with STATES[state]():
            assert gs.check({"x": x, "y": y}) == gm.check({"x": x, "y": y}), state


# -- the adapter's direct reads (at::Context's fields, per-thread thread-local addresses) -------------
def _global_state_set() -> tw.GuardSet:
    b = tw.GuardBuilder({})
    b.global_state("torch_global_state")
    return b.build()


def _cuda_matmul_is_tf32() -> bool:
    return torch._C._get_fp32_precision_getter("cuda", "matmul") == "tf32"


@pytest.mark.parametrize("generic", ["none", "ieee", "tf32"])
def test_tf32_reading_follows_torch(generic: str) -> None:
    """The adapter reads float32Precision(CUDA, MATMUL) from at::Context's map entries and applies
    torch's fallback itself (NONE -> the backend's ALL entry -> GENERIC's): over every combination
    Python can set, its verdict equals torch's GlobalStateGuard, the engine, the reference and
    torch's own getter."""
    get = torch._C._get_fp32_precision_getter
    put = torch._C._set_fp32_precision_setter
    old = (get("generic", "all"), get("cuda", "all"), get("cuda", "matmul"))
    try:
        put("generic", "all", generic)
        for cuda_all in ("none", "ieee", "tf32"):
            put("cuda", "all", cuda_all)
            for matmul in ("none", "ieee", "tf32"):
                put("cuda", "matmul", matmul)
                for built_tf32 in (False, True):
                    # a snapshot taken under the other TF32 verdict must fail, this one pass
                    state = list(tw.tensors._read_torch_state())
                    state[5] = int(built_tf32)
                    b = tw.GuardBuilder({})
                    b.global_state("torch_global_state", snapshot=tuple(state))
                    gs = tw.GuardSet(b.guards)
                    want = built_tf32 == _cuda_matmul_is_tf32()
                    combo = (generic, cuda_all, matmul, built_tf32)
                    assert gs.check({}) == want, combo
                    assert reference.check(gs.guards, {}) == want, combo
                assert _core.read_builtin_probe("torch_global_state")[5] == int(_cuda_matmul_is_tf32())
                torch_guard = torch_guards.GlobalStateGuard()
                gs = _global_state_set()
                assert gs.check({}) and torch_guard.check()
    finally:
        put("generic", "all", old[0])
        put("cuda", "all", old[1])
        put("cuda", "matmul", old[2])


def test_context_fields_changed_from_cpp_setters_fail() -> None:
    """Each at::Context field the adapter reads directly, changed through torch's C++ setters
    (torch._C bindings, no Python-level hook): the set fails, and passes again once restored."""
    gs = _global_state_set()
    C = torch._C
    changes = [
        (C._get_deterministic_algorithms, lambda v: C._set_deterministic_algorithms(v), True),
        (
            C._get_deterministic_algorithms_warn_only,
            lambda v: C._set_deterministic_algorithms(True, warn_only=v),
            True,
        ),
        (
            C._get_cublas_allow_fp16_reduced_precision_reduction,
            lambda v: C._set_cublas_allow_fp16_reduced_precision_reduction(*v),
            (False, False),
        ),
        (
            C._get_cublas_allow_bf16_reduced_precision_reduction,
            lambda v: C._set_cublas_allow_bf16_reduced_precision_reduction(*v),
            (False, True),
        ),
        (C._get_float32_matmul_precision, C._set_float32_matmul_precision, "high"),
    ]
    for get, put, value in changes:
        det = (C._get_deterministic_algorithms(), C._get_deterministic_algorithms_warn_only())
        old = get()
        put(value)
        try:
            assert not gs.check({}), get.__name__
            f = gs.why_not({})
            assert f is not None and f.kind == "GLOBAL_STATE", get.__name__
        finally:
            put(old)
            C._set_deterministic_algorithms(det[0], warn_only=det[1])
        assert gs.check({}), get.__name__


def test_autocast_cache_flag_is_read_where_torch_keeps_it() -> None:
    """The adapter reads at::autocast's cache flag from this thread's TLS block of libtorch_cpu at
    the place it found by flipping the flag with torch's setter at load (global_state.cpp,
    AutocastCacheFlag); a set decides by the flag on this thread, flipped by torch's setter, as
    torch's GlobalStateGuard does (other threads: test_each_thread_reads_its_own_thread_locals)."""
    if not tw._core.torch_adapter_installed():
        pytest.skip("the torch adapter is not loaded in this build")
    import tripwire._torch_adapter as adapter

    assert adapter.autocast_cache_flag_offset >= 0  # found on this torch build (else: the accessor)
    gs = _global_state_set()
    theirs = torch_guards.GlobalStateGuard()
    for flag in (False, True, False):
        with setting(torch.is_autocast_cache_enabled, torch.set_autocast_cache_enabled, flag):
            assert gs.check({}) is flag is theirs.check()
            assert reference.check(gs.guards, {}, {}) is flag
    assert gs.check({}) and theirs.check()


def test_each_thread_reads_its_own_thread_locals() -> None:
    """Grad mode, torch-function state, autocast and the thread count are per thread: a set built
    on one thread decides on another by that thread's state, as torch's GlobalStateGuard built
    with it does. Threads run one after another, so a new thread typically reuses the control
    block (and thread pointer) of the one that exited: the adapter's per-thread addresses must not
    outlive their thread."""
    import threading

    gs = _global_state_set()
    theirs = torch_guards.GlobalStateGuard()
    with torch.no_grad():
        no_grad_set = _global_state_set()
        no_grad_theirs = torch_guards.GlobalStateGuard()
    seen: list[tuple[bool, bool, bool, bool]] = []

    def run(ctx: Callable[[], Any]) -> None:
        with ctx():
            seen.append((gs.check({}), theirs.check(), no_grad_set.check({}), no_grad_theirs.check()))

    names = (
        "nothing",
        "no_grad",
        "autocast_cpu",
        "autocast_cache_off",
        "torch_function_off",
        "one_thread",
        "deterministic",
    )
    for round_ in range(gc_stress.scaled(20, 4)):
        for name in names:
            t = threading.Thread(target=run, args=(STATES[name],))
            t.start()
            t.join()
            ours, torchs, ours_ng, torchs_ng = seen[-1]
            assert (ours, ours_ng) == (torchs, torchs_ng), (round_, name, seen[-1])
        assert gs.check({}) and theirs.check()  # the main thread again, after the others
        assert not no_grad_set.check({})
        with torch.no_grad():
            assert no_grad_set.check({})
    # at least one thread passed and one failed each set: the comparison above was not vacuous
    assert {s[0] for s in seen} == {True, False} and {s[2] for s in seen} == {True, False}


@pytest.mark.parametrize(
    "probe, state",
    [
        ("torch_function_mode_stack", "mode_a"),
        ("torch_function_mode_stack", "device_context_meta"),
        ("torch_default_device", "default_device_meta"),
        ("torch_default_device", "device_context_meta"),
        ("torch_default_device", "mode_a"),
    ],
)
def test_the_empty_mode_stack_and_no_default_device_are_read_in_the_fast_pass(probe: str, state: str) -> None:
    """Snapshots taken with no torch-function mode and no default device (every compile outside
    such a context) have their own fast-pass reads: a passing check decides them without a
    residue, and a mode or device set since fails, as torch and the reference decide, in the fast
    pass and in the walk."""
    with STATES["nothing"]():
        theirs = torch_verdicts()
        b = tw.GuardBuilder({})
        b.global_state(probe)
        gs = b.build()
        assert_passes_on_the_fast_pass(gs, {})
    with STATES[state]():
        want = theirs()[PROBES.index(probe)]
        for on in (True, False):
            with fast_pass(on):
                assert gs.check({}) == want == reference.check(gs.guards, {}), (probe, state, on)
    # A mode on the stack, or a default device set, is a change these guards catch.
    assert want is (state == "mode_a" and probe == "torch_default_device") or state == "device_context_meta"
    with STATES["nothing"]():
        assert_passes_on_the_fast_pass(gs, {})

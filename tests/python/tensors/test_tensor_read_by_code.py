"""Tensors whose metadata is answered by code, and the Python-key mask.

The second part: torch's guards mask the Python dispatch keys unless its C++ thread-local flag
says a dispatch mode without ignore_compile_internals is active (guards.h LocalState). The flag is
set from a module global that all threads share; the engine reads torch's flag (found by the
adapter), and these tests construct the cases where the two differ (threads, the setter called
directly) and nested modes, _DisableTorchDispatch and modes pushed without __enter__.

A ``__torch_dispatch__`` wrapper subclass built with ``dispatch_sizes_strides_policy``,
``dispatch_device`` or ``dispatch_layout`` answers ``sizes()``, ``strides()``, ``dim()``,
``storage_offset()``, ``device()`` or ``layout()`` by calling its Python ``__torch_dispatch__``.
The engine's native readers run inside regions without user code (docs/cpp.md): they must never
ask such a tensor (its dispatch may collect garbage, free what the region borrows, mutate the
guarded dict or raise). TENSOR_MATCH reads it through the Python reader outside any region, so
the decision is still torch's. These tests build such subclasses whose dispatch does each of
those things and compare every decision with torch's own guard (``RootGuardManager``).
"""

from __future__ import annotations

import contextlib
import gc
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest

import reference
import tripwire as tw
from engine_switches import assert_passes_on_the_fast_pass, fast_pass, python_readers, switches
from gc_stress import scaled
from tripwire import _core

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
from torch._C._dynamo import guards as torch_guards  # noqa: E402
from torch._dynamo.guards import GuardManagerType  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

tw.tensors.ensure_torch()
aten = torch.ops.aten
ADAPTER = _core.torch_adapter_installed()
# The native readers and torch's per-thread flag are the adapter's (the ASan build has none).
needs_adapter = pytest.mark.skipif(not ADAPTER, reason="the torch adapter is not built here")

# What the dispatch does besides answering: set per test, read by every Wrapper.
ACTION: dict[str, Any] = {"do": None}
CALLS: list[str] = []


class Wrapper(torch.Tensor):
    """A wrapper subclass around ``elem``; ``policy`` picks what torch asks its Python for."""

    elem: Any

    @staticmethod
    def __new__(cls, elem: Any, policy: str = "sizes") -> Any:
        kwargs: dict[str, Any] = {}
        if policy in ("sizes", "strides"):
            kwargs["dispatch_sizes_strides_policy"] = policy
        elif policy == "device":
            kwargs["dispatch_device"] = True
        elif policy == "layout":
            kwargs["dispatch_layout"] = True
        r = torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), dtype=elem.dtype, device=elem.device, **kwargs
        )
        r.elem = elem
        return r

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        CALLS.append(str(func))
        if ACTION["do"] is not None:
            ACTION["do"]()
        e = args[0].elem
        answers = {
            aten.sym_size.default: lambda: tuple(e.size()),
            aten.size.default: lambda: tuple(e.size()),
            aten.sym_stride.default: lambda: tuple(e.stride()),
            aten.stride.default: lambda: tuple(e.stride()),
            aten.dim.default: e.dim,
            aten.sym_storage_offset.default: e.storage_offset,
            aten.storage_offset.default: e.storage_offset,
            aten.sym_numel.default: e.numel,
            aten.numel.default: e.numel,
            torch.ops.prim.device.default: lambda: e.device,
            torch.ops.prim.layout.default: lambda: e.layout,
            aten.is_contiguous.default: e.is_contiguous,
            aten.is_contiguous.memory_format: e.is_contiguous,
            aten.detach.default: lambda: Wrapper(e.detach()),
        }
        if func in answers:
            return answers[func]()
        return NotImplemented


POLICIES = ["sizes", "strides", "device", "layout"]


@contextlib.contextmanager
def dispatch_does(action: Any) -> Any:
    ACTION["do"] = action
    try:
        yield
    finally:
        ACTION["do"] = None


def torch_root(example: Any, exp: tw.tensors.TensorExpectation) -> Any:
    """torch's TENSOR_MATCH leaf for ``example`` with the same unchecked dimensions."""
    root = torch_guards.RootGuardManager()
    m = root.getitem_manager(
        key="t", source="L['t']", example_value=example, guard_manager_enum=GuardManagerType.GUARD_MANAGER
    )
    m.add_tensor_match_guard(
        example, list(exp.sizes), list(exp.strides), "L['t']", ["tm"], None, type(example),
        torch._C._dispatch_keys(example),
    )  # fmt: skip
    return root


def build(example: Any) -> tuple[tw.GuardSet, Any]:
    b = tw.GuardBuilder({"t": example})
    spec = b.tensor_match("L['t']")
    return b.build(), spec.args[1]


def candidates(policy: str) -> list[Any]:
    return [
        Wrapper(torch.zeros(2, 3), policy),
        Wrapper(torch.zeros(2, 4), policy),
        Wrapper(torch.zeros(3, 2).t(), policy),
        Wrapper(torch.zeros(2, 3, dtype=torch.float64), policy),
        Wrapper(torch.zeros(6)[1:].view(5), policy),
        torch.zeros(2, 3),
    ]


@pytest.mark.parametrize("policy", POLICIES)
def test_decides_as_torch_without_asking_inside_a_region(policy: str) -> None:
    """Every decision equals torch's, on the fast pass and the walk, through the adapter."""
    example = Wrapper(torch.zeros(2, 3), policy)
    gs, exp = build(example)
    assert gs._guard_path(0) == ("native" if ADAPTER else "python")
    theirs = torch_root(example, exp)
    for v in candidates(policy):
        L = {"t": v}
        want = theirs.check(L)
        for fast in (True, False):
            with switches(fast=fast):
                assert gs.check(L) == want, (policy, v.shape, fast)
        assert (gs.why_not(L) is None) == want
        assert reference.check(gs.guards, L) == want


@needs_adapter
@pytest.mark.parametrize("policy", POLICIES)
def test_reading_by_code_goes_through_the_python_reader(policy: str) -> None:
    """The native reader answers "read by code" without one dispatch; the fields then come from
    the Python reader (the same ones), so the builder and the diagnostics still name them."""
    w = Wrapper(torch.zeros(2, 3), policy)
    CALLS.clear()
    with switches(python=True):
        by_python = _core.read_tensor_fields(w, False)
    assert _core.read_tensor_fields(w, True) == by_python
    assert by_python[4] == (2, 3)


@needs_adapter
def test_a_wrapper_without_custom_policies_is_read_natively() -> None:
    """A wrapper subclass that leaves its metadata to torch is read from its fields: no dispatch,
    and its guard passes on the fast pass (the Python keys masked as torch masks them)."""
    w = torch.Tensor._make_wrapper_subclass(Wrapper, (2, 3), dtype=torch.float32)
    w.elem = torch.zeros(2, 3)
    gs, exp = build(w)
    CALLS.clear()
    assert_passes_on_the_fast_pass(gs, {"t": w})
    assert CALLS == []
    assert torch_root(w, exp).check({"t": w})


@pytest.mark.parametrize("policy", POLICIES)
def test_dispatch_that_collects_garbage(policy: str) -> None:
    """The dispatch runs gc.collect() (finalizers, weakref callbacks) on every metadata read."""
    example = Wrapper(torch.zeros(2, 3), policy)
    gs, exp = build(example)
    theirs = torch_root(example, exp)
    with dispatch_does(gc.collect):
        for _ in range(scaled(5, 5)):
            for v in candidates(policy)[:3]:
                L = {"t": v}
                assert gs.check(L) == theirs.check(L)


@pytest.mark.parametrize("policy", POLICIES)
def test_dispatch_that_raises(policy: str) -> None:
    """A raising dispatch: torch's guard raises; tripwire's guard fails, no error left set."""
    example = Wrapper(torch.zeros(2, 3), policy)
    gs, _ = build(example)

    def boom() -> None:
        raise RuntimeError("dispatch says no")

    with dispatch_does(boom):
        for fast in (True, False):
            with switches(fast=fast):
                assert gs.check({"t": example}) is False
        assert gs.why_not({"t": example}) is not None
    assert gs.check({"t": example}) is True


@pytest.mark.parametrize("policy", POLICIES)
def test_dispatch_that_mutates_the_guarded_dict(policy: str) -> None:
    """The dispatch replaces a value the check has already fetched (the only reference to the old
    one): the check must not read the freed object (ASan), and the next check sees the new one."""
    example = Wrapper(torch.zeros(2, 3), policy)
    b = tw.GuardBuilder({"u": [1, 2], "t": example})
    b.type_match("L['u']")
    b.tensor_match("L['t']")
    b.length("L['u']")
    gs = b.build()
    for fast in (True, False):
        with switches(fast=fast):
            L: dict[str, Any] = {"u": [1, 2], "t": example}

            def swap(L: dict[str, Any] = L) -> None:
                L["u"] = [object() for _ in range(5)]  # frees the list the check fetched

            with dispatch_does(swap):
                got = gs.check(L)
            assert got in (True, False)
            assert gs.check(L) is reference.check(gs.guards, L) is False  # length 5 now


@pytest.mark.parametrize("policy", POLICIES)
def test_inside_disabled_torch_dispatch(policy: str) -> None:
    """Under _DisableTorchDispatch the Python key is excluded from the thread-local sets, so the key
    comparison no longer stops a wrapper before its sizes: the one-call reader must still not read
    them. Decided as torch's guard built and checked inside the same context. (No assertion
    message shows a Wrapper: its repr segfaults in torch with the dispatch disabled.)"""
    example = Wrapper(torch.zeros(2, 3), policy)
    other = Wrapper(torch.zeros(2, 4), policy)
    with torch._C._DisableTorchDispatch():
        gs, exp = build(example)
        theirs = torch_root(example, exp)
        for fast in (True, False):
            with switches(fast=fast):
                for v in (example, other):
                    same = gs.check({"t": v}) == theirs.check({"t": v})
                    assert same, (policy, fast)


# -- the Python-key mask: torch's per-thread flag, not the module global ---------------------------------
class VisibleMode(TorchDispatchMode):
    """A dispatch mode without ignore_compile_internals: torch stops masking the Python keys."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


class QuietMode(VisibleMode):
    """A dispatch mode that ignores compile internals: torch keeps masking."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


def plain_and_wrapper() -> list[Any]:
    """A plain tensor (Python keys only from a mode's thread-local include set) and a wrapper
    subclass without custom policies (Python keys of its own, read natively)."""
    w = torch.Tensor._make_wrapper_subclass(Wrapper, (2, 3), dtype=torch.float32)
    w.elem = torch.zeros(2, 3)
    return [torch.zeros(2, 3), w]


# How the engine reads the tensors and torch's flag: the adapter, the Python readers (the path
# without the adapter: the ASan build, a build without it), and each with torch's getter hidden
# (as if libtorch_python.so were stripped: no flag, so Python-key sets fail closed).
READINGS = [
    pytest.param(("native", False), id="adapter", marks=needs_adapter),
    pytest.param(("python", False), id="python-readers"),
    pytest.param(("native", True), id="adapter-no-flag", marks=needs_adapter),
    pytest.param(("python", True), id="python-readers-no-flag"),
]


@contextlib.contextmanager
def reading(how: tuple[str, bool]) -> Any:
    """Guard sets built inside read through the adapter or the Python readers as `how` says;
    yields whether agree_with_torch checks with torch's flag hidden. (They are built with it: a
    guard on a tensor with Python keys is refused at build without the flag,
    test_no_flag_refuses_to_build_on_python_keys; checking without it is the case of a set loaded
    in a process whose libtorch_python.so has no symbol table.)"""
    readers, hidden = how
    with python_readers(readers == "python"):
        yield hidden


@contextlib.contextmanager
def flag_hidden(on: bool) -> Any:
    was = _core.testing.hide_torch_mode_flag(on)
    try:
        yield
    finally:
        _core.testing.hide_torch_mode_flag(was)


def has_python_key(t: Any) -> bool:
    """Whether torch's applied key set of `t` on this thread, before its Python-key mask, has a
    Python key: where the mask decides, so where tripwire without torch's flag fails closed."""
    C = torch._C
    keys = (C._dispatch_keys(t) | C._dispatch_tls_local_include_set()) - C._dispatch_tls_local_exclude_set()
    return any(
        keys.has(k)
        for k in (C.DispatchKey.Python, C.DispatchKey.PythonTLSSnapshot, C.DispatchKey.PythonDispatcher)
    )


def agree_with_torch(where: str, built: list[tuple[Any, tw.GuardSet, Any]], hidden: bool = False) -> None:
    """tripwire decides as torch's own guard; with torch's flag hidden, a tensor whose applied
    keys carry a Python key fails (closed, with a reason saying why), every other as torch."""
    for t, gs, theirs in built:
        want = theirs.check({"t": t})
        undecidable = hidden and has_python_key(t)
        if undecidable:
            want = False
        with flag_hidden(hidden):
            for fast in (True, False):
                with fast_pass(fast):
                    assert gs.check({"t": t}) == want, (where, type(t).__name__, fast)
            f = gs.why_not({"t": t})
        assert (f is None) == want, where
        if undecidable:
            assert f is not None and "could not be found" in f.reason and "fails closed" in f.reason, f.reason


def built_outside() -> list[tuple[Any, tw.GuardSet, Any]]:
    out = []
    for t in plain_and_wrapper():
        gs, exp = build(t)
        out.append((t, gs, torch_root(t, exp)))
    return out


@contextlib.contextmanager
def module_global_restored() -> Any:
    """torch's module global as found: after A leaves, then B, it is left True (B restores the
    value it saw on entry, A's): torch's own cross-thread bug, which must not leak into other tests."""
    from torch.utils import _python_dispatch

    was = _python_dispatch._is_in_any_mode_without_ignore_compile_internals
    try:
        yield
    finally:
        _python_dispatch._is_in_any_mode_without_ignore_compile_internals = was


@pytest.mark.parametrize("how", READINGS)
def test_a_thread_still_in_a_mode_after_another_left_one(how: tuple[str, bool]) -> None:
    """Thread A enters a visible mode, B enters one, A leaves: the module global is False again
    while B's flag (torch's) is still True. torch does not mask on B: its guard fails where the
    global would have masked and passed (a false pass, so tripwire reads torch's own flag on every
    path, the Python readers included). The reference reads the module global, so it cannot know B's
    flag: the oracle here is torch's own guard."""
    with reading(how) as hidden:
        run_a_thread_still_in_a_mode(hidden)


def run_a_thread_still_in_a_mode(hidden: bool) -> None:
    built = built_outside()
    ev = {k: threading.Event() for k in ("a_in", "b_in", "a_out")}
    errors: list[BaseException] = []

    def a() -> None:
        with VisibleMode():
            ev["a_in"].set()
            ev["b_in"].wait(30)
        ev["a_out"].set()

    def b() -> None:
        try:
            ev["a_in"].wait(30)
            with VisibleMode():
                ev["b_in"].set()
                ev["a_out"].wait(30)
                from torch.utils import _python_dispatch

                assert _python_dispatch._is_in_any_mode_without_ignore_compile_internals is False
                assert _core._masks_python_keys() is False
                agree_with_torch("B inside, A left", built, hidden)
                assert not any(theirs.check({"t": t}) for t, _, theirs in built)
                with flag_hidden(hidden):
                    assert not any(gs.check({"t": t}) for t, gs, _ in built)
        except BaseException as e:  # reported on the main thread
            errors.append(e)
            ev["b_in"].set()

    with module_global_restored():
        threads = [threading.Thread(target=a), threading.Thread(target=b)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
    assert not errors, errors


@pytest.mark.parametrize("how", READINGS)
def test_a_thread_outside_modes_while_another_is_inside_one(how: tuple[str, bool]) -> None:
    """The reverse: the global is True (thread A is in a visible mode), this thread's flag False:
    torch masks here, so tripwire must too (it was stricter than torch before). Without the flag
    the wrapper (Python keys of its own) fails closed, the plain tensor passes as in torch."""
    with reading(how) as hidden:
        run_a_thread_outside_modes(hidden)


def run_a_thread_outside_modes(hidden: bool) -> None:
    built = built_outside()
    inside, done = threading.Event(), threading.Event()

    def a() -> None:
        with VisibleMode():
            inside.set()
            done.wait(30)

    th = threading.Thread(target=a)
    th.start()
    try:
        inside.wait(30)
        agree_with_torch("A inside, here outside", built, hidden)
        assert all(theirs.check({"t": t}) for t, _, theirs in built)
    finally:
        done.set()
        th.join(60)


@pytest.mark.parametrize("how", READINGS)
def test_the_flag_set_directly(how: tuple[str, bool]) -> None:
    """torch._C._dynamo.guards.set_is_in_mode_without_ignore_compile_internals, called without a
    mode: torch stops masking; the module global does not move."""
    from torch._C._dynamo.guards import set_is_in_mode_without_ignore_compile_internals as set_flag

    with reading(how) as hidden:
        built = built_outside()
        set_flag(True)
        try:
            agree_with_torch("flag set directly", built, hidden)
        finally:
            set_flag(False)
        agree_with_torch("flag cleared", built, hidden)


@pytest.mark.parametrize("readers", ["native", "python"])
def test_no_flag_refuses_to_build_on_python_keys(readers: str) -> None:
    """Without torch's flag a TENSOR_MATCH on a tensor whose applied keys carry a Python key cannot
    be decided: building it raises (the set would fail on its own example), saying why; a tensor
    without one builds and passes as before."""
    if readers == "native" and not ADAPTER:
        pytest.skip("the torch adapter is not built here")
    plain, wrapper = plain_and_wrapper()
    with python_readers(readers == "python"), flag_hidden(True):
        assert _core._masks_python_keys() is None
        with pytest.raises(tw.GuardBuildError, match="flag could not be found"):
            build(wrapper)
        gs, _ = build(plain)
        assert gs.check({"t": plain})
        with VisibleMode(), pytest.raises(tw.GuardBuildError, match="fails closed"):
            build(plain)


@pytest.mark.parametrize(
    "contexts",
    [
        pytest.param(lambda: [VisibleMode()], id="visible"),
        pytest.param(lambda: [QuietMode()], id="quiet"),
        pytest.param(lambda: [QuietMode(), VisibleMode()], id="quiet-then-visible"),
        pytest.param(lambda: [VisibleMode(), QuietMode()], id="visible-then-quiet"),
        pytest.param(lambda: [VisibleMode(), torch._C._DisableTorchDispatch()], id="visible-disabled"),
        pytest.param(lambda: [torch._C._DisableTorchDispatch(), VisibleMode()], id="disabled-visible"),
    ],
)
@pytest.mark.parametrize("how", READINGS)
def test_nested_modes_and_disabled_dispatch(contexts: Any, how: tuple[str, bool]) -> None:
    """Guards built outside and inside, checked inside and outside, as torch decides."""
    with reading(how) as hidden:
        for built_inside in (False, True):
            with contextlib.ExitStack() as stack:
                if built_inside:
                    for c in contexts():
                        stack.enter_context(c)
                built = built_outside()
            for inside in (False, True):
                with contextlib.ExitStack() as stack:
                    if inside:
                        for c in contexts():
                            stack.enter_context(c)
                    agree_with_torch(f"built inside={built_inside} checked inside={inside}", built, hidden)


@pytest.mark.parametrize("how", READINGS)
def test_modes_pushed_on_the_cpp_stack_without_enter(how: tuple[str, bool]) -> None:
    """A mode pushed without __enter__ (torch's _push_mode): neither flag moves; torch masks."""
    from torch.utils._python_dispatch import _pop_mode, _push_mode

    with reading(how) as hidden:
        built = built_outside()
        _push_mode(VisibleMode())
        try:
            agree_with_torch("pushed without __enter__", built, hidden)
        finally:
            _pop_mode()


@needs_adapter
def test_the_getter_is_found_by_the_adapter_and_verified_by_torch_setter() -> None:
    """In a fresh process (the getter not verified yet): without the adapter there is no getter;
    with the adapter loaded while torch's setter does not move the flag, or with a setter that does
    not move it (a no-op, print, None), it stays unverified (the mask unknown, so Python-key sets
    fail closed); torch's setter verifies it, and then the mask follows the flag."""
    code = textwrap.dedent(
        """
        import warnings
        import torch
        from tripwire import _core, tensors
        C = torch._C
        guards = C._dynamo.guards
        setter = guards.set_is_in_mode_without_ignore_compile_internals
        bits = C.DispatchKeySet(C.DispatchKey.Python).raw_repr()
        assert _core._masks_python_keys() is None
        assert not _core._find_torch_mode_flag(setter, bits)  # no adapter yet: only the bits
        guards.set_is_in_mode_without_ignore_compile_internals = lambda v: None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert tensors.ensure_torch()
        guards.set_is_in_mode_without_ignore_compile_internals = setter
        assert _core.torch_adapter_installed()
        assert "flag was not found" in tensors.adapter_status(), tensors.adapter_status()
        assert _core._masks_python_keys() is None
        assert not _core._find_torch_mode_flag(lambda v: None, bits)
        assert not _core._find_torch_mode_flag(print, bits)
        assert not _core._find_torch_mode_flag(None, bits)
        assert _core._masks_python_keys() is None
        assert _core._find_torch_mode_flag(setter, bits)
        assert _core._masks_python_keys() is True
        setter(True)
        assert _core._masks_python_keys() is False
        setter(False)
        assert _core._masks_python_keys() is True
        print("ok")
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


@pytest.mark.parametrize("how", READINGS[:2])
def test_threads_entering_and_leaving_modes_at_random(how: tuple[str, bool]) -> None:
    """Four threads enter and leave a visible mode at random, with a 1 us switch interval (the
    module global flips under every thread's feet): each check equals torch's guard on the same
    thread, on both reading paths."""
    import random

    with reading(how):
        built = built_outside()
    counts = {"agree": 0, "disagree": 0}
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(scaled(150, 10)):
                mode = VisibleMode() if rng.random() < 0.5 else contextlib.nullcontext()
                with mode:
                    for t, gs, theirs in built:
                        same = gs.check({"t": t}) == theirs.check({"t": t})
                        counts["agree" if same else "disagree"] += 1
        except BaseException as e:  # reported on the main thread
            errors.append(e)

    was = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with module_global_restored():
            threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(120)
    finally:
        sys.setswitchinterval(was)
    assert not errors, errors
    assert counts["disagree"] == 0 and counts["agree"] > 0, counts


def test_no_adapter_and_no_flag_end_to_end() -> None:
    """A fresh process where the adapter does not load and torch's getter fails verification (its
    setter replaced while tripwire looks for it): adapter_status() says the flag was not found, the
    mask is unknown (never the module global), a plain tensor's guard passes outside a mode and
    fails closed inside a visible one (torch fails there too: the mode's include set carries the
    Python keys), with a reason saying why."""
    code = textwrap.dedent(
        """
        import sys, warnings
        sys.modules["tripwire._torch_adapter"] = None  # the adapter does not load
        import torch, tripwire as tw
        from torch.utils._python_dispatch import TorchDispatchMode
        guards = torch._C._dynamo.guards
        real = guards.set_is_in_mode_without_ignore_compile_internals
        guards.set_is_in_mode_without_ignore_compile_internals = lambda v: None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "the adapter did not load"
            assert tw.tensors.ensure_torch()
        guards.set_is_in_mode_without_ignore_compile_internals = real
        assert not tw._core.torch_adapter_installed()
        assert tw._core._masks_python_keys() is None
        assert "flag was not found" in tw.tensors.adapter_status(), tw.tensors.adapter_status()

        class Visible(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))

        t = torch.zeros(2, 3)
        b = tw.GuardBuilder({"t": t})
        b.tensor_match("L['t']")
        gs = b.build()
        assert gs.check({"t": t}) is True
        with Visible():
            assert gs.check({"t": t}) is False
            f = gs.why_not({"t": t})
            assert f is not None and "fails closed" in f.reason, f
        assert gs.check({"t": t}) is True
        print("ok")
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]

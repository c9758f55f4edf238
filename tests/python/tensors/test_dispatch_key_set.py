"""Dynamo's DISPATCH_KEY_SET_MATCH imported by guards_of as tripwire's native kind of that name
(torch's rule: the value's key set, with the checking thread's include/exclude sets applied and the
Python keys masked, equals the compiled set so applied; read in C++ through the torch adapter)
decides as the entry's guard_manager.check on DispatchKeySet locals and globals that differ in keys,
in type, under changed thread-local dispatch state, and after torch's root last ran under another
dispatch state (torch's own leaf reads the LocalState of its root's last check: called alone, as an
earlier import did, it passed a set its root fails). The kind itself: the builder, the fast pass and
the walk, the reference, the failure reason, a save/load round trip in a fresh process, and the
refusal without the adapter.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import reference
import tripwire as tw

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from torch_guard_managers import guard_manager_of, torch_decides  # noqa: E402
from tripwire.torch import guards_of  # noqa: E402

C = torch._C
DK = C.DispatchKey
tw.tensors.ensure_torch()
# The native kind reads through the torch adapter (the ASan build has none: there the importer
# falls back to its Python predicate, and the kind itself is refused).
NATIVE = tw._core.dispatch_key_set_reader_installed()
needs_adapter = pytest.mark.skipif(not NATIVE, reason="the torch adapter is not loaded in this build")


def local_fn(x: Any, ks: Any) -> Any:
    if ks.has(DK.CPU):
        return x + 1
    return x - 1


KS = C._dispatch_keys(torch.randn(2))


def global_fn(x: Any) -> Any:
    if KS.has(DK.AutogradCPU):
        return x * 2
    return x


class SubKeySet(C.DispatchKeySet):
    """Holds only CPU, and claims the compiled set's bits: neither torch nor tripwire asks it."""

    def raw_repr(self) -> int:
        return KS.raw_repr()

    def __or__(self, other: Any) -> Any:
        return KS


STATES: dict[str, Callable[[], Any]] = {
    "nothing": contextlib.nullcontext,
    "include_conjugate": lambda: C._IncludeDispatchKeyGuard(DK.Conjugate),
    "exclude_conjugate": lambda: C._ExcludeDispatchKeyGuard(C.DispatchKeySet(DK.Conjugate)),
}


def values(ks: Any) -> dict[str, Any]:
    return {
        "same": ks,
        "copy": C.DispatchKeySet.from_raw_repr(ks.raw_repr()),
        "minus_autocast": ks.remove(DK.AutocastCPU),  # excluded by default: torch passes it
        "plus_backend_select": ks.add(DK.BackendSelect),  # included by default: passes
        "plus_python": ks.add(DK.Python),  # masked: passes
        "plus_conjugate": ks.add(DK.Conjugate),
        "minus_autograd": ks.remove(DK.AutogradCPU),
        "meta": C._dispatch_keys(torch.empty(2, device="meta")),
        "subclass_lying": SubKeySet(DK.CPU),
        # Not a DispatchKeySet (an int, None): torch's pybind cast throws inside its root check,
        # which then skips restoring the torch-function state it disabled for the accessors
        # (the thread is left with torch functions ALL_DISABLED). Not tried against torch here;
        # tripwire fails them (test_non_key_sets_fail).
    }


@contextlib.contextmanager
def stale_root(gm: Any, L: dict, state: str) -> Iterator[None]:
    """torch's root last checked under `state` (its LocalState now holds that state)."""
    with STATES[state]():
        torch_decides(gm, L)
    yield


def test_local_dispatch_key_set_decides_as_torch() -> None:
    x = torch.randn(3)
    gm = guard_manager_of(local_fn, x, KS)
    gs = guards_of(local_fn)
    (rec,) = [g for g in gs.torch_import.guards if g.kind == "DISPATCH_KEY_SET_MATCH"]
    assert rec.outcome == "native"
    kinds = [gs.guards[i].kind for i in rec.guards]
    if NATIVE:
        assert kinds == [tw.GuardKind.DISPATCH_KEY_SET_MATCH], kinds
        assert "apply_local_dispatch_keys(L['ks']) == DispatchKeySet(" in gs.explain()
    else:
        assert kinds == [tw.GuardKind.LAMBDA] and "torch's rule in Python" in rec.why, (kinds, rec.why)
    checked = set()
    for stale in STATES:
        for state in STATES:
            for name, v in values(KS).items():
                L = {"x": x, "ks": v}
                with stale_root(gm, {"x": x, "ks": KS}, stale), STATES[state]():
                    ours = gs.check(L)
                    assert reference.check(gs.guards, L, local_fn.__globals__) == ours, (stale, state, name)
                    assert ours == torch_decides(gm, L), (stale, state, name)
                checked.add(ours)
    assert checked == {True, False}


def test_stale_local_state_false_pass_is_gone() -> None:
    """The case torch's leaf alone got wrong: after a root check with Conjugate excluded, a set
    carrying Conjugate checked with nothing excluded must fail, as torch's root decides."""
    x = torch.randn(3)
    gm = guard_manager_of(local_fn, x, KS)
    gs = guards_of(local_fn)
    with STATES["exclude_conjugate"]():
        gm.check({"x": x, "ks": KS})
    L = {"x": x, "ks": KS.add(DK.Conjugate)}
    assert gs.check(L) is False
    assert gm.check(L) is False


def test_global_dispatch_key_set_decides_as_torch() -> None:
    global KS
    x = torch.randn(3)
    old = KS
    try:
        gm = guard_manager_of(global_fn, x)
        gs = guards_of(global_fn)
        assert [g.outcome for g in gs.torch_import.guards if g.kind == "DISPATCH_KEY_SET_MATCH"] == ["native"]
        for name, v in values(old).items():
            KS = v
            for state in STATES:
                with STATES[state]():
                    assert gs.check({"x": x}) == torch_decides(gm, {"x": x}), (name, state)
    finally:
        KS = old


def test_non_key_sets_fail() -> None:
    x = torch.randn(3)
    guard_manager_of(local_fn, x, KS)
    gs = guards_of(local_fn)
    for v in (KS.raw_repr(), None, "CPU", object()):
        assert gs.check({"x": x, "ks": v}) is False
        assert reference.check(gs.guards, {"x": x, "ks": v}, local_fn.__globals__) is False


# -- the kind itself ----------------------------------------------------------------------------------
def _built(expected: Any = None) -> Any:
    b = tw.GuardBuilder({"ks": KS})
    b.dispatch_key_set_match("L['ks']", expected=expected)
    return b.build()


@needs_adapter
def test_builder_reads_the_applied_set_and_both_paths_decide_as_the_reference() -> None:
    gs = _built()
    (spec,) = gs.guards
    applied = reference._applied_key_set(KS)  # the thread's sets applied: not KS's raw bits
    assert applied != KS.raw_repr()
    assert spec.kind is tw.GuardKind.DISPATCH_KEY_SET_MATCH and spec.args == (applied,)
    assert gs._uses_fast_pass
    outcomes = set()
    for state in STATES:
        for name, v in values(KS).items():
            with STATES[state]():
                ref = reference.check(gs.guards, {"ks": v}, {})
                assert gs.check({"ks": v}) is ref, (state, name)
                assert (gs.why_not({"ks": v}) is None) is ref, (state, name)
                outcomes.add(ref)
    assert outcomes == {True, False}
    for v in (KS.raw_repr(), None, "CPU", object(), torch.randn(2)):
        assert gs.check({"ks": v}) is False
        assert reference.check(gs.guards, {"ks": v}, {}) is False


class FakeClass:
    """Claims DispatchKeySet as its __class__ (isinstance would believe it): not one."""

    __class__ = C.DispatchKeySet  # type: ignore[assignment]

    def raw_repr(self) -> int:
        return KS.raw_repr()


@needs_adapter
def test_hostile_values_fail_as_in_the_reference() -> None:
    gs = _built()
    never_built = C.DispatchKeySet.__new__(C.DispatchKeySet)  # no C++ value: __init__ never ran
    for v in (never_built, FakeClass(), SubKeySet(DK.CPU), C.DispatchKeySet):
        assert gs.check({"ks": v}) is False, v
        assert reference.check(gs.guards, {"ks": v}, {}) is False
        f = gs.why_not({"ks": v})
        assert f is not None and f.kind == "DISPATCH_KEY_SET_MATCH"


@needs_adapter
def test_each_thread_applies_its_own_state() -> None:
    import threading

    gs = _built()
    seen: dict[str, tuple[bool, bool]] = {}

    def run(name: str) -> None:
        with STATES[name]():
            seen[name] = (gs.check({"ks": KS}), gs.check({"ks": KS.add(DK.Conjugate)}))

    with C._ExcludeDispatchKeyGuard(C.DispatchKeySet(DK.ADInplaceOrView)):
        assert gs.check({"ks": KS}) is False  # this thread's exclusion: another thread's check
        for name in STATES:
            t = threading.Thread(target=run, args=(name,))
            t.start()
            t.join()
    # Each thread applies its own sets (not this thread's ADInplaceOrView exclusion): included,
    # Conjugate is added to both; excluded, it is removed from `ks | Conjugate`.
    assert seen == {
        "nothing": (True, False),
        "include_conjugate": (False, False),
        "exclude_conjugate": (True, True),
    }, seen


@needs_adapter
def test_builder_refuses_non_key_sets_and_bad_bits() -> None:
    b = tw.GuardBuilder({"ks": 3})
    with pytest.raises(tw.GuardBuildError, match=r"is not a torch\._C\.DispatchKeySet"):
        b.dispatch_key_set_match("L['ks']")
    with pytest.raises(TypeError, match="raw bits"):
        tw.GuardBuilder({}).dispatch_key_set_match("L['ks']", expected=-1)


@needs_adapter
def test_python_keys_are_masked_as_torch_masks_them() -> None:
    """A set carrying the Python key matches one without it: torch's guards mask the Python keys
    unless a dispatch mode without ignore_compile_internals is active."""
    gs = _built()
    with_python = KS.add(DK.Python)
    assert gs.check({"ks": with_python}) is True
    import torch.utils._python_dispatch as pd
    from torch._C._dynamo.guards import set_is_in_mode_without_ignore_compile_internals as set_flag

    # torch's guards read its C++ per-thread flag (the engine reads it through the adapter); the
    # reference reads the module global it is set from: set both, as entering a mode does.
    old = pd._is_in_any_mode_without_ignore_compile_internals
    pd._is_in_any_mode_without_ignore_compile_internals = True
    set_flag(True)
    try:
        assert gs.check({"ks": with_python}) is False
        assert reference.check(gs.guards, {"ks": with_python}, {}) is False
        assert gs.check({"ks": KS}) is True
    finally:
        set_flag(bool(old))
        pd._is_in_any_mode_without_ignore_compile_internals = old


@contextlib.contextmanager
def _flag_hidden() -> Iterator[None]:
    """As if torch's per-thread mode-flag getter had not been found (a stripped libtorch_python.so)."""
    was = tw._core.testing.hide_torch_mode_flag(True)
    try:
        yield
    finally:
        tw._core.testing.hide_torch_mode_flag(was)


@needs_adapter
def test_without_torch_flag_a_set_with_python_keys_fails_closed() -> None:
    """Without torch's flag the masked and unmasked sets differ, so whether a set with a Python key
    matches depends on a flag tripwire cannot read: it fails, saying why; the builder refuses such
    an example; a set without Python keys is decided as before."""
    from torch._C._dynamo.guards import set_is_in_mode_without_ignore_compile_internals as set_flag

    gs = _built()
    with_python = KS.add(DK.Python)
    with _flag_hidden():
        assert tw._core._masks_python_keys() is None
        for flag in (False, True):  # torch: True with the flag clear, False with it set
            set_flag(flag)
            try:
                assert gs.check({"ks": with_python}) is False
                f = gs.why_not({"ks": with_python})
                assert f is not None and "could not be found" in f.reason and "fails closed" in f.reason, (
                    f.reason
                )
                assert gs.check({"ks": KS}) is True
            finally:
                set_flag(False)
        with pytest.raises(
            tw.GuardBuildError, match="flag, which decides whether torch masks it, was not found"
        ):
            tw.GuardBuilder({"ks": with_python}).dispatch_key_set_match("L['ks']")


def test_the_python_predicate_without_torch_flag_fails_closed() -> None:
    """The importer's Python form (the path without the adapter) decides the same way."""
    from tripwire.torch._torch_leaves import DispatchKeySetMatch, _applied_keys

    match = DispatchKeySetMatch(_applied_keys(torch, KS))
    with_python = KS.add(DK.Python)
    assert match(with_python) is True and match(KS) is True
    with _flag_hidden():
        assert _applied_keys(torch, with_python) is None
        assert match(with_python) is False
        assert match(KS) is True


@needs_adapter
def test_reason_names_the_keys_that_differ() -> None:
    gs = _built()
    f = gs.why_not({"ks": KS.add(DK.Conjugate).remove(DK.AutogradCPU)})
    assert f is not None and f.kind == "DISPATCH_KEY_SET_MATCH"
    assert "extra Conjugate" in f.reason and "missing AutogradCPU" in f.reason, f.reason
    with C._ExcludeDispatchKeyGuard(C.DispatchKeySet(DK.ADInplaceOrView)):
        f = gs.why_not({"ks": KS})
    assert f is not None and "missing ADInplaceOrView" in f.reason, f.reason
    f = gs.why_not({"ks": 7})
    assert f is not None and "not a DispatchKeySet" in f.reason, f.reason


@needs_adapter
def test_round_trip_in_a_fresh_process() -> None:
    gs = _built()
    data = gs.to_bytes()
    code = textwrap.dedent(
        f"""
        import torch, tripwire as tw
        C, DK = torch._C, torch._C.DispatchKey
        ks = C._dispatch_keys(torch.randn(2))
        gs = tw.GuardSet.from_bytes({data!r})
        (spec,) = gs.guards
        assert spec.kind is tw.GuardKind.DISPATCH_KEY_SET_MATCH and spec.args == ({gs.guards[0].args[0]},), spec
        assert gs.check({{"ks": ks}}) is True
        assert gs.check({{"ks": ks.add(DK.Conjugate)}}) is False
        with C._ExcludeDispatchKeyGuard(C.DispatchKeySet(DK.ADInplaceOrView)):
            assert gs.check({{"ks": ks}}) is False
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@needs_adapter
def test_refused_without_the_adapter() -> None:
    data = _built().to_bytes()
    code = textwrap.dedent(
        f"""
        import sys, warnings
        sys.modules["tripwire._torch_adapter"] = None  # the adapter does not load
        import torch, tripwire as tw
        warnings.simplefilter("ignore")
        assert tw.tensors.ensure_torch() and not tw._core.torch_adapter_installed()
        try:
            tw.GuardBuilder({{"ks": torch._C._dispatch_keys(torch.randn(2))}}).dispatch_key_set_match("L['ks']")
        except tw.GuardBuildError as e:
            assert "needs the torch adapter" in str(e), e
        else:
            raise AssertionError("built without the adapter")
        try:
            tw.GuardSet.from_bytes({data!r})
        except Exception as e:
            assert "needs the torch adapter" in str(e), e
        else:
            raise AssertionError("loaded without the adapter")
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr

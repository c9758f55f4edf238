"""STORAGE_OVERLAPPING: torch 2.13's relation over the storage ranges of a group of tensors (the
tensors that overlapped another at compile time must still, the others must not), decided by
torch's own rule (guards.cpp ``tensors_definitely_do_not_overlap<StaticMeta>``: storage offset,
numel, contiguity, sizes and strides; the storages themselves are not compared).

Oracles: the pure-Python reference on generated views (1-D slices, strided, transposed, empty,
torch's 2-D "shampoo" rows, fresh tensors, non-tensors), and torch's own guard manager on a real
``aot_eager`` compile with ``dynamic=True`` of a function that mutates one of several overlapping
views (the only way torch 2.13 emits the guard), imported with ``guards_of`` and round-tripped.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap

import pytest

import reference
import tripwire as tw
from gc_stress import scaled
from tripwire import GuardBuilder
from tripwire.catalogue import GuardKind, GuardSpec

torch = pytest.importorskip("torch")

from torch._dynamo.eval_frame import _debug_get_cache_entry_list  # noqa: E402

pytestmark = pytest.mark.torch

tw.tensors.ensure_torch()
# These read only through the torch adapter (the ASan build has none: there a set is refused).
needs_adapter = pytest.mark.skipif(
    not tw._core.torch_adapter_installed(), reason="the torch adapter is not loaded in this build"
)


class _Dispatching(torch.Tensor):
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError("the engine must not ask")


def _triples() -> list[tuple]:
    base = torch.arange(40.0)
    grid = torch.arange(64.0).reshape(8, 8)
    out = [
        (base[0:6], base[4:10], base[12:18]),  # a, b overlap; c apart
        (base[0:6], base[6:12], base[12:18]),  # touching, not overlapping
        (base[0:6], base[0:6], base[20:26]),  # same range, different views
        (torch.randn(6), torch.randn(6), torch.randn(6)),  # fresh storages: offsets 0 "overlap"
        (base[0:12:2], base[1:13:2], base[30:36]),  # interleaved strided views
        (base[0:0], base[0:6], base[3:9]),  # an empty one never overlaps
        (grid[:, 0:4], grid[:, 4:8], grid[:, 2:6]),  # torch's 2-D same-stride rows
        (grid[:, 0:3], grid[:, 5:8], grid[0:2, :]),
        (grid.t(), grid[0:1, :], base[0:4]),
        (base[10:16], base[0:6], base[5:11]),
    ]
    shared = torch.randn(6)
    out.append((shared, shared, base[0:6]))  # one object twice (is_same)
    out.append((base[0:6], 3, base[20:26]))  # a non-tensor
    wrapper = torch.Tensor._make_wrapper_subclass(_Dispatching, (6,), dispatch_sizes_strides_policy="sizes")
    out.append((wrapper, base[0:6], base[20:26]))  # its metadata is Python code: never read (fails)
    return out


def _sets() -> list:
    """Every partition of (a, b, c) into overlapping / non-overlapping, in every order (built
    unchecked: the builder refuses a set that fails on its example)."""
    names = [tw.Source.local(n) for n in "abc"]
    out = []
    for perm in itertools.permutations(names):
        for n_over in (0, 2, 3):
            spec = GuardSpec(GuardKind.STORAGE_OVERLAPPING, perm[0], (tuple(perm[1:]), n_over), 0, ())
            out.append(tw.GuardSet([spec], None, None))
    return out


@needs_adapter
def test_engine_equals_reference_on_views_and_non_tensors() -> None:
    sets = _sets()
    seen = {True: 0, False: 0}
    for _ in range(scaled(2, 2)):
        for t in _triples():
            L = dict(zip("abc", t, strict=True))
            for gs in sets:
                got = gs.check(L)
                assert got == reference.check(gs.guards, L), (gs.guards[0], t)
                seen[got] += 1
    assert seen[True] >= 10 and seen[False] >= 10, seen


@needs_adapter
def test_builder_printing_explain_why_not_and_round_trip() -> None:
    base = torch.arange(20.0)
    L = {"a": base[0:6], "b": base[4:10], "c": base[12:18]}
    b = GuardBuilder(L)
    b.storage_overlapping(overlapping=["L['a']", "L['b']"], non_overlapping=["L['c']"])
    gs = b.build()
    text = "check_overlapping(overlapping=[L['a'], L['b']], non_overlapping=[L['c']])"
    assert gs.check(L) and text in gs.explain()
    moved = {**L, "b": base[6:12]}
    assert not gs.check(moved)
    why = str(gs.why_not(moved))
    assert "STORAGE_OVERLAPPING" in why and text in why
    loaded = tw.GuardSet.from_bytes(gs.to_bytes())
    assert loaded.guards[0].args == gs.guards[0].args
    for t in _triples():
        M = dict(zip("abc", t, strict=True))
        assert loaded.check(M) == gs.check(M)
    with pytest.raises(tw.GuardBuildError):
        GuardBuilder(L).storage_overlapping(overlapping=["L['a']"], non_overlapping=["L['c']"])
    with pytest.raises(tw.GuardBuildError):
        GuardBuilder(L).storage_overlapping(overlapping=["L['a']", "L['a']"])


def f_mutates_views(a, b, c):
    a.add_(1)
    return a + b.sum() + c.sum()


@needs_adapter
def test_guards_of_imports_storage_overlapping_and_decides_as_torch() -> None:
    torch._dynamo.reset()
    base = torch.randn(20)
    torch.compile(f_mutates_views, backend="aot_eager", dynamic=True)(base[0:6], base[4:10], base[12:18])
    gm = _debug_get_cache_entry_list(f_mutates_views.__code__)[0].guard_manager
    gs = tw.torch.guards_of(f_mutates_views)
    records = [g for g in gs.torch_import.guards if g.kind == "STORAGE_OVERLAPPING"]
    # One record per tensor node (torch's two leaves, overlapping and not, print the same code).
    assert len(records) == 3 and all(g.outcome == "native" for g in records), records
    assert len({g.guards for g in records}) == 1, "torch's two leaves share one tripwire guard"
    loaded = tw.GuardSet.from_bytes(gs.to_bytes())
    decisions = {True: 0, False: 0}
    by_overlap_only = 0
    fresh = torch.randn(20)
    starts = range(0, 15, 2 if scaled(50) == 50 else 7)  # fewer under --gc-stress
    for i, j, k in itertools.product(starts, starts, starts):
        L = {"a": fresh[i : i + 6], "b": fresh[j : j + 6], "c": fresh[k : k + 6]}
        want = gm.check(L)
        assert gs.check(L) == want == loaded.check(L), (i, j, k)
        decisions[want] += 1
        if not want:
            failures = gs.failures(L) if hasattr(gs, "failures") else [gs.why_not(L)]
            if all("STORAGE_OVERLAPPING" in str(f) for f in failures):
                by_overlap_only += 1
    assert decisions[True] and decisions[False], decisions
    assert by_overlap_only, "some inputs fail on the overlap relation alone"


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _saved_sets() -> tuple[bytes, bytes]:
    """A STORAGE_OVERLAPPING set, and a set whose only guard reads a C++ tensor step (no tensor
    kind that would switch torch support on by itself)."""
    base = torch.arange(20.0)
    L = {"a": base[0:6], "b": base[4:10], "c": base[12:18]}
    b = GuardBuilder(L)
    b.storage_overlapping(overlapping=["L['a']", "L['b']"], non_overlapping=["L['c']"])
    b2 = GuardBuilder({"x": torch.zeros(8, 3)})
    b2.equals(tw.Source.local("x").tensor_size(0), 8)
    return b.build().to_bytes(), b2.build().to_bytes()


@needs_adapter
def test_loads_in_a_fresh_process_before_torch_support_is_on() -> None:
    """A fresh process that imported torch but never switched tripwire's torch support on: the
    load sees the adapter-only guards (the C++ pass reports them: STORAGE_OVERLAPPING was missing
    from the loader's kinds, and a C++ tensor step under EQUALS was never seen, so both were
    refused as "needs the torch adapter" although the adapter was there) and switches it on."""
    overlap, step = _saved_sets()
    r = _run(
        f"""
        import torch, tripwire as tw
        assert tw.tensors._torch_status is None and not tw._core.torch_adapter_installed()
        gs = tw.GuardSet.from_bytes({overlap!r})
        assert tw._core.torch_adapter_installed()
        base = torch.arange(20.0)
        L = {{"a": base[0:6], "b": base[4:10], "c": base[12:18]}}
        assert gs.check(L) is True
        assert gs.check({{**L, "b": base[6:12]}}) is False
        assert gs.check({{**L, "c": base[2:8]}}) is False
        gs2 = tw.GuardSet.from_bytes({step!r})
        assert gs2.check({{"x": torch.zeros(8, 3)}}) is True
        assert gs2.check({{"x": torch.zeros(9, 3)}}) is False
        print("ok")
        """
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_refused_without_the_adapter_leaving_no_half_built_set() -> None:
    """Without the adapter (it does not load) the loader and the importer's set refuse
    STORAGE_OVERLAPPING with an error saying why, and the refused construction leaves no
    instance behind: nothing in the traceback holds one, none is alive after a collection, and
    no nanobind "uninitialized instance" warning (an error here: -W error) comes from printing
    the traceback with its locals. (The saved sets need the adapter to be made: in a build
    without it, the ASan build, only the constructors are tried.)"""
    blobs = _saved_sets() if tw._core.torch_adapter_installed() else ()
    r = _run(
        f"""
        import gc, sys, traceback, warnings
        sys.modules["tripwire._torch_adapter"] = None  # the adapter does not load
        import torch, tripwire as tw
        from tripwire.catalogue import GuardKind, GuardSpec
        from tripwire.torch._imported import ImportedGuardSet
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ensure_torch's "the adapter did not load"
            assert tw.tensors.ensure_torch() and not tw._core.torch_adapter_installed()
        names = [tw.Source.local(n) for n in "abc"]
        spec = GuardSpec(GuardKind.STORAGE_OVERLAPPING, names[0], (tuple(names[1:]), 2), 0, ())
        attempts = [
            (lambda: ImportedGuardSet([spec], None, None), tw.GuardBuildError),
            (lambda: tw.GuardSet([spec]), tw.GuardBuildError),
            *((lambda blob=blob: tw.GuardSet.from_bytes(blob), tw.FormatError) for blob in {blobs!r}),
        ]
        assert len(attempts) == {2 + len(blobs)}
        for make, error in attempts:
            try:
                make()
            except error as e:
                assert "torch adapter" in str(e), e
                text = "".join(traceback.TracebackException.from_exception(e, capture_locals=True).format())
                tb = e.__traceback__
                while tb is not None:
                    held = [v for v in tb.tb_frame.f_locals.values() if isinstance(v, tw._core.GuardSetCore)]
                    assert not held, (tb.tb_frame.f_code.co_name, text)
                    tb = tb.tb_next
            else:
                raise AssertionError("built without the adapter")
        gc.collect()
        assert not [o for o in gc.get_objects() if isinstance(o, tw._core.GuardSetCore)]
        print("ok")
        """
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]

"""TENSOR_MATCH and DIMENSION_MARKING: the engine against the reference and against torch's own guards.

Tensors are generated over float/int/bool/complex dtypes, requires_grad, views (transposed, sliced,
expanded with zero strides), Parameter vs Tensor, conjugate and negative views, inference-mode
tensors, meta and sparse tensors, 0-d and zero-size shapes, mark_dynamic'd tensors. Every guard set
is checked through the torch adapter and through the Python reader, with the fast pass on and off,
and torch's own TENSOR_MATCH (a RootGuardManager leaf built from the same example) must decide as
tripwire does, including under thread-local dispatch changes (autocast, dispatch modes, include
and exclude guards).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference
import tripwire as tw
from engine_switches import assert_passes_on_the_fast_pass, switches
from gc_stress import examples, hit_every_allocation, scaled
from tripwire import _core

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from torch._C._dynamo import guards as torch_guards  # noqa: E402
from torch._dynamo.guards import GuardManagerType  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

tw.tensors.ensure_torch()
ADAPTER = _core.torch_adapter_installed()


def test_adapter_is_built_here() -> None:
    """CI builds the adapter wherever torch imports (scripts/setup); say so loudly if not."""
    assert ADAPTER, f"the torch adapter is not in use: {tw.tensors.adapter_status()}"


# -- generated tensors ------------------------------------------------------------------------------
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8,
          torch.int8, torch.bool, torch.complex64, torch.complex128]  # fmt: skip
VIEWS = ["plain", "transpose", "slice", "expand", "conj", "neg", "parameter", "inference", "meta", "sparse",
         "requires_grad", "marked", "offset"]  # fmt: skip


class Sub(torch.Tensor):
    """A tensor subclass with a lying dtype property (the engine reads C fields, never this)."""

    @property
    def dtype(self) -> Any:  # type: ignore[override]
        raise AssertionError("a subclass property was consulted")


def make_tensor(dtype: Any, shape: tuple[int, ...], view: str) -> Any:
    t = torch.zeros(shape, dtype=dtype)
    if view == "transpose" and t.dim() >= 2:
        return t.transpose(0, 1)
    if view == "slice" and t.dim() >= 1:
        return torch.zeros((shape[0] * 2, *shape[1:]), dtype=dtype)[::2]
    if view == "expand" and t.dim() >= 1:
        return torch.zeros((1, *shape[1:]), dtype=dtype).expand(shape)
    if view == "conj" and dtype.is_complex:
        return t.conj()
    if view == "neg" and dtype.is_complex:
        return torch._neg_view(t)
    if view == "parameter" and (dtype.is_floating_point or dtype.is_complex):
        return torch.nn.Parameter(t)
    if view == "requires_grad" and (dtype.is_floating_point or dtype.is_complex):
        return t.requires_grad_()
    if view == "inference":
        with torch.inference_mode():
            return torch.zeros(shape, dtype=dtype)
    if view == "meta":
        return torch.zeros(shape, dtype=dtype, device="meta")
    if view == "sparse" and t.dim() >= 1 and dtype not in (torch.bool, torch.float16, torch.bfloat16):
        return t.to_sparse()
    if view == "marked" and t.dim() >= 1:
        torch._dynamo.mark_dynamic(t, 0)
        return t
    if view == "offset" and t.dim() >= 1:
        return torch.zeros((shape[0] + 1, *shape[1:]), dtype=dtype)[1:]
    if view == "sub":
        return t.as_subclass(Sub)
    return t


@st.composite
def tensors(draw: st.DrawFn) -> Any:
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
    return make_tensor(dtype, shape, draw(st.sampled_from(VIEWS)))


def variants(t: Any) -> list[Any]:
    """Tensors close to ``t``: copies, views, other dtypes, shapes, flags, devices, types."""
    out = [t]
    with torch.no_grad():
        base = t.detach() if t.layout == torch.strided else t.to_dense().detach()
        out.append(base.clone())
        out.append(base.contiguous())
        if base.dim():
            out.append(base[:0])
            out.append(torch.cat([base, base]))
            out.append(base.unsqueeze(0))
        if base.dim() >= 2:
            out.append(base.transpose(0, 1))
        if not base.dtype.is_complex:
            out.append(base.to(torch.float64 if base.dtype != torch.float64 else torch.float32))
        if base.dtype.is_floating_point:
            out.append(base.clone().requires_grad_())
            out.append(torch.nn.Parameter(base.clone()))
        if base.dtype.is_complex:
            out.append(base.conj())
        with torch.inference_mode():
            out.append(torch.zeros(base.shape, dtype=base.dtype))
        out.append(torch.zeros(base.shape, dtype=base.dtype, device="meta"))
        out.append(base.clone().as_subclass(Sub))
        out.append([1, 2])
    return out


def torch_tensor_match(example: Any, exp: tw.tensors.TensorExpectation) -> Any:
    """torch's own TENSOR_MATCH leaf, built from the same example with the same unchecked dims."""
    root = torch_guards.RootGuardManager()
    m = root.getitem_manager(
        key="t", source="L['t']", example_value=example, guard_manager_enum=GuardManagerType.GUARD_MANAGER
    )
    m.add_tensor_match_guard(
        example, list(exp.sizes), list(exp.strides), "L['t']", ["tm"], None, type(example),
        torch._C._dispatch_keys(example),
    )  # fmt: skip
    return root


def check_all_ways(gs_adapter: tw.GuardSet, gs_python: tw.GuardSet, L: dict) -> bool:
    expected = reference.check(gs_adapter.guards, L)
    for gs in (gs_adapter, gs_python):
        for fast in (True, False):
            with switches(fast=fast):
                assert gs.check(L) == expected, (L, fast, gs.explain())
    why = gs_adapter.why_not(L)
    assert (why is None) == expected
    if why is not None:
        first = reference.first_failure(gs_adapter.guards, L)
        assert first is not None and first[0].index == why.guard.index
    return expected


@settings(max_examples=examples(300), **_SETTINGS)
@given(tensors(), st.data())
def test_tensor_match_matches_the_reference_and_torch(t: Any, data: st.DataObject) -> None:
    ndim = t.dim()
    dynamic = data.draw(st.sets(st.integers(0, ndim - 1), max_size=ndim)) if ndim else set()
    offset = data.draw(st.booleans())
    built = []
    for python in (False, True):
        with switches(python=python):
            b = tw.GuardBuilder({"t": t})
            spec = b.tensor_match("L['t']", dynamic=dynamic, storage_offset=offset)
            b.dimension_marking("L['t']")
            built.append(b.build())
    gs_adapter, gs_python = built
    assert gs_adapter._guard_path(0) == ("native" if ADAPTER else "python")
    assert gs_python._guard_path(0) == "python"
    ours = torch_tensor_match(t, spec.args[1])
    others = data.draw(st.lists(tensors(), max_size=2))
    for v in variants(t) + others:
        L = {"t": v}
        got = check_all_ways(gs_adapter, gs_python, L)
        # torch does not check the storage offset, nor the markings here.
        tm_only = reference.check([g for g in gs_adapter.guards if g.kind.name == "TENSOR_MATCH"], L)
        if not offset:
            assert ours.check(L) == tm_only, (t, v)
        assert got == (tm_only and reference.check(gs_adapter.guards[1:], L))


@pytest.mark.parametrize(
    "context",
    [
        pytest.param(lambda: torch.autocast("cpu"), id="autocast"),
        pytest.param(
            lambda: torch._C._IncludeDispatchKeyGuard(torch._C.DispatchKey.Python), id="include-python"
        ),
        pytest.param(
            lambda: torch._C._ExcludeDispatchKeyGuard(
                torch._C.DispatchKeySet(torch._C.DispatchKey.ADInplaceOrView)
            ),
            id="exclude-adinplace",
        ),
        pytest.param(
            lambda: torch._C._ExcludeDispatchKeyGuard(
                torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradCPU)
            ),
            id="exclude-autograd",
        ),
        pytest.param(lambda: torch.inference_mode(), id="inference-mode"),
        pytest.param(lambda: torch.no_grad(), id="no-grad"),
        pytest.param(lambda: PlainMode(), id="dispatch-mode"),
        pytest.param(lambda: VisibleMode(), id="dispatch-mode-visible"),
        pytest.param(lambda: torch._C.DisableTorchFunction(), id="torch-function-disabled"),
    ],
)
def test_thread_local_dispatch_state_as_torch_decides(context: Callable[[], Any]) -> None:
    """The key set is compared after the thread-local include/exclude sets (and the Python-key
    mask): tripwire decides as torch's own TENSOR_MATCH, inside and outside the context, for guards
    built inside and outside it."""
    tensors_ = [
        torch.zeros(2, 3),
        torch.zeros(2, 3, dtype=torch.complex64).conj(),
        torch.nn.Parameter(torch.zeros(3)),
    ]
    for built_inside in (False, True):
        for t in tensors_:
            ctx = context() if built_inside else contextlib.nullcontext()
            with ctx:
                b = tw.GuardBuilder({"t": t})
                spec = b.tensor_match("L['t']")
                gs = b.build()
                theirs = torch_tensor_match(t, spec.args[1])
                with switches(python=True):
                    b2 = tw.GuardBuilder({"t": t})
                    b2.tensor_match("L['t']", expected=spec.args[1], type=type(t))
                    gs_py = b2.build()
            for inside in (False, True):
                with context() if inside else contextlib.nullcontext():
                    for v in (t, t.detach().clone()):
                        want = theirs.check({"t": v})
                        assert gs.check({"t": v}) == want, (built_inside, inside)
                        assert gs_py.check({"t": v}) == want, (built_inside, inside)
                        assert reference.check(gs.guards, {"t": v}) == want


class PlainMode(TorchDispatchMode):
    """A dispatch mode that ignores compile internals (torch masks the Python keys)."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class VisibleMode(TorchDispatchMode):
    """A dispatch mode without ignore_compile_internals: torch stops masking the Python keys."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_reasons_name_every_field() -> None:
    b = tw.GuardBuilder({"x": torch.zeros(4, 8)})
    b.tensor_match("L['x']")
    gs = b.build()
    f = gs.why_not({"x": torch.zeros(5, 8, dtype=torch.float16)})
    assert f.kind == "TENSOR_MATCH" and f.source == "L['x']"
    assert f.reason.startswith("L['x']: TENSOR_MATCH ")
    assert "size[0] expected 4, got 5" in f.reason
    assert "dtype expected float32, got float16" in f.reason
    f = gs.why_not({"x": torch.zeros(4, 8, requires_grad=True)})
    assert "requires_grad expected False, got True" in f.reason
    f = gs.why_not({"x": torch.zeros(4, 8, device="meta")})
    assert "dispatch keys expected" in f.reason and "device expected cpu, got meta" in f.reason
    f = gs.why_not({"x": torch.zeros(8, 4).t()})
    assert "stride[0] expected 8, got 1" in f.reason and "stride[1] expected 1, got 4" in f.reason
    f = gs.why_not({"x": torch.nn.Parameter(torch.zeros(4, 8))})
    assert "type expected torch.Tensor, got torch.nn.parameter.Parameter" in f.reason
    f = gs.why_not({"x": torch.zeros(4, 8, 1)})
    assert "ndim expected 2, got 3" in f.reason


def test_storage_offset_is_opt_in() -> None:
    base = torch.zeros(10)
    b = tw.GuardBuilder({"x": base[0:4]})
    b.tensor_match("L['x']")
    lax = b.build()
    b = tw.GuardBuilder({"x": base[0:4]})
    b.tensor_match("L['x']", storage_offset=True)
    strict = b.build()
    assert lax.check({"x": base[1:5]})  # as torch: base[1:5] passes a guard built on base[0:4]
    assert not strict.check({"x": base[1:5]})
    assert "storage_offset expected 0, got 1" in strict.why_not({"x": base[1:5]}).reason


def test_explain_names_the_path() -> None:
    b = tw.GuardBuilder({"x": torch.zeros(2)})
    b.tensor_match("L['x']")
    assert ("[torch adapter]" if ADAPTER else "[python reader") in b.build().explain()
    with switches(python=True):
        gs = b.build()
    assert "[python reader: no torch adapter]" in gs.explain()
    assert not gs._uses_fast_pass


def test_adapter_path_runs_in_the_fast_pass() -> None:
    if not ADAPTER:
        pytest.skip(tw.tensors.adapter_status())
    xs = {f"x{i}": torch.zeros(i + 1, 3) for i in range(8)}
    gs = tw.guards_for(xs)
    assert gs._uses_fast_pass
    n = gs._fast_pass_count
    for _ in range(10):
        assert gs.check(xs)
    assert gs._fast_pass_count == n + 10


def test_adapter_and_python_reader_read_the_same_fields() -> None:
    if not ADAPTER:
        pytest.skip(tw.tensors.adapter_status())
    for view in VIEWS + ["sub"]:
        for dtype in DTYPES:
            t = make_tensor(dtype, (2, 3), view)
            assert _core.read_tensor_fields(t, True) == _core.read_tensor_fields(t, False), (view, dtype)


def _lie(func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
    """A __torch_function__ that answers every tensor read with a wrong value."""
    name = getattr(func, "__name__", "")
    lies = {"size": torch.Size([99]), "stride": (99,), "storage_offset": 99, "get_device": 99,
            "__get__": torch.float64}  # fmt: skip
    if name in lies:
        return lies[name]
    with torch._C.DisableTorchFunction():
        return func(*args, **(kwargs or {}))


class LyingMode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return _lie(func, types, args, kwargs)


class LyingSub(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return _lie(func, types, args, kwargs)


def test_python_reader_is_not_answered_by_torch_function() -> None:
    """The Python reader reads a plain tensor without DisableTorchFunction only when no
    torch-function mode is active; under a lying mode, and for a subclass with a lying
    __torch_function__, it reads the tensor's own fields."""
    t = torch.zeros(2, 3, dtype=torch.float32)
    want = tw.tensors._read_tensor(t)
    assert want is not None and want[1] == 6 and tuple(want[4]) == (2, 3)  # float32's code
    with LyingMode():
        assert torch.zeros(1).size() == (99,)  # the mode does lie
        got = tw.tensors._read_tensor(t)
        assert _core.read_tensor_fields(t, False) == _core.read_tensor_fields(t, ADAPTER)
    assert got == want
    p = torch.nn.Parameter(torch.zeros(2, 3))
    with LyingMode():
        assert tw.tensors._read_tensor(p)[1:] == (6, -1, True, (2, 3), (3, 1), 0)
    sub = torch.zeros(2, 3).as_subclass(LyingSub)
    assert sub.size() == (99,)  # the subclass does lie
    assert tw.tensors._read_tensor(sub)[1:] == want[1:]
    assert _core.read_tensor_fields(sub, False) == _core.read_tensor_fields(sub, ADAPTER)


@pytest.mark.parametrize("cap", [1, 256])
def test_python_reader_key_memo_follows_the_thread_local_sets(cap: int, monkeypatch: Any) -> None:
    """The Python reader's memo of (keys | include) - exclude answers as torch's operators do,
    in and out of contexts that change the thread-local sets, at any bound."""
    monkeypatch.setattr(tw.tensors, "_T_KEY_MEMO_MAX", cap)
    monkeypatch.setattr(tw.tensors, "_t_key_memo", {})  # the bound holds from an empty memo
    C = torch._C
    ts = [torch.zeros(2), torch.zeros(2, requires_grad=True), torch.zeros(1, dtype=torch.int64)]

    def direct(t: Any) -> int:
        return (
            (C._dispatch_keys(t) | C._dispatch_tls_local_include_set()) - C._dispatch_tls_local_exclude_set()
        ).raw_repr()

    contexts = [
        contextlib.nullcontext,
        torch.inference_mode,
        lambda: C._ExcludeDispatchKeyGuard(C.DispatchKeySet(C.DispatchKey.AutogradCPU)),
        lambda: C._IncludeDispatchKeyGuard(C.DispatchKey.Python),
        lambda: C._ExcludeDispatchKeyGuard(C.DispatchKeySet(C.DispatchKey.CPU)),
    ]
    seen = set()
    for _ in range(2):
        for context in contexts:
            with context():
                for t in ts:
                    got = tw.tensors._read_tensor(t)
                    assert got is not None and got[0] == direct(t)
                    seen.add(got[0])
            assert len(tw.tensors._t_key_memo) <= cap
    assert len(seen) >= 4  # the contexts did change the keys


def test_scalar_type_table_matches_the_adapter() -> None:
    """The name table the Python path uses (tensors._SCALAR_TYPE_NAMES) is c10::ScalarType's order."""
    if not ADAPTER:
        pytest.skip(tw.tensors.adapter_status())
    for code, name in enumerate(tw.tensors._SCALAR_TYPE_NAMES):
        d = getattr(torch, name, None)
        if type(d) is torch.dtype:
            assert _core.dtype_code(d) == code, name


def test_read_shape_interface() -> None:
    """runtime/tensors/readers.hpp read_shape, the C++ interface for other areas."""
    t = torch.zeros(10, 4)[2:5].t()
    if ADAPTER:
        assert _core.read_shape(t) == (2, (4, 3), (1, 4), 8, 1)
        assert _core.read_shape(torch.zeros(3).to_sparse()) == (1, (3,), None, 0, 1)
    else:
        assert _core.read_shape(t) in ("not applicable", "unavailable")
    assert _core.read_shape([1, 2]) == "not applicable"


# -- hostile inputs ---------------------------------------------------------------------------------
def test_impostors_and_subclasses() -> None:
    b = tw.GuardBuilder({"x": torch.zeros(2)})
    b.tensor_match("L['x']")
    gs = b.build()

    class Impostor:
        @property
        def __class__(self) -> type:
            return torch.Tensor

        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the engine asked an impostor for {name}")

    class Child(torch.Tensor):
        pass

    assert not gs.check({"x": Impostor()})
    assert not gs.check({"x": torch.zeros(2).as_subclass(Child)})
    assert gs.why_not({"x": Impostor()}).kind == "TENSOR_MATCH"
    b = tw.GuardBuilder({"x": torch.zeros(2).as_subclass(Sub)})
    b.tensor_match("L['x']")
    gs = b.build()  # reads C fields: Sub.dtype never runs
    assert gs.check({"x": torch.ones(2).as_subclass(Sub)})
    with pytest.raises(tw.GuardBuildError, match="not a torch tensor"):
        tw.GuardBuilder({"x": Impostor()}).tensor_match("L['x']")


def test_undefined_tensor_fails_cleanly() -> None:
    b = tw.GuardBuilder({"x": torch.zeros(2)})
    b.tensor_match("L['x']")
    gs = b.build()
    try:
        undefined = torch._C.TensorBase.__new__(torch.Tensor)
    except Exception:
        pytest.skip("torch does not create undefined tensors from Python")
    assert not gs.check({"x": undefined})
    assert gs.why_not({"x": undefined}).kind == "TENSOR_MATCH"


def test_tensor_freed_during_the_walk() -> None:
    """A property earlier in the walk drops the only reference to the tensor a later guard reads:
    the walk holds what it reads, and the answer is the reference's."""

    class Holder:
        def __init__(self) -> None:
            self.t = torch.zeros(3)

        @property
        def killer(self) -> int:
            self.t = torch.zeros(3)  # the old tensor loses its last reference here
            gc.collect()
            return 1

    h = Holder()
    b = tw.GuardBuilder({"h": h})
    b.equals("L['h'].killer")  # read first: frees the tensor L['h'].t held a moment ago
    b.tensor_match("L['h'].t")
    b.no_alias("L['h'].t", "L['h'].other")
    h.other = torch.zeros(3)
    gs = b.build()
    for _ in range(scaled(20)):
        h = Holder()
        h.other = torch.zeros(3)
        with switches(fast=False):
            assert gs.check({"h": h}) is True
        assert reference.check(gs.guards, {"h": h}) is True
        h.other = h.t
        # killer runs first and replaces t: other holds the old tensor, which the check keeps alive,
        # so it cannot share an address with the new t.
        assert gs.check({"h": h}) is True
        h.other = h.t
        assert reference.check(gs.guards, {"h": h}) is True


def test_huge_ndim() -> None:
    t = torch.zeros([1] * 64)
    b = tw.GuardBuilder({"t": t})
    b.tensor_match("L['t']", dynamic=True)
    gs = b.build()
    assert gs.check({"t": torch.zeros([1] * 64)})
    assert not gs.check({"t": torch.zeros([1] * 63)})
    exp = tw.tensors.TensorExpectation(0, 6, -1, False, (None,) * 1024, (None,) * 1024)
    b = tw.GuardBuilder({"t": t})
    b.tensor_match("L['t']", expected=exp, type=torch.Tensor)
    with pytest.raises(tw.GuardBuildError):  # fails on its own example: ndim 64 != 1024
        b.build()
    with pytest.raises(tw.GuardBuildError, match="more than"):
        tw.tensors.TensorExpectation(0, 6, -1, False, (None,) * 1025, (None,) * 1025)


def test_tensors_under_collections() -> None:
    xs = {f"x{i}": torch.zeros(i + 1) for i in range(scaled(20, 2))}
    gs = tw.guards_for(xs)
    for _ in range(scaled(50)):
        gc.collect()
        assert gs.check(xs)
        ys = dict(xs, x0=torch.zeros(7))
        assert not gs.check(ys)


# -- dimension markings against torch -----------------------------------------------------------------
MARKINGS = tw.tensors._MARKING_ATTRS


@st.composite
def marking_states(draw: st.DrawFn) -> dict[str, Any]:
    """A tensor's marking attributes: each absent or a small set; the flag present or not."""
    state: dict[str, Any] = {}
    for name in MARKINGS:
        if draw(st.booleans()):
            state[name] = set(draw(st.lists(st.integers(0, 2), max_size=3)))
    if draw(st.booleans()):
        state["_has_dynamo_dim_marking"] = True
    if "_dynamo_unbacked_indices" in state and draw(st.booleans()):
        state["_dynamo_shape_ids"] = draw(st.sampled_from([None, {0: "a"}, {0: "b"}]))
    return state


def marked(state: dict[str, Any]) -> Any:
    t = torch.zeros(3, 3, 3)
    for k, v in state.items():
        setattr(t, k, v)
    return t


@settings(max_examples=examples(300), **_SETTINGS)
@given(marking_states(), st.lists(marking_states(), min_size=1, max_size=4))
def test_dimension_marking_decides_as_torch(built: dict, runs: list[dict]) -> None:
    example = marked(built)
    b = tw.GuardBuilder({"t": example})
    spec = b.dimension_marking("L['t']")
    m = spec.args[0]
    try:
        gs = b.build()
    except tw.GuardBuildError:
        # torch's guard fails on its own example too (a flag without any marking attribute).
        assert built.get("_has_dynamo_dim_marking") and not any(k in built for k in MARKINGS)
        return
    root = torch_guards.RootGuardManager()
    expected_attrs = {n: set(s) for n, s in zip(MARKINGS, m.attrs, strict=True) if s is not None}
    absent = [n for n, s in zip(MARKINGS, m.attrs, strict=True) if s is None]
    dependent = {}
    if m.dependent:
        dependent = {
            "_dynamo_shape_ids": (m.shape_ids, "_dynamo_unbacked_indices"),
            "_dynamo_unbacked_bounds": (m.unbacked_bounds, "_dynamo_unbacked_indices"),
        }
    theirs = torch_guards.DIMENSION_DYNAMIC_MARKING_GUARD(
        root, expected_attrs, absent, dependent, ["dm"], None
    )
    for state in [built, *runs]:
        v = marked(state)
        want = theirs(v)
        for fast in (True, False):
            with switches(fast=fast):
                assert gs.check({"t": v}) == want, (built, state)
        assert reference.check(gs.guards, {"t": v}) == want
        if not want:
            assert gs.why_not({"t": v}).kind == "DIMENSION_MARKING"


def test_unmarked_tensors_take_the_fast_pass() -> None:
    b = tw.GuardBuilder({"t": torch.zeros(2)})
    b.dimension_marking("L['t']")
    gs = b.build()
    assert_passes_on_the_fast_pass(gs, {"t": torch.zeros(5)})
    t = torch.zeros(2)
    torch._dynamo.mark_dynamic(t, 0)
    assert not gs.check({"t": t})
    f = gs.why_not({"t": t})
    assert "marked (_has_dynamo_dim_marking) but was not when the guard was built" in f.reason


# -- EQUALS on torch's value-like objects -------------------------------------------------------------
@pytest.mark.parametrize(
    "value, same, other",
    [
        (torch.bool, torch.bool, torch.uint8),
        (torch.float32, torch.float, torch.float64),
        (torch.device("cpu"), torch.device("cpu"), torch.device("meta")),
        (torch.device("cuda", 0), torch.device("cuda:0"), torch.device("cuda")),
        (torch.Size([2, 3]), torch.Size([2, 3]), torch.Size([3, 2])),
        (torch.Size([2, 3]), torch.Size([2, 3]), (2, 3)),
        (torch.strided, torch.strided, torch.sparse_coo),
        (torch.contiguous_format, torch.contiguous_format, torch.channels_last),
        ((torch.float16, torch.device("cpu")), (torch.float16, torch.device("cpu")), (torch.float16, "cpu")),
    ],
)
def test_equals_on_torch_values(value: Any, same: Any, other: Any) -> None:
    b = tw.GuardBuilder({"v": value})
    b.equals("L['v']")
    gs = b.build()
    for fast in (True, False):
        with switches(fast=fast):
            assert gs.check({"v": same})
            assert not gs.check({"v": other})
    assert reference.check(gs.guards, {"v": same}) and not reference.check(gs.guards, {"v": other})
    assert _core.is_constant(value) and reference.is_constant(value)


def test_registered_constant_types_are_listed() -> None:
    types_ = {t for t, _, _ in _core.constant_types()}
    assert {torch.dtype, torch.device, torch.Size, torch.layout, torch.memory_format} <= types_
    with pytest.raises(TypeError, match="static C types"):
        tw.register_constant_type(Sub, "richcompare")
    with pytest.raises(TypeError, match="tuple subtype"):
        tw.register_constant_type(Sub, "tuple")
    with pytest.raises(ValueError, match="built-in constant type"):
        tw.register_constant_type(int, "identity")


# -- inference ----------------------------------------------------------------------------------------
def test_guards_for_infers_tensor_guards_as_dynamo() -> None:
    x, w = torch.zeros(4, 8), torch.nn.Parameter(torch.zeros(8))
    L = {"x": x, "w": w, "w2": w, "dt": torch.float32, "n": 3}
    gs = tw.guards_for(L)
    kinds = [g.kind.name for g in gs]
    assert kinds.count("TENSOR_MATCH") == 3 and kinds.count("DIMENSION_MARKING") == 3
    assert "ALIAS" in kinds and "NO_ALIAS" in kinds
    assert gs.check(L)
    assert not gs.check(dict(L, x=torch.zeros(5, 8)))  # static by default
    assert not gs.check(dict(L, w2=torch.nn.Parameter(torch.zeros(8))))  # aliasing changed
    assert not gs.check(dict(L, w=x, x=w))
    assert not gs.check(dict(L, dt=torch.float16))
    assert tw.guards_for(L, policy=tw.Policy(dynamic={"x": (0,)})).check(dict(L, x=torch.zeros(5, 8)))
    assert tw.guards_for(L, policy=tw.Policy(dynamic={"L['x']": True})).check(dict(L, x=torch.zeros(5, 3)))


def test_guards_for_honours_mark_dynamic() -> None:
    x = torch.zeros(4, 8)
    torch._dynamo.mark_dynamic(x, 0)
    gs = tw.guards_for({"x": x})
    spec = next(g for g in gs if g.kind.name == "TENSOR_MATCH")
    assert spec.args[1].sizes == (None, 8) and spec.args[1].strides == (8, 1)
    assert gs.check({"x": torch.zeros(9, 8)})  # unmarked now: markings are requests
    y = torch.zeros(9, 8)
    torch._dynamo.mark_dynamic(y, 1)  # a new marking: recompile, as torch does
    assert not gs.check({"x": y})
    gs = tw.guards_for({"x": x}, policy=tw.Policy(mark_dynamic=False))
    assert not gs.check({"x": torch.zeros(9, 8)})


# -- the cache's dispatch index on tensor shapes -------------------------------------------------------
def test_cache_index_dispatches_on_tensor_shapes() -> None:
    """Entries whose TENSOR_MATCH checks every size are indexed by (type, sizes): a lookup reads
    the shape through the adapter and tries only the matching entry. Entries with a dynamic
    dimension, values of another type, and tensors the runtime cannot read stay correct."""
    cache = tw.Cache(recompile_limit=64)
    made = {}
    for n in range(1, 9):
        x = torch.zeros(n, 3)
        gs = tw.guards_for({"x": x})
        cache.insert(gs, n)
        made[n] = x
    dyn = tw.guards_for({"x": torch.zeros(20, 5)}, policy=tw.Policy(dynamic={"x": (0,)}))
    cache.insert(dyn, "dynamic")
    if ADAPTER:
        assert cache.index_source == "L['x']"
    for n in range(1, 9):
        assert cache.lookup({"x": torch.zeros(n, 3)}) == n
        assert cache.lookup({"x": torch.zeros(n, 3, dtype=torch.float64)}) is None
    assert cache.lookup({"x": torch.zeros(50, 5)}) == "dynamic"  # unindexed: always a candidate
    assert cache.lookup({"x": torch.zeros(2, 5)}) == "dynamic"
    assert cache.lookup({"x": torch.zeros(3).as_subclass(Sub)}) is None
    assert cache.lookup({"x": [1, 2, 3]}) is None
    assert cache.lookup({"x": torch.nn.Parameter(torch.zeros(2, 3))}) is None
    for n in range(1, 9):  # the same answers as trying every entry
        v = {"x": torch.zeros(n, 3).t().contiguous().t()}
        want = next((e.payload for e in cache.entries if e.guards.check(v)), None)
        assert cache.lookup(v) == want


def test_key_memo_is_forgotten_after_a_residue() -> None:
    """TENSOR_MATCH reads the thread-local dispatch key sets once per check (TwKeyMemo) and
    reuses the last raw key set's applied value. A residue that enters autocast between two
    tensors of the same key set changes the applied keys: the second tensor must be read
    afresh (after_residue clears the memo), so the check fails as torch's would."""
    a, c = torch.ones(2), torch.ones(3)
    f_locals = {"a": a, "c": c}
    state: dict[str, Any] = {"enter": False, "ctx": None}

    def enters_autocast(v: Any) -> bool:
        if state["enter"] and state["ctx"] is None:
            state["ctx"] = torch.autocast("cpu")
            state["ctx"].__enter__()
        return True

    b = tw.GuardBuilder(f_locals, {})
    b.tensor_match("L['a']")
    b.predicate(enters_autocast, source="L['a']")
    b.tensor_match("L['c']")
    gs = b.build()
    assert all(gs.check(f_locals) for _ in range(3))
    state["enter"] = True
    try:
        assert gs.check(f_locals) is False  # c's keys now carry AutocastCPU
    finally:
        state["ctx"].__exit__(None, None, None)
    assert gs.check(f_locals) is True


def test_marking_memo_sees_mark_dynamic() -> None:
    """DIMENSION_MARKING keeps the tag of the instance dict state it proved to lack the marking
    flag; mark_dynamic writes the flag into that dict (a new tag), so the next check fails."""
    import torch._dynamo

    x = torch.nn.Parameter(torch.ones(4, 3))
    x._dynamo_static_input_type = "static"  # a materialised instance dict, as on model parameters
    b = tw.GuardBuilder({"x": x}, {})
    b.dimension_marking("L['x']")
    gs = b.build()
    assert all(gs.check({"x": x}) for _ in range(3))  # the memo is made, then used
    torch._dynamo.mark_dynamic(x, 0)
    assert gs.check({"x": x}) is False  # marked now, not at build time: recompile


# -- DIMENSION_MARKING on marked tensors: the fast form against torch --------------------------------
class SetSub(set):
    """A set subclass: its own issubset decides, as torch's guard calls it."""


class LyingSetSub(set):
    def issubset(self, other: Any) -> bool:  # type: ignore[override]
        return True


class Hash0:
    """Equal to everything, hash 0: a set lookup that meets it compares through its __eq__."""

    calls = 0

    def __hash__(self) -> int:
        return 0

    def __eq__(self, other: object) -> bool:
        Hash0.calls += 1
        return True


class PropertyMarked(torch.Tensor):
    """A class that defines a marking attribute: never read from the instance's storage."""

    @property
    def _dynamo_dynamic_indices(self) -> set[int]:
        return {5}


def _mark(how: str) -> Any:
    t = torch.zeros(3, 3)
    if how == "mark 0":
        torch._dynamo.mark_dynamic(t, 0)
    elif how == "mark 1":
        torch._dynamo.mark_dynamic(t, 1)
    elif how == "mark 0 1":
        torch._dynamo.mark_dynamic(t, [0, 1])
    elif how == "deleted":
        torch._dynamo.mark_dynamic(t, 0)
        del t._dynamo_dynamic_indices
    elif how == "flag only":
        t._has_dynamo_dim_marking = True
    elif how == "mark_static":
        torch._dynamo.mark_static(t, 0)
    elif how == "maybe_mark_dynamic":
        torch._dynamo.maybe_mark_dynamic(t, 0)
    elif how == "property":
        t = torch.zeros(3, 3).as_subclass(PropertyMarked)
        t._has_dynamo_dim_marking = True
    elif how != "plain":
        t._has_dynamo_dim_marking = True
        t._dynamo_dynamic_indices = {
            "set subclass": lambda: SetSub({0}),
            "set subclass, other dim": lambda: SetSub({2}),
            "lying issubset": lambda: LyingSetSub({2}),
            "frozenset": lambda: frozenset({0}),
            "frozenset, other dim": lambda: frozenset({2}),
            "float": lambda: {0.0},
            "float, other": lambda: {1.5},
            "bool True": lambda: {True},
            "bool False": lambda: {False},
            "big int": lambda: {2**70},
            "negative": lambda: {-1},
            "empty": lambda: set(),
            "hash-0 object": lambda: {Hash0()},
            "str": lambda: {"0"},
        }[how]()
    return t


RUN_MARKINGS = ["plain", "mark 0", "mark 1", "mark 0 1", "deleted", "flag only", "mark_static",
                "maybe_mark_dynamic", "property", "set subclass", "set subclass, other dim", "lying issubset",
                "frozenset", "frozenset, other dim", "float", "float, other", "bool True", "bool False",
                "big int", "negative", "empty", "hash-0 object", "str"]  # fmt: skip


def _torch_marking_guard(example: Any) -> Any:
    """torch's own DIMENSION_DYNAMIC_MARKING leaf, built from ``example`` as its guards.py does."""
    root = torch_guards.RootGuardManager()
    expected = {n: getattr(example, n) for n in MARKINGS if hasattr(example, n)}
    absent = [n for n in MARKINGS if not hasattr(example, n)]
    return torch_guards.DIMENSION_DYNAMIC_MARKING_GUARD(root, expected, absent, {}, ["dm"], None)


@pytest.mark.parametrize("built_as", ["mark 0", "mark 0 1", "mark 1"])
@pytest.mark.parametrize("run_as", RUN_MARKINGS)
def test_marked_fast_form_decides_as_torch(built_as: str, run_as: str) -> None:
    """Built on a mark_dynamic'd tensor, checked on tensors marked every way: the engine (fast
    pass on and off), the reference and torch's own guard agree."""
    example = _mark(built_as)
    theirs = _torch_marking_guard(example)
    v = _mark(run_as)
    want = theirs(v)
    got = []
    for fast in (True, False):
        with switches(fast=fast):
            b = tw.GuardBuilder({"t": example})
            b.dimension_marking("L['t']")
            gs = b.build()
            got += [gs.check({"t": v}), gs.check({"t": v})]  # the second through filled caches
    assert got == [want] * 4, (built_as, run_as, want, got)
    assert reference.check(gs.guards, {"t": v}) == want
    if not want:
        assert gs.why_not({"t": v}).kind == "DIMENSION_MARKING"


def test_marked_tensor_takes_the_fast_pass_and_sees_in_place_changes() -> None:
    """A mark_dynamic'd tensor is decided on the fast pass; the sets are read on every check, so
    an in-place add fails the next one."""
    x = torch.zeros(4, 3)
    torch._dynamo.mark_dynamic(x, 0)
    b = tw.GuardBuilder({"x": x})
    b.tensor_match("L['x']")
    b.dimension_marking("L['x']")
    gs = b.build()
    theirs = _torch_marking_guard(x)
    y = torch.zeros(4, 3)
    torch._dynamo.mark_dynamic(y, 0)
    assert_passes_on_the_fast_pass(gs, {"x": y})
    assert_passes_on_the_fast_pass(gs, {"x": y})
    y._dynamo_dynamic_indices.add(1)
    assert theirs(y) is False and gs.check({"x": y}) is False
    y._dynamo_dynamic_indices.discard(1)
    assert_passes_on_the_fast_pass(gs, {"x": y})
    y._dynamo_dynamic_indices.discard(0)  # empty: a subset of anything
    assert theirs(y) is True
    assert_passes_on_the_fast_pass(gs, {"x": y})
    y._dynamo_dynamic_indices = {True}  # True == 1: not within {0}
    assert theirs(y) is False and gs.check({"x": y}) is False
    y._dynamo_dynamic_indices = {False}  # False == 0: within {0}, decided by the slow path
    assert theirs(y) is True and gs.check({"x": y}) is True


def test_marked_fast_form_runs_no_user_eq() -> None:
    """An element whose hash collides with a built dimension is never compared by the fast form:
    the slow path's issubset compares it (as torch's does), once per check."""
    x = torch.zeros(4, 3)
    torch._dynamo.mark_dynamic(x, 0)
    y = _mark("hash-0 object")
    for fast in (True, False):
        with switches(fast=fast):
            b = tw.GuardBuilder({"x": x})
            b.dimension_marking("L['x']")
            gs = b.build()
            Hash0.calls = 0
            assert gs.check({"x": y}) is _torch_marking_guard(x)(y) is True
            assert Hash0.calls == 2  # ours once, torch's once


@pytest.mark.parametrize("action", ["delete", "replace", "add"])
def test_marked_fast_form_under_collections(action: str) -> None:
    """A finalizer run by a collection inside the check deletes, replaces or grows the marking set
    (the set the fast form reads, held only by the tensor): no crash, no error left set, and a
    decision torch makes on the state before or after it."""
    x = torch.zeros(4, 3)
    torch._dynamo.mark_dynamic(x, 0)
    b = tw.GuardBuilder({"x": x})
    b.dimension_marking("L['x']")
    gs = b.build()
    theirs = _torch_marking_guard(x)
    y = torch.zeros(4, 3)

    def setup() -> None:
        y._has_dynamo_dim_marking = True
        y._dynamo_dynamic_indices = {0}

    def act() -> None:
        if action == "delete":
            del y._dynamo_dynamic_indices
        elif action == "replace":
            y._dynamo_dynamic_indices = {7}
        else:
            y._dynamo_dynamic_indices.add(3)

    seen = set()
    for result, fired in hit_every_allocation(lambda: gs.check({"x": y}), act, setup=setup, ks=range(6)):
        after = theirs(y)
        assert result in (True, after), (action, result, fired)
        seen.add(fired)
    setup()
    act()
    assert gs.check({"x": y}) is theirs(y)


def test_marked_fast_form_under_threads() -> None:
    """One thread checks while another grows and shrinks the marking set and swaps it for another
    set: nothing crashes, no error is left set, and once the writer stops the check agrees with
    torch's on the final state and on fresh ones."""
    import threading

    x = torch.zeros(4, 3)
    torch._dynamo.mark_dynamic(x, [0, 1])
    b = tw.GuardBuilder({"x": x})
    b.dimension_marking("L['x']")
    gs = b.build()
    theirs = _torch_marking_guard(x)
    y = torch.zeros(4, 3)
    torch._dynamo.mark_dynamic(y, 0)
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            s = y._dynamo_dynamic_indices
            s.add(i % 3)  # 2 is outside the built {0, 1}
            s.discard((i + 1) % 3)
            if i % 7 == 0:
                y._dynamo_dynamic_indices = {i % 2}

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(scaled(2000)):
            gs.check({"x": y})  # either answer: the writer runs between any two bytecodes
    finally:
        stop.set()
        t.join()
    assert gs.check({"x": y}) is theirs(y)
    y._dynamo_dynamic_indices = {1}
    assert gs.check({"x": y}) is theirs(y) is True
    y._dynamo_dynamic_indices = {2}
    assert gs.check({"x": y}) is theirs(y) is False

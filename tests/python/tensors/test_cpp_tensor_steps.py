"""The C++ tensor steps (TENSOR_SIZE, TENSOR_STRIDE, TENSOR_STORAGE_OFFSET, GRAD): torch 2.13's
TensorPropertyGuardAccessor and GradGuardAccessor, read through the torch adapter with no Python
fallback.

Three oracles: the pure-Python reference (which reads through TensorBase's C methods with every
``__torch_function__`` disabled), torch's own guard manager (leaves added below real
TensorPropertyGuardAccessor / GradGuardAccessor nodes of a compiled entry, imported with
``guards_of`` and checked against ``guard_manager.check`` on mutated inputs), and a save/load
round trip. The values include what would make a Python-level read differ from torch's: a
subclass overriding ``size``/``stride``/``storage_offset``/``grad``, a subclass and a mode with a
lying ``__torch_function__``, an instance attribute ``size``, a non-leaf tensor's grad, non-tensors,
an object faking ``__class__``.
"""

from __future__ import annotations

import pytest

import reference
import tripwire as tw
from gc_stress import scaled
from tripwire import GuardBuilder, Source

torch = pytest.importorskip("torch")

from torch._dynamo.eval_frame import _debug_get_cache_entry_list  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

from tensor_step_entry import entry_with_tensor_step_leaves, f_two  # noqa: E402

pytestmark = pytest.mark.torch

tw.tensors.ensure_torch()
# These read only through the torch adapter (the ASan build has none: there a set is refused).
needs_adapter = pytest.mark.skipif(
    not tw._core.torch_adapter_installed(), reason="the torch adapter is not loaded in this build"
)


class LyingMethods(torch.Tensor):
    """Python-level reads of this subclass disagree with the C++ tensor."""

    def size(self, *a):  # type: ignore[override]
        return (99, 99, 99)

    def stride(self, *a):  # type: ignore[override]
        return (77, 77, 77)

    def storage_offset(self):  # type: ignore[override]
        return 55

    @property
    def grad(self):  # type: ignore[override]
        return "not a grad"


class LyingTorchFunction(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return 99


class LyingMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return 99


class PythonSizes(torch.Tensor):
    """A wrapper subclass whose sizes are answered by Python (``__torch_dispatch__``): reading them
    would run user code inside the engine, so the C++ steps never do (the guard fails)."""

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, dtype=elem.dtype, dispatch_sizes_strides_policy="sizes"
        )

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError("the engine must not ask")


class FakeClass:
    """isinstance(FakeClass(), torch.Tensor) is True through ``__class__``; it is no tensor."""

    @property
    def __class__(self):  # type: ignore[override]
        return torch.Tensor


def _values() -> list:
    base = torch.randn(8, 3)
    leaf = torch.randn(8, 3, requires_grad=True)
    with_grad = torch.randn(8, 3, requires_grad=True)
    with_grad.grad = torch.ones(8, 3)
    shadowed = torch.randn(8, 3)
    shadowed.size = lambda *a: (99,)  # an instance attribute a Python read would call
    return [
        base,
        torch.randn(7, 3),
        torch.randn(3, 8).t(),
        torch.randn(9, 3)[1:],
        torch.randn(8, 3)[:, :1],
        torch.randn(8),
        torch.tensor(1.0),
        torch.randn(0, 3),
        torch.nn.Parameter(torch.randn(8, 3)),
        base.as_subclass(LyingMethods),
        torch.randn(9, 3)[1:].as_subclass(LyingMethods),
        base.as_subclass(LyingTorchFunction),
        leaf,
        with_grad,
        leaf * 2,  # a non-leaf: grad is None (Tensor.grad would warn)
        shadowed,
        torch.randn(8, 3, dtype=torch.complex64).conj(),
        torch.randn(8, 3, dtype=torch.float64),
        3,
        None,
        [8, 3],
        FakeClass(),
    ]


def _sources() -> list[Source]:
    x = Source.local("x")
    return [
        x.tensor_size(0),
        x.tensor_size(1),
        x.tensor_stride(0),
        x.tensor_stride(1),
        x.tensor_storage_offset(),
    ]


def _sets() -> list:
    """One set per guard (so each decision is seen alone), built on the base tensor."""
    ex = {"x": torch.randn(8, 3)}
    out = []
    for src, value in zip(_sources(), (8, 3, 3, 1, 0), strict=True):
        b = GuardBuilder(ex)
        b.equals(src, value)
        out.append(b.build())
    b = GuardBuilder(ex)
    b.none(Source.local("x").grad())
    out.append(b.build())
    with_grad = torch.randn(8, 3, requires_grad=True)
    with_grad.grad = torch.ones(8, 3)
    b = GuardBuilder({"x": with_grad})
    g = Source.local("x").grad()
    b.not_none(g)
    b.type_match(g, torch.Tensor)
    b.equals(g.tensor_size(0), 8)
    out.append(b.build())
    return out


@needs_adapter
def test_engine_equals_reference_on_tensors_subclasses_and_non_tensors() -> None:
    sets = _sets()
    seen = {True: 0, False: 0}
    for _ in range(scaled(3, 3)):
        for v in _values():
            for gs in sets:
                L = {"x": v}
                got = gs.check(L)
                assert got == reference.check(gs.guards, L), (gs.guards, v)
                seen[got] += 1
    assert seen[True] and seen[False], seen


@needs_adapter
def test_reads_the_cpp_tensor_where_python_would_not() -> None:
    size0, _, _, _, offset, grad_none, _ = _sets()
    lying = torch.randn(8, 3).as_subclass(LyingMethods)
    assert lying.size() == (99, 99, 99) and lying.grad == "not a grad"
    assert size0.check({"x": lying}) and grad_none.check({"x": lying})
    assert not offset.check({"x": torch.randn(9, 3)[1:].as_subclass(LyingMethods)})
    assert size0.check({"x": torch.randn(8, 3).as_subclass(LyingTorchFunction)})
    t8, t7 = torch.randn(8, 3), torch.randn(7, 3)
    with LyingMode():
        assert t8.size(0) == 99  # what a Python-level read sees under the mode
        assert size0.check({"x": t8}) and not size0.check({"x": t7})
    # Not a tensor (its __class__ lies): fails, without unpacking it as one.
    assert not size0.check({"x": FakeClass()}) and not grad_none.check({"x": FakeClass()})
    wrapper = PythonSizes(torch.randn(8, 3))
    for gs in (size0, offset):
        assert not gs.check({"x": wrapper}) and not reference.check(gs.guards, {"x": wrapper})
    assert grad_none.check({"x": wrapper})  # grad() is a field: read as torch reads it
    why = str(size0.why_not({"x": 3}))
    assert "not a tensor" in why and "L['x'].size()[0]" in why


@needs_adapter
def test_printed_as_torch_prints_and_marked_in_explain() -> None:
    x = Source.local("x")
    assert [str(s) for s in (x.tensor_size(1), x.tensor_stride(0), x.tensor_storage_offset(), x.grad())] == [
        "L['x'].size()[1]",
        "L['x'].stride()[0]",
        "L['x'].storage_offset()",
        "L['x'].grad",
    ]
    # parse() reads the printed text as the Python-level steps: the C++ steps are built, not parsed.
    assert Source.parse("L['x'].size()[1]") != x.tensor_size(1)
    text = _sets()[0].explain()
    assert "[TENSOR_SIZE: the C++ tensor, torch adapter only]" in text


@needs_adapter
def test_round_trip_decides_the_same() -> None:
    for gs in _sets():
        loaded = tw.GuardSet.from_bytes(gs.to_bytes())
        assert [str(g.source) for g in loaded.guards] == [str(g.source) for g in gs.guards]
        assert [g.source for g in loaded.guards] == [g.source for g in gs.guards]
        for v in _values():
            assert loaded.check({"x": v}) == gs.check({"x": v}), (gs.guards, v)


def test_refused_without_the_adapter() -> None:
    """No reader but the adapter has torch's meaning: in a process whose adapter does not load,
    a set naming a C++ tensor step or STORAGE_OVERLAPPING is refused at build and at load."""
    import subprocess
    import sys

    if not tw._core.torch_adapter_installed():  # this process has none (the ASan build)
        with pytest.raises(tw.GuardBuildError, match="torch adapter"):
            _sets()
        with pytest.raises(tw.GuardBuildError, match="torch adapter"):
            b0 = GuardBuilder({"a": torch.randn(2), "b": torch.randn(2)})
            b0.storage_overlapping(overlapping=["L['a']", "L['b']"])
            b0.build()
        return
    data_steps = _sets()[0].to_bytes()
    base = torch.arange(4.0)
    b = GuardBuilder({"a": base[:2], "b": base[2:]})
    b.storage_overlapping(non_overlapping=["L['a']", "L['b']"])
    data_overlap = b.build().to_bytes()
    code = f"""
import sys
sys.modules["tripwire._torch_adapter"] = None  # the adapter does not load
import torch, tripwire as tw
from tripwire import GuardBuilder, Source

def build_steps():
    b = GuardBuilder({{"x": torch.randn(8, 3)}})
    b.equals(Source.local("x").tensor_size(0), 8)
    b.build()

for build in (build_steps, lambda: tw.GuardSet.from_bytes({data_steps!r}), lambda: tw.GuardSet.from_bytes({data_overlap!r})):
    try:
        build()
        print("built")
    except (tw.GuardBuildError, tw.FormatError) as e:
        print("refused" if "torch adapter" in str(e) else repr(e))
print(tw._core.torch_adapter_installed())
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.stdout.split() == ["refused", "refused", "refused", "False"], (r.stdout, r.stderr[-2000:])


# -- against torch's own accessors -----------------------------------------------------------------


@needs_adapter
def test_guards_of_imports_tensor_property_and_grad_accessors_and_decides_as_torch() -> None:
    gm, x, _ = entry_with_tensor_step_leaves()
    gs = tw.torch.guards_of(f_two)
    by_source = {g.source: g for g in gs.torch_import.guards}
    for s in ("L['z'].size()[0]", "L['z'].stride()[1]", "L['z'].storage_offset()", "L['z'].grad"):
        assert by_source[s].outcome == "native", by_source[s]
    kinds = {str(g.source): g.source.steps[-1].kind.name for g in gs.guards if g.source and g.source.steps}
    assert kinds == {
        "L['z'].size()[0]": "TENSOR_SIZE",
        "L['z'].stride()[1]": "TENSOR_STRIDE",
        "L['z'].storage_offset()": "TENSOR_STORAGE_OFFSET",
        "L['z'].grad": "GRAD",
    }
    loaded = tw.GuardSet.from_bytes(gs.to_bytes())
    # FakeClass is left out here: torch's THPVariable_Check accepts it through __class__ and would
    # unpack it as a tensor (undefined behaviour); tripwire fails it (test above).
    values = [v for v in _values() if not isinstance(v, FakeClass)]
    seen = {True: 0, False: 0}
    for _ in range(scaled(2, 2)):
        for v in values:
            L = {"x": x, "z": v}
            want = gm.check(L)
            assert gs.check(L) == want, v
            assert loaded.check(L) == want, v
            seen[want] += 1
    assert seen[True] >= 3 and seen[False] >= 5, seen


def f_cpp_path(x, y, s):
    return x.reshape(-1, 4).sum() * s + y[: x.shape[0] // 2].sum()


@needs_adapter
def test_a_dynamic_compile_with_cpp_shape_guards_imports_guards_below_the_accessor() -> None:
    """torch's C++ shape guard path (dynamic=True, enable_cpp_symbolic_shape_guards) hangs the
    shape guard below TensorPropertyGuardAccessor nodes; a guard added below the same nodes (and
    below a GradGuardAccessor) now imports through the C++ tensor steps, and the imported set
    decides as torch on mutated inputs."""
    from torch._dynamo.guards import GuardManagerType

    torch._dynamo.reset()
    old = (torch._dynamo.config.specialize_float, torch._dynamo.config.enable_cpp_symbolic_shape_guards)
    torch._dynamo.config.specialize_float = False
    torch._dynamo.config.enable_cpp_symbolic_shape_guards = True
    example = {"x": torch.randn(8, 3), "y": torch.randn(10), "s": 0.5}
    try:
        torch.compile(f_cpp_path, backend="eager", dynamic=True)(**example)
    finally:
        torch._dynamo.config.specialize_float, torch._dynamo.config.enable_cpp_symbolic_shape_guards = old
    gm = _debug_get_cache_entry_list(f_cpp_path.__code__)[0].guard_manager
    x_node = next(c for c in gm.root.get_child_managers() if c.get_source() == "L['x']")
    prop = next(c for c in x_node.get_child_managers() if c.get_source() == "L['x'].size()[0]")
    prop.add_lambda_guard(lambda v: v >= 2, ["L['x'].size()[0] >= 2"], None)
    grad = x_node.grad_manager(
        source="L['x'].grad", example_value=None, guard_manager_enum=GuardManagerType.GUARD_MANAGER
    )
    grad.add_none_match_guard(["L['x'].grad is None"], None)
    gs = tw.torch.guards_of(f_cpp_path)
    by_code = {g.code: g for g in gs.torch_import.guards}
    assert by_code["L['x'].size()[0] >= 2"].outcome == "torch"  # torch's lambda, on the C++ size
    assert by_code["L['x'].grad is None"].outcome == "native"
    shape = [g for g in gs.torch_import.guards if g.kind == "SYMBOLIC_SHAPE_GUARD"]
    assert shape and all(g.outcome == "native" for g in shape), shape
    with_grad = torch.randn(8, 3, requires_grad=True)
    with_grad.grad = torch.zeros(8, 3)
    xs = [
        torch.randn(8, 3),
        torch.randn(12, 3),
        torch.randn(1, 3),
        torch.randn(4, 3),
        with_grad,
        torch.randn(6, 3),
    ]
    decisions = set()
    for xv in xs:
        L = {**example, "x": xv}
        want = gm.check(L)
        assert gs.check(L) == want, xv.shape
        decisions.add(want)
    assert decisions == {True, False}

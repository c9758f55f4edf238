"""ARRAY_MATCH and numpy dtypes as constants: the engine answers as the reference evaluator.

Arrays are generated over every numpy dtype hypothesis knows (numbers of both byte orders, bool,
bytes, str, datetime, timedelta, object, structured), every shape up to 3 dims (0-d and zero-size
included), and views of them (transposed, sliced with negative steps, broadcast with zero strides,
Fortran order, read-only, unaligned). Each set is checked through the array struct and through the
Python reader, with the fast pass on and off.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference
import tripwire as tw
from engine_switches import assert_passes_on_the_fast_pass, switches
from gc_stress import examples, scaled
from tripwire import _core

np = pytest.importorskip("numpy")
hnp = pytest.importorskip("hypothesis.extra.numpy")

_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def dtypes() -> st.SearchStrategy[Any]:
    return st.one_of(
        hnp.scalar_dtypes(),
        hnp.integer_dtypes(endianness="="),
        hnp.floating_dtypes(endianness="<"),
        hnp.floating_dtypes(endianness=">"),
        hnp.byte_string_dtypes(max_len=4),
        hnp.unicode_string_dtypes(max_len=4),
        st.just(np.dtype(object)),
        hnp.nested_dtypes(max_itemsize=24),
    )


@st.composite
def arrays(draw: st.DrawFn) -> Any:
    dtype = draw(dtypes())
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
    if dtype == np.dtype(object):
        a = np.empty(shape, dtype=object)
    else:
        a = np.zeros(shape, dtype=dtype)
    view = draw(
        st.sampled_from(["plain", "transpose", "slice", "broadcast", "fortran", "readonly", "unaligned"])
    )
    if view == "transpose":
        a = a.T
    elif view == "slice" and a.ndim:
        a = a[(slice(None, None, draw(st.sampled_from([1, 2, -1]))),)]
    elif view == "broadcast":
        a = np.broadcast_to(a, (2, *a.shape))
    elif view == "fortran":
        a = np.asfortranarray(a)
    elif view == "readonly":
        a = a.copy()
        a.flags.writeable = False
    elif view == "unaligned" and dtype.itemsize > 1 and dtype != np.dtype(object) and dtype.fields is None:
        buf = np.zeros(a.size * dtype.itemsize + 1, dtype=np.uint8)
        a = buf[1:].view(dtype).reshape(shape) if a.size else a
    return a


def variants(a: Any) -> list[Any]:
    """Arrays close to ``a``: equal, copies, views, other dtypes and shapes, flags flipped."""
    out = [a, a.copy(), np.array(a, order="F"), a.T, a[..., None] if a.ndim < 3 else a]
    if a.ndim:
        out.append(a[::-1])
        out.append(np.concatenate([a, a]) if a.dtype != np.dtype(object) else a[:0])
    if a.dtype.kind in "iuf" and a.dtype.fields is None:
        out.append(a.astype(a.dtype.newbyteorder()))
        out.append(a.astype(np.float64 if a.dtype != np.float64 else np.float32))
    ro = a.copy()
    ro.flags.writeable = False
    out.append(ro)
    out.append(np.broadcast_to(a, (3, *a.shape)))
    return out


def agree(gs: tw.GuardSet, L: dict, fast: bool) -> bool:
    expected = reference.check(gs.guards, L)
    with switches(fast=fast):
        got = gs.check(L)
    assert got == expected, (L, gs.explain())
    why = gs.why_not(L)
    assert (why is None) == expected
    if why is not None:
        first = reference.first_failure(gs.guards, L)
        assert first is not None and why.guard.index == first[0].index
        if why.kind == "ARRAY_MATCH":
            assert why.reason.startswith(f"{why.source}: ARRAY_MATCH ")
    return expected


@settings(max_examples=examples(250), **_SETTINGS)
@given(arrays(), st.data())
def test_array_match_matches_the_reference(a: Any, data: st.DataObject) -> None:
    dynamic = data.draw(
        st.sets(st.integers(0, max(a.ndim - 1, 0)), max_size=a.ndim) if a.ndim else st.just(set())
    )
    others = data.draw(st.lists(arrays(), max_size=3))
    for python in (False, True):
        with switches(python=python):
            b = tw.GuardBuilder({"a": a})
            b.array_match("L['a']", dynamic=dynamic)
            gs = b.build()
        path = gs._guard_path(0)
        assert path == ("python" if python or not _core.numpy_struct_enabled() else "native")
        for v in variants(a) + others:
            for fast in (True, False):
                agree(gs, {"a": v}, fast)


def test_array_reasons_name_every_field() -> None:
    a = np.zeros((4, 8), dtype=np.float32)
    b = tw.GuardBuilder({"a": a})
    b.array_match("L['a']")
    gs = b.build()
    f = gs.why_not({"a": np.zeros((5, 8), dtype=np.float64)})
    assert f.kind == "ARRAY_MATCH"
    assert "dtype expected float32, got float64" in f.reason
    assert "size[0] expected 4, got 5" in f.reason
    assert "stride[0] expected 32, got 64" in f.reason
    ro = a.copy()
    ro.flags.writeable = False
    assert "writeable expected True, got False" in gs.why_not({"a": ro}).reason
    # Contiguity alone: every size and the outer stride dynamic, the inner stride still 4.
    b2 = tw.GuardBuilder({"a": a})
    b2.array_match("L['a']", dynamic=True)
    gs2 = b2.build()
    assert gs2.check({"a": np.zeros((2, 3), np.float32)})
    f = gs2.why_not({"a": np.zeros((4, 16), np.float32)[:, :8]})
    assert f is not None and "c_contiguous expected" in f.reason
    f = gs.why_not({"a": [1, 2]})
    assert "type expected numpy.ndarray, got list" in f.reason


def test_dynamic_dims_leave_dependent_strides_unchecked() -> None:
    a = np.zeros((4, 8), dtype=np.float32)
    b = tw.GuardBuilder({"a": a})
    spec = b.array_match("L['a']", dynamic=(1,))
    assert spec.args[1].sizes == (4, None)
    assert spec.args[1].strides == (None, 4)  # stride[0] = 4 * size[1]
    gs = b.build()
    assert gs.check({"a": np.zeros((4, 3), dtype=np.float32)})
    assert not gs.check({"a": np.zeros((5, 3), dtype=np.float32)})
    assert not gs.check({"a": np.zeros((3, 4), dtype=np.float32).T})  # F order: stride[1] differs
    # A broadcast (stride 0) dimension lies inside nothing.
    bc = np.broadcast_to(np.arange(8, dtype=np.float32), (4, 8))
    spec = tw.GuardBuilder({"a": bc}).array_match("L['a']", dynamic=(0,))
    assert spec.args[1].strides == (0, 4)


def test_array_subclasses_and_impostors() -> None:
    class Sub(np.ndarray):
        @property
        def shape(self) -> Any:  # a lying property: never consulted
            raise AssertionError("the engine called a subclass property")

    a = np.zeros(3).view(Sub)
    b = tw.GuardBuilder({"a": a})
    b.array_match("L['a']")
    gs = b.build()
    assert gs.check({"a": np.zeros(3).view(Sub)})
    assert not gs.check({"a": np.zeros(3)})  # the exact type

    class Impostor:
        @property
        def __class__(self) -> type:
            return np.ndarray

        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the engine asked an impostor for {name}")

    assert not gs.check({"a": Impostor()})
    assert gs.why_not({"a": Impostor()}).kind == "ARRAY_MATCH"


def test_array_expectation_given_explicitly() -> None:
    exp = tw.tensors.ArrayExpectation("<f4", (None, 3), (12, 4), True, False, True, True)
    b = tw.GuardBuilder({"a": np.zeros((2, 3), np.float32)})
    b.array_match("L['a']", expected=exp, type=np.ndarray)
    gs = b.build()
    assert gs.check({"a": np.zeros((7, 3), np.float32)})
    assert not gs.check({"a": np.zeros((7, 3), np.float64)})
    with pytest.raises(TypeError, match="needs type"):
        tw.GuardBuilder({}).array_match("L['a']", expected=exp)


def test_struct_path_runs_no_python() -> None:
    """Through the struct the set keeps the fast pass; a structured dtype is compared by numpy and
    makes the guard a Python-level one."""
    tw.tensors.ensure_numpy()
    assert _core.numpy_struct_enabled(), tw.tensors.array_path()
    b = tw.GuardBuilder({"a": np.zeros(3), "r": np.zeros(2, dtype=[("x", "i4")])})
    b.array_match("L['a']")
    gs = b.build()
    assert_passes_on_the_fast_pass(gs, {"a": np.ones(3)})
    b.array_match("L['r']")
    gs = b.build()
    assert not gs._uses_fast_pass
    assert gs.check({"a": np.ones(3), "r": np.ones(2, dtype=[("x", "i4")])})
    assert not gs.check({"a": np.ones(3), "r": np.ones(2, dtype=[("y", "i4")])})


@settings(max_examples=examples(300), **_SETTINGS)
@given(dtypes(), dtypes())
def test_numpy_dtypes_as_constants_match_the_reference(d1: Any, d2: Any) -> None:
    tw.tensors.ensure_numpy()
    assert _core.is_constant(d1) == reference.is_constant(d1)
    if not reference.is_constant(d1):
        with pytest.raises(tw.GuardBuildError):
            tw.GuardBuilder({"d": d1}).equals("L['d']")
        return
    for other in (d2, np.dtype(d1.str) if d1.fields is None else d1, d1.newbyteorder()):
        assert _core.equals_match(other, d1) == reference.equals_match(other, d1), (other, d1)
    gs = tw.GuardBuilder({"d": d1})
    gs.equals("L['d']")
    built = gs.build()
    for other in (d1, d2):
        assert built.check({"d": other}) == reference.check(built.guards, {"d": other})


def test_equals_on_numpy_dtypes() -> None:
    tw.tensors.ensure_numpy()
    b = tw.GuardBuilder({"d": np.dtype("float32"), "u": np.dtype("<U5")})
    b.equals("L['d']")
    b.equals("L['u']")
    gs = b.build()
    assert gs.check({"d": np.zeros(1, np.float32).dtype, "u": np.dtype("U5")})
    assert not gs.check({"d": np.dtype(">f4"), "u": np.dtype("U5")})
    assert not gs.check({"d": np.dtype("float32"), "u": np.dtype("U6")})
    assert not gs.check({"d": np.float32, "u": np.dtype("U5")})  # the scalar type, not a dtype


def test_many_arrays_under_collections() -> None:
    arrays_ = [np.zeros((i + 1, 2)) for i in range(scaled(30, 3))]
    f_locals = {f"a{i}": a for i, a in enumerate(arrays_)}
    gs = tw.guards_for(f_locals)
    assert gs.check(f_locals)
    g = dict(f_locals)
    g["a0"] = g["a1"]
    assert not gs.check(g)
    assert gs.why_not(g).kind in ("ARRAY_MATCH", "NO_ALIAS")


def test_cache_index_dispatches_on_array_shapes() -> None:
    cache = tw.Cache(recompile_limit=64)
    for n in range(1, 7):
        cache.insert(tw.guards_for({"a": np.zeros((n, 2))}), n)
    if _core.numpy_struct_enabled():
        assert cache.index_source == "L['a']"
    for n in range(1, 7):
        assert cache.lookup({"a": np.ones((n, 2))}) == n
        assert cache.lookup({"a": np.ones((n, 2), dtype=np.float32)}) is None
        assert cache.lookup({"a": np.ones((2, n)).T}) is None  # right sizes, wrong strides
    assert cache.lookup({"a": [[0.0, 0.0]]}) is None


# -- the struct reader: layout check, and the warning when it cannot be had ----------------------------
def test_this_numpy_is_read_from_its_struct() -> None:
    """numpy 1.x and 2.x are read from the struct in every build (no numpy headers needed at build
    time): the path is never silently the slow one."""
    tw.tensors.ensure_numpy()
    assert tw.tensors.array_path() == f"array struct (numpy {np.__version__})"
    assert _core.numpy_struct_enabled()


def test_the_layout_check_refuses_the_other_numpys_dtype_layout() -> None:
    """The probes tell numpy 1.x's PyArray_Descr from 2.x's (elsize moved): the check can fail."""
    mine = tw.tensors._numpy_descr_layout(np.__version__)
    assert mine in (1, 2)
    assert tw.tensors._numpy_layout_matches(np, mine)
    assert not tw.tensors._numpy_layout_matches(np, 3 - mine)
    assert tw.tensors._numpy_descr_layout("3.0.0") is None
    assert tw.tensors._numpy_descr_layout("10.1") is None


def test_struct_probe_on_bad_input() -> None:
    """The probe reads nothing that is not an ndarray with a numpy dtype, under a known layout."""
    layout = tw.tensors._numpy_descr_layout(np.__version__)
    a = np.zeros((2, 3), dtype="<U4")
    got = _core._numpy_struct_probe(a, np.ndarray, np.dtype, layout)
    assert got is not None and got[8:] == (16, a.dtype.num, "U", "U", "=")  # numpy stores native as '='
    big = np.zeros(2, dtype=">i2" if np.little_endian else "<i2")
    assert _core._numpy_struct_probe(big, np.ndarray, np.dtype, layout)[8:] == (
        2,
        big.dtype.num,
        "i",
        "h",
        big.dtype.byteorder,
    )

    class Sub(np.ndarray):
        pass

    assert _core._numpy_struct_probe(a.view(Sub), np.ndarray, np.dtype, layout) is not None
    for bad in ([1, 2], 3, np.float64(1.0), np.dtype("f8")):
        assert _core._numpy_struct_probe(bad, np.ndarray, np.dtype, layout) is None
    for lay in (0, 3, -1, 255):
        assert _core._numpy_struct_probe(a, np.ndarray, np.dtype, lay) is None
    assert _core._numpy_struct_probe(a, np.ndarray, int, layout) is None  # descr not of that type
    assert _core._numpy_struct_probe(a, int, np.dtype, layout) is None

    class Big:  # instances as large as an ndarray's fields: still not numpy's type
        __slots__ = tuple(f"s{i}" for i in range(16))

    big = Big()
    for i in range(16):
        setattr(big, f"s{i}", i)
    assert _core._numpy_struct_probe(big, Big, np.dtype, layout) is None
    assert not _core._enable_numpy_struct(Big, np.dtype, layout)  # enabled already or not: refused
    with pytest.raises(TypeError):
        _core._numpy_struct_probe(a, 5, np.dtype, layout)


_UNKNOWN_NUMPY = """
import sys, warnings
import numpy as np
{patch}
import tripwire as tw
from tripwire import _core
assert not _core._enable_numpy_struct(np.ndarray, np.dtype, 3)
assert not _core._enable_numpy_struct(object, np.dtype, 2)
assert not _core._enable_numpy_struct(np.ndarray, object, 2)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    b = tw.GuardBuilder({{"a": np.zeros((2, 3), np.float32)}})
    b.array_match("L['a']")
    gs = b.build()
    tw.GuardBuilder({{"a": np.zeros(2)}}).array_match("L['a']")
msgs = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]
print(len(msgs))
print(msgs[0] if msgs else "")
print(tw.tensors.array_path())
print(_core.numpy_struct_enabled(), gs._guard_path(0))
print(gs.check({{"a": np.ones((2, 3), np.float32)}}), gs.check({{"a": np.ones((2, 3), np.float64)}}),
      gs.check({{"a": np.ones((3, 2), np.float32).T}}))
"""


@pytest.mark.parametrize(
    ("patch", "why"),
    [
        ('np.__version__ = "3.0.0"', "not of numpy 3.0.0"),
        (
            "import tripwire.tensors as T; T._numpy_layout_matches = lambda np, layout: False",
            "does not match",
        ),
    ],
)
def test_unknown_numpy_warns_once_and_reads_through_python(patch: str, why: str) -> None:
    """When the struct cannot be had: one RuntimeWarning saying why and what to do, then the
    Python reader, which decides as the struct would."""
    import subprocess
    import sys

    code = _UNKNOWN_NUMPY.format(patch=patch)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == 5, (r.stdout, r.stderr[-2000:])
    assert lines[0] == "1"
    assert why in lines[1] and "read through Python" in lines[1] and "numpy 1.x or 2.x" in lines[1]
    assert lines[2].startswith("python reader (") and why in lines[2]
    assert lines[3] == "False python"
    assert lines[4] == "True False False"

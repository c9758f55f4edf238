"""Failure: why a guard set did not pass, as one readable record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .catalogue import _TORCH_PROBES, GuardKind, GuardSpec, Weak, short_repr

__all__ = ["Failure", "make_failure"]


@dataclass(frozen=True)
class Failure:
    """The first failing guard (by installation order) of a check.

    Attributes:
        source: the printed source, e.g. ``"L['cfg']['mode']"`` (None for ambient guards).
        kind: the catalogue name, e.g. ``"EQUALS_MATCH"``.
        expected: what the guard expects (a type, constant, length, key list...).
        actual: what was found (the value's type for TYPE_MATCH, its length for LENGTH, the
            value otherwise); None when the source could not be fetched.
        reason: one readable line.
        guard: the GuardSpec, with ``.stack``: where the guard was installed.
    """

    source: str | None
    kind: str
    expected: Any
    actual: Any
    reason: str
    guard: GuardSpec

    @property
    def stack(self) -> tuple[str, ...]:
        return self.guard.stack

    def __str__(self) -> str:
        return self.reason


def _actual(spec: GuardSpec, v: Any) -> Any:
    k = spec.kind
    try:
        if k is GuardKind.TYPE_MATCH:
            return type(v)
        if k is GuardKind.LENGTH:
            return len(v)
        if k is GuardKind.DICT_KEYS and isinstance(v, dict):
            return list(dict.keys(v))
        if k is GuardKind.CODE_MATCH:
            return getattr(v, "__code__", None)
    except Exception:  # noqa: BLE001 - diagnostics must not raise
        return v
    return v


def _key_names(bits: int) -> list[str]:
    from .tensors import dispatch_key_names

    text = dispatch_key_names(bits)
    inner = text[text.find("(") + 1 : text.rfind(")")] if text.startswith("DispatchKeySet(") else ""
    return [n for n in inner.split(", ") if n]


_MASK_UNKNOWN = (
    "torch masks those keys unless a dispatch mode without ignore_compile_internals is active on "
    "this thread, and its per-thread flag could not be found (tripwire.tensors.adapter_status()), "
    "so the guard fails closed"
)


def _is_key_set(value: Any) -> bool:
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and issubclass(type(value), torch._C.DispatchKeySet)


def _key_set_text(spec: GuardSpec, value: Any, where: str) -> tuple[Any, str]:
    """DISPATCH_KEY_SET_MATCH's (actual, reason): the applied set the engine reads now and the keys
    that differ from the expected one, by torch's key names."""
    import tripwire._core as _core

    from .tensors import dispatch_key_names

    want = spec.args[0]
    try:
        now = _core.applied_dispatch_keys(value)
    except Exception:  # noqa: BLE001 - diagnostics must not raise
        now = None
    if now is None and _core._masks_python_keys() is None and _is_key_set(value):
        return value, (
            f"{where}: DISPATCH_KEY_SET_MATCH expected applied keys {dispatch_key_names(want)}, got a set "
            f"with a Python dispatch key: {_MASK_UNKNOWN}"
        )
    if now is None:
        return value, (
            f"{where}: DISPATCH_KEY_SET_MATCH expected a torch._C.DispatchKeySet with applied keys "
            f"{dispatch_key_names(want)}, got {short_repr(value)} (not a DispatchKeySet the adapter reads)"
        )
    w, g = _key_names(want), _key_names(now)
    extra = [n for n in g if n not in w]
    missing = [n for n in w if n not in g]
    diff = []
    if extra:
        diff.append("extra " + ", ".join(extra))
    if missing:
        diff.append("missing " + ", ".join(missing))
    if not diff:  # the same names (bits torch does not name)
        diff.append(f"raw {want:#x} != {now:#x}")
    return dispatch_key_names(now), (
        f"{where}: DISPATCH_KEY_SET_MATCH applied keys (this thread's include/exclude sets, Python keys "
        f"masked as torch's guards do) expected {dispatch_key_names(want)}, got {dispatch_key_names(now)}: "
        + "; ".join(diff)
    )


def _shape_failure(spec: GuardSpec, value: Any, error: str | None) -> Failure:
    """A SHAPE relation: ``expected`` is the relation, ``actual`` {symbol: value} (None when a
    symbol could not be read), ``source`` its symbols."""
    text, symbols = spec.args[0], spec.args[1]
    src = ", ".join(str(s) for s in symbols) or None
    if type(value) is dict:
        # The engine's reason: "<relation> is false with L['x'].size()[0] = 9".
        return Failure(src, "SHAPE", text, value, error or f"{text} is false", spec)
    return Failure(src, "SHAPE", text, None, f"{text}: {error}", spec)


def _field_text(spec: GuardSpec, field: str, dim: int, expected: int, actual: Any, value: Any) -> str:
    """One differing field: ``size[0] expected 4, got 5``."""
    from . import tensors

    if field == "type":
        want = spec.args[0].get() if type(spec.args[0]) is Weak else spec.args[0]
        return f"type expected {_qualname(want)}, got {_qualname(type(value))}"
    if field == "unreadable":
        return "the fields could not be read"
    if field == "python_key_mask":
        got = tensors.dispatch_key_names(actual & ((1 << 64) - 1))
        return f"dispatch keys {got} include a Python dispatch key: {_MASK_UNKNOWN}"
    where = f"{field}[{dim}]" if dim >= 0 else field
    if field == "stride" and actual == tensors.ANY_DIM:
        return f"{where} expected {expected}, got none (the layout has no strides)"
    if field == "dtype":
        if spec.kind is GuardKind.TENSOR_MATCH:
            return f"dtype expected {tensors.dtype_name(expected)}, got {tensors.dtype_name(actual)}"
        return f"dtype expected {_dtype_text(spec.args[1].dtype)}, got {_array_dtype(value)}"
    if field == "dispatch_keys":
        exp = tensors.dispatch_key_names(expected & ((1 << 64) - 1))
        got = tensors.dispatch_key_names(actual & ((1 << 64) - 1))
        text = f"dispatch keys expected {exp}, got {got}"
        device = getattr(spec.args[1], "device", "")
        now = _tensor_device(value)
        if device and now and now != device:
            text += f" (device expected {device}, got {now})"
        return text
    if field in ("requires_grad", "writeable"):
        return f"{where} expected {bool(expected)}, got {bool(actual)}"
    if field in ("c_contiguous", "f_contiguous", "aligned"):
        return f"{where} expected, got not {field.replace('_', '-')}"
    return f"{where} expected {expected}, got {actual}"


def _qualname(t: Any) -> str:
    try:
        mod = type.__getattribute__(t, "__module__")
        qn = type.__getattribute__(t, "__qualname__")
        return qn if mod == "builtins" else f"{mod}.{qn}"
    except Exception:  # noqa: BLE001
        return "<type>"


def _array_dtype(value: Any) -> str:
    import sys

    try:
        return str(sys.modules["numpy"].ndarray.dtype.__get__(value))
    except Exception:  # noqa: BLE001
        return "?"


def _dtype_text(desc: Any) -> str:
    import sys

    try:
        np = sys.modules["numpy"]
        return str(np.dtype(list(desc) if isinstance(desc, tuple) else desc))
    except Exception:  # noqa: BLE001
        return str(desc)


def _tensor_device(value: Any) -> str:
    import sys

    try:
        return str(sys.modules["torch"]._C.TensorBase.device.__get__(value))
    except Exception:  # noqa: BLE001
        return ""


def _relation_text(spec: GuardSpec, values: Any) -> str:
    srcs = spec.sources
    if spec.kind is GuardKind.ALIAS:
        return (
            f"ALIAS expected {srcs[0]} is {srcs[1]}, got two objects ({_obj(values[0])}, {_obj(values[1])})"
        )
    for i in range(len(values)):
        for j in range(i):
            if values[i] is values[j]:
                return f"NO_ALIAS expected distinct objects, got {srcs[j]} is {srcs[i]} ({_obj(values[i])})"
    return "NO_ALIAS expected distinct objects"


def _obj(v: Any) -> str:
    return f"<{_qualname(type(v))} at {id(v):#x}>"


def _hooks_text(value: Any) -> str:
    """A saved-tensor-hooks probe value in words (None covers both no hooks and hooks torch
    does not inline, as torch's guard does)."""
    if value is None:
        return "no inlineable saved-tensor hooks (none, or hooks that are not both fx.GraphModule)"
    if type(value) is tuple and len(value) == 2:
        return f"GraphModule hooks with ids (pack {value[0]:#x}, unpack {value[1]:#x})"
    return short_repr(value)


def _level_text(value: Any) -> str:
    """A dual-level probe value: the int, or what the Python reader found instead."""
    if type(value) is int:
        return str(value)
    if type(value) is tuple and len(value) == 2 and value[0] == "not an int":
        return f"a {value[1].__name__} (not an int)"
    if type(value) is tuple and len(value) == 1 and value[0] == "unreadable":
        return "nothing (getattr raised)"
    return short_repr(value)


def _state_text(spec: GuardSpec, now: Any) -> str:
    """A torch probe's change, each field named: ``grad_mode expected True, got False; ...``."""
    import tripwire._core as _core

    from . import tensors

    probe, want = spec.args[0], spec.args[1]
    if probe == "torch_saved_tensors_hooks":
        return f"expected {_hooks_text(want)}, got {_hooks_text(now)}"
    if probe == "torch_dual_level":
        return f"forward-AD dual level (torch.autograd.forward_ad._current_level) expected {want}, got {_level_text(now)}"
    if probe != "torch_global_state":
        return f"expected {short_repr(want)}, got {short_repr(now)}"
    try:
        names = _core.torch_state_differences(list(want), list(now))
        exp, got = tensors.torch_state_to_dict(tuple(want)), tensors.torch_state_to_dict(tuple(now))
    except Exception:  # noqa: BLE001 - messages must not raise
        return f"expected {short_repr(want)}, got {short_repr(now)}"
    parts = []
    for n in names:
        key = n.removesuffix("_enabled").removesuffix("_dtype").removesuffix("_device")
        if key.startswith("autocast(") and key in exp and key in got:
            parts.append(f"{n} expected {exp[key]}, got {got[key]}")
        elif n in exp and n in got:
            parts.append(f"{n} expected {exp[n]}, got {got[n]}")
        else:
            parts.append(n)
    return "; ".join(parts) if parts else "changed"


def _marking_text(spec: GuardSpec, value: Any) -> str:
    """Which dimension marking changed (read with getattr, as the guard reads them)."""
    from . import tensors

    built = spec.args[0]
    try:
        if not hasattr(value, "_has_dynamo_dim_marking"):
            return "holds (no marking flag)"
        if all(s is None for s in built.attrs):
            return "the tensor is marked (_has_dynamo_dim_marking) but was not when the guard was built"
        for name, want in zip(tensors._MARKING_ATTRS, built.attrs, strict=True):
            if not hasattr(value, name):
                continue
            now = getattr(value, name)
            if want is None:
                return f"{name} is {short_repr(now)}, absent when the guard was built"
            if not now.issubset(want):
                return f"{name} {short_repr(now)} is not a subset of {short_repr(set(want))}"
        if built.dependent and hasattr(value, tensors._MARKING_GATE):
            for name, want in zip(
                tensors._MARKING_DEPENDENT, (built.shape_ids, built.unbacked_bounds), strict=True
            ):
                now = getattr(value, name, None)
                if not now == want:  # noqa: SIM201 - torch's test is ==, which a value may define apart from !=
                    return f"{name} expected {short_repr(want)}, got {short_repr(now)}"
    except Exception as e:  # noqa: BLE001 - user attributes may raise
        return f"reading the markings raised {type(e).__name__}"
    return "markings changed"


def make_failure(
    spec: GuardSpec, value: Any, error: str | None, fetch_failed: bool, fields: list | None = None
) -> Failure:
    """Build the Failure for guard ``spec`` that saw ``value`` (or could not fetch it). ``fields``:
    for TENSOR_MATCH / ARRAY_MATCH, every differing field (field, dim, expected, actual) as the
    engine read them."""
    if spec.kind is GuardKind.SHAPE and not (error is not None and "has died" in error and value is None):
        return _shape_failure(spec, value, error)
    src = str(spec.source) if spec.source is not None else None
    where = src or "global state"
    kind = spec.kind.name
    expected = spec.expected
    if fetch_failed:
        reason = f"{where}: cannot be read ({error}); {kind} expected {short_repr(expected)}"
        return Failure(src, kind, expected, None, reason, spec)
    if error is not None and "has died" in error and value is None:
        return Failure(src, kind, expected, None, f"{where}: {kind} can never pass: {error}", spec)
    actual = _actual(spec, value)
    if error is not None:
        reason = f"{where}: {kind} raised {error}"
    elif fields:
        details = "; ".join(_field_text(spec, f[0], f[1], f[2], f[3], value) for f in fields)
        reason = f"{where}: {kind} {details}"
    elif spec.kind is GuardKind.DIMENSION_MARKING:
        reason = f"{where}: {kind} {_marking_text(spec, value)}"
    elif spec.kind is GuardKind.DISPATCH_KEY_SET_MATCH:
        actual, reason = _key_set_text(spec, value, where)
    elif spec.kind is GuardKind.STORAGE_OVERLAPPING and type(value) is tuple:
        reason = (
            f"{where}: STORAGE_OVERLAPPING expected {spec.expected} (torch's rule on storage offsets, "
            "sizes and strides), got another overlap relation or a non-tensor"
        )
    elif spec.kind in (GuardKind.ALIAS, GuardKind.NO_ALIAS) and type(value) is tuple:
        reason = f"{where}: {_relation_text(spec, value)}"
    elif spec.kind is GuardKind.GLOBAL_STATE and spec.args[0] in _TORCH_PROBES:
        import tripwire._core as _core

        try:
            now = _core.read_builtin_probe(spec.args[0])
        except Exception as e:  # noqa: BLE001
            now = f"<unreadable: {type(e).__name__}>"
        actual = now
        reason = f"global state {spec.args[2]!r} changed: {_state_text(spec, now)}"
    elif spec.kind is GuardKind.GLOBAL_STATE:
        reason = f"global state {spec.args[2]!r} changed: expected {short_repr(expected)}"
    else:
        reason = f"{where}: {kind} expected {short_repr(expected)}, got {short_repr(actual)} ({spec.describe()} is false)"
    return Failure(src, kind, expected, actual, reason, spec)

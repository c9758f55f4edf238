"""Torch leaf guards on tensors and on torch's own state -> tripwire's tensor and GLOBAL_STATE
kinds: TENSOR_MATCH, the dimension markings, the global-state snapshots (grad mode, the
torch-function mode stack, the default device, saved-tensor hooks, the forward-AD level) and
DISPATCH_KEY_SET_MATCH with its Python form :class:`DispatchKeySetMatch` (``_rules.LEAF_RULES``
maps the kinds to the ``leaf_*`` methods). torch is imported here only inside the rules: a tree
with these leaves comes from a process that has it."""

from __future__ import annotations

import ast
import re
import sys
from typing import Any

import tripwire._core as _core

from ..catalogue import GuardKind
from ._convert import ConverterBase, _Fallback, _Node
from ._printed import details, literal, parse
from ._tree import split_site


class TorchLeafRules(ConverterBase):
    """The leaf rules of the converter for tensors and torch's state."""

    def leaf_tensor_match(self, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        import torch

        from ..tensors import TensorExpectation, dtype_code, ensure_torch

        ensure_torch()
        d = details("TENSOR_MATCH", [code])
        if d is None:
            raise _Fallback("a check_tensor form tripwire does not parse (a layout without strides?)")
        t = node.torch.example_type
        if not (isinstance(t, type) and issubclass(t, torch.Tensor) and t.__name__ == d["pytype"]):
            raise _Fallback(f"the exact tensor type {d['pytype']} is not known")
        names = d["dispatch_keys"][len("DispatchKeySet(") : -1].split(", ")
        keys = torch._C.DispatchKeySet(torch._C.DispatchKey.Undefined)
        for n in filter(None, names):
            keys = keys | torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, n))
        if str(keys) != d["dispatch_keys"]:  # the names must rebuild exactly the set torch keeps
            raise _Fallback(f"{d['dispatch_keys']} does not rebuild from its key names")
        dtype = getattr(torch, d["dtype"].split(".", 1)[1])
        size, stride = d["size"], d["stride"]
        exp = TensorExpectation(
            keys.raw_repr(),
            dtype_code(dtype),
            -1 if d["device_index"] is None else d["device_index"],
            d["requires_grad"],
            tuple(size),
            tuple(stride),
        )
        return [self.spec(GuardKind.TENSOR_MATCH, self._src(node), (t, exp), site)], ""

    def leaf_dimension_marking(
        self, node: _Node, leaf: Any, code: str, site: str | None
    ) -> tuple[list[int], str]:
        from ..tensors import DimensionMarkings

        src = node.torch.source
        attrs: dict[str, frozenset[int] | None] = {}
        for part in (split_site(p)[0] for p in leaf.verbose_code_parts()):
            m = re.fullmatch(r"hasattr\((.*), '(\w+)'\) == False", part.strip())
            if m and m.group(1) == src:
                attrs[m.group(2)] = None
                continue
            m = re.fullmatch(
                r"\(\(getattr\((.*), '(\w+)', set\(\)\)\.issubset\((.*)\)\) if hasattr\((.*), '(\w+)'\) else True\)",
                part.strip(),
            )
            if m and m.group(1) == src == m.group(4) and m.group(2) == m.group(5):
                dims = literal(parse(m.group(3)))
                if not isinstance(dims, (set, frozenset)) or not all(type(x) is int for x in dims):
                    raise _Fallback(f"unexpected dims {m.group(3)}")
                attrs[m.group(2)] = frozenset(dims)
                continue
            raise _Fallback(f"a marking check tripwire does not parse: {part}")
        names = _core.MARKING_ATTRS
        if set(attrs) - set(names) or "_dynamo_unbacked_indices" in {
            k for k, v in attrs.items() if v is not None
        }:
            raise _Fallback("unbacked markings (their dependent attributes are not printed)")
        # torch prints a part for _dynamo_dynamic_indices and for each marking present at
        # compile time; its C++ leaf checks the others as absent (the differential tests mark
        # weak, static and dynamic dims to hold this to torch's decisions).
        full = tuple(attrs.get(n) for n in names)
        return [self.spec(GuardKind.DIMENSION_MARKING, self._src(node), (DimensionMarkings(full),), site)], ""

    def _probe(self, probe: str, snapshot: Any, site: str | None) -> list[int]:
        from ..builder import torch_snapshot
        from ..tensors import ensure_torch

        ensure_torch()
        return [
            self.spec(GuardKind.GLOBAL_STATE, None, (probe, torch_snapshot(probe, snapshot), probe), site)
        ]

    def leaf_global_state(self, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        d = details("GLOBAL_STATE", [code])
        if d is None:
            raise _Fallback("no snapshot printed")
        return self._probe("torch_global_state", d["snapshot"], site), ""

    def leaf_mode_stack(self, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        # torch prints no snapshot; its leaf compares the types of the modes on the stack with
        # those at compile time, so when it passes now, the current types are that snapshot.
        from torch.overrides import _get_current_function_mode_stack

        if not leaf({}):
            raise _Fallback("the mode stack differs now from the compiled one: its snapshot is unknown")
        stack = tuple(type(m) for m in _get_current_function_mode_stack())
        return self._probe(
            "torch_function_mode_stack", stack, site
        ), "snapshot: the stack now (torch's leaf passes)"

    def leaf_default_device(
        self, node: _Node, leaf: Any, code: str, site: str | None
    ) -> tuple[list[int], str]:
        import torch.utils._device as device_mod

        if not leaf({}):
            raise _Fallback("the default device differs now from the compiled one")
        return self._probe("torch_default_device", device_mod.CURRENT_DEVICE, site), ""

    def leaf_saved_tensors_hooks(
        self, node: _Node, leaf: Any, code: str, site: str | None
    ) -> tuple[list[int], str]:
        # torch prints the snapshot: `...top_saved_tensors_hooks ids == None` or `== (id, id)`.
        from ..tensors import _read_saved_tensors_hooks

        lhs, sep, rhs = code.partition(" ids == ")
        if not sep or not lhs.endswith("top_saved_tensors_hooks"):
            raise _Fallback("no snapshot printed")
        snapshot = ast.literal_eval(rhs.strip())
        if snapshot is not None and (
            type(snapshot) is not tuple or len(snapshot) != 2 or any(type(x) is not int for x in snapshot)
        ):
            raise _Fallback(f"an unexpected snapshot {rhs.strip()!r}")
        # torch's leaf and the printed snapshot must agree on the state now.
        if bool(leaf({})) != (_read_saved_tensors_hooks() == snapshot):
            raise _Fallback("the printed snapshot disagrees with torch's leaf")
        return self._probe("torch_saved_tensors_hooks", snapshot, site), ""

    def leaf_dispatch_key_set(
        self, node: _Node, leaf: Any, code: str, site: str | None
    ) -> tuple[list[int], str]:
        # torch prints the DispatchKeySet it saw; its leaf compares apply(value) with
        # apply(that set) taken at construction, apply being the root's LocalState (the thread's
        # include/exclude sets, Python keys masked) as last read by a root check. The expectation
        # is the printed set applied now, verified against torch's leaf just after a root check
        # refreshed its LocalState to now.
        import torch

        m = re.fullmatch(r"(.*)\.raw_repr\(\) == (DispatchKeySet\(.*\))\.raw_repr\(\)", code.strip())
        if m is None or m.group(1) != node.torch.source:
            raise _Fallback("no key set printed")
        ks = torch._C.DispatchKeySet(torch._C.DispatchKey.Undefined)
        for n in filter(None, m.group(2)[len("DispatchKeySet(") : -1].split(", ")):
            k = getattr(torch._C.DispatchKey, n, None)
            if k is None:
                raise _Fallback(f"unknown dispatch key {n}")
            ks = ks | torch._C.DispatchKeySet(k)
        if str(ks) != m.group(2):
            raise _Fallback(f"{m.group(2)} does not rebuild from its key names")
        applied = _applied_keys(torch, ks)
        if applied is None:
            raise _Fallback(
                "the set has a Python key and torch's per-thread dispatch-mode flag was not found"
            )
        match = DispatchKeySetMatch(applied)
        self.refresh_local_state()
        if bool(leaf(ks)) is not True:
            raise _Fallback("torch's leaf does not accept the printed set under the current dispatch state")
        import tripwire._core as _core

        if _core.dispatch_key_set_reader_installed():
            # The native kind: the same rule read in C++ through the adapter (fast pass, saved).
            if _core.applied_dispatch_keys(ks) != match.expected:
                raise _Fallback("the adapter's applied key set disagrees with torch's rule")
            return [self.spec(GuardKind.DISPATCH_KEY_SET_MATCH, self._src(node), (match.expected,), site)], ""
        return [self.spec(GuardKind.LAMBDA, self._src(node), (match, repr(match)), site)], (
            "a tripwire predicate applying torch's rule in Python (torch's own leaf reads the "
            "LocalState of its root's last check, which a LAMBDA calling it would not refresh)"
        )

    def leaf_dual_level(self, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        # torch prints the level it compares with: `torch.autograd.forward_ad._current_level == -1`.
        from ..tensors import _read_dual_level

        m = re.fullmatch(r"torch\.autograd\.forward_ad\._current_level == (-?\d+)", code.strip())
        if m is None:
            raise _Fallback("no level printed")
        level = int(m.group(1))
        # torch's leaf and the printed level must agree on the state now.
        if bool(leaf({})) != (_read_dual_level() == level):
            raise _Fallback("the printed level disagrees with torch's leaf")
        return self._probe("torch_dual_level", level, site), ""


def _applied_keys(torch: Any, ks: Any) -> int | None:
    """torch's LocalState::apply with the current thread's state: (ks | included) - excluded,
    the Python keys removed unless a dispatch mode without ignore_compile_internals is active
    (torch's per-thread flag, tensors._mask_python_keys). None when the set has a Python key and
    that flag is unknown: the masked and unmasked sets differ, so no answer is sound."""
    from ..tensors import _mask_python_keys

    C = torch._C
    KS = C.DispatchKeySet
    out = KS.__sub__(KS.__or__(ks, C._dispatch_tls_local_include_set()), C._dispatch_tls_local_exclude_set())
    python_keys = (C.DispatchKey.Python, C.DispatchKey.PythonTLSSnapshot, C.DispatchKey.PythonDispatcher)
    if any(KS.has(out, k) for k in python_keys):
        mask = _mask_python_keys()
        if mask is None:
            return None
        if mask:
            for k in python_keys:
                out = KS.remove(out, k)
    return int(KS.raw_repr(out))


class DispatchKeySetMatch:
    """Dynamo's DISPATCH_KEY_SET_MATCH as a predicate: the value is a torch._C.DispatchKeySet (its
    type derives from it, as torch's pybind cast requires) whose key set, with the current
    thread's include/exclude sets applied, equals ``expected`` (torch's rule). Reads through the
    class's own methods, never a subclass's overrides."""

    def __init__(self, expected: int) -> None:
        self.expected = expected

    def __call__(self, value: Any) -> bool:
        torch = sys.modules["torch"]
        if not issubclass(type(value), torch._C.DispatchKeySet):
            return False
        applied = _applied_keys(torch, value)
        return applied is not None and applied == self.expected  # None: undecidable, fails closed

    def __repr__(self) -> str:
        from ..tensors import dispatch_key_names

        return f"DISPATCH_KEY_SET_MATCH(applied keys == {dispatch_key_names(self.expected)})"

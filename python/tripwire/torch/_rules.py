"""Torch 2.13 guard kinds -> tripwire sources and guards: the walk of torch's tree and one table
per torch kind.

``LEAF_RULES`` maps each torch leaf guard class to a method of :class:`Converter`;
``ACCESSOR_RULES`` maps each torch accessor class to the step it becomes. ``PENDING_KINDS`` lists
what waits for the tensor and framework-state engine (``GuardBuilder.tensor_match``, ``alias``,
``no_alias``, a dimension-marking guard, torch state probes): adding one is a new entry in
``LEAF_RULES`` (or ``ACCESSOR_RULES``) and its removal from ``PENDING_KINDS``. Every mapping and
why it decides exactly as torch is in docs/torch.md; the differential tests check it against
``guard_manager.check``.

The rules live by role, each a class :class:`Converter` joins: ``_accessors`` (accessor ->
source step), ``_leaves`` (leaf guards on Python values), ``_torch_leaves`` (tensors and torch's
state), ``_relational`` (aliasing and overlap, decided after the walk) and ``_shape_guards``
(shape-environment relations); ``_convert`` holds the node and the state they share. This module
is the walk itself: each node's source, a DictGuardManager's own checks, and each leaf dispatched
to its rule or to a fallback.

Where tripwire has no kind that decides exactly as torch's leaf does, the default
(``fallback="torch"``) is a tripwire LAMBDA that calls torch's own leaf guard object: exact by
construction, slow, and marked as such. ``fallback="refuse"`` reports those as unsupported.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import tripwire._core as _core

from ..catalogue import GuardKind
from ._accessors import AccessorRules
from ._convert import _Blocked, _Fallback, _Node, _type_name
from ._layout import LayoutUnknown, dict_manager_length
from ._leaves import _DICT_LEN_TYPES, LeafRules
from ._printed import details, id_in, lambda_kind, rhs_literal
from ._relational import RelationalRules
from ._shape_guards import CPP_SHAPE_GUARD, SHAPE_ENV, ShapeRules
from ._torch_leaves import TorchLeafRules
from ._tree import TorchNode, split_site

__all__ = ["ACCESSOR_RULES", "LEAF_RULES", "PENDING_ACCESSORS", "PENDING_KINDS", "Converter", "known_kinds"]

# Torch kinds that wait for the tensor / framework-state engine, with the tripwire API each needs.
PENDING_KINDS: dict[str, str] = {}
# Torch kinds mapped onto tripwire's tensor / framework-state kinds (_torch_leaves, _relational).
TENSOR_KINDS: dict[str, str] = {
    "TENSOR_MATCH": "TENSOR_MATCH (type, dispatch keys, dtype, device index, requires_grad, sizes, strides)",
    "DIMENSION_DYNAMIC_MARKING_GUARD": "DIMENSION_MARKING (torch's subset rule)",
    "NO_TENSOR_ALIASING": "NO_ALIAS over the sources torch compares (its parameter exemption recorded)",
    "OBJECT_ALIASING": "ALIAS per `a is b` of torch's batched root lambda",
    "STORAGE_OVERLAPPING": "STORAGE_OVERLAPPING over the sources torch lists (its two leaves: one guard)",
    "GLOBAL_STATE": "GLOBAL_STATE torch_global_state (the snapshot torch printed)",
    "TORCH_FUNCTION_MODE_STACK": "GLOBAL_STATE torch_function_mode_stack",
    "DEFAULT_DEVICE": "GLOBAL_STATE torch_default_device",
    "AUTOGRAD_SAVED_TENSORS_HOOKS": "GLOBAL_STATE torch_saved_tensors_hooks (the ids torch printed)",
    "DUAL_LEVEL_MATCH": "GLOBAL_STATE torch_dual_level (the level torch printed)",
    "DISPATCH_KEY_SET_MATCH": "DISPATCH_KEY_SET_MATCH (torch's rule on the current thread state; without the "
    "adapter, LAMBDA DispatchKeySetMatch in Python)",
}
# The ``via`` of a guard whose source is deeper than the engine's limit (_core.MAX_SOURCE_DEPTH
# steps); ``drop=`` takes it, or the guard's own torch source.
SOURCE_DEPTH = "SOURCE_DEPTH"

# Accessors that reach into a tensor map onto the C++ tensor steps (TENSOR_SIZE, TENSOR_STRIDE,
# TENSOR_STORAGE_OFFSET, GRAD), which read what torch reads (the C++ ``sym_size(i)`` / ... /
# ``grad()`` through the adapter, failing on a non-tensor) and never a Python method. Nothing waits.
PENDING_ACCESSORS: dict[str, str] = {}
# Accessors with no tripwire step that reads the same thing.
UNSUPPORTED_ACCESSORS: dict[str, str] = {
    "TupleIteratorGetItemAccessor": "reads a tuple iterator's remaining items; tripwire has no such step",
    "SetGetItemGuardAccessor": "indexes a set by iteration order; tripwire has no such step",
    "CallFunctionNoArgsGuardAccessor": "calls an arbitrary function; tripwire only calls weak references",
    "PythonLambdaGuardAccessor": "applies a Python lambda; tripwire has no such step",
    # The (index, value) tuples torch's C++ shape guard receives its symbols through: the
    # SYMBOLIC_SHAPE_GUARD is imported from its code parts (Converter.cpp_shape_guard, which
    # reads the symbols by their own sources); any other leaf there is unsupported.
    "IndexedGuardAccessor": "packs (index, value) for torch's C++ shape guard; tripwire has no such step",
}


class _DictStorageLength:
    """``dict.__len__(v) == n``: the dict's own size (PyDict_Size), never an overridden __len__."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, v: Any) -> bool:
        return dict.__len__(v) == self.n

    def __repr__(self) -> str:
        return f"dict.__len__(v) == {self.n}"


class Converter(AccessorRules, LeafRules, TorchLeafRules, RelationalRules, ShapeRules):
    """Walks torch's tree once and emits GuardSpecs and TorchGuard records."""

    # -- the walk ----------------------------------------------------------------------------------
    def run(self, root: TorchNode) -> None:
        top = _Node(root)
        self.nodes[id(root)] = top
        self.visit(top)
        for leaf in root.mgr.get_epilogue_lambda_guards():
            self.leaf(top, leaf, epilogue=True)
        for node, leaf, kind, codes, code, site in self.deferred:
            self.relational(node, leaf, kind, codes, code, site)

    def visit(self, node: _Node) -> None:
        tn = node.torch
        if node.src is not None and not node.dead and node.blocked is None:
            self.by_source.setdefault(tn.source, node)
        if tn.manager_kind == "DictGuardManager":
            self.dict_manager(node)
        if not node.dead:
            self.learn_type(node)
            if node.blocked is None:
                self.class_dict_item(node)
        for leaf in tn.leaves:
            self.leaf(node, leaf)
        for child in tn.children:
            cn = self.child(node, child)
            self.nodes[id(child)] = cn
            self.visit(cn)

    def learn_type(self, node: _Node) -> None:
        """What every value reaching this node's children is known to be, from its own guards."""
        for leaf in node.torch.leaves:
            name = type(leaf).__name__
            if name not in ("TYPE_MATCH", "ID_MATCH", "EQUALS_MATCH"):
                continue
            try:
                code = split_site(leaf.verbose_code_parts()[0])[0]
                if name == "EQUALS_MATCH":
                    # torch's EQUALS_MATCH checks Py_TYPE(v) against the constant's type first.
                    # Learnt for printed sets only: it is what SET_CONTAINS's absent sense needs (a
                    # module's _non_persistent_buffers_set carries both guards).
                    c = rhs_literal(code)
                    if type(c) in (set, frozenset):
                        node.exact_type = type(c)
                elif name == "TYPE_MATCH":
                    obj = self.ids[id_in(code, ("___check_type_id",), node.torch.source)]
                    if isinstance(obj, type):
                        node.exact_type = obj
                else:
                    obj = self.ids[id_in(code, ("___check_obj_id", "__check_obj_id"), node.torch.source)]
                    node.exact_type = type(obj)
            except (KeyError, ValueError, IndexError, SyntaxError):  # an EQUALS_MATCH printed as no literal
                continue
        if node.exact_type is not None and issubclass(node.exact_type, dict):
            node.is_dict = True

    # -- accessors -> steps ----------------------------------------------------------------------
    def child(self, parent: _Node, tn: TorchNode) -> _Node:
        node = _Node(tn, dead=parent.dead)
        if parent.dead:
            return node
        if parent.blocked is not None:
            node.blocked = parent.blocked
            return node
        kind = tn.accessor
        try:
            rule = ACCESSOR_RULES.get(kind)
            if rule is None:
                if kind in PENDING_ACCESSORS:
                    raise _Blocked(
                        "pending", f"reached through {kind}, which waits for {PENDING_ACCESSORS[kind]}", kind
                    )
                why = UNSUPPORTED_ACCESSORS.get(kind, "an accessor kind tripwire does not know")
                raise _Blocked("unsupported", f"reached through {kind}: {why}", kind)
            rule(self, parent, node)
            if node.src is not None and len(node.src.steps) > _core.MAX_SOURCE_DEPTH:
                # Refused here rather than by the set (which would refuse the whole import): the
                # report names each guard's torch source, and drop= takes it or SOURCE_DEPTH.
                raise _Blocked(
                    "unsupported",
                    f"its source is {len(node.src.steps)} steps deep; tripwire's sources have at most "
                    f"{_core.MAX_SOURCE_DEPTH}",
                    SOURCE_DEPTH,
                )
        except _Blocked as b:
            node.blocked = b
        return node

    # -- DictGuardManager's own checks ----------------------------------------------------------
    def dict_manager(self, node: _Node) -> None:
        tn = node.torch
        t = tn.example_type
        node.exact_type, node.is_dict = t, True
        head = f"type({tn.source}) is {_type_name(t)} and len({tn.source}) == "
        if node.dead:
            self.record(
                tn,
                "DictGuardManager",
                head + "?",
                "unreachable",
                why="torch's DictGuardManager above returns before it (that dict must be empty)",
            )
            return
        try:
            n = dict_manager_length(tn.mgr)
        except LayoutUnknown as e:
            self.record(
                tn,
                "DictGuardManager",
                head + "?",
                "unsupported",
                why=f"torch's expected length is not readable: {e}",
            )
            return
        code = head + str(n)
        if n == 0:
            node.dead = True  # torch returns True right after the length: nothing below runs
        if node.blocked is not None:
            b = node.blocked
            self.record(tn, "DictGuardManager", code, b.outcome, why=b.why, via=b.via)
            return
        if node.src is None:
            self.record(tn, "DictGuardManager", code, "unsupported", why="the dict has no tripwire source")
            return
        ids = [self.spec(GuardKind.TYPE_MATCH, node.src, (t,), None)]
        why = ""
        keys = self._all_keys(node, n)
        if keys is not None:
            # Every position 0..n-1 has a key manager whose only guard is an EQUALS on a str or int
            # constant: DICT_KEYS(keys, ordered) decides exactly those n key guards and torch's
            # storage-size check at once, in one walk of the dict (PyDict_Size == n, then key i
            # type-exactly equal to keys[i]).
            node.keys = keys
            node.keys_guard = self.spec(GuardKind.DICT_KEYS, node.src, (keys, True), None)
            ids.append(node.keys_guard)
        elif n == 0:
            ids.append(self.spec(GuardKind.DICT_KEYS, node.src, ((), True), None))
        elif t in _DICT_LEN_TYPES:
            ids.append(self.spec(GuardKind.LENGTH, node.src, (n,), None))
        else:
            pred = _DictStorageLength(n)
            ids.append(
                self.spec(GuardKind.LAMBDA, node.src, (pred, f"dict.__len__({node.src}) == {n}"), None)
            )
            why = "its size is read by dict.__len__ (a Python-level predicate): the type may override __len__"
        self.record(tn, "DictGuardManager", code, "native", tuple(ids), why=why)

    def _all_keys(self, node: _Node, n: int) -> tuple | None:
        """The dict's keys in order when torch guards every position with an EQUALS on a str or int
        constant key and nothing else, else None."""
        if n == 0:
            return None
        keys: dict[int, Any] = {}
        for child in node.torch.children:
            if child.accessor != "key":
                continue
            if child.children or len(child.leaves) != 1 or type(child.leaves[0]).__name__ != "EQUALS_MATCH":
                return None
            leaf = child.leaves[0]
            try:
                k = rhs_literal(split_site(leaf.verbose_code_parts()[0])[0])
            except (ValueError, SyntaxError):
                return None
            if type(k) not in (str, int) or leaf(k) is not True:
                return None
            keys[child.index] = sys.intern(k) if type(k) is str else k
        if sorted(keys) != list(range(n)):
            return None
        return tuple(keys[i] for i in range(n))

    # -- leaf guards -----------------------------------------------------------------------------
    def leaf(self, node: _Node, leaf: Any, epilogue: bool = False) -> None:
        tn = node.torch
        kind = type(leaf).__name__
        parts = leaf.verbose_code_parts()
        codes = [split_site(p) for p in parts]
        code = "; ".join(c for c, _ in codes)
        site = next((s for _, s in codes if s), None)
        if kind == "LAMBDA_GUARD":
            kind = lambda_kind([c for c, _ in codes])
            if kind == "LAMBDA_GUARD" and epilogue:
                kind = SHAPE_ENV  # the only other epilogue lambda is OBJECT_ALIASING's
        if kind == CPP_SHAPE_GUARD and not node.dead:
            # torch's C++ shape guard: one relational leaf under the (index, value) node of each of
            # its symbols (IndexedGuardAccessor), whose verbose code parts are the relations as
            # Python prints them. Imported once, like the Python path's lambda.
            self.cpp_shape_guard(node, leaf, codes, code, site)
            return
        if node.dead:
            self.record(
                tn,
                kind,
                code,
                "unreachable",
                site=site,
                why="torch's DictGuardManager returns before it (the dict must be empty)",
            )
            return
        if (
            kind in ("NO_TENSOR_ALIASING", "OBJECT_ALIASING", "STORAGE_OVERLAPPING")
            and not node.dead
            and node.blocked is None
        ):
            # Relational: decided once every source is known (after the walk); torch shares one
            # NO_TENSOR_ALIASING leaf among all its tensors' nodes.
            self.deferred.append((node, leaf, kind, codes, code, site))
            return
        if kind in PENDING_KINDS:
            self.record(
                tn,
                kind,
                code,
                "pending",
                site=site,
                why=f"waits for {PENDING_KINDS[kind]}",
                details=details(kind, [c for c, _ in codes]),
            )
            return
        if node.blocked is not None:
            b = node.blocked
            self.record(tn, kind, code, b.outcome, site=site, why=b.why, via=b.via)
            return
        if kind == SHAPE_ENV:
            self.shape_env(node, leaf, codes, code, site)
            return
        if node.covered_by >= 0 and kind == "EQUALS_MATCH":
            # Decided by the parent's DICT_KEYS guard (every key, in order).
            self.record(tn, kind, code, "native", (node.covered_by,), site=site)
            return
        rule = LEAF_RULES.get(kind)
        try:
            if rule is None:
                raise _Fallback(f"a torch leaf kind tripwire does not know ({kind})", unknown=True)
            ids, why = rule(self, node, leaf, codes[0][0], site)
            self.record(tn, kind, code, "native", tuple(ids), why=why, site=site)
        except (_Fallback, ValueError, KeyError, IndexError, SyntaxError) as e:
            reason = (
                str(e)
                if isinstance(e, _Fallback)
                else f"cannot read its parameters ({type(e).__name__}: {e})"
            )
            unknown = isinstance(e, _Fallback) and e.unknown
            if self.fallback == "torch" and not unknown:
                i = self.torch_leaf(node, leaf, kind, code, site)
                self.record(tn, kind, code, "torch", (i,), why=reason, site=site)
            else:
                self.record(tn, kind, code, "unsupported", why=reason, site=site)


LEAF_RULES: dict[str, Callable[..., tuple[list[int], str]]] = {
    "TYPE_MATCH": Converter.leaf_type_match,
    "ID_MATCH": Converter.leaf_id_match,
    "NONE_MATCH": Converter.leaf_none,
    "NOT_NONE": Converter.leaf_not_none,
    "TRUE_MATCH": Converter.leaf_true,
    "FALSE_MATCH": Converter.leaf_false,
    "EQUALS_MATCH": Converter.leaf_equals,
    "FLOAT_IS_NAN": Converter.leaf_float_is_nan,
    "LENGTH_CHECK": Converter.leaf_length,
    "DICT_LENGTH": Converter.leaf_dict_length,
    "DICT_CONTAINS": Converter.leaf_dict_contains,
    "NO_HASATTR": Converter.leaf_no_hasattr,
    "SET_CONTAINS": Converter.leaf_set_contains,
    "DICT_VERSION": Converter.leaf_dict_version,
    "TUPLE_ITERATOR_LEN": Converter.leaf_tuple_iterator_len,
    "RANGE_ITERATOR_MATCH": Converter.leaf_range_iterator,
    "TENSOR_MATCH": Converter.leaf_tensor_match,
    "DIMENSION_DYNAMIC_MARKING_GUARD": Converter.leaf_dimension_marking,
    "GLOBAL_STATE": Converter.leaf_global_state,
    "TORCH_FUNCTION_MODE_STACK": Converter.leaf_mode_stack,
    "DEFAULT_DEVICE": Converter.leaf_default_device,
    "AUTOGRAD_SAVED_TENSORS_HOOKS": Converter.leaf_saved_tensors_hooks,
    "DUAL_LEVEL_MATCH": Converter.leaf_dual_level,
    "DISPATCH_KEY_SET_MATCH": Converter.leaf_dispatch_key_set,
}
# Leaf kinds with no exact tripwire form: evaluated by torch's own leaf (fallback="torch").
TORCH_ONLY_KINDS: dict[str, str] = {
    "COMPLEX_IS_NAN": "torch accepts a NaN in either part; tripwire's EQUALS matches NaN per part",
    "MAPPING_KEYS_MATCH": "a mappingproxy's keys() compared with Python ==",
    "FAKE_SCRIPT_TYPE_MATCH": "unwraps torch's FakeScriptObject",
    "LAMBDA_GUARD": "a Python lambda of torch's",
}


def _torch_only(why: str) -> Callable[..., tuple[list[int], str]]:
    def rule(self: Converter, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        raise _Fallback(why)

    return rule


for _k, _why in TORCH_ONLY_KINDS.items():
    LEAF_RULES[_k] = _torch_only(_why)

ACCESSOR_RULES: dict[str, Callable[[Converter, _Node, _Node], None]] = {
    "FrameLocalsGuardAccessor": Converter.acc_frame_locals,
    "GlobalsGuardAccessor": Converter.acc_globals,
    "DictGetItemGuardAccessor": Converter.acc_dict_getitem,
    "GlobalWeakRefGuardAccessor": Converter.acc_global_weakref,
    "GetAttrGuardAccessor": Converter.acc_getattr,
    "GenericGetAttrGuardAccessor": Converter.acc_generic_getattr,
    "GetGenericDictGuardAccessor": Converter.acc_generic_dict,
    "GetItemGuardAccessor": Converter.acc_getitem,
    "ListGetItemGuardAccessor": Converter.acc_list_getitem,
    "TupleGetItemGuardAccessor": Converter.acc_tuple_getitem,
    "TypeGuardAccessor": Converter.acc_type,
    "TypeDictGuardAccessor": Converter.acc_type_dict,
    "TypeMROGuardAccessor": Converter.acc_type_mro,
    "WeakRefCallGuardAccessor": Converter.acc_weakref_call,
    "CodeGuardAccessor": Converter.acc_code,
    "FuncDefaultsGuardAccessor": Converter.acc_func_defaults,
    "FuncKwDefaultsGuardAccessor": Converter.acc_func_kwdefaults,
    "ClosureGuardAccessor": Converter.acc_closure,
    "TensorPropertyGuardAccessor": Converter.acc_tensor_property,
    "GradGuardAccessor": Converter.acc_grad,
    "key": Converter.acc_dict_key,
    "value": Converter.acc_dict_value,
}


def known_kinds() -> frozenset[str]:
    """Every kind name ``drop=`` accepts."""
    return frozenset(
        {
            *LEAF_RULES,
            *TENSOR_KINDS,
            *PENDING_KINDS,
            *PENDING_ACCESSORS,
            *UNSUPPORTED_ACCESSORS,
            *ACCESSOR_RULES,
            "DictGuardManager",
            SHAPE_ENV,
            CPP_SHAPE_GUARD,
            SOURCE_DEPTH,
        }
        - {"key", "value"}
    )

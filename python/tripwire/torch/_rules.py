"""Torch 2.13 guard kinds -> tripwire sources and guards: one table per torch kind.

``LEAF_RULES`` maps each torch leaf guard class to a method of :class:`Converter`;
``ACCESSOR_RULES`` maps each torch accessor class to the step it becomes. ``PENDING_KINDS`` lists
what waits for the tensor and framework-state engine (``GuardBuilder.tensor_match``, ``alias``,
``no_alias``, a dimension-marking guard, torch state probes): adding one is a new entry in
``LEAF_RULES`` (or ``ACCESSOR_RULES``) and its removal from ``PENDING_KINDS``. Every mapping and
why it decides exactly as torch is in docs/torch.md; the differential tests check it against
``guard_manager.check``.

Where tripwire has no kind that decides exactly as torch's leaf does, the default
(``fallback="torch"``) is a tripwire LAMBDA that calls torch's own leaf guard object: exact by
construction, slow, and marked as such. ``fallback="refuse"`` reports those as unsupported.
"""

from __future__ import annotations

import ast
import collections
import math
import re
import sys
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import _core, shapes
from ..catalogue import GuardKind, GuardSpec
from ..errors import ShapeSyntaxError
from ..source import Source, StepKind, dict_keys_owner
from ._imported import TorchGuard
from ._layout import LayoutUnknown, dict_manager_length
from ._printed import (
    NO_KEY,
    call_args,
    details,
    has_nan,
    id_in,
    lambda_kind,
    literal,
    n_from_len,
    parse,
    rhs_literal,
    subscript_key,
)
from ._tree import TorchNode, split_site

__all__ = ["ACCESSOR_RULES", "LEAF_RULES", "PENDING_ACCESSORS", "PENDING_KINDS", "Converter", "known_kinds"]

# Torch kinds that wait for the tensor / framework-state engine, with the tripwire API each needs.
PENDING_KINDS: dict[str, str] = {}
# Torch kinds mapped onto tripwire's tensor / framework-state kinds (the rules below).
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
# torch's default (Python) path puts every shape-environment guard in one epilogue lambda on the
# root (guards.py GuardBuilder.SHAPE_ENV, add_python_lambda_leaf_guard_to_root); its code parts
# are the relations as torch prints them. Imported as SHAPE relations (docs/torch.md, "Shape
# guards"); a part tripwire's syntax does not cover leaves the whole lambda to torch's own object.
SHAPE_ENV = "SHAPE_ENV"
# torch's optional C++ path (enable_cpp_symbolic_shape_guards) installs the same relations as one
# relational leaf fed by IndexedGuardAccessors; imported the same way (Converter.cpp_shape_guard).
CPP_SHAPE_GUARD = "SYMBOLIC_SHAPE_GUARD"
_SIZE_STEPS = (StepKind.SIZE, StepKind.STRIDE, StepKind.STORAGE_OFFSET)
# The ``via`` of a guard whose source is deeper than the engine's limit (_core.MAX_SOURCE_DEPTH
# steps); ``drop=`` takes it, or the guard's own torch source.
SOURCE_DEPTH = "SOURCE_DEPTH"

# Accessors that reach into a tensor map onto the C++ tensor steps (TENSOR_SIZE, TENSOR_STRIDE,
# TENSOR_STORAGE_OFFSET, GRAD), which read what torch reads (the C++ ``sym_size(i)`` / ... /
# ``grad()`` through the adapter, failing on a non-tensor) and never a Python method. Nothing waits.
PENDING_ACCESSORS: dict[str, str] = {}
_TENSOR_PROPERTY_STEPS = {
    "SIZE": StepKind.TENSOR_SIZE,
    "STRIDE": StepKind.TENSOR_STRIDE,
    "STORAGE_OFFSET": StepKind.TENSOR_STORAGE_OFFSET,
}
# Accessors with no tripwire step that reads the same thing.
UNSUPPORTED_ACCESSORS: dict[str, str] = {
    "TupleIteratorGetItemAccessor": "reads a tuple iterator's remaining items; tripwire has no such step",
    "SetGetItemGuardAccessor": "indexes a set by iteration order; tripwire has no such step",
    "CallFunctionNoArgsGuardAccessor": "calls an arbitrary function; tripwire only calls weak references",
    "PythonLambdaGuardAccessor": "applies a Python lambda; tripwire has no such step",
    # The (index, value) tuples torch's C++ shape guard receives its symbols through: the
    # SYMBOLIC_SHAPE_GUARD below is imported from its code parts (Converter.cpp_shape_guard, which
    # reads the symbols by their own sources); any other leaf there is unsupported.
    "IndexedGuardAccessor": "packs (index, value) for torch's C++ shape guard; tripwire has no such step",
}

_SCALARS = (int, float, complex, str, bytes, bool, type(None))
_DICT_LEN_TYPES = (dict, collections.OrderedDict, collections.defaultdict)  # len() is dict's own


class _Blocked(Exception):
    def __init__(self, outcome: str, why: str, via: str) -> None:
        super().__init__(why)
        self.outcome, self.why, self.via = outcome, why, via


@dataclass
class _Node:
    """A torch node as the converter sees it: its tripwire source, or why it has none."""

    torch: TorchNode
    src: Source | None = None
    blocked: _Blocked | None = None
    is_globals: bool = False  # torch's G node (the globals dict itself)
    func_src: Source | None = None  # for __defaults__ / __kwdefaults__ / __closure__ nodes: the function
    role: str = ""  # "defaults", "kwdefaults", "closure", "cell"
    cell_index: int = -1
    exact_type: Any = None  # type(value) is exact_type for every value that reaches the children
    is_dict: bool = False  # every value that reaches the children is a dict (or dict subclass)
    dead: bool = False  # torch never evaluates what is below (empty DictGuardManager)
    # A DictGuardManager whose every position has a constant key guard: the keys in order, and the
    # DICT_KEYS guard that checks them all (values are then read by key, not by position).
    keys: tuple | None = None
    keys_guard: int = -1
    covered_by: int = -1  # a key manager whose EQUALS the parent's DICT_KEYS guard implements


def _type_name(t: Any) -> str:
    try:
        return f"{t.__module__}.{t.__qualname__}" if t.__module__ != "builtins" else t.__qualname__
    except Exception:  # noqa: BLE001
        return repr(t)


class _OnGlobals:
    """A predicate for tripwire's LAMBDA without a source that runs torch's leaf guard on the
    globals dict (torch's G node passes its fixed globals dict, not the frame locals)."""

    __slots__ = ("g", "leaf")

    def __init__(self, leaf: Any, g: dict) -> None:
        self.leaf, self.g = leaf, g

    def __call__(self, _f_locals: Any) -> bool:
        return bool(self.leaf(self.g))


class _DictStorageLength:
    """``dict.__len__(v) == n``: the dict's own size (PyDict_Size), never an overridden __len__."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, v: Any) -> bool:
        return dict.__len__(v) == self.n

    def __repr__(self) -> str:
        return f"dict.__len__(v) == {self.n}"


def _identity_constant(code: str, leaf: Any) -> Any:
    """The constant of torch's ``X == a.b.c`` when torch's EQUALS_MATCH on it is ``v is c``.

    torch's check is ``v is c or (type(v) is type(c) and v == c)``. For an instance of an
    immutable type (no class attribute can be assigned later) that inherits object's ``==``
    (``torch.dtype``, ``torch.layout``, ``torch.memory_format``), ``v == c`` of the same type is
    ``v is c``. The printed name is resolved through the module dicts of ``sys.modules`` only (no
    getattr, nothing runs), and torch's own leaf must accept the object found: by identity
    equality, that is torch's constant itself."""
    tree = parse(code)
    if not (isinstance(tree, ast.Compare) and len(tree.ops) == 1 and isinstance(tree.ops[0], ast.Eq)):
        raise ValueError(f"not a comparison: {code}")
    names: list[str] = []
    rhs = tree.comparators[0]
    while isinstance(rhs, ast.Attribute):
        names.append(rhs.attr)
        rhs = rhs.value
    if not isinstance(rhs, ast.Name) or not names:
        raise _Fallback("the printed constant is neither a literal nor a module attribute")
    obj: Any = sys.modules.get(rhs.id)
    for name in reversed(names):
        if type(obj) is not types.ModuleType:
            raise _Fallback(f"the printed constant's {rhs.id!r} is not a loaded module")
        obj = vars(obj).get(name, _MISSING)
        if obj is _MISSING:
            raise _Fallback(f"the printed constant's {name!r} is not in its module's dict")
    t = type(obj)
    if not (type(t) is type and t.__flags__ & _IMMUTABLETYPE and t.__eq__ is _OBJECT_EQ):
        raise _Fallback(f"a {t.__name__} constant (its == is not identity on an immutable type)")
    if leaf(obj) is not True:
        raise _Fallback("the object the printed name resolves to does not pass torch's own guard")
    return obj


_MISSING = object()
_OBJECT_EQ: Any = object.__eq__
_IMMUTABLETYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: a static or immutable type, no attribute assignment


def _simple_rule(kind: GuardKind) -> Callable[..., tuple[list[int], str]]:
    """A leaf guard with no parameters that is the tripwire kind of the same meaning."""

    def rule(self: Converter, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        return [self.spec(kind, self._src(node), (), site)], ""

    return rule


# -- the converter ----------------------------------------------------------------------------------
_PLAIN_DICTS = (dict, collections.OrderedDict)


def _is_keys_position(index: ast.AST, owner: ast.AST) -> bool:
    """Whether ``index`` is ``list(dict.keys(owner))[i]`` with a literal int i."""
    if not (isinstance(index, ast.Subscript) and isinstance(index.slice, ast.Constant)):
        return False
    keys_of = dict_keys_owner(index.value)
    return type(index.slice.value) is int and keys_of is not None and ast.dump(keys_of) == ast.dump(owner)


class Converter:
    """Walks torch's tree once and emits GuardSpecs and TorchGuard records."""

    def __init__(
        self,
        *,
        ids: dict[int, Any],
        f_globals: dict | None,
        equals: str,
        fallback: str,
    ) -> None:
        self.ids = ids
        self.f_globals = f_globals
        self.equals = equals
        self.fallback = fallback
        self.specs: list[GuardSpec] = []
        self.records: list[tuple[TorchGuard, TorchNode]] = []
        self.added: list[tuple[int, str, Source]] = []  # (spec index, why, the source it protects)
        self.nodes: dict[int, _Node] = {}
        self.stricter: list[tuple[str, str]] = []  # (torch source, how tripwire's step is stricter)
        self._preconditions: set[tuple] = set()
        self.deferred: list[tuple] = []  # relational leaves, decided after the walk
        self.by_source: dict[str, _Node] = {}  # torch printed source -> node
        self._relational: dict[object, int] = {}  # id(torch leaf) (or a shared code) -> spec index
        self._called_refs: list[Source] = []  # the `X` of each `X()` the current relation reads
        self._cpp_shape_ids: dict[int, tuple[int, ...]] = {}  # first spec index -> all its relations
        # Runs torch's root check once, which re-reads the thread's dispatch-key state into the
        # root's LocalState (the leaves read it from there); set by guards_of.
        self.refresh_local_state: Callable[[], Any] = lambda: None

    # -- emitting --------------------------------------------------------------------------------
    def spec(self, kind: GuardKind, src: Source | None, args: tuple, site: str | None) -> int:
        idx = len(self.specs)
        stack = (site,) if site else ()
        self.specs.append(GuardSpec(kind, src, args, idx, stack))
        return idx

    def record(
        self, tn: TorchNode, kind: str, code: str, outcome: str, guards: tuple[int, ...] = (), **kw: Any
    ) -> None:
        self.records.append((TorchGuard(kind, tn.source, code, outcome, guards, **kw), tn))

    def add_precondition(self, protects: Source, kind: GuardKind, src: Source, args: tuple, why: str) -> None:
        """A guard torch does not have, added so that the steps below ``protects`` read what
        torch's accessors read (it makes tripwire stricter, never laxer)."""
        key = (kind, str(src), tuple(id(a) for a in args))
        if key in self._preconditions:
            return
        self._preconditions.add(key)
        i = self.spec(kind, src, args, None)
        self.added.append((i, why, protects))

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
            if name not in ("TYPE_MATCH", "ID_MATCH"):
                continue
            try:
                code = split_site(leaf.verbose_code_parts()[0])[0]
                if name == "TYPE_MATCH":
                    obj = self.ids[id_in(code, ("___check_type_id",), node.torch.source)]
                    if isinstance(obj, type):
                        node.exact_type = obj
                else:
                    obj = self.ids[id_in(code, ("___check_obj_id", "__check_obj_id"), node.torch.source)]
                    node.exact_type = type(obj)
            except (KeyError, ValueError, IndexError):
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

    def _need_parent_src(self, parent: _Node, kind: str) -> Source:
        if parent.src is None:
            raise _Blocked(
                "unsupported", f"{kind} under {parent.torch.source}, which has no tripwire source", kind
            )
        return parent.src

    def acc_frame_locals(self, parent: _Node, node: _Node) -> None:
        m = re.match(
            r"FrameLocalsGuardAccessor\(key=(.*), framelocals_idx=-?\d+\)$",
            node.torch.accessor_obj.repr(),
            re.S,
        )
        key = ast.literal_eval(m.group(1)) if m else None
        if type(key) is not str:
            raise _Blocked(
                "unsupported", "a frame local that is not named by a str", "FrameLocalsGuardAccessor"
            )
        node.src = Source.local(key)

    def acc_globals(self, parent: _Node, node: _Node) -> None:
        if self.f_globals is None:
            raise _Blocked("unsupported", "the globals dict of the frame is unknown", "GlobalsGuardAccessor")
        node.is_globals = True
        node.is_dict = True

    def _dict_key(self, node: _Node) -> Any:
        m = re.match(r"DictGetItemGuardAccessor\((.*)\)$", node.torch.accessor_obj.repr(), re.S)
        try:
            key = ast.literal_eval(m.group(1)) if m else None
        except (ValueError, SyntaxError):
            key = None
        if type(key) not in (str, int, bytes, float, bool, type(None)) or (
            type(key) is float and not math.isfinite(key)
        ):
            raise _Blocked(
                "unsupported", "a dict key tripwire's sources cannot name", "DictGetItemGuardAccessor"
            )
        return key

    def acc_dict_getitem(self, parent: _Node, node: _Node) -> None:
        key = self._dict_key(node)
        if parent.is_globals:
            if type(key) is not str:
                raise _Blocked(
                    "unsupported", "a global that is not named by a str", "DictGetItemGuardAccessor"
                )
            node.src = Source.global_(key)
            return
        if parent.role == "kwdefaults" and parent.func_src is not None and type(key) is str:
            node.src = parent.func_src.step(StepKind.KWDEFAULTS, key)
            return
        node.src = self._need_parent_src(parent, "DictGetItemGuardAccessor").dict_item(key)

    def acc_global_weakref(self, parent: _Node, node: _Node) -> None:
        m = re.match(r"GlobalWeakRefGuardAccessor\((.*)\)$", node.torch.accessor_obj.repr(), re.S)
        if not parent.is_globals or not m:
            raise _Blocked(
                "unsupported",
                "a global weak reference outside the globals dict",
                "GlobalWeakRefGuardAccessor",
            )
        node.src = Source.global_(m.group(1)).step(StepKind.WEAKREF_CALL)
        self.stricter.append((node.torch.source, "a weakref.proxy fails (torch follows proxies too)"))

    def acc_getattr(self, parent: _Node, node: _Node) -> None:
        name = node.torch.accessor_obj.get_attr_name()
        if parent.role == "cell" and name == "cell_contents" and parent.func_src is not None:
            node.src = parent.func_src.step(StepKind.CLOSURE_CELL, parent.cell_index)
            return
        node.src = self._need_parent_src(parent, "GetAttrGuardAccessor").attr(name)

    def acc_generic_getattr(self, parent: _Node, node: _Node) -> None:
        m = re.match(r"GenericGetAttrGuardAccessor\((.*)\)$", node.torch.accessor_obj.repr(), re.S)
        t = parent.exact_type
        plain = (
            t is not None
            and getattr(t, "__getattribute__", None) is object.__getattribute__
            and not hasattr(t, "__getattr__")
        )
        if not m or not plain:
            raise _Blocked(
                "unsupported",
                "object.__getattribute__ equals getattr only for a known type without "
                "__getattribute__/__getattr__ overrides",
                "GenericGetAttrGuardAccessor",
            )
        node.src = self._need_parent_src(parent, "GenericGetAttrGuardAccessor").attr(m.group(1))

    def acc_generic_dict(self, parent: _Node, node: _Node) -> None:
        src = self._need_parent_src(parent, "GetGenericDictGuardAccessor")
        node.src = src.step(StepKind.DICT)
        node.is_dict = True
        t = parent.exact_type
        if t is None or not _standard_dict_type(t):
            self.stricter.append(
                (
                    node.torch.source,
                    "tripwire's __dict__ step fails for types, for classes defining their own __dict__ "
                    "and for instance dicts that are dict subclasses (torch reads them)",
                )
            )

    def acc_getitem(self, parent: _Node, node: _Node) -> None:
        src = self._need_parent_src(parent, "GetItemGuardAccessor")
        key = subscript_key(node.torch.source)
        shown = re.match(r"GetItemGuardAccessor\((.*)\)$", node.torch.accessor_obj.repr(), re.S)
        if key is NO_KEY or not shown or shown.group(1) != str(key):
            raise _Blocked(
                "unsupported", "a __getitem__ key tripwire's sources cannot name", "GetItemGuardAccessor"
            )
        if parent.role == "defaults" and parent.func_src is not None and type(key) is int and key >= 0:
            node.src = parent.func_src.step(StepKind.DEFAULTS, key)
            return
        node.src = src.item(key)

    def _seq_item(self, parent: _Node, node: _Node, base: type, kind: str) -> None:
        m = re.match(rf"{kind}\((\d+)\)$", node.torch.accessor_obj.repr())
        if not m:
            raise _Blocked("unsupported", "an index tripwire cannot read", kind)
        i = int(m.group(1))
        if parent.role == "defaults" and parent.func_src is not None:
            node.src = parent.func_src.step(StepKind.DEFAULTS, i)
            return
        if parent.role == "closure" and parent.func_src is not None:
            node.src = self._need_parent_src(parent, kind).item(i)
            node.role, node.func_src, node.cell_index = "cell", parent.func_src, i
            return
        src = self._need_parent_src(parent, kind)
        # torch reads the list/tuple storage of any list/tuple subclass; tripwire's [i] calls
        # type(v).__getitem__. They agree when the type is known and does not override it.
        t = parent.exact_type
        if t is None:
            ex = parent.torch.example_type
            if ex is not base:
                raise _Blocked(
                    "unsupported",
                    f"{kind} on a value of unknown type (torch reads {base.__name__} storage)",
                    kind,
                )
            self.add_precondition(
                src,
                GuardKind.TYPE_MATCH,
                src,
                (base,),
                f"type({src}) is {base.__name__}: {kind} reads {base.__name__} storage, tripwire's [i] "
                f"calls __getitem__ (stricter: torch also accepts {base.__name__} subclasses here)",
            )
        elif not issubclass(t, base) or getattr(t, "__getitem__", None) is not base.__dict__["__getitem__"]:
            raise _Blocked("unsupported", f"{kind} on {_type_name(t)}, which overrides __getitem__", kind)
        elif t is not base:
            self.stricter.append(
                (node.torch.source, f"exact while {_type_name(t)}.__getitem__ stays {base.__name__}'s own")
            )
        node.src = src.item(i)

    def acc_list_getitem(self, parent: _Node, node: _Node) -> None:
        self._seq_item(parent, node, list, "ListGetItemGuardAccessor")

    def acc_tuple_getitem(self, parent: _Node, node: _Node) -> None:
        self._seq_item(parent, node, tuple, "TupleGetItemGuardAccessor")

    def acc_type(self, parent: _Node, node: _Node) -> None:
        node.src = self._need_parent_src(parent, "TypeGuardAccessor").type()

    def acc_type_dict(self, parent: _Node, node: _Node) -> None:
        # TYPE_DICT reads what torch reads, the type's tp_dict (an exact dict: CPython copies a
        # class body's namespace into a new dict). torch casts its value to a type unchecked; on a
        # value that is not a type tripwire's step is missing (the check fails).
        node.src = self._need_parent_src(parent, "TypeDictGuardAccessor").type_dict()
        node.exact_type, node.is_dict = dict, True

    def acc_type_mro(self, parent: _Node, node: _Node) -> None:
        # TYPE_MRO reads tp_mro, always an exact tuple (CPython converts what mro() returns).
        node.src = self._need_parent_src(parent, "TypeMROGuardAccessor").type_mro()
        node.exact_type = tuple

    def acc_tensor_property(self, parent: _Node, node: _Node) -> None:
        kind = "TensorPropertyGuardAccessor"
        src = self._need_parent_src(parent, kind)
        text = node.torch.accessor_obj.repr()
        m = re.match(r"TensorPropertyGuardAccessor<(?:TensorProperty::)?(\w+)>\((-?\d+)\)$", text)
        step = _TENSOR_PROPERTY_STEPS.get(m.group(1)) if m else None
        if m is None or step is None:
            raise _Blocked("unsupported", f"a tensor property tripwire does not know ({text})", kind)
        index = int(m.group(2))
        if step is StepKind.TENSOR_STORAGE_OFFSET:
            node.src = src.tensor_storage_offset()
        elif index < 0:
            raise _Blocked("unsupported", f"a negative dimension ({text})", kind)
        else:
            node.src = src.step(step, index)

    def acc_grad(self, parent: _Node, node: _Node) -> None:
        node.src = self._need_parent_src(parent, "GradGuardAccessor").grad()

    def acc_weakref_call(self, parent: _Node, node: _Node) -> None:
        node.src = self._need_parent_src(parent, "WeakRefCallGuardAccessor").step(StepKind.WEAKREF_CALL)
        self.stricter.append((node.torch.source, "a weakref.proxy fails (torch follows proxies too)"))

    def _function_like(self, parent: _Node, kind: str) -> Source:
        """torch's function accessors unwrap a bound method and then require a function; tripwire's
        steps read attributes of anything. Make the value a function (or a method of one)."""
        src = self._need_parent_src(parent, kind)
        t = parent.exact_type
        if t is types.FunctionType:
            return src
        ex = parent.torch.example_type if t is None else t
        if ex is types.FunctionType:
            self.add_precondition(
                src,
                GuardKind.TYPE_MATCH,
                src,
                (types.FunctionType,),
                f"type({src}) is function: torch's {kind} accepts only functions and bound methods "
                "(stricter: a bound method in place of the function fails)",
            )
            return src
        if ex is types.MethodType:
            if t is None:
                self.add_precondition(
                    src,
                    GuardKind.TYPE_MATCH,
                    src,
                    (types.MethodType,),
                    f"type({src}) is method: torch's {kind} unwraps bound methods (stricter: a plain "
                    "function in place of the method fails)",
                )
            self.add_precondition(
                src,
                GuardKind.TYPE_MATCH,
                src.attr("__func__"),
                (types.FunctionType,),
                f"type({src}.__func__) is function: torch's {kind} requires the method's function",
            )
            return src
        raise _Blocked("unsupported", f"{kind} on a {_type_name(ex)}", kind)

    def acc_code(self, parent: _Node, node: _Node) -> None:
        node.src = self._function_like(parent, "CodeGuardAccessor").step(StepKind.CODE)

    def acc_func_defaults(self, parent: _Node, node: _Node) -> None:
        f = self._function_like(parent, "FuncDefaultsGuardAccessor")
        node.src, node.role, node.func_src = f.attr("__defaults__"), "defaults", f

    def acc_func_kwdefaults(self, parent: _Node, node: _Node) -> None:
        f = self._function_like(parent, "FuncKwDefaultsGuardAccessor")
        node.src, node.role, node.func_src = f.attr("__kwdefaults__"), "kwdefaults", f

    def acc_closure(self, parent: _Node, node: _Node) -> None:
        f = self._function_like(parent, "ClosureGuardAccessor")
        node.src, node.role, node.func_src = f.attr("__closure__"), "closure", f

    def acc_dict_key(self, parent: _Node, node: _Node) -> None:
        node.src = self._need_parent_src(parent, "DictGuardManager").step(StepKind.DICT_KEY, node.torch.index)
        if parent.keys is not None:
            node.covered_by = parent.keys_guard

    def acc_dict_value(self, parent: _Node, node: _Node) -> None:
        src = self._need_parent_src(parent, "DictGuardManager")
        if parent.keys is not None:
            # The keys are checked in order (DICT_KEYS): the value at position i is the value of
            # key i, found by a storage lookup of that exact str/int key.
            node.src = src.dict_item(parent.keys[node.torch.index])
            return
        node.src = src.step(StepKind.DICT_VALUE, node.torch.index)

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

    def cpp_shape_guard(
        self, node: _Node, leaf: Any, codes: list[tuple[str, str | None]], code: str, site: str | None
    ) -> None:
        """torch's SYMBOLIC_SHAPE_GUARD (``enable_cpp_symbolic_shape_guards``) as SHAPE relations.

        The same leaf hangs under every symbol's node; the first occurrence imports its code parts
        (torch's ``verbose_python`` text, the relations its generated C function evaluates), the
        others share them. The relations mean what torch's Python path means: NaN fails
        ``not math.isnan(s)`` (torch's C++ function prints ``~std::isnan(s)``, which is always true;
        docs/torch.md, "Shape guards"), and arithmetic is exact (torch's C++ is unchecked int64).
        There is no torch object to fall back to (the leaf is fed by its accessors), so a part
        outside tripwire's syntax makes it unsupported."""
        tn = node.torch
        done = self._relational.get(id(leaf))
        if done is not None:
            ids = self._cpp_shape_ids[done]
            self.record(tn, CPP_SHAPE_GUARD, code, "native", ids, site=site, why="shared with the first")
            return
        # A node below the tuple accessor has no tripwire source; the relations need none.
        self.shape_env(node, leaf, codes, code, site, kind=CPP_SHAPE_GUARD)
        last = self.records[-1][0]
        if last.outcome == "native" and last.guards:
            self._relational[id(leaf)] = last.guards[0]
            self._cpp_shape_ids[last.guards[0]] = last.guards

    def shape_env(
        self,
        node: _Node,
        leaf: Any,
        codes: list[tuple[str, str | None]],
        code: str,
        site: str | None,
        kind: str = SHAPE_ENV,
    ) -> None:
        """torch's shape-environment lambda as SHAPE relations: one per relation of each code part
        (a top-level ``and`` split, so a failure names the conjunct), each installed at the user
        line torch printed for it. All or nothing: a part tripwire cannot parse leaves the whole
        lambda to torch's own guard object (fallback="torch") or reports it (fallback="refuse")."""
        tn = node.torch
        parts = [c for c, _ in codes]
        try:
            rels = [(rel, s) for c, s in codes for rel in shapes.relations_from_torch(c)]
        except ShapeSyntaxError as e:
            reason = f"a shape relation tripwire's syntax does not cover: {e}"
            if self.fallback == "torch" and kind == SHAPE_ENV:
                i = self.torch_leaf(node, leaf, SHAPE_ENV, code, site)
                self.record(tn, SHAPE_ENV, code, "torch", (i,), why=reason, site=site)
            else:
                if kind != SHAPE_ENV:
                    reason += " (torch's C++ shape guard is fed by its accessors: no torch object to call)"
                self.record(tn, kind, code, "unsupported", why=reason, site=site)
            return
        floats = {m.group(1) for p in parts for m in re.finditer(r"isnan\((L\[.*?\]|G\[.*?\])\)", p)}
        ids = [
            self.spec(
                GuardKind.SHAPE,
                None,
                (rel.text, rel.symbols, tuple(self.symbol_type(sym, floats) for sym in rel.symbols)),
                s or site,
            )
            for rel, s in rels
        ]
        guessed = sorted({str(sym) for rel, _ in rels for sym in rel.symbols if self._typed(sym) is None})
        why = (
            f"{len(ids)} SHAPE relations from {len(parts)} code parts; each symbol must have the "
            "type of its example (torch's TYPE_MATCH or TENSOR_MATCH checks it too)"
        )
        if guessed:
            why += "; typed from the relations (no TYPE_MATCH on them): " + ", ".join(guessed)
        self.record(tn, kind, code, "native", tuple(ids), why=why, site=site)

    def _typed(self, sym: Source) -> str | None:
        """A symbol's type when the tree says it: a size, stride or storage offset is an int; a
        value with an exact TYPE_MATCH/ID_MATCH of int or float is that."""
        if sym.steps and sym.steps[-1].kind in _SIZE_STEPS:
            return "int"
        text = str(sym)
        for n in self.nodes.values():
            if n.torch.source == text and n.exact_type in (int, float):
                return n.exact_type.__name__
        return None

    def symbol_type(self, sym: Source, floats: set[str]) -> str:
        """int or float: from the tree (`_typed`), else float when torch guards it against NaN
        (only float symbols get `not math.isnan(s)`), else int. A wrong guess makes tripwire
        stricter, never laxer: a value of another type fails the relation."""
        t = self._typed(sym)
        if t is not None:
            return t
        return "float" if str(sym) in floats else "int"

    def torch_leaf(self, node: _Node, leaf: Any, kind: str, code: str, site: str | None) -> int:
        text = f"torch {kind}: {code} (torch's own guard object)"
        if node.torch.accessor == "root":
            return self.spec(GuardKind.LAMBDA, None, (leaf, text), site)
        if node.is_globals:
            assert self.f_globals is not None
            return self.spec(GuardKind.LAMBDA, None, (_OnGlobals(leaf, self.f_globals), text), site)
        assert node.src is not None
        return self.spec(GuardKind.LAMBDA, node.src, (leaf, text), site)

    def _src(self, node: _Node) -> Source:
        if node.src is None:  # the root or G node: torch's leaf still decides (fallback)
            raise _Fallback("a guard on the frame or globals dict itself")
        return node.src

    def leaf_type_match(self, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        t = self.ids.get(id_in(code, ("___check_type_id",), node.torch.source))
        if not isinstance(t, type):
            raise _Fallback("torch's expected type is not reachable (no live object for its id)")
        return [self.spec(GuardKind.TYPE_MATCH, self._src(node), (t,), site)], ""

    def leaf_id_match(self, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        i = id_in(code, ("___check_obj_id", "__check_obj_id"), node.torch.source)
        if i not in self.ids:
            raise _Fallback(
                "torch's object is not reachable (not weakly referenceable, so torch keeps no record of it)"
            )
        return [self.spec(GuardKind.ID_MATCH, self._src(node), (self.ids[i],), site)], ""

    leaf_none = _simple_rule(GuardKind.NONE)
    leaf_not_none = _simple_rule(GuardKind.NOT_NONE)
    leaf_true = _simple_rule(GuardKind.TRUE)
    leaf_false = _simple_rule(GuardKind.FALSE)

    def leaf_equals(self, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        src = self._src(node)
        try:
            c = rhs_literal(code)
        except ValueError:
            # `X == torch.bool`: a constant printed by name. Where its == is identity, torch's
            # guard is `v is c`, which is tripwire's ID_MATCH.
            return [self.spec(GuardKind.ID_MATCH, src, (_identity_constant(code, leaf),), site)], ""
        # The parsed constant must be one torch's own guard accepts (type-exact and ==).
        if leaf(c) is not True:
            raise _Fallback(f"the printed constant {c!r} does not pass torch's own guard")
        if type(c) in _SCALARS and not has_nan(c) and type(c) is not bool:
            # torch: v is c or (type(v) is type(c) and v == c). For these exact builtin types ==
            # is value equality, so this is tripwire's EQUALS_MATCH (also type-exact). A parsed
            # string is interned: the values it meets are often the interned literal itself, and
            # identity is the comparison's fast path (torch holds the example's own object).
            if type(c) is str:
                c = sys.intern(c)
            return [self.spec(GuardKind.EQUALS_MATCH, src, (c,), site)], ""
        if type(c) in (tuple, list, set, frozenset, dict) and not has_nan(c) and _core.is_constant(c):
            if self.equals == "strict":
                return [self.spec(GuardKind.EQUALS_MATCH, src, (c,), site)], (
                    "stricter (equals='strict'): tripwire compares the elements type-exactly, torch with "
                    f"Python == (torch also accepts e.g. {_looser_example(c)!r})"
                )
            # torch: v is c or (type(v) is type(c) and v == c), Python's == on the elements
            # (True == 1, an element's own __eq__). EQUALS_MATCH with python_eq is exactly that,
            # decided without user code where the interpreter's comparisons decide it. A parsed
            # NaN is excluded above: torch's held NaN object equals itself by identity, ours is
            # another object.
            return [self.spec(GuardKind.EQUALS_MATCH, src, (c, True), site)], ""
        raise _Fallback(f"a {type(c).__name__} constant")

    def leaf_float_is_nan(self, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        # torch: type(v) is float and isnan(v); tripwire's EQUALS_MATCH(nan) is exactly that.
        return [self.spec(GuardKind.EQUALS_MATCH, self._src(node), (float("nan"),), site)], ""

    def leaf_length(self, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        n = n_from_len(code)
        t = node.exact_type
        # torch: PySequence_Length(v) == n (sq_length only). tripwire's LENGTH reads list/tuple
        # sizes and otherwise calls len(), which tries sq_length first: the same for sequences.
        if t is None or not issubclass(t, (list, tuple)):
            raise _Fallback(
                "torch's PySequence_Length differs from len() on values that are not known lists/tuples"
            )
        return [self.spec(GuardKind.LENGTH, self._src(node), (n,), site)], ""

    def leaf_dict_length(self, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        n = n_from_len(code)
        src = self._src(node)
        if n == 0:
            # torch: isinstance(v, dict) and PyDict_Size(v) == 0; DICT_KEYS(()) reads the storage.
            return [self.spec(GuardKind.DICT_KEYS, src, ((), True), site)], ""
        if node.exact_type in _DICT_LEN_TYPES:
            return [self.spec(GuardKind.LENGTH, src, (n,), site)], ""
        raise _Fallback("torch reads the dict's storage size; len() may call an overridden __len__")

    def leaf_dict_contains(
        self, node: _Node, leaf: Any, code: str, site: str | None
    ) -> tuple[list[int], str]:
        tree = parse(code)
        present = not (isinstance(tree, ast.UnaryOp) and isinstance(tree.op, ast.Not))
        args = call_args(code, ("___dict_contains",))
        key = literal(args[0])
        # Check the parsed key and sense against torch's own guard.
        if leaf({key: None}) is not present or leaf({}) is present:
            raise _Fallback("the printed key does not reproduce torch's guard")
        src = self._src(node)
        if not present and not node.is_dict:
            raise _Fallback("torch's 'not in' passes any non-dict; tripwire's DICT_CONTAINS fails it")
        return [self.spec(GuardKind.DICT_CONTAINS, src, (key, present), site)], ""

    def leaf_dict_version(self, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        if sys.version_info >= (3, 12):
            raise _Fallback("torch's dict versions on 3.12+ come from its own watcher")
        if node.torch.example_type is not dict:
            raise _Fallback("tripwire's DICT_VERSION needs an exact dict")
        tag = rhs_literal(code)
        if type(tag) is not int:
            raise ValueError(code)
        # 3.11: both read ma_version_tag (PEP 509, a global counter): equal tags, same dict, unchanged.
        return [self.spec(GuardKind.DICT_VERSION, self._src(node), (tag,), site)], ""

    def leaf_tuple_iterator_len(
        self, node: _Node, leaf: Any, code: str, site: str | None
    ) -> tuple[list[int], str]:
        n = rhs_literal(code)
        if type(n) is not int:
            raise ValueError(code)
        return [self.spec(GuardKind.TUPLE_ITERATOR_LEN, self._src(node), (n,), site)], ""

    def leaf_range_iterator(
        self, node: _Node, leaf: Any, code: str, site: str | None
    ) -> tuple[list[int], str]:
        start, stop, step = rhs_literal(code)
        if len(range(start, stop, step)) < 2:
            # torch compares (start, stop, step) of the rest literally; range equality (tripwire)
            # ignores them for 0 or 1 items left.
            raise _Fallback("torch compares start/stop/step even with fewer than 2 items left")
        return [self.spec(GuardKind.RANGE_ITERATOR, self._src(node), (start, stop, step), site)], ""

    # -- tensors, aliasing, torch's state ----------------------------------------------------------
    def relational(self, node: _Node, leaf: Any, kind: str, codes: list, code: str, site: str | None) -> None:
        """NO_TENSOR_ALIASING / OBJECT_ALIASING, once every node's source is known."""
        tn = node.torch
        # torch installs STORAGE_OVERLAPPING as two leaves (the overlapping and the other tensors)
        # sharing one checker and one printed code: one tripwire guard for both.
        key: object = ("STORAGE_OVERLAPPING", code) if kind == "STORAGE_OVERLAPPING" else id(leaf)
        done = self._relational.get(key)
        if done is not None:  # the same torch leaf under another tensor's node
            self.record(tn, kind, code, "native", (done,), site=site, why="shared with the first")
            return
        self._called_refs = []
        try:
            if kind == "NO_TENSOR_ALIASING":
                args = call_args(code.split("; ")[0], ("check_no_aliasing",))
                srcs = [self._relational_source(ast.unparse(a)) for a in args]
                if len(srcs) < 2:
                    raise _Fallback("fewer than two sources")
                ids = [self.spec(GuardKind.NO_ALIAS, srcs[0], (tuple(srcs[1:]),), site)]
                why = "torch's sources only (its parameter exemption: see the exemptions)"
            elif kind == "STORAGE_OVERLAPPING":
                ids, why = [self._storage_overlapping(code.split("; ")[0], site)], ""
            else:
                ids = []
                for c, _ in codes:
                    t = parse(c)
                    if not (isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Is)):
                        raise _Fallback(f"not an `a is b`: {c}")
                    a = self._relational_source(ast.unparse(t.left))
                    b = self._relational_source(ast.unparse(t.comparators[0]))
                    ids.append(self.spec(GuardKind.ALIAS, a, (b,), site))
                why = ""
            # Each `X()` the relation reads is a WEAKREF_CALL of X, which is Python's call only
            # when X is a weak reference whose __call__ is weakref.ref's own: part of this guard.
            for ref in dict.fromkeys(self._called_refs):
                ids.append(self.spec(GuardKind.TYPE_MATCH, ref, (weakref.ref,), site))
                self.stricter.append(
                    (str(ref), "type(X) is weakref.ref: torch's lambda calls X(), whatever X is")
                )
            self._relational[key] = ids[0]
            self.record(tn, kind, code, "native", tuple(ids), why=why, site=site)
        except (_Fallback, ValueError, KeyError, SyntaxError, IndexError) as e:
            if self.fallback == "torch":
                i = self.torch_leaf(node, leaf, kind, code, site)
                self._relational[key] = i
                self.record(tn, kind, code, "torch", (i,), why=str(e), site=site)
            else:
                self.record(tn, kind, code, "unsupported", why=str(e), site=site)

    def _storage_overlapping(self, code: str, site: str | None) -> int:
        """``check_overlapping(overlapping=[...], non_overlapping=[...])`` as one STORAGE_OVERLAPPING."""
        t = parse(code)
        if not (
            isinstance(t, ast.Call)
            and isinstance(t.func, ast.Name)
            and t.func.id == "check_overlapping"
            and not t.args
            and [k.arg for k in t.keywords] == ["overlapping", "non_overlapping"]
            and all(isinstance(k.value, ast.List) for k in t.keywords)
        ):
            raise _Fallback(f"not a check_overlapping form tripwire reads: {code}")
        groups = [[self._relational_source(ast.unparse(e)) for e in cast_list(k.value)] for k in t.keywords]
        srcs = groups[0] + groups[1]
        if len(srcs) < 2 or len(set(srcs)) != len(srcs) or len(groups[0]) == 1:
            raise _Fallback(f"an overlap relation tripwire does not build: {code}")
        return self.spec(GuardKind.STORAGE_OVERLAPPING, srcs[0], (tuple(srcs[1:]), len(groups[0])), site)

    def _relational_source(self, printed: str) -> Source:
        """The tripwire source of a source torch's lambda reads. A node of the walk gives it; else
        it is built from the printed expression, only where a step reads exactly what Python's
        evaluation of the lambda reads: a frame local ``L['name']``, a global ``G['name']``,
        ``.attr`` (getattr), ``[key]`` (``dict.__getitem__`` on a node known to hold exact dicts,
        else operator.getitem: what Python's subscript calls), and ``X()`` (the referent of a weak
        reference; the caller adds ``type(X) is weakref.ref``, see relational()). A missing value
        fails the relation, as an exception in torch's lambda fails its guard."""
        n = self.by_source.get(printed)
        if n is not None and n.src is not None:
            return n.src
        tree = parse(printed)
        if isinstance(tree, ast.Attribute):
            return self._relational_source(ast.unparse(tree.value)).attr(tree.attr)
        if isinstance(tree, ast.Subscript) and isinstance(tree.slice, ast.Constant):
            base = ast.unparse(tree.value)
            key = tree.slice.value
            if base == "L" and type(key) is str:
                return Source.parse(printed)
            if base == "G" and type(key) is str and self.f_globals is not None:
                return Source.global_(key)
            parent = self.by_source.get(base)
            if parent is not None and parent.src is not None and parent.exact_type is dict:
                return parent.src.dict_item(key)
            if type(key) in (str, int, bytes, bool, type(None)) and base not in ("L", "G"):
                return self._relational_source(base).item(key)
        if isinstance(tree, ast.Subscript) and _is_keys_position(tree.slice, tree.value):
            # X[list(dict.keys(X))[i]]: the value at insertion position i. Exact when X's node is
            # a DictGuardManager of dict or OrderedDict (its type guard is in the same set, and
            # both subscript through dict's own lookup, which DICT_VALUE's storage read equals).
            parent = self.by_source.get(ast.unparse(tree.value))
            if parent is not None and parent.src is not None and parent.exact_type in _PLAIN_DICTS:
                return parent.src.step(StepKind.DICT_VALUE, tree.slice.slice.value)  # type: ignore[attr-defined]
        if isinstance(tree, ast.Call) and not tree.args and not tree.keywords:
            ref = self._relational_source(ast.unparse(tree.func))
            self._called_refs.append(ref)
            return ref.step(StepKind.WEAKREF_CALL)
        raise _Fallback(f"{printed} is not a source this import reads exactly")

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
        from .. import _core

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


class _Fallback(Exception):
    def __init__(self, why: str, unknown: bool = False) -> None:
        super().__init__(why)
        self.unknown = unknown


def _looser_example(c: Any) -> Any:
    """A value torch's Python == accepts for c that tripwire's type-exact EQUALS does not."""

    def loosen(x: Any) -> Any:
        if type(x) is int:
            return float(x)
        if type(x) is tuple:
            return tuple(loosen(e) for e in x)
        if type(x) is list:
            return [loosen(e) for e in x]
        return x

    return loosen(c)


def _standard_dict_type(t: type) -> bool:
    """Whether ``X.__dict__`` of an instance of t is the interpreter's instance dict."""
    if issubclass(t, type):
        return False
    for k in t.__mro__:
        d = k.__dict__.get("__dict__")
        if d is not None:
            return type(d).__name__ == "getset_descriptor"
    return False


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
    "NO_HASATTR": "torch's PyObject_HasAttr counts any exception as absent; tripwire's HASATTR fails on it",
    "SET_CONTAINS": "tripwire's DICT_CONTAINS is for dicts",
    "COMPLEX_IS_NAN": "torch accepts a NaN in either part; tripwire's EQUALS matches NaN per part",
    "MAPPING_KEYS_MATCH": "a mappingproxy's keys() compared with Python ==",
    "FAKE_SCRIPT_TYPE_MATCH": "unwraps torch's FakeScriptObject",
    "LAMBDA_GUARD": "a Python lambda of torch's",
}


def cast_list(node: ast.expr) -> list[ast.expr]:
    """The elements of an ``ast.List`` (checked by the caller)."""
    return node.elts if isinstance(node, ast.List) else []


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

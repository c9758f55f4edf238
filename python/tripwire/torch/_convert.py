"""What every rule of the torch import builds on: the converter's view of a torch node
(:class:`_Node`), the two ways a rule gives up (:class:`_Blocked` for a node without a source,
:class:`_Fallback` for a leaf without an exact tripwire form), and :class:`ConverterBase`, the
converter's state with what every rule emits through (``spec``, ``record``, ``add_precondition``,
``torch_leaf``: torch's own leaf object as a LAMBDA)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..catalogue import GuardKind, GuardSpec
from ..source import Source
from ._imported import TorchGuard
from ._tree import TorchNode


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


class _Fallback(Exception):
    def __init__(self, why: str, unknown: bool = False) -> None:
        super().__init__(why)
        self.unknown = unknown


class ConverterBase:
    """The converter's state and its emitting helpers; the rule classes (``_accessors``,
    ``_leaves``, ``_torch_leaves``, ``_relational``, ``_shape_guards``) extend it and
    ``_rules.Converter`` joins them with the walk."""

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
        self._type_lookups: set[tuple[int, str]] = set()  # (id(type), name) guarded by type_lookup
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

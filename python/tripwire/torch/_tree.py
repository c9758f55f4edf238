"""Reading torch 2.13's guard manager tree: the cache entry, its nodes, their leaf guards.

Nothing here maps anything to tripwire (that is ``_rules``); this module only answers "what did
torch install, where, with which parameters", from torch's own objects:

* the cache entry: ``torch._dynamo.eval_frame._debug_get_cache_entry_list(code)[entry]``;
* the nodes: ``guard_manager.root``, ``get_accessors()`` / ``get_child_managers()`` (pairwise),
  ``DictGuardManager.get_key_value_managers()``, ``get_epilogue_lambda_guards()``;
* the parameters of a leaf guard: torch's bindings expose only ``verbose_code_parts()`` (and
  ``__call__``), so they are parsed from the code part torch printed (``___check_type_id(X, id)``,
  ``X == 3``...), and every parsed value is checked against the leaf itself before it is used;
* the objects behind ``___check_type_id`` / ``___check_obj_id`` ids: torch keeps a
  ``weakref.finalize`` per identity-matched object (``CheckFunctionManager.id_ref``) whose callback
  invalidates this entry; those finalizers hold a weak reference to each object, so the live
  object for each id is found there (a dead one would have invalidated the entry).
"""

from __future__ import annotations

import ast
import functools
import re
import types
import weakref
from dataclasses import dataclass, field
from typing import Any

from ..errors import TorchImportError

__all__ = [
    "Target",
    "TorchNode",
    "count_entries",
    "find_entry",
    "identity_objects",
    "resolve_target",
    "walk",
]


@dataclass
class Target:
    """What ``guards_of`` was given, resolved: the code torch compiled and the globals its frame
    reads (``G[...]``), and the object the caller passed (for messages).

    ``wrapped`` is set when torch compiled ``torch._dynamo.external_utils.wrap_inline(obj)``'s
    ``inner`` frame rather than ``obj``'s own code: torch does so for what ``torch.compile`` is
    given whose code Dynamo skips (``nn.Linear``, ``nn.Sequential``: their ``forward`` is in torch's
    skipfiles). That one code object serves every such object, its frame locals are ``args``,
    ``kwargs`` and ``fn`` (= ``wrapped``), and only the entries whose guards on ``L['fn']`` accept
    ``wrapped`` belong to it."""

    code: types.CodeType
    f_globals: dict | None
    described: str
    wrapped: Any = None
    is_wrapped: bool = False


def _torch() -> Any:
    import torch

    return torch


def _inline_code() -> types.CodeType:
    """The code of ``wrap_inline``'s ``inner``: a constant of ``wrap_inline``'s code, so one code
    object whatever it wraps."""
    from torch._dynamo import external_utils

    return external_utils.wrap_inline(_inline_code).__code__


def _wrap_target(obj: Any, described: str) -> Target:
    from torch._dynamo import external_utils

    return Target(
        _inline_code(),
        external_utils.__dict__,
        f"{described} (torch compiled wrap_inline's inner frame)",
        wrapped=obj,
        is_wrapped=True,
    )


def _compiled_callee(wrapper: Any) -> Any:
    """What a ``torch.compile`` wrapper runs under Dynamo's callback: its ``fn`` closure cell
    (torch 2.13's ``compile_wrapper``), or None when it has no such cell."""
    code = getattr(wrapper, "__code__", None)
    cells = getattr(wrapper, "__closure__", None)
    if not isinstance(code, types.CodeType) or not cells or "fn" not in code.co_freevars:
        return None
    try:
        return cells[code.co_freevars.index("fn")].cell_contents
    except ValueError:  # an empty cell
        return None


def _own_target(obj: Any) -> Target | None:
    """The code of ``obj`` itself (a module's ``forward``, a method's or function's code)."""
    torch = _torch()
    if isinstance(obj, torch.nn.Module):
        fwd = type(obj).forward
        if isinstance(fwd, types.FunctionType):
            return Target(fwd.__code__, fwd.__globals__, f"{type(obj).__qualname__}.forward")
        return None
    fn = obj.__func__ if isinstance(obj, types.MethodType) else obj
    if isinstance(fn, types.FunctionType):
        return Target(fn.__code__, fn.__globals__, fn.__qualname__)
    if isinstance(obj, types.CodeType):
        return Target(obj, None, obj.co_qualname)
    return None


def _describe(obj: Any) -> str:
    torch = _torch()
    if isinstance(obj, torch.nn.Module):
        return type(obj).__qualname__
    return getattr(obj, "__qualname__", None) or type(obj).__qualname__


def resolve_target(obj: Any) -> Target:
    """The code object (and globals) torch compiled for ``obj``: a function, a bound method, an
    ``nn.Module`` (its ``forward``, or ``wrap_inline``'s frame around it), a code object, or what
    ``torch.compile`` returned for one (an ``OptimizedModule`` or a function wrapper).

    What ``torch.compile`` returned says which frame it compiles (its wrapper's ``fn`` cell is
    ``wrap_inline(...)`` or the object's own callable). For the object itself the question is
    answered by the cache: its own code when that has entries, else ``wrap_inline``'s frame when
    an entry of it accepts the object, else its own code (whose "no entry" error names it)."""
    torch = _torch()
    orig = obj
    inline = _inline_code()
    callee = None
    if isinstance(obj, torch._dynamo.eval_frame.OptimizedModule):
        callee = _compiled_callee(obj.__dict__.get("_forward", obj.__dict__.get("forward")))
        obj = obj._orig_mod
    elif callable(obj) and getattr(obj, "_torchdynamo_orig_callable", None) is not None:
        callee = _compiled_callee(obj)
        obj = obj._torchdynamo_orig_callable
        if isinstance(obj, torch._dynamo.eval_frame.OptimizedModule):
            return resolve_target(obj)
    if getattr(callee, "__code__", None) is inline:
        return _wrap_target(_compiled_callee(callee), _describe(obj))
    own = _own_target(obj)
    if own is None and isinstance(obj, torch.nn.Module):
        raise TypeError(
            f"guards_of: {type(obj).__qualname__}.forward is not a Python function ({type(obj).forward!r})"
        )
    if own is None:
        raise TypeError(
            "guards_of: expected a function, a bound method, an nn.Module, a code object or what "
            f"torch.compile returned for one, not {type(orig).__name__}"
        )
    if callee is not None or isinstance(obj, types.CodeType) or _entries(own):
        return own
    wrapped = _wrap_target(obj, _describe(obj))
    return wrapped if _entries(wrapped) else own


def _entries(target: Target) -> list[Any]:
    """torch's cache entries of ``target.code`` that belong to it, most recently used first."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    entries = list(_debug_get_cache_entry_list(target.code))
    if not target.is_wrapped:
        return entries
    return [e for e in entries if _accepts_wrapped(e.guard_manager, target.wrapped)]


# The leaves and steps that decide whether an entry of wrap_inline's frame is for the wrapped
# object: identity and type checks only (they run no user code), on ``L['fn']`` and on a method's
# ``__self__`` / ``__func__`` (and a function's ``__code__``), read with getattr on objects whose
# attributes these are slots of (methods, functions): no property of a user class runs.
_IDENTITY_LEAVES = ("TYPE_MATCH", "ID_MATCH")
_IDENTITY_STEPS = {
    ".__self__": (types.MethodType, "__self__"),
    ".__func__": (types.MethodType, "__func__"),
    ".__code__": (types.FunctionType, "__code__"),
}


def _accepts_wrapped(gm: Any, obj: Any) -> bool:
    root = getattr(gm, "root", None)
    if root is None:  # an invalidated entry: find_entry reports it
        return True
    for mgr in root.get_child_managers():
        if mgr.get_source() == "L['fn']":
            return _identity_leaves_pass(mgr, obj)
    return True  # torch guards nothing on fn: the entry accepts any object


def _identity_leaves_pass(mgr: Any, value: Any) -> bool:
    for leaf in mgr.get_leaf_guards():
        if type(leaf).__name__ in _IDENTITY_LEAVES and not leaf(value):
            return False
    source = mgr.get_source()
    for child in mgr.get_child_managers():
        step = _IDENTITY_STEPS.get(child.get_source()[len(source) :])
        if (
            step is not None
            and isinstance(value, step[0])
            and not _identity_leaves_pass(child, getattr(value, step[1]))
        ):
            return False
    return True


def find_entry(target: Target, entry: int) -> Any:
    """The ``GuardManagerWrapper`` of cache entry ``entry`` (0 = the most recently used)."""
    from torch._dynamo.guards import DeletedGuardManagerWrapper, GuardManagerWrapper

    code = target.code
    where = f"{target.described} ({code.co_filename}:{code.co_firstlineno})"
    entries = _entries(target)
    if not entries:
        raise TorchImportError(
            f"guards_of: torch has no compiled cache entry for {where}: call the torch.compile'd "
            "function once first (or torch._dynamo.reset() cleared it)"
        )
    if type(entry) is not int:
        raise TypeError(f"guards_of: entry must be an int, not {type(entry).__name__}")
    if not -len(entries) <= entry < len(entries):
        raise TorchImportError(
            f"guards_of: entry {entry} is out of range: torch has {len(entries)} cache "
            f"entr{'y' if len(entries) == 1 else 'ies'} for {where}"
        )
    gm = entries[entry].guard_manager
    if isinstance(gm, DeletedGuardManagerWrapper) or not isinstance(gm, GuardManagerWrapper):
        reason = getattr(gm, "invalidation_reason", None) or type(gm).__name__
        raise TorchImportError(f"guards_of: cache entry {entry} of {where} is invalidated: {reason}")
    return gm


def count_entries(target: Target) -> int:
    """How many of torch's cache entries belong to ``target``."""
    return len(_entries(target))


def identity_objects(gm: Any) -> dict[int, Any]:
    """id -> live object, for every object torch matches by identity in this entry."""
    out: dict[int, Any] = {}
    for info in list(weakref.finalize._registry.values()):  # type: ignore[attr-defined]
        fn = info.func
        if not isinstance(fn, functools.partial) or getattr(fn.func, "__name__", "") != "invalidate":
            continue
        owner = getattr(fn.func, "__self__", None)
        if getattr(owner, "guard_manager", None) is not gm:
            continue
        obj = info.weakref()
        if obj is not None:
            out[id(obj)] = obj
    return out


_SITE = re.compile(r"^(?P<code>.*?)\s{2,}#\s(?P<comment>.*)$", re.S)


def split_site(part: str) -> tuple[str, str | None]:
    """``("L['x'] == 3", "f.py:12 in f")`` from torch's verbose code part
    ``"L['x'] == 3<padding>  # y = x + n  # f.py:12 in f"`` (guards.py
    ``get_verbose_code_part``; a recompile hint may follow as `` (HINT: ...)``). The code ends at
    the first ``  # `` after which the text before it parses as Python, so a ``#`` inside a
    string constant is not taken for the comment; code that is not Python (``..., type=<class
    'int'>``) ends at the first ``  # ``."""
    text = re.sub(r"\s\(HINT: .*\)$", "", part.rstrip(), flags=re.S)
    cuts = [m.start() for m in re.finditer(r"  # ", text)]
    cut = len(text)
    for c in cuts:
        try:
            ast.parse(text[:c].strip(), mode="eval")
        except SyntaxError:
            continue
        cut = c
        break
    else:
        if cuts:
            cut = cuts[0]
    sites = re.findall(r"(\S+:\d+ in [\w<>.]+)", text[cut:])
    return text[:cut].strip(), (sites[-1] if sites else None)


# -- the tree ---------------------------------------------------------------------------------------
@dataclass(eq=False)
class TorchNode:
    """One torch guard manager: its printed source, how its value is reached from the parent
    (``accessor``: the accessor kind, ``accessor_obj`` the accessor, or ``"key"``/``"value"``
    and ``index`` for a DictGuardManager's pairs), its leaf guards and its children."""

    mgr: Any
    source: str
    accessor: str  # GuardAccessor class name, "root", "key" or "value"
    accessor_obj: Any = None
    index: int = -1
    parent: TorchNode | None = None
    children: list[TorchNode] = field(default_factory=list)
    leaves: list[Any] = field(default_factory=list)

    @property
    def manager_kind(self) -> str:
        return type(self.mgr).__name__

    @property
    def example_type(self) -> Any:
        try:
            return self.mgr.get_type_of_guarded_value()
        except Exception:  # noqa: BLE001 - a dead type: unknown
            return None


# torch 2.13 binds some accessors with no Python class of their own: TensorPropertyGuardAccessor (a
# C++ template), GradGuardAccessor and IndexedGuardAccessor are all plain ``GuardAccessor`` objects
# in Python, told apart only by their repr (``TensorPropertyGuardAccessor<TensorProperty::SIZE>(0)``,
# ``GradGuardAccessor(grad)``, ``IndexedGuardAccesor(0)``, torch's spelling).
# Only these names are taken from a repr: another unnamed accessor stays ``GuardAccessor`` (unknown,
# unsupported), never a name that a rule maps onto a step.
_REPR_KINDS = {
    "TensorPropertyGuardAccessor": "TensorPropertyGuardAccessor",
    "GradGuardAccessor": "GradGuardAccessor",
    "IndexedGuardAccesor": "IndexedGuardAccessor",
    "IndexedGuardAccessor": "IndexedGuardAccessor",
}


def accessor_kind(acc: Any) -> str:
    """The accessor's class name, or for torch's unnamed ``GuardAccessor`` objects the name its repr
    starts with (so that pending/unsupported reports and ``drop=`` name the real accessor)."""
    name = type(acc).__name__
    if name != "GuardAccessor":
        return name
    try:
        text = acc.repr()
    except Exception:  # noqa: BLE001 - no repr: keep the generic name
        return name
    m = re.match(r"([A-Za-z_]\w*)", text) if isinstance(text, str) else None
    if m is None:
        return name
    return _REPR_KINDS.get(m.group(1), name)


def walk(gm: Any) -> TorchNode:
    """The tree under ``gm.root`` as TorchNodes (children in torch's current accessor order)."""
    root = TorchNode(gm.root, gm.root.get_source(), "root")
    stack = [root]
    while stack:
        node = stack.pop()
        node.leaves = list(node.mgr.get_leaf_guards())
        kids: list[TorchNode] = []
        for acc, child in zip(node.mgr.get_accessors(), node.mgr.get_child_managers(), strict=True):
            kids.append(TorchNode(child, child.get_source(), accessor_kind(acc), acc, parent=node))
        if hasattr(node.mgr, "get_key_value_managers"):
            for idx, (kmgr, vmgr) in sorted(node.mgr.get_key_value_managers().items()):
                if kmgr is not None:
                    kids.append(TorchNode(kmgr, kmgr.get_source(), "key", index=idx, parent=node))
                if vmgr is not None:
                    kids.append(TorchNode(vmgr, vmgr.get_source(), "value", index=idx, parent=node))
        node.children = kids
        stack.extend(reversed(kids))
    return root

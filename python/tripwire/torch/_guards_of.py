"""``guards_of``: the guards of one Dynamo cache entry (or of a guard manager in none), imported
as a tripwire GuardSet; ``frame_locals`` and ``install_dynamo_globals`` for checking them. The
mapping of every torch accessor and leaf kind is ``_rules``'s; the tree walk ``_tree``'s."""

from __future__ import annotations

import contextlib
import difflib
import inspect
import types
from collections.abc import Iterable
from typing import Any, Literal

from ..errors import GuardsNotImportable, TorchImportError
from ._imported import Exemption, ImportedGuardSet, TorchGuard, TorchImport


def guards_of(
    obj: Any,
    *,
    entry: int = 0,
    drop: Iterable[str] = (),
    equals: Literal["exact", "strict"] = "exact",
    fallback: Literal["torch", "refuse"] = "torch",
    strict: bool = False,
) -> ImportedGuardSet:
    """The guards of one torch.compile cache entry, as a tripwire GuardSet.

    Args:
        obj: a guard manager (``GuardManagerWrapper``, or the ``GuardedCode`` Dynamo's callback
            returns: in no cache entry), or the function, bound method, ``nn.Module`` (its ``forward``) or code object whose
            frame torch compiled, or what ``torch.compile`` returned for one of them (an
            ``OptimizedModule`` or a function wrapper). For an object whose code Dynamo skips
            (``nn.Linear``, ``nn.Sequential``, their bound methods) torch compiles the frame of
            ``torch._dynamo.external_utils.wrap_inline(obj)``'s ``inner``; the entries of that
            frame whose guards on ``fn`` accept ``obj`` are its entries, and ``check`` takes that
            frame's locals (``frame_locals`` builds them).
        entry: which cache entry (0 = the most recently used; torch keeps them in LRU order).
        drop: torch kind names (``"TENSOR_MATCH"``, ``"GradGuardAccessor"``, ...) and torch printed
            sources (``"L['x']"``: the guards on that value and below it) not to import. Each
            dropped guard is listed in ``torch_import`` and ``explain()``. A name that is neither a
            known kind nor a source of this entry raises ValueError.
        equals: ``"exact"`` (default): an EQUALS_MATCH on a container (tuple, list, set, dict)
            keeps torch's Python ``==`` semantics: tripwire's EQUALS_MATCH with ``python_eq``
            (decided without user code for exact ints, strs, floats, None and tuples/lists of
            them; Python's ``==`` otherwise); ``"strict"``: use
            tripwire's type-exact EQUALS_MATCH for them (stricter than torch: ``(1.0, 1)`` no longer
            matches ``(1, 1)``; recorded per guard).
        fallback: ``"torch"`` (default): a guard with no exact tripwire form becomes a tripwire
            LAMBDA calling torch's own guard object (exact, slow, not serializable);
            ``"refuse"``: such guards are not importable (raise unless dropped).
        strict: passed to the GuardSet (``check`` raises instead of failing on an exception).

    Returns:
        an :class:`ImportedGuardSet` whose ``check(f_locals)`` takes the locals torch's
        ``guard_manager.check`` takes (:func:`frame_locals` builds them for a call).

    Raises:
        TypeError: ``obj`` is none of the above.
        TorchImportError: no cache entry, ``entry`` out of range, or an invalidated entry.
        GuardsNotImportable: guards that cannot be imported exactly (each with its source, kind
            and reason) and were not named in ``drop``.
    """
    if equals not in ("exact", "strict"):
        raise ValueError(f"equals must be 'exact' or 'strict', not {equals!r}")
    if fallback not in ("torch", "refuse"):
        raise ValueError(f"fallback must be 'torch' or 'refuse', not {fallback!r}")
    if isinstance(drop, str):
        drop = (drop,)
    drops = tuple(drop)
    for d in drops:
        if not isinstance(d, str):
            raise TypeError(f"drop entries are kind names or sources (str), not {type(d).__name__}")

    from ._rules import Converter, known_kinds
    from ._tree import count_entries, find_entry, identity_objects, resolve_target, walk

    gm, target = _manager_of(obj)
    if gm is None:
        target = resolve_target(obj)
        gm = find_entry(target, entry)
        n_entries = count_entries(target)
    elif entry != 0:
        raise TorchImportError(f"guards_of: a guard manager is one entry: entry must be 0, not {entry!r}")
    else:
        n_entries = 1
    scope = getattr(gm, "global_scope", None) or {}
    f_globals = scope.get("G", target.f_globals)
    if target.f_globals is not None and f_globals is not target.f_globals:
        raise TorchImportError(
            f"guards_of: torch's entry for {target.described} reads another globals dict than the "
            "function's __globals__"
        )
    conv = Converter(ids=identity_objects(gm), f_globals=f_globals, equals=equals, fallback=fallback)
    conv.refresh_local_state = lambda: gm.check({})  # torch's root re-reads its LocalState first
    root = walk(gm)
    conv.run(root)

    # -- drop= ---------------------------------------------------------------------------------
    kinds = known_kinds()
    sources = {tn.source for _, tn in conv.records}
    for d in drops:
        if d not in kinds and d not in sources and not _any_node_source(root, d):
            close = difflib.get_close_matches(d, sorted(kinds | sources), n=3)
            hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
            raise ValueError(
                f"guards_of: drop={d!r} is neither a torch kind nor a source of this entry; {hint}"
                f"kinds: {', '.join(sorted(kinds))}"
            )
    kind_drops = {d for d in drops if d in kinds}
    source_drops = {d for d in drops if d not in kinds}
    records: list[TorchGuard] = []
    removed: set[int] = set()
    for g, tn in conv.records:
        if _dropped(g, tn, kind_drops, source_drops):
            why = f"{g.outcome}" + (f": {g.why}" if g.why else "")
            removed.update(g.guards)
            g = TorchGuard(g.kind, g.source, g.code, "dropped", (), why, g.via, g.site, g.details)
        records.append(g)

    bad = [g for g in records if g.outcome in ("pending", "unsupported")]
    if bad:
        raise GuardsNotImportable(_not_importable_message(target.described, bad), tuple(bad))

    added = [(i, why) for i, why, protects in conv.added if _still_protects(conv, protects, removed)]
    removed |= {i for i, _, _ in conv.added} - {i for i, _ in added}
    specs = [s for s in conv.specs if s.index not in removed]
    record = TorchImport(
        code_name=target.described,
        entry=entry,
        entries=n_entries,
        guards=records,
        added=added,
        stricter=conv.stricter,
        exemptions=_exemptions(gm, conv),
        options={"drop": drops, "equals": equals, "fallback": fallback},
    )
    # A guard evaluated by torch's own leaf object calls into torch's tree (the binding hands out
    # borrowed pointers to its leaves): keep that tree alive exactly as long as the set.
    calls_torch = any(g.outcome == "torch" for g in records)
    return ImportedGuardSet(specs, f_globals, record, keep_alive=gm if calls_torch else None, strict=strict)


def _manager_of(obj: Any) -> tuple[Any, Any]:
    """(guard manager, Target) when ``obj`` is a guard manager itself (a ``GuardManagerWrapper``,
    or a ``GuardedCode`` holding one: what Dynamo's callback returns, in no cache entry yet), else
    (None, None). Imports torch only when it is loaded already (nothing else can be one)."""
    import sys

    guards = sys.modules.get("torch._dynamo.guards")
    if guards is None:
        return None, None
    from torch._dynamo.types import GuardedCode

    from ._tree import Target

    code = None
    if isinstance(obj, GuardedCode):
        code, obj = obj.code, obj.guard_manager
    if isinstance(obj, guards.DeletedGuardManagerWrapper):
        reason = getattr(obj, "invalidation_reason", None) or type(obj).__name__
        raise TorchImportError(f"guards_of: the guard manager is invalidated: {reason}")
    if not isinstance(obj, guards.GuardManagerWrapper):
        return None, None
    scope = getattr(obj, "global_scope", None) or {}
    name = code.co_qualname if code is not None else "a guard manager"
    return obj, Target(code, scope.get("G"), f"{name} (a guard manager in no cache entry)")  # type: ignore[arg-type]


def _any_node_source(root: Any, s: str) -> bool:
    stack = [root]
    while stack:
        n = stack.pop()
        if n.source == s:
            return True
        stack.extend(n.children)
    return False


def _dropped(g: TorchGuard, tn: Any, kinds: set[str], sources: set[str]) -> bool:
    if g.kind in kinds or (g.via and g.via in kinds):
        return True
    # torch's C++ shape guard hangs below a TensorPropertyGuardAccessor and an IndexedGuardAccessor
    # per symbol, but tripwire imports its relations from their printed text, reading no value
    # through either accessor: naming those accessors (drop=PENDING_KINDS) does not drop it; its own
    # kind or a source does.
    by_accessor = g.kind != "SYMBOLIC_SHAPE_GUARD"
    node = tn
    while node is not None:
        if node.source in sources or (by_accessor and node.accessor in kinds and node.accessor != "root"):
            return True
        node = node.parent
    return False


def _still_protects(conv: Any, protects: Any, removed: set[int]) -> bool:
    """An added precondition stays while a kept guard reads a value below the source it protects."""
    n = len(protects.steps)
    added = {j for j, _, _ in conv.added}
    for s in conv.specs:
        if s.index in removed or s.index in added or s.source is None:
            continue
        src = s.source
        if (
            (src.root, src.name) == (protects.root, protects.name)
            and len(src.steps) > n
            and src.steps[:n] == protects.steps
        ):
            return True
    return False


def _not_importable_message(where: str, bad: list[TorchGuard]) -> str:
    kinds = sorted({g.via or g.kind for g in bad})
    lines = [
        f"guards_of({where}): {len(bad)} torch guard(s) cannot be imported exactly; name them in "
        f"drop= to import the rest without them (kinds: {', '.join(repr(k) for k in kinds)}):"
    ]
    for g in bad[:40]:
        lines.append(f"  {g.line()}")
    if len(bad) > 40:
        lines.append(f"  ... and {len(bad) - 40} more")
    return "\n".join(lines)


def _exemptions(gm: Any, conv: Any) -> list[Exemption]:
    """Where the imported guards are lax because torch's are (config defaults of torch 2.13)."""
    import torch

    cfg = torch._dynamo.config
    out: list[Exemption] = []
    flag = lambda name: bool(getattr(cfg, name, False))  # noqa: E731 - torch 2.13's config names
    tensors = [(g, tn) for g, tn in conv.records if g.kind == "TENSOR_MATCH"]
    params = [
        g.source
        for g, tn in tensors
        if isinstance(tn.example_type, type) and issubclass(tn.example_type, torch.nn.Parameter)
    ]
    if params and flag("skip_no_tensor_aliasing_guards_on_parameters"):
        out.append(
            Exemption(
                "NO_TENSOR_ALIASING",
                "parameters are exempt from torch's no-aliasing check "
                "(config.skip_no_tensor_aliasing_guards_on_parameters=True): passing the same tensor "
                "as a parameter and as an input, or tying two parameters, is not noticed",
                tuple(params),
            )
        )
    modules = sorted(
        {
            tn.source
            for _, tn in conv.records
            if isinstance(tn.example_type, type) and issubclass(tn.example_type, torch.nn.Module)
        }
    )
    if modules and flag("skip_nnmodule_hook_guards"):
        out.append(
            Exemption(
                "NN_MODULE_HOOKS",
                "torch guards no nn.Module hook dict (config.skip_nnmodule_hook_guards=True): "
                "registering or removing a hook on a guarded module still passes",
                tuple(modules),
            )
        )
    under_dicts = [g.source for g, tn in tensors if tn.accessor == "DictGetItemGuardAccessor"]
    if under_dicts and flag("skip_tensor_guards_with_matching_dict_tags"):
        out.append(
            Exemption(
                "DICT_TAG_SKIP",
                "torch skips the guards of a tensor read from a dict whose version is unchanged since "
                "its last passing check (config.skip_tensor_guards_with_matching_dict_tags=True): an "
                "in-place change of such a tensor's metadata (requires_grad_, resize_, .data=) passes; "
                "applies to TENSOR_MATCH once imported",
                tuple(under_dicts),
            )
        )
    return out


def frame_locals(obj: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """The locals torch's guards read for the call ``obj(*args, **kwargs)``: the arguments bound
    to the compiled function's parameters (defaults applied; ``self`` for a module or bound
    method) and the closure variables by name, as torch's frame-locals mapping has them. When
    torch compiled ``wrap_inline(obj)``'s frame (``nn.Linear``, ``nn.Sequential``: see
    ``guards_of``), that frame's locals: ``{"args": args, "kwargs": kwargs, "fn": obj}``."""
    from ._tree import resolve_target

    target = resolve_target(obj)
    if target.is_wrapped:
        return {"args": args, "kwargs": kwargs, "fn": target.wrapped}
    fn = _function_for(obj)
    bound_self = _self_for(obj)
    call_args = (bound_self, *args) if bound_self is not _NOTHING else args
    sig = inspect.signature(fn)
    ba = sig.bind(*call_args, **kwargs)
    ba.apply_defaults()
    out = dict(ba.arguments)
    for name, cell in zip(target.code.co_freevars, fn.__closure__ or (), strict=True):
        with contextlib.suppress(ValueError):  # an empty cell: torch's mapping has no entry either
            out[name] = cell.cell_contents
    return out


_NOTHING: Any = object()

_BUILTINS_DICT = "__builtins_dict___"
_IMPORT = "__import_"


def install_dynamo_globals(gs: Any, f_globals: dict | None = None) -> list[str]:
    """Give a loaded set the module globals ``torch.compile`` added in the compiling process.

    Dynamo installs helper globals in the compiled function's module and its guards read them:
    ``__builtins_dict___N`` (the builtins' dict) and ``__import_a_dot_b`` (module ``a.b``). A
    process that loads a ``guards_of`` set (``GuardSet.from_bytes``) without compiling lacks
    them, and the guards on them fail: safe (never a false pass) but useless. This installs
    every such name the set reads and the globals dict lacks: ``f_globals`` when given, else the
    dict the set's ``G[...]`` roots read (the ``f_globals`` given to ``from_bytes``, or the
    ``__dict__`` of the module recorded at save). A module is taken from ``sys.modules`` only,
    never imported (importing runs code): one not imported yet is left out, and its guards keep
    failing until it is imported and this is called again. Names already bound are left alone.
    Returns the names installed. Never imports torch.
    """
    import builtins
    import sys

    from ..source import RootKind

    g = f_globals if f_globals is not None else getattr(gs, "_f_globals", None)
    if type(g) is not dict:
        raise TypeError("install_dynamo_globals needs the set's globals dict (pass f_globals=)")
    names = {s.name for spec in gs.guards for s in spec.sources if s.root is RootKind.GLOBAL}
    done = []
    for name in sorted(names):
        if name in g:
            continue
        if name.startswith(_BUILTINS_DICT) and name[len(_BUILTINS_DICT) :].isdigit():
            g[name] = builtins.__dict__
        elif name.startswith(_IMPORT):
            module = sys.modules.get(name[len(_IMPORT) :].replace("_dot_", "."))
            if module is None:
                continue
            g[name] = module
        else:
            continue
        done.append(name)
    return done


def _unwrap(obj: Any) -> Any:
    import torch

    if isinstance(obj, torch._dynamo.eval_frame.OptimizedModule):
        return obj._orig_mod
    orig = getattr(obj, "_torchdynamo_orig_callable", None)
    if callable(obj) and orig is not None:
        return _unwrap(orig)
    return obj


def _function_for(obj: Any) -> types.FunctionType:
    import torch

    obj = _unwrap(obj)
    fn: Any = obj
    if isinstance(obj, torch.nn.Module):
        fn = type(obj).forward
    elif isinstance(obj, types.MethodType):
        fn = obj.__func__
    if isinstance(fn, types.FunctionType):
        return fn
    raise TypeError(f"frame_locals: needs a function, bound method or nn.Module, not {type(obj).__name__}")


def _self_for(obj: Any) -> Any:
    import torch

    obj = _unwrap(obj)
    if isinstance(obj, torch.nn.Module):
        return obj
    if isinstance(obj, types.MethodType):
        return obj.__self__
    return _NOTHING

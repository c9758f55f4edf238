"""References: objects stored by name (``module:qualname``) and fingerprint, never by pickling.

A guard set names types, functions, code objects, enum members, modules and module-level objects.
None of them can be written as data, and none may be rebuilt by running code from the data. The
format stores each as a *reference*: its kind, the module and qualified name that lead to it, and a
fingerprint of what it was (a code object's bytecode, constants and names; a type's name, module
and MRO). Loading looks the name up again and compares fingerprints: an object that is not the one
that was saved is a load error, never a silent match.

Naming is checked at save time by resolving the name back in the saving process: a name that does
not lead to the very same object (a function defined inside another, a ``functools.wraps`` wrapper
shadowing what it wraps, an instance that no module attribute holds) is refused then, with the
reason, so that ``to_bytes()`` never writes what cannot be loaded.

Lookups read ``__dict__`` entries (a module's, the classes' of an MRO, code constants): no module
``__getattr__``, metaclass hook, property or descriptor runs while a reference is resolved.
"""

from __future__ import annotations

import builtins
import enum
import functools
import hashlib
import importlib
import sys
import types
import weakref
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["RefKind", "Reference", "Unnamed", "fingerprint", "name_of", "resolve_name"]


class RefKind(enum.IntEnum):
    """What a reference names (core::codec::RefKind)."""

    TYPE = 0
    FUNCTION = 1
    CODE = 2
    ENUM_MEMBER = 3
    OBJECT = 4
    MODULE = 5


Reference = tuple[RefKind, str, str]  # kind, module, qualname


class Unnamed(Exception):
    """An object that cannot be referred to by name (the message says why)."""


_MISSING: Any = object()


# type's own descriptors for the attributes read from classes: a metaclass may define a property
# named __mro__ or __qualname__, which type.__getattribute__ would run (a data descriptor of the
# metatype wins). The getters of `type` itself run no user code.
_TYPE_GETTERS = {
    name: type.__dict__[name]
    for name in ("__mro__", "__qualname__", "__module__", "__dict__", "__name__", "__flags__")
}


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class created by a class statement (or type())


def _type_attr(t: type, name: str, default: Any = _MISSING) -> Any:
    """``t.name`` through type's own descriptor (no metaclass hook or property runs)."""
    try:
        getter = _TYPE_GETTERS.get(name)
        if getter is not None:
            return getter.__get__(t, type)
        return type.__getattribute__(t, name)
    except (AttributeError, TypeError):
        if default is _MISSING:
            raise
        return default


def _static_attr(obj: Any, name: str) -> Any:
    """``obj.name`` read from ``__dict__`` entries only: a module's dict, or the dicts of a class's
    MRO; staticmethod and classmethod wrappers are unwrapped. Raises LookupError."""
    if issubclass(type(obj), types.ModuleType):
        d = obj.__dict__
        if name in d:
            return d[name]
        raise LookupError(f"module {obj.__name__!r} has no attribute {name!r}")
    if issubclass(type(obj), type):
        for klass in _type_attr(obj, "__mro__"):
            d = _type_attr(klass, "__dict__")
            if name in d:
                v = d[name]
                if type(v) in (staticmethod, classmethod):
                    v = v.__func__
                return v
        raise LookupError(f"class {_type_attr(obj, '__qualname__', '?')!r} has no attribute {name!r}")
    raise LookupError(f"{name!r} is reached through a {type(obj).__name__}, not a module or a class")


def _code_of(obj: Any) -> types.CodeType | None:
    # type(), not isinstance(): isinstance may read a user's __class__.
    if type(obj) is types.CodeType:
        return obj
    if type(obj) is types.FunctionType:
        return obj.__code__
    return None


def _walk(module: types.ModuleType, qualname: str) -> Any:
    """The object at ``qualname`` in ``module``. ``<locals>`` steps into the code of the function
    before it, and a part after a code object is the code constant of that qualified name (a
    closure's code is a constant of its enclosing function's code, a method's of its class body's;
    the closure itself is not reachable, its code is)."""
    parts = qualname.split(".")
    obj: Any = module
    for i, part in enumerate(parts):
        if part == "<locals>":
            code = _code_of(obj)
            if code is None:
                raise LookupError(f"'<locals>' follows a {type(obj).__name__} in {qualname!r}")
            obj = code
        elif type(obj) is types.CodeType:
            want = ".".join(parts[: i + 1])
            found = [c for c in obj.co_consts if isinstance(c, types.CodeType) and c.co_qualname == want]
            if len(found) != 1:
                how = "no" if not found else str(len(found))
                raise LookupError(f"{how} code objects named {want!r} in {obj.co_qualname!r}")
            obj = found[0]
        else:
            obj = _static_attr(obj, part)
    return obj


def resolve_name(kind: RefKind, module: types.ModuleType, qualname: str) -> Any:
    """The object a reference of ``kind`` names in the (already imported) ``module``."""
    if kind is RefKind.MODULE:
        return module
    if kind is RefKind.ENUM_MEMBER:
        cls_name, _, member = qualname.rpartition(".")
        cls = _walk(module, cls_name)
        if not (issubclass(type(cls), type) and issubclass(cls, enum.Enum)):
            raise LookupError(f"{cls_name!r} is not an enum class")
        members = _type_attr(cls, "_member_map_")
        if type(members) is not dict or member not in members:
            raise LookupError(f"enum {cls_name!r} has no member {member!r}")
        return members[member]
    obj = _walk(module, qualname)
    if kind is RefKind.CODE:
        code = _code_of(obj)
        if code is None:
            raise LookupError(f"{qualname!r} is a {type(obj).__name__}, not a function or code object")
        return code
    return obj


# -- naming objects (save) ----------------------------------------------------------------------


def _module_named(name: Any) -> types.ModuleType:
    if type(name) is not str:
        raise Unnamed("it has no module name")
    mod = sys.modules.get(name)
    if not isinstance(mod, types.ModuleType):
        raise Unnamed(f"its module {name!r} is not imported")
    return mod


def _code_module(code: types.CodeType, modules_by_file: dict[str, list[str]]) -> str:
    """The module whose source file holds ``code``."""
    names = modules_by_file.get(code.co_filename, [])
    for name in names:
        mod = sys.modules.get(name)
        try:
            if mod is not None and resolve_name(RefKind.CODE, mod, code.co_qualname) is code:
                return name
        except LookupError:
            continue
    if not names:
        raise Unnamed(f"no imported module has the file {code.co_filename!r}")
    raise Unnamed(f"{code.co_qualname!r} in {code.co_filename!r} does not lead back to this code object")


def modules_by_file() -> dict[str, list[str]]:
    """Imported modules by source file (for code objects, which name their file, not their module)."""
    out: dict[str, list[str]] = {}
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None) if isinstance(mod, types.ModuleType) else None
        if type(f) is str:
            out.setdefault(f, []).append(name)
    return out


def _check_round_trip(kind: RefKind, module: str, qualname: str, obj: Any) -> Reference:
    """The reference, after checking that it leads back to ``obj`` in this process."""
    mod = _module_named(module)
    try:
        found = resolve_name(kind, mod, qualname)
    except LookupError as e:
        raise Unnamed(f"{module}:{qualname} does not resolve ({e})") from None
    if found is not obj:
        raise Unnamed(f"{module}:{qualname} names another object (a wrapper, a rebinding or a copy)")
    return (kind, module, qualname)


_TYPE_ALIAS_MODULES = ("types", "_collections_abc")


def name_of(
    obj: Any, *, global_name: tuple[str, str] | None = None, files: Callable[[], dict[str, list[str]]]
) -> Reference:
    """The reference standing for ``obj``; raises Unnamed with the reason when there is none.

    ``global_name`` is ``(module, name)`` when the object was read from a module's globals as
    ``G['name']``: any object a module attribute holds can be named that way.
    """
    t = type(obj)  # type(), not isinstance(): isinstance may read a user's __class__
    if issubclass(t, types.ModuleType):
        name = obj.__name__
        if sys.modules.get(name) is not obj:
            raise Unnamed(f"module {name!r} is not the one imported under that name")
        return (RefKind.MODULE, name, "")
    if issubclass(t, type):
        qualname = _type_attr(obj, "__qualname__", None)
        module = _type_attr(obj, "__module__", None)
        if type(qualname) is not str or "<locals>" in qualname:
            raise Unnamed(f"class {qualname!r} is defined inside a function: no name leads to it")
        try:
            return _check_round_trip(RefKind.TYPE, module, qualname, obj)
        except Unnamed:
            # Interpreter types that builtins does not export (function, NoneType, dict_keys,
            # list_iterator...) are named by the stdlib modules that do.
            for alias_module in _TYPE_ALIAS_MODULES:
                mod = sys.modules.get(alias_module)
                for name, value in (vars(mod) if mod is not None else {}).items():
                    if value is obj and not name.startswith("__"):
                        return _check_round_trip(RefKind.TYPE, alias_module, name, obj)
            raise
    if issubclass(t, enum.Enum):
        cls_ref = name_of(t, files=files)
        member = obj._name_
        return _check_round_trip(RefKind.ENUM_MEMBER, cls_ref[1], f"{cls_ref[2]}.{member}", obj)
    if t is types.CodeType:
        return _check_round_trip(RefKind.CODE, _code_module(obj, files()), obj.co_qualname, obj)
    if t in (types.FunctionType, types.BuiltinFunctionType):
        qualname, module = obj.__qualname__, obj.__module__
        try:
            if "<locals>" in qualname or "<lambda>" in qualname:
                raise Unnamed(f"function {qualname!r} is a closure or lambda: no name leads to it")
            if module is None and t is types.BuiltinFunctionType:
                raise Unnamed(f"built-in {qualname!r} is bound to an object")
            return _check_round_trip(RefKind.FUNCTION, module, qualname, obj)
        except Unnamed:
            # A functools.wraps wrapper carries the wrapped function's name; the module attribute
            # that holds it is its name.
            mod = sys.modules.get(module) if type(module) is str else None
            for name, value in (vars(mod) if isinstance(mod, types.ModuleType) else {}).items():
                if value is obj and type(name) is str and name.isidentifier():
                    return _check_round_trip(RefKind.FUNCTION, module, name, obj)
            if global_name is None:
                raise
    if global_name is not None:
        return _check_round_trip(RefKind.OBJECT, global_name[0], global_name[1], obj)
    for name, value in builtins.__dict__.items():  # NotImplemented, Ellipsis and friends
        if value is obj and not name.startswith("_"):
            return (RefKind.OBJECT, "builtins", name)
    raise Unnamed(f"a {t.__qualname__} instance is not held by any module attribute it was read from")


# -- fingerprints --------------------------------------------------------------------------------


def _const_repr(c: Any) -> str:
    if isinstance(c, types.CodeType):
        return "code:" + _code_digest(c).hex()
    if type(c) is frozenset:  # order depends on the hash seed
        return "frozenset(" + ",".join(sorted(_const_repr(x) for x in c)) + ")"
    if type(c) is tuple:
        return "(" + ",".join(_const_repr(x) for x in c) + ")"
    return f"{type(c).__name__}:{c!r}"


# A code object is immutable, so its digest is computed once per object: keyed by identity (equal
# code objects may differ in co_qualname, which the digest covers), each entry dropped when its
# code object dies, so that an id reused by a later object never finds it.
_digests: dict[int, tuple[weakref.ref, bytes]] = {}


def _forget_digest(key: int, ref: weakref.ref) -> None:
    entry = _digests.get(key)
    if entry is not None and entry[0] is ref:
        del _digests[key]


def _code_digest(code: types.CodeType) -> bytes:
    key = id(code)
    entry = _digests.get(key)
    if entry is not None and entry[0]() is code:
        return entry[1]
    digest = _compute_code_digest(code)
    try:
        ref = weakref.ref(code, functools.partial(_forget_digest, key))
    except TypeError:  # a code type that cannot be weakly referenced: no caching
        return digest
    _digests[key] = (ref, digest)
    return digest


def _compute_code_digest(code: types.CodeType) -> bytes:
    h = hashlib.sha256()
    for part in (
        code.co_code,
        repr(
            (
                code.co_qualname,
                code.co_argcount,
                code.co_posonlyargcount,
                code.co_kwonlyargcount,
                code.co_flags,
                code.co_names,
                code.co_varnames,
                code.co_freevars,
                code.co_cellvars,
            )
        ).encode(),
        _const_repr(code.co_consts).encode("utf-8", "surrogatepass"),
    ):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.digest()


def _unwrapped(v: Any) -> Any:
    """The function a chain of functools.wraps wrappers ends at (read from the functions'
    ``__dict__``: no descriptor runs), at most 16 deep."""
    for _ in range(16):
        if type(v) is not types.FunctionType:
            break
        inner = v.__dict__.get("__wrapped__")
        if type(inner) is not types.FunctionType:
            break
        v = inner
    return v


def _type_text(t: type) -> str:
    """A class by its MRO's names and, for each class of it defined in the class's own module, the
    code of the methods its body defines (an edited method makes another class; a function
    assigned onto the class later, or a decorator's wrapper under another qualname, is not
    counted; base classes of other modules and C types contribute names only)."""
    mro: Iterable[type] = _type_attr(t, "__mro__", ())
    home = _type_attr(t, "__module__", "?")
    parts = []
    for k in mro:
        qualname = _type_attr(k, "__qualname__", "?")
        module = _type_attr(k, "__module__", "?")
        parts.append(f"{module}.{qualname}")
        if module != home or not _type_attr(k, "__flags__", 0) & _HEAPTYPE:
            # A C type, or a base class of another module (a library's: torch.nn.Module), by
            # name only: a C type has no Python methods, and a library class's methods are
            # that library's, and torch.compile replaces nn.Module.__init__ and
            # __setstate__ on its first compile, which would make every nn.Module subclass differ
            # between a process that compiled and one that did not.
            continue
        d = _type_attr(k, "__dict__", {})
        for name in sorted(n for n in d if type(n) is str):
            v = d[name]
            if type(v) in (staticmethod, classmethod):
                v = v.__func__
            v = _unwrapped(v)
            # Only the methods written in the class body (qualname "Class.name"), through
            # functools.wraps wrappers: a function assigned onto the class at run time is not its
            # code.
            if type(v) is types.FunctionType and v.__qualname__ == f"{qualname}.{name}":
                parts.append(f"{name}={_code_digest(v.__code__).hex()[:16]}")
    return "|".join(parts)


def fingerprint(kind: RefKind, obj: Any) -> bytes:
    """What the object was, as 16 bytes: loading compares it with the object a name leads to.

    TYPE: module, qualname and the MRO's names. FUNCTION and CODE: the code's bytecode, constants
    (nested code by its own digest), names and signature counts, not its file or line numbers
    (a function moved within its file is the same function); a built-in by module and name.
    ENUM_MEMBER: the enum class's fingerprint and the member name. OBJECT: its type's names (and
    its code's digest, for a function).
    MODULE: the module's name only (what it holds is checked through the references into it).
    """
    if kind is RefKind.TYPE:
        text = "type|" + _type_text(obj)
    elif kind in (RefKind.FUNCTION, RefKind.CODE):
        code = _code_of(obj)
        if code is not None:
            text = f"{kind.name}|{_code_digest(code).hex()}"
        else:
            text = f"builtin|{getattr(obj, '__module__', '')}|{getattr(obj, '__qualname__', '')}|{type(obj).__name__}"
    elif kind is RefKind.ENUM_MEMBER:
        text = f"enum|{_type_text(type(obj))}|{obj._name_}"
    elif kind is RefKind.OBJECT:
        code = _code_of(obj)  # a module-level closure: what it runs, too
        text = "object|" + _type_text(type(obj)) + ("" if code is None else "|" + _code_digest(code).hex())
    else:
        text = "module"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:16]


def import_module(name: str) -> types.ModuleType:
    """``importlib.import_module``, for modules a loader was allowed to import."""
    return importlib.import_module(name)

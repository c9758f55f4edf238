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

Stored bytes are untrusted, and a reference names only what its own module defines
(:func:`resolve_name`, the one rule every loader uses): the walk from the module never steps
through another module, an instance, a class or function of another module or an attribute chain
(``__globals__``, ``__dict__``...), and the object found must be that module's by its
``__module__`` (or file, for code). Lookups read ``__dict__`` entries (a module's, a class's own,
code constants) through the types' own descriptors: no module ``__getattr__``, metaclass hook,
property or descriptor runs while a reference is resolved.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import importlib
import sys
import types
import weakref
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["CALLED_KINDS", "RefKind", "Reference", "Unnamed", "fingerprint", "name_of", "resolve_name"]


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
# The same for modules, functions and built-ins: a ModuleType subclass may define
# __getattribute__ or a __dict__ property, and a module's __getattr__ runs for any name its dict
# lacks. FunctionType and builtin_function_or_method cannot be subclassed, so their members are
# what `type(obj) is ...` objects hold.
_MODULE_DICT: Any = vars(types.ModuleType)["__dict__"]
_FUNCTION_MODULE = types.FunctionType.__dict__["__module__"]
_BUILTIN_MODULE = types.BuiltinFunctionType.__dict__["__module__"]


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


def _module_dict(mod: types.ModuleType) -> dict:
    """A module's ``__dict__``, through ModuleType's own member (no hook of a subclass runs)."""
    return _MODULE_DICT.__get__(mod)


# Methods and slots of C types: callables of their class, whose module is not the one holding them.
_DESCRIPTOR_TYPES = (
    types.MethodDescriptorType,
    types.ClassMethodDescriptorType,
    types.WrapperDescriptorType,
    types.MethodWrapperType,
    types.GetSetDescriptorType,
    types.MemberDescriptorType,
)


def _home(obj: Any) -> Any:
    """The name of the module that defines a function, a built-in, a class or a method: its
    ``__module__``, read through the type's own member (no hook runs). None when there is none (a
    built-in bound to an instance, a C type's method, a module, a code object); _MISSING for
    any other object (an instance: a module defines one by holding it)."""
    t = type(obj)  # type(), not isinstance(): isinstance may read a user's __class__
    if t is types.FunctionType:
        home = _FUNCTION_MODULE.__get__(obj)
    elif t is types.BuiltinFunctionType:
        home = _BUILTIN_MODULE.__get__(obj)
    elif issubclass(t, type):
        home = _type_attr(obj, "__module__", None)
    elif t in (types.MethodType, staticmethod, classmethod):
        inner = _home(obj.__func__)  # a member of each of these types
        return None if inner is _MISSING else inner
    elif t in _DESCRIPTOR_TYPES or t is types.CodeType or issubclass(t, types.ModuleType):
        return None
    else:
        return _MISSING
    return home if type(home) is str else None


# Attribute chains out of a module. The type rules of _walk refuse each as well (a step enters
# only a class or function of the reference's module, or a code object); naming them keeps the
# message plain.
_CHAINS = frozenset(
    (
        "__class__",
        "__globals__",
        "__builtins__",
        "__dict__",
        "__wrapped__",
        "__module__",
        "__func__",
        "__self__",
        "__code__",
        "__closure__",
        "__mro__",
        "__bases__",
        "__base__",
        "__objclass__",
        "__loader__",
        "__spec__",
    )
)

# Interpreter types that builtins does not export (function, NoneType, dict_keys, list_iterator)
# are named by the stdlib modules that hold them (`types:FunctionType`): the one exception to "a
# reference names what its own module defines". It admits only C types of builtins held directly
# by one of these modules, and only for references that are never called.
_TYPE_ALIAS_MODULES = ("types", "_collections_abc")

# What a called reference (a GLOBAL_STATE probe, a store payload) may name: a function or a class
# of its module, never an instance (whose __call__ is another module's) nor an alias.
CALLED_KINDS = (RefKind.FUNCTION, RefKind.TYPE)


def _code_of(obj: Any) -> types.CodeType | None:
    # type(), not isinstance(): isinstance may read a user's __class__.
    if type(obj) is types.CodeType:
        return obj
    if type(obj) is types.FunctionType:
        return obj.__code__
    return None


def _outside(what: str, home: Any, name: str) -> LookupError:
    where = "no module" if home is None else f"{home!r}"
    return LookupError(
        f"{what} is defined in {where}, not in {name!r}: a reference names only what its module defines"
    )


def _walk(name: str, module: types.ModuleType, qualname: str) -> Any:
    """The object at ``qualname`` in ``module`` (named ``name``), without leaving the module.

    The first part is an entry of the module's ``__dict__``. Each later part is read from the
    object before it, which must be a class or a function defined in ``name`` (by its
    ``__module__``) or a code object: a class's own ``__dict__`` (not its bases', which may be
    another module's; staticmethod and classmethod unwrapped); ``<locals>`` steps into a
    function's code; a part after a code object is the code constant of that qualified name (a
    closure's code is a constant of its enclosing function's code, a method's of its class
    body's; the closure itself is not reachable, its code is). A module object, an instance, and
    the attributes of _CHAINS are never stepped through."""
    parts = qualname.split(".")
    for part in parts:
        if not part:
            raise LookupError(f"{qualname!r} has an empty part")
        if part in _CHAINS:
            raise LookupError(f"{qualname!r} steps through {part}, which leads out of its module")
    d = _module_dict(module)
    if parts[0] not in d:
        raise LookupError(f"module {name!r} has no attribute {parts[0]!r}")
    obj = d[parts[0]]
    for i in range(1, len(parts)):
        part, t = parts[i], type(obj)
        here = ".".join(parts[:i])
        if t is types.CodeType:
            if part == "<locals>":
                continue
            want = ".".join(parts[: i + 1])
            found = [c for c in obj.co_consts if type(c) is types.CodeType and c.co_qualname == want]
            if len(found) != 1:
                how = "no" if not found else str(len(found))
                raise LookupError(f"{how} code objects named {want!r} in {obj.co_qualname!r}")
            obj = found[0]
            continue
        if t is not types.FunctionType and not issubclass(t, type):
            raise LookupError(
                f"{qualname!r} steps through {here!r}, a {t.__name__}: only a class or a function is entered"
            )
        home = _home(obj)
        if home != name:
            raise _outside(repr(here), home, name)
        if t is types.FunctionType:
            if part != "<locals>":
                raise LookupError(
                    f"{qualname!r} reads {part!r} of the function {here!r}: only '<locals>' follows a function"
                )
            obj = obj.__code__
            continue
        cd = _type_attr(obj, "__dict__")
        if part not in cd:
            raise LookupError(f"class {here!r} has no attribute {part!r}")
        obj = cd[part]
        if type(obj) in (staticmethod, classmethod):
            obj = obj.__func__
    return obj


def resolve_name(
    kind: RefKind, name: str, module: types.ModuleType, qualname: str, *, called: bool = False
) -> Any:
    """The object a reference of ``kind`` names in ``module`` (imported, under the name
    ``name``), never one that another module defines; raises LookupError saying why not.

    TYPE, FUNCTION: a class or function (Python or built-in) whose ``__module__`` is ``name``,
    reached by _walk. ENUM_MEMBER: a member of such an enum class, from the class's own
    ``_member_map_``. CODE: a code object reached by _walk whose qualified name is ``qualname``
    and whose file is the module's ``__file__``. OBJECT: an entry of the module's ``__dict__``
    (one step) that is not a module, and is not a function, class or method of another module.
    MODULE: the module itself. A TYPE in ``types`` or ``_collections_abc`` may be a C type of
    builtins held there (_TYPE_ALIAS_MODULES). ``called``: the caller will call the object, which
    must then be a function or class of the module itself (CALLED_KINDS, no alias)."""
    if not issubclass(type(module), types.ModuleType):
        raise LookupError(f"{name!r} is a {type(module).__name__} in sys.modules, not a module")
    if type(qualname) is not str:
        raise LookupError(f"the qualified name is a {type(qualname).__name__}, not a str")
    if called and kind not in CALLED_KINDS:
        raise LookupError(
            f"a {kind.name.lower()} is never called: a called reference is a function or a class"
        )
    if kind is RefKind.MODULE:
        if qualname:
            raise LookupError(f"a module reference has no qualified name ({qualname!r})")
        return module
    if kind is RefKind.OBJECT:
        if "." in qualname:
            raise LookupError(f"{qualname!r}: an object reference is one entry of its module")
        obj = _walk(name, module, qualname)
        home = _home(obj)
        if home is not _MISSING and home != name:
            raise _outside(f"{qualname!r} (a {type(obj).__name__})", home, name)
        return obj
    if kind is RefKind.ENUM_MEMBER:
        cls_name, _, member = qualname.rpartition(".")
        if not cls_name:
            raise LookupError(f"{qualname!r} is not Class.MEMBER")
        cls = _walk(name, module, cls_name)
        if not (issubclass(type(cls), type) and issubclass(cls, enum.Enum)):
            raise LookupError(f"{cls_name!r} is not an enum class")
        if _home(cls) != name:
            raise _outside(f"enum {cls_name!r}", _home(cls), name)
        # The class's own dict: type.__getattribute__ would run a metaclass property.
        members = _type_attr(cls, "__dict__").get("_member_map_")
        if type(members) is not dict or member not in members:
            raise LookupError(f"enum {cls_name!r} has no member {member!r}")
        found = members[member]
        if type(found) is not cls:
            raise LookupError(f"{qualname!r} is a {type(found).__name__}, not a member of {cls_name!r}")
        return found
    obj = _walk(name, module, qualname)
    if kind is RefKind.CODE:
        code = _code_of(obj)
        if code is None:
            raise LookupError(f"{qualname!r} is a {type(obj).__name__}, not a function or code object")
        file = _module_dict(module).get("__file__")
        if code.co_qualname != qualname or type(file) is not str or code.co_filename != file:
            raise LookupError(
                f"{qualname!r} leads to the code of {code.co_qualname!r} in {code.co_filename!r}, "
                f"not to code of {name!r} by that name"
            )
        return code
    t = type(obj)
    if kind is RefKind.TYPE:
        if not issubclass(t, type):
            raise LookupError(f"{qualname!r} is a {t.__name__}, not a type")
        home = _home(obj)
        if home != name and not (
            not called
            and name in _TYPE_ALIAS_MODULES
            and "." not in qualname
            and home == "builtins"
            and not _type_attr(obj, "__flags__") & _HEAPTYPE
        ):
            raise _outside(f"class {qualname!r}", home, name)
        return obj
    if kind is RefKind.FUNCTION:
        if t is not types.FunctionType and t is not types.BuiltinFunctionType:
            raise LookupError(f"{qualname!r} is a {t.__name__}, not a function")
        home = _home(obj)
        if home != name:
            raise _outside(f"function {qualname!r}", home, name)
        return obj
    raise LookupError(f"unknown reference kind {kind!r}")


# -- naming objects (save) ----------------------------------------------------------------------


def _module_named(name: Any) -> types.ModuleType:
    if type(name) is not str:
        raise Unnamed("it has no module name")
    mod = sys.modules.get(name)
    if not issubclass(type(mod), types.ModuleType):
        raise Unnamed(f"its module {name!r} is not imported")
    return mod  # type: ignore[return-value]


def _code_module(code: types.CodeType, modules_by_file: dict[str, list[str]]) -> str:
    """The module whose source file holds ``code``."""
    names = modules_by_file.get(code.co_filename, [])
    for name in names:
        mod = sys.modules.get(name)
        try:
            if mod is not None and resolve_name(RefKind.CODE, name, mod, code.co_qualname) is code:
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
        if issubclass(type(mod), types.ModuleType):
            f = _module_dict(mod).get("__file__")  # a dict entry: no module __getattr__ runs
            if type(f) is str:
                out.setdefault(f, []).append(name)
    return out


def _check_round_trip(kind: RefKind, module: str, qualname: str, obj: Any, called: bool) -> Reference:
    """The reference, after checking that it leads back to ``obj`` in this process, by the rules
    of the load (resolve_name): a save never writes what a load refuses."""
    mod = _module_named(module)
    try:
        found = resolve_name(kind, module, mod, qualname, called=called)
    except LookupError as e:
        raise Unnamed(f"{module}:{qualname} does not resolve ({e})") from None
    if found is not obj:
        raise Unnamed(f"{module}:{qualname} names another object (a wrapper, a rebinding or a copy)")
    return (kind, module, qualname)


def _held_by(module: Any, obj: Any) -> list[str]:
    """The names under which the module ``module`` (a name) holds ``obj`` directly."""
    mod: Any = sys.modules.get(module) if type(module) is str else None
    if not issubclass(type(mod), types.ModuleType):
        return []
    # A copy first: a finalizer run by an allocation of the loop may change the module's dict.
    items = _module_dict(mod).copy().items()
    return [k for k, v in items if v is obj and type(k) is str and k.isidentifier()]


def name_of(
    obj: Any,
    *,
    global_name: tuple[str, str] | None = None,
    files: Callable[[], dict[str, list[str]]],
    called: bool = False,
) -> Reference:
    """The reference standing for ``obj``; raises Unnamed with the reason when there is none.

    ``global_name`` is ``(module, name)`` when the object was read from a module's globals as
    ``G['name']``: an instance a module attribute holds can be named that way. ``called``: the
    loader will call the object (a GLOBAL_STATE probe, a store payload), so it must be a function
    or class its module defines (resolve_name).
    """
    t = type(obj)  # type(), not isinstance(): isinstance may read a user's __class__
    if issubclass(t, types.ModuleType):
        name = _module_dict(obj).get("__name__")
        if type(name) is not str or sys.modules.get(name) is not obj:
            raise Unnamed(f"module {name!r} is not the one imported under that name")
        return _check_round_trip(RefKind.MODULE, name, "", obj, called)
    if issubclass(t, type):
        qualname = _type_attr(obj, "__qualname__", None)
        module = _type_attr(obj, "__module__", None)
        if type(qualname) is not str or "<locals>" in qualname:
            raise Unnamed(f"class {qualname!r} is defined inside a function: no name leads to it")
        try:
            return _check_round_trip(RefKind.TYPE, module, qualname, obj, called)
        except Unnamed:
            if module == "builtins" and not called:
                for alias_module in _TYPE_ALIAS_MODULES:
                    for name in _held_by(alias_module, obj):
                        if not name.startswith("__"):
                            return _check_round_trip(RefKind.TYPE, alias_module, name, obj, called)
            raise
    if issubclass(t, enum.Enum):
        cls_ref = name_of(t, files=files)
        member = obj._name_
        return _check_round_trip(RefKind.ENUM_MEMBER, cls_ref[1], f"{cls_ref[2]}.{member}", obj, called)
    if t is types.CodeType:
        return _check_round_trip(RefKind.CODE, _code_module(obj, files()), obj.co_qualname, obj, called)
    if t in (types.FunctionType, types.BuiltinFunctionType):
        qualname, module = obj.__qualname__, obj.__module__
        try:
            if "<locals>" in qualname or "<lambda>" in qualname:
                raise Unnamed(f"function {qualname!r} is a closure or lambda: no name leads to it")
            if module is None and t is types.BuiltinFunctionType:
                raise Unnamed(f"built-in {qualname!r} is bound to an object")
            return _check_round_trip(RefKind.FUNCTION, module, qualname, obj, called)
        except Unnamed:
            # A functools.wraps wrapper carries the wrapped function's name (and module); the
            # attribute of that module that holds it is its name.
            for name in _held_by(module, obj):
                return _check_round_trip(RefKind.FUNCTION, module, name, obj, called)
            if global_name is None:
                raise
    if global_name is not None:
        return _check_round_trip(RefKind.OBJECT, global_name[0], global_name[1], obj, called)
    for name in _held_by("builtins", obj):  # NotImplemented and the site helpers (exit, help)
        if not name.startswith("_"):
            return _check_round_trip(RefKind.OBJECT, "builtins", name, obj, called)
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

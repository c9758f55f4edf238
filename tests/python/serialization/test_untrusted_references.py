"""Stored bytes are untrusted: no byte chooses code (docs/format.md, "References"; docs/store.md,
"Codecs").

Every reference names only what its own module defines, and the walk from the module never leaves
it; a reference that is called (a GLOBAL_STATE probe, a store payload) also needs its module
admitted. The attacks here use real modules written to a temporary directory and imported: an
admitted module that imports ``os``, ``subprocess`` and a library of marker functions, whose every
call is recorded (``MARK``), and whose module ``__getattr__`` records every call (``CALLS``). A
refused reference must raise FormatError with nothing recorded.
"""

from __future__ import annotations

import enum
import importlib
import json
import os
import random
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tripwire as tw
from gc_stress import examples, scaled
from tripwire import _core
from tripwire.references import RefKind, fingerprint, resolve_name
from tripwire.store import ReferenceCodec

EVIL = "twu_evil"
ADM = "twu_adm"

EVIL_SRC = """
import enum
import functools

MARK = []


def boom(*args, **kwargs):
    MARK.append(("boom", args))
    return "boom"


class Boom:
    def __init__(self, *args, **kwargs):
        MARK.append(("Boom", args))

    def go(self):
        MARK.append("go")

    @staticmethod
    def sgo():
        MARK.append("sgo")


class Color(enum.Enum):
    RED = 1


def deco(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        MARK.append("wrapper")
        return fn(*args)

    return wrapper


def outer():
    def inner():
        MARK.append("inner")

    return inner
"""

ADM_SRC = """
import enum
import os
import subprocess

import twu_evil
import twu_evil as ev
from os import abort, getpid, system
from subprocess import Popen, getoutput
from twu_evil import Boom, Color as EvilColor, boom, deco, outer

CALLS = []


def __getattr__(name):
    CALLS.append(name)
    if name.startswith("_"):
        raise AttributeError(name)
    return boom


def own(x=None):
    return "own"


def probe():
    return "probe"


class Own:
    class Inner:
        def meth(self):
            return 1

        @staticmethod
        def smeth():
            return 2

        @classmethod
        def cmeth(cls):
            return 3

    run = staticmethod(getoutput)
    P = Popen
    B = Boom
    g = boom
    ev = twu_evil


class Sub(Boom):
    pass


class Mode(enum.Enum):
    A = 1


def make():
    k = 1

    def closure():
        return k

    return closure


CLOSURE = make()
INSTANCE = Own()


@deco
def decorated():
    return "decorated"


wrapped_boom = deco(boom)
inner_alias = outer()
"""


@pytest.fixture(scope="module")
def mods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[types.ModuleType, types.ModuleType]]:
    root: Path = tmp_path_factory.mktemp("untrusted")
    (root / f"{EVIL}.py").write_text(EVIL_SRC)
    (root / f"{ADM}.py").write_text(ADM_SRC)
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    try:
        evil = importlib.import_module(EVIL)
        adm = importlib.import_module(ADM)
        yield evil, adm
    finally:
        sys.path.remove(str(root))
        for name in (EVIL, ADM):
            sys.modules.pop(name, None)


@pytest.fixture
def evil(mods: tuple[types.ModuleType, types.ModuleType]) -> Iterator[types.ModuleType]:
    """The marker library; every test ends with nothing of it run and no __getattr__ call."""
    ev, adm = mods
    ev.MARK.clear()
    adm.CALLS.clear()
    yield ev
    assert ev.MARK == [], "a refused reference ran code"
    assert adm.CALLS == [], "a module __getattr__ ran"


@pytest.fixture
def adm(mods: tuple[types.ModuleType, types.ModuleType], evil: types.ModuleType) -> types.ModuleType:
    return mods[1]


# What the resolution rule says when it refuses (references.resolve_name): never a fingerprint,
# never "not imported".
RULE = (
    r"defined in|steps through|leads out of|only '<locals>' follows|not a module|is never called|"
    r"refused|one entry of its module|leads to the code of|has no attribute|not an enum class|"
    r"not a type|not a function|is not imported|not Class.MEMBER|not a member of"
)


def _fingerprint(kind: RefKind, target: Any) -> bytes:
    """The target's true fingerprint when it has one of this kind (an enum member's needs a
    member)."""
    try:
        return fingerprint(kind, target)
    except AttributeError:
        return b"x" * 16


def _encode(decl: Any, consts: list, ref: tuple[RefKind, str, str, bytes]) -> bytes:
    return _core.encode_guard_set(
        [decl],
        consts,
        [0] * len(consts),
        ["probe"],
        [[]],
        [(int(ref[0]), ref[1], ref[2], ref[3])],
        lambda o: 0,
        None,
        [],
        [],
        False,
        "test",
        sys.version_info[:2],
    )


def probe_bytes(kind: RefKind, module: str, qualname: str, target: Any) -> bytes:
    """A GLOBAL_STATE guard whose probe (called by every check) is the reference given, with the
    true fingerprint of ``target``: the fingerprint is public, it must not be what refuses."""
    decl = _core.GuardDecl(tw.GuardKind.GLOBAL_STATE, None, 0, 1, id=0)
    return _encode(decl, [target, 0], (kind, module, qualname, _fingerprint(kind, target)))


def operand_bytes(kind: RefKind, module: str, qualname: str, target: Any) -> bytes:
    """An ID_MATCH on L['v'] whose operand is the reference given (never called)."""
    decl = _core.GuardDecl(
        tw.GuardKind.ID_MATCH, _core.SourcePath(tw.RootKind.LOCAL, 0, [], ["L['v']"]), 1, id=0
    )
    return _encode(decl, ["v", target], (kind, module, qualname, _fingerprint(kind, target)))


def payload(kind: RefKind, module: str, qualname: str, target: Any) -> bytes:
    fp = _fingerprint(kind, target).hex()
    return json.dumps({"kind": int(kind), "module": module, "qualname": qualname, "fingerprint": fp}).encode()


def refused_everywhere(kind: RefKind, module: str, qualname: str, target: Any, **load: Any) -> None:
    """The reference is refused as a probe, as a guard operand and as a payload, by the rule."""
    with pytest.raises(tw.FormatError, match=RULE):
        tw.GuardSet.from_bytes(probe_bytes(kind, module, qualname, target), **load)
    with pytest.raises(tw.FormatError, match=RULE):
        tw.GuardSet.from_bytes(operand_bytes(kind, module, qualname, target), **load)
    with pytest.raises(tw.FormatError, match=RULE):
        ReferenceCodec(modules=[module]).decode(payload(kind, module, qualname, target))


# -- the attacks of the issue ----------------------------------------------------------------------


def test_a_payload_cannot_reach_subprocess_through_an_admitted_module(
    adm: types.ModuleType, evil: types.ModuleType
) -> None:
    """subprocess.getoutput / Popen through an admitted module that imports subprocess: by the
    module attribute, by the imported name, by a class attribute, and a marker library's."""
    codec = ReferenceCodec(modules=[ADM])
    cases = [
        (RefKind.FUNCTION, "subprocess.getoutput", subprocess.getoutput),
        (RefKind.FUNCTION, "getoutput", subprocess.getoutput),
        (RefKind.TYPE, "subprocess.Popen", subprocess.Popen),
        (RefKind.TYPE, "Popen", subprocess.Popen),
        (RefKind.FUNCTION, "Own.run", subprocess.getoutput),
        (RefKind.TYPE, "Own.P", subprocess.Popen),
        (RefKind.FUNCTION, "boom", evil.boom),
        (RefKind.TYPE, "Boom", evil.Boom),
        (RefKind.FUNCTION, "twu_evil.boom", evil.boom),
        (RefKind.FUNCTION, "ev.boom", evil.boom),
        (RefKind.FUNCTION, "Own.g", evil.boom),
        (RefKind.TYPE, "Own.B", evil.Boom),
        (RefKind.FUNCTION, "Own.ev.boom", evil.boom),
        (RefKind.FUNCTION, "Sub.go", evil.Boom.go),  # inherited from another module's class
        (RefKind.FUNCTION, "Sub.sgo", evil.Boom.sgo),
        (RefKind.FUNCTION, "wrapped_boom", adm.wrapped_boom),
        (RefKind.FUNCTION, "inner_alias", adm.inner_alias),
    ]
    for kind, qualname, target in cases:
        with pytest.raises(tw.FormatError, match=RULE):
            codec.decode(payload(kind, ADM, qualname, target))
        refused_everywhere(kind, ADM, qualname, target, allow_modules=[ADM], f_globals=adm.__dict__)
    # The payload's own module, unadmitted, is refused before anything is looked up.
    for target in (subprocess.getoutput, subprocess.Popen):
        kind = RefKind.TYPE if isinstance(target, type) else RefKind.FUNCTION
        with pytest.raises(tw.FormatError, match="refused"):
            codec.decode(payload(kind, target.__module__, target.__qualname__, target))


def test_a_probe_cannot_reach_os_through_the_globals_module(adm: types.ModuleType) -> None:
    """A GLOBAL_STATE probe '<the f_globals module>:os.getpid' (or abort, system, getpid as
    imported by name) is refused: the walk never leaves the module."""
    for qualname, target in [
        ("os.getpid", os.getpid),
        ("os.abort", os.abort),
        ("getpid", os.getpid),
        ("abort", os.abort),
        ("system", os.system),
        ("subprocess.getoutput", subprocess.getoutput),
    ]:
        data = probe_bytes(RefKind.FUNCTION, ADM, qualname, target)
        for load in ({"f_globals": adm.__dict__}, {"allow_modules": [ADM], "resolve": _never}):
            with pytest.raises(tw.FormatError, match=RULE):
                tw.GuardSet.from_bytes(data, **load)
    # The function's true module, unadmitted, is refused as a probe whatever else is given; with
    # resolve=, the caller's resolver is asked, never sys.modules.
    data = probe_bytes(RefKind.FUNCTION, "posix", "abort", os.abort)
    with pytest.raises(tw.FormatError, match="called by every check"):
        tw.GuardSet.from_bytes(data, f_globals=adm.__dict__, allow_modules=[ADM])
    asked: list[tuple[str, str]] = []

    def resolve(module: str, qualname: str) -> Any:
        asked.append((module, qualname))
        raise LookupError("not mine")

    with pytest.raises(tw.FormatError, match="does not resolve: not mine"):
        tw.GuardSet.from_bytes(data, resolve=resolve)
    assert asked == [("posix", "abort")]


def _never(module: str, qualname: str) -> Any:
    raise AssertionError(f"resolve asked for {module}:{qualname}")


def test_re_exports_are_refused_for_every_kind(adm: types.ModuleType) -> None:
    """``from os import getpid`` in a module: the object's __module__ is posix, so no reference
    in that module reaches it, called or not, under any kind."""
    for kind in RefKind:
        if kind is RefKind.MODULE:
            continue
        refused_everywhere(kind, ADM, "getpid", os.getpid, allow_modules=[ADM])
    # A whole module held under another name is not that module.
    refused_everywhere(RefKind.OBJECT, ADM, "os", os, allow_modules=[ADM])
    refused_everywhere(RefKind.OBJECT, ADM, "ev", sys.modules[EVIL], allow_modules=[ADM])


def test_monkeypatched_sys_modules_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module object whose attributes are another module's (set at run time), a real module
    registered under another name, and a non-module in sys.modules."""
    fake = types.ModuleType("twu_fake")
    fake.getpid = os.getpid  # type: ignore[attr-defined]
    fake.abort = os.abort  # type: ignore[attr-defined]
    fake.getoutput = subprocess.getoutput  # type: ignore[attr-defined]
    fake.Popen = subprocess.Popen  # type: ignore[attr-defined]
    fake.os = os  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "twu_fake", fake)
    monkeypatch.setitem(sys.modules, "twu_os_alias", os)
    monkeypatch.setitem(sys.modules, "twu_posix_alias", sys.modules[os.getpid.__module__])
    monkeypatch.setitem(sys.modules, "twu_class", subprocess.Popen)
    for module, kind, qualname, target in [
        ("twu_fake", RefKind.FUNCTION, "getpid", os.getpid),
        ("twu_fake", RefKind.FUNCTION, "abort", os.abort),
        ("twu_fake", RefKind.FUNCTION, "getoutput", subprocess.getoutput),
        ("twu_fake", RefKind.TYPE, "Popen", subprocess.Popen),
        ("twu_fake", RefKind.FUNCTION, "os.getpid", os.getpid),
        ("twu_os_alias", RefKind.FUNCTION, "getpid", os.getpid),
        ("twu_os_alias", RefKind.FUNCTION, "system", os.system),
        ("twu_posix_alias", RefKind.FUNCTION, "getpid", os.getpid),
        ("twu_class", RefKind.FUNCTION, "__init__", subprocess.Popen.__init__),
        ("twu_class", RefKind.TYPE, "Popen", subprocess.Popen),
    ]:
        refused_everywhere(kind, module, qualname, target, allow_modules=[module])


def test_a_module_getattr_never_runs(adm: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Names the module's dict lacks would be answered by its __getattr__ (which returns a marker
    function); resolution reads the dict only. A ModuleType subclass's __getattribute__ and
    __dict__ property never run either."""
    for kind in RefKind:
        if kind is RefKind.MODULE:
            continue
        for qualname in ("missing", "Own.missing", "__file__x"):
            refused_everywhere(kind, ADM, qualname, adm.own, allow_modules=[ADM])
    assert adm.CALLS == []

    hooked: list[str] = []

    class Hooked(types.ModuleType):
        def __getattribute__(self, name: str) -> Any:
            hooked.append(name)
            return os.getpid

        @property
        def __dict__(self) -> Any:  # type: ignore[override]
            hooked.append("__dict__")
            return {"getpid": os.getpid}

    m = Hooked("twu_hooked")
    vars(types.ModuleType)["__dict__"].__get__(m)["own"] = os.getpid
    monkeypatch.setitem(sys.modules, "twu_hooked", m)
    refused_everywhere(RefKind.FUNCTION, "twu_hooked", "own", os.getpid, allow_modules=["twu_hooked"])
    refused_everywhere(RefKind.FUNCTION, "twu_hooked", "getpid", os.getpid, allow_modules=["twu_hooked"])
    assert hooked == []


def test_a_save_never_runs_a_module_getattr(adm: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Naming a code object looks through every imported module's file: from its dict, not by
    getattr (which would run each lazy module's __getattr__)."""
    lazy = types.ModuleType("twu_lazy")
    calls: list[str] = []

    def __getattr__(name: str) -> Any:
        calls.append(name)
        raise AttributeError(name)

    lazy.__getattr__ = __getattr__  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "twu_lazy", lazy)
    b = tw.GuardBuilder({"f": adm.own})
    b.code_match("L['f']")
    data = b.build().to_bytes()
    assert tw.GuardSet.from_bytes(data).check({"f": adm.own})
    assert calls == []


@pytest.mark.parametrize(
    "qualname",
    [
        "own.__globals__.os",
        "own.__globals__",
        "own.__builtins__.eval",
        "__builtins__.eval",
        "__builtins__",
        "Own.__dict__",
        "Own.__class__",
        "Own.__class__.__subclasses__",
        "decorated.__wrapped__",
        "Own.Inner.meth.__globals__",
        "Own.Inner.__module__",
        "own.__code__",
        "Own.__mro__",
        "Own.__init__.__globals__",
        "INSTANCE.__class__",
        "INSTANCE.run",
        "CLOSURE.__closure__",
        "__loader__",
        "__spec__",
        "Own.Inner.smeth.<locals>",
        "make.<locals>.closure.__globals__",
    ],
)
def test_dunder_chains_are_refused(adm: types.ModuleType, qualname: str) -> None:
    for kind in (RefKind.FUNCTION, RefKind.TYPE, RefKind.OBJECT, RefKind.CODE):
        refused_everywhere(kind, ADM, qualname, adm.own, allow_modules=[ADM])


def test_the_walk_never_leaves_the_module(
    adm: types.ModuleType, evil: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not even to come back: the admitted module's own function, reached through another
    module or another module's class, is refused; so is an enum's member map holding another
    enum's member."""
    monkeypatch.setattr(evil, "twu_own", adm.own, raising=False)
    monkeypatch.setattr(evil.Boom, "twu_own", adm.own, raising=False)
    monkeypatch.setattr(evil.Boom, "TwuOwn", adm.Own, raising=False)
    for kind, qualname, target in [
        (RefKind.FUNCTION, "ev.twu_own", adm.own),
        (RefKind.FUNCTION, "twu_evil.twu_own", adm.own),
        (RefKind.FUNCTION, "Boom.twu_own", adm.own),
        (RefKind.FUNCTION, "Own.B.twu_own", adm.own),
        (RefKind.TYPE, "Boom.TwuOwn", adm.Own),
        (RefKind.FUNCTION, "Boom.TwuOwn.Inner.meth", adm.Own.Inner.meth),
        (RefKind.CODE, "Boom.twu_own", adm.own.__code__),
    ]:
        refused_everywhere(kind, ADM, qualname, target, allow_modules=[ADM])
    monkeypatch.setitem(adm.Mode._member_map_, "EVIL", evil.Color.RED)
    refused_everywhere(RefKind.ENUM_MEMBER, ADM, "Mode.EVIL", evil.Color.RED, allow_modules=[ADM])
    # What the walk may enter it reaches directly.
    assert resolve_name(RefKind.FUNCTION, ADM, adm, "Own.Inner.meth") is adm.Own.Inner.meth
    assert resolve_name(RefKind.ENUM_MEMBER, ADM, adm, "Mode.A") is adm.Mode.A


def test_builtins_are_called_only_when_builtins_is_admitted(adm: types.ModuleType) -> None:
    """builtins:eval, exec and __import__ are builtins' own functions: as guard operands they load
    (identity only); as probes only when the caller admits builtins; as payloads never (a payload
    is a Python function). The site helpers (exit, help) are instances: never called."""
    import builtins

    for name in ("eval", "exec", "__import__"):
        target = getattr(builtins, name)
        data = probe_bytes(RefKind.FUNCTION, "builtins", name, target)
        with pytest.raises(tw.FormatError, match="called by every check"):
            tw.GuardSet.from_bytes(data, f_globals=adm.__dict__)
        with pytest.raises(tw.FormatError, match="called by every check"):
            tw.GuardSet.from_bytes(data, allow_modules=[ADM])
        tw.GuardSet.from_bytes(data, allow_modules=["builtins"])  # the caller's explicit choice
        assert tw.GuardSet.from_bytes(operand_bytes(RefKind.FUNCTION, "builtins", name, target)).check(
            {"v": target}
        )
        with pytest.raises(tw.FormatError, match="refused"):
            ReferenceCodec(modules=[ADM]).decode(payload(RefKind.FUNCTION, "builtins", name, target))
        with pytest.raises(tw.FormatError, match="not a Python function"):
            ReferenceCodec(modules=["builtins"]).decode(payload(RefKind.FUNCTION, "builtins", name, target))
        # Not through any other module: the admitted module's __builtins__ is a chain.
        refused_everywhere(RefKind.FUNCTION, ADM, f"__builtins__.{name}", target, allow_modules=[ADM])
    for name in ("exit", "help"):
        data = probe_bytes(RefKind.OBJECT, "builtins", name, getattr(builtins, name))
        with pytest.raises(tw.FormatError, match="only a function or a class is called"):
            tw.GuardSet.from_bytes(data, allow_modules=["builtins"])


def test_enum_members_and_code_of_other_modules_are_refused(
    adm: types.ModuleType, evil: types.ModuleType
) -> None:
    for kind, qualname, target in [
        (RefKind.ENUM_MEMBER, "EvilColor.RED", evil.Color.RED),
        (RefKind.ENUM_MEMBER, "twu_evil.Color.RED", evil.Color.RED),
        (RefKind.ENUM_MEMBER, "Own.ev.Color.RED", evil.Color.RED),
        (RefKind.ENUM_MEMBER, "Mode.A.__class__", adm.Mode.A),
        (RefKind.ENUM_MEMBER, "os.SEEK_SET", adm.Mode.A),
        (RefKind.CODE, "boom", evil.boom.__code__),  # another module's code, re-exported
        (RefKind.CODE, "decorated", adm.decorated.__code__),  # the decorator's wrapper code
        (RefKind.CODE, "outer.<locals>.inner", evil.outer().__code__),
        (RefKind.CODE, "inner_alias", adm.inner_alias.__code__),
        (RefKind.CODE, "Sub.go", evil.Boom.go.__code__),
        (RefKind.CODE, "Own.g", evil.boom.__code__),
        (RefKind.CODE, "getoutput", subprocess.getoutput.__code__),
        (RefKind.CODE, "twu_evil.deco.<locals>.wrapper", adm.decorated.__code__),
    ]:
        refused_everywhere(kind, ADM, qualname, target, allow_modules=[ADM])


def test_the_type_alias_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    """types / _collections_abc name C types of builtins that builtins does not export; nothing
    else of theirs, nothing in two steps, and never for a called reference."""
    f_type = types.FunctionType
    assert tw.GuardSet.from_bytes(operand_bytes(RefKind.TYPE, "types", "FunctionType", f_type)).check(
        {"v": f_type}
    )
    keys = type({}.keys())
    assert tw.GuardSet.from_bytes(operand_bytes(RefKind.TYPE, "_collections_abc", "dict_keys", keys)).check(
        {"v": keys}
    )
    # Called: refused even with types admitted.
    with pytest.raises(tw.FormatError, match="defined in 'builtins', not in 'types'"):
        tw.GuardSet.from_bytes(
            probe_bytes(RefKind.TYPE, "types", "FunctionType", f_type), allow_modules=["types"]
        )
    # A heap class claiming builtins, another module's class, and two steps are refused.

    class Fake:
        pass

    Fake.__module__ = "builtins"
    monkeypatch.setattr(types, "TwuFake", Fake, raising=False)
    monkeypatch.setattr(types, "TwuPopen", subprocess.Popen, raising=False)
    import abc

    for module, qualname, target in [
        ("types", "TwuFake", Fake),
        ("types", "TwuPopen", subprocess.Popen),
        ("_collections_abc", "ABCMeta", abc.ABCMeta),
        ("_collections_abc", "Iterable", sys.modules["collections.abc"].Iterable),
        ("types", "FunctionType.__call__", f_type),
        ("types", "sys.modules", f_type),
    ]:
        refused_everywhere(RefKind.TYPE, module, qualname, target, allow_modules=[module])
    # The alias is for types only: a function object of builtins held by types is not named there.
    monkeypatch.setattr(types, "twu_eval", eval, raising=False)
    refused_everywhere(RefKind.FUNCTION, "types", "twu_eval", eval, allow_modules=["types"])


# -- hostile payload bytes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b'{"kind": 1, "module": "twu_adm", "qualname": ["own"], "fingerprint": ""}',
        b'{"kind": 1, "module": "twu_adm", "qualname": "own", "fingerprint": 0}',
        b'{"kind": 1, "module": ["twu_adm"], "qualname": "own", "fingerprint": ""}',
        b'{"kind": true, "module": "twu_adm", "qualname": "own", "fingerprint": ""}',
        b'{"kind": 1.0, "module": "twu_adm", "qualname": "own", "fingerprint": ""}',
        b'{"kind": 4, "module": "twu_adm", "qualname": "INSTANCE", "fingerprint": ""}',
        b'{"kind": 2, "module": "twu_adm", "qualname": "own", "fingerprint": ""}',
        b'{"kind": 1, "module": "twu_adm", "qualname": "", "fingerprint": ""}',
        b'{"kind": 1, "module": "twu_adm", "qualname": "own..x", "fingerprint": ""}',
        b'{"kind": 1, "module": "twu_adm", "qualname": "own", "fingerprint": "00"}',
        b"[" * 100_000 + b"]" * 100_000,
        b'"just a string"',
        b"\xff\xfe",
        b"{}",
        b'{"kind": 1, "module": "twu_adm", "qualname": "own", "fingerprint": "", "x": {}}',
    ],
)
def test_hostile_payload_bytes(adm: types.ModuleType, data: bytes) -> None:
    with pytest.raises(tw.FormatError):
        ReferenceCodec(modules=[ADM]).decode(data)


# -- what still loads --------------------------------------------------------------------------------


def test_legitimate_references_still_load(adm: types.ModuleType) -> None:
    """A module-level function, a nested class and its methods, a closure's code constant, an enum
    member, a module-level instance, a functools.wraps wrapper, another module's function held
    here (named by its own module), an alias type and a builtins object round-trip; so does a
    probe of the function's own module."""
    inner = adm.Own.Inner
    frame = {
        "f": adm.own,
        "m": inner.meth,
        "s": inner.smeth,
        "c": vars(inner)["cmeth"].__func__,
        "k": inner,
        "i": inner(),
        "e": adm.Mode.A,
        "d": adm.decorated,
        "p": os.getpid,
        "t": adm.own,
        "n": NotImplemented,
        "cl": adm.CLOSURE,
    }
    b = tw.GuardBuilder(frame, adm.__dict__)
    for name in ("f", "m", "s", "c", "k", "e", "d", "p", "n"):
        b.id_match(f"L['{name}']")
    b.type_match("L['i']")
    b.type_match("L['t']")  # types:FunctionType
    b.code_match("L['cl']")  # make.<locals>.closure
    b.code_match("L['m']")
    b.id_match("G['INSTANCE']")
    b.global_state(adm.probe)
    data = b.build().to_bytes()
    refs = tw.serialization.inspect_bytes(data)[0]["references"]
    assert "function twu_adm:Own.Inner.meth" in refs
    assert "code twu_adm:make.<locals>.closure" in refs
    assert "enum_member twu_adm:Mode.A" in refs
    assert "object twu_adm:INSTANCE" in refs
    assert "function twu_adm:decorated" in refs
    assert "type types:FunctionType" in refs
    assert "object builtins:NotImplemented" in refs
    assert f"function {os.getpid.__module__}:getpid" in refs
    for load in ({"f_globals": adm.__dict__}, {"allow_modules": [ADM]}):
        gs = tw.GuardSet.from_bytes(data, **load)
        assert gs.check(frame)
        assert not gs.check({**frame, "f": adm.probe})
    with pytest.raises(tw.FormatError, match="called by every check"):
        tw.GuardSet.from_bytes(data)  # the probe's module is not admitted

    codec = ReferenceCodec(modules=[ADM])
    for target in (adm.own, adm.Own, inner, inner.meth, inner.smeth, adm.decorated, adm.Sub):
        assert codec.decode(codec.encode(target)) is target


def test_a_save_never_writes_what_the_load_refuses(
    adm: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The save names objects by the load's own rule (references.resolve_name)."""
    rnd = random.random  # a built-in bound to an instance: held by a module, defined by none
    adm.__dict__["twu_rnd"] = rnd
    try:
        b = tw.GuardBuilder({}, adm.__dict__)
        b.id_match("G['twu_rnd']")
        with pytest.raises(tw.NotSerializable, match="defined in no module"):
            b.build().to_bytes()
    finally:
        del adm.__dict__["twu_rnd"]
    import builtins

    # An instance is never a called reference, even one builtins holds.
    class Probe:
        def __call__(self) -> int:
            return 0

    monkeypatch.setattr(builtins, "twu_probe", Probe(), raising=False)
    b = tw.GuardBuilder({})
    b.global_state(builtins.twu_probe)  # type: ignore[attr-defined]
    with pytest.raises(tw.NotSerializable, match="never called"):
        b.build().to_bytes()
    # An alias is never a called reference, also when a TYPE_MATCH named the same type first.
    for first in (True, False):
        b = tw.GuardBuilder({"n": None})
        if first:
            b.type_match("L['n']")  # types:NoneType
        b.global_state(type(None))  # NoneType() is None
        with pytest.raises(tw.NotSerializable, match="builtins:NoneType does not resolve"):
            b.build().to_bytes()
    # A re-exported function as a probe is named by its own module (which a load must admit).
    b = tw.GuardBuilder({}, adm.__dict__)
    b.global_state(adm.getpid)
    data = b.build().to_bytes()
    with pytest.raises(tw.FormatError, match="called by every check"):
        tw.GuardSet.from_bytes(data, f_globals=adm.__dict__, allow_modules=[ADM])
    # The codec refuses another module's function held by an admitted one.
    with pytest.raises(tw.NotSerializable, match="not in the codec's modules"):
        ReferenceCodec(modules=[ADM]).encode(adm.getoutput)


# -- property: whatever the name, nothing outside the module -----------------------------------------

_PARTS = [
    "own",
    "probe",
    "Own",
    "Inner",
    "meth",
    "smeth",
    "cmeth",
    "run",
    "P",
    "B",
    "g",
    "ev",
    "Sub",
    "go",
    "sgo",
    "os",
    "subprocess",
    "getpid",
    "abort",
    "system",
    "getoutput",
    "Popen",
    "boom",
    "Boom",
    "EvilColor",
    "Color",
    "RED",
    "Mode",
    "A",
    "make",
    "closure",
    "<locals>",
    "CLOSURE",
    "INSTANCE",
    "decorated",
    "wrapped_boom",
    "inner_alias",
    "outer",
    "inner",
    "wrapper",
    "deco",
    "twu_evil",
    "__class__",
    "__globals__",
    "__builtins__",
    "__dict__",
    "__wrapped__",
    "__init__",
    "__call__",
    "__func__",
    "__module__",
    "missing",
    "eval",
    "",
]


def _owned(kind: RefKind, qualname: str, obj: Any, adm: types.ModuleType) -> bool:
    """Whether ``obj`` is something the admitted module itself defines (an independent statement
    of the rule: plain attribute reads on objects the test made)."""
    if isinstance(obj, types.ModuleType):  # getattr would run the module's __getattr__
        return kind is RefKind.MODULE and qualname == "" and obj is adm
    home = getattr(obj, "__module__", None)
    if kind is RefKind.FUNCTION:
        return type(obj) is types.FunctionType and home == ADM
    if kind is RefKind.TYPE:
        return isinstance(obj, type) and home == ADM
    if kind is RefKind.CODE:
        return type(obj) is types.CodeType and obj.co_filename == adm.__file__
    if kind is RefKind.ENUM_MEMBER:
        return isinstance(obj, enum.Enum) and type(obj).__module__ == ADM
    if kind is RefKind.OBJECT:
        held = adm.__dict__.get(qualname, object()) is obj
        routine = isinstance(obj, type | types.FunctionType | types.BuiltinFunctionType | types.MethodType)
        return held and (not routine or home == ADM)
    return False  # MODULE: handled above


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    kind=st.sampled_from(list(RefKind)),
    parts=st.lists(st.sampled_from(_PARTS), min_size=1, max_size=5),
    called=st.booleans(),
)
def test_no_name_leaves_the_module(
    mods: tuple[types.ModuleType, types.ModuleType], kind: RefKind, parts: list[str], called: bool
) -> None:
    # The modules as a tuple: hypothesis probes its arguments' attributes, which would run the
    # module's __getattr__.
    evil, adm = mods
    evil.MARK.clear()
    adm.CALLS.clear()
    qualname = ".".join(parts)
    try:
        obj = resolve_name(kind, ADM, adm, qualname, called=called)
    except LookupError:
        pass
    else:
        assert _owned(kind, qualname, obj, adm), (kind, qualname, obj)
        if called:
            assert kind in (RefKind.FUNCTION, RefKind.TYPE)
    codec = ReferenceCodec(modules=[ADM])
    try:
        loaded = codec.decode(payload(kind, ADM, qualname, adm.own))
    except tw.FormatError:
        pass
    else:
        assert loaded is adm.own and qualname == "own"
    assert evil.MARK == [] and adm.CALLS == []


def test_a_name_rebound_by_another_thread(adm: types.ModuleType) -> None:
    """The object checked is the object returned: while another thread rebinds the name between
    the module's function and os.getpid, a load gives the function or refuses, never getpid."""
    import threading

    stop = threading.Event()
    d = adm.__dict__

    def flip() -> None:
        while not stop.is_set():
            d["twu_flip"] = os.getpid
            d["twu_flip"] = adm.own
            d.pop("twu_flip", None)

    t = threading.Thread(target=flip)
    t.start()
    try:
        codec = ReferenceCodec(modules=[ADM])
        data = payload(RefKind.FUNCTION, ADM, "twu_flip", adm.own)
        outcomes = set()
        for _ in range(scaled(2000)):
            try:
                got = resolve_name(RefKind.FUNCTION, ADM, adm, "twu_flip", called=True)
            except LookupError:
                outcomes.add("refused")
            else:
                assert got is adm.own
                outcomes.add("own")
            try:
                loaded = codec.decode(data)
            except tw.FormatError as e:
                assert "fingerprint" not in str(e)
            else:
                assert loaded is adm.own
    finally:
        stop.set()
        t.join()
        d.pop("twu_flip", None)
    assert "refused" in outcomes

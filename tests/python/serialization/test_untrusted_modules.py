"""The adversarial re-review of "stored data is untrusted": attacks by someone who writes a store or
hands a user a .tw file, beyond those of test_untrusted_references.py and test_store_untrusted.py.

Each attack runs real modules written to a temporary directory, whose every hook records its call
(``MARK``): a refused load must raise FormatError (or skip the entry with one report) with nothing
recorded, and must take time linear in its bytes.
"""

from __future__ import annotations

import importlib
import sys
import tempfile
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import serial_fixtures as fx
import tripwire as tw
from test_store_untrusted import COMPILES, genuine, raw_entry, specialized
from test_untrusted_references import _encode, operand_bytes, probe_bytes
from tripwire import __main__ as cli
from tripwire import _core
from tripwire.references import RefKind, fingerprint
from tripwire.store import Directory, StoreWarning, entry_key

PKG = "twrt_pkg"
HOOKS = "twrt_hooks"

HOOKS_SRC = """
import enum

MARK = []


class Meta(type):
    def __hash__(cls):
        MARK.append("meta hash")
        return 1

    def __eq__(cls, other):
        MARK.append("meta eq")
        return True

    def __instancecheck__(cls, obj):
        MARK.append("meta instancecheck")
        return True

    def __call__(cls, *args):
        MARK.append("meta call")

    @property
    def __mro__(cls):
        MARK.append("meta mro")
        return (cls,)


class Hooked(metaclass=Meta):
    pass


class Inst:
    def __hash__(self):
        MARK.append("hash")
        return 1

    def __eq__(self, other):
        MARK.append("eq")
        return True


INST = Inst()


class Hashy(enum.Enum):
    A = 1

    def __hash__(self):
        MARK.append("enum hash")
        return 7


class Eqy(enum.Enum):
    A = 1

    def __eq__(self, other):
        MARK.append("enum eq")
        return self is other

    __hash__ = enum.Enum.__hash__


class Plain(enum.Enum):
    A = 1
    B = 2


class Number(enum.IntEnum):
    ONE = 1


def f():
    pass
"""


@pytest.fixture(scope="module")
def mods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[types.ModuleType, types.ModuleType]]:
    root: Path = tmp_path_factory.mktemp("redteam")
    pkg = root / PKG
    pkg.mkdir()
    (pkg / "__init__.py").write_text("MARK = []\nMARK.append('init')\n")
    (pkg / "__main__.py").write_text(f"from {PKG} import MARK\nMARK.append('main')\n")
    (pkg / "sub.py").write_text(f"from {PKG} import MARK\nMARK.append('sub')\n\ndef f():\n    pass\n")
    (root / f"{HOOKS}.py").write_text(HOOKS_SRC)
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    try:
        yield importlib.import_module(PKG), importlib.import_module(HOOKS)
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n == HOOKS or n == PKG or n.startswith(PKG + ".")]:
            del sys.modules[name]


@pytest.fixture
def pkg(mods: tuple[types.ModuleType, types.ModuleType]) -> Iterator[types.ModuleType]:
    p = mods[0]
    p.MARK.clear()
    yield p
    for name in [n for n in sys.modules if n.startswith(PKG + ".")]:
        del sys.modules[name]


@pytest.fixture
def hooks(mods: tuple[types.ModuleType, types.ModuleType]) -> Iterator[types.ModuleType]:
    h = mods[1]
    h.MARK.clear()
    yield h
    assert h.MARK == [], "a hook of a referenced class ran"


def f() -> None:
    pass


def equals_bytes(const: Any, ref: tuple[RefKind, str, str, bytes] | None = None) -> bytes:
    """An EQUALS_MATCH of L['v'] against ``const``, with one reference when given."""
    decl = _core.GuardDecl(
        tw.GuardKind.EQUALS_MATCH, _core.SourcePath(tw.RootKind.LOCAL, 0, [], ["L['v']"]), 1, id=0
    )
    if ref is not None:
        return _encode(decl, ["v", const], ref)
    return _core.encode_guard_set(
        [decl],
        ["v", const],
        [0, 0],
        ["x"],
        [[]],
        [],
        lambda o: 0,
        None,
        [],
        [],
        False,
        "test",
        sys.version_info[:2],
    )


# -- allow_modules: the bytes choose which submodule is imported -----------------------------------


@pytest.mark.parametrize("module", [f"{PKG}.__main__", f"{PKG}.__init__", f"{PKG}.sub.__main__"])
@pytest.mark.parametrize("kind", [RefKind.MODULE, RefKind.FUNCTION])
def test_a_load_never_imports_a_package_s_main_or_its_init_again(
    pkg: types.ModuleType, module: str, kind: RefKind
) -> None:
    """``allow_modules=["pkg"]`` admits pkg's modules, but ``pkg.__main__`` is its command line
    (importing it runs it) and ``pkg.__init__`` runs its body again as another module."""
    qualname = "" if kind is RefKind.MODULE else "f"
    for data in (operand_bytes(kind, module, qualname, f), probe_bytes(RefKind.FUNCTION, module, "f", f)):
        with pytest.raises(tw.FormatError, match="dunder part"):
            tw.GuardSet.from_bytes(data, allow_modules=[PKG])
    assert pkg.MARK == []
    assert not [n for n in sys.modules if n.startswith(PKG + ".")]


@pytest.mark.parametrize("module", [f"{PKG}..sub", f"{PKG}.", f"{PKG}.a/b", f"{PKG}.\x00", f"{PKG}.sub "])
def test_module_names_that_are_not_dotted_identifiers_are_never_imported(
    pkg: types.ModuleType, module: str
) -> None:
    with pytest.raises(tw.FormatError, match="dunder part"):
        tw.GuardSet.from_bytes(operand_bytes(RefKind.MODULE, module, "", f), allow_modules=[PKG])
    assert pkg.MARK == []


def test_an_admitted_submodule_is_imported_as_format_md_says(pkg: types.ModuleType) -> None:
    """The documented power of allow_modules: a submodule of an admitted prefix is imported."""
    sub = f"{PKG}.sub"
    gs = tw.GuardSet.from_bytes(operand_bytes(RefKind.MODULE, sub, "", f), allow_modules=[PKG])
    assert pkg.MARK == ["sub"]
    assert gs.check({"v": sys.modules[sub]}) and not gs.check({"v": pkg})


# -- hash flooding ------------------------------------------------------------------------------

_M = (1 << 61) - 1  # the modulus of int hashing: i * _M hashes to 0 for every i


@pytest.mark.parametrize("make", [frozenset, set, dict.fromkeys, lambda xs: frozenset((x, 1) for x in xs)])
def test_a_constant_of_colliding_hashes_is_refused_not_quadratic(make: Any) -> None:
    """16,000 ints that all hash to 0 (190 KB) would take 3 s to load and as long to check: each
    insertion compares with every earlier item. More than 16 items per hash are refused."""
    data = equals_bytes(make([i * _M for i in range(20_000)]))
    with pytest.raises(tw.FormatError, match="share one hash"):
        tw.GuardSet.from_bytes(data)
    # Sixteen per hash load: what an honest set holds (-1 and -2 share a hash) is far fewer.
    honest = make([i * _M for i in range(16)] + [-1, -2] + list(range(1, 1000)))
    gs = tw.GuardSet.from_bytes(equals_bytes(honest))
    assert gs.check({"v": honest}) and not gs.check({"v": make([0])})


def test_a_save_never_writes_a_colliding_constant() -> None:
    b = tw.GuardBuilder({"x": frozenset(i * _M for i in range(100))})
    b.equals("L['x']")
    with pytest.raises(tw.FormatError, match="share one hash"):
        b.build().to_bytes()


# -- hooks of referenced classes ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "qualname"), [(RefKind.TYPE, "Hooked"), (RefKind.OBJECT, "INST"), (RefKind.FUNCTION, "f")]
)
def test_loading_and_checking_a_reference_runs_none_of_its_hooks(
    hooks: types.ModuleType, kind: RefKind, qualname: str
) -> None:
    """A metaclass __eq__, __hash__, __instancecheck__, __call__ or __mro__ property, an instance's
    __eq__ and __hash__: an ID_MATCH operand is held and compared by identity."""
    target = getattr(hooks, qualname)
    data = operand_bytes(kind, HOOKS, qualname, target)
    hooks.MARK.clear()  # encoding the test's bytes may hash
    gs = tw.GuardSet.from_bytes(data)
    assert gs.check({"v": target})
    assert not gs.check({"v": hooks.Inst()}) and not gs.check({"v": 1})


@pytest.mark.parametrize("member", ["Hashy.A", "Eqy.A"])
@pytest.mark.parametrize(
    "make",
    [
        lambda m: frozenset([m]),
        lambda m: {m: 1},
        lambda m: frozenset([(1, m)]),
        lambda m: {(m,): 1},
        lambda m: (1, m),
        lambda m: [m],
        lambda m: {1: m},
    ],
)
def test_an_enum_whose_hash_or_eq_is_python_code_is_refused_inside_a_constant(
    hooks: types.ModuleType, member: str, make: Any
) -> None:
    """A set item or dict key is hashed (and compared on a collision) while its constant is built,
    and a tuple's items are compared by every check of an EQUALS_MATCH: an enum member of any
    imported module would run its class's __hash__ or __eq__, at load or on checks."""
    cls, name = member.split(".")
    obj = getattr(getattr(hooks, cls), name)
    data = equals_bytes(
        make(obj), (RefKind.ENUM_MEMBER, HOOKS, member, fingerprint(RefKind.ENUM_MEMBER, obj))
    )
    hooks.MARK.clear()
    with pytest.raises(
        tw.FormatError, match=r"defines __(hash|eq)__ in Python, which the bytes would choose to run"
    ):
        tw.GuardSet.from_bytes(data)


@pytest.mark.parametrize("member", ["Plain.A", "Number.ONE"])
def test_enums_of_the_standard_hash_still_load_in_sets(hooks: types.ModuleType, member: str) -> None:
    cls, name = member.split(".")
    obj = getattr(getattr(hooks, cls), name)
    ref = (RefKind.ENUM_MEMBER, HOOKS, member, fingerprint(RefKind.ENUM_MEMBER, obj))
    for const in (frozenset([obj]), {obj: 1}, frozenset([(obj, 1)])):
        gs = tw.GuardSet.from_bytes(equals_bytes(const, ref))
        assert gs.check({"v": const}) and not gs.check({"v": frozenset()})


def contains_bytes(
    key: Any, ref: tuple[RefKind, str, str, bytes], kind: tw.GuardKind = tw.GuardKind.DICT_CONTAINS
) -> bytes:
    """A DICT_CONTAINS (or SET_CONTAINS) of ``key`` in L['v'] (flag: the key must be present)."""
    decl = _core.GuardDecl(kind, _core.SourcePath(tw.RootKind.LOCAL, 0, [], ["L['v']"]), 1, flag=True, id=0)
    return _encode(decl, ["v", key], ref)


_CONTAINS_KINDS = [tw.GuardKind.DICT_CONTAINS, tw.GuardKind.SET_CONTAINS]


@pytest.mark.parametrize("guard_kind", _CONTAINS_KINDS)
@pytest.mark.parametrize(
    ("kind", "qualname", "wrap"),
    [
        (RefKind.OBJECT, "INST", False),
        (RefKind.TYPE, "Hooked", False),
        (RefKind.ENUM_MEMBER, "Hashy.A", False),
        (RefKind.ENUM_MEMBER, "Eqy.A", True),
    ],
)
def test_a_contains_key_whose_hash_is_python_code_is_refused(
    hooks: types.ModuleType, kind: RefKind, qualname: str, wrap: bool, guard_kind: tw.GuardKind
) -> None:
    """A DICT_CONTAINS key or SET_CONTAINS item is hashed on every check: the bytes would choose
    which class's __hash__ or __eq__ runs (an instance any module holds, a metaclass, an enum)."""
    obj: Any = hooks
    for part in qualname.split("."):
        obj = getattr(obj, part)
    key = (1, obj) if wrap else obj
    data = contains_bytes(key, (kind, HOOKS, qualname, fingerprint(kind, obj)), guard_kind)
    hooks.MARK.clear()
    what = "key" if guard_kind is tw.GuardKind.DICT_CONTAINS else "item"
    with pytest.raises(
        tw.FormatError,
        # a bare reference: at the guard's operand check; inside a tuple: when the tuple is built
        match=rf"(?:{guard_kind.name} guard: the {what}|constant 1 cannot be built): .*DICT_CONTAINS key or "
        r"SET_CONTAINS item, and its class defines __(hash|eq)__ in Python",
    ):
        tw.GuardSet.from_bytes(data)
    assert not hooks.MARK


@pytest.mark.parametrize("guard_kind", _CONTAINS_KINDS)
@pytest.mark.parametrize("qualname", ["Plain.A", "Number.ONE", "f"])
def test_contains_keys_of_c_or_enum_hashes_still_load(
    hooks: types.ModuleType, qualname: str, guard_kind: tw.GuardKind
) -> None:
    obj: Any = hooks
    for part in qualname.split("."):
        obj = getattr(obj, part)
    kind = RefKind.FUNCTION if qualname == "f" else RefKind.ENUM_MEMBER
    gs = tw.GuardSet.from_bytes(
        contains_bytes(obj, (kind, HOOKS, qualname, fingerprint(kind, obj)), guard_kind)
    )
    if guard_kind is tw.GuardKind.DICT_CONTAINS:
        assert gs.check({"v": {obj: 1}}) and not gs.check({"v": {}})
    else:
        assert gs.check({"v": {obj}}) and gs.check({"v": frozenset([obj])}) and not gs.check({"v": set()})
        assert not gs.check({"v": {obj: 1}})


# -- the CLI on hostile files -------------------------------------------------------------------


def test_inspect_and_diff_import_nothing_and_refuse_floods(
    pkg: types.ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main = tmp_path / "main.tw"
    main.write_bytes(operand_bytes(RefKind.FUNCTION, f"{PKG}.__main__", "f", f))
    flood = tmp_path / "flood.tw"
    flood.write_bytes(equals_bytes(frozenset(i * _M for i in range(20_000))))
    assert cli.main(["inspect", str(main)]) == 0
    assert f"{PKG}.__main__:f" in capsys.readouterr().out
    assert cli.main(["inspect", str(flood)]) == 1
    assert "share one hash" in capsys.readouterr().err
    assert cli.main(["diff", str(main), str(flood)]) != 0
    assert pkg.MARK == [] and f"{PKG}.__main__" not in sys.modules


# -- a store entry that floods ------------------------------------------------------------------


def test_a_stored_entry_that_floods_is_skipped_with_one_report() -> None:
    """A writer of the store plants an entry, valid hash, whose guards hold 20,000 colliding ints:
    skipped with one report, the call compiles, and the genuine entry is still served."""
    with tempfile.TemporaryDirectory() as root:
        a = specialized(Directory(root))
        a(1)
        ns = a._namespace()
        data = raw_entry(
            equals_bytes(frozenset(i * _M for i in range(20_000))), b"reference", genuine()["payload"]
        )
        Directory(root).save(ns, entry_key(data), data)
        b = specialized(Directory(root))
        COMPILES.clear()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            assert [b(1), b(2), b(1), b(2)] == [fx.helper(1), fx.helper(2), fx.helper(1), fx.helper(2)]
        assert COMPILES == [2]
        reports = [str(x.message) for x in w if issubclass(x.category, StoreWarning)]
        assert len(reports) == 1 and "share one hash" in reports[0], reports
        assert b.store_loads == 1 and len(b.store_skipped) == 1


# -- GLOBAL_STATE probes ------------------------------------------------------------------------


def test_a_stored_probe_of_another_module_is_refused_even_with_its_f_globals(hooks: types.ModuleType) -> None:
    """The f_globals module's functions are the only probes a store entry can name; another
    module's function, even one the f_globals module imported, is refused."""
    data = probe_bytes(RefKind.FUNCTION, HOOKS, "f", hooks.f)
    with pytest.raises(tw.FormatError, match="refused"):
        tw.GuardSet.from_bytes(data, f_globals=fx.__dict__)


# -- store entries that serve the wrong thing ---------------------------------------------------


def _plant_and_call(data: bytes, calls: list[Any]) -> tuple[list[Any], list[str], Any]:
    """Plant ``data`` in the namespace of fx.helper under compile_helper, then call a new reader."""
    with tempfile.TemporaryDirectory() as root:
        ns = specialized(Directory(root))._namespace()
        Directory(root).save(ns, entry_key(data), data)
        b = specialized(Directory(root))
        COMPILES.clear()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            results = [b(x) for x in calls]
        return results, [str(x.message) for x in w if issubclass(x.category, StoreWarning)], b


def test_the_function_itself_under_guards_that_always_pass_is_served_and_correct() -> None:
    """A writer may store "the function itself" under an empty guard set: every call is served,
    uncompiled, and every answer is the function's own (store.md, "What a writer of the store can
    still do")."""
    empty = tw.GuardBuilder({"x": 1}).build().to_bytes()
    results, reports, b = _plant_and_call(raw_entry(empty, b"tripwire:function", b""), [1, 2, "a"])
    assert results == [fx.helper(1), fx.helper(2), fx.helper("a")]
    assert COMPILES == [] and reports == [] and b.store_loads == 1


@pytest.mark.parametrize(
    ("module", "qualname"), [("os", "abort"), ("subprocess", "getoutput"), ("builtins", "breakpoint")]
)
def test_a_stored_probe_of_an_imported_library_is_skipped_with_one_report(module: str, qualname: str) -> None:
    """An entry whose GLOBAL_STATE probe names a library function (called on every check) is
    skipped with one report; the call compiles and nothing runs."""
    target = getattr(importlib.import_module(module), qualname)
    guards = probe_bytes(RefKind.FUNCTION, module, qualname, target)
    results, reports, b = _plant_and_call(raw_entry(guards, b"reference", genuine()["payload"]), [1, 1])
    assert results == [fx.helper(1)] * 2 and COMPILES == [1]
    assert len(reports) == 1 and "refused" in reports[0], reports
    assert b.store_loads == 0 and len(b.store_skipped) == 1

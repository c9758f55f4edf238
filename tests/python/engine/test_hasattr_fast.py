"""``not hasattr(o, name)`` (HASATTR with present=False) decided by the fast pass where the name
is certainly absent (attribute_certainly_absent, cpp/runtime/eval/fetch.cpp): no class defines
it, the object's own storage lacks it, and the class has no ``__getattr__``, or a registered one
whose miss is known (cpp/runtime/eval/dict_getattr.hpp: nn.Module's) and misses. Every case checks
passing calls first, then a change that ``hasattr`` sees, decided four ways
(engine_switches.agree_with_and_without_skip: the fast pass with and without the skip, the walk,
which calls ``hasattr``, and the reference)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

import tripwire as tw
from engine_switches import agree_with_and_without_skip as _decide
from engine_switches import fast_once as _fast_once
from engine_switches import fast_pass
from tripwire import _core


def _guarded(obj: Any, name: str = "missing") -> tuple[Any, list[Any], dict]:
    f_locals = {"o": obj}
    b = tw.GuardBuilder(f_locals)
    b.hasattr("L['o']", name, present=False)
    gs = b.build()
    specs = list(gs.guards)
    for _ in range(3):
        assert _decide(gs, specs, f_locals) is True
    return gs, specs, f_locals


# A class __getattr__ of nn.Module's shape, registered as such (the claim is this test's, about
# this function's body: exactly what tripwire.torch claims about nn.Module.__getattr__).
def _module_getattr(self: Any, name: str) -> Any:
    if "_parameters" in self.__dict__:
        _parameters = self.__dict__["_parameters"]
        if name in _parameters:
            return _parameters[name]
    if "_buffers" in self.__dict__:
        _buffers = self.__dict__["_buffers"]
        if name in _buffers:
            return _buffers[name]
    if "_modules" in self.__dict__:
        modules = self.__dict__["_modules"]
        if name in modules:
            return modules[name]
    raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")


_core.register_dict_getattr(_module_getattr, ("_parameters", "_buffers", "_modules"))
_REGISTERED_CODE = _module_getattr.__code__


def _module_class() -> type:
    class Module:
        __getattr__ = _module_getattr

        def __init__(self) -> None:
            self._parameters: dict[str, Any] = {}
            self._buffers: dict[str, Any] = {"running": 1}
            self._modules: dict[str, Any] = {"0": object()}

    return Module


def _plain_class() -> type:
    class Plain:
        def __init__(self) -> None:
            self.a = 1

    return Plain


def test_a_plain_objects_absent_attribute_is_decided_on_the_fast_pass() -> None:
    gs, _, f_locals = _guarded(_plain_class()())
    assert _fast_once(gs, f_locals)


def test_a_registered_getattrs_miss_is_decided_on_the_fast_pass() -> None:
    gs, _, f_locals = _guarded(_module_class()())
    assert _fast_once(gs, f_locals)


def test_an_unregistered_getattr_is_called() -> None:
    calls = []

    class Other:
        def __getattr__(self, name: str) -> Any:
            calls.append(name)
            raise AttributeError(name)

    gs, _, f_locals = _guarded(Other())
    n = len(calls)
    assert not _fast_once(gs, f_locals)  # a residue: the method runs
    assert len(calls) == n + 1


def _set_param(cls: type, o: Any) -> None:
    o._parameters["missing"] = 1


def _replace_code(cls: type, o: Any) -> None:
    def other(self: Any, name: str) -> Any:
        return 1

    _module_getattr.__code__ = other.__code__


def _dict_property(cls: type) -> type:
    return type("D", (cls,), {"__dict__": property(lambda self: {"_modules": {"missing": 1}})})


class _Contains(dict):
    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: Any) -> Any:
        return 2


MODULE_MUTATIONS: list[tuple[str, Callable[[type, Any], None]]] = [
    ("in _parameters", _set_param),
    ("in _buffers", lambda cls, o: o._buffers.__setitem__("missing", 1)),
    ("in _modules", lambda cls, o: o._modules.__setitem__("missing", 1)),
    ("instance attribute", lambda cls, o: setattr(o, "missing", 1)),
    ("class attribute", lambda cls, o: setattr(cls, "missing", 1)),
    ("class property", lambda cls, o: setattr(cls, "missing", property(lambda self: 1))),
    ("_modules a dict subclass with __contains__", lambda cls, o: setattr(o, "_modules", _Contains())),
    ("_buffers a non-str-keyed dict", lambda cls, o: setattr(o, "_buffers", {1: 2, "missing": 3})),
    ("__getattr__ replaced", lambda cls, o: setattr(cls, "__getattr__", lambda self, n: 1)),
    ("__getattribute__ added", lambda cls, o: setattr(cls, "__getattribute__", lambda self, n: 1)),
    (
        "__class__ to a subclass with the attribute",
        lambda cls, o: setattr(o, "__class__", type("S", (cls,), {"missing": 1})),
    ),
    (
        "__class__ to a subclass with a __dict__ property",
        lambda cls, o: setattr(o, "__class__", _dict_property(cls)),
    ),
    ("the function's __code__ replaced", _replace_code),
]


@pytest.mark.parametrize("mutate", [m for _, m in MODULE_MUTATIONS], ids=[n for n, _ in MODULE_MUTATIONS])
def test_a_change_under_a_registered_getattr_fails(mutate: Callable[[type, Any], None]) -> None:
    cls = _module_class()
    o = cls()
    gs, specs, f_locals = _guarded(o)
    assert _fast_once(gs, f_locals)
    try:
        mutate(cls, o)
        assert _decide(gs, specs, f_locals) is False
    finally:
        _module_getattr.__code__ = _REGISTERED_CODE


PLAIN_MUTATIONS: list[tuple[str, Callable[[type, Any], None]]] = [
    ("instance attribute", lambda cls, o: setattr(o, "missing", 1)),
    ("class attribute", lambda cls, o: setattr(cls, "missing", None)),
    ("__getattr__ added", lambda cls, o: setattr(cls, "__getattr__", lambda self, n: 1)),
    ("__getattribute__ added", lambda cls, o: setattr(cls, "__getattribute__", lambda self, n: 1)),
    ("__class__ swapped", lambda cls, o: setattr(o, "__class__", type("S", (cls,), {"missing": 1}))),
]


@pytest.mark.parametrize("mutate", [m for _, m in PLAIN_MUTATIONS], ids=[n for n, _ in PLAIN_MUTATIONS])
def test_a_change_on_a_plain_object_fails(mutate: Callable[[type, Any], None]) -> None:
    cls = _plain_class()
    o = cls()
    gs, specs, f_locals = _guarded(o)
    assert _fast_once(gs, f_locals)
    mutate(cls, o)
    assert _decide(gs, specs, f_locals) is False


def test_changes_that_keep_the_name_absent_still_pass() -> None:
    cls = _module_class()
    o = cls()
    gs, specs, f_locals = _guarded(o)
    o._parameters["other"] = 1  # another name in a dict
    o._buffers = {}  # a new dict, empty
    del o.__dict__["_modules"]  # a dict the body skips
    o.x = 2
    o.__dict__[3] = 4  # a non-str key in the instance dict: undecidable natively, hasattr decides
    assert _decide(gs, specs, f_locals) is True
    cls.other = 1
    assert _decide(gs, specs, f_locals) is True


def test_a_shadowed_attribute_error_is_not_assumed() -> None:
    # The body raises whatever its globals call AttributeError: a name bound in its module's
    # globals makes hasattr raise that instead, and the check must not pass (a guard that raises
    # fails it, as the walk decides).
    o = _module_class()()
    gs, _, f_locals = _guarded(o)
    g = _module_getattr.__globals__
    g["AttributeError"] = KeyError
    try:
        with pytest.raises(KeyError):
            hasattr(o, "missing")
        assert gs.check(f_locals) is False
        with fast_pass(False):
            assert gs.check(f_locals) is False
    finally:
        del g["AttributeError"]
    assert _fast_once(gs, f_locals)


def test_a_tracer_sees_the_call() -> None:
    o = _module_class()()
    gs, _, f_locals = _guarded(o)
    seen: list[str] = []

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if event == "call":
            seen.append(frame.f_code.co_name)
        return None

    sys.settrace(tracer)
    try:
        assert gs.check(f_locals) is True
    finally:
        sys.settrace(None)
    assert "_module_getattr" in seen


def test_registration_rejects_bad_arguments() -> None:
    with pytest.raises(TypeError):
        _core.register_dict_getattr(len, ("_modules",))
    with pytest.raises(TypeError):
        _core.register_dict_getattr(_module_getattr, ["_modules"])
    with pytest.raises(TypeError):
        _core.register_dict_getattr(_module_getattr, ("_modules", 1))

"""The expected length of a torch ``DictGuardManager``, read from torch's C++ object.

torch 2.13's ``DictGuardManager`` checks ``type(d) is T and PyDict_Size(d) == n`` before anything
else, but its Python binding exposes neither ``n`` nor a way to evaluate the node alone. The
importer needs ``n`` to reproduce the check exactly, so this module reads the C++ member
``DictGuardManager::_size`` through the pybind11 instance.

It never guesses an offset. On first use it builds two ``DictGuardManager``\\ s of its own, with
known lengths and types, and finds the one offset at which each holds ``(_size, _expected_type)``
as two consecutive machine words (``Py_ssize_t _size; PyTypeObject* _expected_type;`` in
guards.cpp), scanning only inside the object's own allocation (``malloc_usable_size``). A read on
a real manager is accepted only when the word after the length is that manager's expected type
(``get_type_of_guarded_value()``). Anything else (another pybind11 layout, a torch that moved the
members, no glibc) makes :func:`dict_manager_length` raise :class:`LayoutUnknown`, and the importer
reports the DictGuardManager as not importable instead of importing a wrong length.
"""

from __future__ import annotations

import ctypes
from typing import Any

__all__ = ["LayoutUnknown", "dict_manager_length"]


class LayoutUnknown(RuntimeError):
    """The length of a DictGuardManager cannot be read on this torch build."""


_WORD = ctypes.sizeof(ctypes.c_void_p)
# pybind11's ``instance``: PyObject_HEAD, then the value pointer of a simple (single-base) layout.
_VALUE_PTR_OFFSET = 2 * _WORD
_offset: int | None = None
_failure: str | None = None


def _value_pointer(wrapper: Any) -> int:
    p = ctypes.c_void_p.from_address(id(wrapper) + _VALUE_PTR_OFFSET).value
    if not p:
        raise LayoutUnknown("the pybind11 instance holds no value pointer")
    return int(p)


def _usable_size(ptr: int) -> int:
    # The allocator that allocated the manager is the one the process resolves `malloc` to: an
    # LD_PRELOADed jemalloc/tcmalloc or ASan's runtime interposes glibc's. Their
    # malloc_usable_size must answer for their blocks, so the symbol is looked up the same way
    # (the global namespace, dlsym(RTLD_DEFAULT)), never in libc.so itself: glibc's would read a
    # chunk header that a foreign allocator's block does not have (garbage, or a crash under ASan).
    fn = getattr(ctypes.CDLL(None), "malloc_usable_size", None)
    if fn is None:
        raise LayoutUnknown("malloc_usable_size is not available (not glibc or an allocator providing it)")
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_void_p]
    return int(fn(ptr))


def _words_at(ptr: int, off: int) -> tuple[int, int]:
    return (
        int(ctypes.c_ssize_t.from_address(ptr + off).value),
        int(ctypes.c_void_p.from_address(ptr + off + _WORD).value or 0),
    )


def _calibrate() -> int:
    import collections

    from torch._C._dynamo.guards import DictGuardManager, RootGuardManager
    from torch._dynamo.guards import GuardManagerType

    root = RootGuardManager()
    found: set[int] | None = None
    # Two probes that differ in length and type, so a stray pair of words cannot match both.
    probes: list[dict] = [
        {f"k{i}": i for i in range(7)},
        collections.OrderedDict((i, i) for i in range(13)),
    ]
    for i, example in enumerate(probes):
        mgr = root.framelocals_manager(
            key=(f"tripwire_probe_{i}", i),
            source=f"L['tripwire_probe_{i}']",
            example_value=example,
            guard_manager_enum=GuardManagerType.DICT_GUARD_MANAGER,
        )
        if type(mgr) is not DictGuardManager:
            raise LayoutUnknown("torch did not build a DictGuardManager for a dict")
        ptr = _value_pointer(mgr)
        limit = _usable_size(ptr)
        hits = {
            off
            for off in range(0, limit - 2 * _WORD + 1, _WORD)
            if _words_at(ptr, off) == (len(example), id(type(example)))
        }
        found = hits if found is None else found & hits
    if not found or len(found) != 1:
        raise LayoutUnknown(
            f"no unique offset of DictGuardManager::_size (candidates: {sorted(found or ())})"
        )
    return found.pop()


def dict_manager_length(mgr: Any) -> int:
    """The length ``n`` a torch ``DictGuardManager`` requires of its dict."""
    global _offset, _failure
    if type(mgr).__name__ != "DictGuardManager":  # never read past another object's members
        raise LayoutUnknown(f"not a DictGuardManager: {type(mgr).__name__}")
    if _offset is None:
        if _failure is not None:
            raise LayoutUnknown(_failure)
        try:
            _offset = _calibrate()
        except LayoutUnknown as e:
            _failure = str(e)
            raise
        except Exception as e:  # noqa: BLE001 - torch internals moved: report, never guess
            _failure = f"calibration failed: {type(e).__name__}: {e}"
            raise LayoutUnknown(_failure) from None
    ptr = _value_pointer(mgr)
    n, tp = _words_at(ptr, _offset)
    expected = mgr.get_type_of_guarded_value()
    if tp != id(expected) or n < 0:
        raise LayoutUnknown(
            f"DictGuardManager at {mgr.get_source()}: the word after its length is not its type "
            f"({tp:#x}, expected {id(expected):#x})"
        )
    return n

// tripwire/cpp/runtime/serial/values.hpp -- Python constants to the format's value trees and back.
//
// Only plain data is written as a value: None, bool, int, float, complex, str, bytes, Ellipsis,
// range, slice, and exact tuples, lists, sets, frozensets and dicts of these. Every other object
// (a type, an enum member, a function...) is handed to the caller's `ref_of`, which returns the
// index of the reference standing for it or raises. Reading back never runs code from the data:
// values are built with the C API, references are the objects the caller resolved.
#pragma once

#include <vector>

#include "core/codec/document.hpp"
#include "runtime/py.hpp"

namespace tripwire::runtime::serial {

/// `o` as a value tree into `out`. False with a Python error set on failure (ref_of raised, a
/// container nests too deep).
bool to_value(PyObject* o, PyObject* ref_of, core::codec::Value& out, int depth = 0);

/// A new object for `v`; references index `refs` (borrowed). Null with a Python error set when
/// the value cannot be built (an unhashable set element, a range with step 0...).
PyObject* from_value(const core::codec::Value& v, const std::vector<PyObject*>& refs);

/// Whether hashing `o` (and comparing it on a collision) runs no Python code: its class's
/// `__hash__` and `__eq__`, and those of a tuple's items, are C implementations or the standard
/// library's `Enum.__hash__`. False with a ValueError (or another error) set otherwise: a
/// referenced key or set item is hashed at load or on every check, in a class the bytes chose.
bool hashes_without_code(PyObject* o);

}  // namespace tripwire::runtime::serial

// tripwire/cpp/runtime/eval/diagnostics.hpp -- what GuardSet's diagnostics ask of a built set.
//
// explain(), symbol_readers() and a tensor guard's failure fields run only when asked, never on
// the check path. Every function expects the GIL; on failure it returns null (or false) with a
// Python error set.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/eval/guard_set.hpp"
#include "runtime/py.hpp"
#include "runtime/tensors/tensor_kinds.hpp"

namespace tripwire::runtime {

/// The position of the guard with id `id` in `gs`'s program, or -1.
std::int64_t guard_position(const GuardSet& gs, std::uint32_t id);

/// Every field where `value` differs from TENSOR_MATCH or ARRAY_MATCH guard `g`'s expectation, as
/// the engine reads it. False with a ValueError for a guard of another kind, or with the error a
/// Python reader raised.
bool field_mismatches(const RuntimeGuard& g, PyObject* value, std::vector<FieldMismatch>& out);

/// What decides each SHAPE symbol's reader on this frame, per symbol in the program's order, as a
/// new list of (printed symbol, fact): ("frame",) for a symbol read from the frame (its last step
/// is no SIZE, STRIDE or STORAGE_OFFSET), ("unreadable", the exception's type name) when its
/// tensor cannot be read here, else ("property", the tensor's type, whether the C-level reader
/// answers, is an array, is a tensor). Each tensor is read once (the same steps a check runs, user
/// code included). `f_globals` is the frame's globals dict, or anything else for none.
PyObject* symbol_reader_facts(const GuardSet& gs, PyObject* f_locals, PyObject* f_globals);

}  // namespace tripwire::runtime

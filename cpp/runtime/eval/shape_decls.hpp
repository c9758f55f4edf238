// tripwire/cpp/runtime/eval/shape_decls.hpp -- a set's SHAPE relations declared from the specs' objects.
//
// guard_set.py hands a set's SHAPE relations to GuardSetCore as the specs' own argument tuples
// (relation text, symbols, symbol types) and each distinct symbol's declaration once, instead of
// one Python GuardDecl per relation: these functions turn those into core::GuardDecls. They read
// only exact tuples, lists, str and int (no user code runs), so the borrowed items stay alive
// while they are compared by identity. Every function expects the GIL; on failure it returns
// false (or null) with a Python error set, and leaves its output as it was.
#pragma once

#include <vector>

#include "core/ir.hpp"
#include "runtime/py.hpp"

namespace tripwire::runtime {

/// The distinct symbols (by identity, in order of first use) of the SHAPE argument tuples in
/// `args` (an exact list), as a new list. When `source_type` is not null and a symbol is not
/// exactly of it, Py_None (new reference) instead.
PyObject* distinct_shape_symbols(PyObject* args, PyObject* source_type);

/// (indices, argument tuples) of `specs` (an exact list) when every spec is an exact `spec_type`
/// whose kind is `shape_kind` and whose arguments are an exact 3-tuple (plain dataclass fields:
/// no user code runs), else Py_None (guard_set.py, _encode's all-SHAPE set). New reference.
PyObject* shape_specs(PyObject* specs, PyObject* spec_type, PyObject* shape_kind);

/// Each SHAPE symbol's declaration, made once per set and shared by every relation that names it:
/// `templates[k]` with its constant ids (the root's name, the steps' operands) mapped through
/// `remaps[k]`, an exact list of the set's pool ids, or `templates[k]` as it is when `remaps[k]`
/// is None (a declaration whose ids are the pool's already). `remaps` is an exact list.
bool symbol_paths(const std::vector<const core::SourcePath*>& templates, PyObject* remaps,
                  std::vector<core::SharedPath>& out);

/// The SHAPE relations merged into `decls`: relation r (id `ids[r]`, arguments `args[r]`) goes
/// before what was `decls[at[r]]`, so the declarations keep the specs' order; its symbols are
/// `shared[k]` where `symbols[k]` is the relation's symbol (by identity). `at`, `ids`, `args` and
/// `symbols` are exact lists.
bool add_shape_decls(std::vector<core::GuardDecl>& decls, PyObject* at, PyObject* ids, PyObject* args,
                     PyObject* symbols, const std::vector<core::SharedPath>& shared);

}  // namespace tripwire::runtime

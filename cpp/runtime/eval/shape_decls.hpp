// tripwire/cpp/runtime/eval/shape_decls.hpp -- a set's SHAPE relations declared from the specs' objects.
//
// guard_set.py hands a set's SHAPE relations to GuardSetCore (and, for a saved set, to
// _core.with_shape_decls) as the specs' own argument tuples (relation text, symbols, symbol
// types) and each distinct symbol's declaration once (declared by guard_set._source_decl as any
// source is), instead of one Python GuardDecl per relation: add_shape_decls turns those into
// core::GuardDecls, the one place a SHAPE relation is declared. It reads only exact tuples, lists, str and
// int (no user code runs), so the borrowed items stay alive while they are compared by identity.
// It expects the GIL; on failure it returns false with a Python error set, and leaves its output
// as it was.
#pragma once

#include <vector>

#include "core/ir.hpp"
#include "runtime/py.hpp"

namespace tripwire::runtime {

/// The SHAPE relations merged into `decls`: relation r (id `ids[r]`, arguments `args[r]`) goes
/// before what was `decls[at[r]]`, so the declarations keep the specs' order; its symbols are
/// `shared[k]` where `symbols[k]` is the relation's symbol (by identity). `at`, `ids`, `args` and
/// `symbols` are exact lists.
bool add_shape_decls(std::vector<core::GuardDecl>& decls, PyObject* at, PyObject* ids, PyObject* args,
                     PyObject* symbols, const std::vector<core::SharedPath>& shared);

}  // namespace tripwire::runtime

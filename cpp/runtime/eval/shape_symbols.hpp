// tripwire/cpp/runtime/eval/shape_symbols.hpp -- reading SHAPE symbols from Python values.
//
// The tree walk reads each symbol's source once, like any other source, and stores its value in
// the check's ShapeFrame (core/shape/program.hpp): int64 and double values go straight into
// registers, with no allocation; ints beyond int64 are converted to BigInt in place (no Python
// object is created). After the walk the relations run on the frame.
//
// The frame belongs to one check: `ShapeScope` makes it the current frame of this thread for the
// duration of the walk and restores the previous one after, so a check that user code starts in
// the middle of another (a tensor subclass's size() calling check) has its own, and a check on
// another thread (user code may release the GIL) never sees it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/shape/program.hpp"
#include "runtime/py.hpp"

namespace tripwire::runtime {

/// The current check's shape frame on this thread, and (for why_not) the symbols' values.
class ShapeScope {
  public:
    explicit ShapeScope(core::shape::ShapeFrame* frame, std::vector<Ref>* values = nullptr);
    ~ShapeScope();
    ShapeScope(const ShapeScope&) = delete;
    ShapeScope& operator=(const ShapeScope&) = delete;

    /// The innermost scope of this thread, or null.
    static ShapeScope* current();

    core::shape::ShapeFrame* frame;
    std::vector<Ref>* values;  ///< per symbol, the value read (why_not only)

  private:
    ShapeScope* prev_;
};

/// Store `v` as symbol `sym` of type `type` in `f`. False, with nothing stored and no error set,
/// when `v` does not have the symbol's type (an exact int, or an exact float): the relations that
/// read it fail. Runs no user code and allocates no Python object.
bool store_symbol(core::shape::ShapeFrame& f, std::uint32_t sym, core::shape::ValueType type, PyObject* v);

/// "L['n'] is a str, not an int", for a value store_symbol refused.
std::string symbol_type_error(const std::string& source, core::shape::ValueType type, PyObject* v);

/// The failure reason of relation `r`: "<text> is false with L['x'].size()[0] = 9" or
/// "<text> raised ZeroDivisionError: ... with ...". `values` holds each symbol's value.
std::string relation_reason(const core::shape::ShapeProgram& p, std::uint32_t r, const std::string& error,
                            const std::vector<Ref>& values, const std::vector<std::string>& symbol_texts);

}  // namespace tripwire::runtime

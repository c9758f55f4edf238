// tripwire/cpp/core/shape/symbol.hpp -- the structure of a shape symbol written in a plain form.
//
// The parser (parser.hpp) finds each symbol's extent and leaves its meaning to the caller. Most
// symbols are written in a handful of plain printed forms (what torch prints): a root `L['x']`,
// `G['x']` or `C['x']` and steps `.name`, `['key']`, `[i]`, `.size()[i]`, `.stride()[i]`,
// `.storage_offset()`, and in shape relations `.size(i)`, `.stride(i)`, `.shape[i]`. For those the
// structure is read here, so the Python layer builds the source without its own parser. Any other
// text is not plain: the caller reads it with the full source parser (python/tripwire/source.py),
// whose plain reader (_parse_plain, shape_is_size=True) this one agrees with wherever it accepts
// (tests/python/test_shapes.py compares them).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "core/ir.hpp"

namespace tripwire::core::shape {

/// One step of a plain symbol.
struct PlainStep {
    /// What the step's argument is.
    enum class Arg : std::uint8_t {
        None,   ///< STORAGE_OFFSET
        Index,  ///< SIZE, STRIDE, an int ITEM: `index`
        Name,   ///< ATTR, a str ITEM: `name` (printable ASCII without quote or backslash)
    };
    StepKind kind = StepKind::Attr;
    Arg arg = Arg::None;
    std::int64_t index = 0;  ///< decimal, at most 18 digits, no leading zero
    std::string_view name;   ///< a view into the symbol text
};

/// A symbol in a plain form: its root, the root's name and its steps.
struct PlainSymbol {
    RootKind root = RootKind::Local;
    std::string_view name;  ///< a view into the symbol text
    std::vector<PlainStep> steps;
    /// Whether the text is the source's printed form (tripwire prints `.size()[i]`, not `.size(i)`
    /// or `.shape[i]`): every other plain text prints exactly as written.
    bool as_printed = true;
};

/// Read `text` as a plain symbol into `out` (its views point into `text`); false for any other
/// text (blanks, other quotes, escapes, non-ASCII, dunders, keywords, calls, big positions, ...),
/// which the caller reads with the full source parser.
bool parse_plain_symbol(std::string_view text, PlainSymbol& out);

}  // namespace tripwire::core::shape

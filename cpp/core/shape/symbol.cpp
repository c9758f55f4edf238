// tripwire/cpp/core/shape/symbol.cpp -- reading plain symbols (symbol.hpp).
//
// The grammar is python/tripwire/source.py's _PLAIN_ROOT / _PLAIN_STEP with shape_is_size, read
// the way Python's regular expressions read it (alternatives in order, identifiers greedy).
// Refusing more than that reader is safe (the caller falls back to it); accepting more is not.
#include "core/shape/symbol.hpp"

#include <string_view>

namespace tripwire::core::shape {
namespace {

bool is_ident_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_ident_char(char c) { return is_ident_start(c) || (c >= '0' && c <= '9'); }
// A character of a quoted name or key: printable ASCII but the quote and the backslash.
bool is_key_char(char c) { return c >= ' ' && c <= '~' && c != '\'' && c != '\\'; }

// Python's keywords, and its soft keywords (refusing those too is safe: see above).
constexpr std::string_view kKeywords[] = {
    "False",    "None",   "True",  "and",  "as",     "assert",   "async",   "await", "break", "class",
    "continue", "def",    "del",   "elif", "else",   "except",   "finally", "for",   "from",  "global",
    "if",       "import", "in",    "is",   "lambda", "nonlocal", "not",     "or",    "pass",  "raise",
    "return",   "try",    "while", "with", "yield",  "match",    "case",    "type",  "_",
};

class Reader {
  public:
    explicit Reader(std::string_view text) : s_(text) {}

    bool read(PlainSymbol& out) {
        out.steps.clear();
        out.as_printed = true;
        if (s_.size() < 5) return false;
        switch (s_[0]) {
            case 'L': out.root = RootKind::Local; break;
            case 'G': out.root = RootKind::Global; break;
            case 'C': out.root = RootKind::Closure; break;
            default: return false;
        }
        pos_ = 1;
        if (!eat('[') || !quoted(out.name) || !eat(']')) return false;
        while (pos_ < s_.size()) {
            PlainStep st;
            if (eat('.')) {
                if (!dotted(st, out.as_printed)) return false;
            } else if (eat('[')) {
                std::string_view key;
                if (peek() == '\'') {
                    if (!quoted(key)) return false;
                    st.arg = PlainStep::Arg::Name;
                    st.name = key;
                } else if (!position(st.index)) {
                    return false;
                } else {
                    st.arg = PlainStep::Arg::Index;
                }
                if (!eat(']')) return false;
                st.kind = StepKind::Item;
            } else {
                return false;
            }
            out.steps.push_back(st);
        }
        return true;
    }

  private:
    char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
    bool eat(char c) {
        if (peek() != c) return false;
        ++pos_;
        return true;
    }
    bool eat(std::string_view tok) {
        if (s_.substr(pos_, tok.size()) != tok) return false;
        pos_ += tok.size();
        return true;
    }

    // 'chars': a name or key without quote or backslash.
    bool quoted(std::string_view& out) {
        if (!eat('\'')) return false;
        const std::size_t begin = pos_;
        while (pos_ < s_.size() && is_key_char(s_[pos_])) ++pos_;
        out = s_.substr(begin, pos_ - begin);
        return eat('\'');
    }

    // A position: `0` or up to 18 digits without a leading zero (what fits an int64 surely).
    bool position(std::int64_t& out) {
        const std::size_t begin = pos_;
        while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
        const std::size_t n = pos_ - begin;
        if (n == 0 || n > 18 || (n > 1 && s_[begin] == '0')) return false;
        out = 0;
        for (std::size_t i = begin; i < pos_; ++i) out = out * 10 + (s_[i] - '0');
        return true;
    }

    // After a '.': `size()[i]`, `stride()[i]`, `size(i)`, `stride(i)`, `storage_offset()`,
    // `shape[i]` or an attribute. The property forms are tried first, as the regular expression
    // does; a property name followed by anything else is an attribute, and what follows it must
    // then be a step of its own (a call is not, so `.size(x)` is not plain).
    bool dotted(PlainStep& st, bool& as_printed) {
        const std::size_t begin = pos_;
        if (!is_ident_start(peek())) return false;
        while (pos_ < s_.size() && is_ident_char(s_[pos_])) ++pos_;
        const std::string_view name = s_.substr(begin, pos_ - begin);
        if (name == "size" || name == "stride") {
            st.kind = name == "size" ? StepKind::Size : StepKind::Stride;
            st.arg = PlainStep::Arg::Index;
            if (eat("()[")) return position(st.index) && eat(']');
            if (eat('(')) {
                as_printed = false;
                return position(st.index) && eat(')');
            }
        } else if (name == "storage_offset") {
            if (eat("()")) {
                st.kind = StepKind::StorageOffset;
                return true;
            }
        } else if (name == "shape" && peek() == '[') {
            ++pos_;
            as_printed = false;
            st.kind = StepKind::Size;
            st.arg = PlainStep::Arg::Index;
            return position(st.index) && eat(']');
        }
        if (name.size() >= 2 && name[0] == '_' && name[1] == '_') return false;
        for (const std::string_view kw : kKeywords)
            if (name == kw) return false;
        st.kind = StepKind::Attr;
        st.arg = PlainStep::Arg::Name;
        st.name = name;
        return true;
    }

    std::string_view s_;
    std::size_t pos_ = 0;
};

}  // namespace

bool parse_plain_symbol(std::string_view text, PlainSymbol& out) { return Reader(text).read(out); }

}  // namespace tripwire::core::shape

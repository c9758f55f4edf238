// tripwire/cpp/bindings/bind_shape.cpp -- the shape-relation parser and evaluator, for the builder.
//
// The builder parses a relation through the core (to find its symbols and give errors with
// offsets) and checks it on the example before declaring it. Offsets cross into Python as
// code-point indices into the str (the core counts UTF-8 bytes).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/shape/parser.hpp"
#include "core/shape/program.hpp"
#include "core/shape/small_eval.hpp"
#include "core/shape/symbol.hpp"
#include "object_memo.hpp"
#include "register.hpp"
#include "runtime/eval/dict_hint.hpp"
#include "runtime/eval/fetch.hpp"
#include "runtime/eval/shape_symbols.hpp"
#include "runtime/frame/install_site.hpp"

namespace nb = nanobind;

namespace tripwire::bindings {
namespace {

// Set by tripwire.errors when the package loads: the class ShapeSyntaxError is raised as.
PyObject* g_syntax_error_type = nullptr;

// The code-point index of byte offset `byte` in UTF-8 `text`.
std::size_t code_points(std::string_view text, std::size_t byte) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < byte && i < text.size(); ++i)
        if ((static_cast<unsigned char>(text[i]) & 0xC0U) != 0x80U) ++n;
    return n;
}

// Raise the shape syntax error (message, offset), or (message, offset, text) when `text` is given.
[[noreturn]] void raise_syntax_error(const std::string& message, std::size_t offset,
                                     PyObject* text = nullptr) {
    PyObject* type = g_syntax_error_type != nullptr ? g_syntax_error_type : PyExc_ValueError;
    PyObject* exc =
        text != nullptr
            ? PyObject_CallFunction(type, "snO", message.c_str(), static_cast<Py_ssize_t>(offset), text)
            : PyObject_CallFunction(type, "sn", message.c_str(), static_cast<Py_ssize_t>(offset));
    if (exc != nullptr) {
        PyErr_SetObject(type, exc);
        Py_DECREF(exc);
    }
    throw nb::python_error();
}

// The UTF-8 of a relation's text (kept by the str for its life), or the shape syntax error naming
// the first code point UTF-8 cannot hold: a lone surrogate (a str may hold one; a file name decoded
// with "surrogateescape" does). The text is not a relation, and nanobind's strict std::string
// conversion would have said only "incompatible function arguments".
std::string_view relation_utf8(nb::handle text) {
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(text.ptr(), &size);
    if (data != nullptr) return {data, static_cast<std::size_t>(size)};
    if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) throw nb::python_error();
    PyErr_Clear();
    const Py_ssize_t n = PyUnicode_GET_LENGTH(text.ptr());
    Py_ssize_t at = 0;
    Py_UCS4 c = 0;
    for (; at < n; ++at) {
        c = PyUnicode_READ_CHAR(text.ptr(), at);
        if (c >= 0xD800 && c <= 0xDFFF) break;
    }
    char code[8];
    std::snprintf(code, sizeof code, "%04X", static_cast<unsigned>(c));
    raise_syntax_error(std::string("a relation is text: U+") + code +
                           " is a lone surrogate, which no source or operator spells",
                       static_cast<std::size_t>(at), text.ptr());
}

// Run `f`, turning the core's ShapeSyntaxError into the Python class with a code-point offset.
template <typename F>
auto translating(std::string_view text, F&& f) {
    try {
        return f();
    } catch (const core::shape::ShapeSyntaxError& e) {
        raise_syntax_error(e.what(), code_points(text, e.offset()));
    }
}

std::vector<core::shape::ValueType> value_types(const std::vector<int>& types) {
    std::vector<core::shape::ValueType> out;
    for (int t : types) {
        if (t != 0 && t != 1) throw nb::value_error("a symbol type is 0 (int) or 1 (float)");
        out.push_back(static_cast<core::shape::ValueType>(t));
    }
    return out;
}

// An interned attribute name, made once (the GIL is held).
PyObject* interned(PyObject*& slot, const char* name) {
    if (slot == nullptr) {
        slot = PyUnicode_InternFromString(name);
        if (slot == nullptr) throw nb::python_error();
    }
    return slot;
}

nb::object get_attr(nb::handle obj, PyObject* name) {
    PyObject* v = PyObject_GetAttr(obj.ptr(), name);
    if (v == nullptr) throw nb::python_error();
    return nb::steal(v);
}

// The exact classes tripwire.source.Source and Step, set by tripwire.builder when it loads:
// a symbol of these classes is decoded once and its decoding memoised (below).
PyObject* g_source_type = nullptr;
PyObject* g_step_type = nullptr;

// One symbol (a Source: its fields root, name and steps; each step's kind and arg) as
// read_source (bind_values.cpp) takes it, each step's operand and index as tripwire.source.Step
// gives them (`arg if has_operand else None`, `index`): bit k of `index_kinds` (`no_arg_kinds`)
// set when StepKind k takes a position (no argument). It owns what the read borrows: reading
// runs user code, which could drop a field of the Source while the read holds its operands.
struct SymbolRead {
    runtime::Ref source;  // the memo's key, kept alive so that its address names no other object
    std::uint64_t index_kinds = 0;
    std::uint64_t no_arg_kinds = 0;
    core::RootKind root = core::RootKind::Local;
    runtime::Ref name;
    std::vector<runtime::RuntimeStep> steps;  // operands borrowed from `operands`
    std::vector<runtime::Ref> operands;
};

// Decoded symbols of the exact classes, by object. A Source and its Steps are frozen dataclasses
// (tripwire treats them as immutable everywhere: builder._read_args, guard_set._source_recipe),
// so a decoding stays the object's for as long as the memo holds the object. Bounded (emptied at
// 4096 entries); emptied by _clear_shape_memos.
using SymbolReads = ObjectMemo<SymbolRead, 4096>;
SymbolReads& symbol_reads() {
    static auto* m = new SymbolReads();  // never destroyed: it holds Python objects
    return *m;
}

void clear_symbol_reads() { symbol_reads().clear(); }

std::shared_ptr<const SymbolRead> decode_symbol(nb::handle source, std::uint64_t index_kinds,
                                                std::uint64_t no_arg_kinds, bool& memoisable) {
    static PyObject* s_root = nullptr;
    static PyObject* s_name = nullptr;
    static PyObject* s_steps = nullptr;
    static PyObject* s_kind = nullptr;
    static PyObject* s_arg = nullptr;
    auto d = std::make_shared<SymbolRead>();
    d->source = runtime::Ref::borrow(source.ptr());
    d->index_kinds = index_kinds;
    d->no_arg_kinds = no_arg_kinds;
    const nb::object root = get_attr(source, interned(s_root, "root"));
    nb::object name = get_attr(source, interned(s_name, "name"));
    const nb::object steps = get_attr(source, interned(s_steps, "steps"));
    if (!PyUnicode_CheckExact(name.ptr()) || !PyTuple_CheckExact(steps.ptr()))
        throw nb::value_error("a symbol is a Source (name: str, steps: tuple)");
    d->root = nb::cast<core::RootKind>(root);
    d->name = runtime::Ref::steal(name.release().ptr());
    const auto n = static_cast<std::size_t>(PyTuple_GET_SIZE(steps.ptr()));
    d->steps.resize(n);
    d->operands.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        const nb::handle st = PyTuple_GET_ITEM(steps.ptr(), static_cast<Py_ssize_t>(i));
        memoisable = memoisable && Py_TYPE(st.ptr()) == reinterpret_cast<PyTypeObject*>(g_step_type);
        auto& out = d->steps[i];
        out.kind = nb::cast<core::StepKind>(get_attr(st, interned(s_kind, "kind")));
        nb::object arg = get_attr(st, interned(s_arg, "arg"));
        const auto k = static_cast<unsigned>(out.kind);
        if (k >= 64) throw nb::value_error("a step kind over 63");
        const bool positional = ((index_kinds >> k) & 1U) != 0;
        const bool no_arg = ((no_arg_kinds >> k) & 1U) != 0;
        out.index = positional ? nb::cast<Py_ssize_t>(arg) : 0;
        d->operands[i] = runtime::Ref::steal(arg.release().ptr());
        out.operand = positional || no_arg ? Py_None : d->operands[i].get();
    }
    return d;
}

// The decoding of one symbol: the memoised one for a Source of the exact class whose steps are
// all exact Steps, decoded under the same masks; else decoded now (and memoised if it may be).
std::shared_ptr<const SymbolRead> symbol_read(nb::handle source, std::uint64_t index_kinds,
                                              std::uint64_t no_arg_kinds) {
    bool memoisable =
        g_source_type != nullptr && Py_TYPE(source.ptr()) == reinterpret_cast<PyTypeObject*>(g_source_type);
    if (memoisable) {
        std::shared_ptr<const SymbolRead> kept = symbol_reads().find(source.ptr());
        if (kept && kept->index_kinds == index_kinds && kept->no_arg_kinds == no_arg_kinds) return kept;
    }
    std::shared_ptr<const SymbolRead> d = decode_symbol(source, index_kinds, no_arg_kinds, memoisable);
    // Decoding ran Python code (getattr), which may have changed the memo: put() looks it up again
    // (and replaces an entry decoded under other masks).
    if (memoisable) symbol_reads().put(source.ptr(), d);
    return d;
}

// The value of one symbol on the example (a new reference), read as read_source reads it;
// `steps` is the caller's scratch (read_source fills its steps' inline caches).
runtime::Ref read_symbol(const SymbolRead& d, std::vector<runtime::RuntimeStep>& steps, nb::handle f_locals,
                         nb::handle f_globals, nb::handle f_closure) {
    runtime::RuntimeRoot r;
    r.kind = d.root;
    r.name = d.name.get();
    if (r.kind == core::RootKind::Closure && PyDict_Check(f_closure.ptr())) {
        PyObject* cell = PyDict_GetItemWithError(f_closure.ptr(), r.name);
        if (cell == nullptr && PyErr_Occurred()) throw nb::python_error();
        r.cell = cell != nullptr && PyCell_Check(cell) ? cell : nullptr;
    }
    steps.assign(d.steps.begin(), d.steps.end());
    PyObject* globals = PyDict_Check(f_globals.ptr()) ? f_globals.ptr() : nullptr;
    runtime::Ref v = runtime::read_source(r, steps, runtime::Locals::of_mapping(f_locals.ptr()), globals);
    if (!v) throw nb::python_error();
    return v;
}

// read_symbol's steps for one relation_holds_on: the calling thread's vector (kept, so a build
// allocates it once) unless a call on the thread already holds it (a read runs user code, which
// may declare a guard and so call relation_holds_on again): that call takes a vector of its own.
// RuntimeStep is trivially destructible (borrowed pointers, overwritten before any use).
class StepsScratch {
  public:
    StepsScratch() {
        Thread* t = thread();
        if (!t->lent) {
            t->lent = true;
            lent_ = &t->lent;
            steps_ = &t->steps;
        }
    }
    ~StepsScratch() {
        if (lent_ != nullptr) *lent_ = false;
    }
    StepsScratch(const StepsScratch&) = delete;
    StepsScratch& operator=(const StepsScratch&) = delete;
    std::vector<runtime::RuntimeStep>& steps() { return *steps_; }

  private:
    struct Thread {
        std::vector<runtime::RuntimeStep> steps;
        bool lent = false;
    };
    [[gnu::noinline]] static Thread* thread() {
        static thread_local Thread t;
        return &t;
    }
    std::vector<runtime::RuntimeStep> own_;
    std::vector<runtime::RuntimeStep>* steps_ = &own_;
    bool* lent_ = nullptr;
};

// Python's str.isspace() of an ASCII character (str.strip() strips these).
bool is_python_space(char c) { return (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= ' '); }

// Sources of plain symbols the memo holds at most (then it is emptied).
constexpr Py_ssize_t kSymbolMemo = 4096;

nb::object owned(PyObject* o) {
    if (o == nullptr) throw nb::python_error();
    return nb::steal(o);
}

// A new instance of `type` as `object.__new__(type)` makes it (no __init__, no __post_init__):
// the objects below are built from fields the engine has checked, as the Python fast
// constructors build them (python/tripwire/source.py _parse_plain, _plain_step).
nb::object new_instance(PyTypeObject* type) {
    static PyObject* empty = nullptr;
    if (empty == nullptr && (empty = PyTuple_New(0)) == nullptr) throw nb::python_error();
    return owned(PyBaseObject_Type.tp_new(type, empty, nullptr));
}

// `object.__setattr__(obj, name, value)`: past a frozen dataclass's __setattr__.
void set_field(nb::handle obj, PyObject* name, nb::handle value) {
    if (PyObject_GenericSetAttr(obj.ptr(), name, value.ptr()) != 0) throw nb::python_error();
}

// A class whose instances object.__new__ makes (a plain Python class: a dataclass here).
PyTypeObject* plain_class(nb::handle type, const char* what) {
    if (!PyType_Check(type.ptr()) ||
        reinterpret_cast<PyTypeObject*>(type.ptr())->tp_new != PyBaseObject_Type.tp_new)
        throw nb::type_error((std::string(what) + " must be a class made by object.__new__").c_str());
    return reinterpret_cast<PyTypeObject*>(type.ptr());
}

// Steps shared by every Source that names them: one immutable Step per (kind, position) of the
// positional steps a plain symbol names most (shapes._SHARED_STEPS, made when tripwire.shapes
// loads: `.size()[i]`, `.stride()[i]`), found by kind and position without a Python lookup. A
// Step is a frozen dataclass that tripwire never mutates, so Sources may share one as they share
// the StepKind members. Only Steps of `step_class` are shared.
struct SharedSteps {
    static constexpr std::size_t kKinds = 64;
    static constexpr std::int64_t kPositions = 16;
    nb::object owner;  // a tuple of the Steps: holds them
    PyTypeObject* step_class = nullptr;
    std::array<PyObject*, kKinds* static_cast<std::size_t>(kPositions)> steps{};  // borrowed from owner

    // The shared Step of `st`, or null.
    PyObject* find(const core::shape::PlainStep& st, PyTypeObject* cls) const {
        const auto kind = static_cast<std::size_t>(st.kind);
        if (cls != step_class || st.arg != core::shape::PlainStep::Arg::Index || st.index < 0 ||
            st.index >= kPositions || kind >= kKinds)
            return nullptr;
        return steps[kind * static_cast<std::size_t>(kPositions) + static_cast<std::size_t>(st.index)];
    }
};

// The classes relations_of_text builds instances of, and the Steps it may share (or null).
struct PlainClasses {
    PyTypeObject* relation;
    PyTypeObject* source;
    PyTypeObject* step;
    const SharedSteps* shared = nullptr;
};

// A Step(kind, arg) of one plain step, as source._plain_step makes it (or the shared one).
nb::object plain_step(const core::shape::PlainStep& st, const PlainClasses& classes) {
    static PyObject* s_kind = nullptr;
    static PyObject* s_arg = nullptr;
    if (classes.shared != nullptr) {
        if (PyObject* known = classes.shared->find(st, classes.step)) return nb::borrow(known);
    }
    PyTypeObject* step_class = classes.step;
    nb::object arg;
    switch (st.arg) {
        case core::shape::PlainStep::Arg::None: arg = nb::none(); break;
        case core::shape::PlainStep::Arg::Index: arg = owned(PyLong_FromLongLong(st.index)); break;
        case core::shape::PlainStep::Arg::Name:
            arg = owned(PyUnicode_FromStringAndSize(st.name.data(), static_cast<Py_ssize_t>(st.name.size())));
            break;
    }
    nb::object step = new_instance(step_class);
    set_field(step, interned(s_kind, "kind"), nb::cast(st.kind));
    set_field(step, interned(s_arg, "arg"), arg);
    return step;
}

// The str of each symbol text plain_source has looked up, its hash kept in it: a cold build names
// a few symbols in many relations, each looked up without a new str and its hashing. A key views
// the UTF-8 bytes of its own str (which holds a strong reference). Emptied with the symbol memo
// (relations_of_text finds it empty: builder.clear_build_memos) and when it holds kSymbolMemo texts.
std::unordered_map<std::string_view, PyObject*>& symbol_keys() {
    static auto* keys = new std::unordered_map<std::string_view, PyObject*>();
    return *keys;  // never destroyed: no order-of-destruction question at exit
}

void clear_symbol_keys() {
    std::unordered_map<std::string_view, PyObject*> old;
    old.swap(symbol_keys());
    for (auto& kv : old) Py_DECREF(kv.second);  // a str: its dealloc runs no Python code
}

// The str of `text` (a new reference).
nb::object symbol_key(std::string_view text) {
    auto& keys = symbol_keys();
    auto it = keys.find(text);
    if (it != keys.end()) return nb::borrow(it->second);
    nb::object key = owned(PyUnicode_FromStringAndSize(text.data(), static_cast<Py_ssize_t>(text.size())));
    Py_ssize_t size = 0;
    const char* bytes = PyUnicode_AsUTF8AndSize(key.ptr(), &size);  // kept by the str for its life
    if (bytes == nullptr) throw nb::python_error();
    if (static_cast<Py_ssize_t>(keys.size()) >= kSymbolMemo) clear_symbol_keys();
    symbol_keys().emplace(std::string_view(bytes, static_cast<std::size_t>(size)), key.inc_ref().ptr());
    return key;
}

// The Source of one plain symbol: from `memo` (keyed by its text, which is its printed form; it
// holds only those), or made as source._parse_plain makes it (fields root, name, steps; `_text`,
// __str__'s cache) and remembered; null when the text is not a plain symbol as printed. `scratch`
// is the reader's output, reused from symbol to symbol.
nb::object plain_source(std::string_view text, core::shape::PlainSymbol& scratch, nb::handle memo,
                        const PlainClasses& classes) {
    static PyObject* s_root = nullptr;
    static PyObject* s_name = nullptr;
    static PyObject* s_steps = nullptr;
    static PyObject* s_text = nullptr;
    nb::object key = symbol_key(text);
    PyObject* known = PyDict_GetItemWithError(memo.ptr(), key.ptr());  // an exact str key: no user code
    if (known != nullptr) return nb::borrow(known);
    if (PyErr_Occurred()) throw nb::python_error();
    const core::shape::PlainSymbol& sym = scratch;
    if (!core::shape::parse_plain_symbol(text, scratch) || !sym.as_printed) return {};
    nb::object steps = owned(PyTuple_New(static_cast<Py_ssize_t>(sym.steps.size())));
    for (std::size_t i = 0; i < sym.steps.size(); ++i) {
        PyTuple_SET_ITEM(steps.ptr(), static_cast<Py_ssize_t>(i),
                         plain_step(sym.steps[i], classes).release().ptr());
    }
    nb::object src = new_instance(classes.source);
    set_field(src, interned(s_root, "root"), nb::cast(sym.root));
    set_field(src, interned(s_name, "name"), nb::str(sym.name.data(), sym.name.size()));
    set_field(src, interned(s_steps, "steps"), steps);
    set_field(src, interned(s_text, "_text"), key);
    if (PyDict_GET_SIZE(memo.ptr()) >= kSymbolMemo) PyDict_Clear(memo.ptr());
    if (PyDict_SetItem(memo.ptr(), key.ptr(), src.ptr()) != 0) throw nb::python_error();
    return src;
}

// Whether a relation's code may be a top-level conjunction: shapes._conjuncts splits nothing
// else (the same test on the same text: UTF-8 holds these ASCII bytes only as themselves).
bool may_be_conjunction(std::string_view code) {
    // " and " found as "and " after a blank: a search from 'a' (rare in torch's code parts), not
    // from ' ' (between every operand).
    for (std::size_t at = code.find("and "); at != std::string_view::npos; at = code.find("and ", at + 1))
        if (at > 0 && code[at - 1] == ' ') return true;
    return code.find("And(") != std::string_view::npos;
}

// shapes.relations_from_torch's relations of `text` when every symbol is written in its printed
// plain form (symbol.hpp): the fields python/tripwire/shapes.py's general path computes (the code
// without leading blanks, the comment stripped as str.strip() does), in a Relation made as
// Relation.__init__ leaves it but for `_spans`, which the Relation computes when first asked for
// it (only an error's offset in `original` uses it). A 1-tuple of it when the code has no conjunction to
// split, the Relation alone when it may have one (the caller splits it); None for any other relation (the
// caller reads its symbols with the source parser).
nb::object relations_of_text(const nb::str& text, const nb::dict& memo, const PlainClasses& classes) {
    static PyObject* s_text = nullptr;
    static PyObject* s_symbols = nullptr;
    static PyObject* s_comment = nullptr;
    static PyObject* s_original = nullptr;
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(text.ptr(), &size);
    if (data == nullptr) {
        PyErr_Clear();  // a lone surrogate: the general path says what it always said
        return nb::none();
    }
    const std::string_view s(data, static_cast<std::size_t>(size));
    const bool ascii = PyUnicode_IS_ASCII(text.ptr()) != 0;
    const auto at = [&](std::size_t byte) {
        return static_cast<Py_ssize_t>(ascii ? byte : code_points(s, byte));
    };
    // The parse of the code alone, as the memo keeps it for the builder's compile of that code:
    // offsets from the code's start, `lead` bytes (ASCII blanks, one code point each) into `s`.
    std::size_t lead = 0;
    std::shared_ptr<const core::shape::ParsedRelation> parsed;
    try {
        parsed = core::shape::parse_code_remembering(s, lead);
    } catch (const core::shape::ShapeSyntaxError& e) {
        raise_syntax_error(e.what(), static_cast<std::size_t>(at(e.offset())), text.ptr());
    }
    const core::shape::ParsedRelation& r = *parsed;
    if (PyDict_GET_SIZE(memo.ptr()) == 0) clear_symbol_keys();  // emptied with the memo
    // The symbols first: any not plain as printed makes this None (the Sources already made are
    // those of their texts, kept in the memo for the next relation naming them).
    nb::object symbols = owned(PyTuple_New(static_cast<Py_ssize_t>(r.symbols.size())));
    core::shape::PlainSymbol scratch;
    for (std::size_t k = 0; k < r.symbols.size(); ++k) {
        nb::object src = plain_source(r.symbols[k], scratch, memo, classes);
        if (!src.is_valid()) return nb::none();
        PyTuple_SET_ITEM(symbols.ptr(), static_cast<Py_ssize_t>(k), src.release().ptr());
    }

    const std::size_t code_end = lead + r.code_end;
    nb::object code = owned(PyUnicode_Substring(text.ptr(), static_cast<Py_ssize_t>(lead), at(code_end)));

    nb::object comment = nb::none();
    std::size_t hash = code_end;
    while (hash < s.size() && core::shape::is_blank(s[hash])) ++hash;
    if (hash < s.size()) {  // a '#': the parser stops nowhere else
        if (ascii) {
            std::size_t b = hash + 1, e = s.size();
            while (b < e && is_python_space(s[b])) ++b;
            while (e > b && is_python_space(s[e - 1])) --e;
            if (e > b) {
                comment = owned(
                    PyUnicode_Substring(text.ptr(), static_cast<Py_ssize_t>(b), static_cast<Py_ssize_t>(e)));
            }
        } else {
            nb::object body =
                owned(PyUnicode_Substring(text.ptr(), at(hash) + 1, PyUnicode_GET_LENGTH(text.ptr())));
            nb::object stripped = owned(PyObject_CallMethod(body.ptr(), "strip", nullptr));
            if (PyUnicode_GET_LENGTH(stripped.ptr()) > 0) comment = std::move(stripped);
        }
    }

    nb::object rel = new_instance(classes.relation);
    set_field(rel, interned(s_text, "text"), code);
    set_field(rel, interned(s_symbols, "symbols"), symbols);
    set_field(rel, interned(s_comment, "comment"), comment);
    set_field(rel, interned(s_original, "original"), text);
    if (may_be_conjunction(s.substr(lead, r.code_end))) return rel;
    nb::object one = owned(PyTuple_New(1));
    PyTuple_SET_ITEM(one.ptr(), 0, rel.release().ptr());
    return one;
}

// What relations_of_part and relations_from_torch pass to relations_of_text, the general paths
// they fall back to and relations_from_torch's memo; set once by tripwire.shapes
// (_set_plain_relations), kept for the life of the process.
struct PlainRelations {
    nb::dict memo;       // shapes._PLAIN_SYMBOLS
    nb::object classes;  // (Relation, Source, Step)
    nb::object general;  // shapes._general_relations(code_part, relation or None) -> tuple
    nb::dict relations;  // shapes._RELATIONS: relations_from_torch's tuple of each exact str
    nb::object split;    // shapes._split_relations(code_part) -> tuple, for any other code part
    std::shared_ptr<const SharedSteps> shared;  // shapes._SHARED_STEPS, read
};
PlainRelations* g_plain_relations = nullptr;

// The shared Steps of `steps` ({(kind, position): Step}): each an exact `step_class` whose fields
// are that kind and that int position, as source._plain_step makes it. The table holds its Steps
// in a tuple of its own: the dict may be changed later, or by the code its keys' == runs now.
std::shared_ptr<const SharedSteps> shared_steps(const nb::dict& steps, PyTypeObject* step_class) {
    static PyObject* s_kind = nullptr;
    static PyObject* s_arg = nullptr;
    const nb::object items = owned(PyDict_Items(steps.ptr()));  // a list of new (key, Step) tuples
    const Py_ssize_t n = PyList_GET_SIZE(items.ptr());
    auto out = std::make_shared<SharedSteps>();
    out->owner = owned(PyTuple_New(n));
    out->step_class = step_class;
    for (Py_ssize_t i = 0; i < n; ++i) {
        const nb::handle item = PyList_GET_ITEM(items.ptr(), i);
        const nb::handle key = PyTuple_GET_ITEM(item.ptr(), 0);
        const nb::handle step = PyTuple_GET_ITEM(item.ptr(), 1);
        PyTuple_SET_ITEM(out->owner.ptr(), i, step.inc_ref().ptr());
        if (Py_TYPE(step.ptr()) != step_class) throw nb::type_error("a shared step is an exact step_class");
        const nb::object kind_obj = get_attr(step, interned(s_kind, "kind"));
        const auto kind = static_cast<std::size_t>(nb::cast<core::StepKind>(kind_obj));
        const nb::object arg = get_attr(step, interned(s_arg, "arg"));
        if (!PyLong_CheckExact(arg.ptr()))
            throw nb::value_error("a shared step's argument is an int position");
        const auto position = nb::cast<std::int64_t>(arg);
        if (position < 0 || position >= SharedSteps::kPositions || kind >= SharedSteps::kKinds)
            throw nb::value_error("a shared step's kind or position is out of the table");
        if (!key.equal(nb::make_tuple(kind_obj, arg)))
            throw nb::value_error("a shared step is keyed by (kind, position)");
        out->steps[kind * static_cast<std::size_t>(SharedSteps::kPositions) +
                   static_cast<std::size_t>(position)] = step.ptr();
    }
    return out;
}

void set_plain_relations(const nb::dict& memo, nb::handle relation_class, nb::handle source_class,
                         nb::handle step_class, nb::handle general, const nb::dict& relations,
                         nb::handle split, const nb::dict& shared) {
    plain_class(relation_class, "relation_class");
    plain_class(source_class, "source_class");
    auto* p = new PlainRelations{memo,
                                 nb::make_tuple(relation_class, source_class, step_class),
                                 nb::borrow(general),
                                 relations,
                                 nb::borrow(split),
                                 shared_steps(shared, plain_class(step_class, "step_class"))};
    std::swap(p, g_plain_relations);
    delete p;  // NOLINT(cppcoreguidelines-owning-memory): the previous objects, replaced
}

// The settings of _set_plain_relations, referenced for one call: a re-entrant _set_plain_relations
// (reading a shared step's fields runs code) may replace the struct while a call uses them.
struct PlainRelationsCall {
    nb::object classes, general, split;
    nb::dict memo, relations;  // copied, not default-made: nb::dict() would make a new dict
    std::shared_ptr<const SharedSteps> shared;

    PlainRelationsCall() : PlainRelationsCall(current()) {}
    explicit PlainRelationsCall(const PlainRelations& p)
        : classes(p.classes),
          general(p.general),
          split(p.split),
          memo(p.memo),
          relations(p.relations),
          shared(p.shared) {}
    static const PlainRelations& current() {
        if (g_plain_relations == nullptr)
            throw nb::type_error("tripwire.shapes has not set the relation classes");
        return *g_plain_relations;
    }
    PlainClasses plain_classes() const {
        return {reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(classes.ptr(), 0)),
                reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(classes.ptr(), 1)),
                reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(classes.ptr(), 2)), shared.get()};
    }
};

// relations_of_text with the classes given (checked here), sharing the Steps _set_plain_relations
// set when `step_class` is theirs.
nb::object relations_of_text_of(const nb::str& text, const nb::dict& memo, nb::handle relation_class,
                                nb::handle source_class, nb::handle step_class) {
    PlainClasses classes{plain_class(relation_class, "relation_class"),
                         plain_class(source_class, "source_class"), plain_class(step_class, "step_class")};
    std::shared_ptr<const SharedSteps> shared;  // kept for the call
    if (g_plain_relations != nullptr) shared = g_plain_relations->shared;
    classes.shared = shared.get();
    return relations_of_text(text, memo, classes);
}

// The relations of an exact str: relations_of_text's 1-tuple, or what the general path makes of
// its Relation (a conjunction to split) or of its None.
nb::tuple relations_of_str(const nb::str& text, const PlainRelationsCall& call) {
    nb::object rel = relations_of_text(text, call.memo, call.plain_classes());
    if (!PyTuple_CheckExact(rel.ptr())) rel = call.general(text, rel);
    if (!PyTuple_Check(rel.ptr())) throw nb::type_error("the general path must give a tuple of relations");
    return nb::borrow<nb::tuple>(rel);
}

// shapes.relations_from_torch's relations of an exact str, without its memo.
nb::tuple relations_of_part(const nb::str& text) { return relations_of_str(text, PlainRelationsCall()); }

// Relations shapes._RELATIONS holds at most (then it is emptied).
constexpr Py_ssize_t kRelationsMemo = 4096;

// A new list of the items of `tuple`.
nb::list list_of(nb::handle tuple) {
    const Py_ssize_t n = PyTuple_GET_SIZE(tuple.ptr());
    nb::object out = owned(PyList_New(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* item = PyTuple_GET_ITEM(tuple.ptr(), i);
        Py_INCREF(item);
        PyList_SET_ITEM(out.ptr(), i, item);
    }
    return nb::borrow<nb::list>(out);
}

// shapes.relations_from_torch: a new list (the caller may change it) of the relations of
// `code_part`. An exact str's tuple is memoised in shapes._RELATIONS (keyed by the str: its hash
// and == run no user code; errors are not memoised): a JIT that recompiles sees the same code
// parts again. Anything else takes shapes._split_relations, not memoised.
nb::list relations_from_torch(nb::handle code_part) {
    const PlainRelationsCall call;
    if (!PyUnicode_CheckExact(code_part.ptr())) {
        const nb::object rels = call.split(code_part);
        if (!PyTuple_Check(rels.ptr()))
            throw nb::type_error("the general path must give a tuple of relations");
        return list_of(rels);
    }
    PyObject* known = PyDict_GetItemWithError(call.relations.ptr(), code_part.ptr());
    if (known != nullptr) {
        // Referenced first: making the list may collect, and a finaliser may empty the memo.
        const nb::object rels = nb::borrow(known);
        return list_of(rels);
    }
    if (PyErr_Occurred()) throw nb::python_error();
    const nb::tuple rels = relations_of_str(nb::borrow<nb::str>(code_part), call);
    if (PyDict_GET_SIZE(call.relations.ptr()) >= kRelationsMemo) PyDict_Clear(call.relations.ptr());
    if (PyDict_SetItem(call.relations.ptr(), code_part.ptr(), rels.ptr()) != 0) throw nb::python_error();
    return list_of(rels);
}

void set_symbol_types(nb::handle source, nb::handle step) {
    if (!PyType_Check(source.ptr()) || !PyType_Check(step.ptr())) throw nb::type_error("needs two classes");
    clear_symbol_reads();
    Py_XDECREF(g_source_type);
    Py_XDECREF(g_step_type);
    g_source_type = source.inc_ref().ptr();  // kept for the life of the process
    g_step_type = step.inc_ref().ptr();
}

// What GuardBuilder.shape's spec_of_shape call needs besides the relation and the example, set
// once by tripwire.builder (_set_shape_builder); kept for the life of the process.
struct ShapeBuilder {
    nb::object spec_type;   // tripwire.catalogue.GuardSpec
    nb::object shape_kind;  // GuardKind.SHAPE
    std::uint64_t index_kinds = 0;
    std::uint64_t no_arg_kinds = 0;
    nb::object type_names;    // builder._TYPE_NAMES
    nb::object is_machinery;  // builder._is_machinery
    int depth = 0;            // builder._STACK_DEPTH
};
ShapeBuilder* g_shape_builder = nullptr;

void set_shape_builder(nb::handle source, nb::handle step, nb::handle spec_type, nb::handle shape_kind,
                       std::uint64_t index_kinds, std::uint64_t no_arg_kinds, nb::handle type_names,
                       nb::handle is_machinery, int depth) {
    plain_class(spec_type, "spec_type");
    set_symbol_types(source, step);
    auto* b = new ShapeBuilder{nb::borrow(spec_type),  nb::borrow(shape_kind),   index_kinds, no_arg_kinds,
                               nb::borrow(type_names), nb::borrow(is_machinery), depth};
    std::swap(b, g_shape_builder);
    delete b;  // NOLINT(cppcoreguidelines-owning-memory): the previous objects, replaced
}

// Type-name tuples `type_names` holds at most (then it is emptied).
constexpr Py_ssize_t kTypeNames = 4096;

// Symbols one call keeps in arrays on the stack (more take a heap array).
constexpr std::size_t kInlineSymbols = 8;

// The type names of a relation's symbols, as `type_names` shares them (see relation_holds_on's
// docstring): a new reference.
nb::object symbol_type_names(const core::shape::ValueType* types, std::size_t n, nb::handle type_names) {
    static PyObject* s_int = nullptr;
    static PyObject* s_float = nullptr;
    interned(s_int, "int");
    interned(s_float, "float");
    nb::object key;
    if (n < 63 && PyDict_CheckExact(type_names.ptr())) {
        std::uint64_t bits = std::uint64_t{1} << n;
        for (std::size_t k = 0; k < n; ++k)
            if (types[k] == core::shape::ValueType::Float) bits |= std::uint64_t{1} << k;
        key = owned(PyLong_FromUnsignedLongLong(bits));  // an exact int: the lookup runs no user code
        PyObject* known = PyDict_GetItemWithError(type_names.ptr(), key.ptr());
        if (known != nullptr) return nb::borrow(known);
        if (PyErr_Occurred()) throw nb::python_error();
    }
    nb::object names = owned(PyTuple_New(static_cast<Py_ssize_t>(n)));
    for (std::size_t k = 0; k < n; ++k) {
        PyObject* name = types[k] == core::shape::ValueType::Float ? s_float : s_int;
        Py_INCREF(name);
        PyTuple_SET_ITEM(names.ptr(), static_cast<Py_ssize_t>(k), name);
    }
    if (key.is_valid()) {
        if (PyDict_GET_SIZE(type_names.ptr()) >= kTypeNames) PyDict_Clear(type_names.ptr());
        if (PyDict_SetItem(type_names.ptr(), key.ptr(), names.ptr()) != 0) throw nb::python_error();
    }
    return names;
}

// holds_on_small_ints of the relation's parse on `values` when they are all ints that fit int64
// (read without running code: exact ints); Undecided otherwise.
core::shape::SmallTruth holds_on_small_ints(std::string_view code, const core::shape::ValueType* types,
                                            const runtime::Ref* values, std::size_t n) {
    std::array<std::int64_t, kInlineSymbols> ints{};
    if (n > kInlineSymbols) return core::shape::SmallTruth::Undecided;
    for (std::size_t k = 0; k < n; ++k) {
        int overflow = 0;
        if (types[k] != core::shape::ValueType::Int) return core::shape::SmallTruth::Undecided;
        ints[k] = PyLong_AsLongLongAndOverflow(values[k].get(), &overflow);
        if (overflow != 0) return core::shape::SmallTruth::Undecided;
    }
    const std::shared_ptr<const core::shape::ParsedRelation> parsed =
        core::shape::parse_relation_shared(code);
    return core::shape::holds_on_small_ints(*parsed, ints.data(), n);
}

nb::object relation_holds_on(const nb::str& text, const nb::tuple& symbols, std::uint64_t index_kinds,
                             std::uint64_t no_arg_kinds, nb::handle f_locals, nb::handle f_globals,
                             nb::handle f_closure, nb::handle type_names) {
    const std::string_view code = relation_utf8(text);
    // Every symbol is read before anything is evaluated (reading runs user code); the values stay
    // referenced here until the relation has been evaluated on them.
    const std::size_t n = symbols.size();
    std::array<runtime::Ref, kInlineSymbols> inline_values;
    std::array<core::shape::ValueType, kInlineSymbols> inline_types{};
    std::vector<runtime::Ref> heap_values;
    std::vector<core::shape::ValueType> heap_types;
    runtime::Ref* values = inline_values.data();
    core::shape::ValueType* types = inline_types.data();
    if (n > kInlineSymbols) {
        heap_values.resize(n);
        heap_types.resize(n);
        values = heap_values.data();
        types = heap_types.data();
    }
    StepsScratch steps;
    for (std::size_t k = 0; k < n; ++k) {
        const std::shared_ptr<const SymbolRead> d = symbol_read(
            PyTuple_GET_ITEM(symbols.ptr(), static_cast<Py_ssize_t>(k)), index_kinds, no_arg_kinds);
        runtime::Ref v = read_symbol(*d, steps.steps(), f_locals, f_globals, f_closure);
        if (PyLong_CheckExact(v.get())) {
            types[k] = core::shape::ValueType::Int;
        } else if (PyFloat_CheckExact(v.get())) {
            types[k] = core::shape::ValueType::Float;
        } else {
            return nb::none();  // not a symbol's type: the caller says which, and why
        }
        values[k] = std::move(v);
    }
    const bool holds = translating(code, [&] {
        // Ints that fit int64 (nearly every example): the parse tree evaluated directly, which
        // decides exactly as the compiled program or leaves it to the compiled program.
        const core::shape::SmallTruth small = holds_on_small_ints(code, types, values, n);
        if (small != core::shape::SmallTruth::Undecided) return small == core::shape::SmallTruth::Holds;
        // Compiled into the thread's scratch program (nothing memoised, nothing allocated once
        // warm), decided as a check decides: the fast path, else the exact one. The program is
        // given back before anything below can run Python code.
        const core::shape::ScratchProgram lent = core::shape::compile_relation_scratch(code, types, n);
        const core::shape::ShapeProgram& p = *lent;
        core::shape::ShapeFrame frame(p);
        for (std::uint32_t k = 0; k < n; ++k)
            if (!runtime::store_symbol(frame, k, types[k], values[k].get())) return false;
        const std::int32_t fast = core::shape::run_fast(p, frame);
        return fast == core::shape::kShapePass ||
               (fast == core::shape::kShapeUndecided && core::shape::run_exact(p, frame)[0].holds);
    });
    if (!holds) return nb::none();
    return symbol_type_names(types, n, type_names);
}

// A new instance of `cls` (a class object.__new__ makes: set_shape_builder checked) with `fields`
// (interned name, value) set as object.__setattr__ sets them (what a frozen dataclass's own
// __init__ does), without calling its __init__.
nb::object new_frozen(nb::handle cls, std::initializer_list<std::pair<PyObject*, nb::handle>> fields) {
    nb::object o = new_instance(reinterpret_cast<PyTypeObject*>(cls.ptr()));
    for (const auto& [name, value] : fields) set_field(o, name, value);
    return o;
}

// GuardBuilder.shape's call: relation_holds_on with the builder's settings, then, when it holds,
// the spec GuardSpec(SHAPE, None, (text, symbols, types), index, stack) with the caller's stack;
// None otherwise. The builder took `index` before the call (read and advanced with nothing in
// between that could collect), so a guard declared while this runs (a read's user code, a
// finalizer) takes another one; the spec is made with it, not given it afterwards.
nb::object spec_of_shape(const nb::str& text, const nb::tuple& symbols, nb::handle f_locals,
                         nb::handle f_globals, nb::handle f_closure, const nb::int_& index) {
    const ShapeBuilder* b = g_shape_builder;
    if (b == nullptr) throw std::logic_error("tripwire.builder did not call _set_shape_builder");
    nb::object types = relation_holds_on(text, symbols, b->index_kinds, b->no_arg_kinds, f_locals, f_globals,
                                         f_closure, b->type_names);
    if (types.is_none()) return types;
    PyObject* stack = runtime::user_stack(b->is_machinery.ptr(), b->depth);
    if (stack == nullptr) throw nb::python_error();
    const nb::object site = nb::steal(stack);
    const nb::object args = nb::make_tuple(text, symbols, types);
    static PyObject* s_kind = nullptr;
    static PyObject* s_source = nullptr;
    static PyObject* s_args = nullptr;
    static PyObject* s_index = nullptr;
    static PyObject* s_stack = nullptr;
    // GuardSpec's fields in its __init__'s order (the instance's attribute order).
    return new_frozen(b->spec_type, {{interned(s_kind, "kind"), b->shape_kind},
                                     {interned(s_source, "source"), nb::none()},
                                     {interned(s_args, "args"), args},
                                     {interned(s_index, "index"), index},
                                     {interned(s_stack, "stack"), site}});
}

// -- GuardBuilder.shape without a Python frame --------------------------------------------------
// GuardBuilder.shape is this method (a method descriptor of the class) when tripwire.builder
// installs it (_shape_method): for an exact GuardBuilder and an exact shapes.Relation it does what
// the Python method does (kept as `general`) with no Python frame, reading the instance
// attributes from the objects' own storage (dict_hint.hpp's verified reads, as LOAD_ATTR's
// specialisations do); anything else calls `general`. The Python method's frame and attribute
// loads were about a fifth of a cold build's shape phase.

// An attribute name and the hint of where it was last found (dict_hint.hpp).
struct HintedName {
    PyObject* name = nullptr;
    Py_ssize_t hint = runtime::kHintUnknown;
};

struct ShapeMethod {
    PyTypeObject* builder = nullptr;   // exact tripwire.GuardBuilder (kept for the process)
    PyTypeObject* relation = nullptr;  // exact shapes.Relation
    unsigned int builder_tag = 0;      // the types' version tags when their names were last checked
    unsigned int relation_tag = 0;
    PyObject* general = nullptr;  // the Python GuardBuilder.shape
    HintedName text, symbols, f_locals, f_globals, f_closure, next_index, specs;
    PyMethodDef def{};
    std::string doc;  // def.ml_doc
};
ShapeMethod* g_shape_method = nullptr;

// Whether instances of `tp` read `names` from their own storage as Python does (and, with
// `stores`, assign them there): the type's own attribute access (and assignment), and no data
// descriptor of those names on the class or its bases (_PyType_Lookup reads the MRO's dicts,
// exact str keys: no user code runs). A type's version tag changes with any class attribute
// assignment on it or a base, and is never handed out again, so the answer holds while the tag
// does.
bool plain_instance_attributes(PyTypeObject* tp, bool stores, std::initializer_list<HintedName*> names) {
    if (tp->tp_getattro != PyObject_GenericGetAttr || (stores && tp->tp_setattro != PyObject_GenericSetAttr))
        return false;
    for (const HintedName* n : names) {
        PyObject* attr = _PyType_Lookup(tp, n->name);
        if (attr != nullptr && Py_TYPE(attr)->tp_descr_set != nullptr) return false;
    }
    return tp->tp_version_tag != 0;
}

bool plain_types(ShapeMethod& m) {
    if (m.builder_tag == 0 || m.builder->tp_version_tag != m.builder_tag) {
        m.builder_tag = 0;
        if (!plain_instance_attributes(m.builder, true,
                                       {&m.f_locals, &m.f_globals, &m.f_closure, &m.next_index, &m.specs}))
            return false;
        m.builder_tag = m.builder->tp_version_tag;
    }
    if (m.relation_tag == 0 || m.relation->tp_version_tag != m.relation_tag) {
        m.relation_tag = 0;
        if (!plain_instance_attributes(m.relation, false, {&m.text, &m.symbols})) return false;  // read only
        m.relation_tag = m.relation->tp_version_tag;
    }
    return true;
}

// obj.<name> from obj's own storage (plain_types checked), a new reference; empty when it is not
// found there (the caller then leaves it to Python).
runtime::Ref own_attribute(PyObject* obj, HintedName& n) {
    return runtime::Ref::borrow(runtime::instance_attr_hinted(obj, n.name, &n.hint));
}

// The spec, as spec_of_shape makes it, or None when the relation is to be redone symbol by symbol
// (what the Python method's `except Exception` does: a C++ error here is one the binding would
// have raised as an Exception). Null with a Python error set for anything else (an exception
// outside Exception, such as KeyboardInterrupt).
PyObject* spec_or_none(const runtime::Ref& text, const runtime::Ref& symbols, const runtime::Ref& f_locals,
                       const runtime::Ref& f_globals, const runtime::Ref& f_closure,
                       const runtime::Ref& index) {
    try {
        return spec_of_shape(nb::borrow<nb::str>(text.get()), nb::borrow<nb::tuple>(symbols.get()),
                             f_locals.get(), f_globals.get(), f_closure.get(),
                             nb::borrow<nb::int_>(index.get()))
            .release()
            .ptr();
    } catch (nb::python_error& e) {
        e.restore();
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return nullptr;
        PyErr_Clear();
    } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch): redone below, which says why
    }
    Py_RETURN_NONE;
}

// self._specs.append(spec), read again after the user code the declaration ran.
bool append_spec(ShapeMethod& m, PyObject* self, PyObject* spec) {
    if (plain_types(m)) {
        const runtime::Ref specs = own_attribute(self, m.specs);
        if (specs && PyList_CheckExact(specs.get())) return PyList_Append(specs.get(), spec) == 0;
    }
    const runtime::Ref specs = runtime::Ref::steal(PyObject_GetAttr(self, m.specs.name));
    if (!specs) return false;
    static PyObject* s_append = nullptr;
    const runtime::Ref r =
        runtime::Ref::steal(PyObject_CallMethodOneArg(specs.get(), interned(s_append, "append"), spec));
    return static_cast<bool>(r);
}

// GuardBuilder.shape(self, rel) for an exact builder and relation: `*out` the spec (new
// reference), null with an error set, or left null with 0 returned when this path does not apply
// (nothing done yet: the caller calls the Python method).
int shape_fast(ShapeMethod& m, PyObject* self, PyObject* rel, PyObject** out) {
    *out = nullptr;
    if (!plain_types(m)) return 0;
    const runtime::Ref text = own_attribute(rel, m.text);
    const runtime::Ref symbols = own_attribute(rel, m.symbols);
    const runtime::Ref f_locals = own_attribute(self, m.f_locals);
    const runtime::Ref f_globals = own_attribute(self, m.f_globals);
    const runtime::Ref f_closure = own_attribute(self, m.f_closure);
    const runtime::Ref index = own_attribute(self, m.next_index);
    if (!text || !PyUnicode_CheckExact(text.get()) || !symbols || !PyTuple_CheckExact(symbols.get()) ||
        !f_locals || !f_globals || !f_closure || !index || !PyLong_CheckExact(index.get()))
        return 0;
    // The index first, as the Python method takes it: read and advanced with nothing in between
    // that could collect (an int is not tracked by the collector, and the store replaces a value).
    const Py_ssize_t i = PyLong_AsSsize_t(index.get());
    if (i < 0 || i == PY_SSIZE_T_MAX) {
        PyErr_Clear();
        return 0;
    }
    const runtime::Ref next = runtime::Ref::steal(PyLong_FromSsize_t(i + 1));
    if (!next || PyObject_GenericSetAttr(self, m.next_index.name, next.get()) != 0) return -1;
    runtime::Ref spec =
        runtime::Ref::steal(spec_or_none(text, symbols, f_locals, f_globals, f_closure, index));
    if (!spec) return -1;
    if (spec.get() == Py_None) {  // self._shape_checked(rel, index), as the Python method calls it
        static PyObject* s_checked = nullptr;
        PyObject* call[] = {self, rel, index.get()};
        spec = runtime::Ref::steal(PyObject_VectorcallMethod(interned(s_checked, "_shape_checked"), call,
                                                             3 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr));
        if (!spec) return -1;
    }
    if (!append_spec(m, self, spec.get())) return -1;
    *out = spec.release();
    return 1;
}

// general(self, *args, **kwargs) from a vectorcall of the method.
PyObject* call_general(const ShapeMethod& m, PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                       PyObject* kwnames) {
    const Py_ssize_t n_kw = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
    std::vector<PyObject*> call(static_cast<std::size_t>(1 + nargs + n_kw));
    call[0] = self;
    for (Py_ssize_t k = 0; k < nargs + n_kw; ++k) call[static_cast<std::size_t>(1 + k)] = args[k];
    return PyObject_Vectorcall(m.general, call.data(), static_cast<std::size_t>(1 + nargs), kwnames);
}

// The method (METH_FASTCALL | METH_KEYWORDS): the fast path for shape(rel), else `general`. No C++
// exception leaves it (a C function): the fast path turns spec_of_shape's into a refusal, as the
// Python method's `except Exception` does, and anything else here is an allocation failure.
PyObject* shape_method(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    const ShapeMethod& m = *g_shape_method;
    try {
        if (nargs == 1 && kwnames == nullptr && Py_TYPE(self) == m.builder &&
            Py_TYPE(args[0]) == m.relation) {
            PyObject* spec = nullptr;
            const int r = shape_fast(*g_shape_method, self, args[0], &spec);
            if (r != 0) return spec;
        }
        return call_general(m, self, args, nargs, kwnames);
    } catch (const std::bad_alloc&) {
        return PyErr_NoMemory();
    } catch (const std::exception& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return nullptr;
    }
}

nb::object make_shape_method(nb::handle builder, nb::handle relation, nb::handle general) {
    if (!PyType_Check(builder.ptr()) || !PyType_Check(relation.ptr()) || !PyCallable_Check(general.ptr()))
        throw nb::type_error("needs two classes and a callable");
    runtime::verify_dict_hints();  // the own-storage reads (off when the layout is not verified)
    auto* m = new ShapeMethod();   // NOLINT(cppcoreguidelines-owning-memory): kept for the process (the
                                   // descriptor points at its PyMethodDef)
    m->builder = reinterpret_cast<PyTypeObject*>(builder.inc_ref().ptr());
    m->relation = reinterpret_cast<PyTypeObject*>(relation.inc_ref().ptr());
    m->general = general.inc_ref().ptr();
    for (auto [n, name] : {std::pair{&m->text, "text"},
                           {&m->symbols, "symbols"},
                           {&m->f_locals, "f_locals"},
                           {&m->f_globals, "f_globals"},
                           {&m->f_closure, "f_closure"},
                           {&m->next_index, "_next_index"},
                           {&m->specs, "_specs"}})
        n->name = interned(n->name, name);
    const nb::object doc = nb::getattr(general, "__doc__", nb::none());
    m->doc =
        "shape($self, /, relation)\n--\n\n" + (doc.is_none() ? std::string() : nb::cast<std::string>(doc));
    m->def.ml_name = "shape";
    m->def.ml_meth = reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&shape_method));
    m->def.ml_flags = METH_FASTCALL | METH_KEYWORDS;
    m->def.ml_doc = m->doc.c_str();
    g_shape_method = m;
    return owned(PyDescr_NewMethod(m->builder, &m->def));
}

// Stores `values[k]` as symbol k of a test hook's frame, or raises TypeError naming the first that
// is not of its declared type: a frame's registers are unwritten until stored, so a hook never
// runs a program on a symbol it could not store.
template <typename Values>
void store_symbols_or_raise(core::shape::ShapeFrame& frame, const std::vector<core::shape::ValueType>& types,
                            const Values& values) {
    for (std::uint32_t k = 0; k < types.size(); ++k) {
        if (!runtime::store_symbol(frame, k, types[k], values[k].ptr()))
            throw nb::type_error(("symbol " + std::to_string(k) + " is not of its declared type").c_str());
    }
}

}  // namespace

void register_shape(nb::module_& m) {
    nb::module_ testing = testing_module(m);
    m.def(
        "_set_shape_syntax_error",
        [](nb::handle type) {
            if (!PyType_Check(type.ptr()) ||
                !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(type.ptr()),
                                  reinterpret_cast<PyTypeObject*>(PyExc_ValueError)))
                throw nb::type_error("needs a ValueError subclass");
            Py_XDECREF(g_syntax_error_type);
            g_syntax_error_type = type.ptr();
            Py_INCREF(g_syntax_error_type);  // kept for the life of the process
        },
        nb::arg("type"),
        "The class (a ValueError subclass taking (message, offset)) shape text errors raise.");
    m.def(
        "parse_relation",
        [](const nb::str& str) {
            const std::string_view text = relation_utf8(str);
            return translating(text, [&] {
                const core::shape::ParsedRelation r = core::shape::parse_relation_remembering_code(text);
                // Offsets are code points; in ASCII text (what torch prints) they are the bytes,
                // without a scan from the start per offset.
                bool ascii = true;
                for (const char c : text) ascii = ascii && (static_cast<unsigned char>(c) & 0x80U) == 0;
                const auto at = [&](std::size_t byte) { return ascii ? byte : code_points(text, byte); };
                nb::list spans;
                for (const core::shape::SymbolSpan& s : r.spans)
                    spans.append(nb::make_tuple(at(s.begin), at(s.end), s.symbol));
                nb::list symbols;
                for (std::string_view s : r.symbols) symbols.append(nb::str(s.data(), s.size()));
                return nb::make_tuple(at(r.code_end), spans, symbols);
            });
        },
        nb::arg("text"),
        "(code_end, [(begin, end, symbol)], [symbol texts]): where the relation ends (before a comment), "
        "every symbol occurrence, and the distinct symbol texts in order of first use. Raises the shape "
        "syntax error with the offset of the problem.");
    m.def("relations_of_text", &relations_of_text_of, nb::arg("text"), nb::arg("symbol_memo"),
          nb::arg("relation_class"), nb::arg("source_class"), nb::arg("step_class"),
          "shapes.relations_from_torch's relations of a relation whose symbols are all written in their "
          "printed plain forms: a 1-tuple of its Relation (made by object.__new__(relation_class), fields "
          "text, symbols, comment, original; not _spans, which the class computes on first use), or the "
          "Relation alone when its code may be a top-level "
          "conjunction (' and ' or 'And(' in it: the caller splits it); None for any other relation. Each "
          "symbol's Source is taken from symbol_memo (a dict keyed by its text) or made of source_class and "
          "step_class as source._parse_plain makes them (a positional step is the shared one "
          "_set_plain_relations set, when step_class is its class), and remembered there. Raises the shape "
          "syntax error with the offset of the problem and the text.");
    m.def("_set_plain_relations", &set_plain_relations, nb::arg("symbol_memo"), nb::arg("relation_class"),
          nb::arg("source_class"), nb::arg("step_class"), nb::arg("general"), nb::arg("relations_memo"),
          nb::arg("split"), nb::arg("shared_steps"),
          "What relations_of_part and relations_from_torch pass to relations_of_text (kept for the life of "
          "the process); the general path of a str, general(text, relation or None) -> tuple of relations; "
          "relations_from_torch's memo (a dict) and its path for anything but a str, split(code_part) -> "
          "tuple of relations; the shared steps, {(kind, position): Step}.");
    m.def("relations_of_part", &relations_of_part, nb::arg("text"),
          "relations_from_torch's relations of a str, not memoised: relations_of_text's 1-tuple with the "
          "arguments _set_plain_relations set, else general(text, what it gave). Raises the shape syntax "
          "error with the offset of the problem and the text.");
    m.def("relations_from_torch", &relations_from_torch, nb::arg("code_part"),
          "The relations of one code part of torch's shape guard, a new list.\n\n"
          "Accepts what torch 2.13 prints in its shape-environment code parts, verbose or not: a "
          "relation, optionally followed by the ``# ...`` comment torch appends (the user's source "
          "line, or why the guard exists). A top-level conjunction (``2 <= s and s <= 1024``, how the "
          "non-verbose form prints a range) becomes one relation per conjunct, so a failure names the "
          "conjunct that is false; a chained comparison (``2 <= s <= 1024``) stays one relation. Every "
          "relation keeps the part's comment. Raises ShapeSyntaxError for text tripwire cannot use.\n\n"
          "The relations of an exact str are memoised (the memo that _set_plain_relations set; errors are "
          "not); anything else takes the split path it set.");
    m.def(
        "evaluate_relation",
        [](const std::string& text, const std::vector<int>& types, nb::list values, bool both_paths) {
            return translating(text, [&] {
                if (values.size() != types.size()) throw nb::value_error("one value per symbol");
                const std::shared_ptr<const core::shape::ShapeProgram> memo =
                    core::shape::compile_relation_shared(text, value_types(types));
                const core::shape::ShapeProgram& p = *memo;
                core::shape::ShapeFrame frame(p);
                store_symbols_or_raise(frame, p.symbol_types, values);
                const std::int32_t fast = core::shape::run_fast(p, frame);
                if (fast == core::shape::kShapePass && !both_paths)
                    return nb::make_tuple(true, nb::none(), "fast");
                const std::vector<core::shape::ExactResult> exact = core::shape::run_exact(p, frame);
                nb::object error = exact[0].error.empty() ? nb::none() : nb::cast(exact[0].error);
                const char* path = fast == core::shape::kShapeUndecided ? "exact" : "fast";
                // The two paths must agree whenever the fast one decides.
                if (fast != core::shape::kShapeUndecided &&
                    (fast == core::shape::kShapePass) != exact[0].holds)
                    throw std::logic_error("shape fast path disagrees with the exact path on " + text);
                return nb::make_tuple(exact[0].holds, error, path);
            });
        },
        nb::arg("text"), nb::arg("types"), nb::arg("values"), nb::arg("both_paths") = true,
        "(holds, error or None, 'fast' or 'exact'): one relation on values for its symbols in order of first "
        "use (types: 0 int, 1 float), as a check evaluates it. The compiled relation is memoised by (text, "
        "types). both_paths: also run the exact path when the fast one decides, and raise if they disagree "
        "(the reference tests); without it a fast pass returns at once.");
    m.def("_set_shape_builder", &set_shape_builder, nb::arg("source"), nb::arg("step"), nb::arg("spec"),
          nb::arg("shape_kind"), nb::arg("index_kinds"), nb::arg("no_arg_kinds"), nb::arg("type_names"),
          nb::arg("is_machinery"), nb::arg("depth"),
          "Set once by tripwire.builder: the exact classes Source and Step (relation_holds_on decodes a "
          "symbol of these classes once and memoises it) and what spec_of_shape uses: the GuardSpec class, "
          "GuardKind.SHAPE, the step masks, the type-name memo, the machinery test and the stack depth.");
    m.def(
        "spec_of_shape", &spec_of_shape, nb::arg("text"), nb::arg("symbols"), nb::arg("f_locals"),
        nb::arg("f_globals").none(), nb::arg("f_closure").none(), nb::arg("index"),
        "GuardBuilder.shape's one call: relation_holds_on with the builder's settings (_set_shape_builder); "
        "when the relation holds, a new GuardSpec(SHAPE, None, (text, symbols, types), index, stack) with "
        "the caller's stack outside tripwire (its fields set as object.__setattr__ sets them), else None. "
        "Raises what relation_holds_on or the stack walk raised.");
    m.def(
        "_shape_method", &make_shape_method, nb::arg("builder"), nb::arg("relation"), nb::arg("general"),
        "GuardBuilder.shape as a method descriptor of `builder` (set once by tripwire.builder): for an exact "
        "`builder` instance and an exact `relation` instance (shapes.Relation) it does what the Python "
        "method `general` does without a Python frame: takes the index, makes the spec with spec_of_shape "
        "(or, when that gives None or raises an Exception, self._shape_checked(relation, index)) and appends "
        "it to self._specs. Anything else (a subclass, a text, keywords, attributes it cannot read from "
        "the instances' own storage) calls general(self, ...).");
    m.def("relation_holds_on", &relation_holds_on, nb::arg("text"), nb::arg("symbols"),
          nb::arg("index_kinds"), nb::arg("no_arg_kinds"), nb::arg("f_locals"), nb::arg("f_globals").none(),
          nb::arg("f_closure").none(), nb::arg("type_names"),
          "GuardBuilder.shape's one call: read each symbol (a Source: root, name, steps of kind and arg; "
          "bit k of index_kinds / no_arg_kinds set when StepKind k takes a position / no argument) from "
          "the example, in order of first use, and evaluate the relation on the values as a check does "
          "(compiled into a per-thread scratch program, nothing memoised but each symbol's decoding). "
          "The symbols' type names ('int', 'float') when it holds, one tuple per combination: "
          "type_names[(1 << n) | sum(code_k << k)] (codes 0 int, 1 float), made and remembered there "
          "when missing (the dict is emptied at 4096 entries); None when it does not hold or a value "
          "is neither an exact int nor an exact float (the builder then redoes the work symbol by symbol "
          "to say why). Raises what a read raised, or the shape syntax error of a type error.");
    m.def(
        "_clear_shape_memos",
        [] {
            core::shape::clear_shape_memos();
            clear_symbol_reads();
            clear_symbol_keys();  // relations_of_text's symbol strs (it also empties them with its memo)
        },
        "Empty the engine's memos of parsed and compiled relations, relation_holds_on's decoded "
        "symbols and relations_of_text's symbol texts (cold-build benchmarks).");
    testing.def(
        "shape_time",
        [](const std::vector<std::string>& texts, nb::dict values, long iterations) {
            // Symbols are numbered across the relations by their text; values by the same text.
            std::map<std::string, std::uint32_t> index;
            std::vector<core::shape::ValueType> types;
            std::vector<nb::handle> vals;
            std::vector<core::shape::RelationInput> inputs;
            for (std::uint32_t k = 0; k < texts.size(); ++k) {
                const core::shape::ParsedRelation r =
                    translating(texts[k], [&] { return core::shape::parse_relation(texts[k]); });
                core::shape::RelationInput in;
                in.id = k;
                in.text = texts[k];
                for (std::string_view s : r.symbols) {
                    auto [it, fresh] =
                        index.emplace(std::string(s), static_cast<std::uint32_t>(types.size()));
                    if (fresh) {
                        nb::handle v = values[nb::str(s.data(), s.size())];
                        types.push_back(PyFloat_CheckExact(v.ptr()) ? core::shape::ValueType::Float
                                                                    : core::shape::ValueType::Int);
                        vals.push_back(v);
                    }
                    in.symbols.push_back(it->second);
                }
                inputs.push_back(std::move(in));
            }
            const core::shape::ShapeProgram p = translating(texts.empty() ? std::string() : texts[0], [&] {
                return core::shape::compile_relations(inputs, types);
            });
            // Refused before the timed loop, which does not look at what its stores return.
            {
                core::shape::ShapeFrame probe(p);
                store_symbols_or_raise(probe, types, vals);
            }
            // What a check does once its symbols are read: a frame, the stores, the relations.
            std::int32_t result = 0;
            const auto t0 = std::chrono::steady_clock::now();
            for (long i = 0; i < iterations; ++i) {
                core::shape::ShapeFrame frame(p);
                for (std::uint32_t s = 0; s < vals.size(); ++s)
                    runtime::store_symbol(frame, s, types[s], vals[s].ptr());
                result = core::shape::first_failing(p, frame);
            }
            const auto t1 = std::chrono::steady_clock::now();
            const double ns =
                std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(iterations);
            std::size_t ops = 0;
            for (const core::shape::ShapeInstr& in : p.code) ops += in.code != core::shape::Code::Check;
            return nb::make_tuple(ns, result, p.kept.size(), types.size(), ops);
        },
        nb::arg("relations"), nb::arg("values"), nb::arg("iterations"),
        "Benchmark hook: (ns per evaluation, first failing relation or -1, kept relations, symbols, "
        "operations) for relations over symbols whose values are given by printed source: the frame, the "
        "symbol stores and the relations, in a C++ loop (no Python call per iteration).");
}

}  // namespace tripwire::bindings

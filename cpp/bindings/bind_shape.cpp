// tripwire/cpp/bindings/bind_shape.cpp -- the shape-relation parser and evaluator, for the builder.
//
// The builder parses a relation through the core (to find its symbols and give errors with
// offsets) and checks it on the example before declaring it. Offsets cross into Python as
// code-point indices into the str (the core counts UTF-8 bytes).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/shape/parser.hpp"
#include "core/shape/program.hpp"
#include "register.hpp"
#include "runtime/eval/shape_symbols.hpp"

namespace nb = nanobind;

namespace tripwire::bindings {
namespace {

// The code-point index of byte offset `byte` in UTF-8 `text`.
std::size_t code_points(std::string_view text, std::size_t byte) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < byte && i < text.size(); ++i)
        if ((static_cast<unsigned char>(text[i]) & 0xC0U) != 0x80U) ++n;
    return n;
}

// tripwire.ShapeSyntaxError, looked up in its module when an error is raised (a cold path): no
// Python object is kept in C++ between calls, so nothing here outlives the interpreter (or the
// subinterpreter) whose class it is. Found in sys.modules only (no import runs): the module is
// there whenever the package is. A new reference, or null with no error set when the module is
// gone (teardown) or its attribute is not a ValueError subclass.
PyObject* syntax_error_type() {
    PyObject* name = PyUnicode_FromString("tripwire.errors");
    PyObject* errors = name != nullptr ? PyImport_GetModule(name) : nullptr;
    Py_XDECREF(name);
    PyObject* type = errors != nullptr ? PyObject_GetAttrString(errors, "ShapeSyntaxError") : nullptr;
    Py_XDECREF(errors);
    if (type != nullptr && PyType_Check(type) &&
        PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(type),
                         reinterpret_cast<PyTypeObject*>(PyExc_ValueError)))
        return type;
    Py_XDECREF(type);
    PyErr_Clear();
    return nullptr;
}

// Raise the shape syntax error (message, offset), or (message, offset, text) when `text` is given;
// a ValueError saying the same when the class is not there.
[[noreturn]] void raise_syntax_error(const std::string& message, std::size_t offset,
                                     PyObject* text = nullptr) {
    const auto at = static_cast<Py_ssize_t>(offset);
    PyObject* type = syntax_error_type();
    if (type == nullptr) {
        PyErr_Format(PyExc_ValueError, "%s (at offset %zd)", message.c_str(), at);
        throw nb::python_error();
    }
    PyObject* exc = text != nullptr ? PyObject_CallFunction(type, "snO", message.c_str(), at, text)
                                    : PyObject_CallFunction(type, "sn", message.c_str(), at);
    if (exc != nullptr) {
        PyErr_SetObject(type, exc);
        Py_DECREF(exc);
    }
    Py_DECREF(type);
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
        "parse_relation",
        [](const nb::str& str) {
            const std::string_view text = relation_utf8(str);
            return translating(text, [&] {
                const core::shape::ParsedRelation r = core::shape::parse_relation(text);
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

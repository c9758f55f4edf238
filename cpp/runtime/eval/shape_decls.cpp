// tripwire/cpp/runtime/eval/shape_decls.cpp -- a set's SHAPE relations declared from the specs' objects.
#include "runtime/eval/shape_decls.hpp"

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <utility>

namespace tripwire::runtime {
namespace {

/// The items of an exact tuple or list (a spec made by hand may hold a list), borrowed; false
/// with a TypeError saying `what` otherwise.
bool exact_sequence(PyObject* o, const char* what, PyObject* const** items, Py_ssize_t* n) {
    if (PyTuple_CheckExact(o)) {
        *items = &PyTuple_GET_ITEM(o, 0);
        *n = PyTuple_GET_SIZE(o);
        return true;
    }
    if (PyList_CheckExact(o)) {
        *items = reinterpret_cast<PyListObject*>(o)->ob_item;
        *n = PyList_GET_SIZE(o);
        return true;
    }
    PyErr_SetString(PyExc_TypeError, what);
    return false;
}

/// A SHAPE symbol's type code from its name in a spec ("int" 0, "float" 1: shape::ValueType), or
/// -1 with a ValueError.
int symbol_type_code(PyObject* name) {
    // The builder's names are the interned "int" and "float" (bind_shape.cpp, symbol_type_names):
    // found by address, compared by value only otherwise. Made once, never freed (as the module's
    // own names).
    static PyObject* s_int = nullptr;
    static PyObject* s_float = nullptr;
    if (s_int == nullptr && (s_int = PyUnicode_InternFromString("int")) == nullptr) return -1;
    if (s_float == nullptr && (s_float = PyUnicode_InternFromString("float")) == nullptr) return -1;
    if (name == s_int) return 0;
    if (name == s_float) return 1;
    if (PyUnicode_CheckExact(name)) {
        if (PyUnicode_CompareWithASCIIString(name, "int") == 0) return 0;
        if (PyUnicode_CompareWithASCIIString(name, "float") == 0) return 1;
    }
    PyErr_SetString(PyExc_ValueError, "a SHAPE symbol's type is 'int' or 'float'");
    return -1;
}

/// An exact list, or false with a TypeError naming `what`.
bool exact_list(PyObject* o, const char* what) {
    if (PyList_CheckExact(o)) return true;
    PyErr_Format(PyExc_TypeError, "%s: expected a list, not %.200s", what, Py_TYPE(o)->tp_name);
    return false;
}

}  // namespace

bool add_shape_decls(std::vector<core::GuardDecl>& decls, PyObject* at, PyObject* ids, PyObject* args,
                     PyObject* symbols, const std::vector<core::SharedPath>& shared) {
    if (!exact_list(at, "SHAPE positions") || !exact_list(ids, "SHAPE ids") ||
        !exact_list(args, "SHAPE argument tuples") || !exact_list(symbols, "SHAPE symbols"))
        return false;
    const auto n = static_cast<std::size_t>(PyList_GET_SIZE(args));
    const auto n_symbols = static_cast<std::size_t>(PyList_GET_SIZE(symbols));
    if (static_cast<std::size_t>(PyList_GET_SIZE(at)) != n ||
        static_cast<std::size_t>(PyList_GET_SIZE(ids)) != n || n_symbols != shared.size()) {
        PyErr_SetString(PyExc_ValueError, "SHAPE declarations: mismatched lengths");
        return false;
    }
    for (const core::SharedPath& path : shared) {
        if (path == nullptr) {
            PyErr_SetString(PyExc_ValueError, "SHAPE declarations: a symbol without its source");
            return false;
        }
    }
    // Each relation's symbols by identity: a scan of the set's few symbols (borrowed from the
    // caller's list, in its order), a hash map when there are many.
    constexpr std::size_t kScanned = 16;
    PyObject* const* const symbol_items = reinterpret_cast<PyListObject*>(symbols)->ob_item;
    std::unordered_map<PyObject*, std::uint32_t> symbol_index;
    if (n_symbols > kScanned) {
        symbol_index.reserve(n_symbols);
        for (std::size_t k = 0; k < n_symbols; ++k)
            symbol_index.emplace(symbol_items[k], static_cast<std::uint32_t>(k));
    }
    const auto shared_of = [&](PyObject* sym) -> const core::SharedPath* {
        if (n_symbols > kScanned) {
            const auto it = symbol_index.find(sym);
            if (it != symbol_index.end()) return &shared[it->second];
        } else {
            for (std::size_t k = 0; k < n_symbols; ++k)
                if (symbol_items[k] == sym) return &shared[k];
        }
        PyErr_SetString(PyExc_ValueError, "SHAPE declarations: a symbol without its source");
        return nullptr;
    };
    // Built aside and moved in at the end: `decls` is unchanged when anything is refused.
    std::vector<core::GuardDecl> merged;
    merged.reserve(decls.size() + n);
    std::vector<core::GuardDecl> relations(n);
    std::vector<std::size_t> where(n);
    std::size_t last = 0;
    for (std::size_t r = 0; r < n; ++r) {
        PyObject* pos = PyList_GET_ITEM(at, static_cast<Py_ssize_t>(r));
        PyObject* id = PyList_GET_ITEM(ids, static_cast<Py_ssize_t>(r));
        PyObject* a = PyList_GET_ITEM(args, static_cast<Py_ssize_t>(r));
        if (!PyLong_CheckExact(pos) || !PyLong_CheckExact(id)) {
            PyErr_SetString(PyExc_TypeError, "a SHAPE guard's index is an int");
            return false;
        }
        const std::size_t w = PyLong_AsSize_t(pos);
        const unsigned long gid = PyLong_AsUnsignedLong(id);
        if (PyErr_Occurred() || gid > 0xFFFFFFFFul || w < last || w > decls.size()) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "SHAPE declarations: a bad index or position");
            return false;
        }
        last = where[r] = w;
        if (!PyTuple_CheckExact(a) || PyTuple_GET_SIZE(a) != 3 ||
            !PyUnicode_CheckExact(PyTuple_GET_ITEM(a, 0))) {
            PyErr_SetString(PyExc_TypeError, "SHAPE takes (relation text, symbols, symbol types)");
            return false;
        }
        Py_ssize_t text_len = 0;
        const char* text = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(a, 0), &text_len);
        if (text == nullptr) return false;
        PyObject* const* syms = nullptr;
        PyObject* const* types = nullptr;
        Py_ssize_t n_syms = 0;
        Py_ssize_t n_types = 0;
        if (!exact_sequence(PyTuple_GET_ITEM(a, 1), "SHAPE symbols are a tuple of sources", &syms, &n_syms) ||
            !exact_sequence(PyTuple_GET_ITEM(a, 2), "SHAPE symbol types are a tuple of 'int'/'float'", &types,
                            &n_types))
            return false;
        core::GuardDecl& d = relations[r];
        d.kind = core::GuardKind::Shape;
        d.has_source = false;
        d.id = static_cast<std::uint32_t>(gid);
        d.relation.assign(text, static_cast<std::size_t>(text_len));
        d.symbols.reserve(static_cast<std::size_t>(n_syms));
        for (Py_ssize_t k = 0; k < n_syms; ++k) {
            const core::SharedPath* p = shared_of(syms[k]);
            if (p == nullptr) return false;
            d.symbols.push_back(*p);
        }
        d.symbol_types.reserve(static_cast<std::size_t>(n_types));
        for (Py_ssize_t k = 0; k < n_types; ++k) {
            const int code = symbol_type_code(types[k]);
            if (code < 0) return false;
            d.symbol_types.push_back(static_cast<std::uint8_t>(code));
        }
    }
    std::size_t next = 0;  // the next of `decls` to move into `merged`
    for (std::size_t r = 0; r < n; ++r) {
        while (next < where[r]) merged.push_back(std::move(decls[next++]));
        merged.push_back(std::move(relations[r]));
    }
    while (next < decls.size()) merged.push_back(std::move(decls[next++]));
    decls = std::move(merged);
    return true;
}

}  // namespace tripwire::runtime

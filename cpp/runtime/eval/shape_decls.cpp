// tripwire/cpp/runtime/eval/shape_decls.cpp -- a set's SHAPE relations declared from the specs' objects.
#include "runtime/eval/shape_decls.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
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

/// The symbols of SHAPE argument tuple `a`, which must be an exact 3-tuple.
bool shape_symbols_of(PyObject* a, PyObject* const** items, Py_ssize_t* n) {
    if (!PyTuple_CheckExact(a) || PyTuple_GET_SIZE(a) != 3) {
        PyErr_SetString(PyExc_TypeError, "SHAPE takes (relation text, symbols, symbol types)");
        return false;
    }
    return exact_sequence(PyTuple_GET_ITEM(a, 1), "SHAPE symbols are a tuple of sources", items, n);
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

PyObject* distinct_shape_symbols(PyObject* args, PyObject* source_type) {
    if (!exact_list(args, "SHAPE argument tuples")) return nullptr;
    std::vector<PyObject*> seen;
    seen.reserve(16);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(args); ++i) {
        PyObject* const* items = nullptr;
        Py_ssize_t n = 0;
        if (!shape_symbols_of(PyList_GET_ITEM(args, i), &items, &n)) return nullptr;
        for (Py_ssize_t k = 0; k < n; ++k) {
            if (source_type != nullptr && Py_TYPE(items[k]) != reinterpret_cast<PyTypeObject*>(source_type))
                return Py_NewRef(Py_None);
            if (std::find(seen.begin(), seen.end(), items[k]) == seen.end()) seen.push_back(items[k]);
        }
    }
    // Nothing above ran Python code: the borrowed symbols are still the list's.
    PyObject* out = PyList_New(static_cast<Py_ssize_t>(seen.size()));
    if (out == nullptr) return nullptr;
    for (std::size_t k = 0; k < seen.size(); ++k)
        PyList_SET_ITEM(out, static_cast<Py_ssize_t>(k), Py_NewRef(seen[k]));
    return out;
}

PyObject* shape_specs(PyObject* specs, PyObject* spec_type, PyObject* shape_kind) {
    if (!exact_list(specs, "specs")) return nullptr;
    // Field names made once (never freed, as the module's own names).
    static PyObject* s_kind = nullptr;
    static PyObject* s_args = nullptr;
    static PyObject* s_index = nullptr;
    if (s_kind == nullptr && (s_kind = PyUnicode_InternFromString("kind")) == nullptr) return nullptr;
    if (s_args == nullptr && (s_args = PyUnicode_InternFromString("args")) == nullptr) return nullptr;
    if (s_index == nullptr && (s_index = PyUnicode_InternFromString("index")) == nullptr) return nullptr;
    Ref ids = Ref::steal(PyList_New(0));
    Ref args = Ref::steal(PyList_New(0));
    if (!ids || !args) return nullptr;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(specs); ++i) {
        // Held: reading a field of an exact spec_type runs no user code, but the list is the
        // caller's and the references below are new.
        Ref spec = Ref::borrow(PyList_GET_ITEM(specs, i));
        if (Py_TYPE(spec.get()) != reinterpret_cast<PyTypeObject*>(spec_type)) return Py_NewRef(Py_None);
        Ref kind = Ref::steal(PyObject_GetAttr(spec.get(), s_kind));
        if (!kind) return nullptr;
        if (kind.get() != shape_kind) return Py_NewRef(Py_None);
        Ref a = Ref::steal(PyObject_GetAttr(spec.get(), s_args));
        if (!a) return nullptr;
        Ref index = Ref::steal(PyObject_GetAttr(spec.get(), s_index));
        if (!index) return nullptr;
        if (!PyTuple_CheckExact(a.get()) || PyTuple_GET_SIZE(a.get()) != 3 || !PyLong_CheckExact(index.get()))
            return Py_NewRef(Py_None);
        if (PyList_Append(ids.get(), index.get()) < 0 || PyList_Append(args.get(), a.get()) < 0)
            return nullptr;
    }
    return PyTuple_Pack(2, ids.get(), args.get());
}

bool symbol_paths(const std::vector<const core::SourcePath*>& templates, PyObject* remaps,
                  std::vector<core::SharedPath>& out) {
    if (!exact_list(remaps, "SHAPE symbol constant ids")) return false;
    if (static_cast<std::size_t>(PyList_GET_SIZE(remaps)) != templates.size()) {
        PyErr_SetString(PyExc_ValueError, "SHAPE declarations: mismatched lengths");
        return false;
    }
    std::vector<core::SharedPath> made(templates.size());
    for (std::size_t k = 0; k < templates.size(); ++k) {
        auto p = std::make_shared<core::SourcePath>(*templates[k]);
        PyObject* remap = PyList_GET_ITEM(remaps, static_cast<Py_ssize_t>(k));
        if (remap != Py_None) {
            if (!PyList_CheckExact(remap)) {
                PyErr_SetString(PyExc_TypeError, "a SHAPE symbol's constant ids are a list");
                return false;
            }
            // Only exact ints are read (no __index__ runs): an id past the list or the pool's
            // range is refused, never taken modulo.
            const auto resolve = [remap](core::ConstId& id) {
                if (id >= static_cast<std::size_t>(PyList_GET_SIZE(remap))) {
                    PyErr_SetString(PyExc_ValueError, "SHAPE declarations: a constant id out of range");
                    return false;
                }
                PyObject* v = PyList_GET_ITEM(remap, static_cast<Py_ssize_t>(id));
                const unsigned long u = PyLong_CheckExact(v) ? PyLong_AsUnsignedLong(v) : 0xFFFFFFFFul;
                if (u >= core::kNoConst) {
                    PyErr_Clear();
                    PyErr_SetString(PyExc_ValueError, "SHAPE declarations: a bad constant id");
                    return false;
                }
                id = static_cast<core::ConstId>(u);
                return true;
            };
            if (!resolve(p->name)) return false;
            for (core::Step& st : p->steps) {
                if (st.operand != core::kNoConst && !resolve(st.operand)) return false;
            }
        }
        made[k] = std::move(p);
    }
    out = std::move(made);
    return true;
}

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

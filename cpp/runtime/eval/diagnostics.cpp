// tripwire/cpp/runtime/eval/diagnostics.cpp -- what GuardSet's diagnostics ask of a built set.
#include "runtime/eval/diagnostics.hpp"

#include <initializer_list>
#include <unordered_map>
#include <utility>

#include "runtime/tensors/property_reader.hpp"

namespace tripwire::runtime {
namespace {

/// An interned str made once (the GIL is held; never freed, as the module's own names), or null
/// with the error set.
PyObject* interned_name(PyObject*& slot, const char* text) {
    if (slot == nullptr) slot = PyUnicode_InternFromString(text);
    return slot;
}

/// `module.attrs...` when `module` is imported (sys.modules: nothing is imported here) and has
/// them, else Py_None; null with the error set on any other failure. New reference.
Ref imported_attr(PyObject* module, std::initializer_list<PyObject*> attrs) {
    Ref o = Ref::steal(PyImport_GetModule(module));
    if (!o) return PyErr_Occurred() ? Ref() : Ref::borrow(Py_None);
    for (PyObject* a : attrs) {
        Ref next = Ref::steal(PyObject_GetAttr(o.get(), a));
        if (!next) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return Ref();
            PyErr_Clear();
            return Ref::borrow(Py_None);
        }
        o = std::move(next);
    }
    return o;
}

/// issubclass(t, base), 0 when base is None; -1 with the error set.
int derives(PyObject* t, PyObject* base) { return base == Py_None ? 0 : PyObject_IsSubclass(t, base); }

}  // namespace

std::int64_t guard_position(const GuardSet& gs, std::uint32_t id) {
    const auto& guards = gs.program().guards;
    for (std::size_t gi = 0; gi < guards.size(); ++gi) {
        if (guards[gi].id == id) return static_cast<std::int64_t>(gi);
    }
    return -1;
}

bool field_mismatches(const RuntimeGuard& g, PyObject* value, std::vector<FieldMismatch>& out) {
    if (g.kind == core::GuardKind::TensorMatch) return tensor_mismatches(g, value, out);
    if (g.kind == core::GuardKind::ArrayMatch) return array_mismatches(g, value, out);
    PyErr_SetString(PyExc_ValueError, "not a TENSOR_MATCH or ARRAY_MATCH guard");
    return false;
}

PyObject* symbol_reader_facts(const GuardSet& gs, PyObject* f_locals, PyObject* f_globals) {
    const core::Program& p = gs.program();
    PyObject* globals = PyDict_Check(f_globals) ? f_globals : nullptr;
    static PyObject* s_numpy = nullptr;
    static PyObject* s_ndarray = nullptr;
    static PyObject* s_torch = nullptr;
    static PyObject* s_c = nullptr;
    static PyObject* s_tensor_base = nullptr;
    static PyObject* s_frame = nullptr;
    static PyObject* s_property = nullptr;
    static PyObject* s_unreadable = nullptr;
    // The facts' tags, made once: a str per fact per build was a tenth of this call.
    PyObject* const frame_tag = interned_name(s_frame, "frame");
    PyObject* const property_tag = interned_name(s_property, "property");
    PyObject* const unreadable_tag = interned_name(s_unreadable, "unreadable");
    if (interned_name(s_numpy, "numpy") == nullptr || interned_name(s_ndarray, "ndarray") == nullptr ||
        interned_name(s_torch, "torch") == nullptr || interned_name(s_c, "_C") == nullptr ||
        interned_name(s_tensor_base, "TensorBase") == nullptr || frame_tag == nullptr ||
        property_tag == nullptr || unreadable_tag == nullptr)
        return nullptr;
    const Ref ndarray = imported_attr(s_numpy, {s_ndarray});
    if (!ndarray) return nullptr;
    const Ref tensor_base = imported_attr(s_torch, {s_c, s_tensor_base});
    if (!tensor_base) return nullptr;
    struct Parent {
        Ref value;
        PyObject* type = nullptr;  // borrowed from `value`, which holds its type
        bool is_array = false, is_tensor = false;
    };
    std::unordered_map<std::uint32_t, Parent> parents;  // by node: each tensor read once
    // The symbols' tensors are nearly always of one type: the answers for the type asked last
    // are reused (`last_type` holds it, so its address names that type).
    Ref last_type;
    bool last_is_array = false;
    bool last_is_tensor = false;
    Ref out = Ref::steal(PyList_New(0));
    if (!out) return nullptr;
    const auto append = [&out](const Ref& item) { return item && PyList_Append(out.get(), item.get()) == 0; };
    for (const std::uint32_t ni : p.symbol_nodes) {
        const core::Node& n = p.nodes[ni];
        Ref text =
            Ref::steal(PyUnicode_FromStringAndSize(n.text.data(), static_cast<Py_ssize_t>(n.text.size())));
        if (!text) return nullptr;
        const core::StepKind kind = n.step.kind;
        if (n.is_root || (kind != core::StepKind::Size && kind != core::StepKind::Stride &&
                          kind != core::StepKind::StorageOffset)) {
            Ref fact = Ref::steal(PyTuple_Pack(1, frame_tag));
            if (!fact || !append(Ref::steal(PyTuple_Pack(2, text.get(), fact.get())))) return nullptr;
            continue;
        }
        auto it = parents.find(n.parent);
        if (it == parents.end()) {
            Ref v = gs.read_node(n.parent, f_locals, globals);
            if (!v) {
                // The frame has no such value (or a step raised): said, as `type(e).__name__`.
                if (!PyErr_ExceptionMatches(PyExc_Exception)) return nullptr;
                // The type is held before the error is cleared (the exception held it).
                const Ref type = Ref::borrow(PyErr_Occurred());
                PyErr_Clear();
                Ref name = Ref::steal(PyType_GetName(reinterpret_cast<PyTypeObject*>(type.get())));
                if (!name) return nullptr;
                Ref fact = Ref::steal(PyTuple_Pack(2, unreadable_tag, name.get()));
                if (!fact || !append(Ref::steal(PyTuple_Pack(2, text.get(), fact.get())))) return nullptr;
                continue;
            }
            Parent parent;
            parent.type = reinterpret_cast<PyObject*>(Py_TYPE(v.get()));
            parent.value = std::move(v);
            if (parent.type != last_type.get()) {
                const int is_array = derives(parent.type, ndarray.get());
                if (is_array < 0) return nullptr;
                const int is_tensor = derives(parent.type, tensor_base.get());
                if (is_tensor < 0) return nullptr;
                last_type = Ref::borrow(parent.type);
                last_is_array = is_array == 1;
                last_is_tensor = is_tensor == 1;
            }
            parent.is_array = last_is_array;
            parent.is_tensor = last_is_tensor;
            it = parents.emplace(n.parent, std::move(parent)).first;
        }
        const Parent& parent = it->second;
        std::int64_t value = 0;
        const std::int64_t index = kind == core::StepKind::StorageOffset ? 0 : n.step.index;
        const bool answered =
            read_tensor_property(parent.value.get(), kind, index, &value) != PropertyRead::Unknown;
        if (PyErr_Occurred()) return nullptr;
        Ref fact = Ref::steal(
            Py_BuildValue("(OOOOO)", property_tag, parent.type, answered ? Py_True : Py_False,
                          parent.is_array ? Py_True : Py_False, parent.is_tensor ? Py_True : Py_False));
        if (!fact || !append(Ref::steal(PyTuple_Pack(2, text.get(), fact.get())))) return nullptr;
    }
    return out.release();
}

}  // namespace tripwire::runtime

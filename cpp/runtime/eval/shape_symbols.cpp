// tripwire/cpp/runtime/eval/shape_symbols.cpp -- SHAPE symbols (see the header).
#include "runtime/eval/shape_symbols.hpp"

#include <vector>

namespace tripwire::runtime {
namespace {

using core::shape::ValueType;

thread_local ShapeScope* t_current = nullptr;

// An int beyond int64, converted in place (two's complement bytes, no Python object).
bool store_big(core::shape::ShapeFrame& f, std::uint32_t sym, PyObject* v) {
    const std::size_t bits = _PyLong_NumBits(v);
    if (bits == static_cast<std::size_t>(-1)) {
        PyErr_Clear();
        f.set_too_big(sym);
        return true;
    }
    if (bits > core::shape::kMaxIntBits) {
        f.set_too_big(sym);  // the relations reading it fail with "over 65536 bits"
        return true;
    }
    std::vector<unsigned char> bytes(bits / 8 + 1);
#if PY_VERSION_HEX >= 0x030D0000
    const Py_ssize_t need = PyLong_AsNativeBytes(v, bytes.data(), static_cast<Py_ssize_t>(bytes.size()),
                                                 Py_ASNATIVEBYTES_LITTLE_ENDIAN);
    if (need < 0 || static_cast<std::size_t>(need) > bytes.size()) {
        PyErr_Clear();
        f.set_too_big(sym);
        return true;
    }
#else
    if (_PyLong_AsByteArray(reinterpret_cast<PyLongObject*>(v), bytes.data(), bytes.size(), 1, 1) < 0) {
        PyErr_Clear();
        f.set_too_big(sym);
        return true;
    }
#endif
    f.set_big(sym, core::shape::BigInt::from_signed_le_bytes(bytes.data(), bytes.size()));
    return true;
}

// repr() of a symbol's value for a reason: short, and never raising (a huge int's repr exceeds
// the interpreter's digit limit; a wrong-typed value's repr is user code).
std::string short_value(PyObject* v) {
    if (v == nullptr) return "<not read>";
    PyObject* r = PyObject_Repr(v);
    if (r == nullptr) {
        PyErr_Clear();
        if (PyLong_Check(v)) {
            const std::size_t bits = _PyLong_NumBits(v);
            PyErr_Clear();
            return "<int of " + std::to_string(bits) + " bits>";
        }
        return std::string("<") + Py_TYPE(v)->tp_name + " object>";
    }
    const char* c = PyUnicode_AsUTF8(r);
    std::string out = c != nullptr ? c : "?";
    if (c == nullptr) PyErr_Clear();
    Py_DECREF(r);
    if (out.size() > 60) out = out.substr(0, 28) + "..." + out.substr(out.size() - 28);
    return out;
}

}  // namespace

ShapeScope::ShapeScope(core::shape::ShapeFrame* f, std::vector<Ref>* vals)
    : frame(f), values(vals), prev_(t_current) {
    t_current = this;
}

ShapeScope::~ShapeScope() { t_current = prev_; }

ShapeScope* ShapeScope::current() { return t_current; }

bool store_symbol(core::shape::ShapeFrame& f, std::uint32_t sym, ValueType type, PyObject* v) {
    if (type == ValueType::Float) {
        if (!PyFloat_CheckExact(v)) return false;
        f.set_float(sym, PyFloat_AS_DOUBLE(v));
        return true;
    }
    if (!PyLong_CheckExact(v)) return false;  // bool, numpy ints, int subclasses: not the example's type
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow == 0) {
        if (x == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return false;
        }
        f.set_int(sym, x);
        return true;
    }
    return store_big(f, sym, v);
}

std::string symbol_type_error(const std::string& source, ValueType type, PyObject* v) {
    const char* want = type == ValueType::Float ? "float" : "int";
    return source + " has type " + (v != nullptr ? std::string(Py_TYPE(v)->tp_name) : std::string("?")) +
           ", not " + want + " (a shape symbol keeps the exact type of its example)";
}

std::string relation_reason(const core::shape::ShapeProgram& p, std::uint32_t r, const std::string& error,
                            const std::vector<Ref>& values, const std::vector<std::string>& symbol_texts) {
    const core::shape::ShapeRelation& rel = p.relations[r];
    std::string out = rel.text + (error.empty() ? " is false" : " raised " + error);
    for (std::size_t k = 0; k < rel.symbols.size(); ++k) {
        const std::uint32_t s = rel.symbols[k];
        out += k == 0 ? " with " : ", ";
        out += symbol_texts[s] + " = " + short_value(values[s].get());
    }
    return out;
}

}  // namespace tripwire::runtime

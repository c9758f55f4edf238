// tripwire/cpp/runtime/serial/values.cpp -- converting constants to value trees and back.
#include "runtime/serial/values.hpp"

#include <string>

namespace tripwire::runtime::serial {
namespace {

using core::codec::Value;
using core::codec::ValueTag;

constexpr int kMaxDepth = 128;

/// `owner.method(a, b, signed=True)`: int.to_bytes and int.from_bytes take `signed` by keyword only.
PyObject* call_signed(PyObject* owner, const char* method, PyObject* a, const char* byteorder) {
    Ref fn = Ref::steal(PyObject_GetAttrString(owner, method));
    if (!fn) return nullptr;
    Ref args = Ref::steal(Py_BuildValue("(Os)", a, byteorder));
    Ref kwargs = Ref::steal(Py_BuildValue("{s:O}", "signed", Py_True));
    if (!args || !kwargs) return nullptr;
    return PyObject_Call(fn.get(), args.get(), kwargs.get());
}

bool fail(PyObject* type, const char* msg) {
    PyErr_SetString(type, msg);
    return false;
}

bool int_value(PyObject* o, Value& out) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) return false;
    if (overflow == 0) {
        out.tag = ValueTag::Int;
        out.i = v;
        return true;
    }
    // Minimal two's complement: bit_length of n, or of ~n for a negative n, plus a sign bit.
    Ref magnitude = Ref::steal(overflow > 0 ? Py_NewRef(o) : PyNumber_Invert(o));
    if (!magnitude) return false;
    Ref bits = Ref::steal(PyObject_CallMethod(magnitude.get(), "bit_length", nullptr));
    if (!bits) return false;
    const Py_ssize_t n_bits = PyLong_AsSsize_t(bits.get());
    if (n_bits < 0) return false;
    const Py_ssize_t n_bytes = (n_bits + 8) / 8;
    if (static_cast<std::size_t>(n_bytes) > core::codec::kMaxBigInt) {
        return fail(PyExc_OverflowError, "an integer constant is too large to store");
    }
    Ref n = Ref::steal(PyLong_FromSsize_t(n_bytes));
    if (!n) return false;
    Ref b = Ref::steal(call_signed(o, "to_bytes", n.get(), "little"));
    if (!b) return false;
    out.tag = ValueTag::BigInt;
    out.bytes.assign(PyBytes_AS_STRING(b.get()), static_cast<std::size_t>(PyBytes_GET_SIZE(b.get())));
    return true;
}

bool str_bytes(PyObject* s, std::string& out) {
    // "surrogatepass": a Python str may hold lone surrogates; they round-trip.
    Ref b = Ref::steal(PyUnicode_AsEncodedString(s, "utf-8", "surrogatepass"));
    if (!b) return false;
    out.assign(PyBytes_AS_STRING(b.get()), static_cast<std::size_t>(PyBytes_GET_SIZE(b.get())));
    return true;
}

bool items(PyObject* seq, PyObject* ref_of, Value& out, int depth) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    out.items.resize(static_cast<std::size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
        // A list may be mutated by ref_of (user code): re-check the size on every step.
        if (i >= PySequence_Fast_GET_SIZE(seq))
            return fail(PyExc_RuntimeError, "a list changed while being stored");
        Ref item = Ref::borrow(PySequence_Fast_GET_ITEM(seq, i));
        if (!to_value(item.get(), ref_of, out.items[static_cast<std::size_t>(i)], depth + 1)) return false;
    }
    return true;
}

}  // namespace

bool to_value(PyObject* o, PyObject* ref_of, Value& out, int depth) {
    if (depth > kMaxDepth) return fail(PyExc_RecursionError, "a constant nests too deep to store");
    PyTypeObject* t = Py_TYPE(o);
    if (o == Py_None) {
        out.tag = ValueTag::None;
    } else if (o == Py_False || o == Py_True) {
        out.tag = o == Py_True ? ValueTag::True : ValueTag::False;
    } else if (o == Py_Ellipsis) {
        out.tag = ValueTag::Ellipsis;
    } else if (t == &PyLong_Type) {
        return int_value(o, out);
    } else if (t == &PyFloat_Type) {
        out.tag = ValueTag::Float;
        out.re = PyFloat_AS_DOUBLE(o);
    } else if (t == &PyComplex_Type) {
        out.tag = ValueTag::Complex;
        const Py_complex c = PyComplex_AsCComplex(o);
        out.re = c.real;
        out.im = c.imag;
    } else if (t == &PyUnicode_Type) {
        out.tag = ValueTag::Str;
        return str_bytes(o, out.bytes);
    } else if (t == &PyBytes_Type) {
        out.tag = ValueTag::Bytes;
        out.bytes.assign(PyBytes_AS_STRING(o), static_cast<std::size_t>(PyBytes_GET_SIZE(o)));
    } else if (t == &PyTuple_Type || t == &PyList_Type) {
        out.tag = t == &PyTuple_Type ? ValueTag::Tuple : ValueTag::List;
        return items(o, ref_of, out, depth);
    } else if (t == &PySet_Type || t == &PyFrozenSet_Type) {
        out.tag = t == &PySet_Type ? ValueTag::Set : ValueTag::FrozenSet;
        Ref seq = Ref::steal(PySequence_List(o));  // a snapshot: ref_of may run user code
        if (!seq) return false;
        return items(seq.get(), ref_of, out, depth);
    } else if (t == &PyDict_Type) {
        out.tag = ValueTag::Dict;
        Ref pairs = Ref::steal(PyDict_Items(o));  // a snapshot, as above
        if (!pairs) return false;
        const Py_ssize_t n = PyList_GET_SIZE(pairs.get());
        out.items.resize(static_cast<std::size_t>(2 * n));
        for (Py_ssize_t i = 0; i < n; ++i) {
            PyObject* kv = PyList_GET_ITEM(pairs.get(), i);
            for (int k = 0; k < 2; ++k) {
                if (!to_value(PyTuple_GET_ITEM(kv, k), ref_of, out.items[static_cast<std::size_t>(2 * i + k)],
                              depth + 1))
                    return false;
            }
        }
    } else if (t == &PyRange_Type || t == &PySlice_Type) {
        out.tag = t == &PyRange_Type ? ValueTag::Range : ValueTag::Slice;
        out.items.resize(3);
        static const char* const kParts[3] = {"start", "stop", "step"};
        for (int k = 0; k < 3; ++k) {
            Ref part = Ref::steal(PyObject_GetAttrString(o, kParts[k]));
            if (!part || !to_value(part.get(), ref_of, out.items[static_cast<std::size_t>(k)], depth + 1))
                return false;
        }
    } else {
        Ref index = Ref::steal(PyObject_CallOneArg(ref_of, o));
        if (!index) return false;
        const Py_ssize_t i = PyLong_AsSsize_t(index.get());
        if (i < 0)
            return PyErr_Occurred() ? false : fail(PyExc_ValueError, "ref_of returned a negative index");
        out.tag = ValueTag::Ref;
        out.index = static_cast<std::uint32_t>(i);
    }
    return true;
}

PyObject* from_value(const Value& v, const std::vector<PyObject*>& refs) {
    switch (v.tag) {
        case ValueTag::None: return Py_NewRef(Py_None);
        case ValueTag::False: return Py_NewRef(Py_False);
        case ValueTag::True: return Py_NewRef(Py_True);
        case ValueTag::Ellipsis: return Py_NewRef(Py_Ellipsis);
        case ValueTag::Int: return PyLong_FromLongLong(v.i);
        case ValueTag::BigInt: {
            Ref b = Ref::steal(
                PyBytes_FromStringAndSize(v.bytes.data(), static_cast<Py_ssize_t>(v.bytes.size())));
            if (!b) return nullptr;
            return call_signed(reinterpret_cast<PyObject*>(&PyLong_Type), "from_bytes", b.get(), "little");
        }
        case ValueTag::Float: return PyFloat_FromDouble(v.re);
        case ValueTag::Complex: return PyComplex_FromDoubles(v.re, v.im);
        case ValueTag::Str:
            return PyUnicode_DecodeUTF8(v.bytes.data(), static_cast<Py_ssize_t>(v.bytes.size()),
                                        "surrogatepass");
        case ValueTag::Bytes:
            return PyBytes_FromStringAndSize(v.bytes.data(), static_cast<Py_ssize_t>(v.bytes.size()));
        case ValueTag::Ref:
            if (v.index >= refs.size() || refs[v.index] == nullptr) {
                PyErr_SetString(PyExc_ValueError, "reference out of range");
                return nullptr;
            }
            return Py_NewRef(refs[v.index]);
        case ValueTag::Tuple:
        case ValueTag::List: {
            const auto n = static_cast<Py_ssize_t>(v.items.size());
            Ref out = Ref::steal(v.tag == ValueTag::Tuple ? PyTuple_New(n) : PyList_New(n));
            if (!out) return nullptr;
            for (Py_ssize_t i = 0; i < n; ++i) {
                PyObject* x = from_value(v.items[static_cast<std::size_t>(i)], refs);
                if (x == nullptr) return nullptr;
                if (v.tag == ValueTag::Tuple) {
                    PyTuple_SET_ITEM(out.get(), i, x);
                } else {
                    PyList_SET_ITEM(out.get(), i, x);
                }
            }
            return out.release();
        }
        case ValueTag::Set:
        case ValueTag::FrozenSet: {
            Ref out = Ref::steal(PySet_New(nullptr));
            if (!out) return nullptr;
            for (const Value& item : v.items) {
                Ref x = Ref::steal(from_value(item, refs));
                if (!x || PySet_Add(out.get(), x.get()) < 0) return nullptr;
            }
            if (v.tag == ValueTag::Set) return out.release();
            return PyFrozenSet_New(out.get());
        }
        case ValueTag::Dict: {
            Ref out = Ref::steal(PyDict_New());
            if (!out) return nullptr;
            for (std::size_t i = 0; i + 1 < v.items.size(); i += 2) {
                Ref k = Ref::steal(from_value(v.items[i], refs));
                if (!k) return nullptr;
                Ref x = Ref::steal(from_value(v.items[i + 1], refs));
                if (!x || PyDict_SetItem(out.get(), k.get(), x.get()) < 0) return nullptr;
            }
            return out.release();
        }
        case ValueTag::Range:
        case ValueTag::Slice: {
            Ref parts[3];
            for (int k = 0; k < 3; ++k) {
                parts[k] = Ref::steal(from_value(v.items.at(static_cast<std::size_t>(k)), refs));
                if (!parts[k]) return nullptr;
            }
            if (v.tag == ValueTag::Slice) return PySlice_New(parts[0].get(), parts[1].get(), parts[2].get());
            return PyObject_CallFunctionObjArgs(reinterpret_cast<PyObject*>(&PyRange_Type), parts[0].get(),
                                                parts[1].get(), parts[2].get(), nullptr);
        }
    }
    PyErr_SetString(PyExc_ValueError, "unknown value tag");
    return nullptr;
}

}  // namespace tripwire::runtime::serial

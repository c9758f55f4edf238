// tripwire/cpp/runtime/serial/values.cpp -- converting constants to value trees and back.
#include "runtime/serial/values.hpp"

#include <algorithm>
#include <string>
#include <vector>

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

// Hash flooding: items that share one hash make each insertion into a set or dict probe every
// earlier one, so n of them cost n^2 comparisons. The hashes of ints, floats and tuples of them
// are not randomised, so the bytes choose them (i * (2**61 - 1) all hash to 0): 16,000 such ints,
// 190 KB, would take 3 s to load and as long to check. An honest set has at most two items per hash
// (-1 and -2); more than kMaxSameHash is refused, which keeps building linear.
constexpr std::size_t kMaxSameHash = 16;

/// The class attribute `name` of `t` as the interpreter finds it: the first MRO class whose own
/// dict holds it (borrowed; nullptr with no error when none does). No metaclass hook runs.
PyObject* mro_lookup(PyTypeObject* t, PyObject* name) {
    PyObject* mro = t->tp_mro;
    if (mro == nullptr || !PyTuple_Check(mro)) return nullptr;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); ++i) {
        PyObject* d = reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, i))->tp_dict;
        if (d == nullptr) continue;
        PyObject* found = PyDict_GetItemWithError(d, name);
        if (found != nullptr || PyErr_Occurred()) return found;
    }
    return nullptr;
}

// A referenced object that is a set item, a dict key, a DICT_CONTAINS key or a SET_CONTAINS item is hashed
// (at load or on every check), and one inside a tuple is compared by EQUALS_MATCH: its class's __hash__ and
// __eq__ would run, chosen by the bytes (an enum of any imported module may define them). Only C
// implementations (object's, int's, str's) and the standard library's Enum.__hash__ (the hash of
// the member's name) may run.
bool hashed_without_code(PyObject* x) {
    PyTypeObject* t = Py_TYPE(x);
    if (t->tp_hash == PyBaseObject_Type.tp_hash && t->tp_richcompare == PyBaseObject_Type.tp_richcompare)
        return true;  // identity: no __hash__ or __eq__ of Python code anywhere in the MRO
    for (const char* name : {"__hash__", "__eq__"}) {
        Ref key = Ref::steal(PyUnicode_InternFromString(name));
        if (!key) return false;
        PyObject* found = mro_lookup(t, key.get());
        if (found == nullptr && PyErr_Occurred()) return false;
        if (found == nullptr || found == Py_None || Py_IS_TYPE(found, &PyWrapperDescr_Type) ||
            Py_IS_TYPE(found, &PyMethodDescr_Type) || PyCFunction_Check(found))
            continue;
        // Enum.__hash__, found in enum.Enum's own dict (enum is imported: x is a member).
        Ref enum_module = Ref::steal(PyImport_GetModule(Ref::steal(PyUnicode_FromString("enum")).get()));
        if (enum_module) {
            Ref enum_type = Ref::steal(PyObject_GetAttrString(enum_module.get(), "Enum"));
            if (enum_type && PyType_Check(enum_type.get())) {
                PyObject* d = reinterpret_cast<PyTypeObject*>(enum_type.get())->tp_dict;
                if (found == PyDict_GetItemWithError(d, key.get())) continue;
            }
        }
        if (PyErr_Occurred()) return false;
        PyErr_Format(PyExc_ValueError,
                     "a %.200s is inside a constant or a DICT_CONTAINS key or SET_CONTAINS item, and its "
                     "class defines %s in "
                     "Python, which the bytes would choose to run",
                     t->tp_name, name);
        return false;
    }
    return true;
}

/// A referenced object inside a container (only an enum member: the decoder allows no other) is
/// hashed when it is a set item or a dict key, and compared whenever the container is: a tuple's
/// items by EQUALS_MATCH on every check. Its class's hooks must run no code the bytes chose.
bool contained(const Value& item, PyObject* x) { return item.tag != ValueTag::Ref || hashed_without_code(x); }

bool hashes_spread(const std::vector<Ref>& keys) {
    std::vector<Py_hash_t> hashes;
    hashes.reserve(keys.size());
    for (const Ref& k : keys) {
        const Py_hash_t h = PyObject_Hash(k.get());
        if (h == -1 && PyErr_Occurred()) return false;
        hashes.push_back(h);
    }
    std::sort(hashes.begin(), hashes.end());
    std::size_t run = 0;
    for (std::size_t i = 0; i < hashes.size(); ++i) {
        run = i > 0 && hashes[i] == hashes[i - 1] ? run + 1 : 1;
        if (run > kMaxSameHash) {
            PyErr_Format(PyExc_ValueError,
                         "more than %zu of its %zu items share one hash (a set or dict of colliding hashes "
                         "costs quadratic time)",
                         kMaxSameHash, keys.size());
            return false;
        }
    }
    return true;
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

bool hashes_without_code(PyObject* o) {
    if (PyTuple_CheckExact(o)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o); ++i) {
            if (!hashes_without_code(PyTuple_GET_ITEM(o, i))) return false;
        }
        return true;
    }
    // A frozenset's items were checked when it was built (from_value).
    if (PyLong_CheckExact(o) || PyUnicode_CheckExact(o) || PyBytes_CheckExact(o) || PyFloat_CheckExact(o) ||
        PyFrozenSet_CheckExact(o) || o == Py_None || PyBool_Check(o))
        return true;
    return hashed_without_code(o);
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
                const Value& item = v.items[static_cast<std::size_t>(i)];
                PyObject* x = from_value(item, refs);
                if (x == nullptr) return nullptr;
                if (!contained(item, x)) {
                    Py_DECREF(x);
                    return nullptr;
                }
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
            std::vector<Ref> items;
            items.reserve(v.items.size());
            for (const Value& item : v.items) {
                items.push_back(Ref::steal(from_value(item, refs)));
                if (!items.back()) return nullptr;
                if (!contained(item, items.back().get())) return nullptr;
            }
            if (!hashes_spread(items)) return nullptr;
            Ref out = Ref::steal(PySet_New(nullptr));
            if (!out) return nullptr;
            for (const Ref& x : items) {
                if (PySet_Add(out.get(), x.get()) < 0) return nullptr;
            }
            if (v.tag == ValueTag::Set) return out.release();
            return PyFrozenSet_New(out.get());
        }
        case ValueTag::Dict: {
            std::vector<Ref> keys, values;
            keys.reserve(v.items.size() / 2);
            values.reserve(v.items.size() / 2);
            for (std::size_t i = 0; i + 1 < v.items.size(); i += 2) {
                keys.push_back(Ref::steal(from_value(v.items[i], refs)));
                if (!keys.back()) return nullptr;
                if (!contained(v.items[i], keys.back().get())) return nullptr;
                values.push_back(Ref::steal(from_value(v.items[i + 1], refs)));
                if (!values.back() || !contained(v.items[i + 1], values.back().get())) return nullptr;
            }
            if (!hashes_spread(keys)) return nullptr;
            Ref out = Ref::steal(PyDict_New());
            if (!out) return nullptr;
            for (std::size_t i = 0; i < keys.size(); ++i) {
                if (PyDict_SetItem(out.get(), keys[i].get(), values[i].get()) < 0) return nullptr;
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

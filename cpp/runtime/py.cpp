// tripwire/cpp/runtime/py.cpp -- the out-of-line parts of py.hpp.
#include "runtime/py.hpp"

namespace tripwire::runtime {

std::string take_error_text() {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (type == nullptr) return "";
    PyErr_NormalizeException(&type, &value, &tb);
    std::string out = reinterpret_cast<PyTypeObject*>(type)->tp_name;
    if (value != nullptr) {
        PyObject* s = PyObject_Str(value);
        if (s != nullptr) {
            const char* c = PyUnicode_AsUTF8(s);
            if (c != nullptr && *c) out += std::string(": ") + c;
            Py_DECREF(s);
        }
        PyErr_Clear();  // str() of a hostile exception may itself raise
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return out;
}

}  // namespace tripwire::runtime

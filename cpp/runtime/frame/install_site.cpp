// tripwire/cpp/runtime/frame/install_site.cpp -- where a guard was installed (see the header).
#include "runtime/frame/install_site.hpp"

#include <array>
#include <charconv>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tripwire::runtime {
namespace {

// Bounds of the memos: a builder walks a handful of distinct files and lines; a long-lived JIT
// could see many, so each memo is emptied when it reaches its bound.
constexpr std::size_t kMaxFiles = 1024;
constexpr std::size_t kMaxSites = 8192;
// Sites one walk keeps in an array on the stack (a deeper walk takes a heap array).
constexpr int kInlineSites = 16;

// filename object -> whether it is machinery. The key holds a strong reference (so the pointer
// cannot be reused by another object while it is a key).
std::map<PyObject*, bool>& machinery_memo() {
    static auto* m = new std::map<PyObject*, bool>();
    return *m;
}

// (code object, last instruction offset) -> "file:line in func". Keys and values hold strong
// references. Keyed by the instruction rather than the line: the line of an instruction is a scan
// of the code's line table (PyCode_Addr2Line, linear in the function's size), paid per frame per
// guard otherwise; an instruction's line never changes.
std::map<std::pair<PyObject*, int>, PyObject*>& site_memo() {
    static auto* m = new std::map<std::pair<PyObject*, int>, PyObject*>();
    return *m;
}

// set_machinery_rule's callable (a strong reference) and directory.
struct MachineryRule {
    PyObject* is_machinery = nullptr;
    std::string dir;
};
MachineryRule& machinery_rule() {
    static auto* r = new MachineryRule();  // never destroyed: it holds a Python object
    return *r;
}

bool ends_with(std::string_view s, std::string_view end) {
    return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

// The rule's answer for `filename` (1 machinery, 0 user code), or -1 when the rule does not
// decide (the callable is asked). Runs no Python code. The tests are _is_machinery's on the
// UTF-8 bytes, which agree with its tests on code points: '/', '.' and "<frozen " are ASCII, and
// no byte of a multi-byte UTF-8 sequence is ASCII.
int machinery_by_rule(PyObject* is_machinery, PyObject* filename) {
    const MachineryRule& rule = machinery_rule();
    if (rule.is_machinery == nullptr || is_machinery != rule.is_machinery || !PyUnicode_CheckExact(filename))
        return -1;
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(filename, &size);
    if (data == nullptr) {  // not encodable (a lone surrogate): the callable decides
        PyErr_Clear();
        return -1;
    }
    const std::string_view f(data, static_cast<std::size_t>(size));
    constexpr std::string_view kFrozen = "<frozen ";
    if (f.compare(0, kFrozen.size(), kFrozen) == 0) return 1;
    constexpr auto npos = std::string_view::npos;
    if (f.empty() || f[0] != '/' || f.find("//") != npos || f.find("/./") != npos || f.find("/../") != npos ||
        ends_with(f, "/") || ends_with(f, "/.") || ends_with(f, "/.."))
        return -1;
    const std::size_t slash = f.rfind('/');
    return f.substr(0, slash) == rule.dir && f.substr(slash + 1) != "demo.py" ? 1 : 0;
}

// 1 machinery, 0 user code, -1 error.
int is_machinery_file(PyObject* is_machinery, PyObject* filename) {
    {
        auto& memo = machinery_memo();
        auto it = memo.find(filename);
        if (it != memo.end()) return it->second ? 1 : 0;
    }
    int truth = machinery_by_rule(is_machinery, filename);
    if (truth < 0) {
        PyObject* r = PyObject_CallOneArg(is_machinery, filename);  // user code may run
        if (r == nullptr) return -1;
        truth = PyObject_IsTrue(r);
        Py_DECREF(r);
        if (truth < 0) return -1;
    }
    auto& memo = machinery_memo();
    if (memo.size() >= kMaxFiles) {
        std::map<PyObject*, bool> old;
        old.swap(memo);
        for (auto& [k, _] : old) Py_DECREF(k);  // str: no user code runs
    }
    if (memo.emplace(filename, truth == 1).second) Py_INCREF(filename);
    return truth;
}

// "file:line in func", as PyUnicode_FromFormat("%U:%d in %U") makes it: copied byte by byte when
// both names are exact ASCII str (the format's parsing and its writer are most of a new site's
// cost), else through the format.
PyObject* format_site(PyObject* filename, int line, PyObject* name) {
    if (!PyUnicode_CheckExact(filename) || !PyUnicode_CheckExact(name) || !PyUnicode_IS_ASCII(filename) ||
        !PyUnicode_IS_ASCII(name))
        return PyUnicode_FromFormat("%U:%d in %U", filename, line, name);
    char digits[16];
    const std::to_chars_result r = std::to_chars(digits, digits + sizeof digits, line);
    const auto n_digits = static_cast<Py_ssize_t>(r.ptr - digits);
    const Py_ssize_t n_file = PyUnicode_GET_LENGTH(filename), n_name = PyUnicode_GET_LENGTH(name);
    PyObject* text = PyUnicode_New(n_file + 1 + n_digits + 4 + n_name, 127);
    if (text == nullptr) return nullptr;
    char* out = static_cast<char*>(PyUnicode_DATA(text));
    const auto put = [&out](const void* data, Py_ssize_t n) {
        std::memcpy(out, data, static_cast<std::size_t>(n));
        out += n;
    };
    put(PyUnicode_DATA(filename), n_file);
    put(":", 1);
    put(digits, n_digits);
    put(" in ", 4);
    put(PyUnicode_DATA(name), n_name);
    return text;
}

// A new reference to "file:line in func" for frame `f` running `code`, or null with an error set.
PyObject* site_text(PyCodeObject* code, PyFrameObject* f) {
    PyObject* key_code = reinterpret_cast<PyObject*>(code);
    const int lasti = PyFrame_GetLasti(f);
    {
        auto& memo = site_memo();
        auto it = memo.find({key_code, lasti});
        if (it != memo.end()) {
            Py_INCREF(it->second);
            return it->second;
        }
    }
    PyObject* text = format_site(code->co_filename, PyFrame_GetLineNumber(f), code->co_name);
    if (text == nullptr) return nullptr;
    auto& memo = site_memo();
    if (memo.size() >= kMaxSites) {
        // Swapped out first: dropping a code object can run a weakref callback (user code), which
        // may call user_stack again and must find a consistent (empty) memo.
        std::map<std::pair<PyObject*, int>, PyObject*> old;
        old.swap(memo);
        for (auto& [k, v] : old) {
            Py_DECREF(v);
            Py_DECREF(k.first);
        }
    }
    auto [it, fresh] = site_memo().emplace(std::make_pair(key_code, lasti), text);
    if (fresh) {
        Py_INCREF(key_code);
        Py_INCREF(text);
    }
    (void)it;
    return text;
}

}  // namespace

PyObject* user_stack(PyObject* is_machinery, int depth) {
    // The sites found, innermost first: on the stack up to kInlineSites, else in a heap array.
    std::array<Ref, kInlineSites> inline_sites;
    std::vector<Ref> heap_sites;
    Ref* sites = inline_sites.data();
    if (depth > kInlineSites) {
        heap_sites.resize(static_cast<std::size_t>(depth));
        sites = heap_sites.data();
    }
    int n = 0;
    PyFrameObject* f = PyEval_GetFrame();  // borrowed
    Py_XINCREF(f);
    Ref frame = Ref::steal(reinterpret_cast<PyObject*>(f));
    while (frame && n < depth) {
        auto* fo = reinterpret_cast<PyFrameObject*>(frame.get());
        Ref code = Ref::steal(reinterpret_cast<PyObject*>(PyFrame_GetCode(fo)));
        auto* co = reinterpret_cast<PyCodeObject*>(code.get());
        const int m = is_machinery_file(is_machinery, co->co_filename);
        if (m < 0) return nullptr;
        if (m == 0) {
            PyObject* text = site_text(co, fo);
            if (text == nullptr) return nullptr;
            sites[n++] = Ref::steal(text);
        }
        frame = Ref::steal(reinterpret_cast<PyObject*>(PyFrame_GetBack(fo)));
    }
    PyObject* t = PyTuple_New(n);
    if (t == nullptr) return nullptr;
    // Innermost last.
    for (int k = 0; k < n; ++k) PyTuple_SET_ITEM(t, k, sites[n - 1 - k].release());
    return t;
}

void set_machinery_rule(PyObject* is_machinery, std::string dir) {
    MachineryRule& rule = machinery_rule();
    Py_XINCREF(is_machinery);
    PyObject* old = rule.is_machinery;
    rule.is_machinery = is_machinery;
    rule.dir = std::move(dir);
    Py_XDECREF(old);  // after the rule is consistent: dropping a callable may run code
}

void clear_install_site_memo() {
    std::map<PyObject*, bool> files;
    std::map<std::pair<PyObject*, int>, PyObject*> sites;
    files.swap(machinery_memo());
    sites.swap(site_memo());
    for (auto& [k, _] : files) Py_DECREF(k);
    for (auto& [k, v] : sites) {
        Py_DECREF(v);
        Py_DECREF(k.first);
    }
}

}  // namespace tripwire::runtime

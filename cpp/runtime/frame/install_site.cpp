// tripwire/cpp/runtime/frame/install_site.cpp -- where a guard was installed (see the header).
#include "runtime/frame/install_site.hpp"

#include <cstddef>
#include <map>
#include <utility>
#include <vector>

namespace tripwire::runtime {
namespace {

// Bound of the memo: a builder walks a handful of distinct lines; a long-lived JIT could see
// many, so the memo is emptied when it reaches its bound.
constexpr std::size_t kMaxSites = 8192;

// (code object, instruction offset in bytes) -> what that frame contributes to a stack: "file:line
// in func" (a strong reference), or null (machinery). Keyed by the instruction rather than the
// line: PyFrame_GetLineNumber scans the code's location table, linear in the function's size, per
// frame per guard otherwise. Each key holds a strong reference to its code object, so a code's
// address cannot name another code while it is a key.
using SiteKey = std::pair<PyObject*, int>;
std::map<SiteKey, PyObject*>& site_memo() {
    static auto* m = new std::map<SiteKey, PyObject*>();  // never destroyed: it holds Python objects
    return *m;
}

// Empty the memo, then drop its references: dropping a code object can run a weakref callback
// (user code) that walks a stack again and must find a consistent (empty) memo.
void clear_memo() {
    std::map<SiteKey, PyObject*> old;
    old.swap(site_memo());
    for (auto& [key, site] : old) {
        Py_XDECREF(site);
        Py_DECREF(key.first);
    }
}

// What frame `fo` adds to a stack: 1 with a new reference to "file:line in func" in `site`, 0 for
// a machinery frame, -1 with an error set.
int frame_site(PyObject* is_machinery, PyFrameObject* fo, Ref& site) {
    const Ref code = Ref::steal(reinterpret_cast<PyObject*>(PyFrame_GetCode(fo)));
    const SiteKey key{code.get(), PyFrame_GetLasti(fo)};
    {
        auto it = site_memo().find(key);
        if (it != site_memo().end()) {
            if (it->second == nullptr) return 0;
            site = Ref::borrow(it->second);
            return 1;
        }
    }
    auto* co = reinterpret_cast<PyCodeObject*>(code.get());
    const Ref answer = Ref::steal(PyObject_CallOneArg(is_machinery, co->co_filename));  // user code may run
    if (!answer) return -1;
    const int machinery = PyObject_IsTrue(answer.get());
    if (machinery < 0) return -1;
    Ref text;
    if (machinery == 0) {
        text = Ref::steal(
            PyUnicode_FromFormat("%U:%d in %U", co->co_filename, PyFrame_GetLineNumber(fo), co->co_name));
        if (!text) return -1;
    }
    // Probed afresh: the call and the allocations above may have walked a stack (and filled or
    // emptied the memo) meanwhile.
    if (site_memo().size() >= kMaxSites) clear_memo();  // may run code (a code object's weakref callback)
    if (site_memo().emplace(key, text.get()).second) {
        Py_INCREF(key.first);
        Py_XINCREF(text.get());
    }
    if (machinery == 1) return 0;
    site = std::move(text);
    return 1;
}

}  // namespace

PyObject* user_stack(PyObject* is_machinery, int depth) {
    std::vector<Ref> sites;  // innermost first
    Ref frame = Ref::borrow(reinterpret_cast<PyObject*>(PyEval_GetFrame()));
    while (frame && static_cast<int>(sites.size()) < depth) {
        auto* fo = reinterpret_cast<PyFrameObject*>(frame.get());
        Ref site;
        const int r = frame_site(is_machinery, fo, site);
        if (r < 0) return nullptr;
        if (r == 1) sites.push_back(std::move(site));
        // A new reference, or null (the outermost frame, or no memory for its frame object: the
        // walk ends there, as a traceback's would).
        frame = Ref::steal(reinterpret_cast<PyObject*>(PyFrame_GetBack(fo)));
    }
    if (PyErr_Occurred()) return nullptr;
    const auto n = static_cast<Py_ssize_t>(sites.size());
    PyObject* t = PyTuple_New(n);
    if (t == nullptr) return nullptr;
    // Innermost last.
    for (Py_ssize_t k = 0; k < n; ++k)
        PyTuple_SET_ITEM(t, k, sites[static_cast<std::size_t>(n - 1 - k)].release());
    return t;
}

void clear_install_site_memo() { clear_memo(); }

}  // namespace tripwire::runtime

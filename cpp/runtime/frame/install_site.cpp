// tripwire/cpp/runtime/frame/install_site.cpp -- where a guard was installed (see the header).
#include "runtime/frame/install_site.hpp"

#include <array>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/frame/interp_frame.hpp"

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

// (code object, last instruction offset in bytes) -> what that frame contributes to a stack:
// "file:line in func", or nothing (machinery). Keyed by the instruction rather than the line: the
// line of an instruction is a scan of the code's line table (PyCode_Addr2Line, linear in the
// function's size), paid per frame per guard otherwise; an instruction's line never changes.
// An open-addressing table (one probe of a few instructions per frame of every walk; a std::map
// was two lookups per frame, with the file memo below). Keys and sites hold strong references,
// so a code object's address cannot name another code while it is a key.
class SiteTable {
  public:
    struct Entry {
        PyObject* code = nullptr;  // null: a free slot
        int lasti = 0;
        PyObject* site = nullptr;  // null: a machinery frame
    };

    // The entry of (code, lasti), or null. Runs no Python code.
    const Entry* find(PyObject* code, int lasti) const {
        if (slots_.empty()) return nullptr;
        for (std::size_t i = slot_of(code, lasti);; i = (i + 1) & mask()) {
            const Entry& e = slots_[i];
            if (e.code == nullptr) return nullptr;
            if (e.code == code && e.lasti == lasti) return &e;
        }
    }

    // Add (code, lasti) -> site (null: machinery), taking new references, unless it is there
    // already (a nested walk added it meanwhile). Runs no Python code.
    void insert(PyObject* code, int lasti, PyObject* site) {
        if (find(code, lasti) != nullptr) return;
        if (2 * (used_ + 1) > slots_.size()) grow();
        Py_INCREF(code);
        Py_XINCREF(site);
        place({code, lasti, site});
        ++used_;
    }

    std::size_t size() const { return used_; }

    // Empty the table, then drop its references: dropping a code object can run a weakref
    // callback (user code) that walks a stack again and must find a consistent (empty) table.
    void clear() {
        std::vector<Entry> old;
        old.swap(slots_);
        used_ = 0;
        for (const Entry& e : old) {
            if (e.code == nullptr) continue;
            Py_XDECREF(e.site);
            Py_DECREF(e.code);
        }
    }

  private:
    static constexpr std::size_t kInitialSlots = 16;

    std::size_t mask() const { return slots_.size() - 1; }
    std::size_t slot_of(PyObject* code, int lasti) const {
        // Fibonacci hashing of the address (its low bits are alignment) and the offset.
        const std::uint64_t key = (static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(code)) >> 4U) ^
                                  (static_cast<std::uint64_t>(static_cast<std::uint32_t>(lasti)) << 40U);
        return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ULL) >> 32U) & mask();
    }
    void place(const Entry& e) {
        std::size_t i = slot_of(e.code, e.lasti);
        while (slots_[i].code != nullptr) i = (i + 1) & mask();
        slots_[i] = e;
    }
    void grow() {
        std::vector<Entry> old(slots_.empty() ? kInitialSlots : 2 * slots_.size());
        old.swap(slots_);
        for (const Entry& e : old)
            if (e.code != nullptr) place(e);
    }

    std::vector<Entry> slots_;  // a power of two in size, at most half full
    std::size_t used_ = 0;
};

SiteTable& site_memo() {
    static auto* m = new SiteTable();  // never destroyed: it holds Python objects
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

// PyCode_Addr2Line(code, offset) (`offset` in bytes), which scans the location table from its
// start through CPython's general range iterator (most of a cold install-site walk); here the
// same scan reads only lines. The table's format is 3.11-3.13's (CPython's Objects/locations.md):
// each entry starts with a byte 1cccclll (code c, length l + 1 code units) and no other byte has
// bit 7 set; c 15 has no line, 14 and 13 carry a signed varint line delta first (6-bit chunks,
// low first, bit 6 set on all but the last, the sign in bit 0), 10-12 a delta of c - 10, 0-9 none.
// The walk from entry to entry is CPython's (to the next byte with bit 7 set), and so are the
// answers: the code's first line before the first instruction, -1 for an instruction without a
// line or past the table. Another version asks CPython.
int line_of_instruction(PyCodeObject* code, int offset) {
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000
    if (offset < 0) return code->co_firstlineno;
    PyObject* table = code->co_linetable;
    if (table == nullptr || !PyBytes_CheckExact(table)) return PyCode_Addr2Line(code, offset);
    const auto* p = reinterpret_cast<const std::uint8_t*>(PyBytes_AS_STRING(table));
    const std::uint8_t* const end = p + PyBytes_GET_SIZE(table);
    const int unit = offset / 2;  // sizeof(_Py_CODEUNIT)
    int line = code->co_firstlineno;
    int entry_end = 0;  // in code units
    while (p < end) {
        const unsigned int first = *p;
        const unsigned int kind = (first >> 3) & 15U;
        entry_end += static_cast<int>(first & 7U) + 1;
        if (kind >= 10 && kind <= 12) {
            line += static_cast<int>(kind) - 10;
        } else if (kind == 13 || kind == 14) {
            unsigned int v = 0;
            unsigned int shift = 0;
            for (const std::uint8_t* q = p + 1; q < end && shift < 32; shift += 6) {
                const unsigned int b = *q++;
                v |= (b & 63U) << shift;
                if ((b & 64U) == 0) break;
            }
            line += (v & 1U) != 0 ? -static_cast<int>(v >> 1) : static_cast<int>(v >> 1);
        }
        if (unit < entry_end) return (first >> 3) == 0x1FU ? -1 : line;
        do {
            ++p;
        } while (p < end && (*p & 128U) == 0);
    }
    return -1;
#else
    return PyCode_Addr2Line(code, offset);
#endif
}

// frame_site for a (code, lasti) the memo does not hold: asks is_machinery (Python code may run)
// and formats the site (allocates: a collection may run). Either may walk a stack again, so the
// memo is probed afresh before the entry is added.
__attribute__((noinline)) int new_frame_site(PyObject* is_machinery, PyCodeObject* code, int lasti,
                                             PyFrameObject* fo, Ref& site) {
    Ref text;
    const int m = is_machinery_file(is_machinery, code->co_filename);
    if (m < 0) return -1;
    if (m == 0) {
        const int line = fo != nullptr ? PyFrame_GetLineNumber(fo) : line_of_instruction(code, lasti);
        text = Ref::steal(format_site(code->co_filename, line, code->co_name));
        if (!text) return -1;
    }
    SiteTable& memo = site_memo();
    if (memo.size() >= kMaxSites) memo.clear();  // may run code (a code object's weakref callback)
    site_memo().insert(reinterpret_cast<PyObject*>(code), lasti, text.get());
    if (m == 1) return 0;
    site = std::move(text);
    return 1;
}

// What the frame running `code` at `lasti` (bytes; PyFrame_GetLasti's value) adds to a stack
// (`is_machinery` as user_stack's): 1 with a new reference to "file:line in func" in `site`, 0 for
// a machinery frame, -1 with an error set. `fo` is the frame's object when the walk has one (the
// line is then PyFrame_GetLineNumber's, which a tracer may set); without one the line is the
// instruction's (what that function computes when no tracer set it).
inline int frame_site(PyObject* is_machinery, PyCodeObject* code, int lasti, PyFrameObject* fo, Ref& site) {
    if (const SiteTable::Entry* e = site_memo().find(reinterpret_cast<PyObject*>(code), lasti)) {
        if (e->site == nullptr) return 0;
        site = Ref::borrow(e->site);
        return 1;
    }
    return new_frame_site(is_machinery, code, lasti, fo, site);
}

// Whether the frames can be walked without frame objects (frame::thread_top_frame ...): a build
// with the version's frame layout mirror, once the walk has agreed with the frame-object walk on a
// real stack (the first walk of the process checks; a disagreement keeps the frame-object walk).
enum class RawWalk : std::uint8_t { Unchecked, Checking, Agrees, Disagrees };
RawWalk g_raw_walk = RawWalk::Unchecked;

// The first complete frame from `f` on (PyEval_GetFrame's and PyFrame_GetBack's choice).
frame::RawFrame* complete_from(frame::RawFrame* f) {
    while (f != nullptr && frame::frame_incomplete(f)) f = frame::frame_previous(f);
    return f;
}

// (code, lasti in bytes) of every frame, innermost first, walked both ways; whether they agree.
bool raw_walk_agrees() {
    std::vector<std::pair<PyObject*, int>> raw;  // borrowed: the frames below this call hold them
    for (frame::RawFrame* f = complete_from(frame::thread_top_frame(PyThreadState_Get())); f != nullptr;
         f = complete_from(frame::frame_previous(f))) {
        const int lasti = frame::frame_lasti(f);
        raw.emplace_back(reinterpret_cast<PyObject*>(frame::frame_code(f)), lasti < 0 ? -1 : 2 * lasti);
    }
    std::size_t k = 0;
    Ref frame = Ref::borrow(reinterpret_cast<PyObject*>(PyEval_GetFrame()));
    while (frame) {
        auto* fo = reinterpret_cast<PyFrameObject*>(frame.get());
        const Ref code = Ref::steal(reinterpret_cast<PyObject*>(PyFrame_GetCode(fo)));
        if (k >= raw.size() || raw[k].first != code.get() || raw[k].second != PyFrame_GetLasti(fo))
            return false;
        ++k;
        frame = Ref::steal(reinterpret_cast<PyObject*>(PyFrame_GetBack(fo)));
    }
    PyErr_Clear();  // a frame object that could not be made (memory) ends the walk early: no match
    return k == raw.size();
}

bool raw_walk() {
    if (!frame::kHasFrameLayout) return false;
    if (g_raw_walk == RawWalk::Unchecked) {
        g_raw_walk = RawWalk::Checking;  // a walk nested in the check (a finalizer) uses frame objects
        g_raw_walk = raw_walk_agrees() ? RawWalk::Agrees : RawWalk::Disagrees;
    }
    return g_raw_walk == RawWalk::Agrees;
}

// The sites of the frames from `f` on, innermost first, into sites[0, depth): the count, or -1
// with an error set. Reads the frames (raw_walk checked it may); the frames below this call stay
// on the stack while it runs, whatever the Python code it runs does.
int raw_stack(PyObject* is_machinery, frame::RawFrame* f, Ref* sites, int depth) {
    int n = 0;
    for (f = complete_from(f); f != nullptr && n < depth; f = complete_from(frame::frame_previous(f))) {
        const int lasti = frame::frame_lasti(f);
        const int r =
            frame_site(is_machinery, frame::frame_code(f), lasti < 0 ? -1 : 2 * lasti, nullptr, sites[n]);
        if (r < 0) return -1;
        n += r;
    }
    return n;
}

// The same through frame objects (PyEval_GetFrame, PyFrame_GetBack), which CPython makes.
int object_stack(PyObject* is_machinery, Ref* sites, int depth) {
    int n = 0;
    Ref frame = Ref::borrow(reinterpret_cast<PyObject*>(PyEval_GetFrame()));
    while (frame && n < depth) {
        auto* fo = reinterpret_cast<PyFrameObject*>(frame.get());
        const Ref code = Ref::steal(reinterpret_cast<PyObject*>(PyFrame_GetCode(fo)));
        const int r = frame_site(is_machinery, reinterpret_cast<PyCodeObject*>(code.get()),
                                 PyFrame_GetLasti(fo), fo, sites[n]);
        if (r < 0) return -1;
        n += r;
        frame = Ref::steal(reinterpret_cast<PyObject*>(PyFrame_GetBack(fo)));
    }
    return n;
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
    const int n = raw_walk()
                      ? raw_stack(is_machinery, frame::thread_top_frame(PyThreadState_Get()), sites, depth)
                      : object_stack(is_machinery, sites, depth);
    if (n < 0) return nullptr;
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
    files.swap(machinery_memo());
    for (auto& [k, _] : files) Py_DECREF(k);
    site_memo().clear();
}

int instruction_line(PyCodeObject* code, int offset) { return line_of_instruction(code, offset); }

bool set_frame_object_walk(bool on) {
    const bool was = !raw_walk();
    if (frame::kHasFrameLayout && g_raw_walk != RawWalk::Checking)
        g_raw_walk = on ? RawWalk::Disagrees : RawWalk::Unchecked;  // off: checked again by the next walk
    return was;
}

bool frame_walks_agree() { return frame::kHasFrameLayout && raw_walk_agrees(); }

}  // namespace tripwire::runtime

// tripwire/cpp/runtime/serial/loaded.cpp -- the load-time checks of a decoded guard set.
#include "runtime/serial/loaded.hpp"

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "runtime/eval/guard_kinds.hpp"
#include "runtime/serial/values.hpp"

namespace tripwire::runtime::serial {
namespace {

using core::GuardKind;
using core::RootKind;
using core::SourcePath;
using core::StepKind;
using core::codec::FormatError;

/// A failed C API call inside the checks: its Python error becomes the FormatError's text.
[[noreturn]] void fail_python(std::size_t offset, const std::string& what) {
    throw FormatError(offset, what + ": " + take_error_text());
}

/// The UTF-8 of a str, cached in the str itself (valid while `s` lives).
std::string_view utf8(PyObject* s, std::size_t offset) {
    Py_ssize_t n = 0;
    const char* p = PyUnicode_AsUTF8AndSize(s, &n);
    if (p == nullptr) fail_python(offset, "a text cannot be encoded");
    return {p, static_cast<std::size_t>(n)};
}

/// Python's keyword.kwlist, read once (tripwire.source imports `keyword`, so this runs no module
/// code); ATTR steps named by a keyword print through getattr().
const std::vector<std::string>& keywords(std::size_t offset) {
    static std::vector<std::string>* words = nullptr;
    if (words == nullptr) {
        Ref mod = Ref::steal(PyImport_ImportModule("keyword"));
        Ref list = mod ? Ref::steal(PyObject_GetAttrString(mod.get(), "kwlist")) : Ref();
        if (!list || !PyList_Check(list.get())) fail_python(offset, "keyword.kwlist is unavailable");
        auto* out = new std::vector<std::string>();
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list.get()); ++i) {
            PyObject* w = PyList_GET_ITEM(list.get(), i);
            if (PyUnicode_CheckExact(w)) out->emplace_back(utf8(w, offset));
        }
        words = out;  // kept for the process
    }
    return *words;
}

/// Source.__str__'s rule for an ATTR step: a plain `X.name` when the name is an identifier that
/// is not a keyword, not a step dunder and NFKC-normal (the parser reads back exactly it).
bool plain_attr(PyObject* name, std::size_t offset) {
    if (PyUnicode_IsIdentifier(name) != 1) return false;
    const std::string_view s = utf8(name, offset);
    for (const std::string& k : keywords(offset)) {
        if (s == k) return false;
    }
    for (const char* r : {"__dict__", "__code__", "__defaults__", "__kwdefaults__", "__closure__"}) {
        if (s == r) return false;
    }
    if (PyUnicode_IS_ASCII(name)) return true;  // ASCII is NFKC-normal
    static PyObject* normalize = nullptr;
    if (normalize == nullptr) {
        Ref mod = Ref::steal(PyImport_ImportModule("unicodedata"));
        normalize = mod ? PyObject_GetAttrString(mod.get(), "normalize") : nullptr;  // kept for the process
        if (normalize == nullptr) fail_python(offset, "unicodedata.normalize is unavailable");
    }
    Ref form = Ref::steal(PyUnicode_FromString("NFKC"));
    Ref normal =
        form ? Ref::steal(PyObject_CallFunctionObjArgs(normalize, form.get(), name, nullptr)) : Ref();
    if (!normal) fail_python(offset, "an attribute name cannot be normalised");
    const int same = PyUnicode_Compare(normal.get(), name);
    if (same == -1 && PyErr_Occurred()) fail_python(offset, "an attribute name cannot be compared");
    return same == 0;
}

/// The pieces one after another (one allocation, where `a + b + c` makes temporaries).
std::string join(std::initializer_list<std::string_view> parts) {
    std::size_t n = 0;
    for (const std::string_view p : parts) n += p.size();
    std::string out;
    out.reserve(n);
    for (const std::string_view p : parts) out.append(p);
    return out;
}

/// `v` in decimal, written at the end of `buf` (no locale, no allocation, unlike snprintf).
std::string_view decimal(std::int64_t v, char (&buf)[24]) {
    char* end = buf + sizeof buf;
    char* p = end;
    const bool negative = v < 0;
    std::uint64_t u = negative ? 0 - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
    do {
        *--p = static_cast<char>('0' + u % 10);
        u /= 10;
    } while (u != 0);
    if (negative) *--p = '-';
    return {p, static_cast<std::size_t>(end - p)};
}

/// Whether `text` is exactly the pieces one after another, without building them (this runs for
/// every step of every source at every load; the rendered text is built only for a message).
bool spells(std::string_view text, std::initializer_list<std::string_view> parts) {
    std::size_t n = 0;
    for (const std::string_view p : parts) n += p.size();
    if (n != text.size()) return false;
    std::size_t at = 0;
    for (const std::string_view p : parts) {
        if (text.compare(at, p.size(), p) != 0) return false;
        at += p.size();
    }
    return true;
}

bool is_property_method(PyObject* name) {
    return PyUnicode_CompareWithASCIIString(name, "size") == 0 ||
           PyUnicode_CompareWithASCIIString(name, "stride") == 0 ||
           PyUnicode_CompareWithASCIIString(name, "storage_offset") == 0;
}

/// A step key a Source may hold (tripwire.source.Step): exactly str, int, bytes, float (finite),
/// bool or None.
bool valid_key(PyObject* k) {
    if (PyFloat_CheckExact(k)) return std::isfinite(PyFloat_AS_DOUBLE(k));
    return PyUnicode_CheckExact(k) || PyLong_CheckExact(k) || PyBytes_CheckExact(k) || PyBool_Check(k) ||
           k == Py_None;
}

/// Renders and checks sources against their stored texts; reprs are computed once per constant.
class SourceChecker {
  public:
    SourceChecker(PyObject* consts, std::size_t n) : consts_(consts), reprs_(n), have_(n, 0) {}

    /// Check `p` of the guard at `offset` (kind name `kind` for messages); interns its str
    /// operands in the constants list.
    void check(const SourcePath& p, std::string_view kind, std::size_t offset) {
        auto bad = [&](const std::string& why) -> FormatError {
            return FormatError(offset, std::string(kind) + " guard: " + why);
        };
        PyObject* name = item(p.name);
        if (!PyUnicode_CheckExact(name)) throw bad("a root name must be a str");
        intern(p.name);
        if (p.texts.size() != p.steps.size() + 1) throw bad("a source needs one text per prefix");
        static constexpr const char* kRoot[] = {"L[", "G[", "C["};
        expect(p.texts[0], {kRoot[static_cast<int>(p.root)], repr(p.name, offset), "]"}, bad);
        for (std::size_t k = 0; k < p.steps.size(); ++k) {
            const core::Step& st = p.steps[k];
            const std::string_view base = p.texts[k];
            const std::string& text = p.texts[k + 1];
            PyObject* arg = nullptr;
            if (st.kind == StepKind::Attr || st.kind == StepKind::Item || st.kind == StepKind::DictItem ||
                st.kind == StepKind::KwDefaults) {
                arg = item(st.operand);
                if (st.kind == StepKind::Attr || st.kind == StepKind::KwDefaults) {
                    if (!PyUnicode_CheckExact(arg) ||
                        (st.kind == StepKind::Attr && PyUnicode_GET_LENGTH(arg) == 0)) {
                        throw bad(std::string("bad source: ") +
                                  (st.kind == StepKind::Attr ? "ATTR step needs a non-empty attribute name"
                                                             : "KWDEFAULTS step needs a str name"));
                    }
                } else if (!valid_key(arg)) {
                    throw bad(
                        "bad source: an item key must be a str, int, bytes, finite float, bool or None");
                }
                if (PyUnicode_CheckExact(arg)) {
                    intern(st.operand);  // may replace the list's item: read it again
                    arg = item(st.operand);
                }
            }
            char idx_buf[24];
            const std::string_view idx = decimal(st.index, idx_buf);
            switch (st.kind) {
                case StepKind::Attr:
                    if (plain_attr(arg, offset)) {
                        expect(text, {base, ".", utf8(arg, offset)}, bad);
                    } else {
                        expect(text, {"getattr(", base, ", ", repr(st.operand, offset), ")"}, bad);
                    }
                    break;
                case StepKind::Item: expect(text, {base, "[", repr(st.operand, offset), "]"}, bad); break;
                case StepKind::DictItem:
                    expect(text, {"dict.__getitem__(", base, ", ", repr(st.operand, offset), ")"}, bad);
                    break;
                case StepKind::Type: expect(text, {"type(", base, ")"}, bad); break;
                case StepKind::Dict: expect(text, {base, ".__dict__"}, bad); break;
                case StepKind::Defaults: expect(text, {base, ".__defaults__[", idx, "]"}, bad); break;
                case StepKind::KwDefaults:
                    expect(text, {base, ".__kwdefaults__[", repr(st.operand, offset), "]"}, bad);
                    break;
                case StepKind::Code: expect(text, {base, ".__code__"}, bad); break;
                case StepKind::ClosureCell:
                    expect(text, {base, ".__closure__[", idx, "].cell_contents"}, bad);
                    break;
                case StepKind::WeakrefCall:
                    // Source.__str__: `X.size` followed by a call prints `getattr(X, 'size')()`, so
                    // that it does not read back as the SIZE step.
                    if (k > 0 && p.steps[k - 1].kind == StepKind::Attr &&
                        is_property_method(item(p.steps[k - 1].operand))) {
                        expect(
                            text,
                            {"getattr(", p.texts[k - 1], ", ", repr(p.steps[k - 1].operand, offset), ")()"},
                            bad);
                    } else {
                        expect(text, {base, "()"}, bad);
                    }
                    break;
                case StepKind::DictKey: expect(text, {"list(dict.keys(", base, "))[", idx, "]"}, bad); break;
                case StepKind::DictValue:
                    expect(text, {base, "[list(dict.keys(", base, "))[", idx, "]]"}, bad);
                    break;
                case StepKind::Size: expect(text, {base, ".size()[", idx, "]"}, bad); break;
                case StepKind::Stride: expect(text, {base, ".stride()[", idx, "]"}, bad); break;
                case StepKind::StorageOffset: expect(text, {base, ".storage_offset()"}, bad); break;
                // The C++ tensor steps print as torch prints their sources (TensorPropertySource,
                // GradSource): the same text as SIZE/STRIDE/STORAGE_OFFSET and ATTR grad.
                case StepKind::TensorSize: expect(text, {base, ".size()[", idx, "]"}, bad); break;
                case StepKind::TensorStride: expect(text, {base, ".stride()[", idx, "]"}, bad); break;
                case StepKind::TensorStorageOffset: expect(text, {base, ".storage_offset()"}, bad); break;
                case StepKind::Grad: expect(text, {base, ".grad"}, bad); break;
                // torch's TypeDictSource / TypeMROSource print.
                case StepKind::TypeDict: expect(text, {"dict(", base, ".__dict__)"}, bad); break;
                case StepKind::TypeMro: expect(text, {base, ".__mro__"}, bad); break;
            }
        }
    }

  private:
    PyObject* item(core::ConstId i) const { return PyList_GET_ITEM(consts_, static_cast<Py_ssize_t>(i)); }

    void intern(core::ConstId i) {
        PyObject* s = item(i);
        if (PyUnicode_CHECK_INTERNED(s)) return;
        Py_INCREF(s);
        PyUnicode_InternInPlace(&s);
        PyList_SetItem(consts_, static_cast<Py_ssize_t>(i), s);  // steals s
    }

    const std::string& repr(core::ConstId i, std::size_t offset) {
        if (!have_[i]) {
            Ref r = Ref::steal(PyObject_Repr(item(i)));
            if (!r) fail_python(offset, "a source key cannot be printed");
            reprs_[i] = utf8(r.get(), offset);
            have_[i] = 1;
        }
        return reprs_[i];
    }

    template <class Bad>
    static void expect(const std::string& stored, std::initializer_list<std::string_view> rendered,
                       Bad& bad) {
        if (!spells(stored, rendered)) {
            throw bad("the source texts do not match its steps ('" + stored + "' is '" + join(rendered) +
                      "')");
        }
    }

    PyObject* consts_;
    std::vector<std::string> reprs_;
    std::vector<char> have_;
};

/// The operand checks of the kinds the Python loader does not check itself.
void check_operands(const core::codec::GuardRecord& g, PyObject* consts, std::string_view kind) {
    const core::GuardDecl& d = g.decl;
    auto bad = [&](const std::string& why) {
        return FormatError(g.offset, std::string(kind) + " guard: " + why);
    };
    auto at = [&](core::ConstId i) -> PyObject* {
        return i == core::kNoConst ? Py_None : PyList_GET_ITEM(consts, static_cast<Py_ssize_t>(i));
    };
    switch (d.kind) {
        case GuardKind::CodeMatch:
            if (!PyCode_Check(at(d.operand))) throw bad("needs a code object");
            break;
        case GuardKind::EqualsMatch: {
            const int r = is_constant(at(d.operand));
            if (r < 0) fail_python(g.offset, std::string(kind) + " guard: the constant cannot be checked");
            if (r == 0) throw bad(std::string(Py_TYPE(at(d.operand))->tp_name) + " is not a constant");
            break;
        }
        case GuardKind::DictKeys: {
            PyObject* keys = at(d.operand2);
            if (!PyTuple_CheckExact(keys)) throw bad("the keys must be a tuple of constants");
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(keys); ++i) {
                const int r = is_constant(PyTuple_GET_ITEM(keys, i), 1);
                if (r < 0) fail_python(g.offset, std::string(kind) + " guard: a key cannot be checked");
                if (r == 0) throw bad("the keys must be a tuple of constants");
            }
            break;
        }
        case GuardKind::RangeIterator:
            if (!PyRange_Check(at(d.operand))) throw bad("needs a range");
            break;
        case GuardKind::DictContains:
        case GuardKind::SetContains:
            // The key or item is hashed on every check: no hook of a class the bytes chose may run.
            if (!hashes_without_code(at(d.operand))) {
                const std::string why = take_error_text();
                throw bad(d.kind == GuardKind::DictContains ? "the key: " + why : "the item: " + why);
            }
            // An unhashable key or item fails every check: the builder refuses it (its own
            // example fails), and so does the loader, with the reason, rather than load an entry
            // that can never pass. Hashing it runs no code the bytes chose: checked just above.
            if (PyObject_Hash(at(d.operand)) == -1) {
                const char* what = d.kind == GuardKind::DictContains ? "the key" : "the item";
                if (!PyErr_ExceptionMatches(PyExc_TypeError))
                    fail_python(g.offset, std::string(kind) + " guard: " + what + " cannot be hashed");
                const std::string why = take_error_text();
                throw bad(std::string(what) + " is unhashable: " + why);
            }
            break;
        default: break;
    }
}

}  // namespace

LoadedFacts check_loaded(const core::codec::Document& doc, PyObject* consts) {
    if (!PyList_CheckExact(consts) ||
        static_cast<std::size_t>(PyList_GET_SIZE(consts)) != doc.constants.size())
        throw FormatError(0, "one object per constant");
    LoadedFacts facts;
    SourceChecker sources(consts, doc.constants.size());
    for (std::size_t i = 0; i < doc.guards.size(); ++i) {
        const core::codec::GuardRecord& g = doc.guards[i];
        const core::GuardDecl& d = g.decl;
        const std::string_view kind = core::guard_kind_name(d.kind);
        auto one = [&](const SourcePath& p) {
            sources.check(p, kind, g.offset);
            facts.reads_globals = facts.reads_globals || p.root == RootKind::Global;
            for (const core::Step& s : p.steps)
                facts.reads_torch_adapter = facts.reads_torch_adapter || core::is_cpp_tensor_step(s.kind);
        };
        if (d.has_source) one(d.source);
        for (const SourcePath& p : d.more_sources) one(p);
        for (const core::SharedPath& p : d.symbols) one(*p);
        check_operands(g, consts, kind);
        // The kind table's LOAD column: kinds whose operands the Python loader checks by building
        // their specs at load (torch-build codes, plain data, probes, relations); its ADAPTER
        // column: kinds the adapter alone reads.
        if (core::guard_load(d.kind) == core::KindLoad::Python)
            facts.python_checked.push_back(static_cast<std::uint32_t>(i));
        if (core::guard_reads_adapter_only(d.kind)) facts.reads_torch_adapter = true;
    }
    return facts;
}

PyObject* hold_weakly(PyObject* consts, const std::vector<std::uint8_t>& flags,
                      std::vector<std::uint32_t>& weak_positions) {
    const Py_ssize_t n = PyList_GET_SIZE(consts);
    Ref out = Ref::steal(PyList_GetSlice(consts, 0, n));
    if (!out) return nullptr;
    for (Py_ssize_t i = 0; i < n && static_cast<std::size_t>(i) < flags.size(); ++i) {
        PyObject* o = PyList_GET_ITEM(out.get(), i);
        if ((flags[static_cast<std::size_t>(i)] & 1) == 0 || !PyType_SUPPORTS_WEAKREFS(Py_TYPE(o))) continue;
        Ref ref = Ref::steal(PyWeakref_NewRef(o, nullptr));
        Ref address = Ref::steal(PyLong_FromVoidPtr(o));
        Ref name = Ref::steal(PyType_GetName(Py_TYPE(o)));
        if (!ref || !address || !name) return nullptr;
        PyObject* held = PyTuple_Pack(3, ref.get(), address.get(), name.get());
        if (held == nullptr) return nullptr;
        PyList_SetItem(out.get(), i, held);  // steals `held`, releases the strong reference
        weak_positions.push_back(static_cast<std::uint32_t>(i));
    }
    return out.release();
}

}  // namespace tripwire::runtime::serial

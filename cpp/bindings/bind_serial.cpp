// tripwire/cpp/bindings/bind_serial.cpp -- the binary format in Python: encode a guard set's
// declarations and constants, decode bytes into a Decoded document (tripwire.serialization).
//
// Decoding is the core's (core::codec::decode, which validates everything); building constants
// from a decoded document is the runtime's (runtime::serial::from_value). Resolving references is
// Python's (tripwire.serialization), and happens between the two.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/codec/document.hpp"
#include "core/ir.hpp"
#include "register.hpp"
#include "runtime/serial/loaded.hpp"
#include "runtime/serial/values.hpp"

namespace nb = nanobind;

namespace tripwire::bindings {
namespace {

using core::codec::Document;

nb::bytes as_bytes(const std::string& s) { return nb::bytes(s.data(), s.size()); }

// An install site as str. A site names a file whose path may hold bytes that are not UTF-8, which
// Python decodes into lone surrogates ("surrogateescape"), so the codec stores sites as
// "surrogatepass" writes them and they are read back the same way (nanobind's std::string caster
// is strict). A label is text: the decoder refuses one that is not.
nb::str site_str(const std::string& s) {
    PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogatepass");
    if (o == nullptr) throw nb::python_error();
    return nb::steal<nb::str>(o);
}
nb::list site_strs(const std::vector<std::string>& sites) {
    nb::list out;
    for (const std::string& s : sites) out.append(site_str(s));
    return out;
}

// An install stack as the codec stores it: each site's UTF-8 with "surrogatepass", since a site
// names a file whose path may hold bytes that are not UTF-8 (Python decodes those with
// "surrogateescape" into lone surrogates).
std::vector<std::string> site_texts(nb::handle stack) {
    std::vector<std::string> out;
    for (nb::handle site : stack) {
        if (!PyUnicode_Check(site.ptr())) throw nb::type_error("an install site is a str");
        PyObject* b = PyUnicode_AsEncodedString(site.ptr(), "utf-8", "surrogatepass");
        if (b == nullptr) throw nb::python_error();
        out.emplace_back(PyBytes_AS_STRING(b), static_cast<std::size_t>(PyBytes_GET_SIZE(b)));
        Py_DECREF(b);
    }
    return out;
}

/// A decoded, validated document; constants are built on request, once references are resolved.
struct Decoded {
    Document doc;
    std::vector<std::size_t> const_offsets;
    /// The declarations were moved into the guard set built from this document (a load copies
    /// none of them); that set's `_decls()` gives them back.
    bool decls_taken = false;
};

Decoded* as_decoded(PyObject* o) {
    Decoded* d = nullptr;
    if (!nb::try_cast<Decoded*>(nb::handle(o), d)) return nullptr;
    return d;
}

/// The document of `d` with its declarations still in it.
const Document& with_decls(const Decoded& d) {
    if (d.decls_taken) {
        throw std::runtime_error(
            "the declarations of this document were moved into the guard set built from it");
    }
    return d.doc;
}

}  // namespace

const core::codec::Document* decoded_document(PyObject* o) {
    Decoded* d = as_decoded(o);
    return d == nullptr ? nullptr : &d->doc;
}

std::vector<core::GuardDecl> take_decoded_decls(PyObject* o) {
    Decoded* d = as_decoded(o);
    if (d == nullptr) throw nb::type_error("expected a decoded document (tripwire._core.Decoded)");
    (void)with_decls(*d);
    std::vector<core::GuardDecl> out;
    out.reserve(d->doc.guards.size());
    for (auto& g : d->doc.guards) out.push_back(std::move(g.decl));
    d->decls_taken = true;
    return out;
}

void register_serial(nb::module_& m) {
    // The core's FormatError; tripwire.serialization re-raises it as tripwire.FormatError.
    static const nb::exception<core::codec::FormatError> codec_error(m, "_CodecError", PyExc_ValueError);
    // Its message decoded with "backslashreplace": the decoder's messages quote only what it has
    // checked is text, and should one ever quote a stray byte the load must still raise this
    // error, not the UnicodeDecodeError nanobind's strict translation would raise instead.
    nb::register_exception_translator(
        [](const std::exception_ptr& p, void* type) {
            try {
                std::rethrow_exception(p);
            } catch (const core::codec::FormatError& e) {
                const char* what = e.what();
                PyObject* msg = PyUnicode_DecodeUTF8(what, static_cast<Py_ssize_t>(std::strlen(what)),
                                                     "backslashreplace");
                if (msg != nullptr) {
                    PyErr_SetObject(static_cast<PyObject*>(type), msg);
                    Py_DECREF(msg);
                }
            }
        },
        codec_error.ptr());

    m.def(
        "encode_guard_set",
        [](std::vector<core::GuardDecl> decls, nb::list consts, std::vector<std::uint8_t> const_flags,
           std::vector<std::string> labels, nb::list stacks, nb::list references, nb::callable ref_of,
           std::optional<std::string> globals_module,
           const std::vector<std::pair<std::string, core::ConstId>>& baselines,
           const std::vector<std::tuple<std::string, std::string, std::string>>& dropped, bool strict,
           std::string version, std::pair<int, int> python) {
            Document doc;
            doc.tripwire_version = std::move(version);
            doc.python_major = static_cast<std::uint8_t>(python.first);
            doc.python_minor = static_cast<std::uint8_t>(python.second);
            if (labels.size() != decls.size() || nb::len(stacks) != decls.size())
                throw nb::value_error("one label and one stack per declaration");
            // Constants first: ref_of appends to `references` as it meets objects.
            doc.constants.resize(nb::len(consts));
            for (std::size_t i = 0; i < doc.constants.size(); ++i) {
                if (!runtime::serial::to_value(consts[i].ptr(), ref_of.ptr(), doc.constants[i]))
                    throw nb::python_error();
            }
            doc.const_flags = std::move(const_flags);
            for (nb::handle r : references) {
                auto [kind, module, qualname, fp] =
                    nb::cast<std::tuple<int, std::string, std::string, nb::bytes>>(r);
                if (kind < 0 || kind >= core::codec::kRefKindCount)
                    throw nb::value_error("bad reference kind");
                doc.references.push_back({static_cast<core::codec::RefKind>(kind), std::move(module),
                                          std::move(qualname), std::string(fp.c_str(), fp.size()), 0});
            }
            for (std::size_t i = 0; i < decls.size(); ++i) {
                core::codec::GuardRecord g;
                g.decl = std::move(decls[i]);
                g.label = std::move(labels[i]);
                g.stack = site_texts(stacks[i]);
                doc.guards.push_back(std::move(g));
            }
            doc.has_globals_module = globals_module.has_value();
            if (globals_module) doc.globals_module = *globals_module;
            for (const auto& [name, c] : baselines) doc.baselines.push_back({name, c});
            for (const auto& [k, s, d] : dropped) doc.dropped.push_back({k, s, d});
            doc.strict = strict;
            return as_bytes(core::codec::encode(doc));
        },
        nb::arg("decls"), nb::arg("consts"), nb::arg("const_flags"), nb::arg("labels"), nb::arg("stacks"),
        nb::arg("references"), nb::arg("ref_of"), nb::arg("globals_module").none(), nb::arg("baselines"),
        nb::arg("dropped"), nb::arg("strict"), nb::arg("version"), nb::arg("python"),
        "The bytes of a guard set (docs/format.md). Constants that are not plain values go through "
        "ref_of(obj) -> reference index, which appends (kind, module, qualname, fingerprint) to "
        "`references` or raises.");

    nb::class_<Decoded>(m, "Decoded", "A decoded, validated guard-set document (tripwire.serialization).")
        .def_prop_ro("tripwire_version", [](const Decoded& d) { return d.doc.tripwire_version; })
        .def_prop_ro(
            "python_version",
            [](const Decoded& d) { return std::make_pair(int{d.doc.python_major}, int{d.doc.python_minor}); })
        .def_prop_ro("strict", [](const Decoded& d) { return d.doc.strict; })
        .def_prop_ro("globals_module",
                     [](const Decoded& d) {
                         return d.doc.has_globals_module ? std::optional<std::string>(d.doc.globals_module)
                                                         : std::nullopt;
                     })
        .def_prop_ro(
            "references",
            [](const Decoded& d) {
                nb::list out;
                for (const auto& r : d.doc.references) {
                    out.append(nb::make_tuple(static_cast<int>(r.kind), r.module, r.qualname,
                                              as_bytes(r.fingerprint), r.offset));
                }
                return out;
            },
            "[(kind, module, qualname, fingerprint, byte offset)]")
        .def_prop_ro("baselines",
                     [](const Decoded& d) {
                         std::vector<std::pair<std::string, core::ConstId>> out;
                         for (const auto& b : d.doc.baselines) out.emplace_back(b.name, b.value);
                         return out;
                     })
        .def_prop_ro("dropped",
                     [](const Decoded& d) {
                         std::vector<std::tuple<std::string, std::string, std::string>> out;
                         for (const auto& x : d.doc.dropped)
                             out.emplace_back(x.kind, x.source, x.description);
                         return out;
                     })
        .def_prop_ro("const_flags", [](const Decoded& d) { return d.doc.const_flags; })
        .def_prop_ro(
            "probe_references",
            [](const Decoded& d) {
                // The references the engine will call (GLOBAL_STATE's Python probes): a probe must
                // be a reference, so that the loader can apply its stricter policy to it.
                std::vector<std::uint32_t> out;
                for (const auto& g : d.doc.guards) {
                    if (g.decl.kind != core::GuardKind::GlobalState || g.decl.operand == core::kNoConst)
                        continue;
                    const core::codec::Value& v = d.doc.constants[g.decl.operand];
                    if (v.tag != core::codec::ValueTag::Ref)
                        throw core::codec::FormatError(g.offset, "a GLOBAL_STATE probe must be a reference");
                    out.push_back(v.index);
                }
                return out;
            },
            "Indices of the references that GLOBAL_STATE guards call as probes.")
        .def_prop_ro("guard_count", [](const Decoded& d) { return d.doc.guards.size(); })
        .def(
            "decls",
            [](const Decoded& d) {
                std::vector<core::GuardDecl> out;
                out.reserve(d.doc.guards.size());
                for (const auto& g : with_decls(d).guards) out.push_back(g.decl);
                return out;
            },
            "The guard declarations (operands index constants()), until a guard set is built from "
            "this document (GuardSetCore(decoded, ...) moves them there: see its _decls()).")
        .def(
            "decl",
            [](const Decoded& d, std::size_t i) {
                if (i >= d.doc.guards.size()) throw nb::index_error("no such guard");
                return with_decls(d).guards[i].decl;
            },
            nb::arg("i"), "The declaration of the guard at position i.")
        .def(
            "info",
            [](const Decoded& d, std::size_t i) {
                if (i >= d.doc.guards.size()) throw nb::index_error("no such guard");
                const auto& g = d.doc.guards[i];
                return nb::make_tuple(g.label, site_strs(core::codec::stack_of(d.doc, g)), g.offset);
            },
            nb::arg("i"), "(label, install stack, byte offset) of the guard at position i.")
        .def(
            "check_loaded",
            [](const Decoded& d, nb::list consts) {
                runtime::serial::LoadedFacts f = runtime::serial::check_loaded(with_decls(d), consts.ptr());
                return nb::make_tuple(f.reads_globals, nb::cast(std::move(f.python_checked)),
                                      f.reads_torch_adapter);
            },
            nb::arg("consts"),
            nb::sig("def check_loaded(self, consts: list) -> tuple[bool, list[int], bool]"),
            "Check every source's texts against its steps and the common kinds' operands against "
            "the built constants, interning names in place (runtime/serial/loaded.hpp). Returns "
            "(reads_globals, positions of the guards the Python loader checks, whether a guard reads "
            "through the torch adapter only); raises _CodecError.")
        .def(
            "hold_weakly",
            [](const Decoded& d, nb::list consts) {
                std::vector<std::uint32_t> positions;
                PyObject* held = runtime::serial::hold_weakly(consts.ptr(), d.doc.const_flags, positions);
                if (held == nullptr) throw nb::python_error();
                return std::make_pair(nb::steal<nb::list>(held), std::move(positions));
            },
            nb::arg("consts"),
            "(consts with each weakly held constant as (weakref, id, type name), the positions "
            "replaced): what a loaded set keeps for its lazily built diagnostics.")
        .def(
            "guard_info",
            [](const Decoded& d) {
                nb::list out;
                for (const auto& g : d.doc.guards) {
                    out.append(nb::make_tuple(g.label, site_strs(core::codec::stack_of(d.doc, g)), g.offset));
                }
                return out;
            },
            "[(label, install stack, byte offset)] per guard.")
        .def(
            "constants",
            [](const Decoded& d, nb::list resolved) {
                std::vector<PyObject*> refs;
                refs.reserve(nb::len(resolved));
                for (nb::handle r : resolved) refs.push_back(r.ptr());
                if (refs.size() != d.doc.references.size()) throw nb::value_error("one object per reference");
                nb::list out;
                for (std::size_t i = 0; i < d.doc.constants.size(); ++i) {
                    PyObject* o = runtime::serial::from_value(d.doc.constants[i], refs);
                    if (o == nullptr) {
                        const std::string why = runtime::take_error_text();
                        throw core::codec::FormatError(
                            d.const_offsets[i], "constant " + std::to_string(i) + " cannot be built: " + why);
                    }
                    out.append(nb::steal(o));
                }
                return out;
            },
            nb::arg("resolved"),
            "The constants as objects, references replaced by `resolved` (one object per reference).");

    m.def(
        "decode_guard_set",
        [](nb::bytes data) {
            auto* d = new Decoded{
                core::codec::decode(reinterpret_cast<const std::uint8_t*>(data.c_str()), data.size()), {}};
            d->const_offsets = d->doc.const_offsets;  // kept beside the document for messages
            return d;
        },
        nb::arg("data"), nb::rv_policy::take_ownership,
        "Decode and validate bytes (raises _CodecError naming the byte offset).");
}

}  // namespace tripwire::bindings

// tripwire/cpp/bindings/bind_ir.cpp -- the guard IR in Python: kinds and declarations.
//
// The enums are the core's own (cpp/core/ir.hpp), named by its tables, so Python and C++ share one
// definition: tripwire.GuardKind is tripwire._core.GuardKind. A guard crosses into C++ as a typed
// GuardDecl (with its SourcePath and Steps), not as a positional tuple.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <iterator>
#include <memory>
#include <optional>

#include "core/codec/guard_records.hpp"
#include "core/ir.hpp"
#include "core/kind_data.hpp"
#include "core/program.hpp"
#include "register.hpp"

namespace nb = nanobind;

namespace tripwire::bindings {
namespace {

// A constant-pool index, or None for "no constant" (core::kNoConst).
std::optional<core::ConstId> optional_id(core::ConstId c) {
    return c == core::kNoConst ? std::nullopt : std::optional<core::ConstId>(c);
}
core::ConstId id_or_none(std::optional<core::ConstId> c) { return c.value_or(core::kNoConst); }

/// A SHAPE declaration's symbols from Python: each its own shared path.
std::vector<core::SharedPath> shared_paths(std::vector<core::SourcePath> paths) {
    std::vector<core::SharedPath> out;
    out.reserve(paths.size());
    for (core::SourcePath& p : paths) out.push_back(std::make_shared<const core::SourcePath>(std::move(p)));
    return out;
}

/// A SHAPE declaration's symbols for Python: copies (a SourcePath is a value there).
std::vector<core::SourcePath> plain_paths(const std::vector<core::SharedPath>& paths) {
    std::vector<core::SourcePath> out;
    out.reserve(paths.size());
    for (const core::SharedPath& p : paths) out.push_back(*p);
    return out;
}

template <typename E, typename Name>
void bind_enum(nb::module_& m, const char* py_name, int count, Name name, const char* doc) {
    nb::enum_<E> e(m, py_name, nb::is_arithmetic(), doc);
    // Reserved values (a kind another branch owns) have no name and no member.
    for (int i = 0; i < count; ++i) {
        const std::string_view n = name(static_cast<E>(i));
        if (n != "UNKNOWN" && n != "unknown") e.value(n.data(), static_cast<E>(i));
    }
}

}  // namespace

void register_ir(nb::module_& m) {
    bind_enum<core::RootKind>(m, "RootKind", core::kRootKindCount, core::root_kind_name,
                              "Where a source's first value is read: L['x'], G['x'], C['x'].");
    bind_enum<core::StepKind>(m, "StepKind", core::kStepKindCount, core::step_kind_name,
                              "One step from a value to a child value (docs/guards.md, Sources).");
    bind_enum<core::GuardKind>(m, "GuardKind", core::kGuardKindCount, core::guard_kind_name,
                               "The guard kinds of the catalogue (docs/guards.md).");

    nb::class_<core::Step>(m, "Step", "One step of a source as the engine reads it.")
        .def(
            "__init__",
            [](core::Step* s, core::StepKind kind, std::optional<core::ConstId> operand, std::int64_t index) {
                new (s) core::Step{kind, id_or_none(operand), index};
            },
            nb::arg("kind"), nb::arg("operand").none() = nb::none(), nb::arg("index") = 0)
        .def_rw("kind", &core::Step::kind)
        .def_prop_ro(
            "operand", [](const core::Step& s) { return optional_id(s.operand); },
            "Constant-pool index of the attribute name or key, or None.")
        .def_rw("index", &core::Step::index, "Position, for positional steps.");

    nb::class_<core::SourcePath>(m, "SourcePath", "A root and its steps, with the printed prefixes.")
        .def(
            "__init__",
            [](core::SourcePath* p, core::RootKind root, core::ConstId name, std::vector<core::Step> steps,
               std::vector<std::string> texts) {
                new (p) core::SourcePath{root, name, std::move(steps), std::move(texts)};
            },
            nb::arg("root"), nb::arg("name"), nb::arg("steps"), nb::arg("texts"))
        .def_rw("root", &core::SourcePath::root)
        .def_rw("name", &core::SourcePath::name, "Constant-pool index of the root's name.")
        .def_rw("steps", &core::SourcePath::steps)
        .def_rw("texts", &core::SourcePath::texts, "The printed prefixes: len(steps) + 1 of them.");

    nb::class_<core::GuardDecl>(m, "GuardDecl",
                                "One declared guard as the engine compiles it; operands are constant-pool "
                                "indices (validated against guard_shape by the compiler).")
        .def(
            "__init__",
            [](core::GuardDecl* d, core::GuardKind kind, std::optional<core::SourcePath> source,
               std::optional<core::ConstId> operand, std::optional<core::ConstId> operand2, std::int64_t n,
               std::int64_t n2, std::int64_t n3, bool flag, std::uint32_t id, std::string relation,
               std::vector<core::SourcePath> symbols, std::vector<std::uint8_t> symbol_types,
               std::vector<std::int64_t> data, std::vector<core::SourcePath> more_sources) {
                new (d) core::GuardDecl();
                d->kind = kind;
                d->has_source = source.has_value();
                if (source) d->source = std::move(*source);
                d->operand = id_or_none(operand);
                d->operand2 = id_or_none(operand2);
                d->n = n;
                d->n2 = n2;
                d->n3 = n3;
                d->flag = flag;
                d->id = id;
                d->relation = std::move(relation);
                d->symbols = shared_paths(std::move(symbols));
                d->symbol_types = std::move(symbol_types);
                d->data = std::move(data);
                d->more_sources = std::move(more_sources);
            },
            nb::arg("kind"), nb::arg("source").none(), nb::arg("operand").none() = nb::none(),
            nb::arg("operand2").none() = nb::none(), nb::arg("n") = 0, nb::arg("n2") = 0, nb::arg("n3") = 0,
            nb::arg("flag") = false, nb::arg("id") = 0, nb::arg("relation") = "",
            nb::arg("symbols") = std::vector<core::SourcePath>(),
            nb::arg("symbol_types") = std::vector<std::uint8_t>(),
            nb::arg("data") = std::vector<std::int64_t>{},
            nb::arg("more_sources") = std::vector<core::SourcePath>{})
        .def_rw("kind", &core::GuardDecl::kind)
        .def_prop_ro("source",
                     [](const core::GuardDecl& d) {
                         return d.has_source ? std::optional<core::SourcePath>(d.source) : std::nullopt;
                     })
        .def_prop_ro("operand", [](const core::GuardDecl& d) { return optional_id(d.operand); })
        .def_prop_ro("operand2", [](const core::GuardDecl& d) { return optional_id(d.operand2); })
        .def_rw("n", &core::GuardDecl::n)
        .def_rw("n2", &core::GuardDecl::n2)
        .def_rw("n3", &core::GuardDecl::n3)
        .def_rw("flag", &core::GuardDecl::flag)
        .def_rw("id", &core::GuardDecl::id)
        .def_rw("relation", &core::GuardDecl::relation, "SHAPE: the relation's text.")
        .def_prop_rw(
            "symbols", [](const core::GuardDecl& d) { return plain_paths(d.symbols); },
            [](core::GuardDecl& d, std::vector<core::SourcePath> symbols) {
                d.symbols = shared_paths(std::move(symbols));
            },
            "SHAPE: each distinct symbol's source, in order of first use.")
        .def_rw("symbol_types", &core::GuardDecl::symbol_types, "SHAPE: per symbol, 0 for int, 1 for float.")
        .def_rw("data", &core::GuardDecl::data, "Per-kind plain data (cpp/core/kind_data.hpp).")
        .def_rw("more_sources", &core::GuardDecl::more_sources,
                "A relational guard's sources after the first.")
        .def_ro("via_python", &core::GuardDecl::via_python,
                "Set by the engine when it binds the declaration: evaluated through a Python reader.");
    m.attr("ANY_DIM") = core::kAny;
    m.attr("MAX_DIMS") = core::kMaxDims;
    {
        nb::list attrs;
        for (int i = 0; i < core::marking_data::kAttrCount; ++i)
            attrs.append(nb::str(core::marking_data::attr_name(i).data()));
        m.attr("MARKING_ATTRS") = nb::tuple(attrs);
        nb::list fields;
        for (std::size_t i = 0; i < core::torch_state::kHeader; ++i)
            fields.append(nb::str(core::torch_state::field_name(i).data()));
        m.attr("TORCH_STATE_FIELDS") = nb::tuple(fields);
    }

    m.def(
        "guard_kind_table",
        [] {
            // The kind table (core/guard_kind_table.hpp), row by row: the Python catalogue's
            // per-kind facts (tripwire.catalogue.KINDS) are these, never a list of its own.
            static constexpr const char* kSource[] = {"required", "optional", "absent"};
            static constexpr const char* kOperand[] = {"none", "value", "identity"};
            static constexpr const char* kImplied[] = {"never",
                                                       "identity",
                                                       "if_immutable_type",
                                                       "if_immutable_constant",
                                                       "dict_state",
                                                       "dict_state_or_fixed_size"};
            // One name per enumerator, in the enums' order (core/guard_kind_table.hpp).
            static_assert(std::size(kSource) == static_cast<std::size_t>(core::KindSource::Absent) + 1);
            static_assert(std::size(kOperand) == static_cast<std::size_t>(core::KindOperand::Identity) + 1);
            static_assert(std::size(kImplied) ==
                          static_cast<std::size_t>(core::Implied::DictStateOrFixedSize) + 1);
            nb::list rows;
            for (int i = 0; i < core::kGuardKindCount; ++i) {
                const auto k = static_cast<core::GuardKind>(i);
                if (!core::guard_kind_known(k)) continue;
                const char* never = core::codec::never_stored_reason(k);
                nb::dict row;
                row["kind"] = k;
                row["source"] = kSource[static_cast<int>(core::guard_source(k))];
                row["operand"] = kOperand[static_cast<int>(core::guard_operand(k))];
                row["operand2"] = core::guard_shape(k).operand2;
                row["runs_user_code"] = core::guard_runs_user_code(k);
                row["relational"] = core::is_relational(k);
                row["implied"] = kImplied[static_cast<int>(core::guard_implied(k))];
                row["record_version"] = core::codec::record_version(k);
                row["never_stored"] = never == nullptr ? nb::none() : nb::object(nb::str(never));
                rows.append(row);
            }
            return rows;
        },
        "The kind table, one dict per kind in value order: kind, source ('required', 'optional', "
        "'absent'), operand ('none', 'value', 'identity'), operand2, runs_user_code, relational, "
        "implied, record_version (0: never stored), never_stored (why, or None).");
    m.def(
        "builtin_probes",
        [] {
            std::vector<std::string> names;
            names.reserve(core::kBuiltinProbeCount);
            for (int i = 0; i < core::kBuiltinProbeCount; ++i)
                names.emplace_back(core::builtin_probe_name(static_cast<core::BuiltinProbe>(i)));
            return names;
        },
        "The built-in global-state probes by id (GuardDecl.n of a GLOBAL_STATE without operand).");
    m.attr("MAX_CONSTANT_DEPTH") = core::kMaxConstantDepth;
    m.attr("MAX_SOURCE_DEPTH") = core::kMaxSourceDepth;
}

}  // namespace tripwire::bindings

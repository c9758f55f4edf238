// tripwire/tests/cpp/testing.hpp -- small builders for guard declarations used by the core tests.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/ir.hpp"
#include "core/kind_data.hpp"
#include "core/program.hpp"

namespace tripwire::test_util {

using core::ConstId;
using core::GuardDecl;
using core::GuardKind;
using core::RootKind;
using core::SourcePath;
using core::Step;
using core::StepKind;

inline Step attr(ConstId name) { return Step{StepKind::Attr, name, 0}; }
inline Step item(ConstId key) { return Step{StepKind::Item, key, 0}; }
inline Step dict_item(ConstId key) { return Step{StepKind::DictItem, key, 0}; }
inline Step type_of() { return Step{StepKind::Type, core::kNoConst, 0}; }
inline Step defaults(std::int64_t i) { return Step{StepKind::Defaults, core::kNoConst, i}; }

/// A source with printed prefixes derived from the constant ids: L['c0'].c1['c2'] ...
inline SourcePath source(RootKind root, ConstId name, std::vector<Step> steps = {}) {
    SourcePath s;
    s.root = root;
    s.name = name;
    const char* prefix = root == RootKind::Local ? "L" : root == RootKind::Global ? "G" : "C";
    std::string text = std::string(prefix) + "['c" + std::to_string(name) + "']";
    s.texts.push_back(text);
    for (const Step& st : steps) {
        switch (st.kind) {
            case StepKind::Attr: text += ".c" + std::to_string(st.operand); break;
            case StepKind::Item:
            case StepKind::DictItem: text += "['c" + std::to_string(st.operand) + "']"; break;
            case StepKind::Type: text = "type(" + text + ")"; break;
            default:
                text += "." + std::string(core::step_kind_name(st.kind)) + std::to_string(st.index);
                break;
        }
        s.texts.push_back(text);
    }
    s.steps = std::move(steps);
    return s;
}

inline SourcePath local(ConstId name, std::vector<Step> steps = {}) {
    return source(RootKind::Local, name, std::move(steps));
}

/// A guard with one operand on a source (TYPE_MATCH by default).
inline GuardDecl on(std::uint32_t id, SourcePath src, GuardKind kind = GuardKind::TypeMatch,
                    ConstId operand = 0) {
    GuardDecl d;
    d.kind = kind;
    d.id = id;
    d.source = std::move(src);
    d.operand = core::guard_shape(kind).operand ? operand : core::kNoConst;
    if (core::guard_shape(kind).operand2) d.operand2 = operand;
    return d;
}

/// The smallest valid GuardDecl::data of a kind: a 0-d tensor or array, no markings.
inline std::vector<std::int64_t> minimal_data(GuardKind k) {
    switch (k) {
        case GuardKind::TensorMatch: return {0, 6, -1, 0, 0, core::kAny};
        case GuardKind::ArrayMatch: return {0, 0, 1};
        case GuardKind::DimensionMarking: return {-1, -1, -1, -1, -1};
        default: return {};
    }
}

/// A relational guard (ALIAS, NO_ALIAS) over sources.
inline GuardDecl relate(std::uint32_t id, GuardKind kind, std::vector<SourcePath> sources) {
    GuardDecl d;
    d.kind = kind;
    d.id = id;
    d.source = sources.front();
    d.more_sources.assign(sources.begin() + 1, sources.end());
    return d;
}

/// An ambient GLOBAL_STATE guard on a built-in probe.
inline GuardDecl ambient(std::uint32_t id, core::BuiltinProbe probe = core::BuiltinProbe::GcEnabled) {
    GuardDecl d;
    d.kind = GuardKind::GlobalState;
    d.has_source = false;
    d.n = static_cast<std::int64_t>(probe);
    d.id = id;
    return d;
}

}  // namespace tripwire::test_util

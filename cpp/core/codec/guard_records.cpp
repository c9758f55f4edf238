// tripwire/cpp/core/codec/guard_records.cpp -- the per-kind payloads (record version 1 of each).
#include "core/codec/guard_records.hpp"

#include <string>

#include "core/program.hpp"

namespace tripwire::core::codec {
namespace {

bool step_has_operand(StepKind k) {
    return k == StepKind::Attr || k == StepKind::Item || k == StepKind::DictItem || k == StepKind::KwDefaults;
}
bool step_has_index(StepKind k) {
    return k == StepKind::Defaults || k == StepKind::ClosureCell || k == StepKind::DictKey ||
           k == StepKind::DictValue;
}

}  // namespace

void write_source(const SourcePath& s, Writer& w, StringTable& strings) {
    w.u8(static_cast<std::uint8_t>(s.root));
    w.varint(s.name);
    w.varint(s.steps.size());
    for (const Step& st : s.steps) {
        w.u8(static_cast<std::uint8_t>(st.kind));
        if (step_has_operand(st.kind)) w.varint(st.operand);
        if (step_has_index(st.kind)) w.varint(static_cast<std::uint64_t>(st.index));
    }
    for (const std::string& t : s.texts) w.varint(strings.index(t));
}

void read_source(Reader& r, SourcePath& s, const PayloadContext& ctx) {
    const std::size_t at = r.offset();
    const std::uint8_t root = r.u8("root kind");
    if (root >= kRootKindCount) r.fail_at(at, "unknown root kind " + std::to_string(root));
    s.root = static_cast<RootKind>(root);
    s.name = r.index("root name constant", ctx.n_consts);
    const std::size_t depth_at = r.offset();
    const std::size_t n = r.count("source depth");
    if (n > kMaxSourceDepth) {
        r.fail_at(depth_at, "source deeper than " + std::to_string(kMaxSourceDepth) + " steps");
    }
    s.steps.clear();
    s.steps.reserve(n);
    for (std::size_t k = 0; k < n; ++k) {
        const std::size_t step_at = r.offset();
        const std::uint8_t kind = r.u8("step kind");
        if (kind >= kStepKindCount) r.fail_at(step_at, "unknown step kind " + std::to_string(kind));
        Step st;
        st.kind = static_cast<StepKind>(kind);
        if (step_has_operand(st.kind)) st.operand = r.index("step operand constant", ctx.n_consts);
        if (step_has_index(st.kind)) {
            const std::uint64_t i = r.varint("step index");
            if (i > 0x7FFFFFFFu) r.fail_at(step_at, "step index out of range");
            st.index = static_cast<std::int64_t>(i);
        }
        s.steps.push_back(st);
    }
    s.texts.clear();
    s.texts.reserve(n + 1);
    for (std::size_t k = 0; k <= n; ++k)
        s.texts.push_back(ctx.strings[r.index("source text", ctx.strings.size())]);
}

std::uint8_t record_version(GuardKind k) { return never_stored_reason(k) == nullptr ? 1 : 0; }

const char* never_stored_reason(GuardKind k) {
    switch (k) {
        case GuardKind::DictVersion:
            return "a dict version is a counter of this process: it cannot be compared in another one";
        case GuardKind::Lambda: return "a predicate is code; the format never stores code";
        default: return nullptr;
    }
}

void write_payload(const GuardDecl& d, Writer& w, StringTable& /*strings*/) {
    switch (d.kind) {
        case GuardKind::TypeMatch:
        case GuardKind::IdMatch:
        case GuardKind::EqualsMatch:
        case GuardKind::CodeMatch:
        case GuardKind::RangeIterator: w.varint(d.operand); break;
        case GuardKind::None:
        case GuardKind::NotNone:
        case GuardKind::True:
        case GuardKind::False:
        case GuardKind::WeakrefAlive: break;
        case GuardKind::Length:
        case GuardKind::TupleIteratorLen: w.varint(static_cast<std::uint64_t>(d.n)); break;
        case GuardKind::DictKeys:
            w.varint(d.operand2);
            w.u8(d.flag ? 1 : 0);
            break;
        case GuardKind::DictContains:
        case GuardKind::HasAttr:
            w.varint(d.operand);
            w.u8(d.flag ? 1 : 0);
            break;
        case GuardKind::GlobalState:
            if (d.operand == kNoConst) {  // built-in probe: its id and the int snapshot
                w.u8(0);
                w.varint(static_cast<std::uint64_t>(d.n));
                w.zigzag(d.n2);
            } else {  // a Python probe (a reference) and its snapshot (a constant)
                w.u8(1);
                w.varint(d.operand);
                w.varint(d.operand2);
            }
            break;
        case GuardKind::DictVersion:
        case GuardKind::Lambda:
            throw FormatError(w.out.size(), std::string(guard_kind_name(d.kind)) +
                                                " guards are never stored: " + never_stored_reason(d.kind));
    }
}

void read_payload(GuardDecl& d, std::uint8_t version, Reader& r, const PayloadContext& ctx) {
    const std::size_t n_consts = ctx.n_consts;
    const std::string name(guard_kind_name(d.kind));
    if (const char* why = never_stored_reason(d.kind)) r.fail(name + " guards are never stored: " + why);
    if (version != 1) {
        r.fail(name + " record version " + std::to_string(version) + " is not one this build reads (1)");
    }
    auto constant = [&](const char* what) { return static_cast<ConstId>(r.index(what, n_consts)); };
    switch (d.kind) {
        case GuardKind::TypeMatch:
        case GuardKind::IdMatch:
        case GuardKind::EqualsMatch:
        case GuardKind::CodeMatch:
        case GuardKind::RangeIterator: d.operand = constant("operand constant"); break;
        case GuardKind::None:
        case GuardKind::NotNone:
        case GuardKind::True:
        case GuardKind::False:
        case GuardKind::WeakrefAlive: break;
        case GuardKind::Length:
        case GuardKind::TupleIteratorLen: {
            const std::uint64_t n = r.varint("length");
            if (n > static_cast<std::uint64_t>(INT64_MAX)) r.fail("length out of range");
            d.n = static_cast<std::int64_t>(n);
            break;
        }
        case GuardKind::DictKeys:
            d.operand2 = constant("key tuple constant");
            d.flag = r.flag("ordered flag");
            break;
        case GuardKind::DictContains:
        case GuardKind::HasAttr:
            d.operand = constant("operand constant");
            d.flag = r.flag("present flag");
            break;
        case GuardKind::GlobalState:
            if (r.flag("probe form")) {
                d.operand = constant("probe constant");
                d.operand2 = constant("snapshot constant");
            } else {
                const std::uint64_t probe = r.varint("built-in probe id");
                if (probe >= static_cast<std::uint64_t>(kBuiltinProbeCount)) {
                    r.fail("unknown built-in probe " + std::to_string(probe));
                }
                d.n = static_cast<std::int64_t>(probe);
                d.n2 = r.zigzag("built-in probe snapshot");
            }
            break;
        case GuardKind::DictVersion:
        case GuardKind::Lambda: break;  // refused above
    }
    if (!r.at_end()) r.fail(name + " payload has " + std::to_string(r.remaining()) + " unread bytes");
}

}  // namespace tripwire::core::codec

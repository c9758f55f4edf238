// tripwire/cpp/core/codec/document.hpp -- a serialized guard set as plain data, and its codec.
//
// A Document is everything the binary format (docs/format.md) holds, with no Python in it: the
// guard declarations (core::GuardDecl, operands as indices into `constants`), the constants as
// value trees, the references (module:qualname plus fingerprint) that stand for objects which
// cannot be written as values, and the metadata of the set. encode() writes one; decode() reads
// one from untrusted bytes: it checks the header, the content hash, every length against the
// bytes present (so a declared length never allocates more than the input could hold), every
// index, every kind's record, and every declaration against the catalogue before returning.
// Any problem is a FormatError naming the byte offset where it was found.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/ir.hpp"

namespace tripwire::core::codec {

/// The format version this build writes and reads (docs/format.md, "Versioning").
inline constexpr std::uint16_t kFormatVersion = 1;
/// "\x89TWG\r\n\x1a\n": the high byte and the line endings catch text-mode mangling.
inline constexpr std::uint8_t kMagic[8] = {0x89, 'T', 'W', 'G', '\r', '\n', 0x1A, '\n'};
/// Bytes before the body: magic, format version, flags, tripwire version, body length, SHA-256.
inline constexpr std::size_t kHeaderSize = 64;
/// The tripwire version field: ASCII, NUL-padded.
inline constexpr std::size_t kVersionField = 16;
/// Largest body accepted (a 100,000-guard set is about 4 MB).
inline constexpr std::size_t kMaxBody = std::size_t{256} << 20;
/// Longest fingerprint of a reference.
inline constexpr std::size_t kMaxFingerprint = 64;
/// Largest big integer constant, in bytes of two's complement.
inline constexpr std::size_t kMaxBigInt = 1 << 16;

/// Bad bytes: what is wrong and where. Maps to tripwire.FormatError (a ValueError) in Python.
class FormatError : public std::runtime_error {
  public:
    FormatError(std::size_t offset, const std::string& what)
        : std::runtime_error(what + " (at byte " + std::to_string(offset) + ")"), offset_(offset) {}
    std::size_t offset() const { return offset_; }

  private:
    std::size_t offset_;
};

/// Tags of a constant's value tree (docs/format.md, "Values").
enum class ValueTag : std::uint8_t {
    None = 0,
    False = 1,
    True = 2,
    Int = 3,     ///< fits an int64: zigzag varint
    BigInt = 4,  ///< two's complement, little-endian, minimal length
    Float = 5,
    Complex = 6,
    Str = 7,
    Bytes = 8,
    Ellipsis = 9,
    Tuple = 10,
    List = 11,
    Set = 12,
    FrozenSet = 13,
    Dict = 14,   ///< items alternate key, value
    Range = 15,  ///< three Int/BigInt items: start, stop, step
    Slice = 16,  ///< three items: start, stop, step
    Ref = 17,    ///< an object named by reference: `index` into Document::references
};
inline constexpr int kValueTagCount = 18;

/// One constant: a tree of values. Str holds UTF-8 (surrogates allowed, as Python's
/// "surrogatepass" writes them); Bytes and BigInt hold raw bytes.
struct Value {
    ValueTag tag = ValueTag::None;
    std::int64_t i = 0;        ///< Int
    double re = 0, im = 0;     ///< Float (re), Complex
    std::uint32_t index = 0;   ///< Ref
    std::string bytes;         ///< Str, Bytes, BigInt
    std::vector<Value> items;  ///< containers, Range, Slice
};

/// What a reference names; the loader resolves each kind its own way (docs/format.md).
enum class RefKind : std::uint8_t {
    Type = 0,        ///< a class: module:qualname
    Function = 1,    ///< a function or builtin: module:qualname
    Code = 2,        ///< the code object of a function: module:qualname of the function
    EnumMember = 3,  ///< module:qualname of the enum class, then "." and the member's name
    Object = 4,      ///< a module-level object: module:qualname
    Module = 5,      ///< a module: its name (qualname empty)
};
inline constexpr int kRefKindCount = 6;
std::string_view ref_kind_name(RefKind k);

struct Reference {
    RefKind kind = RefKind::Type;
    std::string module;
    std::string qualname;
    std::string fingerprint;  ///< opaque to the core; at most kMaxFingerprint bytes
    std::size_t offset = 0;   ///< where decode() found it (for load errors that name it)
};

/// One guard: its declaration plus what diagnostics show (a label, the install stack).
struct GuardRecord {
    GuardDecl decl;
    std::string label;               ///< GLOBAL_STATE's name; empty for other kinds
    std::vector<std::string> stack;  ///< install sites, innermost last (what encode() writes)
    std::size_t offset = 0;          ///< where decode() found it
    /// decode() leaves `stack` empty and records the sites as Document::stack_strings[stack_begin,
    /// stack_begin + stack_count) instead: no string per site per guard at load. Read with stack_of().
    std::uint32_t stack_begin = 0, stack_count = 0;
};

/// A guard left out at save by an explicit drop=: recorded, shown by explain().
struct Dropped {
    std::string kind;         ///< "ID_MATCH"
    std::string source;       ///< "L['f']", empty for ambient guards
    std::string description;  ///< the guard as explain() printed it, and why it could not be kept
};

/// A baseline of framework state the guards were built under (docs/format.md, "Baselines").
struct Baseline {
    std::string name;
    ConstId value = kNoConst;  ///< a constant
};

struct Document {
    std::string tripwire_version;
    std::uint8_t python_major = 0, python_minor = 0;  ///< the writer's CPython
    std::vector<Reference> references;
    std::vector<Value> constants;
    std::vector<std::uint8_t> const_flags;   ///< per constant: bit 0 = held by weak reference
    std::vector<std::size_t> const_offsets;  ///< where decode() found each constant (for messages)
    std::vector<GuardRecord> guards;         ///< sorted by decl.id, ids unique
    bool has_globals_module = false;
    std::string globals_module;  ///< the module whose __dict__ G[...] roots read
    std::vector<Baseline> baselines;
    std::vector<Dropped> dropped;
    bool strict = false;  ///< the set re-raises guard exceptions (GuardEvalError)
    /// decode() only: the string table, and the install stacks as indices into it (GuardRecord).
    std::vector<std::string> strings;
    std::vector<std::uint32_t> stack_strings;
};

/// The install stack of `g` (a guard of `doc`), whether `doc` was built to encode or decoded.
std::vector<std::string> stack_of(const Document& doc, const GuardRecord& g);

/// The bytes of `doc` (header, hash, body). Throws FormatError when `doc` itself breaks a rule
/// decode() would reject (so encode never writes what decode refuses).
std::string encode(const Document& doc);

/// Read and validate a document. Throws FormatError.
Document decode(const std::uint8_t* data, std::size_t size);

/// The body alone (no header, no hash check): what decode() parses after the header; the body
/// starts at byte kHeaderSize of the input (offsets in messages count from the input's start).
Document decode_body(const std::uint8_t* body, std::size_t size);

/// `body` behind a header and its hash, the way encode() wraps it (for the fuzzer and the tests).
std::string wrap_body(const std::string& body, const std::string& tripwire_version);

}  // namespace tripwire::core::codec

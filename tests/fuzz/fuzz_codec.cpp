// tripwire/tests/fuzz/fuzz_codec.cpp -- libFuzzer target for the serialization decoder.
//
// The first input byte picks what the rest is fed to:
//   0: decode() of the bytes as they are (header, hash and all);
//   1: decode() of the bytes wrapped in a valid header and content hash, so that mutations reach
//      the body parser instead of failing the hash check;
//   2: decode_body() directly.
// The rules:
//   - decode either returns a Document or throws codec::FormatError, whose message is UTF-8 text
//     (Python turns it into a str); any other exception (an allocation failure from a declared
//     length among them), a crash, a hang or a sanitizer report is a bug;
//   - a returned Document compiles (core::compile accepts every declaration decode accepted);
//   - it re-encodes, and decoding that gives a document that encodes to the same bytes again.
// Built with libFuzzer (TRIPWIRE_FUZZ, scripts/fuzz) or as a plain replay test (replay_main.cpp).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "core/codec/document.hpp"
#include "core/program.hpp"

namespace tripwire::core::codec {
namespace {

[[noreturn]] void bug(const char* what, const std::string& detail = "") {
    std::fprintf(stderr, "fuzz_codec: %s %s\n", what, detail.c_str());
    std::abort();
}

// Strict UTF-8 (what Python's decoder accepts): shortest forms, no surrogate, at most U+10FFFF.
bool is_text(const char* s) {
    const auto* p = reinterpret_cast<const unsigned char*>(s);
    while (*p != 0) {
        const unsigned c = *p;
        int n = 0;
        std::uint32_t cp = 0;
        if (c < 0x80) {
            ++p;
            continue;
        }
        if ((c & 0xE0) == 0xC0) {
            n = 1;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            n = 2;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            n = 3;
            cp = c & 0x07;
        } else {
            return false;
        }
        for (int k = 1; k <= n; ++k) {
            if ((p[k] & 0xC0) != 0x80) return false;  // also stops at the terminating NUL
            cp = (cp << 6) | (p[k] & 0x3F);
        }
        static constexpr std::uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
        if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        p += n + 1;
    }
    return true;
}

void check_document(const Document& doc) {
    std::vector<GuardDecl> decls;
    decls.reserve(doc.guards.size());
    for (const GuardRecord& g : doc.guards) decls.push_back(g.decl);
    try {
        (void)compile(std::move(decls), doc.constants.size());
    } catch (const InvalidProgram& e) {
        bug("decode accepted declarations that compile rejects:", e.what());
    }
    std::string once;
    try {
        once = encode(doc);
    } catch (const FormatError& e) {
        bug("a decoded document does not encode:", e.what());
    }
    Document again;
    try {
        again = decode(reinterpret_cast<const std::uint8_t*>(once.data()), once.size());
    } catch (const FormatError& e) {
        // The encoder writes each distinct string once, so its body may be smaller than the input's
        // (which may repeat strings) while naming the same strings as often: over the text budget
        // of the smaller body (TextBudget) is a refusal of that body, not a bug.
        const std::string why = e.what();
        if (why.find("names its strings for more than") != std::string::npos ||
            why.find("relation texts add up to more than") != std::string::npos)
            return;
        bug("an encoded document does not decode:", e.what());
    }
    if (encode(again) != once) bug("encode(decode(encode(doc))) differs from encode(doc)");
}

}  // namespace
}  // namespace tripwire::core::codec

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace tripwire::core::codec;  // NOLINT(google-build-using-namespace)
    if (size == 0) return 0;
    const std::uint8_t mode = data[0] % 3;
    const std::uint8_t* rest = data + 1;
    const std::size_t n = size - 1;
    try {
        Document doc;
        if (mode == 0) {
            doc = decode(rest, n);
        } else if (mode == 1) {
            const std::string wrapped =
                wrap_body(std::string(reinterpret_cast<const char*>(rest), n), "fuzz");
            doc = decode(reinterpret_cast<const std::uint8_t*>(wrapped.data()), wrapped.size());
        } else {
            doc = decode_body(rest, n);
        }
        check_document(doc);
    } catch (const FormatError& e) {
        // The expected outcome for most inputs. Its message becomes a Python str: it must be text.
        if (!is_text(e.what())) bug("a FormatError message is not UTF-8 text:", e.what());
    } catch (const std::exception& e) {
        bug("unexpected exception:", e.what());
    }
    return 0;
}

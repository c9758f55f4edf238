// tripwire/tests/cpp/test_shape.cpp -- the shape engine: exact integers, the parser, the compiled
// program, its fast and exact evaluators, and SHAPE guards in the tree compiler.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "core/program.hpp"
#include "core/shape/bigint.hpp"
#include "core/shape/parser.hpp"
#include "core/shape/program.hpp"
#include "testing.hpp"

// Every heap allocation of this test binary is counted (ShapeFrame.FastPathAllocatesNothing).
namespace {
std::atomic<long> g_allocations{0};
}  // namespace

void* operator new(std::size_t n) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n != 0 ? n : 1)) return p;
    throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace tripwire::core::shape {
namespace {

BigInt big(const std::string& s) {
    BigInt out;
    const bool neg = !s.empty() && s[0] == '-';
    EXPECT_TRUE(BigInt::from_decimal(neg ? s.substr(1) : s, out)) << s;
    return neg ? -out : out;
}

// ---------------------------------------------------------------------------------------------
// BigInt

TEST(BigInt, DecimalRoundTrip) {
    for (const char* s :
         {"0", "1", "-1", "9223372036854775807", "-9223372036854775808", "18446744073709551616",
          "-340282366920938463463374607431768211457", "100000000000000000000000000000"}) {
        EXPECT_EQ(big(s).to_string(), s);
    }
    BigInt out;
    EXPECT_FALSE(BigInt::from_decimal("", out));
    EXPECT_FALSE(BigInt::from_decimal("12a", out));
    EXPECT_EQ(big("000").to_string(), "0");
    // Nine digits per pass: every length around the chunk boundaries, against to_string.
    std::string digits = "1";
    for (int n = 1; n <= 40; ++n) {
        EXPECT_EQ(big(digits).to_string(), digits) << n;
        digits += static_cast<char>('0' + (n * 7) % 10);
    }
    EXPECT_EQ(big("1" + std::string(100, '0')).to_string(), "1" + std::string(100, '0'));
}

TEST(BigInt, Int64Boundaries) {
    std::int64_t v = 0;
    EXPECT_TRUE(BigInt(INT64_MIN).to_int64(v));
    EXPECT_EQ(v, INT64_MIN);
    EXPECT_TRUE(BigInt(INT64_MAX).to_int64(v));
    EXPECT_EQ(v, INT64_MAX);
    EXPECT_FALSE((BigInt(INT64_MAX) + BigInt(1)).to_int64(v));
    EXPECT_FALSE((BigInt(INT64_MIN) - BigInt(1)).to_int64(v));
    EXPECT_EQ((BigInt(INT64_MIN) - BigInt(1)).to_string(), "-9223372036854775809");
    EXPECT_EQ((-BigInt(INT64_MIN)).to_string(), "9223372036854775808");
}

TEST(BigInt, ArithmeticMatchesPython) {
    // Values computed with Python.
    EXPECT_EQ((big("123456789012345678901234567890") * big("-987654321098765432109876543210")).to_string(),
              "-121932631137021795226185032733622923332237463801111263526900");
    EXPECT_EQ((big("340282366920938463463374607431768211456") - big("1")).to_string(),
              "340282366920938463463374607431768211455");
    BigInt q, r;
    BigInt::floor_divmod(big("-7"), big("2"), &q, &r);
    EXPECT_EQ(q.to_string(), "-4");
    EXPECT_EQ(r.to_string(), "1");
    BigInt::floor_divmod(big("7"), big("-2"), &q, &r);
    EXPECT_EQ(q.to_string(), "-4");
    EXPECT_EQ(r.to_string(), "-1");
    BigInt::floor_divmod(big("-7"), big("-2"), &q, &r);
    EXPECT_EQ(q.to_string(), "3");
    EXPECT_EQ(r.to_string(), "-1");
    // Multi-limb division (Knuth D, including the add-back step on some of these).
    BigInt::floor_divmod(big("1000000000000000000000000000000000000000"), big("-12345678901234567890123"), &q,
                         &r);
    EXPECT_EQ(q.to_string(), "-81000000729000007");
    EXPECT_EQ(r.to_string(), "-4519715300541642230861");
    BigInt::floor_divmod(big("340282366920938463463374607431768211455"), big("18446744073709551617"), &q, &r);
    EXPECT_EQ(q.to_string(), "18446744073709551615");
    EXPECT_EQ(r.to_string(), "0");
}

TEST(BigInt, DivisionAgainstMultiplication) {
    // q*b + r == a and 0 <= |r| < |b| with r of b's sign, over many limb patterns.
    std::uint64_t seed = 88172645463325252ULL;
    auto next = [&] {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        return seed;
    };
    for (int trial = 0; trial < 2000; ++trial) {
        BigInt a(static_cast<std::int64_t>(next())), b(static_cast<std::int64_t>(next() >> (next() % 63)));
        for (int k = static_cast<int>(next() % 4); k > 0; --k)
            a = a * BigInt(static_cast<std::int64_t>(next() | 1));
        for (int k = static_cast<int>(next() % 3); k > 0; --k)
            b = b * BigInt(static_cast<std::int64_t>(next() | 1));
        if (b.is_zero()) continue;
        BigInt q, r;
        BigInt::floor_divmod(a, b, &q, &r);
        EXPECT_EQ(q * b + r, a);
        EXPECT_LT(compare(r.abs(), b.abs()), 0);
        EXPECT_TRUE(r.is_zero() || r.negative() == b.negative());
    }
}

TEST(BigInt, ToDoubleRoundsHalfToEven) {
    double d = 0;
    EXPECT_TRUE(big("9007199254740993").to_double(d));  // 2**53 + 1: a tie, down to even
    EXPECT_EQ(d, 9007199254740992.0);
    EXPECT_TRUE(big("9007199254740995").to_double(d));  // 2**53 + 3: a tie, up to even
    EXPECT_EQ(d, 9007199254740996.0);
    // 2**80 + 2**27 + 1: above the tie because of the lowest bit (the sticky bit matters).
    EXPECT_TRUE(big("1208925819614629308923905").to_double(d));
    EXPECT_EQ(d, std::ldexp(1.0, 80) + std::ldexp(1.0, 28));
    EXPECT_TRUE(big("-1208925819614629174706176").to_double(d));
    EXPECT_EQ(d, -std::ldexp(1.0, 80));
    // Overflow: 2**1024 does not fit; the largest double does.
    BigInt two1024 = BigInt(1).shifted_left(1024);
    EXPECT_FALSE(two1024.to_double(d));
    BigInt max_double;
    ASSERT_TRUE(BigInt::from_integral_double(std::numeric_limits<double>::max(), max_double));
    EXPECT_TRUE(max_double.to_double(d));
    EXPECT_EQ(d, std::numeric_limits<double>::max());
    // Rounds up to 2**1024: OverflowError in Python.
    EXPECT_FALSE((two1024 - BigInt(1)).to_double(d));
}

TEST(BigInt, TrueDivideIsCorrectlyRounded) {
    double d = 0;
    EXPECT_TRUE(BigInt::true_divide(big("1"), big("3"), d));
    EXPECT_EQ(d, 1.0 / 3.0);
    // Python: (10**30) / 3 == 3.333333333333333e+29
    EXPECT_TRUE(BigInt::true_divide(big("1000000000000000000000000000000"), big("3"), d));
    EXPECT_EQ(d, 3.333333333333333e+29);
    // Python: (2**60 + 1) / (2**60) == 1.0 ; (2**54 + 3) / 2 == 9007199254740994.0
    EXPECT_TRUE(BigInt::true_divide(big("1152921504606846977"), big("1152921504606846976"), d));
    EXPECT_EQ(d, 1.0);
    EXPECT_TRUE(BigInt::true_divide(big("18014398509481987"), big("2"), d));
    EXPECT_EQ(d, 9007199254740994.0);
    // Sign of a zero quotient follows the divisor, as in Python (0 / -5 == -0.0).
    EXPECT_TRUE(BigInt::true_divide(big("0"), big("-5"), d));
    EXPECT_TRUE(std::signbit(d));
    // Tiny quotients round once, at the subnormal grid: 1 / 2**1075 is 0.0 (a tie, to even),
    // 3 / 2**1076 rounds up to the smallest subnormal.
    EXPECT_TRUE(BigInt::true_divide(big("1"), BigInt(1).shifted_left(1075), d));
    EXPECT_EQ(d, 0.0);
    EXPECT_TRUE(BigInt::true_divide(big("3"), BigInt(1).shifted_left(1076), d));
    EXPECT_EQ(d, std::numeric_limits<double>::denorm_min());
    EXPECT_FALSE(BigInt::true_divide(BigInt(1).shifted_left(1100), big("3"), d));
}

TEST(BigInt, CompareWithDoubleIsExact) {
    const BigInt p53 = big("9007199254740993");            // 2**53 + 1
    EXPECT_EQ(p53.compare_double(9007199254740992.0), 1);  // a rounding comparison would say equal
    EXPECT_EQ(big("5").compare_double(5.5), -1);
    EXPECT_EQ(big("-5").compare_double(-5.5), 1);
    EXPECT_EQ(big("-5").compare_double(-5.0), 0);
    EXPECT_EQ(BigInt(1).shifted_left(2000).compare_double(std::numeric_limits<double>::infinity()), -1);
    EXPECT_EQ(BigInt(1).shifted_left(2000).compare_double(1e308), 1);
}

// ---------------------------------------------------------------------------------------------
// Parser

TEST(ShapeParser, TorchSpellings) {
    const ParsedRelation r = parse_relation("((6*L['x'].size()[0]) % 4) == 0  # z = x.reshape(-1, 4)");
    ASSERT_EQ(r.symbols.size(), 1u);
    EXPECT_EQ(r.symbols[0], "L['x'].size()[0]");
    EXPECT_EQ(r.code_end, std::string("((6*L['x'].size()[0]) % 4) == 0").size());
    EXPECT_EQ(r.nodes[r.root].op, Op::Eq);

    const ParsedRelation chain = parse_relation("2 <= L['x'].size()[0] <= 1024");
    EXPECT_EQ(chain.nodes[chain.root].op, Op::And);
    ASSERT_EQ(chain.spans.size(), 1u);  // the middle operand is parsed once

    const ParsedRelation nan = parse_relation("not math.isnan(L['s'])  # implicit guard for float input");
    EXPECT_EQ(nan.nodes[nan.root].op, Op::Not);
    EXPECT_EQ(nan.symbols[0], "L['s']");

    const ParsedRelation sympy = parse_relation("Eq(Mod(L['a'], 8), 0)");
    EXPECT_EQ(sympy.nodes[sympy.root].op, Op::Eq);
    EXPECT_EQ(sympy.nodes[sympy.nodes[sympy.root].args[0]].op, Op::Mod);
}

TEST(ShapeParser, SourcesAreWholePostfixChains) {
    const ParsedRelation r = parse_relation(
        "L['x'].size(0) + L['self'].layers[0].n + getattr(L['o'], 'a-b') + dict.__getitem__(L['d'], 'k') "
        "+ L['x'].stride()[1] + L['x'].storage_offset() + L['x'].shape[2] + G['g'] > 0");
    const std::vector<std::string_view> want = {"L['x'].size(0)",         "L['self'].layers[0].n",
                                                "getattr(L['o'], 'a-b')", "dict.__getitem__(L['d'], 'k')",
                                                "L['x'].stride()[1]",     "L['x'].storage_offset()",
                                                "L['x'].shape[2]",        "G['g']"};
    EXPECT_EQ(r.symbols, want);
    // A '#' inside a string key is not a comment; one outside is.
    const ParsedRelation key = parse_relation("L['a#b'] > 0 # note");
    EXPECT_EQ(key.symbols[0], "L['a#b']");
}

TEST(ShapeParser, Precedence) {
    // -a ** 2 is -(a ** 2); a ** -1 is a ** (-1); not binds looser than ==.
    ParsedRelation r = parse_relation("-L['a'] ** 2 == 4");
    const AstNode& lhs = r.nodes[r.nodes[r.root].args[0]];
    EXPECT_EQ(lhs.op, Op::Neg);
    EXPECT_EQ(r.nodes[lhs.args[0]].op, Op::Pow);
    r = parse_relation("not L['a'] == 1 and L['b'] < 2 or L['c'] > 3");
    EXPECT_EQ(r.nodes[r.root].op, Op::Or);
    EXPECT_EQ(r.nodes[r.nodes[r.root].args[0]].op, Op::And);
    r = parse_relation("L['a'] + L['b'] * L['c'] // 2 == 1");
    const AstNode& sum = r.nodes[r.nodes[r.root].args[0]];
    EXPECT_EQ(sum.op, Op::Add);
    EXPECT_EQ(r.nodes[sum.args[1]].op, Op::FloorDiv);
    r = parse_relation("(L['a'] if L['b'] > 0 else 3) == 2");
    EXPECT_EQ(r.nodes[r.nodes[r.root].args[0]].op, Op::Select);
}

void expect_error(const std::string& text, std::size_t offset, const std::string& fragment) {
    try {
        parse_relation(text);
        ADD_FAILURE() << "no error for: " << text;
    } catch (const ShapeSyntaxError& e) {
        EXPECT_EQ(e.offset(), offset) << text << ": " << e.what();
        EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << text << ": " << e.what();
    }
}

TEST(ShapeParser, ErrorsHaveOffsets) {
    expect_error("", 0, "empty");
    expect_error("   # only a comment", 3, "empty");
    expect_error("L['x'] ==", 9, "expected an operand");
    expect_error("L['x'] == (1 + 2", 16, "expected ')' (opened at offset 10)");
    expect_error("L['x'] @ 2", 7, "unexpected '@'");
    expect_error("foo(L['x']) > 1", 0, "unknown function 'foo'");
    expect_error("x > 1", 0, "unknown name 'x'");
    expect_error("L['x > 1", 2, "unterminated string");
    // The groups of printed sources have a fast path in the parser: escapes and newlines in a key
    // leave it for the general scan, which says what it always said.
    expect_error("L['a\\'] == 1", 2, "unterminated string");
    expect_error("L['x'].size()[0] + L['a\\'] > 1", 21, "unterminated string");
    expect_error("L['a\nb'] > 1", 2, "unterminated string");
    expect_error("L['x'][0) > 1", 8, "unmatched ')'");
    EXPECT_EQ(parse_relation("L['a\\']'] == 1").symbols.at(0), "L['a\\']']");
    EXPECT_EQ(parse_relation("L['a#b)'][12]() > 1").symbols.at(0), "L['a#b)'][12]()");
    expect_error("L['x']] > 1", 6, "unexpected ']'");
    expect_error("max(L['x']) > 1", 0, "max() takes at least 2 arguments");
    expect_error("007 < L['x']", 0, "leading zeros");
    expect_error("1.5.2 < L['x']", 3, "malformed number");
    expect_error("L['x'] if 1 > 0 L['y']", 16, "expected 'else'");
    expect_error(std::string(300, '(') + "1" + std::string(300, ')') + " == 1", 100, "nested more than");
    expect_error("L[" + std::string(300, '[') + "'x'" + std::string(300, ']') + "] > 1", 201,
                 "nested more than");
}

TEST(ShapeParser, Literals) {
    ParsedRelation r = parse_relation("L['x'] < 123456789012345678901234567890");
    EXPECT_EQ(r.int_literal(r.nodes[r.nodes[r.root].args[1]]).to_string(), "123456789012345678901234567890");
    r = parse_relation("L['x'] < 9223372036854775807");
    EXPECT_EQ(r.nodes[r.nodes[r.root].args[1]].big_int, 0U);
    EXPECT_EQ(r.nodes[r.nodes[r.root].args[1]].int_small, INT64_MAX);
    r = parse_relation("L['x'] < 1e400");
    EXPECT_TRUE(std::isinf(r.nodes[r.nodes[r.root].args[1]].float_value));
    r = parse_relation("L['x'] < 1e-400");
    EXPECT_EQ(r.nodes[r.nodes[r.root].args[1]].float_value, 0.0);
    r = parse_relation("L['x'] < 0.1");
    EXPECT_EQ(r.nodes[r.nodes[r.root].args[1]].float_value, 0.1);
    r = parse_relation("L['x'] != math.nan");
    EXPECT_TRUE(std::isnan(r.nodes[r.nodes[r.root].args[1]].float_value));
    // The largest literal of kMaxIntLiteralDigits digits converts; one digit more is refused by the
    // parser before any conversion, whatever its length (a 10 MB literal took seconds to refuse).
    const std::string most(kMaxIntLiteralDigits, '9');
    r = parse_relation("L['x'] < " + most);
    EXPECT_EQ(r.int_literal(r.nodes[r.nodes[r.root].args[1]]).to_string(), most);
    for (const std::size_t n : {kMaxIntLiteralDigits + 1, std::size_t{10} << 20}) {
        try {
            (void)parse_relation("L['x'] < " + std::string(n, '7'));
            ADD_FAILURE() << n;
        } catch (const ShapeSyntaxError& e) {
            EXPECT_EQ(std::string(e.what()), "int literal over 65536 bits") << n;
            EXPECT_EQ(e.offset(), 9U);
        }
    }
    // Zeros are one value however many (Python reads 000 as 0).
    r = parse_relation("L['x'] < " + std::string(kMaxIntLiteralDigits + 5, '0'));
    EXPECT_EQ(r.nodes[r.nodes[r.root].args[1]].int_small, 0);
}

TEST(ShapeParser, ManySymbolsAreNumberedInOrderOfFirstUse) {
    // Past kScannedSymbols distinct symbols the parser finds them through a table: the numbering
    // must be the scan's (first use), repeats included.
    std::string text;
    for (int k = 0; k < 200; ++k)
        text += "L['a" + std::to_string(k) + "'] + L['a" + std::to_string(k / 2) + "'] + ";
    text += "1 >= 0";
    const ParsedRelation r = parse_relation(text);
    ASSERT_EQ(r.symbols.size(), 200U);
    for (int k = 0; k < 200; ++k) EXPECT_EQ(r.symbols[k], "L['a" + std::to_string(k) + "']") << k;
    ASSERT_EQ(r.spans.size(), 400U);
    for (std::size_t k = 0; k < 200; ++k) {
        EXPECT_EQ(r.spans[2 * k].symbol, static_cast<std::uint32_t>(k));
        EXPECT_EQ(r.spans[2 * k + 1].symbol, static_cast<std::uint32_t>(k / 2));
    }
}

// ---------------------------------------------------------------------------------------------
// Compiled programs

struct Sym {
    ValueType type;
    std::optional<std::int64_t> i;
    std::optional<double> f;
    std::optional<BigInt> b;
};
Sym I(std::int64_t v) { return {ValueType::Int, v, std::nullopt, std::nullopt}; }
Sym F(double v) { return {ValueType::Float, std::nullopt, v, std::nullopt}; }
Sym B(const std::string& v) { return {ValueType::Int, std::nullopt, std::nullopt, big(v)}; }

struct Outcome {
    bool holds;
    bool fast_decided;
    std::string error;
};

// Compile one relation over symbols named in order of first appearance, evaluate both ways, and
// check the fast path (when it decides) agrees with the exact one.
Outcome eval(const std::string& text, const std::vector<Sym>& syms) {
    std::vector<ValueType> types;
    RelationInput in;
    in.id = 0;
    in.text = text;
    for (std::uint32_t k = 0; k < syms.size(); ++k) {
        types.push_back(syms[k].type);
        in.symbols.push_back(k);
    }
    const ShapeProgram p = compile_relations({in}, types);
    validate_shape(p);
    ShapeFrame f(p);
    for (std::uint32_t k = 0; k < syms.size(); ++k) {
        if (syms[k].i) f.set_int(k, *syms[k].i);
        if (syms[k].f) f.set_float(k, *syms[k].f);
        if (syms[k].b) f.set_big(k, *syms[k].b);
    }
    const std::vector<ExactResult> exact = run_exact(p, f);
    const std::int32_t fast = run_fast(p, f);
    Outcome out{exact[0].holds, fast != kShapeUndecided, exact[0].error};
    if (fast != kShapeUndecided) {
        EXPECT_EQ(fast == kShapePass, exact[0].holds) << text;
    }
    return out;
}

TEST(ShapeEval, TorchReshapeRelations) {
    EXPECT_TRUE(eval("((6*L['x'].size()[0]) % 4) == 0", {I(2)}).holds);
    const Outcome o = eval("((6*L['x'].size()[0]) % 4) == 0", {I(9)});
    EXPECT_FALSE(o.holds);
    EXPECT_TRUE(o.fast_decided);
    EXPECT_TRUE(eval("(6*L['x'].size()[0]) == (4*((3*L['x'].size()[0]) // 2))", {I(4)}).holds);
    EXPECT_TRUE(eval("(L['x'].size()[0] // 2) <= L['y'].size()[0]", {I(9), I(4)}).holds);
    EXPECT_FALSE(eval("(L['x'].size()[0] // 2) <= L['y'].size()[0]", {I(10), I(4)}).holds);
    EXPECT_TRUE(eval("2 <= L['y'].size()[0]", {I(2)}).holds);
    EXPECT_FALSE(eval("2 <= L['y'].size()[0] <= 4", {I(5)}).holds);
}

TEST(ShapeEval, PythonIntegerSemantics) {
    EXPECT_TRUE(eval("L['a'] // L['b'] == -4", {I(-7), I(2)}).holds);
    EXPECT_TRUE(eval("L['a'] % L['b'] == 1", {I(-7), I(2)}).holds);
    EXPECT_TRUE(eval("L['a'] % L['b'] == -1", {I(7), I(-2)}).holds);
    EXPECT_TRUE(eval("PythonMod(L['a'], L['b']) == -1", {I(7), I(-2)}).holds);
    EXPECT_TRUE(eval("CleanDiv(L['a'], L['b']) == -4", {I(7), I(-2)}).holds);
    EXPECT_TRUE(eval("L['a'] % -1 == 0", {I(INT64_MIN)}).holds);
    EXPECT_TRUE(eval("L['a'] ** 3 == -27", {I(-3)}).holds);
    EXPECT_TRUE(eval("max(L['a'], L['b'], 7) == 7 and min(L['a'], L['b']) == -3", {I(-3), I(5)}).holds);
    EXPECT_TRUE(eval("abs(L['a']) == 3", {I(-3)}).holds);
    EXPECT_TRUE(eval("L['a'] / L['b'] == 2.5", {I(5), I(2)}).holds);
    EXPECT_TRUE(eval("IntTrueDiv(L['a'], L['b']) < 0", {I(5), I(-2)}).holds);
}

TEST(ShapeEval, OverflowFallsBackToExactIntegers) {
    // 2**62 * 4 overflows int64; the exact path gets 2**64.
    Outcome o = eval("L['a'] * 4 == 18446744073709551616", {I(std::int64_t{1} << 62)});
    EXPECT_TRUE(o.holds);
    EXPECT_FALSE(o.fast_decided);
    // Values beyond int64.
    o = eval("L['a'] - 1 == 9223372036854775807", {B("9223372036854775808")});
    EXPECT_TRUE(o.holds);
    EXPECT_FALSE(o.fast_decided);
    EXPECT_TRUE(eval("L['a'] // 3 == -3074457345618258603", {I(INT64_MIN)}).holds);
    EXPECT_TRUE(eval("-L['a'] == 9223372036854775808", {I(INT64_MIN)}).holds);
    EXPECT_TRUE(eval("L['a'] // -1 == 9223372036854775808", {I(INT64_MIN)}).holds);
    EXPECT_TRUE(eval("L['a'] ** 2 > L['a']", {I(INT64_MAX)}).holds);
    // Over the bit limit: fails closed with a reason.
    o = eval("L['a'] ** 100000 > 0", {I(3)});
    EXPECT_FALSE(o.holds);
    EXPECT_NE(o.error.find("65536 bits"), std::string::npos);
    EXPECT_TRUE(eval("L['a'] ** 100000 == 1", {I(-1)}).holds);
}

TEST(ShapeEval, ErrorsFailTheRelationUnlessShortCircuited) {
    Outcome o = eval("L['a'] // L['b'] == 0", {I(1), I(0)});
    EXPECT_FALSE(o.holds);
    EXPECT_NE(o.error.find("ZeroDivisionError"), std::string::npos);
    // Python never evaluates the right side of a false `and`.
    o = eval("L['b'] != 0 and L['a'] // L['b'] == 0", {I(0), I(1)});  // symbols in order of first use
    EXPECT_FALSE(o.holds);
    EXPECT_TRUE(o.error.empty());
    o = eval("L['b'] == 0 or L['a'] % L['b'] == 1", {I(0), I(1)});
    EXPECT_TRUE(o.holds);
    o = eval("(1 if L['b'] == 0 else L['a'] // L['b']) == 1", {I(0), I(1)});
    EXPECT_TRUE(o.holds);
    o = eval("L['a'] ** L['b'] == 1", {I(2), I(-1)});
    EXPECT_FALSE(o.holds);
    EXPECT_NE(o.error.find("natural exponent"), std::string::npos);
}

TEST(ShapeEval, Floats) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double inf = std::numeric_limits<double>::infinity();
    EXPECT_FALSE(eval("not math.isnan(L['s'])", {F(nan)}).holds);
    EXPECT_TRUE(eval("not math.isnan(L['s'])", {F(inf)}).holds);
    EXPECT_TRUE(eval("L['s'] != L['s']", {F(nan)}).holds);
    EXPECT_FALSE(eval("L['s'] == L['s']", {F(nan)}).holds);
    EXPECT_FALSE(eval("L['s'] < 1 or L['s'] >= 1", {F(nan)}).holds);
    EXPECT_TRUE(eval("L['s'] // 0.5 == 5.0", {F(2.75)}).holds);
    EXPECT_TRUE(eval("L['s'] % -2.0 == -1.0", {F(5.0)}).holds);
    EXPECT_TRUE(
        eval("math.floor(L['s']) == -3 and math.ceil(L['s']) == -2 and int(L['s']) == -2", {F(-2.5)}).holds);
    EXPECT_TRUE(eval("round(L['s']) == 2", {F(2.5)}).holds);
    EXPECT_TRUE(eval("round(L['s']) == 4", {F(3.5)}).holds);
    EXPECT_FALSE(eval("math.floor(L['s']) > 0", {F(inf)}).holds);
    EXPECT_TRUE(eval("math.floor(L['s']) > 10**300", {F(1e301)}).holds);
    EXPECT_TRUE(eval("L['n'] + L['s'] == 3.5", {I(3), F(0.5)}).holds);
    // int/float comparisons are exact: 2**53 + 1 > 2.0**53.
    EXPECT_TRUE(eval("L['n'] > L['s']", {I((std::int64_t{1} << 53) + 1), F(9007199254740992.0)}).holds);
    EXPECT_TRUE(eval("L['n'] > L['s']", {B("100000000000000000000000"), F(1e22)}).holds);
    EXPECT_FALSE(eval("L['n'] < L['s']", {I(1), F(nan)}).holds);
    EXPECT_TRUE(eval("L['n'] != L['s']", {I(1), F(nan)}).holds);
    EXPECT_FALSE(eval("L['s'] / 0.0 > 0", {F(1.0)}).holds);
    // float(int) overflows for huge ints: Python raises.
    const Outcome o = eval("float(L['n']) > 0", {B("1" + std::string(400, '0'))});
    EXPECT_FALSE(o.holds);
    EXPECT_NE(o.error.find("OverflowError"), std::string::npos);
    EXPECT_TRUE(eval("torch.sym_float(L['n']) / 2 == 1.5", {I(3)}).holds);
}

TEST(ShapeEval, TypeErrorsHaveOffsets) {
    auto type_error_at = [](const std::string& text, const std::vector<ValueType>& types,
                            std::size_t offset) {
        RelationInput in;
        in.text = text;
        for (std::uint32_t k = 0; k < types.size(); ++k) in.symbols.push_back(k);
        try {
            compile_relations({in}, types);
            ADD_FAILURE() << "no error for " << text;
        } catch (const ShapeSyntaxError& e) {
            EXPECT_EQ(e.offset(), offset) << text << ": " << e.what();
        }
    };
    // Operations point at their operator, calls at their name.
    type_error_at("L['s'] ** 2 > 1", {ValueType::Float}, 7);
    type_error_at("L['n'] + 1", {ValueType::Int}, 7);
    type_error_at("(L['n'] < 1) + 1 > 0", {ValueType::Int}, 13);
    type_error_at("max(L['n'], L['s']) > 0", {ValueType::Int, ValueType::Float}, 0);
    type_error_at("L['n'] > 0 and L['n']", {ValueType::Int}, 11);
    type_error_at("1 < 2 < (L['n'] < 3)", {ValueType::Int}, 6);
    type_error_at("IntTrueDiv(L['s'], 2) > 0", {ValueType::Float}, 0);
}

TEST(ShapeProgram, SharesSubexpressionsAcrossRelations) {
    std::vector<RelationInput> rels;
    const char* texts[] = {"((L['x'] * L['y']) % 4) == 0", "(L['y'] * L['x']) // 4 != L['x']",
                           "((L['x'] * L['y']) // 4) >= 2"};
    for (std::uint32_t k = 0; k < 3; ++k) rels.push_back({k, texts[k], {0, 1}});
    const ShapeProgram p = compile_relations(rels, {ValueType::Int, ValueType::Int});
    int muls = 0, floordivs = 0;
    for (const ShapeNode& n : p.nodes) {
        muls += n.code == Code::IMul;
        floordivs += n.code == Code::IFloorDiv;
    }
    EXPECT_EQ(muls, 1);  // x*y and y*x are one node
    EXPECT_EQ(floordivs, 1);
    EXPECT_EQ(p.kept.size(), 3u);
}

TEST(ShapeProgram, MergesDuplicatesAndDropsImpliedBounds) {
    std::vector<RelationInput> rels = {
        {0, "4 <= L['x']", {0}},           // kept
        {1, "2 <= L['x']", {0}},           // implied by #0
        {2, "4 <= L['x']  # again", {0}},  // merged into #0
        {3, "L['x'] >= 4", {0}},           // the same node as #0 after operand ordering: merged
        {4, "3 < L['x'] <= 10", {0}},      // 4 <= x is known, x <= 10 is new: kept
        {5, "L['x'] < 20", {0}},           // x <= 19 implied by x <= 10
        {6, "L['x'] % 2 == 0", {0}},       // not a bound: kept
        {7, "L['x'] == 7", {0}},           // tighter than both bounds: kept
    };
    const ShapeProgram p = compile_relations(rels, {ValueType::Int});
    auto status = [&](std::uint32_t id) { return p.relations[id].status; };
    EXPECT_EQ(status(0), RelationStatus::Kept);
    EXPECT_EQ(status(1), RelationStatus::Implied);
    EXPECT_EQ(p.relations[1].by, 0u);
    EXPECT_EQ(status(2), RelationStatus::Merged);
    EXPECT_EQ(status(3), RelationStatus::Merged);
    EXPECT_EQ(status(4), RelationStatus::Kept);
    EXPECT_EQ(status(5), RelationStatus::Implied);
    EXPECT_EQ(p.relations[5].by, 4u);
    EXPECT_EQ(status(6), RelationStatus::Kept);
    EXPECT_EQ(status(7), RelationStatus::Kept);
    EXPECT_EQ(p.kept.size(), 4u);
    EXPECT_EQ(p.relations[2].text, "4 <= L['x']");  // the comment is not part of the relation
    // Whenever a dropped relation fails, an earlier kept one does too.
    for (std::int64_t x = -5; x < 25; ++x) {
        ShapeFrame f(p);
        f.set_int(0, x);
        const std::int32_t first = first_failing(p, f);
        const bool r1 = 2 <= x, r5 = x < 20;
        if (!r1 || !r5) {
            ASSERT_GE(first, 0);
            EXPECT_LT(p.relations[static_cast<std::uint32_t>(first)].id, !r1 ? 1u : 5u);
        }
    }
}

TEST(ShapeProgram, ConstantsFoldAndBigConstantsDisableTheFastPath) {
    ShapeProgram p = compile_relations({{0, "L['x'] < 2 ** 10 * 3", {0}}}, {ValueType::Int});
    int consts = 0;
    for (const ShapeNode& n : p.nodes) consts += n.code == Code::Const;
    EXPECT_EQ(consts, 1);  // 3072
    EXPECT_TRUE(p.fast_ok);
    p = compile_relations({{0, "L['x'] < 2 ** 70", {0}}}, {ValueType::Int});
    EXPECT_FALSE(p.fast_ok);
    ShapeFrame f(p);
    f.set_int(0, 5);
    EXPECT_EQ(run_fast(p, f), kShapeUndecided);
    EXPECT_EQ(first_failing(p, f), -1);
    // A constant expression that raises stays in the program and fails when evaluated.
    p = compile_relations({{0, "L['x'] > 1 // 0", {0}}}, {ValueType::Int});
    ShapeFrame g(p);
    g.set_int(0, 5);
    EXPECT_EQ(first_failing(p, g), 0);
}

TEST(ShapeProgram, ValidateRejectsCorruption) {
    const ShapeProgram good =
        compile_relations({{0, "((6*L['x']) % 4) == 0", {0}}, {1, "L['x'] // L['y'] < 3", {0, 1}}},
                          {ValueType::Int, ValueType::Int});
    EXPECT_NO_THROW(validate_shape(good));
    for (int k = 0; k < 6; ++k) {
        ShapeProgram bad = good;
        switch (k) {
            case 0: bad.nodes.back().a = static_cast<std::uint32_t>(bad.nodes.size()); break;
            case 1: bad.code.front().dst = 0; break;
            case 2: bad.code.back().c = 99; break;
            case 3: bad.kept.push_back(0); break;
            case 4: bad.nodes[0].code = Code::Const; break;
            case 5: bad.const_regs.resize(bad.nodes.size() + 1); break;
        }
        EXPECT_THROW(validate_shape(bad), InvalidProgram) << k;
    }
}

// The inputs of `texts` (ids in order) with each symbol numbered by its place in `names`.
std::vector<RelationInput> relations_over(const std::vector<std::string>& texts,
                                          const std::vector<std::string_view>& names) {
    std::vector<RelationInput> rels;
    for (std::uint32_t k = 0; k < texts.size(); ++k) {
        const ParsedRelation r = parse_relation(texts[k]);
        RelationInput in{k, texts[k], {}};
        for (std::string_view sym : r.symbols) {
            in.symbols.push_back(
                static_cast<std::uint32_t>(std::find(names.begin(), names.end(), sym) - names.begin()));
        }
        rels.push_back(in);
    }
    return rels;
}

TEST(ShapeFrame, FastPathAllocatesNothing) {
    // A check stores its symbols and runs the relations without touching the heap: the frame
    // is inline (up to 96 registers and 32 symbols), int64 and float values go into registers.
    const std::vector<RelationInput> rels = relations_over(
        {"((6*L['a']) % 4) == 0", "(L['a'] // 2) <= L['c']", "(L['a']*L['b']) != ((L['a']*L['b']) // 4)",
         "2 <= L['d']", "not math.isnan(L['s'])", "L['s'] * 2 < L['a']"},
        {"L['a']", "L['b']", "L['c']", "L['d']", "L['s']"});
    const long compiling = g_allocations.load();
    const ShapeProgram p = compile_relations(
        rels, {ValueType::Int, ValueType::Int, ValueType::Int, ValueType::Int, ValueType::Float});
    EXPECT_GT(g_allocations.load() - compiling, 0);  // the counter counts (compiling allocates)
    const long before = g_allocations.load();
    std::int32_t result = 0;
    for (int i = 0; i < 1000; ++i) {
        ShapeFrame f(p);
        f.set_int(0, 24);
        f.set_int(1, 3);
        f.set_int(2, 40);
        f.set_int(3, 17);
        f.set_float(4, 0.5);
        result = first_failing(p, f);
    }
    EXPECT_EQ(result, -1);
    EXPECT_EQ(g_allocations.load() - before, 0);
}

TEST(ShapeFrame, RegistersAreWrittenBeforeTheyAreRead) {
    // A frame's registers are uninitialised except the constants' (the inline array as the heap
    // buffer of a large program): every computed register must be written by its instruction
    // before any instruction reads it. Computed registers are filled with two different poisons
    // before the stores; the decision must not change, and must agree with the exact path.
    // Small (inline) and large (heap, more than 96 registers) programs both.
    for (const int copies : {1, 12}) {
        std::vector<std::string> texts;
        static const char* const forms[] = {
            "((#*L['a']) % 4) != 3 or L['b'] == #", "(L['a'] // #) <= L['c'] + #",
            "(L['a']*L['b']) - # != ((L['a']*L['b']) // 4)", "(L['c'] % #) + L['d'] >= -# or L['d'] < 0"};
        for (int k = 0; k < copies; ++k) {
            for (const char* form : forms) {  // each '#' is this copy's constant
                std::string text;
                for (const char* ch = form; *ch != '\0'; ++ch) {
                    if (*ch == '#') {
                        text += std::to_string(k + 2);
                    } else {
                        text += *ch;
                    }
                }
                texts.push_back(text);
            }
        }
        const ShapeProgram p =
            compile_relations(relations_over(texts, {"L['a']", "L['b']", "L['c']", "L['d']"}),
                              std::vector<ValueType>(4, ValueType::Int));
        if (copies > 1) {
            ASSERT_GT(p.nodes.size(), 96U);  // the heap path
        } else {
            ASSERT_LE(p.nodes.size(), 96U);  // the inline path
        }
        ASSERT_TRUE(p.fast_ok);
        std::uint64_t seed = 7;
        const auto value = [&seed] {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            return static_cast<std::int64_t>((seed >> 33) % 41) - 20;
        };
        int passes = 0, fails = 0;
        for (int trial = 0; trial < 3000; ++trial) {
            const std::int64_t v[4] = {value(), value(), value(), value()};
            std::int32_t decided[2] = {0, 0};
            for (int poison = 0; poison < 2; ++poison) {
                ShapeFrame f(p);
                for (std::size_t n = p.const_regs.size(); n < p.nodes.size(); ++n) {
                    f.regs()[n].i = poison == 0 ? 0x5A5A5A5A5A5A5A5A : -1;
                }
                for (std::uint32_t s = 0; s < 4; ++s) f.set_int(s, v[s]);
                decided[poison] = run_fast(p, f);
                const std::vector<ExactResult> exact = run_exact(p, f);
                if (decided[poison] == kShapePass) {
                    for (std::uint32_t r : p.kept) EXPECT_TRUE(exact[r].holds) << texts[r];
                } else if (decided[poison] >= 0) {
                    EXPECT_FALSE(exact[static_cast<std::size_t>(decided[poison])].holds);
                }
            }
            EXPECT_EQ(decided[0], decided[1]) << v[0] << " " << v[1] << " " << v[2] << " " << v[3];
            (decided[0] == kShapePass ? passes : fails) += 1;
        }
        EXPECT_GT(passes, 100);  // both outcomes are exercised
        EXPECT_GT(fails, 100);
    }
}

// ---------------------------------------------------------------------------------------------
// SHAPE guards in the tree compiler

GuardDecl shape_guard(std::uint32_t id, const std::string& text, std::vector<SourcePath> symbols,
                      std::vector<std::uint8_t> types) {
    GuardDecl d;
    d.kind = GuardKind::Shape;
    d.has_source = false;
    d.id = id;
    d.relation = text;
    for (SourcePath& p : symbols) d.symbols.push_back(std::make_shared<const SourcePath>(std::move(p)));
    d.symbol_types = std::move(types);
    return d;
}

TEST(ShapeGuards, SymbolsAreTreeNodesSharedWithOtherGuards) {
    using test_util::local;
    const SourcePath x0 = local(0, {Step{StepKind::Size, kNoConst, 0}});
    const SourcePath y0 = local(1, {Step{StepKind::Size, kNoConst, 0}});
    std::vector<GuardDecl> decls;
    decls.push_back(test_util::on(0, local(0)));  // TYPE_MATCH on L['c0']
    decls.push_back(shape_guard(1, x0.texts.back() + " == " + y0.texts.back(), {x0, y0}, {0, 0}));
    decls.push_back(shape_guard(2, "2 <= " + x0.texts.back(), {x0}, {0}));
    const Program p = compile(decls, 4);
    EXPECT_EQ(p.shape.n_symbols(), 2u);
    EXPECT_EQ(p.shape_guards.size(), 2u);
    EXPECT_TRUE(p.ambient.empty());
    // L['c0'] is one node (TYPE_MATCH and the symbol's parent); L['c1'] and the two sizes.
    EXPECT_EQ(p.nodes.size(), 4u);
    const Node& sx = p.nodes[p.symbol_nodes[0]];
    EXPECT_EQ(sx.symbol, 0u);
    EXPECT_EQ(sx.min_guard_id, 1u);
    EXPECT_EQ(p.nodes[p.symbol_nodes[1]].min_guard_id, 1u);
    EXPECT_EQ(p.symbol_min_id, (std::vector<std::uint32_t>{1, 1}));
    // Sizes run user code (a Python call today), so the tree above them holds references.
    EXPECT_TRUE(p.nodes[0].subtree_runs_user_code);

    Program bad = p;
    bad.nodes[p.symbol_nodes[0]].symbol = kNoSymbol;
    EXPECT_THROW(validate(bad, 4), InvalidProgram);
    bad = p;
    bad.symbol_min_id[0] = 0;
    EXPECT_THROW(validate(bad, 4), InvalidProgram);
    bad = p;
    std::swap(bad.symbol_nodes[0], bad.symbol_nodes[1]);
    EXPECT_THROW(validate(bad, 4), InvalidProgram);
}

TEST(ShapeGuards, DeclarationsAreChecked) {
    using test_util::local;
    const SourcePath n = local(0);
    EXPECT_THROW(compile({shape_guard(0, "", {}, {})}, 2), InvalidProgram);
    EXPECT_THROW(compile({shape_guard(0, "L['c0'] > 1", {n}, {})}, 2), InvalidProgram);
    EXPECT_THROW(compile({shape_guard(0, "L['c0'] > 1", {n}, {2})}, 2), InvalidProgram);
    // Symbol count mismatch between the text and the bindings.
    EXPECT_THROW(compile({shape_guard(0, "L['c0'] > L['c1']", {n}, {0})}, 2), InvalidProgram);
    // One source, two types.
    EXPECT_THROW(
        compile({shape_guard(0, "L['c0'] > 1", {n}, {0}), shape_guard(1, "L['c0'] > 1.5", {n}, {1})}, 2),
        InvalidProgram);
    // Text errors keep their type (the caller reports the offset).
    EXPECT_THROW(compile({shape_guard(0, "L['c0'] >", {n}, {0})}, 2), ShapeSyntaxError);
    // A symbol without a source (a null shared path) is refused, never read.
    GuardDecl null_symbol = shape_guard(0, "L['c0'] > 1", {n}, {0});
    null_symbol.symbols[0] = nullptr;
    EXPECT_THROW(compile({null_symbol}, 2), InvalidProgram);
    EXPECT_THROW(validate_decl(null_symbol, 2), InvalidProgram);
    // Other kinds take no relation.
    GuardDecl t = test_util::on(0, n);
    t.relation = "1 < 2";
    EXPECT_THROW(compile({t}, 2), InvalidProgram);
}

}  // namespace
}  // namespace tripwire::core::shape

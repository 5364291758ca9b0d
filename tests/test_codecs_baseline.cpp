// Baseline KV codecs (kv/codecs/baseline.cpp): f32, f16, bf16, q8_0, q4_0, fp8.
//  * encode -> decode equals an independent scalar reference of METHODS.md ("Baselines") bit for
//    bit (and the packed bytes too where the format fixes them), on fresh random inputs and on
//    special cases (zeros, ties, subnormals, overflow / saturation, NaN).
//  * bits_per_element, token-wise block parameters, option and head_dim validation.
//  * the readers (scalar reference and AVX2) against decode-then-dot in double. Tolerance: the
//    readers sum in float in their own order (FMA, 8 lanes), so for each output
//        |got - exact| <= 1e-5 * (sum of |terms|)
//    where exact and the terms are computed in double from decode()'s values (and, for
//    accumulate, the initial accumulator counts as a term). A float sum of up to 128 terms has
//    a worst-case relative error (to sum |terms|) of ~128 * 2^-24 = 7.6e-6, so 1e-5 holds for
//    any summation order and catches every real mistake (a wrong value moves a result by ~1e-2).
//  * except the scores of q8_0 / q4_0 keys, which are llama.cpp's CPU flash-attention scores: the
//    query quantized to q8_0 (AVX2 quantize_row_q8_0 = ref_q8_0 below) and ggml_vec_dot_q8_0_q8_0
//    / q4_0_q8_0 (AVX2 branch). Both readers must equal ref_qdot (an independent scalar
//    reference of those operations) bit for bit, and stay within the query's quantization error
//    of decode-then-dot:
//        |got - exact| <= sum over blocks b of amax(q_b) / 127 * sum_{c in b} |k_c| + 1e-5 * sum |terms|
//    (|q_c - code_c * fp16(d)| <= d/2 + 127 * |d - fp16(d)| <= amax * (1/254 + 2^-11) < amax / 127).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "formats/ggml_types.h"
#include "support/isa.h"
#include "support/seed.h"
#include "kernels/cpu/kv_reader.h"
#include "kv/codec.h"

namespace vxq::codecs::detail {

// A CPU reader of a codec's format, with the codec's parameters (fp8's scale) bound.
struct BoundReader {
    const cpu::KvReader* r;
    const Codec* c;
    void scores(const float* q, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d, float* s) const {
        r->scores_of(c->params(d), q, n_q, blk, n, d, s);
    }
    void accumulate(const float* p, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d, float* acc) const {
        r->accumulate(c->params(d), p, n_q, blk, n, d, acc);
    }
};
BoundReader baseline_scalar_reader(const Codec& c) { return {cpu::kv_reader(c.params(64).kind, cpu::KvIsa::Scalar), &c}; }
// nullopt without AVX2 + FMA + F16C
std::optional<BoundReader> baseline_avx2_reader(const Codec& c) {
    const cpu::KvReader* r = cpu::kv_reader(c.params(64).kind, cpu::KvIsa::Avx2);
    if (!r) return std::nullopt;
    return BoundReader{r, &c};
}

}  // namespace vxq::codecs::detail

namespace vxq {
namespace {

using test::fresh_seed;

// The registry's baseline formats: every method whose blocks the baseline readers read.
const std::vector<std::string> kNames = [] {
    std::vector<std::string> out;
    for (const CodecInfo& info : list_codecs()) {
        const auto c = make_codec(CodecSpec::parse(info.variants.front()), KvRole::Key, 64);
        if (cpu::baseline_reader(c->params(64).kind, cpu::KvIsa::Scalar)) out.push_back(info.name);
    }
    return out;
}();

double registry_bits(const std::string& name) {
    for (const CodecInfo& info : list_codecs()) {
        if (info.name == name) return std::stod(info.bits);
    }
    return -1;
}

std::unique_ptr<Codec> make(const std::string& spec, int64_t d) {
    return make_codec(CodecSpec::parse(spec), KvRole::Key, d);
}

bool same_float(float a, float b) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
    return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

// ---- references (written from METHODS.md and ggml, independently of the codec code) ----------

// IEEE-754 round to nearest, ties to even, of x to a binary format with `mant` fraction bits,
// smallest normal exponent emin and largest finite value maxf (rounding beyond it: infinity).
double round_ieee(double x, int mant, int emin, double maxf) {
    if (std::isnan(x) || std::isinf(x)) return x;
    const double a = std::fabs(x);
    const int e = a == 0.0 ? emin : std::max(emin, std::ilogb(a));
    const double ulp = std::ldexp(1.0, e - mant);
    const double qv = a / ulp;  // exact: a has 24 significant bits, ulp is a power of two
    double r = std::floor(qv);
    const double f = qv - r;
    if (f > 0.5 || (f == 0.5 && std::fmod(r, 2.0) != 0.0)) r += 1.0;
    double v = r * ulp;
    if (v > maxf) v = std::numeric_limits<double>::infinity();
    return std::copysign(v, x);
}

double half_even(double v) {  // round half to even, for values of moderate size
    double r = std::floor(v);
    const double f = v - r;
    if (f > 0.5 || (f == 0.5 && std::fmod(r, 2.0) != 0.0)) r += 1.0;
    return r;
}

// e4m3fn by definition: (-1)^s * (e == 0 ? m * 2^-9 : (1 + m/8) * 2^(e-7)); e = 15, m = 7: NaN.
double e4m3_def(int code) {
    const int e = (code >> 3) & 15, m = code & 7;
    if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
    const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
    return (code & 0x80) ? -mag : mag;
}

// Nearest finite e4m3fn code by exhaustive search, ties to the even code (= even mantissa),
// saturating at +-448; NaN -> 0x7f with the sign.
uint8_t e4m3_ref(float y) {
    const uint8_t sign = std::signbit(y) ? 0x80 : 0x00;
    if (std::isnan(y)) return uint8_t(sign | 0x7f);
    const double a = std::fabs(double(y));
    if (a >= 448.0) return uint8_t(sign | 0x7e);
    int best = 0;
    double best_diff = std::numeric_limits<double>::infinity();
    for (int c = 0; c <= 0x7e; ++c) {
        const double diff = std::fabs(e4m3_def(c) - a);
        if (diff < best_diff || (diff == best_diff && c % 2 == 0)) {
            best = c;
            best_diff = diff;
        }
    }
    return uint8_t(sign | best);
}

struct Expected {
    std::vector<uint8_t> bytes;  // empty: the format's bytes are checked through the values only
    std::vector<float> values;   // decode(encode(x))
};

// x86 cvtps2dq + packs saturation, with half_even instead of the hardware rounding.
int8_t ref_q8(float v) {
    if (std::isnan(v) || std::fabs(v) >= 2147483648.0f) return -128;
    return int8_t(std::clamp(half_even(v), -128.0, 127.0));
}

// q8_0 as llama.cpp's CPU KV-cache write computes it on x86 (AVX2 quantize_row_q8_0).
Expected ref_q8_0(const float* x, int64_t d) {
    Expected e;
    for (int64_t b = 0; b < d / 32; ++b) {
        const float* xb = x + b * 32;
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::fabs(xb[j]) > amax ? std::fabs(xb[j]) : amax;
        const f16_t dh = fp32_to_fp16(amax / 127.0f);
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        e.bytes.push_back(uint8_t(dh & 0xff));
        e.bytes.push_back(uint8_t(dh >> 8));
        for (int j = 0; j < 32; ++j) {
            const int8_t q = ref_q8(xb[j] * id);
            e.bytes.push_back(uint8_t(q));
            e.values.push_back(float(q) * fp16_to_fp32(dh));
        }
    }
    return e;
}

// q4_0 per METHODS.md (ggml's quantize_row_q4_0_ref). Inputs must keep x*id + 8.5 in int8 range.
Expected ref_q4_0(const float* x, int64_t d) {
    Expected e;
    for (int64_t b = 0; b < d / 32; ++b) {
        const float* xb = x + b * 32;
        float amax = 0.0f, m = 0.0f;
        for (int j = 0; j < 32; ++j) {
            if (std::fabs(xb[j]) > amax) {  // the first value of largest magnitude
                amax = std::fabs(xb[j]);
                m = xb[j];
            }
        }
        const float dd = m / -8.0f;
        const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
        const f16_t dh = fp32_to_fp16(dd);
        int q[32];
        for (int j = 0; j < 32; ++j) {
            const float t = xb[j] * id + 8.5f;
            EXPECT_TRUE(t > -128.0f && t < 128.0f) << "reference input out of range";
            q[j] = std::min(15, int(int8_t(t)));
        }
        e.bytes.push_back(uint8_t(dh & 0xff));
        e.bytes.push_back(uint8_t(dh >> 8));
        for (int j = 0; j < 16; ++j) e.bytes.push_back(uint8_t(q[j] | (q[j + 16] << 4)));
        for (int j = 0; j < 32; ++j) e.values.push_back(float(q[j] - 8) * fp16_to_fp32(dh));
    }
    return e;
}

Expected ref_fp8(const float* x, int64_t d, float scale) {
    Expected e;
    for (int64_t c = 0; c < d; ++c) {
        const uint8_t code = e4m3_ref(x[c] / scale);
        e.bytes.push_back(code);
        e.values.push_back(float(e4m3_def(code)) * scale);
    }
    return e;
}

Expected reference(const std::string& name, const float* x, int64_t d, float fp8_scale) {
    Expected e;
    if (name == "q8_0") return ref_q8_0(x, d);
    if (name == "q4_0") return ref_q4_0(x, d);
    if (name == "fp8") return ref_fp8(x, d, fp8_scale);
    for (int64_t c = 0; c < d; ++c) {
        if (name == "f32") {
            e.values.push_back(x[c]);
        } else if (name == "f16") {
            e.values.push_back(float(round_ieee(x[c], 10, -14, 65504.0)));
        } else {  // bf16
            e.values.push_back(float(round_ieee(x[c], 7, -126, std::ldexp(2.0 - std::ldexp(1.0, -7), 127))));
        }
    }
    if (name == "f32") {
        e.bytes.resize(size_t(d) * 4);
        std::memcpy(e.bytes.data(), x, e.bytes.size());
    }
    return e;
}

// encode + decode of one token against the reference: bytes (where fixed) and values, bit for bit.
void check_token(const std::string& name, const Codec& codec, const std::vector<float>& x, float fp8_scale,
                 const std::string& what) {
    const int64_t d = int64_t(x.size());
    std::vector<uint8_t> blk(codec.block_bytes(d));
    codec.encode(x.data(), d, blk.data());
    std::vector<float> y(size_t(d), -12345.0f);
    codec.decode(blk.data(), d, y.data());
    const Expected e = reference(name, x.data(), d, fp8_scale);
    if (!e.bytes.empty()) {
        ASSERT_EQ(e.bytes.size(), blk.size()) << name;
        for (size_t i = 0; i < blk.size(); ++i) {
            ASSERT_EQ(int(e.bytes[i]), int(blk[i])) << name << " " << what << ": byte " << i;
        }
    }
    ASSERT_EQ(e.values.size(), y.size());
    for (size_t c = 0; c < y.size(); ++c) {
        ASSERT_TRUE(same_float(e.values[c], y[c]))
            << name << " " << what << ": value " << c << " x=" << x[c] << " decoded " << y[c] << " expected "
            << e.values[c];
    }
}

// ---- block parameters, options ---------------------------------------------------------------

TEST(CodecBaseline, BitsPerElementAndTokenWiseBlocks) {
    ASSERT_GE(kNames.size(), 6u);
    for (size_t i = 0; i < kNames.size(); ++i) {
        for (const int64_t d : {64, 128}) {
            for (const KvRole role : {KvRole::Key, KvRole::Value}) {
                const auto c = make_codec(CodecSpec::parse(kNames[i]), role, d);
                EXPECT_EQ(c->spec(), kNames[i]);
                EXPECT_EQ(c->block_tokens(), 1);
                EXPECT_EQ(c->flush_at(), 1);
                EXPECT_EQ(c->flush_count(), 1);
                EXPECT_DOUBLE_EQ(c->bits_per_element(d), registry_bits(kNames[i])) << kNames[i] << " d=" << d;
            }
        }
    }
    EXPECT_EQ(make("q8_0", 128)->block_bytes(128), 4 * sizeof(BlockQ8_0));
    EXPECT_EQ(make("q4_0", 128)->block_bytes(128), 4 * sizeof(BlockQ4_0));
}

TEST(CodecBaseline, OptionsAreRejected) {
    for (const std::string& name : kNames) {
        try {
            make(std::string(name) + ":bits=4", 128);
            ADD_FAILURE() << name << " accepted an option";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("bits"), std::string::npos) << e.what();
        }
    }
}

TEST(CodecBaseline, BlockFormatsNeedHeadDimMultipleOf32) {
    for (const char* name : {"q8_0", "q4_0"}) {
        for (const int64_t d : {8, 48, 100}) {
            try {
                make(name, d);
                ADD_FAILURE() << name << " accepted head_dim " << d;
            } catch (const Error& e) {
                EXPECT_NE(std::string(e.what()).find("32"), std::string::npos) << e.what();
            }
        }
    }
    for (const char* name : {"f32", "f16", "bf16", "fp8"}) EXPECT_NO_THROW(make(name, 8));
}

// ---- encode / decode against the reference -------------------------------------------------------

TEST(CodecBaseline, RandomRoundTripEqualsReference) {
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("seed=" + std::to_string(seed));
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> mag(-4.0f, 3.0f);
    for (const std::string& name : kNames) {
        for (const int64_t d : {32, 64, 128}) {
            for (int rep = 0; rep < 40; ++rep) {
                const auto c = make(name, d);
                // a prompt of 16 tokens sets fp8's scale; then tokens of all sizes, some beyond it
                const float s0 = std::pow(10.0f, mag(rng));
                std::vector<float> prompt(size_t(16 * d));
                for (auto& v : prompt) v = nd(rng) * s0;
                c->observe_first_batch(prompt.data(), 16, d);
                float amax = 0.0f;
                for (const float v : prompt) amax = std::max(amax, std::fabs(v));
                const float scale = amax / 448.0f;
                for (int tok = 0; tok < 4; ++tok) {
                    std::vector<float> x(static_cast<size_t>(d));
                    const float s = tok == 0 ? s0 : std::pow(10.0f, mag(rng));
                    for (auto& v : x) v = nd(rng) * s;
                    if (tok == 3) {  // outliers in some channels
                        for (int k = 0; k < 3; ++k) x[size_t(rng() % d)] *= 50.0f;
                    }
                    check_token(name, *c, x, scale, "d=" + std::to_string(d) + " rep=" + std::to_string(rep));
                    if (tok < 3) check_token(name, *c, std::vector<float>(prompt.begin() + tok * d, prompt.begin() + (tok + 1) * d), scale, "prompt");
                }
            }
        }
    }
}

TEST(CodecBaseline, ZerosDecodeToZero) {
    for (const std::string& name : kNames) {
        for (const int64_t d : {64, 128}) {
            const auto c = make(name, d);
            std::vector<float> x(size_t(d), 0.0f);
            c->observe_first_batch(x.data(), 1, d);  // fp8: amax 0 -> scale 1
            check_token(name, *c, x, 1.0f, "zeros");
            std::vector<uint8_t> blk(c->block_bytes(d));
            std::vector<float> y(static_cast<size_t>(d));
            c->encode(x.data(), d, blk.data());
            c->decode(blk.data(), d, y.data());
            for (const float v : y) EXPECT_EQ(v, 0.0f) << name;
        }
    }
}

TEST(CodecBaseline, HalfAndBfloatRoundToNearestEven) {
    const auto f16 = make("f16", 32);
    std::vector<float> x(32, 0.0f);
    const float cases[][2] = {
        {1.0f + 0x1p-11f, 1.0f},                    // tie -> even
        {1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-9f},      // tie -> even (up)
        {65519.0f, 65504.0f},                       // below the overflow tie
        {65520.0f, INFINITY},                       // overflow tie -> infinity
        {-1e6f, -INFINITY},
        {0x1p-24f, 0x1p-24f},                       // smallest subnormal
        {0x1p-25f, 0.0f},                           // tie with zero -> 0
        {3 * 0x1p-25f, 0x1p-23f},                   // subnormal tie -> even
        {1e-30f, 0.0f},
        {-0.0f, -0.0f},
    };
    for (size_t i = 0; i < std::size(cases); ++i) x[i] = cases[i][0];
    std::vector<uint8_t> blk(64);
    std::vector<float> y(32);
    f16->encode(x.data(), 32, blk.data());
    f16->decode(blk.data(), 32, y.data());
    for (size_t i = 0; i < std::size(cases); ++i) EXPECT_TRUE(same_float(y[i], cases[i][1])) << i << ": " << y[i];
    check_token("f16", *f16, x, 1.0f, "f16 specials");

    const auto bf = make("bf16", 32);
    const float bcases[][2] = {
        {1.0f + 0x1p-8f, 1.0f},
        {1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-6f},
        {1e-40f, 0.0f},  // fp32 subnormal (checked by check_token below)
        {0x1p-133f, 0x1p-133f},
        {0x1p-134f, 0.0f},
        {std::numeric_limits<float>::max(), INFINITY},
        {-3.0e38f, -3.0e38f},
    };
    std::fill(x.begin(), x.end(), 0.0f);
    for (size_t i = 0; i < std::size(bcases); ++i) x[i] = bcases[i][0];
    x[8] = std::numeric_limits<float>::quiet_NaN();
    x[9] = INFINITY;
    bf->encode(x.data(), 32, blk.data());
    bf->decode(blk.data(), 32, y.data());
    for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(same_float(y[i], bcases[i][1])) << i << ": " << y[i];
    EXPECT_TRUE(same_float(y[3], 0x1p-133f));
    EXPECT_TRUE(same_float(y[4], 0.0f));
    EXPECT_TRUE(same_float(y[5], INFINITY));
    EXPECT_TRUE(std::isnan(y[8]));
    EXPECT_TRUE(same_float(y[9], INFINITY));
    check_token("bf16", *bf, x, 1.0f, "bf16 specials");
}

// llama.cpp's x86 q8_0 quantizer rounds x * (127 / amax) half to even (quantize_row_q8_0_ref's
// roundf would round half away from zero).
TEST(CodecBaseline, Q8_0TiesRoundHalfToEven) {
    const auto c = make("q8_0", 64);
    std::vector<float> x(64, 0.0f);
    x[0] = 127.0f;  // amax 127: d = 1, id = 1
    const float ties[] = {2.5f, 3.5f, -2.5f, -3.5f, 0.5f, -0.5f, 126.5f, -126.5f, 1.5f};
    const float want[] = {2.0f, 4.0f, -2.0f, -4.0f, 0.0f, 0.0f, 126.0f, -126.0f, 2.0f};
    for (size_t i = 0; i < std::size(ties); ++i) x[1 + i] = ties[i];
    // second block: amax small enough for a subnormal fp16 d
    for (int j = 32; j < 64; ++j) x[size_t(j)] = float(j - 48) * 7.0e-6f;
    std::vector<uint8_t> blk(c->block_bytes(64));
    std::vector<float> y(64);
    c->encode(x.data(), 64, blk.data());
    c->decode(blk.data(), 64, y.data());
    EXPECT_EQ(y[0], 127.0f);
    for (size_t i = 0; i < std::size(ties); ++i) EXPECT_TRUE(same_float(y[1 + i], want[i])) << ties[i] << " -> " << y[1 + i];
    check_token("q8_0", *c, x, 1.0f, "ties + subnormal d");

    // degenerate blocks: fp32-subnormal amax (127 / amax = inf), infinities mixed in
    std::vector<float> z(64, 0.0f);
    for (int j = 0; j < 32; ++j) z[size_t(j)] = float(j - 16) * 1e-40f;
    for (int j = 32; j < 64; ++j) z[size_t(j)] = float(j - 40) * 1e30f;
    check_token("q8_0", *c, z, 1.0f, "degenerate");
    for (int j = 0; j < 32; ++j) z[size_t(j)] = 0.0f;
    z[0] = 1e-45f;  // smallest subnormal
    check_token("q8_0", *c, z, 1.0f, "smallest subnormal");
}

TEST(CodecBaseline, Q4_0SpecialCases) {
    const auto c = make("q4_0", 128);
    std::vector<float> x(128, 0.0f);
    // block 0: m = -8 (first of largest magnitude, an equal +8 comes later): d = 1
    for (int j = 0; j < 16; ++j) x[size_t(j)] = float(j - 8);
    x[16] = 8.0f;
    for (int j = 17; j < 32; ++j) x[size_t(j)] = float(j - 24) + 0.5f;
    // block 1: largest magnitude positive and first
    x[32] = 3.0f;
    x[33] = -3.0f;
    for (int j = 34; j < 64; ++j) x[size_t(j)] = 0.1f * float(j - 49);
    // block 2: fp16-subnormal d
    for (int j = 64; j < 96; ++j) x[size_t(j)] = float(j - 80) * 1.0e-6f;
    // block 3: all zeros (d = -0)
    check_token("q4_0", *c, x, 1.0f, "specials");
    std::vector<uint8_t> blk(c->block_bytes(128));
    std::vector<float> y(128);
    c->encode(x.data(), 128, blk.data());
    c->decode(blk.data(), 128, y.data());
    EXPECT_EQ(y[0], -8.0f);   // q = 0
    EXPECT_EQ(y[16], 7.0f);   // +8 clamps to q = 15
    EXPECT_EQ(y[32], 3.0f);
    for (int j = 96; j < 128; ++j) EXPECT_EQ(y[size_t(j)], 0.0f);

    // fp32-subnormal largest magnitude: 1/d overflows; everything decodes to zero.
    std::vector<float> z(128, 0.0f);
    for (int j = 0; j < 32; ++j) z[size_t(j)] = float(j - 16) * 1e-40f;
    c->encode(z.data(), 128, blk.data());
    c->decode(blk.data(), 128, y.data());
    for (const float v : y) EXPECT_EQ(v, 0.0f);
}

TEST(CodecBaseline, Fp8ValuesSaturationTiesSubnormals) {
    const auto c = make("fp8", 32);
    // scale = 1: a 16-token prompt whose amax is 448
    std::vector<float> prompt(16 * 32, 1.0f);
    prompt[5] = -448.0f;
    c->observe_first_batch(prompt.data(), 16, 32);

    // every code decodes to its definition
    std::vector<float> y(32);
    for (int base = 0; base < 256; base += 32) {
        std::vector<uint8_t> blk(32);
        for (int i = 0; i < 32; ++i) blk[size_t(i)] = uint8_t(base + i);
        c->decode(blk.data(), 32, y.data());
        for (int i = 0; i < 32; ++i) {
            EXPECT_TRUE(same_float(y[size_t(i)], float(e4m3_def(base + i)))) << "code " << base + i;
        }
    }
    EXPECT_EQ(e4m3_def(0x7e), 448.0);
    EXPECT_EQ(e4m3_def(0x01), std::ldexp(1.0, -9));

    const float cases[][2] = {
        {448.0f, 448.0f},   {-448.0f, -448.0f},   {449.0f, 448.0f},  {464.0f, 448.0f},   {1e9f, 448.0f},
        {-5000.0f, -448.0f}, {INFINITY, 448.0f},  {-INFINITY, -448.0f},
        {432.0f, 448.0f},                                  // tie 416 | 448 -> even mantissa (448)
        {1.0625f, 1.0f},    {1.1875f, 1.25f},     {-1.0625f, -1.0f},  // ties
        {0x1p-9f, 0x1p-9f}, {0x1p-10f, 0.0f},     {3 * 0x1p-10f, 0x1p-8f},  // subnormals, ties
        {15 * 0x1p-10f, 0x1p-6f},                          // tie between 7 * 2^-9 and 2^-6
        {1e-30f, 0.0f},     {-0.0f, -0.0f},       {240.0f, 240.0f},   {-0.3f, -0.3125f},
    };
    std::vector<float> x(32, 0.0f);
    for (size_t i = 0; i < std::size(cases); ++i) x[i] = cases[i][0];
    x[31] = std::numeric_limits<float>::quiet_NaN();
    std::vector<uint8_t> blk(32);
    c->encode(x.data(), 32, blk.data());
    c->decode(blk.data(), 32, y.data());
    for (size_t i = 0; i < std::size(cases); ++i) {
        EXPECT_TRUE(same_float(y[i], cases[i][1])) << "x=" << cases[i][0] << " -> " << y[i];
    }
    EXPECT_TRUE(std::isnan(y[31]));
    EXPECT_EQ(blk[31], 0x7f);
    check_token("fp8", *c, x, 1.0f, "specials");
}

TEST(CodecBaseline, Fp8ScaleComesFromTheFirstBatch) {
    {
        const auto c = make("fp8", 64);
        std::vector<float> prompt(16 * 64, 0.25f);
        prompt[777] = -896.0f;  // amax 896 -> scale 2
        prompt[3] = INFINITY;   // non-finite values are ignored
        c->observe_first_batch(prompt.data(), 16, 64);
        std::vector<float> x(64, 0.0f);
        x[0] = 896.0f;
        x[1] = 2000.0f;         // beyond the prompt: saturates to 448 * 2
        x[2] = 2.125f;          // 1.0625 * 2: tie -> 2
        x[3] = 0x1p-9f;         // 2^-10 * 2: tie with 0 -> 0
        std::vector<uint8_t> blk(64);
        std::vector<float> y(64);
        c->encode(x.data(), 64, blk.data());
        c->decode(blk.data(), 64, y.data());
        EXPECT_EQ(y[0], 896.0f);
        EXPECT_EQ(y[1], 896.0f);
        EXPECT_EQ(y[2], 2.0f);
        EXPECT_EQ(y[3], 0.0f);
        check_token("fp8", *c, x, 2.0f, "scale 2");
    }
    {
        const auto c = make("fp8", 64);  // never observed: scale 1
        std::vector<float> x(64, 3.0f);
        check_token("fp8", *c, x, 1.0f, "no prompt");
    }
    {
        const auto c = make("fp8", 64);  // all-zero prompt: scale 1
        std::vector<float> prompt(16 * 64, 0.0f);
        c->observe_first_batch(prompt.data(), 16, 64);
        std::vector<float> x(64, 300.0f);
        check_token("fp8", *c, x, 1.0f, "zero prompt");
    }
    {
        // 15 tokens are too few to calibrate on (a BOS fed alone in stream mode would clip every
        // larger later value): scale stays 1. This test fails if any first batch sets the scale.
        const auto c = make("fp8", 64);
        std::vector<float> prompt(15 * 64, 0.25f);
        prompt[100] = 896.0f;
        c->observe_first_batch(prompt.data(), 15, 64);
        std::vector<float> x(64, 300.0f);
        x[1] = 0.25f;
        check_token("fp8", *c, x, 1.0f, "short prompt");
    }
    {
        // A fixed scale ignores the prompt.
        const auto c = make_codec(CodecSpec::parse("fp8:scale=0.5"), KvRole::Key, 64);
        EXPECT_EQ(c->spec(), "fp8:scale=0.5");
        std::vector<float> prompt(16 * 64, 1000.0f);
        c->observe_first_batch(prompt.data(), 16, 64);
        std::vector<float> x(64, 3.0f);
        x[2] = 1000.0f;  // saturates to 448 * 0.5
        check_token("fp8", *c, x, 0.5f, "fixed scale");
        EXPECT_EQ(make_codec(CodecSpec::parse("fp8:scale=prompt"), KvRole::Key, 64)->spec(), "fp8");
    }
    for (const char* bad : {"fp8:scale=0", "fp8:scale=-1", "fp8:scale=x", "fp8:scale=inf", "fp8:scale=1e99",
                            "fp8:bits=4", "q8_0:scale=1"}) {
        EXPECT_THROW(make_codec(CodecSpec::parse(bad), KvRole::Key, 64), Error) << bad;
    }
}

// ---- readers -------------------------------------------------------------------------------------

// llama.cpp's score of one q8_0 / q4_0 key token against a query row: q -> q8_0 blocks
// (ref_q8_0), then per 32-block the exact integer dot of the codes in 8 lanes of 4 values,
// acc[l] = fma(fp16(d_k) * fp16(d_q), lane_l, acc[l]), and hsum_float_8:
// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). (ggml's maddubs/sign trick differs from the exact
// products only when both codes are -128, which finite inputs never produce.)
float ref_qdot(const std::string& name, const uint8_t* tok, const float* q, int64_t d) {
    const Expected qq = ref_q8_0(q, d);
    const bool q4 = name == "q4_0";
    const size_t kbb = q4 ? 18 : 34;
    float acc[8] = {};
    for (int64_t b = 0; b < d / 32; ++b) {
        const uint8_t* kb = tok + size_t(b) * kbb;
        const uint8_t* qb = qq.bytes.data() + size_t(b) * 34;
        const float dk = fp16_to_fp32(f16_t(kb[0] | (kb[1] << 8)));
        const float dq = fp16_to_fp32(f16_t(qb[0] | (qb[1] << 8)));
        int kc[32];
        for (int j = 0; j < 32; ++j) {
            kc[j] = q4 ? int((j < 16 ? kb[2 + j] & 0x0f : kb[2 + j - 16] >> 4)) - 8 : int(int8_t(kb[2 + j]));
        }
        const float dd = dk * dq;
        for (int l = 0; l < 8; ++l) {
            int lane = 0;
            for (int j = 4 * l; j < 4 * l + 4; ++j) lane += kc[j] * int(int8_t(qb[2 + j]));
            acc[l] = std::fma(dd, float(lane), acc[l]);
        }
    }
    const float v0 = acc[0] + acc[4], v1 = acc[1] + acc[5], v2 = acc[2] + acc[6], v3 = acc[3] + acc[7];
    return (v0 + v2) + (v1 + v3);
}

struct PackedRun {
    std::unique_ptr<Codec> codec;
    std::vector<uint8_t> bytes;     // n tokens, contiguous
    std::vector<double> xhat;       // decode() of each token, [n, d]
};

PackedRun make_run(const std::string& name, int64_t d, int64_t n, std::mt19937& rng) {
    PackedRun r;
    r.codec = make(name, d);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(size_t(n * d));
    for (int64_t t = 0; t < n; ++t) {
        const float s = std::pow(2.0f, float(int(rng() % 9)) - 4.0f);
        for (int64_t c = 0; c < d; ++c) x[size_t(t * d + c)] = nd(rng) * s * (c % 7 == 3 ? 8.0f : 1.0f);
    }
    r.codec->observe_first_batch(x.data(), n, d);
    const size_t bb = r.codec->block_bytes(d);
    r.bytes.resize(bb * size_t(n));
    std::vector<float> y(static_cast<size_t>(d));
    for (int64_t t = 0; t < n; ++t) {
        r.codec->encode(x.data() + t * d, d, r.bytes.data() + size_t(t) * bb);
        r.codec->decode(r.bytes.data() + size_t(t) * bb, d, y.data());
        for (const float v : y) r.xhat.push_back(v);
    }
    return r;
}

void check_reader(const codecs::detail::BoundReader& rd, const std::string& label, const PackedRun& r, int64_t n, int64_t n_q,
                  int64_t d, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(0.0f, 1.0f);
    // scores
    std::vector<float> q(size_t(n_q * d));
    for (auto& v : q) v = nd(rng);
    std::vector<float> s(size_t(n_q * n), NAN);
    rd.scores(q.data(), n_q, r.bytes.data(), n, d, s.data());
    const std::string name = r.codec->spec();
    const bool qdot = name == "q8_0" || name == "q4_0";
    const size_t bb = r.codec->block_bytes(d);
    for (int64_t h = 0; h < n_q; ++h) {
        for (int64_t t = 0; t < n; ++t) {
            double exact = 0.0, mag = 0.0, qerr = 0.0;
            for (int64_t c = 0; c < d; ++c) {
                const double term = double(q[size_t(h * d + c)]) * r.xhat[size_t(t * d + c)];
                exact += term;
                mag += std::fabs(term);
            }
            const float got = s[size_t(h * n + t)];
            if (qdot) {
                const float want = ref_qdot(name, r.bytes.data() + size_t(t) * bb, q.data() + h * d, d);
                ASSERT_TRUE(same_float(got, want))
                    << label << " scores h=" << h << " t=" << t << ": " << got << " vs llama.cpp's " << want;
                for (int64_t b = 0; b < d / 32; ++b) {
                    double amax = 0.0, ksum = 0.0;
                    for (int64_t c = 32 * b; c < 32 * b + 32; ++c) {
                        amax = std::max(amax, std::fabs(double(q[size_t(h * d + c)])));
                        ksum += std::fabs(r.xhat[size_t(t * d + c)]);
                    }
                    qerr += amax / 127.0 * ksum;
                }
            }
            ASSERT_LE(std::fabs(double(got) - exact), qerr + 1e-5 * mag)
                << label << " scores h=" << h << " t=" << t << ": " << got << " vs " << exact;
        }
    }
    // accumulate
    std::vector<float> p(size_t(n_q * n));
    for (auto& v : p) v = ud(rng);
    std::vector<float> acc(size_t(n_q * d));
    for (auto& v : acc) v = nd(rng);
    const std::vector<float> acc0 = acc;
    rd.accumulate(p.data(), n_q, r.bytes.data(), n, d, acc.data());
    for (int64_t h = 0; h < n_q; ++h) {
        for (int64_t c = 0; c < d; ++c) {
            double exact = acc0[size_t(h * d + c)], mag = std::fabs(exact);
            for (int64_t t = 0; t < n; ++t) {
                const double term = double(p[size_t(h * n + t)]) * r.xhat[size_t(t * d + c)];
                exact += term;
                mag += std::fabs(term);
            }
            ASSERT_LE(std::fabs(double(acc[size_t(h * d + c)]) - exact), 1e-5 * mag)
                << label << " accumulate h=" << h << " c=" << c << ": " << acc[size_t(h * d + c)] << " vs " << exact;
        }
    }
}

TEST(CodecBaseline, ReadersMatchDecodeThenDot) {
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("seed=" + std::to_string(seed));
    std::mt19937 rng(seed);
    for (const std::string& name : kNames) {
        const bool blocks = std::string(name) == "q8_0" || std::string(name) == "q4_0";
        std::vector<int64_t> dims = {64, 128};
        if (!blocks) {
            dims.push_back(40);  // 8-aligned, not 16-aligned
            dims.push_back(36);  // not 8-aligned: the AVX2 reader falls back to the scalar one
        } else {
            dims.push_back(96);
        }
        for (const int64_t d : dims) {
            for (const int64_t n : {1, 7, 31, 64}) {
                const PackedRun r = make_run(name, d, n, rng);
                const auto avx2 = codecs::detail::baseline_avx2_reader(*r.codec);
                for (const int64_t n_q : {1, 2, 3, 4, 5, 8, 9, 12}) {
                    const std::string label =
                        std::string(name) + " d=" + std::to_string(d) + " n=" + std::to_string(n) + " n_q=" + std::to_string(n_q);
                    check_reader(codecs::detail::baseline_scalar_reader(*r.codec), label + " scalar", r, n, n_q, d, rng);
                    if (avx2) check_reader(*avx2, label + " avx2", r, n, n_q, d, rng);
                    if (HasFatalFailure()) return;
                }
            }
        }
    }
}

// q8_0 / q4_0 scores on arbitrary block bytes (every code, -128 included) and queries with NaN
// (q8_0 code -128; the block scale stays finite when ggml's max_ps order drops the NaN): the
// AVX2 reader equals the scalar one bit for bit, including the wrap of _mm256_sign_epi8(-128)
// that the scalar reader emulates.
TEST(CodecBaseline, QdotReadersAgreeOnAnyBytes) {
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("seed=" + std::to_string(seed));
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (const char* name : {"q8_0", "q4_0"}) {
        const int64_t d = 128, n = 50;
        const auto c = make(name, d);
        const auto avx2 = codecs::detail::baseline_avx2_reader(*c);
        VXQ_REQUIRE_AVX2(avx2);
        const size_t bb = c->block_bytes(d), kbb = bb / size_t(d / 32);
        std::vector<uint8_t> bytes(bb * size_t(n));
        for (auto& b : bytes) b = uint8_t(rng());
        for (size_t off = 0; off < bytes.size(); off += kbb) {  // finite scales
            const f16_t h = fp32_to_fp16(nd(rng));
            bytes[off] = uint8_t(h & 0xff);
            bytes[off + 1] = uint8_t(h >> 8);
            if (std::string(name) == "q8_0" && rng() % 2) bytes[off + 2 + rng() % 32] = 0x80;  // more -128
        }
        for (const int64_t n_q : {1, 3, 8, 11}) {
            std::vector<float> q(size_t(n_q * d));
            for (auto& v : q) v = rng() % 50 == 0 ? NAN : nd(rng) * 3.0f;
            std::vector<float> s0(size_t(n_q * n)), s1(s0.size());
            codecs::detail::baseline_scalar_reader(*c).scores(q.data(), n_q, bytes.data(), n, d, s0.data());
            avx2->scores(q.data(), n_q, bytes.data(), n, d, s1.data());
            for (size_t i = 0; i < s0.size(); ++i) {
                ASSERT_TRUE(same_float(s0[i], s1[i])) << name << " n_q=" << n_q << " i=" << i << ": " << s0[i] << " vs " << s1[i];
            }
        }
    }
}

TEST(CodecBaseline, ReaderDispatchesToAvx2WhenAvailable) {
    for (const std::string& name : kNames) {
        const auto c = make(name, 64);
        const auto avx2 = codecs::detail::baseline_avx2_reader(*c);
        const cpu::KvReader* want = avx2 ? avx2->r : codecs::detail::baseline_scalar_reader(*c).r;
        EXPECT_EQ(&cpu::kv_reader(c->params(64).kind), want) << name;
    }
}

// fp8 NaN codes read as NaN in every reader (the AVX2 loader special-cases them).
TEST(CodecBaseline, Fp8ReadersPropagateNaN) {
    const auto c = make("fp8", 16);
    std::vector<uint8_t> blk(16, 0x38);  // 1.0
    blk[5] = 0xff;
    std::vector<float> q(16, 1.0f), s(1);
    std::vector<codecs::detail::BoundReader> readers = {codecs::detail::baseline_scalar_reader(*c)};
    if (const auto a = codecs::detail::baseline_avx2_reader(*c)) readers.push_back(*a);
    for (const auto& rd : readers) {
        rd.scores(q.data(), 1, blk.data(), 1, 16, s.data());
        EXPECT_TRUE(std::isnan(s[0]));
        blk[5] = 0x38;
        rd.scores(q.data(), 1, blk.data(), 1, 16, s.data());
        EXPECT_EQ(s[0], 16.0f);
        blk[5] = 0x7f;
    }
}

}  // namespace
}  // namespace vxq

// KIVI codec (kv/codecs/kivi.{h,cpp}, kivi_avx2.cpp) against METHODS.md "KIVI":
//  1. encode -> decode equals a straightforward scalar reference written here, bit for bit (packed
//     bytes and reconstructed floats), on hundreds of random configurations;
//  2. one test per parity rule, each showing that a deliberately broken variant differs from the
//     codec on crafted inputs while the codec equals the correct reference;
//  3. readers (scalar and AVX2) vs decode-then-dot in double;
//  4. options, spec, flush parameters, bits per element.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/fp16.h"
#include "kv/codec.h"
#include "kernels/cpu/kv_read_kivi.h"
#include "kernels/cpu/kv_reader.h"
#include "kernels/cuda/kivi_code.h"
#include "kv/formats/kivi.h"
#include "support/attend.h"
#include "support/seed.h"

#pragma GCC optimize("fp-contract=off")  // the reference below rounds every operation on its own

namespace vxq {
namespace {

using test::fresh_seed;

std::unique_ptr<Codec> make_kivi(KvRole role, int bits, int group, int64_t residual, int64_t d) {
    return make_codec(CodecSpec::parse(fmt::format("kivi:bits={},group={},residual={}", bits, group, residual)), role, d);
}

// ---------------------------------------------------------------------------------------------
// The reference: METHODS.md "KIVI" transcribed step by step, with switches that break one parity
// rule at a time (the default Variant is the correct one).

enum class Rounding { HalfEven, HalfAway };                      // rule 1: rint vs round()
enum class Dequant { TwoRoundings, Fma, Fp16Arithmetic };         // rule 2
struct Variant {
    Rounding rounding = Rounding::HalfEven;
    Dequant dequant = Dequant::TwoRoundings;
    bool zero_pad = false;        // rule 3: pad a ragged value group with zeros instead of its last element
    bool guard_zero_scale = true; // rule 4: s16 == 0 -> code 0 (false: compute (x - z) / 0)
};

int64_t g_ties = 0;  // how many (x - z16) / s16 landed exactly on k + 0.5 (the tie tests must see some)

struct RefGroup {
    uint16_t z16 = 0, s16 = 0;
    std::vector<int> q;        // -1 where the code is NaN (broken variant only)
    std::vector<float> xhat;
};

float ref_dequant(float q, float s, float z, Dequant how) {
    switch (how) {
        case Dequant::Fma: return std::fma(q, s, z);
        case Dequant::Fp16Arithmetic: return round_fp16(round_fp16(q * s) + z);  // PyTorch's fp16 path
        default: {
            volatile float prod = q * s;  // rounded to f32
            volatile float sum = prod + z;  // rounded to f32
            return sum;
        }
    }
}

RefGroup ref_group(const std::vector<float>& x, int bits, const Variant& v = {}) {
    const float mn = *std::min_element(x.begin(), x.end());
    const float mx = *std::max_element(x.begin(), x.end());
    const float qmax = float((1 << bits) - 1);
    volatile float range = mx - mn;
    const float s = range / qmax;  // f32
    RefGroup r;
    r.z16 = fp32_to_fp16(mn);
    r.s16 = fp32_to_fp16(s);
    const float zf = fp16_to_fp32(r.z16), sf = fp16_to_fp32(r.s16);
    for (float xi : x) {
        float qf;
        if (sf == 0.0f && v.guard_zero_scale) {
            qf = 0.0f;
        } else {
            float t = (xi - zf) / sf;
            t = t < 0.0f ? 0.0f : (t > qmax ? qmax : t);  // NaN stays NaN
            if (t - std::floor(t) == 0.5f) ++g_ties;
            qf = v.rounding == Rounding::HalfEven ? std::rint(t) : std::round(t);
        }
        r.q.push_back(std::isnan(qf) ? -1 : int(qf));
        r.xhat.push_back(ref_dequant(qf, sf, zf, v.dequant));
    }
    return r;
}

// Codes of a row packed into 32-bit words, code j at bit (j mod 32/b)*b of word j/(32/b), LSB
// first, words stored little endian (the METHODS.md formulation; the codec packs bytes).
void ref_pack(const std::vector<int>& q, int bits, uint8_t* out) {
    const size_t per = size_t(32 / bits);
    std::vector<uint32_t> words((q.size() + per - 1) / per, 0u);
    for (size_t j = 0; j < q.size(); ++j) words[j / per] |= uint32_t(q[j] & ((1 << bits) - 1)) << ((j % per) * bits);
    for (size_t k = 0; k < q.size() * bits / 8; ++k) out[k] = uint8_t(words[k / 4] >> (8 * (k % 4)));
}

void put_f16(uint8_t* p, uint16_t h) {
    p[0] = uint8_t(h & 0xff);
    p[1] = uint8_t(h >> 8);
}

struct RefBlock {
    std::vector<uint8_t> bytes;
    std::vector<float> xhat;
};

// Keys: x [G tokens][d channels]; row c = channel c. Header: z16[d], s16[d], then d rows of codes.
RefBlock ref_keys(const float* x, int64_t d, int G, int bits, const Variant& v = {}) {
    const size_t rb = size_t(G * bits / 8);
    RefBlock b;
    b.bytes.assign(4 * size_t(d) + size_t(d) * rb, 0);
    b.xhat.assign(size_t(G * d), 0.0f);
    for (int64_t c = 0; c < d; ++c) {
        std::vector<float> col;
        for (int t = 0; t < G; ++t) col.push_back(x[t * d + c]);
        const RefGroup r = ref_group(col, bits, v);
        put_f16(&b.bytes[2 * size_t(c)], r.z16);
        put_f16(&b.bytes[2 * size_t(d) + 2 * size_t(c)], r.s16);
        ref_pack(r.q, bits, &b.bytes[4 * size_t(d) + size_t(c) * rb]);
        for (int t = 0; t < G; ++t) b.xhat[size_t(t * d + c)] = r.xhat[size_t(t)];
    }
    return b;
}

// Values: x [d]; row g = channels [gG, gG+G), ragged last row padded with its last real element.
RefBlock ref_values(const float* x, int64_t d, int G, int bits, const Variant& v = {}) {
    const int64_t rows = (d + G - 1) / G;
    const size_t rb = size_t(G * bits / 8);
    RefBlock b;
    b.bytes.assign(4 * size_t(rows) + size_t(rows) * rb, 0);
    b.xhat.assign(size_t(d), 0.0f);
    for (int64_t g = 0; g < rows; ++g) {
        std::vector<float> grp;
        for (int64_t c = g * G; c < std::min(d, g * G + G); ++c) grp.push_back(x[c]);
        const float pad = v.zero_pad ? 0.0f : grp.back();
        while (grp.size() < size_t(G)) grp.push_back(pad);
        const RefGroup r = ref_group(grp, bits, v);
        put_f16(&b.bytes[2 * size_t(g)], r.z16);
        put_f16(&b.bytes[2 * size_t(rows) + 2 * size_t(g)], r.s16);
        ref_pack(r.q, bits, &b.bytes[4 * size_t(rows) + size_t(g) * rb]);
        for (int64_t c = g * G; c < std::min(d, g * G + G); ++c) b.xhat[size_t(c)] = r.xhat[size_t(c - g * G)];
    }
    return b;
}

int64_t bit_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return -1;
    int64_t n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]);
    return n;
}

// The codec's encode + decode of one block (keys: G x d input, values: d input).
RefBlock run_codec(const Codec& codec, const float* x, int64_t d) {
    RefBlock b;
    b.bytes.assign(codec.block_bytes(d), 0xAB);  // poison: every byte must be written
    codec.encode(x, d, b.bytes.data());
    b.xhat.assign(size_t(codec.block_tokens() * d), std::nanf(""));
    codec.decode(b.bytes.data(), d, b.xhat.data());
    return b;
}

// ---------------------------------------------------------------------------------------------
// Random inputs. Groups are channels over G tokens (keys) or runs of G channels of one token
// (values); `for_each_group` hands out each group's element indices into x.

template <typename F>
void for_each_group(bool keys, int64_t n_tok, int64_t d, int G, F&& f) {
    std::vector<int64_t> idx;
    if (keys) {
        for (int64_t b = 0; b < n_tok / G; ++b)
            for (int64_t c = 0; c < d; ++c) {
                idx.clear();
                for (int t = 0; t < G; ++t) idx.push_back((b * G + t) * d + c);
                f(idx);
            }
    } else {
        for (int64_t t = 0; t < n_tok; ++t)
            for (int64_t c0 = 0; c0 < d; c0 += G) {
                idx.clear();
                for (int64_t c = c0; c < std::min(d, c0 + G); ++c) idx.push_back(t * d + c);
                f(idx);
            }
    }
}

enum Mode { kGaussian, kHuge, kConstantGroups, kTies, kTinyRange, kModes };

std::vector<float> make_input(Mode mode, bool keys, int64_t n_tok, int64_t d, int G, int bits, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(0.0f, 1.0f);
    std::vector<float> x(size_t(n_tok * d));
    // Gaussian with a global magnitude from tiny (fp16 subnormal scales) to large, per-channel offsets.
    const float mag = std::pow(10.0f, -7.0f + 10.5f * ud(rng));
    std::vector<float> offset(static_cast<size_t>(d));
    for (auto& o : offset) o = mag * 2.0f * nd(rng);
    for (int64_t i = 0; i < n_tok * d; ++i) x[size_t(i)] = offset[size_t(i % d)] + mag * nd(rng);
    switch (mode) {
        case kHuge:  // |x| up to 3e4: z16, s16 still finite for every b
            for (auto& v : x) v = 3e4f * (2.0f * ud(rng) - 1.0f);
            break;
        case kConstantGroups: {
            const float consts[] = {0.0f, 1e-9f, 1.2345678f, -3.0f, 70000.0f / 3.0f, 5.96e-8f};
            for_each_group(keys, n_tok, d, G, [&](const std::vector<int64_t>& idx) {
                if (ud(rng) < 0.5f) {
                    const float c = consts[rng() % std::size(consts)] * (ud(rng) < 0.5f ? 1.0f : 0.37f);
                    for (int64_t i : idx) x[size_t(i)] = c;
                }
            });
            break;
        }
        case kTies: {  // z, s exact in fp16 and f32, elements at z + (k + 1/2) s exactly
            const int qmax = (1 << bits) - 1;
            for_each_group(keys, n_tok, d, G, [&](const std::vector<int64_t>& idx) {
                const int ez = int(rng() % 6) - 2, es = -3 - int(rng() % 5);
                const float z = round_fp16((ud(rng) < 0.5f ? -1.0f : 1.0f) * (1.0f + ud(rng)) * std::ldexp(1.0f, ez));
                const float s = float(1 + 2 * int(rng() % 4)) * std::ldexp(1.0f, es);
                for (size_t k = 0; k < idx.size(); ++k) {
                    const int code = int(rng() % uint32_t(qmax));
                    x[size_t(idx[k])] = z + (float(code) + (ud(rng) < 0.8f ? 0.5f : 0.0f)) * s;
                }
                // min and max somewhere in the group, both real elements
                const size_t a = rng() % idx.size();
                size_t b = rng() % idx.size();
                if (b == a) b = (a + 1) % idx.size();
                x[size_t(idx[a])] = z;
                if (idx.size() > 1) x[size_t(idx[b])] = z + float(qmax) * s;
            });
            break;
        }
        case kTinyRange: {  // spread so small that s16 is subnormal or rounds to 0 while max != min
            const float spread = std::pow(10.0f, -10.0f + 7.0f * ud(rng));
            for (auto& v : x) v = 1.0f + spread * nd(rng);
            break;
        }
        default: break;
    }
    return x;
}

// ---------------------------------------------------------------------------------------------
// 1. encode -> decode equals the reference bit for bit.

TEST(Kivi, EncodeDecodeEqualsReferenceBitForBit) {
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    std::mt19937 rng(seed);
    const int bits_list[] = {2, 4, 8};
    const int groups[] = {8, 16, 32, 64, 128};
    const int64_t dims[] = {64, 128, 72, 100};
    const int64_t ties0 = g_ties;
    int configs = 0;
    int64_t groups_checked = 0, zero_scale_groups = 0;
    for (int it = 0; it < 400; ++it) {
        const bool keys = it % 2 == 0;
        const int bits = bits_list[rng() % 3];
        const int G = groups[rng() % 5];
        const int64_t R = G * int64_t(1 + rng() % 4);
        const int64_t d = dims[rng() % 4];
        const Mode mode = Mode((it / 2) % kModes);
        const auto codec = make_kivi(keys ? KvRole::Key : KvRole::Value, bits, G, R, d);
        const int64_t n_tok = keys ? G * int64_t(1 + rng() % 2) : 3;
        const std::vector<float> x = make_input(mode, keys, n_tok, d, G, bits, rng);
        SCOPED_TRACE(::testing::Message() << "config " << it << ": " << codec->spec() << (keys ? " keys" : " values")
                                          << " d=" << d << " mode " << int(mode));
        const int64_t step = codec->block_tokens();
        for (int64_t t0 = 0; t0 < n_tok; t0 += step) {
            const float* xb = x.data() + t0 * d;
            const RefBlock want = keys ? ref_keys(xb, d, G, bits) : ref_values(xb, d, G, bits);
            const RefBlock got = run_codec(*codec, xb, d);
            ASSERT_EQ(got.bytes.size(), want.bytes.size());
            ASSERT_EQ(got.bytes, want.bytes) << "block at token " << t0;
            ASSERT_EQ(bit_mismatches(got.xhat, want.xhat), 0) << "block at token " << t0;
            const int64_t rows = keys ? d : (d + G - 1) / G;
            for (int64_t r = 0; r < rows; ++r) {
                zero_scale_groups += got.bytes[size_t(2 * rows + 2 * r)] == 0 && got.bytes[size_t(2 * rows + 2 * r + 1)] == 0;
            }
            groups_checked += rows;
        }
        ++configs;
    }
    EXPECT_GE(configs, 300);
    EXPECT_GT(g_ties - ties0, 1000) << "the tie inputs did not land on .5";
    EXPECT_GT(zero_scale_groups, 100) << "constant / s16 == 0 groups were not exercised";
    RecordProperty("groups_checked", std::to_string(groups_checked));
    RecordProperty("ties", std::to_string(g_ties - ties0));
    RecordProperty("zero_scale_groups", std::to_string(zero_scale_groups));
}

// ---------------------------------------------------------------------------------------------
// 2. Parity rules. Each test: the codec equals the correct reference bit for bit, and the broken
// variant differs from the codec on the crafted input (so the test fails if the rule is broken).

// Rule 1: round half to even. Group min 0, max 3 (b = 2) -> z16 = 0, s16 = 1; x = k + 0.5 ties.
TEST(KiviParity, Rule1RoundHalfEven) {
    for (const bool keys : {true, false}) {
        for (const int bits : {2, 4}) {
            SCOPED_TRACE(::testing::Message() << (keys ? "keys" : "values") << " bits " << bits);
            const int G = 32, qmax = (1 << bits) - 1;
            const int64_t d = 32;
            const auto codec = make_kivi(keys ? KvRole::Key : KvRole::Value, bits, G, 128, d);
            const int64_t n_tok = keys ? G : 1;
            std::vector<float> x(size_t(n_tok * d));
            for (int64_t i = 0; i < n_tok * d; ++i) {
                const int64_t k = keys ? i / d : i % d;  // position inside the group
                x[size_t(i)] = k == 0 ? 0.0f : k == 1 ? float(qmax) : float(k % qmax) + 0.5f;
            }
            const RefBlock got = run_codec(*codec, x.data(), d);
            const RefBlock good = keys ? ref_keys(x.data(), d, G, bits) : ref_values(x.data(), d, G, bits);
            Variant broken;
            broken.rounding = Rounding::HalfAway;
            const RefBlock bad = keys ? ref_keys(x.data(), d, G, bits, broken) : ref_values(x.data(), d, G, bits, broken);
            EXPECT_EQ(got.bytes, good.bytes);
            EXPECT_EQ(bit_mismatches(got.xhat, good.xhat), 0);
            EXPECT_GT(bit_mismatches(got.xhat, bad.xhat), 0) << "round() would give the same output";
            EXPECT_NE(got.bytes, bad.bytes);
            // explicitly: x = 2.5 -> code 2 (half to even), round() would give 3
            const int64_t at = keys ? 2 * d : 2;  // position 2 of the group holds 2.5
            ASSERT_EQ(x[size_t(at)], 2.5f);
            EXPECT_EQ(got.xhat[size_t(at)], 2.0f);
            EXPECT_EQ(bad.xhat[size_t(at)], 3.0f);
        }
    }
}

// The device encoders' reciprocal form (kernels/cuda/kivi_code.h: codes from (x - z) * (1 / s),
// the division only near a half-integer) against the codec's division, on fp16 values at, next
// to and between the half-integers of random groups (zeros in [-4, 4], scales 2^-12 .. 2^6, the
// neighbouring fp16 bit patterns of each target; and infinities and NaN), for every width the
// format takes. The near-tie branch must be taken, or the crafted values missed what the test is
// about.
TEST(KiviParity, ReciprocalCodeEqualsDivision) {
    std::mt19937 rng(20261204);
    std::uniform_real_distribution<float> zero(-4.0f, 4.0f), log2_scale(-12.0f, 6.0f);
    for (const int bits : {2, 4, 8}) {
        SCOPED_TRACE(::testing::Message() << "bits " << bits);
        const float qmax = float((1 << bits) - 1);
        int64_t cases = 0, near = 0, wrong = 0;
        for (int g = 0; g < 40000 / (1 << bits); ++g) {
            const float z = round_fp16(zero(rng)), s = round_fp16(std::exp2(log2_scale(rng)));
            const float inv = 1.0f / s;  // correctly rounded, as the device's __frcp_rn
            for (int k = -1; k <= int(qmax); ++k) {
                for (const float off : {0.5f, 0.4999f, 0.5001f, 0.0f, 0.25f}) {
                    const f16_t h = fp32_to_fp16(z + (float(k) + off) * s);
                    for (int dh = -2; dh <= 2; ++dh) {
                        const float x = fp16_to_fp32(f16_t(h + dh));
                        if (!std::isfinite(x)) continue;
                        const float t = (x - z) / s;  // kivi::quantize_group's code
                        const auto want = unsigned(std::nearbyint(t >= 0.0f ? std::min(t, qmax) : 0.0f));
                        wrong += cuda::kivi_code_rcp(x, z, s, inv, qmax) != want;
                        const float c = cuda::kivi_code_clamp((x - z) * inv, qmax);
                        near += cuda::kivi_code_near_tie(c, cuda::kivi_round_biased(c));
                        ++cases;
                    }
                }
            }
            for (const float x : {INFINITY, -INFINITY, NAN}) {  // the quotient's ends: qmax, 0, 0
                const float t = (x - z) / s;
                wrong += cuda::kivi_code_rcp(x, z, s, inv, qmax) != unsigned(std::nearbyint(t >= 0.0f ? std::min(t, qmax) : 0.0f));
                ++cases;
            }
        }
        EXPECT_EQ(wrong, 0) << "of " << cases;
        EXPECT_GT(near, 0) << "no case went to the division";
        RecordProperty(fmt::format("bits{}_cases", bits), std::to_string(cases));
        RecordProperty(fmt::format("bits{}_near_ties", bits), std::to_string(near));
    }
}

// The flush kernel's code from two fused multiply-adds (kivi_code.h, kivi_code_fma: min(rint(P),
// qmax) unless near a half-integer, where the division decides) against the codec's division, on
// values x >= z (z is the group's minimum) at, next to and between the half-integers up to 1.5
// qmax + 1 (a scale rounded down to fp16 lets quotients pass qmax), random zeros and scales as
// above, tiny subnormal scales, and infinite x (P NaN: the division). The near-tie branch must be
// taken, and the same form without the margin (a gap of 1e-12) must give wrong codes here (the
// test can fail).
TEST(KiviParity, FmaCodeEqualsDivision) {
    std::mt19937 rng(20261206);
    std::uniform_real_distribution<float> zero(-4.0f, 4.0f), log2_scale(-12.0f, 6.0f);
    for (const int bits : {2, 4}) {
        SCOPED_TRACE(::testing::Message() << "bits " << bits);
        const float qmax = float((1 << bits) - 1);
        int64_t cases = 0, near = 0, wrong = 0, wrong_tight = 0;
        const auto fma_code = [&](float x, float z, float s, float inv, float gap) {
            const cuda::KiviFmaCode c = cuda::kivi_code_fma(x - z, inv);
            const float f = std::fma(x - z, inv, -(std::bit_cast<float>(c.biased_bits) - cuda::kKiviRoundBias));
            if (gap != cuda::kKiviTieGap ? !(std::fabs(f) < gap) : c.near_tie) return cuda::kivi_code(x, z, s, qmax);
            return std::min(c.biased_bits - cuda::kKiviRoundBiasBits, unsigned(qmax));
        };
        for (int g = 0; g < 40000 / (1 << bits); ++g) {
            const float z = round_fp16(zero(rng));
            const float s = g % 8 == 0 ? fp16_to_fp32(f16_t(1 + rng() % 4)) : round_fp16(std::exp2(log2_scale(rng)));
            const float inv = 1.0f / s;
            for (int k = 0; k <= int(1.5f * qmax) + 1; ++k) {
                for (const float off : {0.5f, 0.49999f, 0.50001f, 0.4999f, 0.5001f, 0.0f, 0.25f, -0.25f}) {
                    const f16_t h = fp32_to_fp16(z + (float(k) + off) * s);
                    for (int dh = -2; dh <= 2; ++dh) {
                        const float x = fp16_to_fp32(f16_t(h + dh));
                        if (!std::isfinite(x) || x < z) continue;
                        const float t = (x - z) / s;
                        const auto want = unsigned(std::nearbyint(t >= 0.0f ? std::min(t, qmax) : 0.0f));
                        wrong += fma_code(x, z, s, inv, cuda::kKiviTieGap) != want;
                        wrong_tight += fma_code(x, z, s, inv, 0.5f - 1e-12f) != want;
                        near += cuda::kivi_code_fma(x - z, inv).near_tie;
                        ++cases;
                    }
                }
            }
            const float x = INFINITY, t = (x - z) / s;  // P = inf: no code from the sum
            wrong += fma_code(x, z, s, inv, cuda::kKiviTieGap) != unsigned(std::nearbyint(t >= 0.0f ? std::min(t, qmax) : 0.0f));
            ++cases;
        }
        EXPECT_EQ(wrong, 0) << "of " << cases;
        EXPECT_GT(near, 0) << "no case went to the division";
        EXPECT_GT(wrong_tight, 0) << "a gap of 1e-12 went uncaught: the crafted values miss the ties";
        RecordProperty(fmt::format("fma_bits{}_cases", bits), std::to_string(cases));
        RecordProperty(fmt::format("fma_bits{}_near_ties", bits), std::to_string(near));
    }
}

// Rule 2: dequant (q * s16) + z16 with two f32 roundings.
// With this format an FMA-contracted dequant can NOT differ: q <= 255 has 8 significant bits and
// s16 11, so q * s16 is exact in f32 and fma(q, s16, z16) rounds the same exact sum once. Part (a)
// proves that exhaustively (every finite fp16 scale x every code), so a contracted build stays bit
// exact. Part (b) shows the comparison does catch FMA when the product is inexact (an f32 scale),
// and part (c) shows a dequant that does not do the two f32 roundings (fp16 arithmetic, the
// authors' fp16 path) differs from the codec on crafted input while the codec equals the reference.
TEST(KiviParity, Rule2DequantTwoRoundings) {
    // (a) q * s16 exact in f32 for every finite fp16 s16 and code q in [0, 255]; hence fma == two roundings.
    std::mt19937 rng(7);
    int64_t inexact = 0, fma_differs = 0;
    for (uint32_t h = 0; h < 0x10000u; ++h) {
        if ((h & 0x7c00u) == 0x7c00u) continue;  // inf / NaN
        const float s = fp16_to_fp32(uint16_t(h));
        for (int q = 0; q < 256; ++q) {
            const float p = float(q) * s;
            inexact += double(p) != double(q) * double(s);
        }
        const float z = fp16_to_fp32(uint16_t(rng() & 0x7bffu) | uint16_t(rng() & 0x8000u));  // finite z16
        const float q = float(rng() % 256);
        fma_differs += std::fma(q, s, z) != ref_dequant(q, s, z, Dequant::TwoRoundings) &&
                       !std::isinf(ref_dequant(q, s, z, Dequant::TwoRoundings));
    }
    EXPECT_EQ(inexact, 0);
    EXPECT_EQ(fma_differs, 0);

    // (b) the FMA variant is a real difference as soon as the product is not exact
    const float s32 = 1.0f / 3.0f;  // not an fp16 value: q * s rounds
    EXPECT_NE(std::fma(3.0f, s32, -1.0f), ref_dequant(3.0f, s32, -1.0f, Dequant::TwoRoundings));

    // (c) a dequant that rounds differently (fp16 arithmetic) is caught: b = 8, z ~ 1000 (fp16 ulp
    // 0.5 there), s ~ 0.1 -> q * s + z is rarely an fp16 value.
    const int G = 32;
    const int64_t d = 64;
    const auto codec = make_kivi(KvRole::Value, 8, G, 128, d);
    std::vector<float> x(static_cast<size_t>(d));
    std::uniform_real_distribution<float> ud(1000.0f, 1025.5f);
    for (auto& v : x) v = ud(rng);
    x[0] = 1000.0f;
    x[1] = 1025.5f;
    const RefBlock got = run_codec(*codec, x.data(), d);
    const RefBlock good = ref_values(x.data(), d, G, 8);
    Variant fp16arith;
    fp16arith.dequant = Dequant::Fp16Arithmetic;
    Variant fused;
    fused.dequant = Dequant::Fma;
    EXPECT_EQ(bit_mismatches(got.xhat, good.xhat), 0);
    EXPECT_EQ(bit_mismatches(got.xhat, ref_values(x.data(), d, G, 8, fused).xhat), 0);  // (a) in practice
    EXPECT_GT(bit_mismatches(got.xhat, ref_values(x.data(), d, G, 8, fp16arith).xhat), 0);
}

// Rule 3: a ragged last value group is padded by repeating its last real element. All-positive
// (and all-negative) tails: zero padding would move min (max) to 0 and change z16, s16, x^.
TEST(KiviParity, Rule3RaggedGroupRepeatsLastElement) {
    for (const int bits : {2, 4, 8}) {
        for (const float sign : {1.0f, -1.0f}) {
            SCOPED_TRACE(::testing::Message() << "bits " << bits << " sign " << sign);
            const int G = 32;
            const int64_t d = 40;  // groups [0, 32) and [32, 40) + 24 padding
            const auto codec = make_kivi(KvRole::Value, bits, G, 128, d);
            ASSERT_EQ(codec->block_bytes(d), size_t(2 * 4 + 2 * G * bits / 8));
            std::vector<float> x(static_cast<size_t>(d));
            for (int64_t c = 0; c < d; ++c) x[size_t(c)] = c < 32 ? std::sin(float(c)) : sign * (5.0f + 0.37f * float(c - 32));
            const RefBlock got = run_codec(*codec, x.data(), d);
            const RefBlock good = ref_values(x.data(), d, G, bits);
            Variant zero;
            zero.zero_pad = true;
            const RefBlock bad = ref_values(x.data(), d, G, bits, zero);
            EXPECT_EQ(got.bytes, good.bytes);
            EXPECT_EQ(bit_mismatches(got.xhat, good.xhat), 0);
            EXPECT_GT(bit_mismatches(got.xhat, bad.xhat), 0) << "zero padding would give the same output";
            // the padding codes stored are the code of the last real element
            const uint8_t* row = got.bytes.data() + 8 + size_t(G * bits / 8);
            for (int j = 8; j < G; ++j) EXPECT_EQ(codecs::kivi::code_at(row, j, bits), codecs::kivi::code_at(row, 7, bits));
        }
    }
}

// Rule 4: a constant group stores s = 0 and reconstructs exactly z16, no 0/0. Two constants: 1.25
// is an fp16 value, so x - z16 = 0 and the unguarded (x - z16) / s16 is 0/0 = NaN; 1.2345678 is
// not, so x - z16 != 0 and the unguarded division gives inf -> code 2^b - 1 (different bytes; x^
// happens to stay z16 because s16 = 0).
TEST(KiviParity, Rule4ConstantGroupIsExactlyZ) {
    for (const bool keys : {true, false}) {
        SCOPED_TRACE(keys ? "keys" : "values");
        const int G = 32, bits = 2;
        const int64_t d = 128;
        const auto codec = make_kivi(keys ? KvRole::Key : KvRole::Value, bits, G, 128, d);
        const int64_t n_tok = keys ? G : 1;
        const float c_exact = 1.25f, c_inexact = 1.2345678f;
        std::vector<float> x(size_t(n_tok * d));
        for (int64_t i = 0; i < n_tok * d; ++i) {
            const int64_t ch = i % d;  // keys: channels 0..63 constant over tokens; values: groups 0 and 1
            x[size_t(i)] = ch < 32 ? c_exact : ch < 64 ? c_inexact : std::cos(float(i));
        }
        const RefBlock got = run_codec(*codec, x.data(), d);
        const RefBlock good = keys ? ref_keys(x.data(), d, G, bits) : ref_values(x.data(), d, G, bits);
        Variant nan;
        nan.guard_zero_scale = false;
        const RefBlock bad = keys ? ref_keys(x.data(), d, G, bits, nan) : ref_values(x.data(), d, G, bits, nan);
        EXPECT_EQ(got.bytes, good.bytes);
        EXPECT_EQ(bit_mismatches(got.xhat, good.xhat), 0);
        EXPECT_GT(bit_mismatches(got.xhat, bad.xhat), 0) << "0/0 would give the same output";
        EXPECT_NE(got.bytes, bad.bytes);
        for (int64_t i = 0; i < n_tok * d; ++i) {
            const int64_t ch = i % d;
            if (ch >= 64) continue;
            ASSERT_EQ(got.xhat[size_t(i)], round_fp16(ch < 32 ? c_exact : c_inexact)) << i;
            if (ch < 32) {
                ASSERT_TRUE(std::isnan(bad.xhat[size_t(i)])) << i;
            }
        }
        // stored scale 0 and codes 0 for the constant groups
        const int64_t rows = keys ? d : 4, const_rows = keys ? 64 : 2;
        for (int64_t r = 0; r < const_rows; ++r) {
            EXPECT_EQ(got.bytes[size_t(2 * rows + 2 * r)] | got.bytes[size_t(2 * rows + 2 * r + 1)], 0);
            const uint8_t* row = got.bytes.data() + 4 * rows + r * (G * bits / 8);
            for (int j = 0; j < G; ++j) EXPECT_EQ(codecs::kivi::code_at(row, j, bits), 0);
        }
    }
}

// A NaN in a group has no code: the group stores z16 = s16 = NaN and codes 0, so all of it
// decodes to NaN (the NaN reaches attention, as with every cache) and no NaN meets the float ->
// integer conversion (undefined behaviour). The same for a NaN first element (it once set min
// and max) and for groups that overflow fp16, where (x - z) / s is inf / inf.
TEST(KiviParity, NanGroupDecodesToNanAndOverflowGetsDefinedCodes) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (const int bits : {2, 4, 8}) {
        for (const int64_t at : {int64_t(0), int64_t(13), int64_t(31)}) {
            std::vector<float> x(32);
            for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i));
            x[size_t(at)] = nan;
            f16_t z16 = 0, s16 = 0;
            std::vector<uint8_t> codes(32, 0xAA);
            codecs::kivi::quantize_group(x.data(), 32, bits, &z16, &s16, codes.data());
            EXPECT_TRUE(std::isnan(fp16_to_fp32(z16)) && std::isnan(fp16_to_fp32(s16))) << bits << " " << at;
            for (size_t i = 0; i < codes.size(); ++i) {
                ASSERT_EQ(codes[i], 0) << i;
                ASSERT_TRUE(std::isnan(codecs::kivi::dequantize(codes[i], s16, z16))) << i;
            }
        }
        // fp16 overflow: z16 = -inf and s16 = inf, so every t is NaN; the codes are still in range.
        std::vector<float> x = {-1e5f, 0.0f, 1e5f, std::numeric_limits<float>::infinity()};
        x.resize(32, 1.0f);
        f16_t z16 = 0, s16 = 0;
        std::vector<uint8_t> codes(32);
        codecs::kivi::quantize_group(x.data(), 32, bits, &z16, &s16, codes.data());
        for (uint8_t c : codes) ASSERT_LE(int(c), (1 << bits) - 1);
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Readers vs decode-then-dot in double. Tolerance: |reader - exact| <= 1e-5 * sum |q_c x^_c|
// (the attention contract); the readers split the dot into sum (q s)·code + sum q z, so they are
// not bit-identical to dot(q, x^), and this bound covers f32 accumulation over d <= 128 terms.

struct ReaderImpl {
    const char* name;
    bool (*available)();
    void (*scores)(const codecs::kivi::Layout&, const float*, int64_t, const uint8_t*, int64_t, int64_t, float*);
    void (*accumulate)(const codecs::kivi::Layout&, const float*, int64_t, const uint8_t*, int64_t, int64_t, float*);
};
bool always() { return true; }
const ReaderImpl kImpls[] = {
    {"scalar", always, cpu::kivi::key_scores_scalar, cpu::kivi::value_accumulate_scalar},
    {"avx2", cpu::kv_avx2_available, cpu::kivi::key_scores_avx2, cpu::kivi::value_accumulate_avx2},
};

TEST(KiviReader, KeyScoresMatchDecodeThenDot) {
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
    double worst = 0.0;
    for (const int bits : {2, 4, 8})
        for (const int G : {8, 16, 32, 64})
            for (const int64_t d : {64, 128, 72})
                for (const int64_t n_q : {1, 2, 3, 4, 5, 8}) {
                    SCOPED_TRACE(::testing::Message() << "bits " << bits << " G " << G << " d " << d << " n_q " << n_q);
                    const auto codec = make_kivi(KvRole::Key, bits, G, 128, d);
                    const int64_t n = std::max<int64_t>(64, G);
                    std::vector<float> ch_off(static_cast<size_t>(d)), ch_scale(static_cast<size_t>(d));
                    for (int64_t c = 0; c < d; ++c) {
                        ch_off[size_t(c)] = 2.0f * ud(rng);
                        ch_scale[size_t(c)] = std::pow(10.0f, ud(rng));  // outlier channels up to 10x
                    }
                    std::vector<float> x(size_t(n * d));
                    for (int64_t i = 0; i < n * d; ++i) x[size_t(i)] = ch_off[size_t(i % d)] + ch_scale[size_t(i % d)] * nd(rng);
                    const size_t bb = codec->block_bytes(d);
                    std::vector<uint8_t> blocks(size_t(n / G) * bb);
                    std::vector<float> xhat(size_t(n * d));
                    for (int64_t b = 0; b < n / G; ++b) {
                        codec->encode(x.data() + b * G * d, d, blocks.data() + size_t(b) * bb);
                        codec->decode(blocks.data() + size_t(b) * bb, d, xhat.data() + b * G * d);
                    }
                    std::vector<float> q(size_t(n_q * d));
                    for (auto& v : q) v = nd(rng);
                    std::vector<double> exact(size_t(n_q * n)), mag(size_t(n_q * n));
                    for (int64_t h = 0; h < n_q; ++h)
                        for (int64_t t = 0; t < n; ++t) {
                            double e = 0.0, m = 0.0;
                            for (int64_t c = 0; c < d; ++c) {
                                const double pr = double(q[size_t(h * d + c)]) * double(xhat[size_t(t * d + c)]);
                                e += pr;
                                m += std::abs(pr);
                            }
                            exact[size_t(h * n + t)] = e;
                            mag[size_t(h * n + t)] = m;
                        }
                    auto check = [&](const char* name, const std::vector<float>& s) {
                        for (int64_t i = 0; i < n_q * n; ++i) {
                            const double err = std::abs(double(s[size_t(i)]) - exact[size_t(i)]);
                            worst = std::max(worst, err / mag[size_t(i)]);
                            ASSERT_LE(err, 1e-5 * mag[size_t(i)]) << name << " h " << i / n << " t " << i % n;
                        }
                    };
                    std::vector<float> s(size_t(n_q * n), std::nanf(""));
                    cpu::kv_reader(codec->params(d).kind).scores_of(codec->params(d), q.data(), n_q, blocks.data(), n, d, s.data());
                    check("codec reader", s);
                    const codecs::kivi::Layout l = codecs::kivi::key_layout(bits, G, d);
                    for (const auto& impl : kImpls) {
                        if (!impl.available()) continue;
                        std::fill(s.begin(), s.end(), std::nanf(""));
                        impl.scores(l, q.data(), n_q, blocks.data(), n, d, s.data());
                        check(impl.name, s);
                    }
                }
    RecordProperty("worst_relative_error", fmt::format("{:.3g}", worst));
}

TEST(KiviReader, ValueAccumulateMatchesDecodeThenSum) {
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(0.0f, 1.0f);
    double worst = 0.0;
    for (const int bits : {2, 4, 8})
        for (const int G : {8, 32, 64})
            for (const int64_t d : {64, 128, 100, 72})
                for (const int64_t n_q : {1, 2, 3, 4, 5, 8})
                    for (const int64_t n : {64, 13}) {
                        SCOPED_TRACE(::testing::Message() << "bits " << bits << " G " << G << " d " << d << " n_q " << n_q << " n " << n);
                        const auto codec = make_kivi(KvRole::Value, bits, G, 128, d);
                        std::vector<float> x(size_t(n * d));
                        for (auto& v : x) v = 0.5f + 3.0f * nd(rng);
                        const size_t bb = codec->block_bytes(d);
                        std::vector<uint8_t> blocks(size_t(n) * bb);
                        std::vector<float> xhat(size_t(n * d));
                        for (int64_t t = 0; t < n; ++t) {
                            codec->encode(x.data() + t * d, d, blocks.data() + size_t(t) * bb);
                            codec->decode(blocks.data() + size_t(t) * bb, d, xhat.data() + t * d);
                        }
                        std::vector<float> p(size_t(n_q * n));
                        for (auto& v : p) v = ud(rng) / float(n);
                        for (const bool from_zero : {true, false}) {
                            std::vector<float> acc0(size_t(n_q * d), 0.0f);
                            if (!from_zero)
                                for (auto& v : acc0) v = nd(rng);
                            std::vector<double> exact(acc0.begin(), acc0.end()), mag(size_t(n_q * d));
                            for (int64_t i = 0; i < n_q * d; ++i) mag[size_t(i)] = std::abs(double(acc0[size_t(i)]));
                            for (int64_t h = 0; h < n_q; ++h)
                                for (int64_t t = 0; t < n; ++t)
                                    for (int64_t c = 0; c < d; ++c) {
                                        const double pr = double(p[size_t(h * n + t)]) * double(xhat[size_t(t * d + c)]);
                                        exact[size_t(h * d + c)] += pr;
                                        mag[size_t(h * d + c)] += std::abs(pr);
                                    }
                            auto check = [&](const char* name, const std::vector<float>& acc) {
                                for (int64_t i = 0; i < n_q * d; ++i) {
                                    const double err = std::abs(double(acc[size_t(i)]) - exact[size_t(i)]);
                                    worst = std::max(worst, err / mag[size_t(i)]);
                                    ASSERT_LE(err, 1e-5 * mag[size_t(i)]) << name << " h " << i / d << " c " << i % d;
                                }
                            };
                            std::vector<float> acc = acc0;
                            cpu::kv_reader(codec->params(d).kind).accumulate(codec->params(d), p.data(), n_q, blocks.data(), n, d, acc.data());
                            check("codec reader", acc);
                            const codecs::kivi::Layout l = codecs::kivi::value_layout(bits, G, d);
                            for (const auto& impl : kImpls) {
                                if (!impl.available()) continue;
                                acc = acc0;
                                impl.accumulate(l, p.data(), n_q, blocks.data(), n, d, acc.data());
                                check(impl.name, acc);
                            }
                        }
                    }
    RecordProperty("worst_relative_error", fmt::format("{:.3g}", worst));
}

// The AVX2 value dequant (one FMA) reproduces the decoder bit for bit: with p = one-hot rows the
// accumulated output is exactly x^ (p * x^ + 0 with p = 1 is exact).
TEST(KiviReader, Avx2ValueDequantIsBitExact) {
    VXQ_REQUIRE_KV_AVX2();
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (const int bits : {2, 4, 8})
        for (const int64_t d : {64, 128, 100}) {
            const int G = 32;
            const auto codec = make_kivi(KvRole::Value, bits, G, 128, d);
            const int64_t n = 8;
            const size_t bb = codec->block_bytes(d);
            std::vector<uint8_t> blocks(size_t(n) * bb);
            std::vector<float> xhat(size_t(n * d)), x(static_cast<size_t>(d));
            for (int64_t t = 0; t < n; ++t) {
                for (auto& v : x) v = 100.0f + 7.0f * nd(rng);
                codec->encode(x.data(), d, blocks.data() + size_t(t) * bb);
                codec->decode(blocks.data() + size_t(t) * bb, d, xhat.data() + t * d);
            }
            for (int64_t t = 0; t < n; ++t) {
                std::vector<float> p(size_t(n), 0.0f), acc(size_t(d), 0.0f);
                p[size_t(t)] = 1.0f;
                cpu::kivi::value_accumulate_avx2(codecs::kivi::value_layout(bits, G, d), p.data(), 1, blocks.data(), n, d, acc.data());
                const std::vector<float> want(xhat.begin() + t * d, xhat.begin() + (t + 1) * d);
                ASSERT_EQ(bit_mismatches(acc, want), 0) << "bits " << bits << " d " << d << " t " << t;
            }
        }
}

// ---------------------------------------------------------------------------------------------
// 4. Options, spec, flush parameters, bits per element.

TEST(KiviOptions, RejectsBadOptions) {
    auto make = [](const std::string& s, KvRole role = KvRole::Key) { return make_codec(CodecSpec::parse(s), role, 128); };
    EXPECT_THROW(make("kivi:bits=3"), Error);
    EXPECT_THROW(make("kivi:bits=3", KvRole::Value), Error);
    EXPECT_THROW(make("kivi:bits=1"), Error);
    EXPECT_THROW(make("kivi:bits=16"), Error);
    EXPECT_THROW(make("kivi:residual=48"), Error);              // not a multiple of 32
    EXPECT_THROW(make("kivi:group=64,residual=96"), Error);
    EXPECT_THROW(make("kivi:group=64,residual=32"), Error);     // smaller than G
    EXPECT_THROW(make("kivi:group=24"), Error);                 // not a power of two
    EXPECT_THROW(make("kivi:group=4,residual=8"), Error);       // below 8
    EXPECT_THROW(make("kivi:group=512,residual=512"), Error);   // above 256
    EXPECT_THROW(make("kivi:foo=1"), Error);
    EXPECT_THROW(make("kivi:bits=2,window=128"), Error);
    EXPECT_THROW(make("kivi:bits=two"), Error);
    EXPECT_NO_THROW(make("kivi"));
    EXPECT_NO_THROW(make("kivi:bits=8,group=8,residual=8"));
    EXPECT_NO_THROW(make("kivi:bits=4,group=256,residual=512"));
}

TEST(KiviOptions, SpecFlushAndBitsPerElement) {
    const auto k = make_codec(CodecSpec::parse("kivi"), KvRole::Key, 128);
    const auto v = make_codec(CodecSpec::parse("kivi"), KvRole::Value, 128);
    EXPECT_EQ(k->spec(), "kivi:bits=2,group=32,residual=128");
    EXPECT_EQ(v->spec(), "kivi:bits=2,group=32,residual=128");
    EXPECT_EQ(make_codec(CodecSpec::parse("kivi:residual=64,bits=4"), KvRole::Key, 64)->spec(), "kivi:bits=4,group=32,residual=64");
    EXPECT_EQ(k->block_tokens(), 32);
    EXPECT_EQ(k->flush_at(), 128);
    EXPECT_EQ(k->flush_count(), 128);
    EXPECT_EQ(v->block_tokens(), 1);
    EXPECT_EQ(v->flush_at(), 129);
    EXPECT_EQ(v->flush_count(), 1);
    // KIVI-2 at G = 32: (2*32 + 32) / 32 = 3.0 bits per element, keys and values (METHODS.md)
    EXPECT_EQ(k->block_bytes(128), 1536u);
    EXPECT_EQ(v->block_bytes(128), 48u);
    EXPECT_DOUBLE_EQ(k->bits_per_element(128), 3.0);
    EXPECT_DOUBLE_EQ(v->bits_per_element(128), 3.0);
    EXPECT_DOUBLE_EQ(k->bits_per_element(64), 3.0);
    // b + 32 / G in general; ragged values pay for the padding codes and the extra group
    EXPECT_DOUBLE_EQ(make_kivi(KvRole::Key, 4, 32, 128, 128)->bits_per_element(128), 5.0);
    EXPECT_DOUBLE_EQ(make_kivi(KvRole::Value, 4, 32, 128, 128)->bits_per_element(128), 5.0);
    EXPECT_DOUBLE_EQ(make_kivi(KvRole::Key, 8, 64, 128, 128)->bits_per_element(128), 8.5);
    EXPECT_DOUBLE_EQ(make_kivi(KvRole::Key, 2, 128, 128, 128)->bits_per_element(128), 2.25);
    EXPECT_DOUBLE_EQ(make_kivi(KvRole::Value, 2, 32, 128, 100)->bits_per_element(100), 8.0 * 48 / 100);  // 4 groups
    const auto k8 = make_kivi(KvRole::Key, 8, 8, 8, 64);
    EXPECT_EQ(k8->block_tokens(), 8);
    EXPECT_EQ(k8->flush_at(), 8);
    EXPECT_EQ(k8->block_bytes(64), size_t(64 * (4 + 8)));
}

}  // namespace
}  // namespace vxq

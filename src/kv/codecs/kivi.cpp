// KIVI codec: the scalar reference of the format (METHODS.md "KIVI") and the two codecs (keys per
// channel, values per token). Layout and precision rules: kv/formats/kivi.h; readers: kernels/cpu.
#include "kv/formats/kivi.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kv/codecs/codecs.h"
#include "kv/codecs/option_parse.h"

// Parity rule 2: every product and sum rounds on its own (no FMA contraction) in this file.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace vxq::codecs {

namespace kivi {

Params parse_params(const CodecSpec& spec) {
    check_known_options(spec, {"bits", "group", "residual"});
    Params p;
    p.bits = int(int_option(spec, "bits", 2, 1, 8));
    if (p.bits != 2 && p.bits != 4 && p.bits != 8) fail("KV method '{}': bits={} (must be 2, 4 or 8)", spec.name, p.bits);
    p.group = int(int_option(spec, "group", 32, 8, 256));
    if ((p.group & (p.group - 1)) != 0) fail("KV method '{}': group={} is not a power of two", spec.name, p.group);
    p.residual = int_option(spec, "residual", 128, 1, int64_t(1) << 20);
    if (p.residual < p.group || p.residual % p.group != 0) {
        fail("KV method '{}': residual={} must be a multiple of group={}", spec.name, p.residual, p.group);
    }
    return p;
}

// rint(t) for 0 <= t < 2^22 without a libm call (x86-64's baseline has no rounding
// instruction): adding 1.5 * 2^23 leaves no fraction bits, so the FPU's default
// round-to-nearest-even does the rounding; subtracting it back is exact. Same bits as
// std::nearbyint in the default rounding mode (tests/test_kivi.cpp checks ties).
inline float rint_small(float t) {
    constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
    return (t + kMagic) - kMagic;  // not foldable: IEEE arithmetic (no -ffast-math anywhere)
}

void quantize_group(const float* x, int64_t n, int bits, f16_t* z16, f16_t* s16, uint8_t* codes) {
    float mn = x[0], mx = x[0];
    bool has_nan = false;
    for (int64_t i = 0; i < n; ++i) {
        if (x[i] < mn) mn = x[i];
        if (x[i] > mx) mx = x[i];
        has_nan |= x[i] != x[i];
    }
    // A NaN has no code; the group stores zero and scale NaN and codes 0, so all of it decodes to
    // NaN and the NaN reaches the attention output, as with every other cache (never a silent
    // finite value).
    if (has_nan) mn = mx = std::numeric_limits<float>::quiet_NaN();
    const float qmax = float((1 << bits) - 1);
    *z16 = fp32_to_fp16(mn);
    *s16 = fp32_to_fp16((mx - mn) / qmax);  // 0 for a constant group (parity rule 4)
    const float z = fp16_to_fp32(*z16), s = fp16_to_fp32(*s16);
    if (!(s > 0.0f)) {  // no 0/0: every code 0, x^ = z16 (also NaN, for a NaN group)
        std::memset(codes, 0, size_t(n));
        return;
    }
    for (int64_t i = 0; i < n; ++i) {
        // t is NaN when the group overflows fp16 (inf - inf, inf / inf); it clamps to 0 rather
        // than reach the float -> integer conversion, where NaN is undefined behaviour.
        const float t = (x[i] - z) / s;
        codes[i] = uint8_t(rint_small(t >= 0.0f ? std::min(t, qmax) : 0.0f));  // round half to even (parity rule 1)
    }
}

float dequantize(int q, f16_t s16, f16_t z16) {
    const float qs = float(q) * fp16_to_fp32(s16);  // exact anyway: 8 x 11 significant bits
    return qs + fp16_to_fp32(z16);
}

void pack_row(const uint8_t* codes, int64_t n, int bits, uint8_t* row) {
    std::memset(row, 0, size_t(n * bits / 8));
    for (int64_t j = 0; j < n; ++j) {
        const int64_t bit = j * bits;
        row[bit >> 3] = uint8_t(row[bit >> 3] | (codes[j] << (bit & 7)));
    }
}

}  // namespace kivi

namespace {

using kivi::Layout;

std::string spec_string(const kivi::Params& p) {
    return fmt::format("kivi:bits={},group={},residual={}", p.bits, p.group, p.residual);
}

KvFormatParams kivi_params(KvFormatKind kind, const kivi::Params& p, const Layout& l, int64_t d) {
    KvFormatParams f;
    f.kind = kind;
    f.block_tokens = kind == KvFormatKind::KiviKey ? p.group : 1;
    f.block_bytes = l.block_bytes();
    f.bits = p.bits;
    f.group = p.group;
    f.rows = l.rows;
    return f;
}

// Quantizes one row of a block (a key channel over G tokens, or a value group of G channels)
// and stores its zero, scale and packed codes at row r.   vals: [G]
void encode_row(const Layout& l, int64_t r, const float* vals, uint8_t* block) {
    uint8_t codes[256];
    f16_t z16, s16;
    kivi::quantize_group(vals, l.group, l.bits, &z16, &s16, codes);
    std::memcpy(block + l.zero_offset() + 2 * size_t(r), &z16, 2);
    std::memcpy(block + l.scale_offset() + 2 * size_t(r), &s16, 2);
    kivi::pack_row(codes, l.group, l.bits, block + l.codes_offset() + r * l.row_code_bytes());
}

// Keys: a block is G tokens x d channels; row c is channel c over the G tokens.
class KiviKeys final : public Codec {
public:
    KiviKeys(kivi::Params p, int64_t d) : p_(p), l_(kivi::key_layout(p.bits, p.group, d)) {}
    std::string spec() const override { return spec_string(p_); }
    int64_t block_tokens() const override { return p_.group; }
    size_t block_bytes(int64_t d) const override { return kivi::key_layout(p_.bits, p_.group, d).block_bytes(); }
    int64_t flush_at() const override { return p_.residual; }
    int64_t flush_count() const override { return p_.residual; }

    void encode(const float* x, int64_t d, uint8_t* block) const override {
        VXQ_ASSERT(d == l_.rows);
        const int64_t G = p_.group;
        float col[256];
        for (int64_t c = 0; c < d; ++c) {
            for (int64_t t = 0; t < G; ++t) col[t] = x[t * d + c];
            encode_row(l_, c, col, block);
        }
    }
    void decode(const uint8_t* block, int64_t d, float* x) const override {
        VXQ_ASSERT(d == l_.rows);
        const int64_t G = p_.group;
        for (int64_t c = 0; c < d; ++c) {
            f16_t z16, s16;
            std::memcpy(&z16, block + l_.zero_offset() + 2 * size_t(c), 2);
            std::memcpy(&s16, block + l_.scale_offset() + 2 * size_t(c), 2);
            const uint8_t* row = block + l_.codes_offset() + c * l_.row_code_bytes();
            for (int64_t t = 0; t < G; ++t) x[t * d + c] = kivi::dequantize(kivi::code_at(row, t, p_.bits), s16, z16);
        }
    }
    KvFormatParams params(int64_t d) const override { return kivi_params(KvFormatKind::KiviKey, p_, l_, d); }

private:
    kivi::Params p_;
    Layout l_;
};

// Values: a block is one token; row g is channels [gG, gG + G), a ragged last row padded by
// repeating its last real element (parity rule 3).
class KiviValues final : public Codec {
public:
    KiviValues(kivi::Params p, int64_t d) : p_(p), l_(kivi::value_layout(p.bits, p.group, d)) {}
    std::string spec() const override { return spec_string(p_); }
    int64_t block_tokens() const override { return 1; }
    size_t block_bytes(int64_t d) const override { return kivi::value_layout(p_.bits, p_.group, d).block_bytes(); }
    int64_t flush_at() const override { return p_.residual + 1; }
    int64_t flush_count() const override { return 1; }

    void encode(const float* x, int64_t d, uint8_t* block) const override {
        VXQ_ASSERT(kivi::value_layout(p_.bits, p_.group, d).rows == l_.rows);
        const int64_t G = p_.group;
        float grp[256];
        for (int64_t g = 0; g < l_.rows; ++g) {
            const int64_t c0 = g * G, real = std::min(G, d - c0);
            std::copy(x + c0, x + c0 + real, grp);
            std::fill(grp + real, grp + G, x[c0 + real - 1]);
            encode_row(l_, g, grp, block);
        }
    }
    void decode(const uint8_t* block, int64_t d, float* x) const override {
        const int64_t G = p_.group;
        for (int64_t g = 0; g < l_.rows; ++g) {
            f16_t z16, s16;
            std::memcpy(&z16, block + l_.zero_offset() + 2 * size_t(g), 2);
            std::memcpy(&s16, block + l_.scale_offset() + 2 * size_t(g), 2);
            const uint8_t* row = block + l_.codes_offset() + g * l_.row_code_bytes();
            const int64_t c0 = g * G, c1 = std::min(d, c0 + G);
            for (int64_t c = c0; c < c1; ++c) x[c] = kivi::dequantize(kivi::code_at(row, c - c0, p_.bits), s16, z16);
        }
    }
    KvFormatParams params(int64_t d) const override { return kivi_params(KvFormatKind::KiviValue, p_, l_, d); }

private:
    kivi::Params p_;
    Layout l_;
};

}  // namespace

std::unique_ptr<Codec> make_kivi(const CodecSpec& spec, KvRole role, int64_t head_dim, const KvLayerState*) {
    const kivi::Params p = kivi::parse_params(spec);
    if (head_dim < 1) fail("KV method '{}': bad head_dim {}", spec.name, head_dim);
    if (role == KvRole::Key) return std::make_unique<KiviKeys>(p, head_dim);
    return std::make_unique<KiviValues>(p, head_dim);
}

}  // namespace vxq::codecs

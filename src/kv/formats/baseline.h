// Baseline KV formats: the plain caches (f32, f16, bf16), llama.cpp's q8_0 / q4_0 blocks and fp8
// e4m3fn with one scale per stream. All are token-wise (block_tokens = flush_at = flush_count = 1)
// and take no options. Formats (METHODS.md, "Baselines"), per token of head_dim values:
//
//   f32   head_dim fp32                                                     32 bits/element
//   f16   head_dim IEEE binary16, fp32 -> fp16 rounds to nearest even       16
//   bf16  head_dim bfloat16, rounds to nearest even                         16
//   q8_0  head_dim/32 BlockQ8_0 {fp16 d; int8 qs[32]}, x = d * q            8.5
//   q4_0  head_dim/32 BlockQ4_0 {fp16 d; uint8 qs[16]}, x = d * (q - 8);    4.5
//         value j in the low nibble of qs[j], value j+16 in its high nibble
//   fp8   head_dim e4m3fn codes, x = e4m3(code) * scale                     8
//         (the fp32 scale is per stream = per (layer, KV head, K or V), set once from the
//         prompt; its 4 bytes per stream are not counted in block_bytes / bits_per_element)
//
// q8_0 rounding. llama.cpp writes its KV cache with ggml_set_rows (older builds: ggml_cpy), whose
// CPU kernels (ggml-cpu/ops.cpp, ggml_compute_forward_set_rows_f32 / ggml_compute_forward_dup_f32)
// convert each row with `ggml_get_type_traits_cpu(dst->type)->from_float`. For GGML_TYPE_Q8_0 that
// is `quantize_row_q8_0` (ggml-cpu.c, type_traits_cpu), which on an AVX/AVX2 build is the SIMD
// version in ggml-cpu/arch/x86/quants.c, NOT the portable quantize_row_q8_0_ref of ggml-quants.c:
//     d = amax / 127.f (stored as fp16);  id = amax != 0 ? 127.f / amax : 0
//     q = _mm256_cvtps_epi32(_mm256_round_ps(x * id, _MM_ROUND_NEAREST))   -> round half to EVEN
//     then _mm256_packs_epi32 / _mm256_packs_epi16                          -> saturate to int8
// (the _ref version uses id = 1/d and roundf, i.e. round half away from zero; it only runs on
// builds without AVX). We follow the AVX2 path, which is what an x86 llama.cpp user's q8_0 cache
// holds, including its integer conversion: NaN or |x*id| >= 2^31 becomes INT32_MIN -> -128.
//
// q4_0 is ggml's quantize_row_q4_0_ref, which is also what the CPU backend runs (ggml-cpu has no
// SIMD q4_0 quantizer on x86): m = first value of largest magnitude, d = m / -8, id = d ? 1/d : 0,
// q = min(15, (int8_t)(x*id + 8.5f)). The float -> int8 conversion is mirrored as x86 code built
// by GCC executes it (cvttss2si to int32, INT32_MIN when out of range, then keep the low byte), so
// degenerate blocks (tiny subnormal m: 1/d = inf) stay well defined.
//
// fp8 e4m3fn: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; max 448 (0x7e), no
// infinities, NaN = 0x7f / 0xff, subnormals m * 2^-9. encode: code = e4m3(x / scale) rounded to
// nearest even, saturated to +-448 (infinities too); NaN -> 0x7f | sign. scale = amax / 448 over
// the finite values of the first batch (observe_first_batch), 1 when that is 0 (or never observed).
//
// Each format is a struct of static functions (bytes per token, encode, decode of values
// [c0, c0 + len)): the scalar reference that the codecs (kv/codecs/baseline.cpp) store with and
// every backend's reader (kernels/cpu/kv_read_baseline.cpp) is tested against.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/fp16.h"
#include "formats/ggml_quants.h"
#include "formats/ggml_types.h"

namespace vxq::kvfmt {

constexpr int64_t kChunk = 32;  // values of one token a scalar reader dequantizes at a time

// ---- formats: bytes per token, encode, decode of values [c0, c0 + len) -------------------------
// decode_range is called with c0 % 32 == 0 and len <= 32 (len == 32 for q8_0 / q4_0).

struct F32 {
    static constexpr const char* kName = "f32";
    static constexpr bool kBlocks32 = false;
    static size_t bytes(int64_t d) { return size_t(d) * 4; }
    static void encode(const float* x, int64_t d, uint8_t* out, float) { std::memcpy(out, x, bytes(d)); }
    static void decode_range(const uint8_t* tok, int64_t c0, int64_t len, float* x, float) {
        std::memcpy(x, tok + c0 * 4, size_t(len) * 4);
    }
};

// f16 and bf16: two bytes per element; they differ only in the conversion and the AVX2 kernels.
template <typename Conv>
struct Half16 {
    static constexpr const char* kName = Conv::kName;
    static constexpr bool kBlocks32 = false;
    static size_t bytes(int64_t d) { return size_t(d) * 2; }
    static void encode(const float* x, int64_t d, uint8_t* out, float) {
        for (int64_t c = 0; c < d; ++c) {
            const uint16_t h = Conv::to(x[c]);
            std::memcpy(out + 2 * c, &h, 2);
        }
    }
    static void decode_range(const uint8_t* tok, int64_t c0, int64_t len, float* x, float) {
        for (int64_t i = 0; i < len; ++i) {
            uint16_t h;
            std::memcpy(&h, tok + 2 * (c0 + i), 2);
            x[i] = Conv::from(h);
        }
    }
};

struct F16Conv {
    static constexpr const char* kName = "f16";
    static uint16_t to(float x) { return fp32_to_fp16(x); }
    static float from(uint16_t h) { return fp16_to_fp32(h); }
};
struct BF16Conv {
    static constexpr const char* kName = "bf16";
    static uint16_t to(float x) { return fp32_to_bf16(x); }
    static float from(uint16_t h) { return bf16_to_fp32(h); }
};
using F16 = Half16<F16Conv>;
using BF16 = Half16<BF16Conv>;

// x86's float -> int32 conversion (cvtps2dq / cvtss2si, round to nearest even): NaN and values
// outside the int32 range give INT32_MIN; then the signed saturation of packs_epi32/epi16.
inline int8_t q8_from_scaled(float v) {
    if (!(std::fabs(v) < 2147483648.0f)) return -128;
    const float r = std::nearbyint(v);  // default rounding mode: to nearest, ties to even
    return int8_t(std::clamp(r, -128.0f, 127.0f));
}

struct Q8_0 {
    static constexpr const char* kName = "q8_0";
    static constexpr bool kBlocks32 = true;
    static size_t bytes(int64_t d) { return size_t(d / kQK8_0) * sizeof(BlockQ8_0); }
    static void encode(const float* x, int64_t d, uint8_t* out, float) {
        for (int64_t b = 0; b < d / kQK8_0; ++b) {
            const float* xb = x + b * kQK8_0;
            float amax = 0.0f;
            for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(xb[j]));
            BlockQ8_0 blk;
            blk.d = fp32_to_fp16(amax / 127.0f);
            const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
            for (int j = 0; j < kQK8_0; ++j) blk.qs[j] = q8_from_scaled(xb[j] * id);
            std::memcpy(out + b * sizeof(BlockQ8_0), &blk, sizeof blk);
        }
    }
    static void decode_range(const uint8_t* tok, int64_t c0, int64_t len, float* x, float) {
        BlockQ8_0 blk;
        std::memcpy(&blk, tok + (c0 / kQK8_0) * sizeof(BlockQ8_0), sizeof blk);
        const float d = fp16_to_fp32(blk.d);
        for (int j = 0; j < kQK8_0; ++j) x[j] = float(blk.qs[j]) * d;
    }
    // Codes of block b of a token (value j in codes[j]); returns the block's scale.
    static float block_codes(const uint8_t* tok, int64_t b, int8_t codes[32]) {
        BlockQ8_0 blk;
        std::memcpy(&blk, tok + b * sizeof(BlockQ8_0), sizeof blk);
        std::memcpy(codes, blk.qs, 32);
        return fp16_to_fp32(blk.d);
    }
};

struct Q4_0 {
    static constexpr const char* kName = "q4_0";
    static constexpr bool kBlocks32 = true;
    static size_t bytes(int64_t d) { return size_t(d / kQK4_0) * sizeof(BlockQ4_0); }
    // ggml's quantize_row_q4_0_ref (formats/ggml_quants.h), which the CPU backend also runs.
    static void encode(const float* x, int64_t d, uint8_t* out, float) {
        quantize_row_q4_0_ref(x, reinterpret_cast<BlockQ4_0*>(out), d);
    }
    static void decode_range(const uint8_t* tok, int64_t c0, int64_t len, float* x, float) {
        BlockQ4_0 blk;
        std::memcpy(&blk, tok + (c0 / kQK4_0) * sizeof(BlockQ4_0), sizeof blk);
        const float d = fp16_to_fp32(blk.d);
        for (int j = 0; j < kQK4_0 / 2; ++j) {
            x[j] = float(int(blk.qs[j] & 0x0f) - 8) * d;
            x[j + kQK4_0 / 2] = float(int(blk.qs[j] >> 4) - 8) * d;
        }
    }
    // Codes (nibble - 8) of block b of a token, value j in codes[j]; returns the block's scale.
    static float block_codes(const uint8_t* tok, int64_t b, int8_t codes[32]) {
        BlockQ4_0 blk;
        std::memcpy(&blk, tok + b * sizeof(BlockQ4_0), sizeof blk);
        for (int j = 0; j < kQK4_0 / 2; ++j) {
            codes[j] = int8_t(int(blk.qs[j] & 0x0f) - 8);
            codes[j + kQK4_0 / 2] = int8_t(int(blk.qs[j] >> 4) - 8);
        }
        return fp16_to_fp32(blk.d);
    }
};

// e4m3fn value of a code (scale 1).
constexpr float e4m3_value(uint8_t code) {
    const int e = (code >> 3) & 0x0f;
    const int m = code & 0x07;
    if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
    float mag = e == 0 ? float(m) / 512.0f : float(8 + m) / 8.0f;  // subnormal m * 2^-9
    for (int i = 1; i < e; ++i) mag *= 2.0f;                        // normal (1 + m/8) * 2^(e-7)
    if (e != 0) mag /= 64.0f;
    return (code & 0x80) ? -mag : mag;
}

struct E4m3Table {
    float v[256];
    constexpr E4m3Table() : v() {
        for (int c = 0; c < 256; ++c) v[c] = e4m3_value(uint8_t(c));
    }
};
inline constexpr E4m3Table kE4m3;

inline uint8_t e4m3_encode(float x) {
    const uint32_t u = std::bit_cast<uint32_t>(x);
    const uint8_t sign = uint8_t((u >> 24) & 0x80u);
    const float a = std::fabs(x);
    if (std::isnan(a)) return uint8_t(sign | 0x7f);
    if (a >= 448.0f) return uint8_t(sign | 0x7e);  // saturate (infinities too)
    if (a < 0x1p-6f) {                             // subnormal range: code = rne(a * 2^9), 8 = 2^-6
        return uint8_t(sign | uint8_t(std::nearbyint(a * 512.0f)));
    }
    // Normal: keep the exponent and the top 3 mantissa bits of fp32, round the other 20 to even;
    // a carry moves into the exponent. a < 448 so the result is at most 0x7e.
    const uint32_t ua = std::bit_cast<uint32_t>(a);
    uint32_t r = ua >> 20;
    const uint32_t rem = ua & 0xfffffu;
    if (rem > 0x80000u || (rem == 0x80000u && (r & 1u))) ++r;
    return uint8_t(sign | uint8_t(r - ((127u - 7u) << 3)));
}

struct FP8 {
    static constexpr const char* kName = "fp8";
    static constexpr bool kBlocks32 = false;
    static size_t bytes(int64_t d) { return size_t(d); }
    static void encode(const float* x, int64_t d, uint8_t* out, float scale) {
        for (int64_t c = 0; c < d; ++c) out[c] = e4m3_encode(x[c] / scale);
    }
    static void decode_range(const uint8_t* tok, int64_t c0, int64_t len, float* x, float scale) {
        for (int64_t i = 0; i < len; ++i) x[i] = kE4m3.v[tok[c0 + i]] * scale;
    }
};

}  // namespace vxq::kvfmt

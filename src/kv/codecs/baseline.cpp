// Baseline KV codecs: the plain caches (f32, f16, bf16), llama.cpp's q8_0 / q4_0 blocks and fp8
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
// Readers. The scalar readers are the reference; the AVX2 + FMA + F16C readers live in
// baseline_avx2.cpp and are used after a runtime CPU check.
//
// accumulate (all formats) and scores (f32, f16, bf16, fp8): both readers dequantize each token
// exactly as decode() does (the same roundings) in registers (scalar: 32 values of one token at a
// time) and apply it to all n_q query heads before moving on; only the summation order differs
// (see tests/test_codecs_baseline.cpp for the tolerance). This is what llama.cpp's CPU flash
// attention does on the V side for every type (v_to_float, then ggml_vec_mad_f32 into an f32
// accumulator).
//
// scores for q8_0 / q4_0 keys follow llama.cpp's CPU flash attention on the K side instead
// (ggml_compute_forward_flash_attn_ext_f16, ggml-cpu.c in b4748, ggml-cpu/ops.cpp later): the
// query row is converted ONCE to K's vec_dot_type with `q_to_vec_dot` (= the type traits'
// from_float of GGML_TYPE_Q8_0, i.e. the AVX2 quantize_row_q8_0 described above, applied to the
// UNSCALED query), each score is `kq_vec_dot(K row, Q_q)` = ggml_vec_dot_q8_0_q8_0 /
// ggml_vec_dot_q4_0_q8_0, and only then `s = s*scale` (the fused kernel does that multiply). The
// dots, AVX2 branch of ggml-cpu-quants.c: one __m256 accumulator; per 32-block
//     acc = fma(set1(fp16(d_k) * fp16(d_q)), cvtepi32_ps(mul_sum_i8_pairs(k codes, q codes)), acc)
// where mul_sum_i8_pairs leaves in int32 lane l the exact sum of the products of values 4l..4l+3
// (maddubs(|k|, sign(q, k)) then madd with ones; q4_0 codes are nibble - 8 with value j in byte
// j), and the result is hsum_float_8(acc) = ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). The scalar
// reader computes exactly these operations (std::fma, the same lane sums and reduction), so the
// two readers agree bit for bit; the result differs from <q, decode(k)> by the q8_0 rounding of
// the query (|error| <= sum over blocks of amax(q_block)/127 * sum |k values of the block|).
#include <cpuid.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "core/error.h"
#include "core/fp16.h"
#include "formats/ggml_types.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_avx2.h"
#include "kv/codecs/codecs.h"
#include "kv/codecs/option_parse.h"

namespace vxq::codecs {

// AVX2 + FMA + F16C readers (baseline_avx2.cpp). Same contract as CodecReader::scores /
// accumulate; `scale` is fp8's per-stream scale (ignored by the others). head_dim % 8 == 0.
// (q8_0 / q4_0 scores take the query already quantized, qdot_scores_*.)
namespace baseline_avx2 {
#define VXQ_BASELINE_AVX2_DECL(fmt)                                                                          \
    void scores_##fmt(const float* q, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d, float scale,   \
                      float* s);                                                                             \
    void accumulate_##fmt(const float* p, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d, float scale, \
                          float* acc);
VXQ_BASELINE_AVX2_DECL(f32)
VXQ_BASELINE_AVX2_DECL(f16)
VXQ_BASELINE_AVX2_DECL(bf16)
VXQ_BASELINE_AVX2_DECL(fp8)
#undef VXQ_BASELINE_AVX2_DECL
void accumulate_q8_0(const float* p, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d, float scale, float* acc);
void accumulate_q4_0(const float* p, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d, float scale, float* acc);
// llama.cpp's q8_0-query scores for q8_0 / q4_0 keys: qb = n_q * d/32 BlockQ8_0 (34 bytes each,
// the query heads quantized by quantize_row_q8_0), qd = their scales as f32. d % 32 == 0.
void qdot_scores_q8_0(const uint8_t* qb, const float* qd, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,
                      float* s);
void qdot_scores_q4_0(const uint8_t* qb, const float* qd, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,
                      float* s);
}  // namespace baseline_avx2

namespace {

constexpr int64_t kFp8MinPromptTokens = 16;  // shorter prompts do not set fp8's scale
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
    static void avx2_scores(const float* q, int64_t n_q, const uint8_t* b, int64_t n, int64_t d, float sc, float* s) {
        baseline_avx2::scores_f32(q, n_q, b, n, d, sc, s);
    }
    static void avx2_accumulate(const float* p, int64_t n_q, const uint8_t* b, int64_t n, int64_t d, float sc,
                                float* acc) {
        baseline_avx2::accumulate_f32(p, n_q, b, n, d, sc, acc);
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
    static void avx2_scores(const float* q, int64_t n_q, const uint8_t* b, int64_t n, int64_t d, float sc, float* s) {
        Conv::scores(q, n_q, b, n, d, sc, s);
    }
    static void avx2_accumulate(const float* p, int64_t n_q, const uint8_t* b, int64_t n, int64_t d, float sc,
                                float* acc) {
        Conv::accumulate(p, n_q, b, n, d, sc, acc);
    }
};

struct F16Conv {
    static constexpr const char* kName = "f16";
    static uint16_t to(float x) { return fp32_to_fp16(x); }
    static float from(uint16_t h) { return fp16_to_fp32(h); }
    static constexpr auto scores = baseline_avx2::scores_f16;
    static constexpr auto accumulate = baseline_avx2::accumulate_f16;
};
struct BF16Conv {
    static constexpr const char* kName = "bf16";
    static uint16_t to(float x) { return fp32_to_bf16(x); }
    static float from(uint16_t h) { return bf16_to_fp32(h); }
    static constexpr auto scores = baseline_avx2::scores_bf16;
    static constexpr auto accumulate = baseline_avx2::accumulate_bf16;
};
using F16 = Half16<F16Conv>;
using BF16 = Half16<BF16Conv>;

// x86's float -> int32 conversion (cvtps2dq / cvtss2si, round to nearest even): NaN and values
// outside the int32 range give INT32_MIN; then the signed saturation of packs_epi32/epi16.
int8_t q8_from_scaled(float v) {
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
    static void avx2_qdot_scores(const BlockQ8_0* qb, const float* qd, int64_t n_q, const uint8_t* b, int64_t n,
                                 int64_t d, float* s) {
        baseline_avx2::qdot_scores_q8_0(reinterpret_cast<const uint8_t*>(qb), qd, n_q, b, n, d, s);
    }
    static void avx2_accumulate(const float* p, int64_t n_q, const uint8_t* b, int64_t n, int64_t d, float sc,
                                float* acc) {
        baseline_avx2::accumulate_q8_0(p, n_q, b, n, d, sc, acc);
    }
};

// (int8_t)(v) as GCC's x86 code computes it: cvttss2si (truncation; INT32_MIN for NaN and out of
// range), then the low byte.
int8_t int8_trunc_x86(float v) {
    const int32_t i = std::fabs(v) < 2147483648.0f ? int32_t(v) : std::numeric_limits<int32_t>::min();
    return int8_t(uint8_t(uint32_t(i) & 0xffu));
}

struct Q4_0 {
    static constexpr const char* kName = "q4_0";
    static constexpr bool kBlocks32 = true;
    static size_t bytes(int64_t d) { return size_t(d / kQK4_0) * sizeof(BlockQ4_0); }
    static void encode(const float* x, int64_t d, uint8_t* out, float) {
        for (int64_t b = 0; b < d / kQK4_0; ++b) {
            const float* xb = x + b * kQK4_0;
            float amax = 0.0f, m = 0.0f;
            for (int j = 0; j < kQK4_0; ++j) {
                if (amax < std::fabs(xb[j])) {
                    amax = std::fabs(xb[j]);
                    m = xb[j];
                }
            }
            const float dd = m / -8.0f;
            const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
            BlockQ4_0 blk;
            blk.d = fp32_to_fp16(dd);
            for (int j = 0; j < kQK4_0 / 2; ++j) {
                const int lo = std::min<int>(15, int8_trunc_x86(xb[j] * id + 8.5f));
                const int hi = std::min<int>(15, int8_trunc_x86(xb[j + kQK4_0 / 2] * id + 8.5f));
                blk.qs[j] = uint8_t((lo & 0x0f) | ((hi & 0x0f) << 4));
            }
            std::memcpy(out + b * sizeof(BlockQ4_0), &blk, sizeof blk);
        }
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
    static void avx2_qdot_scores(const BlockQ8_0* qb, const float* qd, int64_t n_q, const uint8_t* b, int64_t n,
                                 int64_t d, float* s) {
        baseline_avx2::qdot_scores_q4_0(reinterpret_cast<const uint8_t*>(qb), qd, n_q, b, n, d, s);
    }
    static void avx2_accumulate(const float* p, int64_t n_q, const uint8_t* b, int64_t n, int64_t d, float sc,
                                float* acc) {
        baseline_avx2::accumulate_q4_0(p, n_q, b, n, d, sc, acc);
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
constexpr E4m3Table kE4m3;

uint8_t e4m3_encode(float x) {
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
    static void avx2_scores(const float* q, int64_t n_q, const uint8_t* b, int64_t n, int64_t d, float sc, float* s) {
        baseline_avx2::scores_fp8(q, n_q, b, n, d, sc, s);
    }
    static void avx2_accumulate(const float* p, int64_t n_q, const uint8_t* b, int64_t n, int64_t d, float sc,
                                float* acc) {
        baseline_avx2::accumulate_fp8(p, n_q, b, n, d, sc, acc);
    }
};

// ---- readers ---------------------------------------------------------------------------------

// _mm256_sign_epi8 for one byte: a negated (wrapping: -(-128) = -128) where b < 0, 0 where b == 0.
int8_t sign_epi8(int8_t a, int8_t b) {
    if (b < 0) return int8_t(uint8_t(-int(a)));
    return b == 0 ? int8_t(0) : a;
}

// Int32 lane of ggml's AVX2 mul_sum_i8_pairs_float(x = k, y = q) over 4 values:
// maddubs_epi16(|k| as uint8, sign(q, k)) -> two saturated int16 pair sums, then madd with ones.
int32_t lane_dot4(const int8_t* k, const int8_t* q) {
    int32_t sum = 0;
    for (int p = 0; p < 4; p += 2) {
        int pair = 0;
        for (int i = p; i < p + 2; ++i) pair += int(uint8_t(sign_epi8(k[i], k[i]))) * int(sign_epi8(q[i], k[i]));
        sum += std::clamp(pair, -32768, 32767);
    }
    return sum;
}

// hsum_float_8: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
float hsum_float_8(const float l[8]) {
    const float v0 = l[4] + l[0], v1 = l[5] + l[1], v2 = l[6] + l[2], v3 = l[7] + l[3];
    return (v0 + v2) + (v1 + v3);
}

// The n_q query heads quantized to q8_0 (ggml's AVX2 quantize_row_q8_0), per thread; qd holds
// the block scales as f32.
struct QueryQ8 {
    std::vector<BlockQ8_0> qb;
    std::vector<float> qd;
};

const QueryQ8& quantize_query(const float* q, int64_t n_q, int64_t d, bool avx2) {
    thread_local QueryQ8 buf;
    const int64_t nb = d / kQK8_0;
    buf.qb.resize(size_t(n_q * nb));
    buf.qd.resize(size_t(n_q * nb));
    if (avx2) {
        cpu::avx2::quantize_q8_0(q, buf.qb.data(), buf.qd.data(), n_q * d);  // d % 32 == 0: blocks stay per head
    } else {
        cpu::quantize_row_q8_0(q, buf.qb.data(), n_q * d);
        for (size_t i = 0; i < buf.qb.size(); ++i) buf.qd[i] = fp16_to_fp32(buf.qb[i].d);
    }
    return buf;
}

template <class F>
class ScalarReader final : public CodecReader {
public:
    explicit ScalarReader(const float* scale) : scale_(scale) {}

    void scores(const float* q, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d, float* s) const override {
        if constexpr (F::kBlocks32) {
            qdot_scores(q, n_q, blk, n, d, s);
            return;
        }
        const size_t bb = F::bytes(d);
        const float sc = *scale_;
        float x[kChunk];
        for (int64_t t = 0; t < n; ++t) {
            const uint8_t* tok = blk + size_t(t) * bb;
            for (int64_t h = 0; h < n_q; ++h) s[h * n + t] = 0.0f;
            for (int64_t c0 = 0; c0 < d; c0 += kChunk) {
                const int64_t len = std::min(kChunk, d - c0);
                F::decode_range(tok, c0, len, x, sc);
                for (int64_t h = 0; h < n_q; ++h) {
                    const float* qh = q + h * d + c0;
                    float part = 0.0f;
                    for (int64_t i = 0; i < len; ++i) part += qh[i] * x[i];
                    s[h * n + t] += part;
                }
            }
        }
    }

    void accumulate(const float* p, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,
                    float* acc) const override {
        const size_t bb = F::bytes(d);
        const float sc = *scale_;
        float x[kChunk];
        for (int64_t t = 0; t < n; ++t) {
            const uint8_t* tok = blk + size_t(t) * bb;
            for (int64_t c0 = 0; c0 < d; c0 += kChunk) {
                const int64_t len = std::min(kChunk, d - c0);
                F::decode_range(tok, c0, len, x, sc);
                for (int64_t h = 0; h < n_q; ++h) {
                    const float pt = p[h * n + t];
                    float* ah = acc + h * d + c0;
                    for (int64_t i = 0; i < len; ++i) ah[i] += pt * x[i];
                }
            }
        }
    }

private:
    // q8_0 / q4_0 keys: llama.cpp's q8_0-query dot (see the top of this file), literally.
    static void qdot_scores(const float* q, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d, float* s) {
        const size_t bb = F::bytes(d);
        const int64_t nb = d / 32;
        const QueryQ8& qq = quantize_query(q, n_q, d, false);
        int8_t kc[32];
        for (int64_t t = 0; t < n; ++t) {
            const uint8_t* tok = blk + size_t(t) * bb;
            for (int64_t h = 0; h < n_q; ++h) {
                float acc[8] = {};
                for (int64_t b = 0; b < nb; ++b) {
                    const float dk = F::block_codes(tok, b, kc);
                    const BlockQ8_0& qb = qq.qb[size_t(h * nb + b)];
                    const float dd = dk * qq.qd[size_t(h * nb + b)];
                    for (int l = 0; l < 8; ++l) acc[l] = std::fma(dd, float(lane_dot4(kc + 4 * l, qb.qs + 4 * l)), acc[l]);
                }
                s[h * n + t] = hsum_float_8(acc);
            }
        }
    }

    const float* scale_;
};

// AVX2 reader: the kernels need head_dim % 8 == 0 (always true for q8_0 / q4_0); other head
// dimensions go to the scalar reader.
template <class F>
class Avx2Reader final : public CodecReader {
public:
    Avx2Reader(const float* scale, const CodecReader* fallback) : scale_(scale), fallback_(fallback) {}

    void scores(const float* q, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d, float* s) const override {
        if (d % 8 != 0) return fallback_->scores(q, n_q, blk, n, d, s);
        if constexpr (F::kBlocks32) {
            const QueryQ8& qq = quantize_query(q, n_q, d, true);
            F::avx2_qdot_scores(qq.qb.data(), qq.qd.data(), n_q, blk, n, d, s);
        } else {
            F::avx2_scores(q, n_q, blk, n, d, *scale_, s);
        }
    }
    void accumulate(const float* p, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,
                    float* acc) const override {
        if (d % 8 != 0) return fallback_->accumulate(p, n_q, blk, n, d, acc);
        F::avx2_accumulate(p, n_q, blk, n, d, *scale_, acc);
    }

private:
    const float* scale_;
    const CodecReader* fallback_;
};

bool cpu_has_avx2_fma_f16c() {
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return false;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
    return (ecx & (1u << 29)) != 0;  // F16C (clang 14 rejects __builtin_cpu_supports("f16c"))
}

bool use_avx2() {
    static const bool yes = cpu_has_avx2_fma_f16c();
    return yes;
}

// ---- codecs ----------------------------------------------------------------------------------

class BaselineCodec : public Codec {
public:
    virtual const CodecReader& scalar_reader() const = 0;
    virtual const CodecReader& avx2_reader() const = 0;
};

template <class F>
class Baseline final : public BaselineCodec {
public:
    Baseline() = default;
    Baseline(const Baseline&) = delete;  // the readers point at scale_
    Baseline& operator=(const Baseline&) = delete;

    std::string spec() const override {
        if (fixed_scale_) return fmt::format("{}:scale={}", F::kName, scale_);
        return F::kName;
    }
    size_t block_bytes(int64_t head_dim) const override { return F::bytes(head_dim); }

    // fp8: scale = amax / 448 of the prompt (METHODS.md), when the prompt is a sample worth
    // calibrating on (>= kFp8MinPromptTokens tokens); a shorter one (a lone BOS when text is fed
    // token by token) keeps scale 1, the uncalibrated default vLLM also uses, since one token's
    // amax would clip every larger later value. A fixed `scale=` option skips calibration.
    void observe_first_batch(const float* x, int64_t n, int64_t head_dim) override {
        if constexpr (std::is_same_v<F, FP8>) {
            if (fixed_scale_ || n < kFp8MinPromptTokens) return;
            float amax = 0.0f;
            for (int64_t i = 0; i < n * head_dim; ++i) {
                if (std::isfinite(x[i])) amax = std::max(amax, std::fabs(x[i]));
            }
            const float sc = amax / 448.0f;
            scale_ = sc > 0.0f ? sc : 1.0f;
        }
    }
    void set_fixed_scale(float s) {
        scale_ = s;
        fixed_scale_ = true;
    }

    void encode(const float* x, int64_t head_dim, uint8_t* block) const override {
        F::encode(x, head_dim, block, scale_);
    }
    void decode(const uint8_t* block, int64_t head_dim, float* x) const override {
        for (int64_t c0 = 0; c0 < head_dim; c0 += kChunk) {
            F::decode_range(block, c0, std::min(kChunk, head_dim - c0), x + c0, scale_);
        }
    }

    const CodecReader& reader() const override {
        return use_avx2() ? static_cast<const CodecReader&>(avx2_) : scalar_;
    }
    const CodecReader& scalar_reader() const override { return scalar_; }
    const CodecReader& avx2_reader() const override { return avx2_; }

private:
    float scale_ = 1.0f;  // fp8 only
    bool fixed_scale_ = false;
    ScalarReader<F> scalar_{&scale_};
    Avx2Reader<F> avx2_{&scale_, &scalar_};
};

template <class F>
std::unique_ptr<Codec> make(const CodecSpec& spec, int64_t head_dim) {
    if constexpr (std::is_same_v<F, FP8>) {
        check_known_options(spec, {"scale"});
    } else {
        check_known_options(spec, {});
    }
    if (head_dim <= 0) fail("KV method '{}': head_dim must be positive (got {})", spec.name, head_dim);
    if (F::kBlocks32 && head_dim % 32 != 0) {
        fail("KV method '{}' needs head_dim divisible by 32 (blocks of 32 values), got head_dim {}", spec.name,
             head_dim);
    }
    auto codec = std::make_unique<Baseline<F>>();
    if constexpr (std::is_same_v<F, FP8>) {
        const auto it = spec.options.find("scale");
        if (it != spec.options.end() && it->second != "prompt") {
            char* end = nullptr;
            const float s = std::strtof(it->second.c_str(), &end);
            if (it->second.empty() || *end != '\0' || !std::isfinite(s) || s <= 0.0f) {
                fail("KV method 'fp8': scale must be 'prompt' or a positive number, got '{}'", it->second);
            }
            codec->set_fixed_scale(s);
        }
    }
    return codec;
}

}  // namespace

std::unique_ptr<Codec> make_f32(const CodecSpec& s, KvRole, int64_t head_dim) { return make<F32>(s, head_dim); }
std::unique_ptr<Codec> make_f16(const CodecSpec& s, KvRole, int64_t head_dim) { return make<F16>(s, head_dim); }
std::unique_ptr<Codec> make_bf16(const CodecSpec& s, KvRole, int64_t head_dim) { return make<BF16>(s, head_dim); }
std::unique_ptr<Codec> make_q8_0(const CodecSpec& s, KvRole, int64_t head_dim) { return make<Q8_0>(s, head_dim); }
std::unique_ptr<Codec> make_q4_0(const CodecSpec& s, KvRole, int64_t head_dim) { return make<Q4_0>(s, head_dim); }
std::unique_ptr<Codec> make_fp8(const CodecSpec& s, KvRole, int64_t head_dim) { return make<FP8>(s, head_dim); }

// Test hooks (declared in tests/test_codecs_baseline.cpp): a baseline codec's scalar reader, its
// AVX2 reader (nullptr when the CPU lacks AVX2, FMA or F16C) and the CPU check itself.
namespace detail {
const CodecReader& baseline_scalar_reader(const Codec& c) {
    const auto* b = dynamic_cast<const BaselineCodec*>(&c);
    VXQ_ASSERT(b != nullptr);
    return b->scalar_reader();
}
const CodecReader* baseline_avx2_reader(const Codec& c) {
    const auto* b = dynamic_cast<const BaselineCodec*>(&c);
    VXQ_ASSERT(b != nullptr);
    return use_avx2() ? &b->avx2_reader() : nullptr;
}
}  // namespace detail

}  // namespace vxq::codecs

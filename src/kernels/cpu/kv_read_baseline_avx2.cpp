// AVX2 + FMA + F16C readers of the baseline KV codecs (formats: kv/formats/baseline.h). Compiled with
// -mavx2 -mfma -mf16c; called only after kv_avx2_available(). To keep AVX2 code out
// of functions shared with other translation units (the linker keeps one copy of each inline
// function or template instantiation), this file includes no project header but avx2_inl.h
// (intrinsics-only helpers with internal linkage), instantiates no std
// template, and keeps everything but the entry points in an anonymous namespace.
//
// Every loader below yields 8 values of one token exactly as decode() computes them (same
// roundings), in a register; the kernels apply each loaded chunk to up to 8 query heads at once,
// so for n_q <= 8 every token is dequantized once per call (n_q > 8: once per group of 8 heads).
// Only the summation order differs from the scalar reader (FMA, 8 lanes, 1-2 accumulators).
//
// q8_0 / q4_0 scores are llama.cpp's ggml_vec_dot_q8_0_q8_0 / q4_0_q8_0 (AVX2 branch) against
// the query quantized to q8_0, in exactly its operations (kv_read_baseline.cpp describes them), so they
// equal the scalar reader bit for bit. Each key block's codes are loaded once and applied to up
// to 8 heads.
#include <immintrin.h>

#include "kernels/cpu/avx2_inl.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace vxq::cpu::baseline_avx2 {

namespace {

// ---- loaders: values [c, c + 8) of the token at tok, c % 8 == 0 ----------------------------------

struct LoadF32 {
    __m256 operator()(const uint8_t* tok, int64_t c) const {
        return _mm256_loadu_ps(reinterpret_cast<const float*>(tok) + c);
    }
};

struct LoadF16 {
    __m256 operator()(const uint8_t* tok, int64_t c) const {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tok + 2 * c)));
    }
};

struct LoadBF16 {
    __m256 operator()(const uint8_t* tok, int64_t c) const {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(tok + 2 * c));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
};

// BlockQ8_0 = {fp16 d; int8 qs[32]} (34 bytes): x = float(q) * d.
struct LoadQ8_0 {
    __m256 operator()(const uint8_t* tok, int64_t c) const {
        const uint8_t* b = tok + (c >> 5) * 34;
        const __m256 d = _mm256_set1_ps(fp16_at(b));
        const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + (c & 31)));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
    }
};

// BlockQ4_0 = {fp16 d; uint8 qs[16]} (18 bytes): values j < 16 in the low nibbles of qs[j], j >= 16
// in the high nibbles of qs[j - 16]; x = float(q - 8) * d.
struct LoadQ4_0 {
    __m256 operator()(const uint8_t* tok, int64_t c) const {
        const uint8_t* b = tok + (c >> 5) * 18;
        const __m256 d = _mm256_set1_ps(fp16_at(b));
        const int64_t j = c & 31;
        __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + (j & 15))));
        if (j >= 16) w = _mm256_srli_epi32(w, 4);
        w = _mm256_sub_epi32(_mm256_and_si256(w, _mm256_set1_epi32(15)), _mm256_set1_epi32(8));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(w), d);
    }
};

// e4m3fn code -> fp16 bits: (code & 0x7f) << 7 puts the 4 exponent bits in the low bits of the
// fp16 exponent and the 3 mantissa bits at its top, so the fp16 value is the e4m3 value / 2^8,
// subnormals included (F16C converts fp16 subnormals exactly). Multiplying by 2^8 * scale (exact
// power-of-two scaling of scale) gives e4m3(code) * scale rounded once, as decode() does. Codes
// 0x7f / 0xff (NaN) would read as +-480 and are turned into NaN.
struct LoadFP8 {
    __m256 mul;
    explicit LoadFP8(float scale) : mul(_mm256_set1_ps(scale * 256.0f)) {}
    __m256 operator()(const uint8_t* tok, int64_t c) const {
        const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(tok + c)));
        const __m128i mag = _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), 7);
        const __m128i sign = _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8);
        const __m256 x = _mm256_mul_ps(_mm256_cvtph_ps(_mm_or_si128(mag, sign)), mul);
        const __m128i nan16 = _mm_cmpeq_epi16(mag, _mm_set1_epi16(0x3f80));
        return _mm256_or_ps(x, _mm256_castsi256_ps(_mm256_cvtepi16_epi32(nan16)));  // all ones = NaN
    }
};

// ---- kernels -------------------------------------------------------------------------------------

// s[g * n + t] = <q_g, x_t> for G heads (q: [G, d]). G <= 4: two accumulators per head (chunks
// alternate) to cover the FMA latency; G > 4: the heads' chains already do.
template <class L, int G>
void scores_group(const L& ld, const float* q, const uint8_t* blk, int64_t n, int64_t d, size_t bb, float* s) {
    for (int64_t t = 0; t < n; ++t) {
        const uint8_t* tok = blk + size_t(t) * bb;
        __m256 a0[G], a1[G];
        for (int g = 0; g < G; ++g) a0[g] = a1[g] = _mm256_setzero_ps();
        int64_t c = 0;
        if constexpr (G <= 4) {
            for (; c + 16 <= d; c += 16) {
                const __m256 x0 = ld(tok, c);
                const __m256 x1 = ld(tok, c + 8);
                for (int g = 0; g < G; ++g) {
                    a0[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * d + c), x0, a0[g]);
                    a1[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * d + c + 8), x1, a1[g]);
                }
            }
        }
        for (; c < d; c += 8) {
            const __m256 x = ld(tok, c);
            for (int g = 0; g < G; ++g) a0[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * d + c), x, a0[g]);
        }
        for (int g = 0; g < G; ++g) s[g * n + t] = hsum(_mm256_add_ps(a0[g], a1[g]));
    }
}

// acc[g * d + c] += sum_t p[g * n + t] * x_t[c] for G heads, 16 (G <= 4) or 8 columns per pass
// with the accumulators in registers across the n tokens.
template <class L, int G>
void accumulate_group(const L& ld, const float* p, const uint8_t* blk, int64_t n, int64_t d, size_t bb,
                      float* acc) {
    int64_t c = 0;
    if constexpr (G <= 4) {
        for (; c + 16 <= d; c += 16) {
            __m256 a0[G], a1[G];
            for (int g = 0; g < G; ++g) {
                a0[g] = _mm256_loadu_ps(acc + g * d + c);
                a1[g] = _mm256_loadu_ps(acc + g * d + c + 8);
            }
            for (int64_t t = 0; t < n; ++t) {
                const uint8_t* tok = blk + size_t(t) * bb;
                const __m256 x0 = ld(tok, c);
                const __m256 x1 = ld(tok, c + 8);
                for (int g = 0; g < G; ++g) {
                    const __m256 pg = _mm256_broadcast_ss(p + g * n + t);
                    a0[g] = _mm256_fmadd_ps(pg, x0, a0[g]);
                    a1[g] = _mm256_fmadd_ps(pg, x1, a1[g]);
                }
            }
            for (int g = 0; g < G; ++g) {
                _mm256_storeu_ps(acc + g * d + c, a0[g]);
                _mm256_storeu_ps(acc + g * d + c + 8, a1[g]);
            }
        }
    }
    for (; c < d; c += 8) {
        __m256 a[G];
        for (int g = 0; g < G; ++g) a[g] = _mm256_loadu_ps(acc + g * d + c);
        for (int64_t t = 0; t < n; ++t) {
            const __m256 x = ld(blk + size_t(t) * bb, c);
            for (int g = 0; g < G; ++g) a[g] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + g * n + t), x, a[g]);
        }
        for (int g = 0; g < G; ++g) _mm256_storeu_ps(acc + g * d + c, a[g]);
    }
}

// Runs the query heads in groups of up to 8, the group size as a template argument (the
// accumulators of a group live in registers): fn(first_head, std::integral_constant<int, G>).
template <class Fn>
void for_head_groups(int64_t n_q, Fn&& fn) {
    for (int64_t h0 = 0; h0 < n_q; h0 += 8) {
        switch (n_q - h0 < 8 ? n_q - h0 : 8) {
            case 1: fn(h0, std::integral_constant<int, 1>{}); break;
            case 2: fn(h0, std::integral_constant<int, 2>{}); break;
            case 3: fn(h0, std::integral_constant<int, 3>{}); break;
            case 4: fn(h0, std::integral_constant<int, 4>{}); break;
            case 5: fn(h0, std::integral_constant<int, 5>{}); break;
            case 6: fn(h0, std::integral_constant<int, 6>{}); break;
            case 7: fn(h0, std::integral_constant<int, 7>{}); break;
            default: fn(h0, std::integral_constant<int, 8>{}); break;
        }
    }
}

template <class L>
void scores_all(const L& ld, const float* q, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d, size_t bb,
                float* s) {
    for_head_groups(n_q, [&](int64_t h0, auto g) { scores_group<L, decltype(g)::value>(ld, q + h0 * d, blk, n, d, bb, s + h0 * n); });
}

template <class L>
void accumulate_all(const L& ld, const float* p, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d, size_t bb,
                    float* acc) {
    for_head_groups(n_q, [&](int64_t h0, auto g) { accumulate_group<L, decltype(g)::value>(ld, p + h0 * n, blk, n, d, bb, acc + h0 * d); });
}

// ---- q8_0-query dots for q8_0 / q4_0 keys ---------------------------------------------------------

// The 32 codes of a key block (value j in byte j) as int8.
struct CodesQ8_0 {
    static constexpr size_t kBlockBytes = 34;
    __m256i operator()(const uint8_t* b) const { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)); }
};

// q4_0: low nibbles of qs[0..15] = values 0..15, high nibbles = values 16..31, minus 8
// (ggml's bytes_from_nibbles_32 - 8).
struct CodesQ4_0 {
    static constexpr size_t kBlockBytes = 18;
    __m256i operator()(const uint8_t* b) const {
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
        const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
        return _mm256_sub_epi8(_mm256_and_si256(both, _mm256_set1_epi8(15)), _mm256_set1_epi8(8));
    }
};

constexpr size_t kQ8BlockBytes = 34;  // query blocks: BlockQ8_0

// s[g * n + t] = ggml_vec_dot_<K>_q8_0(k_t, q_g) for G heads; qb: [G, nb] blocks, qd: their scales.
template <class C, int G>
void qdot_group(const uint8_t* qb, const float* qd, const uint8_t* blk, int64_t n, int64_t nb, float* s) {
    const C codes;
    const __m256i ones = _mm256_set1_epi16(1);
    const size_t tb = size_t(nb) * C::kBlockBytes;
    for (int64_t t = 0; t < n; ++t) {
        const uint8_t* tok = blk + size_t(t) * tb;
        __m256 acc[G];
        for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t* kb = tok + size_t(b) * C::kBlockBytes;
            const __m256i kx = codes(kb);
            const __m256i ax = _mm256_sign_epi8(kx, kx);
            const __m256 dk = _mm256_set1_ps(fp16_at(kb));
            for (int g = 0; g < G; ++g) {
                const size_t qi = size_t(g * nb + b);
                const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb + qi * kQ8BlockBytes + 2));
                const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(qy, kx)), ones);
                const __m256 dd = _mm256_mul_ps(dk, _mm256_broadcast_ss(qd + qi));
                acc[g] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(dot), acc[g]);
            }
        }
        for (int g = 0; g < G; ++g) s[g * n + t] = hsum(acc[g]);
    }
}

template <class C>
void qdot_all(const uint8_t* qb, const float* qd, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d, float* s) {
    const int64_t nb = d / 32;
    for_head_groups(n_q, [&](int64_t h0, auto g) {
        qdot_group<C, decltype(g)::value>(qb + size_t(h0 * nb) * kQ8BlockBytes, qd + h0 * nb, blk, n, nb, s + h0 * n);
    });
}

}  // namespace

// Entry points (declared in baseline.cpp). head_dim % 8 == 0 (% 32 for q8_0 / q4_0).
#define VXQ_BASELINE_AVX2_SCORES(fmt, loader, token_bytes)                                                  \
    void scores_##fmt(const float* q, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d, float scale,  \
                      float* s) {                                                                           \
        (void)scale;                                                                                        \
        scores_all(loader, q, n_q, blk, n, d, size_t(token_bytes), s);                                      \
    }
#define VXQ_BASELINE_AVX2_ACCUMULATE(fmt, loader, token_bytes)                                              \
    void accumulate_##fmt(const float* p, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,           \
                          float scale, float* acc) {                                                        \
        (void)scale;                                                                                        \
        accumulate_all(loader, p, n_q, blk, n, d, size_t(token_bytes), acc);                                \
    }

VXQ_BASELINE_AVX2_SCORES(f32, LoadF32{}, d * 4)
VXQ_BASELINE_AVX2_SCORES(f16, LoadF16{}, d * 2)
VXQ_BASELINE_AVX2_SCORES(bf16, LoadBF16{}, d * 2)
VXQ_BASELINE_AVX2_SCORES(fp8, LoadFP8(scale), d)
VXQ_BASELINE_AVX2_ACCUMULATE(f32, LoadF32{}, d * 4)
VXQ_BASELINE_AVX2_ACCUMULATE(f16, LoadF16{}, d * 2)
VXQ_BASELINE_AVX2_ACCUMULATE(bf16, LoadBF16{}, d * 2)
VXQ_BASELINE_AVX2_ACCUMULATE(q8_0, LoadQ8_0{}, d / 32 * 34)
VXQ_BASELINE_AVX2_ACCUMULATE(q4_0, LoadQ4_0{}, d / 32 * 18)
VXQ_BASELINE_AVX2_ACCUMULATE(fp8, LoadFP8(scale), d)
#undef VXQ_BASELINE_AVX2_SCORES
#undef VXQ_BASELINE_AVX2_ACCUMULATE

void qdot_scores_q8_0(const uint8_t* qb, const float* qd, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,
                      float* s) {
    qdot_all<CodesQ8_0>(qb, qd, n_q, blk, n, d, s);
}
void qdot_scores_q4_0(const uint8_t* qb, const float* qd, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,
                      float* s) {
    qdot_all<CodesQ4_0>(qb, qd, n_q, blk, n, d, s);
}

}  // namespace vxq::cpu::baseline_avx2

// Internal: ggml's vectorised exp (ggml_v_expf) evaluated one lane at a time, and the AVX2 kernels
// of ops.cpp / attention.cpp that use it.
//
// llama.cpp b4748 (ggml/src/ggml-cpu/ggml-cpu.c) computes SiLU and the attention softmax with
// ggml_v_expf on 8-lane AVX2 vectors, an exp approximation "adapted from arm limited optimized
// routine" (documented there as max error 1.45358 + 0.5 ulp, inputs above 88.38 flush to inf,
// below -103.97 to zero). Only the element counts that are not a multiple of 8 go through libm
// expf. To reproduce its bits we evaluate the same operations in the same order: the FMAs as
// std::fma, everything else as single roundings; the result of a lane never depends on the other
// lanes, so the scalar function below equals every lane of the vector version.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace vxq::cpu::detail {

// Constants of the approximation (facts taken from ggml_v_expf, ggml-cpu.c, llama.cpp b4748).
inline constexpr float kExpRound = 0x1.8p23f;       // adding it rounds to an integer (in the low bits)
inline constexpr float kExpLog2e = 0x1.715476p+0f;  // 1/ln 2
inline constexpr float kExpLn2Hi = 0x1.62e4p-1f;    // ln 2 split in two parts for an exact reduction
inline constexpr float kExpLn2Lo = 0x1.7f7d1cp-20f;
inline constexpr float kExpC0 = 0x1.ffffecp-1f;  // exp(r) - 1 ~ r*(c0 + c1 r + c2 r^2 + c3 r^3 + c4 r^4)
inline constexpr float kExpC1 = 0x1.fffdb6p-2f;
inline constexpr float kExpC2 = 0x1.555e66p-3f;
inline constexpr float kExpC3 = 0x1.573e2ep-5f;
inline constexpr float kExpC4 = 0x1.0e4020p-7f;

// exp(x) = 2^m * exp(r), m = round(x / ln 2), r = x - m ln 2 (|r| <= ln2 / 2).
inline float ggml_expf(float x) {
    const float z = std::fma(x, kExpLog2e, kExpRound);  // m sits in the low mantissa bits of z
    const float m = z - kExpRound;
    const float r = std::fma(-m, kExpLn2Lo, std::fma(-m, kExpLn2Hi, x));
    const uint32_t e = std::bit_cast<uint32_t>(z) << 23;  // m moved to the exponent field
    const float scale = std::bit_cast<float>(e + std::bit_cast<uint32_t>(1.0f));  // 2^m
    const float r2 = r * r;
    const float q = std::fma(std::fma(std::fma(kExpC4, r, kExpC3), r2, std::fma(kExpC2, r, kExpC1)), r2, kExpC0 * r);
    const float am = std::fabs(m);
    if (!(am > 126.0f)) return std::fma(scale, q, scale);  // 2^m is a normal float
    // |m| > 126: 2^m split in two factors s1 * s2 so that neither under/overflows on its own.
    const uint32_t g = m <= 0.0f ? 0x82000000u : 0u;
    const float s1 = std::bit_cast<float>(g + 0x7f000000u);
    if (am > 192.0f) return s1 * s1;  // certain overflow (inf) or underflow (0)
    const float s2 = std::bit_cast<float>(e - g);
    return std::fma(s2, q, s2) * s1;
}

// ggml_v_silu, one lane: x / (1 + exp(0 - x)).
inline float ggml_silu(float x) { return x / (1.0f + ggml_expf(0.0f - x)); }

// ggml_silu_f32 (the scalar leftovers of ggml_vec_silu_f32): libm expf.
inline float libm_silu(float x) { return x / (1.0f + std::exp(-x)); }

// AVX2 + FMA kernels (ops_avx2.cpp); call only when cpu_has_avx2() (attention_impl.h).
void vec_expf_avx2(const float* x, float* y, int64_t n);
void swiglu_rows_avx2(float* gate, const float* up, int64_t n_rows, int64_t n_cols);

}  // namespace vxq::cpu::detail

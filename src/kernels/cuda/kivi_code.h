// A KIVI code as kivi::quantize_group computes it (kv/codecs/kivi.cpp): rint(clamp((x - z) / s,
// 0, qmax)) with the division correctly rounded, for the device encoders (kivi.cu) and, on the
// host, for the test of the reciprocal form's error argument (tests/test_kivi.cpp). The same
// arithmetic on both sides: the device spells each rounding (__fsub_rn, __fdiv_rn, __fmul_rn: no
// contraction), the host's float operations round alike.
#pragma once

#include <cmath>
#if !defined(__CUDA_ARCH__)
#include <bit>
#endif

#if defined(__CUDACC__)
#define VXQ_KIVI_CODE_FN __host__ __device__ __forceinline__
#else
#define VXQ_KIVI_CODE_FN inline
#endif

namespace vxq::cuda {

VXQ_KIVI_CODE_FN float kivi_sub(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}
VXQ_KIVI_CODE_FN float kivi_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
VXQ_KIVI_CODE_FN unsigned kivi_bits(float a) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(a);
#else
    return std::bit_cast<unsigned>(a);
#endif
}
VXQ_KIVI_CODE_FN float kivi_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
VXQ_KIVI_CODE_FN float kivi_fma(float a, float b, float c) {
#ifdef __CUDA_ARCH__
    return __fmaf_rn(a, b, c);
#else
    return std::fma(a, b, c);
#endif
}
VXQ_KIVI_CODE_FN float kivi_div(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

// The code of x in a group of zero z and scale s > 0. A zero numerator (x is the group's
// minimum: every group has one) is taken apart: __fdiv_rn's range check sends it down its slow
// path, a subroutine the whole warp then runs (ncu on the flush of 2048 tokens: a fifth of the
// encoder's instructions).
VXQ_KIVI_CODE_FN unsigned kivi_code(float x, float z, float s, float qmax) {
    const float num = kivi_sub(x, z);
    const float t = num == 0.0f ? 0.0f : kivi_div(num == 0.0f ? s : num, s);
    return unsigned(rintf(t >= 0.0f ? fminf(t, qmax) : 0.0f));
}

// The same code from s's reciprocal inv_s = 1 / s (correctly rounded, once per group): q = (x -
// z) * inv_s, two roundings, is within 2^-23 q of the real quotient and 1.5 2^-23 q of the
// correctly rounded one, and rint(clamp(., 0, qmax)) only changes value at the half-integers:
// where q is farther than 1e-6 max(q, 1) from the nearest one both give the same code; nearer
// (and for a NaN or infinite q) the division decides. Both forms take the same rounded x - z;
// x, z and s are fp16 values, so 1 / s, x - z and q are normal floats (or 0) and the bound holds.
// Outside [0, qmax] the code is 0 or qmax whichever side of the nearest half-integer (-0.5,
// qmax + 0.5) q and the quotient fall, so only the clamped c = clamp(q) is tested: its rint is
// 2^23 + c rounded to nearest even (rintf's rounding; c <= 255), held in the sum's low mantissa
// bits, and c's distance to the nearest half-integer is 0.5 - |c - rint(c)|, exactly (where
// floorf and a conversion instruction took five more instructions a code).
constexpr float kKiviRoundBias = 8388608.0f;         // 2^23: 2^23 + c holds rint(c) in its low mantissa bits
constexpr unsigned kKiviRoundBiasBits = 0x4B000000u;  // its f32 bits
#if !defined(__CUDA_ARCH__)
static_assert(std::bit_cast<unsigned>(kKiviRoundBias) == kKiviRoundBiasBits);
#endif
VXQ_KIVI_CODE_FN float kivi_code_clamp(float q, float qmax) { return fminf(fmaxf(q, 0.0f), qmax); }  // NaN -> 0
VXQ_KIVI_CODE_FN float kivi_round_biased(float c) { return kivi_add(c, kKiviRoundBias); }  // 2^23 + rint(c)
VXQ_KIVI_CODE_FN bool kivi_code_near_tie(float c, float biased) {
    const float gap = 0.5f - fabsf(c - kivi_sub(biased, kKiviRoundBias));
    return !(gap > fmaxf(c, 1.0f) * 1e-6f);
}
VXQ_KIVI_CODE_FN unsigned kivi_code_rcp(float x, float z, float s, float inv_s, float qmax) {
    const float c = kivi_code_clamp(kivi_mul(kivi_sub(x, z), inv_s), qmax);
    const float biased = kivi_round_biased(c);
    if (kivi_code_near_tie(c, biased)) return kivi_code(x, z, s, qmax);
    return kivi_bits(biased) - kKiviRoundBiasBits;
}

// The flush kernel's form (kivi_flush_kernels.cuh), two fused multiply-adds a code: with d = x -
// z (rounded, as above) and P = d inv_s exact, b = RN(P + 2^23) holds rint(P) in its low mantissa
// bits (P < 2^22) and f = RN(P - rint(P)) is P's distance past that integer, within 2^-25. P is
// within 2^-24 P of the real quotient D = d / s (inv_s is 1 / s correctly rounded) and the CPU's
// quotient fl(D) within 2^-24 D of D, so |P - fl(D)| <= 2^-23 D. D is at most 1.5 qmax (s16 is
// (mx - mn) / qmax rounded to fp16: at worst 2^-24 for a quotient just under 1.5 2^-24; within
// 2^-11 relative where normal), so 2^-23 D < 2.7e-6 for qmax <= 15: where |f| < kKiviTieGap =
// 0.5 - 1e-5, rint(P) = rint(fl(D)), and the code is min(rint(P), qmax) (clamping to the integer
// bounds commutes with rint; d >= 0: z is the group's minimum). Elsewhere -- near a half-integer,
// or P NaN (an infinite d or s: x or the group infinite) -- near_tie says the division decides
// (kivi_code). KiviParity.FmaCodeEqualsDivision checks both on the host.
constexpr float kKiviTieGap = 0.5f - 1e-5f;
struct KiviFmaCode {
    unsigned biased_bits;  // kKiviRoundBiasBits + rint(P) where !near_tie
    bool near_tie;
};
VXQ_KIVI_CODE_FN KiviFmaCode kivi_code_fma(float d, float inv_s) {
    const float b = kivi_fma(d, inv_s, kKiviRoundBias);
    const float f = kivi_fma(d, inv_s, -kivi_sub(b, kKiviRoundBias));
    return KiviFmaCode{kivi_bits(b), !(fabsf(f) < kKiviTieGap)};
}

// A group's first minimum and maximum in order, and whether it holds a NaN (kivi::quantize_group's
// loop), of the n values get(0..n-1). (A -0 and a +0 compare equal: the first of them stays, and
// its sign reaches the zero's fp16 bits.)
struct KiviRange {
    float mn, mx;
    bool nan;
};
template <class Get>
VXQ_KIVI_CODE_FN KiviRange kivi_range(Get get, int n) {
    const float x0 = get(0);
    KiviRange r{x0, x0, false};
    for (int i = 0; i < n; ++i) {
        const float x = get(i);
        if (x < r.mn) r.mn = x;
        if (x > r.mx) r.mx = x;
        r.nan |= x != x;
    }
    return r;
}

}  // namespace vxq::cuda

// Internal, AVX2 + FMA only: include from *_avx2.cpp files exclusively (they are the only ones
// compiled with -mavx2 -mfma -mf16c). The 8-lane form of detail::ggml_expf (ops_impl.h), i.e. of
// ggml's AVX2 ggml_v_expf: same operations per lane, the rare-range fixups chosen by blends.
#pragma once

#include <immintrin.h>

#include "kernels/cpu/ops_impl.h"

namespace vxq::cpu::detail {

inline __m256 expf8(__m256 x) {
    const __m256 round = _mm256_set1_ps(kExpRound);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(kExpLog2e), round);
    const __m256 m = _mm256_sub_ps(z, round);
    const __m256 r = _mm256_fnmadd_ps(m, _mm256_set1_ps(kExpLn2Lo), _mm256_fnmadd_ps(m, _mm256_set1_ps(kExpLn2Hi), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 scale = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_set1_epi32(0x3f800000)));  // 2^m
    const __m256 r2 = _mm256_mul_ps(r, r);
    const __m256 hi = _mm256_fmadd_ps(_mm256_set1_ps(kExpC4), r, _mm256_set1_ps(kExpC3));
    const __m256 lo = _mm256_fmadd_ps(_mm256_set1_ps(kExpC2), r, _mm256_set1_ps(kExpC1));
    const __m256 q = _mm256_fmadd_ps(_mm256_fmadd_ps(hi, r2, lo), r2, _mm256_mul_ps(_mm256_set1_ps(kExpC0), r));
    const __m256 normal = _mm256_fmadd_ps(scale, q, scale);
    const __m256 am = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), m);
    const __m256 big = _mm256_cmp_ps(am, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
    if (_mm256_testz_ps(big, big)) return normal;  // no lane needs the split scale (the usual case)
    const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(m, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                       _mm256_set1_epi32(int(0x82000000u)));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256 split = _mm256_mul_ps(_mm256_fmadd_ps(s2, q, s2), s1);
    const __m256 huge = _mm256_cmp_ps(am, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
    return _mm256_blendv_ps(_mm256_blendv_ps(normal, split, big), _mm256_mul_ps(s1, s1), huge);
}

}  // namespace vxq::cpu::detail

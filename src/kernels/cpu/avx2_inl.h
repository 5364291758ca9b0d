// Internal, AVX2 only: included from the AVX2 translation units exclusively (kv_read_*_avx2.cpp,
// matmul_avx2.cpp, matmul_kquants_avx2.cpp), which keep every helper out of functions shared with
// other translation units (kv_read_baseline_avx2.cpp says why). So this header holds intrinsics-only helpers with internal linkage (an anonymous
// namespace: each of those files gets its own copy), includes only <immintrin.h> and <cstdint>, and
// instantiates no template.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace vxq::cpu {
namespace {

// The sum of the 8 lanes: (0+4, 1+5, 2+6, 3+7), then pairs, then the last two: ggml's
// hsum_float_8, i.e. ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
inline float hsum(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

// The fp16 value at a byte address (any alignment), by F16C: core/fp16.h's load_fp16, bit for bit.
inline float fp16_at(const uint8_t* p) {
    unsigned short h;
    __builtin_memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

}  // namespace
}  // namespace vxq::cpu

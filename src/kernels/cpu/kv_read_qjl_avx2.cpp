// AVX2 kernel of the QJL key reader (kv_read_qjl.cpp): the signed sum of a projected query over a
// token's packed sign bits. Compiled with -mavx2 -mfma -mf16c and called only after
// kv_avx2_available(); includes no project header but avx2_inl.h and keeps its helpers in an anonymous
// namespace (see kv_read_baseline_avx2.cpp). Each sign byte is broadcast to 8 lanes, tested
// against the lane's bit, and a clear bit flips the sign of the lane's value (xor of the IEEE sign
// bit: exact), so only the summation order differs from the scalar reader.
#include "kernels/cpu/kv_read_qjl.h"

#include <immintrin.h>

#include "kernels/cpu/avx2_inl.h"

namespace vxq::cpu::qjl_avx2 {

namespace {

// The 8 values v[0..8) with the sign of lane j flipped where bit j of `byte` is clear.
inline __m256 signed8(const float* v, uint8_t byte) {
    const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i clear = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(byte), lane_bit), _mm256_setzero_si256());
    const __m256 flip = _mm256_castsi256_ps(_mm256_and_si256(clear, _mm256_set1_epi32(int(0x80000000u))));
    return _mm256_xor_ps(_mm256_loadu_ps(v), flip);
}

}  // namespace

float signed_sum(const float* v, const uint8_t* bits, int64_t m) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= m; i += 16) {
        a0 = _mm256_add_ps(a0, signed8(v + i, bits[i >> 3]));
        a1 = _mm256_add_ps(a1, signed8(v + i + 8, bits[(i >> 3) + 1]));
    }
    if (i < m) a0 = _mm256_add_ps(a0, signed8(v + i, bits[i >> 3]));
    return hsum(_mm256_add_ps(a0, a1));
}

}  // namespace vxq::cpu::qjl_avx2

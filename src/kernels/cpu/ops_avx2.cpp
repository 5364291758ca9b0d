// AVX2 + FMA kernels of ops.cpp (ggml's 8-lane exp and SiLU); compiled only into this file, called
// after a runtime CPU check. Each lane computes exactly detail::ggml_expf (ops_impl.h).
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/ops_avx2_inl.h"
#include "kernels/cpu/ops_impl.h"

#pragma GCC optimize("fp-contract=off")  // GCC would otherwise fuse _mm256_mul_ps + _mm256_add_ps

namespace vxq::cpu::detail {

void vec_expf_avx2(const float* x, float* y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, expf8(_mm256_loadu_ps(x + i)));
    if (i < n) {  // lane-independent: a partial vector gives the same bits as ggml_expf
        alignas(32) float t[8] = {};
        for (int64_t k = i; k < n; ++k) t[k - i] = x[k];
        _mm256_store_ps(t, expf8(_mm256_load_ps(t)));
        for (int64_t k = i; k < n; ++k) y[k] = t[k - i];
    }
}

void swiglu_rows_avx2(float* gate, const float* up, int64_t n_rows, int64_t n_cols) {
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t r = 0; r < n_rows; ++r) {
        float* g = gate + r * n_cols;
        const float* u = up + r * n_cols;
        int64_t c = 0;
        for (; c + 8 <= n_cols; c += 8) {  // ggml_v_silu, then ggml_mul
            const __m256 x = _mm256_loadu_ps(g + c);
            const __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, expf8(_mm256_sub_ps(zero, x))));
            _mm256_storeu_ps(g + c, _mm256_mul_ps(s, _mm256_loadu_ps(u + c)));
        }
        for (; c < n_cols; ++c) g[c] = libm_silu(g[c]) * u[c];  // ggml_silu_f32 leftovers
    }
}

}  // namespace vxq::cpu::detail

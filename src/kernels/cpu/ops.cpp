#include "kernels/cpu/ops.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/attention_impl.h"  // detail::cpu_has_avx2
#include "kernels/cpu/ops_impl.h"

// Every rounding is written out: products and sums are not contracted into FMAs here, the FMAs that
// ggml's build has are explicit std::fma calls.
#pragma GCC optimize("fp-contract=off")

namespace vxq::cpu {

void rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps, float* y) {
    for (int64_t r = 0; r < n_rows; ++r) {
        const float* xr = x + r * dim;
        float* yr = y + r * dim;
        double sum = 0.0;  // ggml_float
        for (int64_t c = 0; c < dim; ++c) sum += double(xr[c] * xr[c]);
        // ggml: `const float mean = sum/ne00; const float scale = 1.0f/sqrtf(mean + eps);` — the
        // mean is rounded to float before eps is added (in float).
        const float mean = float(sum / double(dim));
        const float scale = 1.0f / std::sqrt(mean + eps);
        for (int64_t c = 0; c < dim; ++c) yr[c] = (xr[c] * scale) * weight[c];
    }
}

void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t pos0, const RopeParams& p) {
    // ggml_rope_cache_init: theta_{i+1} = theta_i * base^(-2/n_dims), cos/sin by cosf/sinf
    // (freq_scale = 1, ext_factor = 0, attn_factor = 1 multiply exactly).
    const float theta_scale = std::pow(p.freq_base, -2.0f / float(p.n_rot));
    std::vector<float> cs(size_t(p.n_rot));
    for (int64_t t = 0; t < n_tokens; ++t) {
        float theta = float(pos0 + t);
        for (int64_t i0 = 0; i0 < p.n_rot; i0 += 2) {
            cs[size_t(i0)] = std::cos(theta);
            cs[size_t(i0 + 1)] = std::sin(theta);
            theta *= theta_scale;
        }
        for (int64_t h = 0; h < n_heads; ++h) {
            float* v = x + (t * n_heads + h) * head_dim;
            for (int64_t i0 = 0; i0 < p.n_rot; i0 += 2) {
                const float c = cs[size_t(i0)], s = cs[size_t(i0 + 1)];
                const int64_t a = p.neox ? i0 / 2 : i0;
                const int64_t b = p.neox ? i0 / 2 + p.n_rot / 2 : i0 + 1;
                const float x0 = v[a], x1 = v[b];
                // ggml writes `x0*cos_theta - x1*sin_theta` and `x0*sin_theta + x1*cos_theta`; its
                // C is built as gnu11 with -O3 on an FMA target, where GCC (and Clang) fuse the
                // first product of each: checked by compiling that loop with gcc 12 and clang.
                v[a] = std::fma(x0, c, -(x1 * s));
                v[b] = std::fma(x0, s, x1 * c);
            }
        }
    }
}

void vec_expf_ref(const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = detail::ggml_expf(x[i]);
}

void vec_expf(const float* x, float* y, int64_t n) {
    static const bool avx2 = detail::cpu_has_avx2();
    if (avx2) {
        detail::vec_expf_avx2(x, y, n);
    } else {
        vec_expf_ref(x, y, n);
    }
}

void swiglu_rows_ref(float* gate, const float* up, int64_t n_rows, int64_t n_cols) {
    const int64_t n_vec = n_cols - n_cols % 8;  // ggml_vec_silu_f32: `for (; i + 7 < n; i += 8)`
    for (int64_t r = 0; r < n_rows; ++r) {
        float* g = gate + r * n_cols;
        const float* u = up + r * n_cols;
        for (int64_t c = 0; c < n_vec; ++c) g[c] = detail::ggml_silu(g[c]) * u[c];
        for (int64_t c = n_vec; c < n_cols; ++c) g[c] = detail::libm_silu(g[c]) * u[c];
    }
}

void swiglu_rows(float* gate, const float* up, int64_t n_rows, int64_t n_cols) {
    static const bool avx2 = detail::cpu_has_avx2();
    if (avx2) {
        detail::swiglu_rows_avx2(gate, up, n_rows, n_cols);
    } else {
        swiglu_rows_ref(gate, up, n_rows, n_cols);
    }
}

void swiglu(float* gate, const float* up, int64_t n) { swiglu_rows(gate, up, 1, n); }

void add(float* x, const float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void add_bias(float* x, const float* b, int64_t n_rows, int64_t dim) {
    for (int64_t r = 0; r < n_rows; ++r) add(x + r * dim, b, dim);
}

}  // namespace vxq::cpu

#include "kernels/cpu/ops.h"

#include <cmath>
#include <vector>

#pragma GCC optimize("fp-contract=off")

namespace vxq::cpu {

void rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps, float* y) {
    for (int64_t r = 0; r < n_rows; ++r) {
        const float* xr = x + r * dim;
        float* yr = y + r * dim;
        double sum = 0.0;
        for (int64_t c = 0; c < dim; ++c) sum += double(xr[c] * xr[c]);
        const double mean = sum / double(dim);
        const float scale = 1.0f / std::sqrt(float(mean + double(eps)));
        for (int64_t c = 0; c < dim; ++c) yr[c] = (xr[c] * scale) * weight[c];
    }
}

void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t pos0, const RopeParams& p) {
    // ggml builds the angles by repeated multiplication: theta_{i+1} = theta_i * base^(-2/n_rot).
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
                v[a] = x0 * c - x1 * s;
                v[b] = x0 * s + x1 * c;
            }
        }
    }
}

void swiglu(float* gate, const float* up, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const float g = gate[i];
        gate[i] = (g / (1.0f + std::exp(-g))) * up[i];
    }
}

void add(float* x, const float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void add_bias(float* x, const float* b, int64_t n_rows, int64_t dim) {
    for (int64_t r = 0; r < n_rows; ++r) add(x + r * dim, b, dim);
}

}  // namespace vxq::cpu

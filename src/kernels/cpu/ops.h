// Element-wise and row-wise CPU ops of the forward pass, in ggml's numerics.
#pragma once

#include <cstdint>

namespace vxq::cpu {

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, with the mean of squares summed in double.
//   x, y: [n_rows, dim] (may alias); weight: [dim]
void rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps, float* y);

struct RopeParams {
    int64_t n_rot;       // rotated dimensions (the rest pass through)
    float freq_base;
    bool neox;           // rotate (i, i + n_rot/2) instead of (2i, 2i+1)
};

// Rotates each head of n_tokens tokens at positions pos0, pos0+1, ... in place.
//   x: [n_tokens, n_heads, head_dim]
void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t pos0, const RopeParams& p);

// gate[i] = silu(gate[i]) * up[i]
void swiglu(float* gate, const float* up, int64_t n);

// x[i] += y[i]
void add(float* x, const float* y, int64_t n);

// x[r][c] += b[c];  x: [n_rows, dim]
void add_bias(float* x, const float* b, int64_t n_rows, int64_t dim);

}  // namespace vxq::cpu

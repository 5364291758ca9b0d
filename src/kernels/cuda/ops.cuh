// The element-wise and normalization ops of the CUDA backend. All pointers are device memory;
// each function launches on `stream` and returns without waiting.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "backend/types.h"

namespace vxq::cuda {

// y = x / sqrt(mean(x^2) + eps) * weight, per row.  x, y: [n_rows, dim] (may alias); weight: [dim]
void rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps, float* y, cudaStream_t stream);
// In place.  x: [n_tokens, n_heads, head_dim], token t at position *pos0 + t (pos0: device memory,
// so a captured graph reads the step's position)
void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int64_t* pos0, const RopeParams& p,
          cudaStream_t stream);
// gate = silu(gate) * up.  gate, up: [n]
void swiglu(float* gate, const float* up, int64_t n, cudaStream_t stream);
// x += y.  x, y: [n]
void add(float* x, const float* y, int64_t n, cudaStream_t stream);
// x[r] += b for every row.  x: [n_rows, dim]; b: [dim]
void add_bias(float* x, const float* b, int64_t n_rows, int64_t dim, cudaStream_t stream);

}  // namespace vxq::cuda

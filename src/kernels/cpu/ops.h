// Element-wise and row-wise CPU ops of the forward pass, in the numerics of llama.cpp b4748's CPU
// backend on an AVX2+FMA machine (ggml/src/ggml-cpu/ggml-cpu.c), bit for bit:
//   rms_norm  ggml_compute_forward_rms_norm_f32 then ggml_mul by the weight
//   rope      ggml_compute_forward_rope_f32 (rope cache by repeated multiplication, rotation as
//             GCC/Clang contract it in ggml's -std=gnu11 build: two FMAs)
//   swiglu    ggml_silu (ggml_vec_silu_f32, row by row) then ggml_mul by up
// Each function with an AVX2 kernel has a scalar reference (*_ref) giving the same bits.
#pragma once

#include <cstdint>

#include "backend/types.h"

namespace vxq::cpu {

// y[r] = (x[r] * s) * weight with s = 1.0f / sqrtf(float(sum(x^2) in double / dim) + eps).
//   x, y: [n_rows, dim] (may alias); weight: [dim]
void rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps, float* y);

// Rotates each head of n_tokens tokens at positions pos0, pos0+1, ... in place:
//   x0' = fma(x0, cos, -(x1 * sin)),  x1' = fma(x0, sin, x1 * cos).
//   x: [n_tokens, n_heads, head_dim]
void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t pos0, const RopeParams& p);

// gate[r][c] = silu(gate[r][c]) * up[r][c] for n_rows rows of n_cols, silu as ggml_vec_silu_f32
// applies it to one row: ggml_v_expf for each full group of 8 from the row start, libm expf for
// the n_cols % 8 last ones. The row length therefore matters (it is n_ff in the FFN).
void swiglu_rows(float* gate, const float* up, int64_t n_rows, int64_t n_cols);
void swiglu_rows_ref(float* gate, const float* up, int64_t n_rows, int64_t n_cols);

// swiglu_rows with one row of n.
void swiglu(float* gate, const float* up, int64_t n);

// y[i] = ggml_v_expf(x[i]) (ggml's 8-lane exp approximation, every element, no libm tail).
void vec_expf(const float* x, float* y, int64_t n);
void vec_expf_ref(const float* x, float* y, int64_t n);

// x[i] += y[i]
void add(float* x, const float* y, int64_t n);

// x[r][c] += b[c];  x: [n_rows, dim]
void add_bias(float* x, const float* b, int64_t n_rows, int64_t dim);

}  // namespace vxq::cpu

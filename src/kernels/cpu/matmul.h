// Weight x activation products for the CPU backend.
//
// Numerics follow llama.cpp's CPU path on an AVX2 machine bit for bit, so greedy text and
// perplexity can be compared token for token:
//   - activations are first converted to the weight's "dot type": F32 -> f32 (unchanged),
//     F16 -> f16, BF16 -> bf16, Q8_0 and Q4_0 -> q8_0 blocks (ggml's AVX2 quantize_row_q8_0),
//     Q6_K, TQ1_0, TQ2_0 and veloxquant's TQ2_G128 -> q8_K blocks (matmul_kquants.h);
//   - every dot product accumulates in 8 lanes and is reduced in ggml's order (see matmul.cpp).
// The scalar reference (matmul_ref) computes the very same sums in the very same order, so the
// optimized kernels must equal it exactly.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/types.h"
#include "formats/ggml_types.h"

namespace vxq {
class ThreadPool;
}

namespace vxq::cpu {

// y[t, r] = sum_c W[r, c] * x[t, c] for t < n_tokens.
//   x: [n_tokens, cols] f32, row-major, contiguous
//   y: [n_tokens, rows] f32, row-major, contiguous
void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool);

// Scalar reference of matmul: same conversions, same summation order, one thread, no SIMD.
void matmul_ref(const WeightView& w, const float* x, int64_t n_tokens, float* y);

// Row r of a weight matrix dequantized to f32 (token embedding lookup). out: [cols]
void dequantize_row(const WeightView& w, int64_t r, float* out);

// ggml's quantize_row_q8_0 as run on AVX2 (d = amax/127 stored as fp16, codes
// round-half-even(x * 127/amax)). n must be a multiple of 32. out: [n / 32] blocks.
void quantize_row_q8_0(const float* x, BlockQ8_0* out, int64_t n);

// Which implementation matmul dispatches to on this CPU ("avx2", "scalar").
const char* matmul_isa();

// The summation order llama.cpp b4748 (AVX2) uses for this product, which matmul reproduces; it
// depends on the type, the shape and the number of tokens (rules in matmul.cpp).  Note that
// n_tokens == 1 and n_tokens >= 2 give different orders for F32/F16/BF16: to match llama.cpp,
// call matmul with the same token count it uses (e.g. only the last position for the logits of a
// generation step).
enum class DotOrder {
    Lanes8,    // tinyBLAS: one 8-lane fma chain per output, then hsum
    VecF32,    // ggml_vec_dot_f32: 4 x 8 lanes, float sum, fused leftovers
    VecF16,    // ggml_vec_dot_f16: 4 x 8 lanes, double sum, leftovers
    VecBF16,   // ggml_vec_dot_bf16 (AVX2)
    Q0Lanes,   // ggml_vec_dot_q8_0_q8_0 / q4_0_q8_0 and tinyBLAS_Q0_AVX
    Q4Repack,  // ggml_gemv/gemm_q4_0_8x8_q8_0 (Q4_0 weights repacked because rows % 8 == 0)
    KLanes,    // ggml_vec_dot_{q6_K,tq1_0,tq2_0}_q8_K, and TQ2_G128's per-block form (matmul_kquants.h)
};
DotOrder dot_order(const WeightView& w, int64_t n_tokens);
const char* dot_order_name(DotOrder order);

}  // namespace vxq::cpu

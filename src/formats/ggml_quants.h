// Weights as llama.cpp's llama-quantize writes them: ggml's reference conversions from f32
// (ggml_quantize_chunk for the block types, which calls the *_ref functions of ggml-quants.c, and
// ggml's fp32 -> fp16 / bf16 round-to-nearest-even). The KV cache's q8_0 is a different function
// (the AVX2 quantizer llama.cpp runs on activations): see kv/formats/baseline.h.
#pragma once

#include <cstdint>

#include "formats/ggml_types.h"

namespace vxq {

// ggml's quantize_row_q8_0_ref: d = amax / 127, q = roundf(x / d) (half away from zero).
//   x: [n], n % 32 == 0; y: [n / 32]
void quantize_row_q8_0_ref(const float* x, BlockQ8_0* y, int64_t n);

// ggml's quantize_row_q4_0_ref: m = the first value of largest magnitude, d = m / -8,
// q = min(15, (int8_t)(x / d + 8.5f)).
//   x: [n], n % 32 == 0; y: [n / 32]
void quantize_row_q4_0_ref(const float* x, BlockQ4_0* y, int64_t n);

// Ternary weights (TQ2_0: 2 bits per weight; TQ1_0: base-3, 5 weights per byte), 256-element
// blocks with an fp16 scale d each, a weight being d * t with t in {-1, 0, 1}:
//   Absmean (BitNet b1.58): t = clamp(round(x / gamma), -1, 1) with gamma the whole tensor's mean
//     |x| (ternary_absmean), and d the block's mean |x| over its non-zero t (the least-squares
//     scale of those t; 0 when all are 0). A tensor that already takes three values {-g, 0, g}
//     is stored without loss: t exact, d = g.
//   Amax (llama.cpp's quantize_row_tq*_ref): d = the block's max |x|, t = round(x / d).
// round() is half away from zero. The two give the same bytes for a ternary tensor.
enum class TernaryRule { Absmean, Amax };

// mean |x| over x[0, n), accumulated in double.
double ternary_absmean(const float* x, int64_t n);

// n values (n % 256 == 0) as TQ2_0, TQ1_0 or TQ2_G128 (veloxquant's 128-value blocks, the same
// rules per 128 values) blocks at out (ggml_row_bytes(t, n) bytes); gamma is used by Absmean only.
void quantize_row_ternary(GgmlType t, TernaryRule rule, double gamma, const float* x, int64_t n, uint8_t* out);

// True for the types quantize_row_ref writes: F32, F16, BF16, Q8_0, Q4_0.
bool can_quantize_ref(GgmlType t);

// n values of type t, ggml_row_bytes(t, n) bytes at out; n must be a multiple of t's block size
// and t one can_quantize_ref accepts (asserted: the caller validates flags and shapes).
//   x: [n]; out: [ggml_row_bytes(t, n)]
void quantize_row_ref(GgmlType t, const float* x, int64_t n, uint8_t* out);

}  // namespace vxq

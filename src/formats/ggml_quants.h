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

// True for the types quantize_row_ref writes: F32, F16, BF16, Q8_0, Q4_0.
bool can_quantize_ref(GgmlType t);

// n values of type t, ggml_row_bytes(t, n) bytes at out; n must be a multiple of t's block size
// and t one can_quantize_ref accepts (asserted: the caller validates flags and shapes).
//   x: [n]; out: [ggml_row_bytes(t, n)]
void quantize_row_ref(GgmlType t, const float* x, int64_t n, uint8_t* out);

}  // namespace vxq

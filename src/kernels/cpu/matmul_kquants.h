// Weights in llama.cpp's 256-value super-block types that veloxquant computes with: Q6_K (the
// token embedding and tied output of llama-quantize's files) and the ternary TQ1_0 and TQ2_0; and
// veloxquant's TQ2_G128 (two 128-value blocks per super-block: per block 8 lanes, value e in lane
// (e % 32) / 4, lanes 0-3 minus the activations' 16-value sums 2k and 2k + 1 of the block, one
// fma per lane and block with the block's own scale; no llama.cpp counterpart).
// Their activations are quantized to q8_K (one fp32 scale per 256 values) and each dot product
// is an exact integer per super-block, as in llama.cpp b4748's CPU path.
//
// The float part follows llama.cpp's AVX2 kernels (ggml_vec_dot_{q6_K,tq1_0,tq2_0}_q8_K): a
// block's integer sum is kept in 8 lanes, value e of the block in lane (e % 32) / 4 (TQ: minus
// the activations' sum of 32 e .. 32 e + 31 in lane e, which turns the stored digit t into t - 1);
// each lane is converted to float and added to its running lane sum times d_w * d_x in one fma
// (Q6_K's kernel calls _mm256_fmadd_ps; the TQ kernels' _mm256_mul_ps + _mm256_add_ps become one
// fma in a build with FMA, as GCC contracts them), and the 8 lanes are added at the end as
// hsum_float_8 does: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). So the results are the
// bits of llama.cpp's AVX2 + FMA build, not only its value (checked against that build's
// functions on 2000 random rows of 1-6 blocks per type: all equal).
#pragma once

#include <cstdint>

#include "formats/ggml_types.h"

namespace vxq::cpu {

// Whether t is one of the types below (activations quantized to q8_K).
bool is_kquant_weight(GgmlType t);

// ggml's quantize_row_q8_K_ref (what its x86 build runs): per 256 values, m = the first value
// of largest magnitude, q = min(127, round-half-even(-127 / m * x)), d = 1 / (-127 / m), and the
// sums of 16 quants. A block of zeros gets d = 0 and zero quants and sums.
//   x: [n], n % 256 == 0; y: [n / 256]
void quantize_row_q8_K(const float* x, BlockQ8_K* y, int64_t n);

// n values of a row of type t (Q6_K, TQ1_0, TQ2_0) as f32, bit-identical to ggml's
// dequantize_row_* (d * scale * q for Q6_K, (t - 1) * d for TQ).
//   row: [ggml_row_bytes(t, n)]; out: [n]
void dequantize_row_kquant(GgmlType t, const uint8_t* row, int64_t n, float* out);

// A TQ1_0 row of n values rewritten as TQ2_0 blocks with the same digits t (0, 1, 2) and the same
// scale d: every value (t - 1) * d bit for bit. What the CUDA backend uploads for TQ1_0 weights,
// read by its TQ2_0 GEMV.
//   row: [ggml_row_bytes(TQ1_0, n)]; out: [ggml_row_bytes(TQ2_0, n)]
void tq1_0_row_as_tq2_0(const uint8_t* row, int64_t n, uint8_t* out);

// A Q6_K row of n values as its parts: the values q - 32 (-32 .. 31) in value order, the int8
// scale of each 16 values and the fp16 d of each 256, so that value e is d * scale * q as
// dequantize_row_kquant computes it (bit for bit). What the CUDA backend uploads for Q6_K weights.
//   row: [ggml_row_bytes(Q6_K, n)]; q: [n]; scales: [n / 16]; d: [n / 256]
void q6_K_row_unpacked(const uint8_t* row, int64_t n, int8_t* q, int8_t* scales, uint16_t* d);

// sum_e W[e] x[e] over nb super-blocks of a row of type t and q8_K activations, in the order
// described above. Scalar; the reference of every faster kernel.
float dot_kquant_q8_K(GgmlType t, const uint8_t* row, const BlockQ8_K* x, int64_t nb);

namespace avx2 {
// dot_kquant_q8_K with AVX2 + FMA (matmul_kquants_avx2.cpp), equal to it bit for bit; only
// where the CPU has them.
float dot_kquant_q8_K(GgmlType t, const uint8_t* row, const BlockQ8_K* x, int64_t nb);

// The same dot of one row with n_tok <= kMultiTokens tokens' activations (token j at x + j *
// x_stride blocks) into out[j], each equal bit for bit to dot_kquant_q8_K: the ternary types
// (TQ1_0, TQ2_0, TQ2_G128) unpack a block's digits once for all the tokens (a prefill's cost was
// the unpacking, TQ1_0's base-3 digits above all); Q6_K calls the one-token dot per token.
constexpr int kMultiTokens = 4;
void dot_kquant_q8_K_multi(GgmlType t, const uint8_t* row, const BlockQ8_K* x, int64_t x_stride, int64_t nb, int n_tok,
                           float* out);

// Decode (one token): n_rows <= kRowsTernary consecutive rows (row_bytes apart) of a ternary
// type (dot_kquant_rows_takes: TQ1_0, TQ2_0, TQ2_G128) against x, out[r] equal bit for bit to
// dot_kquant_q8_K of row r; each activation vector is loaded once for all the rows (4 at a time
// for the 2-bit types, 2 for TQ1_0) and the digits never go through memory.
constexpr int kRowsTernary = 4;
bool dot_kquant_rows_takes(GgmlType t);
void dot_kquant_q8_K_rows(GgmlType t, const uint8_t* row0, size_t row_bytes, int n_rows, const BlockQ8_K* x,
                          int64_t nb, float* out);
}  // namespace avx2

}  // namespace vxq::cpu

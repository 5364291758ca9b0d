// AVX2 + FMA + F16C kernels behind matmul() (internal; call only after the runtime CPU check in
// matmul.cpp).  Every function computes its outputs in the exact order documented at the top of
// matmul.cpp, so results equal matmul_ref bit for bit.
//
// The implementation file is compiled with -mavx2 -mfma -mf16c.  To keep AVX2 code out of inline
// functions shared with baseline translation units (the linker keeps one copy of each), these
// entry points take raw pointers only and the implementation instantiates no std templates.
#pragma once

#include <cstddef>
#include <cstdint>

#include "formats/ggml_types.h"

namespace vxq::cpu::avx2 {

// out[i] = x[i] rounded to fp16 (nearest even) and widened back; the F16 dot type.
void round_f16(const float* x, float* out, int64_t n);
// out[i] = x[i] rounded to bf16 as ggml does (nearest even, NaN quieted) and widened back.
void round_bf16(const float* x, float* out, int64_t n);
// ggml's AVX2 quantize_row_q8_0 over n values (n % 32 == 0); yd[b] = the block scale as f32.
void quantize_q8_0(const float* x, BlockQ8_0* y, float* yd, int64_t n);

// DotOrder::Lanes8 (tinyBLAS) for F32/F16/BF16 weights: rows [r0, r1) (multiples of 4), tokens
// [t0, t1).  x: activations already in the dot type, widened to f32, row stride k; k % 8 == 0.
// y[t * ldy + r].  panel: kLanes8MaxPanels * 4 * k floats of scratch (unused for F32).
constexpr int64_t kLanes8MaxPanels = 4;
void gemm_lanes8(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1,
                 const float* x, int64_t t0, int64_t t1, int64_t k, float* y, int64_t ldy,
                 float* panel);

// DotOrder::VecF32 / VecF16 / VecBF16 (ggml_vec_dot_*): any k.
void gemv_vec(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1,
              const float* x, int64_t t0, int64_t t1, int64_t k, float* y, int64_t ldy);

// DotOrder::Q0Lanes for Q8_0 / Q4_0 weights.  xq / xd: quantized activations and their scales,
// nb blocks per token.
void gemm_q0_lanes(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1,
                   const BlockQ8_0* xq, const float* xd, int64_t t0, int64_t t1, int64_t nb,
                   float* y, int64_t ldy);

// DotOrder::Q4Repack for Q4_0 weights: rows [r0, r1) in groups of 8.
void gemm_q4_repack(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1,
                    const BlockQ8_0* xq, const float* xd, int64_t t0, int64_t t1, int64_t nb,
                    float* y, int64_t ldy);

}  // namespace vxq::cpu::avx2

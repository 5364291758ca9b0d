// AVX2 + FMA + F16C kernels behind matmul() (internal; call only after the runtime CPU check in
// matmul.cpp).  Every function computes its outputs in the exact order documented at the top of
// matmul.cpp, so results equal matmul_ref bit for bit.
//
// The implementation file is compiled with -mavx2 -mfma -mf16c.  To keep AVX2 code out of inline
// functions shared with baseline translation units (the linker keeps one copy of each), these
// entry points take raw pointers and plain structs only, and the implementation instantiates no
// std templates.
#pragma once

#include <cstddef>
#include <cstdint>

#include "formats/ggml_types.h"

namespace vxq::cpu {

// ggml_vec_dot_f32 leftovers (k % 32 elements of a VecF32 product): true = fused, which is what
// GCC emits for ggml's `sumf += x[i]*y[i]` when built with -march=native on an FMA machine;
// false = separately rounded product and sum.  Shared by the reference and the AVX2 kernel.
constexpr bool kF32LeftoverFma = true;

}  // namespace vxq::cpu

namespace vxq::cpu::avx2 {

// out[i] = x[i] rounded to fp16 (nearest even) and widened back; the F16 dot type.
void round_f16(const float* x, float* out, int64_t n);
// out[i] = x[i] rounded to bf16 as ggml does (nearest even, NaN quieted) and widened back.
void round_bf16(const float* x, float* out, int64_t n);
// ggml's AVX2 quantize_row_q8_0 over n values (n % 32 == 0); yd[b] = the block scale as f32.
void quantize_q8_0(const float* x, BlockQ8_0* y, float* yd, int64_t n);

// One thread's share of a product: outputs y[t * ldy + r] for rows r in [r0, r1) and tokens t in
// [t0, t1).  A plain struct (no std members) so that it can cross into the AVX2 translation unit.
struct Job {
    GgmlType type = GgmlType::F32;
    const uint8_t* w = nullptr;     // weights, row r at w + r * row_bytes
    size_t row_bytes = 0;           // stride between weight rows
    int64_t k = 0;                  // columns (elements per row)
    int64_t r0 = 0, r1 = 0;         // output rows
    int64_t t0 = 0, t1 = 0;         // tokens
    const float* x = nullptr;       // [n_tokens, k] activations in the dot type, widened to f32
    const BlockQ8_0* xq = nullptr;  // [n_tokens, k / 32] activations quantized to q8_0
    const float* xd = nullptr;      // [n_tokens, k / 32] their block scales as f32
    float* y = nullptr;             // [n_tokens, ldy]
    int64_t ldy = 0;                // stride between token rows of y
    float* scratch = nullptr;       // gemm_lanes8, F16/BF16: kLanes8MaxPanels * 4 * k floats
};

constexpr int64_t kLanes8MaxPanels = 4;

// DotOrder::Lanes8 (tinyBLAS) for F32/F16/BF16 weights; r0, r1 multiples of 4, k % 8 == 0; uses x.
void gemm_lanes8(const Job& job);
// DotOrder::VecF32 / VecF16 / VecBF16 (ggml_vec_dot_*), any k; uses x.
void gemv_vec(const Job& job);
// DotOrder::Q0Lanes for Q8_0 / Q4_0 weights; uses xq, xd.
void gemm_q0_lanes(const Job& job);
// DotOrder::Q4Repack for Q4_0 weights, rows in groups of 8; uses xq, xd.
void gemm_q4_repack(const Job& job);

}  // namespace vxq::cpu::avx2

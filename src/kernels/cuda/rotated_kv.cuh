// KV codecs that code a token in a rotated domain, in device memory: TurboQuant (METHODS.md
// "TurboQuant"; layout and scalar reference kv/formats/turbo.h: turbo with any rotation,
// rot=calib included, turbo-rvq, turbo-prod: keys mse at b - 1 bits + the residual's norm and QJL
// signs, values mse) and VecInfer (METHODS.md "VecInfer", kv/formats/vecinfer.h: product
// quantization after a smoothing and a Walsh-Hadamard transform).
//
// The stores encode a token as the CPU codecs do, the same operations in the same order, so the
// bytes are the CPU codec's: a warp per (token, KV head, role). TurboQuant: the norm's sum of
// squares in double in channel order (one lane: the CPU's sequential sum), the rotation as the
// CPU's (Hadamard: x * signs, the FWHT's levels in order, * 1/sqrt(d); dense Haar or calibrated
// rows: each output a sequential double sum over the channels, a lane per output), the index the
// upper bound of y in the thresholds (a NaN takes the last, as std::upper_bound), packed LSB
// first into a staging block in shared memory; turbo-prod keys: the residual r = y - c[idx], its
// norm (double, channel order) and sign(S r) (a lane per sketch row, f32 in channel order).
// VecInfer: x / lambda (keys), the FWHT, * 1/sqrt(d), then a lane per sub-vector scans the 2^m
// centroids (squared distance in f32 in element order, the first of equal distances).
//
// The split-K attention of reader_attention.cuh reads both through reader policies
// (rotated_kv_kernels.cuh: TurboReader, VecinferReader) and never rotates a cached token: block
// (queries, KV head, split) rotates its rows' queries once (reader_rows_per_block: a decode
// step's GQA group, a batch's 8 / group queries of it; q' = scale * Pi q; VecInfer: scale * H (lambda q) / sqrt(d)), then
// each of its 4 warps takes every 4th 32-token tile of its stretch (the tile's key
// and value bytes copied into shared memory), scores a token per lane (TurboQuant: n_t * sum_c
// q'_c y_t,c with y the code's centroid read in place from the packed bits, turbo-prod keys adding
// n_t * qjl_scale * gamma_t * sum_i (S q')_i sign_t,i with S q' once per block; VecInfer: the
// sub-vectors' centroids from the codebook), keeps an online softmax and adds p_t * n_t * y_t into
// a rotated accumulator, a lane per channel; the warps and then the splits are merged (log-sum-
// exp), and the merge maps the result back once per (query, head): o = Pi^T sum_t p_t n_t y_t.
// f32 throughout: dequantize-then-attend within ~1e-6 relative (other summation orders).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "kernels/cuda/reader_attention.cuh"

namespace vxq::codecs::turbo {
struct State;
}
namespace vxq::codecs::vecinfer {
struct State;
}

namespace vxq::cuda {

// head_dim a multiple of 32 up to this (the store's and the attention's shared buffers).
constexpr int64_t kTurboMaxHeadDim = kReaderMaxHeadDim;

// One role's format on the device: a layer's turbo::State (its rotation and codebooks copied
// into one device allocation: TurboStateCopy below) and its block layout.
struct TurboFormatDev {
    int32_t d, block_bytes;
    int32_t hadamard;             // 1: Pi = H diag(signs) / sqrt(d); 0: dense rows
    int32_t calibrated;           // rot=calib: per-coordinate bits and scales
    int32_t bits1, bits2;         // index bits of the first and (rvq) second stage; calibrated: bits1 = b
    int32_t idx1_offset, idx2_offset;  // bytes into the block
    float inv_sqrt_d;             // 1.0f / sqrtf(d), as Rotation::apply computes it
    int32_t cbk_floats;           // calibrated: the centroids at cbk_cent (2^(top + 1) - 1)
    int32_t qjl;                  // turbo-prod keys: the residual's fp16 norm and d sign bits
    int32_t gamma_offset, sign_offset;  // bytes into the block (qjl)
    float qjl_scale;              // sqrt(pi/2) / d (qjl)
    const float* signs;           // [d] (hadamard)
    const float* rows;            // [d, d] Pi's rows (dense)
    const float* thr1;            // [2^bits1 - 1] thresholds and [2^bits1] centroids, unit-sphere units
    const float* cent1;
    const float* thr2;            // rvq's second stage
    const float* cent2;
    // calibrated: coordinate c has coord_bits(c) bits at bit coord_at[c] >> 8 of the index area
    // (coord_at[c] & 0xff: its bits) and value coord_scale[c] * cbk_cent[2^b - 1 + index]; bit count
    // b's thresholds at cbk_thr + 2^b - 1 - b (the N(0, 1) codebooks of b = 0 .. 8, concatenated).
    const int32_t* coord_at;
    const float* coord_scale;
    const float* cbk_thr;
    const float* cbk_cent;
    const float* sketch_t;        // [d, d] S^T (qjl): S[r][c] at c d + r, so the encoder's lanes and the
                                  // reader's threads, one a row of S, read adjacent floats together
};

// VecInfer (kv/formats/vecinfer.h) on the device: keys y = H (x / lambda) / sqrt(d), values
// y = H x / sqrt(d), each n-element sub-vector the m-bit index of its nearest centroid.
struct VecinferFormatDev {
    int32_t d, block_bytes, n, m;
    float inv_sqrt_d;             // 1.0f / sqrtf(d), as vecinfer::hadamard computes it
    int32_t pad;
    const float* lambda;          // keys: [d] smoothing factors; values: null
    const float* codebook;        // [d/n, 2^m, n]
};

// A layer's state for one role (turbo::State, vecinfer::State) copied to the device: one
// allocation of `bytes` that `f` points into (rotated_kv_state.cpp); state_free gives it back.
template <class F>
struct DeviceStateCopy {
    F f{};
    void* buf = nullptr;
    size_t bytes = 0;
};
using TurboStateCopy = DeviceStateCopy<TurboFormatDev>;
using VecinferStateCopy = DeviceStateCopy<VecinferFormatDev>;
TurboStateCopy turbo_state_copy(const codecs::turbo::State& s);
VecinferStateCopy vecinfer_state_copy(const codecs::vecinfer::State& s);
void device_state_free(void* buf);
template <class F>
void state_free(DeviceStateCopy<F>& c) {
    device_state_free(c.buf);
    c = DeviceStateCopy<F>{};
}
// The same parts laid out in `bytes` (host memory), the format pointing into them: what the
// copies upload, and what the kernels' CPU test (tests/test_rotated_kv_simt.cpp) reads.
TurboFormatDev turbo_format_host(const codecs::turbo::State& s, std::vector<uint8_t>& bytes);
VecinferFormatDev vecinfer_format_host(const codecs::vecinfer::State& s, std::vector<uint8_t>& bytes);

// The pool of centroids a coordinate's index selects from, in shared memory: uniform formats
// their 2^bits1 (+ 2^bits2) centroids, calibrated ones the codebooks of 0..8 bits.
constexpr int kTurboPoolFloats = 511 + 16;

template <class F>
struct RotatedStoreParams {
    const float* k;             // [n, n_head_kv, head_dim] after RoPE (device)
    const float* v;
    const KvHeadDev* heads;     // [n_head_kv]: the pages, n_tokens = the slot of the first new token
    int64_t n, n_head_kv, head_dim;
    F kf, vf;
};
using TurboStoreParams = RotatedStoreParams<TurboFormatDev>;
using VecinferStoreParams = RotatedStoreParams<VecinferFormatDev>;
// Encode as turbo::encode / vecinfer::encode: the CPU codec's bytes.
void turbo_store(const TurboStoreParams& p, cudaStream_t stream);
void vecinfer_store(const VecinferStoreParams& p, cudaStream_t stream);

template <class F>
using RotatedAttentionParams = ReaderAttentionParams<F, F, KvHeadDev>;
using TurboAttentionParams = RotatedAttentionParams<TurboFormatDev>;
using VecinferAttentionParams = RotatedAttentionParams<VecinferFormatDev>;
void turbo_attention(const TurboAttentionParams& p, cudaStream_t stream);
void vecinfer_attention(const VecinferAttentionParams& p, cudaStream_t stream);

}  // namespace vxq::cuda

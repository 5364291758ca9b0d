// Weights on the device and the matmul kernels of the CUDA backend.
//
// Weights are uploaded once. F32, F16 and BF16 keep the file's row layout. Q8_0 and Q4_0 blocks
// (2-byte scale + packed quants, 34 and 18 bytes: not 16-byte aligned) are split at upload into
// a quant plane and a scale plane, so a lane reads a block's quants with one or two 16-byte loads
// and the warp's loads are contiguous. Same bytes as the file, only regrouped.
//
// The matmul y = x W^T converts the activations to the weight's dot type first, as the CPU
// backend and llama.cpp's CPU build do (f16/bf16 rounding, or q8_0 blocks with the same rounding
// as ggml's AVX2 quantize_row_q8_0). Then a block of kGemvWarps warps streams kGemvRowsPerBlock
// weight rows, its threads splitting the columns, for up to kGemvTokens tokens: batch 1 (decode)
// reads each weight byte once; a batch of n reads the weights ceil(n / kGemvTokens) times
// (correct, not yet the prefill GEMM the issue asks for).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backend/types.h"

namespace vxq::cuda {

constexpr int kGemvWarps = 4;         // warps per block; they split the columns of the block's rows
constexpr int kGemvRowsPerBlock = 2;  // weight rows streamed together (one x load feeds both)
constexpr int kGemvTokens = 4;       // tokens per pass over a weight row
constexpr int kQBlock = 32;     // elements per q8_0 / q4_0 block

struct DeviceWeight {
    GgmlType type = GgmlType::F32;
    int64_t rows = 0, cols = 0;
    void* data = nullptr;        // F32/F16/BF16: [rows, cols] as stored; Q8_0: int8 [rows, cols];
                                 // Q4_0: [rows, cols / 2] bytes, block b of a row at byte 16 b
    __half* scales = nullptr;    // Q8_0/Q4_0: [rows, cols / 32] block scales; else nullptr
    size_t bytes = 0;            // device bytes held (data + scales)
};

// Copies `w` (host memory, e.g. the mapped file) to the device; vxq::Error for a type without
// CUDA kernels, naming it. free_weight releases it.
DeviceWeight upload_weight(const WeightView& w);
void free_weight(DeviceWeight& w);

// Device scratch for the converted activations; grows, never shrinks.
struct GemvScratch {
    void* buf = nullptr;
    size_t bytes = 0;
    ~GemvScratch();
    void* reserve(size_t n);
};

// The scratch bytes gemv needs for this call: with a scratch that large, gemv allocates nothing
// (so it can be captured in a CUDA graph).
size_t gemv_scratch_bytes(const DeviceWeight& w, int64_t n);

// y = x W^T on `stream`.  x: [n, w.cols] f32 (device); y: [n, w.rows] f32 (device)
void gemv(const DeviceWeight& w, const float* x, int64_t n, float* y, GemvScratch& scratch, cudaStream_t stream);

// out[i] = row ids[i] of table, widened to f32.  ids: [n] (device); out: [n, table.cols] (device)
void embed_rows(const DeviceWeight& table, const int32_t* ids, int64_t n, float* out, cudaStream_t stream);

}  // namespace vxq::cuda

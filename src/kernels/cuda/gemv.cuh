// Weights on the device and the matmul of the CUDA backend: a GEMV kernel for decode-sized
// batches, cuBLAS GEMMs for prefill-sized ones.
//
// Weights are uploaded once. F32, F16 and BF16 keep the file's row layout. Q8_0 and Q4_0 blocks
// (2-byte scale + packed quants, 34 and 18 bytes: not 16-byte aligned) are split at upload into
// a quant plane and a scale plane, so a lane reads a block's quants with one or two 16-byte loads
// and the warp's loads are contiguous. Same bytes as the file, only regrouped.
//
// y = x W^T takes one of two paths (gemv_path):
//
// GEMV (n < kGemmMinTokens*): the activations are converted to the weight's dot type first, as
// the CPU backend and llama.cpp's CPU build do (f16/bf16 rounding, or q8_0 blocks with the same
// rounding as ggml's AVX2 quantize_row_q8_0). Then each warp streams kGemvRowsPerWarp weight
// rows, every lane issuing kGemvLoadsPerRow 16-byte loads per row before it uses any, for up to
// kGemvMaxTokens tokens per pass (a batch of n reads the weights ceil(n / 8) times); the block's
// warps take different rows, or split the columns of theirs when the matrix has few rows.
// Numerics against the CPU backend: the same products (Q8_0/Q4_0: the same integer dot of each
// 32-element block, times d_w * d_x), f32 sums in another order.
//
// GEMM (n >= kGemmMinTokens*): cuBLAS (cublasGemmEx, f32 accumulation, f32 output), per type:
//   F16/BF16: the activations rounded to f16/bf16 exactly as on the GEMV path; tensor cores
//     multiply the same 16-bit numbers (products exact in f32) and sum in f32: the GEMV's
//     numerics up to the summation order (and the tensor cores' truncating f32 adds).
//   F32: plain f32 (CUBLAS_COMPUTE_32F_PEDANTIC: never TF32, whose 10-bit mantissa would lose
//     parity with the CPU backend); the CPU's products, another summation order.
//   Q8_0/Q4_0: each weight is dequantized to fp16(d * q) (d * q is exact in f32; one rounding,
//     relative error <= 2^-11) into a scratch matrix, chunks of rows at a time, and the
//     activations are rounded to f16 (relative error <= 2^-11): an f16 GEMM. This is NOT the CPU
//     backend's numerics, which quantize the activations to q8_0 (error up to amax/254 of each
//     32-block, plus the fp16 rounding of its scale) and take exact integer block dots; the
//     difference per output is bounded by (2^-11 * 2 + 2^-22) * sum|w x| +
//     sum over blocks of amax_x(block) * (1/254 + 2^-10) * sum_block |w| (tests/test_cuda.cpp
//     checks that bound, and the GEMM against an f16 reference of the dequantized weights).
//
// Scratch and CUDA graphs: every call takes its device memory (converted activations, the cuBLAS
// workspace, the dequantized weight chunk) from a GemvScratch. gemv_scratch_bytes(w, n) is what
// one call needs; once the scratch holds that many bytes (reserve), gemv allocates and frees
// nothing and creates no cuBLAS handle, so it can be captured in a CUDA graph (run each kernel
// once before capturing: CUDA loads modules lazily on first use).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backend/types.h"
#include "kernels/cuda/q8_act.cuh"

namespace vxq::cuda {

// GEMV kernel shape (gemv.cu says how a block is laid out).
constexpr int kGemvWarps = 4;         // warps per block
constexpr int kGemvRowsPerWarp = 2;   // weight rows a warp streams together: each activation load feeds both
constexpr int kGemvLoadsPerRow = 4;   // 16-byte weight loads per lane, row and iteration, all issued before use
constexpr int kGemvMaxTokens = 8;     // tokens per pass over the weights (kernels for 1, 2, 4, 8)

// Batches from which the matmul is a cuBLAS GEMM. A GEMV pass reads the weights once per 8
// tokens and its arithmetic grows with n (at 8 tokens the Q4_0 kernel's unpack + dp4a work is
// about what the SMs can issue at full bandwidth), while the GEMM reads them once and stays
// memory-bound up to n ~ 300 on an H200.
//   F32/F16/BF16: the GEMM reads the weights' bytes once, as one GEMV pass does, so it wins from
//     two passes on; 16 (not 9) leaves cuBLAS's small-n kernels some margin.
//   Q8_0/Q4_0: the GEMM first writes and reads an fp16 copy of the weights (read 1.06 or 0.56
//     bytes per weight, write 2, read 2 again): ~4.5-5 bytes per weight, about 4-5 GEMV passes of
//     Q8_0 and 8 of Q4_0 by bytes, ~4 of either counting the GEMV's arithmetic at 8 tokens: 32.
// bench/gpu_gemv.cu times both paths at n = 8..64 to check these crossovers.
constexpr int64_t kGemmMinTokensDense = 16;
constexpr int64_t kGemmMinTokensQuant = 32;

constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;  // cuBLAS's recommendation for Hopper
constexpr size_t kDequantChunkBytes = size_t(256) << 20;    // fp16 weight rows dequantized per GEMM

struct DeviceWeight {
    GgmlType type = GgmlType::F32;       // the device layout's type (what the kernels read)
    GgmlType file_type = GgmlType::F32;  // the file's (TQ1_0 is uploaded as TQ2_0: weights.cpp)
    int64_t rows = 0, cols = 0;
    void* data = nullptr;        // F32/F16/BF16: [rows, cols] as stored; Q8_0: int8 [rows, cols];
                                 // Q4_0: [rows, cols / 2] bytes, block b of a row at byte 16 b;
                                 // TQ2_0: [rows, cols / 4] bytes, 256-block b's 64 quant bytes at 64 b;
                                 // TQ2_G128: the same, 128-block b's 32 quant bytes at 32 b;
                                 // Q6_K: int8 [rows, cols] values q - 32, then int8 [rows, cols / 16] scales
    __half* scales = nullptr;    // Q8_0/Q4_0: [rows, cols / 32], TQ2_0 and Q6_K: [rows, cols / 256], TQ2_G128: [rows, cols / 128]
                                 // block scales (Q6_K: d); else nullptr
    size_t bytes = 0;            // device bytes held (data + scales)
};

// Copies `w` (host memory, e.g. the mapped file) to the device; vxq::Error for a type without
// CUDA kernels, naming it. free_weight releases it.
DeviceWeight upload_weight(const WeightView& w);
void free_weight(DeviceWeight& w);

// Device scratch of the matmul, and its cuBLAS handle. Grows, never shrinks. The handle is
// created by the first reserve of at least kCublasWorkspaceBytes (every GEMM call's
// gemv_scratch_bytes is that large), so reserving gemv_scratch_bytes of the largest call up
// front also prepares cuBLAS.
struct GemvScratch {
    void* buf = nullptr;
    size_t bytes = 0;
    cublasHandle_t cublas = nullptr;
    GemvScratch() = default;
    GemvScratch(const GemvScratch&) = delete;
    GemvScratch& operator=(const GemvScratch&) = delete;
    ~GemvScratch();
    void* reserve(size_t n);
};

enum class MatmulPath { Auto, Gemv, Gemm };

// The path gemv takes for a batch of n (Auto resolved by the type's kGemmMinTokens*).
MatmulPath gemv_path(const DeviceWeight& w, int64_t n, MatmulPath path = MatmulPath::Auto);

// Device bytes gemv(w, ..., n, ..., path) takes from its scratch.
size_t gemv_scratch_bytes(const DeviceWeight& w, int64_t n, MatmulPath path = MatmulPath::Auto);

// One line naming the kernels that gemv runs for (w, n, path), for benchmark lines.
std::string gemv_describe(const DeviceWeight& w, int64_t n, MatmulPath path = MatmulPath::Auto);

// y = x W^T on `stream`.  x: [n, w.cols] f32 (device); y: [n, w.rows] f32 (device)
// The L2 priority of the GEMV kernels' weight loads: evict-first (the default) or normal, for the
// device the calling thread uses (gemv.cu says why).
void set_weight_evict_first(bool on);
// The batch-1 ternary GEMV (TQ2_0, TQ2_G128 at n = 1): the stream kernel (ternary_stream_kernels.cuh,
// the default) or the group kernel (false; VXQ_GEMV_TQ2_STREAM=0 at start). For A/B measurements.
void set_gemv_ternary_stream(bool on);
// Within the stream kernel, where x comes in f32: quantized to q8_K by the kernel's own blocks (the
// default) or by the quantize kernel before it (false; VXQ_GEMV_TS_QUANT=0 at start). For A/B.
void set_gemv_ternary_quantize_in_kernel(bool on);
// Within the stream path: the lane-piece kernel where it takes the matrix (true;
// VXQ_GEMV_TQ2_LANES=1 at start) or the stream kernel's ring (the default: the lane-piece kernel
// measured no faster on H100s). For A/B measurements and tests.
void set_gemv_ternary_lanes(bool on);
// The lane-piece kernel's pieces (32 weights each) a lane: 1 (the default) or 2 (a whole 16-byte
// unit, VXQ_GEMV_TQ2_LANES_PIECES=2 at start). For A/B measurements and tests.
void set_gemv_ternary_lanes_pieces(int pieces);
// The stream kernel's preferred warps a block: 16 (the default), 32 (VXQ_GEMV_TS_WARPS=32) or, in
// the half-SM form, 8 (=8).
void set_gemv_ternary_stream_warps(int warps);
// The batch-1 ternary GEMV in half an SM (true; VXQ_GEMV_TS_HALF=1 at start): the stream kernel's
// block within half an SM's registers and shared memory, the lane-piece kernel's grid at half its
// blocks an SM, so that consecutive calls overlap (PDL). Off by default. For A/B and tests.
void set_gemv_ternary_half(bool on);
// TQ2_0 at n = 1: the tensor-core kernel (ternary_mma_kernels.cuh; true, VXQ_GEMV_TQ2_MMA=1 at
// start) or the stream kernel (false: the default). For A/B and tests.
void set_gemv_ternary_mma(bool on);
// TQ2_0 at n > 1: the tensor-core kernel's batch form, 8 tokens a pass (true: the default), or the
// group kernel (false; VXQ_GEMV_TQ2_MMA_BATCH=0 at start). For A/B and tests.
void set_gemv_ternary_mma_batch(bool on);
// The tensor-core kernel's (tile, block) pairs in flight a warp: 4 (the default) or 2. For A/B.
void set_gemv_ternary_mma_depth(int depth);
// Benchmarks only: where x is quantized before the ternary kernel (set_gemv_ternary_quantize_in_kernel
// (false)), skip that quantize kernel and read x's q8_K as the previous call left it in the scratch
// (the same x and scratch): the GEMV's time when the kernel before it writes x as q8_K.
void set_gemv_ternary_x_given(bool on);
// The batch-1 F32/F16/BF16 GEMV: x in registers (each thread converts its own units of x; with a
// fused norm, rows of 256 or 512 units) instead of staged in shared memory by the block (gemv.cu,
// gemv1_kernel's XM). Same bits. On by default (F16 8B decode +8 % on the H200, docs/gpu.md);
// VXQ_GEMV1_X_REGS=0 in the backend turns it off.
void set_gemv1_x_in_registers(bool on);
void gemv(const DeviceWeight& w, const float* x, int64_t n, float* y, GemvScratch& scratch, cudaStream_t stream);
// The same with the path forced (tests and benchmarks compare the two paths).
void gemv(const DeviceWeight& w, const float* x, int64_t n, float* y, GemvScratch& scratch, cudaStream_t stream,
          MatmulPath path);

// Matrices that read the same activations (Q, K and V of a layer; gate and up) in one pass: x is
// converted once and one kernel streams every matrix's rows. Per matrix the same kernel body,
// arguments and sums as gemv(): the same results, bit for bit. Only for matrices that
// gemv_groupable accepts pairwise with ws[0] (same type and cols, the GEMV path for n).
constexpr int kGemvGroupMax = 3;
bool gemv_groupable(const DeviceWeight& a, const DeviceWeight& b, int64_t n);
void gemv_group(const DeviceWeight* const* ws, float* const* ys, int count, const float* x, int64_t n, GemvScratch& s,
                cudaStream_t stream);

// At n == 1 (the decode step) a matmul can take the neighbouring element-wise work of a layer,
// so a decode step runs fewer kernels. F32/F16/BF16 run the batch-1 kernel (gemv.cu, "batch-1
// GEMV": each block converts x in shared memory, the norm is its prologue, SwiGLU or the residual
// add its epilogue); Q8_0/Q4_0 run their quantize kernel with the norm or SwiGLU in it, and the
// residual add in the GEMV's store:
struct GemvFusion {
    // RMSNorm first: x = rms_norm(norm_in) * norm_weight, written to x (an output then) and used
    // as the input. The same arithmetic as cuda::rms_norm (device_math.cuh): the same bits.
    const float* norm_in = nullptr;
    const float* norm_weight = nullptr;
    float norm_eps = 0.0f;
    // One matrix: resid[r] += y[r] after y is computed (the residual add), as cuda::add.
    float* resid = nullptr;
    // Two matrices (gate, up) of equal rows: y0 = silu(y0) * y1 as cuda::swiglu; y1 keeps up.
    // F32/F16/BF16 only.
    bool swiglu = false;
    // Q8_0/Q4_0 only (their activations are quantized by a kernel of their own, which takes the
    // op before): x = silu(x) * swiglu_up first, as cuda::swiglu (x written back).
    const float* swiglu_up = nullptr;

    // Q8_0/Q4_0 only: x arrives quantized to q8_0 (the quantize kernel's bits) by the kernel
    // before (the split attention's merge: attention.cuh), so no quantize kernel runs. Not with
    // norm_weight or swiglu_up.
    Q8Act x_q8{};

    // Not a fusion, a hint: the first bytes that the next matmul kernel reads (its first
    // matrix's first rows), which this kernel's blocks ask L2 to fetch once they have requested
    // their own last weights, so that memory keeps streaming across the boundary between the two
    // kernels (the tail of this one, the launch and prologue of the next). Batch-1
    // F32/F16/BF16 only; no effect on any value.
    const void* l2_next = nullptr;
    size_t l2_next_bytes = 0;  // a multiple of 16
};
// Whether gemv_group(ws, ys, count, x, 1, s, stream, fusion) runs the batch-1 kernel with this
// fusion (the matrices' type and cols, and for swiglu two matrices of equal rows).
bool gemv_fusable(const DeviceWeight* const* ws, int count, const GemvFusion& fusion);
// gemv_group at n = 1 with `fusion` (gemv_fusable must accept it).
void gemv_group(const DeviceWeight* const* ws, float* const* ys, int count, float* x, GemvScratch& s,
                cudaStream_t stream, const GemvFusion& fusion);

// out[i] = row ids[i] of table, widened to f32.  ids: [n] (device); out: [n, table.cols] (device)
void embed_rows(const DeviceWeight& table, const int32_t* ids, int64_t n, float* out, cudaStream_t stream);

}  // namespace vxq::cuda

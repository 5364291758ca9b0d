#include "kernels/cuda/gemv.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <type_traits>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cublas_api.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ternary_mma_kernels.cuh"
#include "kernels/cuda/ternary_stream_kernels.cuh"

namespace vxq::cuda {

namespace {

// ---- element conversions ----------------------------------------------------------------------

__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

// fp32 -> bf16 -> fp32 with round to nearest even, as core/fp16.h's fp32_to_bf16 (NaN stays NaN).
__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 64u);
    return uint16_t((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

// The dense weight types: Raw is the stored element; widen turns one 32-bit word (little
// endian: element 2i is the low half of word i) into its kPerWord floats, exactly.
struct F32Elem {  // activations are used as they are: no conversion kernel
    using Raw = float;
    static constexpr int kPerWord = 1;
    static __device__ __forceinline__ float load(Raw v) { return v; }
    static __device__ __forceinline__ Raw from_float(float f) { return f; }
    static __device__ __forceinline__ void widen(uint32_t w, float* f) { f[0] = __uint_as_float(w); }
};
struct F16Elem {
    using Raw = __half;
    static constexpr int kPerWord = 2;
    static __device__ __forceinline__ float load(Raw v) { return __half2float(v); }
    static __device__ __forceinline__ Raw from_float(float f) { return __float2half_rn(f); }
    static __device__ __forceinline__ void widen(uint32_t w, float* f) {
        f[0] = __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
        f[1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
    }
};
struct BF16Elem {
    using Raw = uint16_t;
    static constexpr int kPerWord = 2;
    static __device__ __forceinline__ float load(Raw v) { return bf16_bits_to_float(v); }
    static __device__ __forceinline__ Raw from_float(float f) { return float_to_bf16_bits(f); }
    static __device__ __forceinline__ void widen(uint32_t w, float* f) {
        f[0] = __uint_as_float(w << 16);
        f[1] = __uint_as_float(w & 0xffff0000u);
    }
};

// ---- activation conversion --------------------------------------------------------------------

template <class E>
__global__ void convert_kernel(const float* __restrict__ x, typename E::Raw* __restrict__ out, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        out[i] = E::from_float(x[i]);
    }
}

// One warp per 32-element block, lane = element.
__global__ void quantize_q8_0_kernel(const float* __restrict__ x, int8_t* __restrict__ qs, Q8Scale* __restrict__ s,
                                     int64_t n_blocks) {
    const int64_t b = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;  // the same for the whole warp
    const int lane = threadIdx.x & 31;
    if (b >= n_blocks) return;
    quantize_block_q8_0(x[b * kQBlock + lane], b, lane, qs, s);
}

// quantize_q8_0_kernel for one row with the op before it done on the way (GemvFusion, n = 1):
// the RMSNorm (every block computes the row's scale as cuda::rms_norm does; each element of the
// normalized row is written to x by its own thread) or the SwiGLU x = silu(x) * up (each element
// written back to x). A warp per 32-element block, as quantize_q8_0_kernel: the same quants and
// scales, bit for bit.
constexpr int kQuantFusedThreads = 256;
static_assert(kQuantFusedThreads == kNormThreads, "the RMSNorm prologue reduces over the block");
__global__ void __launch_bounds__(kQuantFusedThreads)
quantize_fused_kernel(const float* __restrict__ in, const float* __restrict__ norm_w, float eps, const float* __restrict__ up,
                      float* x, int64_t cols, int8_t* __restrict__ qs, Q8Scale* __restrict__ s) {
    __shared__ double partial[kNormThreads];
    pdl_wait();
    pdl_launch_dependents();
    const int lane = threadIdx.x & 31;
    const int64_t b = int64_t(blockIdx.x) * (kQuantFusedThreads / 32) + (threadIdx.x >> 5);
    const bool mine = b < cols / kQBlock;
    const int64_t c = b * kQBlock + lane;
    // This thread's element and its factors, loaded before the norm's loads and barriers.
    float v = mine ? in[c] : 0.0f;
    const float w = norm_w && mine ? norm_w[c] : 0.0f, u = up && mine ? up[c] : 0.0f;
    float scale = 1.0f;
    if (norm_w) {
        scale = block_rms_scale(in, cols, eps, partial);
        pdl_trace_mark(21);
    }
    if (!mine) return;  // after the block-wide norm
    if (norm_w) {
        v = rms_apply(v, scale, w);
        x[c] = v;  // each element by its own thread (in and x do not overlap: the backend's fusion)
    }
    if (up) {
        v = silu_mul(v, u);
        x[c] = v;
    }
    quantize_block_q8_0(v, b, lane, qs, s);
    pdl_trace_mark(22);
}

// ---- GEMV --------------------------------------------------------------------------------------
// A block is kGemvWarps warps. Warps are grouped `split` to a row group of kGemvRowsPerWarp rows:
// split 1 = each warp has its own rows; split 2 or 4 = that many warps share the rows and take
// alternate stretches of their columns (for matrices with few rows, so the grid still keeps
// enough loads in flight), their sums added through shared memory at the end.
// A row is cut into units: 16 bytes of a dense row, or one 32-element block of Q8_0 (two
// 16-byte loads) or Q4_0 (one). Per iteration each lane takes kUnitsPerIter units of each of
// its rows, units lane, lane + 32, ... so that every load instruction of the warp reads
// contiguous bytes, issues all of those loads (kGemvLoadsPerRow x 16 bytes per row, scales
// with them), and only then reads the activations (L1/L2 hits: every block reads the same x)
// and multiplies: each x load feeds the warp's kGemvRowsPerWarp rows, for NT tokens.
// Rows past the matrix's end re-read its last row and tokens past the batch's end its last
// token; neither is stored. Launched with PDL (launch.cuh): a warp issues its first weight
// loads (no kernel writes weights) before it waits for the kernel that wrote x.

constexpr int kGemvThreads = kGemvWarps * 32;

// Warps per SM the grid aims for before splitting rows between warps: 16 warps x 32 lanes x
// 128 bytes = 64 KB of loads in flight per SM, what 4.3 TB/s needs at ~2 us of loaded latency
// spread over 132 SMs.
constexpr int64_t kGemvTargetWarpsPerSm = 16;

// Q8KScale, the q8_K activation block's scale and quarter sums: ternary_stream_kernels.cuh.

// Weights are read once per step and are most of its bytes: they stream through L2 with the
// evict-first priority, so that what the step reads again (activations, the KV cache, the
// kernels' own instructions and parameters, which a cold L2 makes every small kernel fetch from
// DRAM) stays there. On the H200 (docs/gpu.md, 2026-12-02, fourth session) it took the decode
// attention from 25 to 15 us per call, Q4_0 8B decode from 393 to 440-446 t/s from an empty cache
// (378 to 388-391 at depth 1024) and F16 from 182 to 192 (measured with a first form of the loads).
// VXQ_CUDA_WEIGHT_EVICT_FIRST=0 (set_weight_evict_first) gives them the normal priority (A/B).
__constant__ int c_weight_evict_first = 1;
bool g_weight_evict_first = true;  // c_weight_evict_first's host copy (kernels that take it as a parameter)
bool weight_evict_first_on() { return g_weight_evict_first; }
__device__ __forceinline__ uint64_t weight_policy() { return ts_policy(c_weight_evict_first); }
// 16 bytes of weights (read-only for the kernel's lifetime: the non-coherent path, as __ldg).
__device__ __forceinline__ int4 ld_weight16(const void* ptr) {
    int4 v;
    asm("ld.global.nc.L2::cache_hint.v4.s32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(ptr), "l"(weight_policy()));
    return v;
}
__device__ __forceinline__ float ld_weight_half(const __half* ptr) {
    unsigned short v;
    asm("ld.global.nc.L2::cache_hint.u16 %0, [%1], %2;" : "=h"(v) : "l"(ptr), "l"(weight_policy()));
    return __half2float(__ushort_as_half(v));
}
__device__ __forceinline__ void cp_async16_weight(void* smem, const void* gmem) { cp_async16_hint(smem, gmem, weight_policy()); }

struct GemvParams {
    const void* w;             // weight plane: dense [rows, cols]; Q8_0 int8 [rows, cols]; Q4_0 [rows, cols / 2];
                               // TQ2_0 [rows, cols / 4] (each 256-block's 64 quant bytes)
    const __half* w_scale;     // Q8_0/Q4_0: [rows, cols / 32]; TQ2_0, Q6_K: [rows, cols / 256]; TQ2_G128: [rows, cols / 128]; else nullptr
    const void* x;             // activations in the dot type: dense [n, cols]; q8_0 / q8_K quants int8 [n, cols]
    const Q8Scale* x_scale;    // q8_0 activations: [n, cols / 32]; else nullptr
    float* y;                  // [n, rows]
    int rows, cols, n;         // below 2^31 (gemv checks); element offsets are int64
    int split;                 // warps sharing a row group: 1, 2 or 4
    float* resid;              // resid[i] += y[i] as y is stored (GemvFusion::resid), or nullptr
    const Q8KScale* xk_scale;  // q8_K activations (TQ2_0, TQ2_G128, Q6_K): [n, cols / 256]; else nullptr
    const int8_t* w_sub;       // Q6_K: the scale of each 16 weights [rows, cols / 16]; else nullptr
};

// F32/F16/BF16: a unit is 16 bytes; f32 products and sums (f16/bf16 products are exact in f32).
template <class E>
struct DenseFormat {
    using Unit = uint4;
    static constexpr int kRows = kGemvRowsPerWarp;
    static constexpr int kPer16 = 4 * E::kPerWord;  // elements per unit
    static constexpr int kUnitsPerIter = kGemvLoadsPerRow;
    static __host__ __device__ int units(int cols) { return cols / kPer16; }
    static __device__ __forceinline__ Unit load(const GemvParams& p, int row, int u) {
        const int4 v = ld_weight16(static_cast<const uint4*>(p.w) + int64_t(row) * units(p.cols) + u);
        return uint4{unsigned(v.x), unsigned(v.y), unsigned(v.z), unsigned(v.w)};
    }
    template <int R>
    static __device__ __forceinline__ void accumulate(float (&acc)[R], const Unit (&w)[R], const GemvParams& p, int t,
                                                      int u) {
        const uint4 xv = __ldg(static_cast<const uint4*>(p.x) + int64_t(t) * units(p.cols) + u);
        float xf[kPer16];
        widen(xv, xf);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            float wf[kPer16];
            widen(w[r], wf);
#pragma unroll
            for (int e = 0; e < kPer16; ++e) acc[r] = fmaf(wf[e], xf[e], acc[r]);
        }
    }
    static __device__ __forceinline__ void widen(const uint4& v, float (&f)[kPer16]) {
        E::widen(v.x, f);
        E::widen(v.y, f + E::kPerWord);
        E::widen(v.z, f + 2 * E::kPerWord);
        E::widen(v.w, f + 3 * E::kPerWord);
    }
};

__device__ __forceinline__ int dp4a_16(const int4& a, const int4& b, int acc) {
    acc = __dp4a(a.x, b.x, acc);
    acc = __dp4a(a.y, b.y, acc);
    acc = __dp4a(a.z, b.z, acc);
    return __dp4a(a.w, b.w, acc);
}

// Q8_0 weights x q8_0 activations: per block the integer dot (dp4a) times d_w * d_x.
struct Q8Format {
    static constexpr int kRows = kGemvRowsPerWarp;
    struct Unit {
        int4 lo, hi;  // quants 0-15, 16-31
        float d;
    };
    static constexpr int kUnitsPerIter = kGemvLoadsPerRow / 2;  // two 16-byte loads per block
    static __host__ __device__ int units(int cols) { return cols / kQBlock; }
    static __device__ __forceinline__ Unit load(const GemvParams& p, int row, int b) {
        const int64_t i = int64_t(row) * units(p.cols) + b;
        const int4* q = static_cast<const int4*>(p.w) + 2 * i;
        return Unit{ld_weight16(q), ld_weight16(q + 1), ld_weight_half(p.w_scale + i)};
    }
    template <int R>
    static __device__ __forceinline__ void accumulate(float (&acc)[R], const Unit (&w)[R], const GemvParams& p, int t,
                                                      int b) {
        const int64_t i = int64_t(t) * units(p.cols) + b;
        const int4* xq = static_cast<const int4*>(p.x) + 2 * i;
        const int4 x0 = __ldg(xq), x1 = __ldg(xq + 1);
        const float dx = p.x_scale[i].d;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int sumi = dp4a_16(w[r].hi, x1, dp4a_16(w[r].lo, x0, 0));
            acc[r] += float(sumi) * (w[r].d * dx);
        }
    }
};

// Q4_0 weights x q8_0 activations. A block's 16 quant bytes hold element j in the low nibble of
// byte j and element j + 16 in the high nibble; values are nibble - 8. The integer block dot is
// sum (nib - 8) x = sum nib x - 8 sum x, the same integer without a per-byte subtraction.
struct Q4Format {
    static constexpr int kRows = kGemvRowsPerWarp;
    struct Unit {
        int4 q;
        float d;
    };
    static constexpr int kUnitsPerIter = kGemvLoadsPerRow;  // one 16-byte load per block
    static __host__ __device__ int units(int cols) { return cols / kQBlock; }
    static __device__ __forceinline__ Unit load(const GemvParams& p, int row, int b) {
        const int64_t i = int64_t(row) * units(p.cols) + b;
        return Unit{ld_weight16(static_cast<const int4*>(p.w) + i), ld_weight_half(p.w_scale + i)};
    }
    static __device__ __forceinline__ int4 low_nibbles(const int4& v) {
        return make_int4(v.x & 0x0f0f0f0f, v.y & 0x0f0f0f0f, v.z & 0x0f0f0f0f, v.w & 0x0f0f0f0f);
    }
    static __device__ __forceinline__ int4 high_nibbles(const int4& v) {
        return make_int4(int((unsigned(v.x) >> 4) & 0x0f0f0f0fu), int((unsigned(v.y) >> 4) & 0x0f0f0f0fu),
                         int((unsigned(v.z) >> 4) & 0x0f0f0f0fu), int((unsigned(v.w) >> 4) & 0x0f0f0f0fu));
    }
    template <int R>
    static __device__ __forceinline__ void accumulate(float (&acc)[R], const Unit (&w)[R], const GemvParams& p, int t,
                                                      int b) {
        const int64_t i = int64_t(t) * units(p.cols) + b;
        const int4* xq = static_cast<const int4*>(p.x) + 2 * i;
        const int4 x0 = __ldg(xq), x1 = __ldg(xq + 1);  // elements 0-15, 16-31
        const Q8Scale xs = p.x_scale[i];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int sumi = dp4a_16(high_nibbles(w[r].q), x1, dp4a_16(low_nibbles(w[r].q), x0, 0)) - 8 * xs.sum;
            acc[r] += float(sumi) * (w[r].d * xs.d);
        }
    }
};

// TQ2_0 (ternary) weights x q8_K activations. A unit is 16 quant bytes (64 weights): byte k of
// unit c of a 256-block holds, in bits 2 l, the digit u = t + 1 of value 128 (c / 2) + 32 l + 16 (c
// % 2) + k, so each l is one 16-byte run of activations. The integer sum (u - 1) x = sum u x - sum x
// (the quarter's quant sum, Q8KScale) times d_w * d_x: the CPU's integers (matmul_kquants.h),
// summed per 64 weights in float instead of per 256.
struct TQ2Format {  // kRows: TQ2FormatR
    struct Unit {
        int4 q;
        float d;
    };
    static constexpr int kUnitsPerIter = kGemvLoadsPerRow;
    static __host__ __device__ int units(int cols) { return cols / 64; }
    static __device__ __forceinline__ Unit load(const GemvParams& p, int row, int u) {
        const int64_t i = int64_t(row) * units(p.cols) + u;
        return Unit{ld_weight16(static_cast<const int4*>(p.w) + i),
                    ld_weight_half(p.w_scale + int64_t(row) * (p.cols / kQK_K) + u / 4)};
    }
    static __device__ __forceinline__ int4 digits(const int4& q, int l) {
        const unsigned m = 0x03030303u;
        return make_int4(int((unsigned(q.x) >> (2 * l)) & m), int((unsigned(q.y) >> (2 * l)) & m),
                         int((unsigned(q.z) >> (2 * l)) & m), int((unsigned(q.w) >> (2 * l)) & m));
    }
    template <int R>
    static __device__ __forceinline__ void accumulate(float (&acc)[R], const Unit (&w)[R], const GemvParams& p, int t,
                                                      int u) {
        const int b = u / 4, c = u % 4;
        const int8_t* xq = static_cast<const int8_t*>(p.x) + int64_t(t) * p.cols + int64_t(b) * kQK_K + 128 * (c / 2) +
                           16 * (c % 2);
        const Q8KScale* xs = p.xk_scale + int64_t(t) * (p.cols / kQK_K) + b;
        const float dx = __ldg(&xs->d);
        const int sum = __ldg(&xs->sum[c]);
        int4 x[4];
#pragma unroll
        for (int l = 0; l < 4; ++l) x[l] = __ldg(reinterpret_cast<const int4*>(xq + 32 * l));
#pragma unroll
        for (int r = 0; r < R; ++r) {
            int s = 0;
#pragma unroll
            for (int l = 0; l < 4; ++l) s = dp4a_16(digits(w[r].q, l), x[l], s);
            acc[r] += float(s - sum) * (w[r].d * dx);
        }
    }
};

// TQ2_G128 (veloxquant's ternary type: an fp16 scale per 128 weights): TQ2_0's quant bytes (two
// 128-value blocks' 32 bytes side by side are a TQ2_0 256-block's 64), a scale per 2 units; the
// integers and the activations' sums as TQ2_0's.
constexpr int kQG128 = 128;
struct TQ2G128Format : TQ2Format {
    static __device__ __forceinline__ Unit load(const GemvParams& p, int row, int u) {
        const int64_t i = int64_t(row) * units(p.cols) + u;
        return Unit{ld_weight16(static_cast<const int4*>(p.w) + i),
                    ld_weight_half(p.w_scale + int64_t(row) * (p.cols / kQG128) + u / 2)};
    }
};
template <int R>
struct TQ2G128FormatR : TQ2G128Format {
    static constexpr int kRows = R;
};
inline bool is_ternary(GgmlType t) { return t == GgmlType::TQ2_0 || t == GgmlType::TQ2_G128; }

// Q6_K (uploaded unpacked, weights.cpp: int8 values q - 32 in order, an int8 scale per 16 values,
// the fp16 d per 256) x q8_K activations: a unit is 16 values, one 16-byte load and one scale,
// the integer dot (dp4a) times d * scale * d_x (d * scale exact in f32). The CPU's integers
// (matmul_kquants.h), summed per 16 in float instead of per 256.
struct Q6KFormat {
    static constexpr int kRows = kGemvRowsPerWarp;
    struct Unit {
        int4 q;
        float d;
    };
    static constexpr int kUnitsPerIter = kGemvLoadsPerRow;
    static __host__ __device__ int units(int cols) { return cols / 16; }
    static __device__ __forceinline__ Unit load(const GemvParams& p, int row, int u) {
        const int64_t i = int64_t(row) * units(p.cols) + u;
        const float d = ld_weight_half(p.w_scale + int64_t(row) * (p.cols / kQK_K) + u / 16);
        return Unit{ld_weight16(static_cast<const int4*>(p.w) + i), d * float(__ldg(p.w_sub + i))};
    }
    template <int R>
    static __device__ __forceinline__ void accumulate(float (&acc)[R], const Unit (&w)[R], const GemvParams& p, int t,
                                                      int u) {
        const int4 x = __ldg(reinterpret_cast<const int4*>(static_cast<const int8_t*>(p.x) + int64_t(t) * p.cols) + u);
        const float dx = __ldg(&p.xk_scale[int64_t(t) * (p.cols / kQK_K) + u / 16].d);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] += float(dp4a_16(w[r].q, x, 0)) * (w[r].d * dx);
    }
};
// The types whose activations are q8_K (gemv_q8k_group, gemv_q8k_fused at n = 1; no GEMM path).
inline bool is_q8k(GgmlType t) { return is_ternary(t) || t == GgmlType::Q6_K; }

// TQ2_0 with R rows per warp (each activation load, 64 bytes of x per unit, feeds R rows; R x
// tokens per pass <= 32, the lanes that store). VXQ_GEMV_TQ2_ROWS=2 runs 2 rows (measurements).
// On the H200 4 rows measured 19.6 / 18.0 us at 5120 x 17408 / 17408 x 5120 against 21.4 / 17.6
// with 2 (docs/gpu.md).
template <int R>
struct TQ2FormatR : TQ2Format {
    static constexpr int kRows = R;
};
constexpr int kTq2RowsDefault = 4;
int tq2_rows() {
    static const int v = [] {
        const char* e = std::getenv("VXQ_GEMV_TQ2_ROWS");
        return e && std::atoi(e) == 2 ? 2 : kTq2RowsDefault;
    }();
    return v;
}

// q8_K activations (ternary_stream_kernels.cuh's q8k_quantize_block): one warp per 256-block b,
// lane l holding its values 8 l .. 8 l + 7 (every lane calls); the quants to qs, the scale and
// quarter sums to s[b].
__device__ __forceinline__ void quantize_block_q8_K(const float (&v)[8], int64_t b, int lane, int8_t* __restrict__ qs,
                                                    Q8KScale* __restrict__ s) {
    int2 q;
    Q8KScale r;
    q8k_quantize_block(v, lane, q, r);
    *reinterpret_cast<int2*>(qs + b * kQK_K + 8 * lane) = q;
    if (lane == 0) s[b] = r;
}

__global__ void quantize_q8_K_kernel(const float* __restrict__ x, int8_t* __restrict__ qs, Q8KScale* __restrict__ s,
                                     int64_t n_blocks) {
    // The GEMV after it may start now (the ternary stream kernel puts its weights in flight, then
    // waits for this grid); this grid's reads of x wait for the kernel before (no-ops without PDL).
    pdl_launch_dependents();
    pdl_wait();
    const int64_t b = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (b >= n_blocks) return;
    const float* xb = x + b * kQK_K + 8 * lane;
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = xb[j];
    quantize_block_q8_K(v, b, lane, qs, s);
}

// quantize_q8_K_kernel for one row of `cols` (a multiple of 256) with quantize_fused_kernel's
// prologues: x = rms_norm(in) * norm_w (written to x) and/or x = silu(x) * up (written back),
// the separate kernels' arithmetic (device_math.cuh), so the same bits.
__global__ void __launch_bounds__(kQuantFusedThreads)
quantize_q8_K_fused_kernel(const float* __restrict__ in, const float* __restrict__ norm_w, float eps, const float* __restrict__ up,
                           float* x, int64_t cols, int8_t* __restrict__ qs, Q8KScale* __restrict__ s) {
    __shared__ double partial[kNormThreads];
    pdl_launch_dependents();  // as quantize_q8_K_kernel
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int64_t b = int64_t(blockIdx.x) * (kQuantFusedThreads / 32) + (threadIdx.x >> 5);
    const bool mine = b < cols / kQK_K;
    const int64_t c0 = b * kQK_K + 8 * lane;
    float v[8], w[8], u[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {  // loaded before the norm's loads and barriers
        v[j] = mine ? in[c0 + j] : 0.0f;
        w[j] = norm_w && mine ? norm_w[c0 + j] : 0.0f;
        u[j] = up && mine ? up[c0 + j] : 0.0f;
    }
    const float scale = norm_w ? block_rms_scale(in, cols, eps, partial) : 1.0f;
    if (!mine) return;  // after the block-wide norm
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        if (norm_w) v[j] = rms_apply(v[j], scale, w[j]);
        if (up) v[j] = silu_mul(v[j], u[j]);
        if (norm_w || up) x[c0 + j] = v[j];  // each element by its own thread (in and x do not overlap)
    }
    quantize_block_q8_K(v, b, lane, qs, s);
}

// Q4_0 with R rows per warp: each 40-byte activation load (32 quants, scale, sum) feeds R rows
// of 18-byte blocks. 4 by default; VXQ_GEMV_Q4_ROWS=2 runs the 2-row layout (measurements).
template <int R>
struct Q4FormatR : Q4Format {
    static constexpr int kRows = R;
};

// Blocks per SM the Q4_0 4-row kernel is compiled for at n = 1 (gemv_group_kernel's kMinBlocks):
// 4 (128 registers, no spills), or 1 with VXQ_GEMV_Q4_MIN_BLOCKS=1 (no register cap: 154
// registers, 3 blocks fit). On the H200 (docs/gpu.md, 2026-12-03) 4 took Q4_0 8B decode from 480
// to 507 t/s (tg64 from an empty cache; tg128 472 to 491): the ffn down GEMV's 512 blocks fit in
// one wave instead of 1.3 (17.7 to 14.5 us alone), the up/gate GEMV alone went from 14.5 to 15.3.
const int g_q4_min_blocks = [] {
    const char* e = std::getenv("VXQ_GEMV_Q4_MIN_BLOCKS");
    return e && std::atoi(e) == 1 ? 1 : 4;
}();

int q4_rows() {
    static const int v = [] {
        const char* e = std::getenv("VXQ_GEMV_Q4_ROWS");
        return e && std::atoi(e) == 2 ? 2 : 4;  // 4: measured 7 % faster decode on the H200 (docs/gpu.md)
    }();
    return v;
}

// __launch_bounds__(..., 1): no register cap. Without it ptxas aimed at lower counts and
// spilled 8-24 bytes in some instantiations; with it none spills (registers per thread for
// NT = 1 with nvcc 13: q8_0 80, q4_0 2 rows 96, 4 rows 154, i.e. 3-6 blocks per SM). The Q4_0
// 4-row kernel at NT = 1 is capped at 4 blocks (g_q4_min_blocks).
// Block bx of the matrix p (the kernels below give it its block index).
template <class F, int NT>
__device__ __forceinline__ void gemv_block(const GemvParams& p, int bx) {
    constexpr int R = F::kRows, U = F::kUnitsPerIter;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = warp / p.split, part = warp - group * p.split;
    const int row0 = (bx * (kGemvWarps / p.split) + group) * R;
    const int t0 = blockIdx.y * NT;
    int row[R];
#pragma unroll
    for (int r = 0; r < R; ++r) row[r] = min(row0 + r, p.rows - 1);
    int tok[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) tok[t] = min(t0 + t, p.n - 1);

    float acc[R][NT] = {};
    const int units = F::units(p.cols);
    bool waited = false;  // PDL: the first weights are loaded before waiting for the kernel that wrote x
    for (int u0 = part * 32 * U; u0 < units; u0 += p.split * 32 * U) {
        int u[U];
        bool valid[U];
#pragma unroll
        for (int j = 0; j < U; ++j) {
            const int uj = u0 + 32 * j + lane;
            valid[j] = uj < units;
            u[j] = valid[j] ? uj : units - 1;
        }
        typename F::Unit w[U][R];
#pragma unroll
        for (int j = 0; j < U; ++j) {
#pragma unroll
            for (int r = 0; r < R; ++r) w[j][r] = F::load(p, row[r], u[j]);
        }
        if (!waited) {
            pdl_wait();
            pdl_launch_dependents();
            waited = true;
        }
#pragma unroll
        for (int j = 0; j < U; ++j) {
            if (!valid[j]) continue;
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                float a[R];
#pragma unroll
                for (int r = 0; r < R; ++r) a[r] = acc[r][t];
                F::accumulate(a, w[j], p, tok[t], u[j]);
#pragma unroll
                for (int r = 0; r < R; ++r) acc[r][t] = a[r];
            }
        }
    }

    if (!waited) pdl_wait();  // a warp without units still stores
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = warp_sum(acc[r][t]);
    }
    if (p.split > 1) {  // the same for the whole block
        __shared__ float partial[kGemvWarps][R * NT];
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
#pragma unroll
                for (int t = 0; t < NT; ++t) partial[warp][r * NT + t] = acc[r][t];
            }
        }
        __syncthreads();
        if (part != 0) return;
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                float s = 0.0f;
                for (int q = 0; q < p.split; ++q) s += partial[group * p.split + q][r * NT + t];
                acc[r][t] = s;
            }
        }
    }
    // Lane r * NT + t stores (row r, token t).
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (lane == r * NT + t && row0 + r < p.rows && t0 + t < p.n) {
                p.y[int64_t(t0 + t) * p.rows + row0 + r] = acc[r][t];
                if (p.resid) p.resid[int64_t(t0 + t) * p.rows + row0 + r] += acc[r][t];
            }
        }
    }
}

// One or several matrices that share x (Q, K and V; gate and up): blocks [first_block[i],
// first_block[i + 1]) are matrix i's, so one launch streams them all.
struct GemvGroupParams {
    GemvParams m[kGemvGroupMax];
    int first_block[kGemvGroupMax + 1];
    int count;
};

// kMinBlocks > 1 caps the registers so that that many blocks fit an SM (Q4_0's 4 rows per warp
// at n = 1: g_q4_min_blocks).
template <class F, int NT, int kMinBlocks = 1>
__global__ void __launch_bounds__(kGemvThreads, kMinBlocks) gemv_group_kernel(const GemvGroupParams g) {
    int i = 0;
    while (i + 1 < g.count && int(blockIdx.x) >= g.first_block[i + 1]) ++i;
    gemv_block<F, NT>(g.m[i], int(blockIdx.x) - g.first_block[i]);
}

// Dense rows whose length is not a whole number of 16-byte units (tiny test models): one warp
// per row, element by element, every token.
template <class E>
__global__ void __launch_bounds__(kGemvThreads)
gemv_dense_scalar_kernel(const typename E::Raw* __restrict__ w, const typename E::Raw* __restrict__ x, int64_t rows,
                         int64_t cols, int64_t n, float* __restrict__ y) {
    const int lane = threadIdx.x & 31;
    const int64_t row = int64_t(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
    if (row >= rows) return;  // whole warps
    const typename E::Raw* wr = w + row * cols;
    for (int64_t t = 0; t < n; ++t) {
        float acc = 0.0f;
        for (int64_t c = lane; c < cols; c += 32) acc += E::load(wr[c]) * E::load(x[t * cols + c]);
        acc = warp_sum(acc);
        if (lane == 0) y[t * rows + row] = acc;
    }
}

// Warps per row group (gemv_group_kernel): split while the grid has fewer than kGemvTargetWarpsPerSm
// warps per SM and every warp of the group keeps at least one full iteration of units.
int gemv_split(int64_t rows, int64_t units, int units_per_iter, int rows_per_warp) {
    const int64_t row_warps = (rows + rows_per_warp - 1) / rows_per_warp;
    const int64_t target = int64_t(sm_count()) * kGemvTargetWarpsPerSm;
    const int64_t per_warp_iter = int64_t(32) * units_per_iter;
    int split = 1;
    while (split < kGemvWarps && row_warps * split < target && units >= int64_t(2 * split) * per_warp_iter) split *= 2;
    return split;
}

int gemv_tokens_per_pass(int64_t n) { return n >= 5 ? 8 : n >= 3 ? 4 : int(n); }

GemvParams gemv_params(const DeviceWeight& w, const void* x, const Q8Scale* xs, int64_t n, float* y) {
    if (w.rows > INT_MAX || w.cols > INT_MAX || n > INT_MAX) {
        throw_cuda_error(cudaErrorInvalidValue, "gemv: a dimension above INT_MAX", __FILE__, __LINE__);
    }
    const int8_t* sub = w.type == GgmlType::Q6_K ? static_cast<const int8_t*>(w.data) + w.rows * w.cols : nullptr;
    return GemvParams{w.data, w.scales, x, xs, y, int(w.rows), int(w.cols), int(n), 1, nullptr, nullptr, sub};
}

// Sets p.split and returns the matrix's blocks along x.
template <class F>
int64_t plan_gemv(GemvParams& p) {
    p.split = gemv_split(p.rows, F::units(p.cols), F::kUnitsPerIter, F::kRows);
    const int64_t rows_per_block = int64_t(kGemvWarps / p.split) * F::kRows;
    return (p.rows + rows_per_block - 1) / rows_per_block;
}

// ps[0..count) share x, x_scale and n.
template <class F>
void launch_gemv_group(const GemvParams* ps, int count, cudaStream_t st) {
    GemvGroupParams g{};
    g.count = count;
    int64_t blocks = 0;
    for (int i = 0; i < count; ++i) {
        g.m[i] = ps[i];
        g.first_block[i] = int(blocks);
        blocks += plan_gemv<F>(g.m[i]);
    }
    g.first_block[count] = int(blocks);
    const int nt = gemv_tokens_per_pass(ps[0].n);
    const dim3 grid(unsigned(blocks), unsigned((ps[0].n + nt - 1) / nt));
    if constexpr (std::is_same_v<F, Q4FormatR<4>>) {
        if (nt == 1 && g_q4_min_blocks == 4) {
            launch_pdl(gemv_group_kernel<F, 1, 4>, grid, dim3(kGemvThreads), 0, st, g);
            return;
        }
    }
    switch (nt) {
        case 1: launch_pdl(gemv_group_kernel<F, 1>, grid, dim3(kGemvThreads), 0, st, g); break;
        case 2: launch_pdl(gemv_group_kernel<F, 2>, grid, dim3(kGemvThreads), 0, st, g); break;
        case 4: launch_pdl(gemv_group_kernel<F, 4>, grid, dim3(kGemvThreads), 0, st, g); break;
        default: launch_pdl(gemv_group_kernel<F, 8>, grid, dim3(kGemvThreads), 0, st, g); break;
    }
}

// One matrix: the group kernel with one member (the same body as a group's).
template <class F>
void launch_gemv(GemvParams p, cudaStream_t st) {
    launch_gemv_group<F>(&p, 1, st);
}

// ---- batch-1 GEMV -------------------------------------------------------------------------------
// n == 1 (a decode step) has its own kernel, built for the three costs that the kernel above
// leaves at batch 1: the separate kernel that converts x, the last partial wave of a grid of
// small blocks, and the gap between two kernels.
//  - The grid is persistent: at most kG1BlocksPerSm blocks per SM, each taking items (a few
//    rows of one matrix, all their columns) in turn, so the work of the last items is spread
//    over the whole GPU (the planner picks rows per item so that items divide evenly).
//  - Each thread converts the units of x it multiplies to the dot type into registers (the
//    f16/bf16 rounding of convert_kernel: the same numbers), optionally after an RMSNorm of x;
//    where it cannot (XM below), the block stages all of x in shared memory first.
//  - Weights go through a ring of S items in shared memory (cp.async, no registers held): a
//    block has its next S items' weights in flight, S = 2 (kG1StagesDefault; 64 KB per block,
//    128 KB per SM). Launched with PDL (launch.cuh): the first S items are requested before
//    pdl_wait(), so they stream while the previous kernel finishes. On the H200 the ring took
//    the ffn up/gate GEMV from 80 % to 88 % of copy bandwidth and the output head from 95 % to
//    97 % against the register design it replaced (one item in flight per thread), at 64
//    registers instead of 96 (docs/gpu.md).
// F32/F16/BF16 weights (Q8_0/Q4_0 keep the kernel above: g1_dispatch). An item's units (16
// weight bytes of a row) are
// numbered idx = slot * units_per_row + unit; thread t takes idx = t + 256 j (j < kMaxUnits),
// the same slots and units for every item. Each unit's dot product is one partial sum in shared
// memory; a row's sum adds its units' partials in a fixed order (lane-strided, then a warp
// tree), which depends neither on the rows per item nor on the grid: the same bits for a matrix
// alone or in a group, fused or not. Rows of more than 1024 units (f16 cols > 8192: ffn down)
// are items alone, each thread's units summed in registers first (whole_row below): one warp
// then adds 256 sums instead of 1792 partials per item, the chain each item waited for.
constexpr int kG1Threads = 256;
static_assert(kG1Threads == kNormThreads, "the RMSNorm prologue reduces over the block");
constexpr int kG1Warps = kG1Threads / 32;
constexpr size_t kG1MaxXBytes = size_t(64) << 10;  // x in shared memory: f16 cols up to 32768

struct G1Matrix {
    const void* w;          // [rows, cols] as stored
    float* y;
    int rows, first_item;   // items [first_item, next matrix's first_item) are this matrix's
};

struct G1Params {
    G1Matrix m[kGemvGroupMax];
    int count, n_items;
    const float* x;          // f32 activations (the norm's input with norm_w)
    const float* norm_w;     // RMSNorm weight, or nullptr
    float* norm_out;         // with norm_w: the normalized x (each block writes its stretch)
    float eps;
    float* resid;            // resid[r] += y[r], or nullptr (one matrix)
    int swiglu;              // two matrices: slots [0, R) are gate rows, [R, 2R) up rows
    int cols, upr, slots, rows_per_item;  // units per row; slots (rows) per item
    int x_bytes;             // shared bytes of the converted x (16-byte multiple)
    const uint8_t* l2_next;  // GemvFusion::l2_next: each block fetches its share into L2
    unsigned l2_next_bytes;
};

// Dense weights: a unit is 16 bytes; x in shared memory in the weight's 16-bit type (f32 as is).
template <class E>
struct G1Dense {
    using Unit = uint4;
    static constexpr int kPer = 4 * E::kPerWord;  // elements per unit
    static constexpr int kMaxUnits = 8;           // per thread and item: 128 bytes in flight
    static __host__ __device__ int units(int cols) { return cols / kPer; }
    static __host__ __device__ bool shape_ok(int cols) { return cols % kPer == 0; }
    static __host__ __device__ int x_bytes(int cols) { return (cols * int(sizeof(typename E::Raw)) + 15) / 16 * 16; }
    static __device__ __forceinline__ const Unit* address(const G1Matrix& m, int upr, int row, int u) {
        return static_cast<const uint4*>(m.w) + int64_t(row) * upr + u;
    }
    static __device__ __forceinline__ float dot(const Unit& w, const uint8_t* xs, int u) {
        return dot_r(w, reinterpret_cast<const uint4*>(xs)[u]);
    }
    // The same with x's unit given (x in registers).
    static __device__ __forceinline__ float dot_r(const Unit& w, const Unit& xv) {
        float wf[kPer], xf[kPer];
        DenseFormat<E>::widen(w, wf);
        DenseFormat<E>::widen(xv, xf);
        float acc = 0.0f;
#pragma unroll
        for (int e = 0; e < kPer; ++e) acc = fmaf(wf[e], xf[e], acc);
        return acc;
    }
    // Unit u of a f32 row (16-byte aligned) into f.
    static __device__ __forceinline__ void load_unit(const float* row, int u, float (&f)[kPer]) {
#pragma unroll
        for (int i = 0; i < kPer / 4; ++i) {
            const float4 v = reinterpret_cast<const float4*>(row + int64_t(u) * kPer)[i];
            f[4 * i] = v.x;
            f[4 * i + 1] = v.y;
            f[4 * i + 2] = v.z;
            f[4 * i + 3] = v.w;
        }
    }
    // f in the weight's 16-bit type (f32 as is), converted as stage does, in memory order.
    static __device__ __forceinline__ Unit pack(const float (&f)[kPer]) {
        unsigned w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if constexpr (E::kPerWord == 1) {
                w[i] = __float_as_uint(f[i]);
            } else {
                w[i] = raw16(E::from_float(f[2 * i])) | (raw16(E::from_float(f[2 * i + 1])) << 16);
            }
        }
        return Unit{w[0], w[1], w[2], w[3]};
    }
    static __device__ __forceinline__ unsigned raw16(__half h) { return __half_as_ushort(h); }
    static __device__ __forceinline__ unsigned raw16(uint16_t b) { return b; }
    // Unit u of x (no norm), converted.
    static __device__ __forceinline__ Unit x_unit(const float* x, int u) {
        float f[kPer];
        load_unit(x, u, f);
        return pack(f);
    }
    // value(c): x[c] after the optional norm, also written to copy[c] for c in [lo, hi) where copy
    // is not null. All threads call.
    template <class V>
    static __device__ __forceinline__ void stage(int cols, uint8_t* xs, V value, float* copy, int64_t lo, int64_t hi) {
        auto* out = reinterpret_cast<typename E::Raw*>(xs);
        strided_batches<kG1Threads>(cols, value, [&](int64_t c, float v) {
            out[c] = E::from_float(v);
            if (copy && c >= lo && c < hi) copy[c] = v;
        });
    }
};

__device__ __forceinline__ const G1Matrix& g1_matrix(const G1Params& p, int i) {
    return i == 0 ? p.m[0] : i == 1 ? p.m[1] : p.m[2];
}

// The matrix and first row of an item.
__device__ __forceinline__ void g1_item(const G1Params& p, int item, int& mi, int& row0) {
    mi = 0;
    while (mi + 1 < p.count && item >= g1_matrix(p, mi + 1).first_item) ++mi;
    row0 = (item - g1_matrix(p, mi).first_item) * p.rows_per_item;
}

// Issues the copies of the units of `item` that this thread takes into its slots of a ring
// stage (unit j of thread t at stage[j * kG1Threads + t]; rows past a matrix's end re-read its
// last), then commits them as one group. Past the last item it commits an empty group, so that
// every thread has committed the same number of groups at each step.
template <class F>
__device__ __forceinline__ void g1_issue(const G1Params& p, int item, const int (&slot)[F::kMaxUnits],
                                         const int (&unit)[F::kMaxUnits], int n_units, typename F::Unit* stage) {
    if (item < p.n_items) {
        int mi, row0;
        g1_item(p, item, mi, row0);
#pragma unroll
        for (int j = 0; j < F::kMaxUnits; ++j) {
            if (j >= n_units) break;
            int m = mi, r = row0 + slot[j];
            if (p.swiglu) {
                m = slot[j] >= p.rows_per_item ? 1 : 0;
                r = row0 + slot[j] - m * p.rows_per_item;
            }
            const G1Matrix& M = g1_matrix(p, m);
            cp_async16_weight(stage + j * kG1Threads + threadIdx.x, F::address(M, p.upr, min(r, M.rows - 1), unit[j]));
        }
    }
    cp_async_commit();
}

// Block b's share of p.l2_next (16-byte pieces, the blocks in order) requested into L2 (Hopper's
// bulk prefetch, cp_async.cuh). One thread calls.
__device__ __forceinline__ void g1_l2_next(const G1Params& p) {
    const unsigned grid = gridDim.x, per = (p.l2_next_bytes / grid + 15) / 16 * 16;
    const unsigned lo = blockIdx.x * per;
    if (per == 0 || lo >= p.l2_next_bytes) return;
    const unsigned n = min(per, p.l2_next_bytes - lo);
    prefetch_l2_bulk(p.l2_next + lo, n);
}

// The sum of a slot's unit partials (the whole warp calls; every lane gets it).
__device__ __forceinline__ float g1_slot_sum(const float* red, int slot, int upr, int lane) {
    float a = 0.0f;
    for (int c = lane; c < upr; c += 32) a += red[slot * upr + c];
    return warp_sum(a);
}

// Where x is (XM): kG1XStaged, the block stages all of x in shared memory (converted, after the
// norm); kG1XRegs (no norm), kG1XRegsNorm (norm, rows of 256 or 512 units): every item of a thread
// uses the same units of x (unit[j]), so the thread loads and converts those into registers after
// the wait (with the norm: its units and their norm weights loaded before the row's scale is
// computed, each unit written to norm_out where in the block's stretch), with no barrier before
// the first item (ffn down stages 14336 values per block otherwise). Same bits (g1_x_mode).
constexpr int kG1XStaged = 0, kG1XRegs = 1, kG1XRegsNorm = 2;
template <class F, int S, int XM>
__global__ void __launch_bounds__(kG1Threads, 2) gemv1_kernel(const G1Params p) {
    constexpr bool XR = XM == kG1XRegs, XN = XM == kG1XRegsNorm;
    constexpr int L = F::kMaxUnits;
    using Unit = typename F::Unit;
    extern __shared__ uint4 g1_smem[];
    Unit* ring = reinterpret_cast<Unit*>(g1_smem);                    // [S][L * kG1Threads]
    uint8_t* xs = reinterpret_cast<uint8_t*>(ring + S * L * kG1Threads);
    float* red = reinterpret_cast<float*>(xs + p.x_bytes);          // [2][L * kG1Threads]
    double* partial = reinterpret_cast<double*>(red + 2 * L * kG1Threads);  // [kG1Threads]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    const int total = p.slots * p.upr;
    int slot[L], unit[L];
    int n_units = 0;  // this thread's units per item: j < n_units
#pragma unroll
    for (int j = 0; j < L; ++j) {
        const int idx = tid + kG1Threads * j;
        if (idx < total) n_units = j + 1;
        slot[j] = idx < total ? idx / p.upr : 0;
        unit[j] = idx < total ? idx - slot[j] * p.upr : 0;
    }
    // The first S items' weights: written by no kernel, so before the wait.
    const int grid = int(gridDim.x);
#pragma unroll
    for (int k = 0; k < S; ++k) g1_issue<F>(p, int(blockIdx.x) + k * grid, slot, unit, n_units, ring + k * L * kG1Threads);

    pdl_wait();
    pdl_launch_dependents();
    Unit xr[XR ? L : XN ? 2 : 1];  // XR: unit[j]'s; XN: units tid and tid + 256
    float scale = 1.0f;
    // With the norm, the normalized row is also written out, each block its stretch [lo, lo + per).
    const int64_t per = (int64_t(p.cols) + grid - 1) / grid, lo = int64_t(blockIdx.x) * per;
    if constexpr (XR) {
#pragma unroll
        for (int j = 0; j < L; ++j) xr[j] = j < n_units ? F::x_unit(p.x, unit[j]) : Unit{};
    } else if constexpr (XN) {
        const int D = p.upr / kG1Threads;  // 1 or 2 (g1_x_mode)
        float xf[2][F::kPer], wf[2][F::kPer];
#pragma unroll
        for (int d = 0; d < 2; ++d) {
            if (d < D) {
                F::load_unit(p.x, tid + kG1Threads * d, xf[d]);
                F::load_unit(p.norm_w, tid + kG1Threads * d, wf[d]);
            }
        }
        scale = block_rms_scale(p.x, p.cols, p.eps, partial);
#pragma unroll
        for (int d = 0; d < 2; ++d) {
            if (d < D) {
                const int64_t c0 = int64_t(tid + kG1Threads * d) * F::kPer;
#pragma unroll
                for (int e = 0; e < F::kPer; ++e) {
                    xf[d][e] = rms_apply(xf[d][e], scale, wf[d][e]);
                    if (c0 + e >= lo && c0 + e < lo + per) p.norm_out[c0 + e] = xf[d][e];
                }
                xr[d] = F::pack(xf[d]);
            } else {
                xr[d] = Unit{};
            }
        }
    } else if (p.norm_w) {
        scale = block_rms_scale(p.x, p.cols, p.eps, partial);
        F::stage(p.cols, xs, [&](int64_t c) { return rms_apply(p.x[c], scale, p.norm_w[c]); }, p.norm_out, lo, lo + per);
    } else {
        F::stage(p.cols, xs, [&](int64_t c) { return p.x[c]; }, nullptr, 0, 0);
    }
    if constexpr (XM == kG1XStaged) __syncthreads();
    pdl_trace_mark(31);

    // A row longer than half of what a block takes per item is an item alone, every unit of this
    // thread in it (a property of cols, not of the plan): the thread sums its units first, in j's
    // order, and the row's sum adds the 256 threads' sums (lane-strided, then a warp tree).
    const bool whole_row = 2 * p.upr > L * kG1Threads;
    int k = 0;  // ring stage of `item`
    for (int item = blockIdx.x, buf = 0; item < p.n_items; item += grid, buf ^= 1) {
        Unit* stage = ring + k * L * kG1Threads;
        int mi, row0;
        g1_item(p, item, mi, row0);
        const G1Matrix& M = g1_matrix(p, mi);
        // The residual this warp's first slot adds to, loaded now so that its latency passes
        // during the dot products and the barrier.
        const bool resid_mine = p.resid && lane == 0 && warp < p.slots && row0 + warp < M.rows;
        const float resid_old = resid_mine ? p.resid[row0 + warp] : 0.0f;
        cp_async_wait<S - 1>();  // this item's group (the oldest of the S in flight)
        float acc[L];
#pragma unroll
        for (int j = 0; j < L; ++j) {
            if constexpr (XR) {
                acc[j] = j < n_units ? F::dot_r(stage[j * kG1Threads + tid], xr[j]) : 0.0f;
            } else if constexpr (XN) {  // unit[j] = tid + 256 (j % D): a select of values, not an index into xr
                const bool hi = (j & 1) && p.upr > kG1Threads;
                const Unit xv{hi ? xr[1].x : xr[0].x, hi ? xr[1].y : xr[0].y, hi ? xr[1].z : xr[0].z, hi ? xr[1].w : xr[0].w};
                acc[j] = j < n_units ? F::dot_r(stage[j * kG1Threads + tid], xv) : 0.0f;
            } else {
                acc[j] = j < n_units ? F::dot(stage[j * kG1Threads + tid], xs, unit[j]) : 0.0f;
            }
        }
        g1_issue<F>(p, item + S * grid, slot, unit, n_units, stage);  // the stage is free again: S items ahead
        k = k + 1 == S ? 0 : k + 1;
        // The first item after which this block requests nothing more: the next kernel's weights.
        const bool issued_last = item + S * grid >= p.n_items && (item == int(blockIdx.x) || item + (S - 1) * grid < p.n_items);
        if (issued_last && p.l2_next && tid == 0) g1_l2_next(p);
        float* r = red + buf * L * kG1Threads;
        if (whole_row) {
            float a = 0.0f;
#pragma unroll
            for (int j = 0; j < L; ++j) {
                if (j < n_units) a += acc[j];
            }
            r[tid] = a;
        } else {
#pragma unroll
            for (int j = 0; j < L; ++j) {
                if (j < n_units) r[j * kG1Threads + tid] = acc[j];
            }
        }
        // One barrier per item: red is double-buffered, and a buffer is written again only after
        // the next barrier, which every warp passes after its reads of this one.
        __syncthreads();
        const auto store = [&](int s, float v) {  // lane 0
            if (row0 + s >= M.rows) return;
            M.y[row0 + s] = v;
            if (p.resid) p.resid[row0 + s] = (s == warp ? resid_old : p.resid[row0 + s]) + v;
        };
        if (whole_row) {
            if (warp == 0) {
                const float v = g1_slot_sum(r, 0, kG1Threads, lane);
                if (lane == 0) store(0, v);
            }
        } else if (p.swiglu) {
            const G1Matrix &gate = g1_matrix(p, 0), &up = g1_matrix(p, 1);
            for (int s = warp; s < p.rows_per_item; s += kG1Warps) {
                const float g = g1_slot_sum(r, s, p.upr, lane), u = g1_slot_sum(r, p.rows_per_item + s, p.upr, lane);
                if (lane == 0 && row0 + s < gate.rows) {
                    gate.y[row0 + s] = silu_mul(g, u);
                    up.y[row0 + s] = u;
                }
            }
        } else {
            for (int s = warp; s < p.slots; s += kG1Warps) {
                const float v = g1_slot_sum(r, s, p.upr, lane);
                if (lane == 0) store(s, v);
            }
        }
    }
    cp_async_wait<0>();  // no copy outlives the block
    pdl_trace_mark(32);
}

constexpr int kG1BlocksPerSmDefault = 2;

int g1_blocks_per_sm() {
    static const int v = [] {
        const char* e = std::getenv("VXQ_GEMV1_BLOCKS_PER_SM");  // benchmark sweeps only
        const int b = e ? std::atoi(e) : kG1BlocksPerSmDefault;
        return std::clamp(b, 1, 8);
    }();
    return v;
}

// Items whose weights a block has in flight: the stages of its shared-memory ring
// (VXQ_GEMV1_STAGES, 1 to 3, for sweeps).
constexpr int kG1StagesDefault = 2;
int g1_stages() {
    static const int v = [] {
        const char* e = std::getenv("VXQ_GEMV1_STAGES");
        return std::clamp(e ? std::atoi(e) : kG1StagesDefault, 1, 3);
    }();
    return v;
}

// Shared memory of a block: the ring of S items' weights, x, the double-buffered unit partials,
// the norm's reduction.
template <class F>
size_t g1_smem_bytes(size_t x_bytes, int stages) {
    return size_t(stages) * F::kMaxUnits * kG1Threads * sizeof(typename F::Unit) + x_bytes +
           2 * size_t(F::kMaxUnits) * kG1Threads * sizeof(float) + kG1Threads * sizeof(double);
}

// Fills p (all but x, norm and resid) for ws; false where the batch-1 kernel cannot take them.
template <class F>
bool g1_plan(const DeviceWeight* const* ws, float* const* ys, int count, bool swiglu, G1Params& p, int& grid) {
    const DeviceWeight& w0 = *ws[0];
    if (count < 1 || count > kGemvGroupMax || w0.cols > INT_MAX || !F::shape_ok(int(w0.cols))) return false;
    if (swiglu && (count != 2 || ws[1]->rows != w0.rows)) return false;
    for (int i = 0; i < count; ++i) {
        if (ws[i]->type != w0.type || ws[i]->cols != w0.cols || ws[i]->rows > INT_MAX) return false;
    }
    const int cols = int(w0.cols), upr = F::units(cols);
    const int max_slots = F::kMaxUnits * kG1Threads / upr;
    if (max_slots < (swiglu ? 2 : 1)) return false;
    if (size_t(F::x_bytes(cols)) > kG1MaxXBytes) return false;
    // Rows per item: the most that still divide into whole rounds of the grid (>= 90 % of the
    // last round busy), else the best balance; fewer rows per item = fewer loads in flight.
    const int cap = sm_count() * g1_blocks_per_sm();
    const auto items_for = [&](int per) {
        int64_t n = 0;
        for (int i = 0; i < (swiglu ? 1 : count); ++i) n += (ws[i]->rows + per - 1) / per;
        return n;
    };
    const auto balance = [&](int64_t items) {
        const int64_t g = std::min<int64_t>(items, cap);
        const int64_t rounds = (items + g - 1) / g;
        return double(items) / double(rounds * g);
    };
    int best = 1;
    double best_balance = -1.0;
    for (int per = swiglu ? max_slots / 2 : max_slots; per >= 1; per = per > 1 ? per / 2 : 0) {
        const double b = balance(items_for(per));
        if (b >= 0.9) {
            best = per;
            break;
        }
        if (b > best_balance + 1e-9) {
            best_balance = b;
            best = per;
        }
    }
    p = G1Params{};
    p.count = count;
    int64_t items = 0;
    for (int i = 0; i < count; ++i) {
        // swiglu: every item is (gate, up) rows; matrix 1 owns none of its own.
        p.m[i] = G1Matrix{ws[i]->data, ys ? ys[i] : nullptr, int(ws[i]->rows),
                          swiglu && i > 0 ? INT_MAX : int(items)};
        if (!swiglu) items += (ws[i]->rows + best - 1) / best;
    }
    if (swiglu) items = (w0.rows + best - 1) / best;
    if (items > INT_MAX) return false;
    p.n_items = int(items);
    p.swiglu = swiglu ? 1 : 0;
    p.cols = cols;
    p.upr = upr;
    p.rows_per_item = best;
    p.slots = swiglu ? 2 * best : best;
    p.x_bytes = F::x_bytes(cols);
    grid = int(std::min<int64_t>(items, cap));
    return true;
}

template <class F, int S, int XM = kG1XStaged>
void g1_launch_stages(const G1Params& p, int grid, cudaStream_t st) {
    static PerDevice attr_set;
    once_per_device(attr_set, [] {  // the most any call asks for (once per kernel and device, before any launch)
        VXQ_CUDA_CHECK(cudaFuncSetAttribute(gemv1_kernel<F, S, XM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            int(g1_smem_bytes<F>(kG1MaxXBytes, S))));
    });
    launch_pdl(gemv1_kernel<F, S, XM>, dim3(unsigned(grid)), dim3(kG1Threads), g1_smem_bytes<F>(size_t(p.x_bytes), S), st,
               p);
}

bool g_gemv1_x_regs = true;  // set_gemv1_x_in_registers

// Where p's x can be (gemv1_kernel): in registers where x (and the norm weight) are 16-byte
// aligned, with the norm only for rows of 256 or 512 units (a thread's units tid, tid + 256).
int g1_x_mode(const G1Params& p) {
    const auto aligned = [](const void* a) { return reinterpret_cast<uintptr_t>(a) % 16 == 0; };
    if (!aligned(p.x)) return kG1XStaged;
    if (!p.norm_w) return kG1XRegs;
    const bool rows_fit = p.upr % kG1Threads == 0 && p.upr / kG1Threads <= 2;
    return rows_fit && aligned(p.norm_w) ? kG1XRegsNorm : kG1XStaged;
}

template <class F>
void g1_launch(const G1Params& p, int grid, cudaStream_t st) {
    const int mode = g_gemv1_x_regs && g1_stages() == 2 ? g1_x_mode(p) : kG1XStaged;
    if (mode != kG1XStaged) {
        G1Params q = p;
        q.x_bytes = 0;  // no x in shared memory
        if (mode == kG1XRegs) return g1_launch_stages<F, 2, kG1XRegs>(q, grid, st);
        return g1_launch_stages<F, 2, kG1XRegsNorm>(q, grid, st);
    }
    switch (g1_stages()) {
        case 1: return g1_launch_stages<F, 1>(p, grid, st);
        case 3: return g1_launch_stages<F, 3>(p, grid, st);
        default: return g1_launch_stages<F, 2>(p, grid, st);
    }
}

// The batch-1 kernel for ws (one type) with `f`: whether it can run, and with `st` it runs
// (x: the input, or the norm's output with f.norm_weight).
template <class F>
bool g1_run(const DeviceWeight* const* ws, float* const* ys, int count, const float* x, const GemvFusion& f,
            const cudaStream_t* st) {
    G1Params p;
    int grid = 0;
    if (!g1_plan<F>(ws, ys, count, f.swiglu, p, grid)) return false;
    if (f.resid && count != 1) return false;
    if (f.norm_weight && !f.norm_in) return false;
    if (!st) return true;
    p.x = f.norm_weight ? f.norm_in : x;
    p.norm_w = f.norm_weight;
    p.norm_out = const_cast<float*>(x);
    p.eps = f.norm_eps;
    p.resid = f.resid;
    p.l2_next = static_cast<const uint8_t*>(f.l2_next);
    p.l2_next_bytes = unsigned(std::min<size_t>(f.l2_next_bytes, size_t(1) << 30) / 16 * 16);
    g1_launch<F>(p, grid, *st);
    return true;
}

// Dense weights only: for Q8_0/Q4_0 this design measured slower on the H200 than the kernel
// above with its quantize kernel (bench/gpu_gemv.cu, docs/gpu.md), so they keep that one.
bool g1_dispatch(const DeviceWeight* const* ws, float* const* ys, int count, const float* x, const GemvFusion& f,
                 const cudaStream_t* st) {
    switch (ws[0]->type) {
        case GgmlType::F32: return g1_run<G1Dense<F32Elem>>(ws, ys, count, x, f, st);
        case GgmlType::F16: return g1_run<G1Dense<F16Elem>>(ws, ys, count, x, f, st);
        case GgmlType::BF16: return g1_run<G1Dense<BF16Elem>>(ws, ys, count, x, f, st);
        default: return false;
    }
}

// Whether a plain gemv/gemv_group at n = 1 takes the batch-1 kernel.
bool g1_takes(const DeviceWeight* const* ws, int count) { return g1_dispatch(ws, nullptr, count, nullptr, GemvFusion{}, nullptr); }

// The plan of gemv(w, ..., 1, ...) for gemv_describe.
bool g1_describe(const DeviceWeight& w, G1Params& p, int& grid) {
    const DeviceWeight* ws[] = {&w};
    switch (w.type) {
        case GgmlType::F32: return g1_plan<G1Dense<F32Elem>>(ws, nullptr, 1, false, p, grid);
        case GgmlType::F16: return g1_plan<G1Dense<F16Elem>>(ws, nullptr, 1, false, p, grid);
        case GgmlType::BF16: return g1_plan<G1Dense<BF16Elem>>(ws, nullptr, 1, false, p, grid);
        default: return false;
    }
}

unsigned grid_for(int64_t n, int threads) {
    return unsigned(std::clamp<int64_t>((n + threads - 1) / threads, 1, 65535));
}

size_t align256(size_t v) { return (v + 255) & ~size_t(255); }

bool is_quant(GgmlType t) { return t == GgmlType::Q8_0 || t == GgmlType::Q4_0; }

// Dense rows take the 16-byte kernel when they are whole units and x is 16-byte aligned.
template <class E>
bool dense_vector_path(const DeviceWeight& w, const void* x) {
    return w.cols % DenseFormat<E>::kPer16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

template <class E>
void gemv_dense(const DeviceWeight& w, const float* x, int64_t n, float* y, GemvScratch& s, cudaStream_t st) {
    using Raw = typename E::Raw;
    const Raw* xt;
    if constexpr (std::is_same_v<Raw, float>) {
        xt = x;
    } else {
        Raw* conv = static_cast<Raw*>(s.reserve(size_t(n * w.cols) * sizeof(Raw)));
        convert_kernel<E><<<grid_for(n * w.cols, 256), 256, 0, st>>>(x, conv, n * w.cols);
        VXQ_CUDA_CHECK_LAUNCH();
        xt = conv;
    }
    if (dense_vector_path<E>(w, xt)) {
        launch_gemv<DenseFormat<E>>(gemv_params(w, xt, nullptr, n, y), st);
    } else {
        const unsigned blocks = unsigned((w.rows + kGemvWarps - 1) / kGemvWarps);
        gemv_dense_scalar_kernel<E><<<blocks, kGemvThreads, 0, st>>>(static_cast<const Raw*>(w.data), xt, w.rows, w.cols,
                                                                     n, y);
        VXQ_CUDA_CHECK_LAUNCH();
    }
}

// The quantized activations of a Q8_0/Q4_0 (q8_0 blocks of 32, Q8Scale) or TQ2_0 (q8_K blocks of
// 256, Q8KScale) GEMV, in its scratch: [n, cols] int8 quants, then (256-byte aligned) [n, cols /
// block] scales.
template <class Scale>
struct QuantX {
    int8_t* qs;
    Scale* s;
};
template <class Scale>
size_t quant_x_bytes(int64_t n, int64_t cols, int64_t block) {
    return align256(size_t(n * cols)) + size_t(n * (cols / block)) * sizeof(Scale);
}
template <class Scale>
QuantX<Scale> quant_x_in(GemvScratch& s, int64_t n, int64_t cols, int64_t block) {
    auto* base = static_cast<uint8_t*>(s.reserve(quant_x_bytes<Scale>(n, cols, block)));
    return {reinterpret_cast<int8_t*>(base), reinterpret_cast<Scale*>(base + align256(size_t(n * cols)))};
}
// x quantized into the scratch by `kernel` (a warp per block).
template <class Scale>
QuantX<Scale> quantize_x(void (*kernel)(const float*, int8_t*, Scale*, int64_t), const float* x, int64_t n, int64_t cols,
                         int64_t block, GemvScratch& s, cudaStream_t st) {
    const QuantX<Scale> q = quant_x_in<Scale>(s, n, cols, block);
    const int64_t blocks = n * (cols / block);
    kernel<<<unsigned((blocks * 32 + 255) / 256), 256, 0, st>>>(x, q.qs, q.s, blocks);
    VXQ_CUDA_CHECK_LAUNCH();
    return q;
}

size_t gemv_quant_scratch_bytes(const DeviceWeight& w, int64_t n) { return quant_x_bytes<Q8Scale>(n, w.cols, kQBlock); }

// The Q8_0 or Q4_0 GEMV of ps (x already quantized).
void launch_quant_group(GgmlType type, const GemvParams* ps, int count, cudaStream_t st) {
    if (type == GgmlType::Q8_0) {
        launch_gemv_group<Q8Format>(ps, count, st);
    } else if (q4_rows() == 4) {
        launch_gemv_group<Q4FormatR<4>>(ps, count, st);
    } else {
        launch_gemv_group<Q4Format>(ps, count, st);
    }
}

// ws[0..count) share x (same type and cols): x quantized to q8_0 once, then one launch.
void gemv_quant_group(const DeviceWeight* const* ws, float* const* ys, int count, const float* x, int64_t n,
                      GemvScratch& s, cudaStream_t st) {
    const DeviceWeight& w = *ws[0];
    const QuantX<Q8Scale> xa = quantize_x(quantize_q8_0_kernel, x, n, w.cols, kQBlock, s, st);
    GemvParams ps[kGemvGroupMax];
    for (int i = 0; i < count; ++i) ps[i] = gemv_params(*ws[i], xa.qs, xa.s, n, ys[i]);
    launch_quant_group(w.type, ps, count, st);
}

// n = 1 with a fusion (gemv_fusable): the norm or SwiGLU before, in the quantize kernel (none
// when x arrives quantized); the residual add in the GEMV's store.
void gemv_quant_fused(const DeviceWeight* const* ws, float* const* ys, int count, float* x, const GemvFusion& f,
                      GemvScratch& s, cudaStream_t st) {
    const DeviceWeight& w = *ws[0];
    Q8Act xa = f.x_q8;
    if (!xa.qs) {
        const int64_t nb = w.cols / kQBlock;
        const QuantX<Q8Scale> q = quant_x_in<Q8Scale>(s, 1, w.cols, kQBlock);
        xa.qs = q.qs;
        xa.s = q.s;
        const float* in = f.norm_weight ? f.norm_in : x;
        const unsigned blocks = unsigned((nb + kQuantFusedThreads / 32 - 1) / (kQuantFusedThreads / 32));
        launch_pdl(quantize_fused_kernel, dim3(blocks), dim3(kQuantFusedThreads), 0, st, in, f.norm_weight, f.norm_eps,
                   f.swiglu_up, x, w.cols, xa.qs, xa.s);
    }
    GemvParams ps[kGemvGroupMax];
    for (int i = 0; i < count; ++i) {
        ps[i] = gemv_params(*ws[i], xa.qs, xa.s, 1, ys[i]);
        ps[i].resid = f.resid;
    }
    launch_quant_group(w.type, ps, count, st);
}

size_t gemv_q8k_scratch_bytes(const DeviceWeight& w, int64_t n) { return quant_x_bytes<Q8KScale>(n, w.cols, kQK_K); }

// The batch-1 ternary GEMV of ternary_stream_kernels.cuh, by default (VXQ_GEMV_TQ2_STREAM=0 or
// set_gemv_ternary_stream(false): the group kernel, for A/B).
bool g_ternary_stream = [] {
    const char* e = std::getenv("VXQ_GEMV_TQ2_STREAM");
    return !(e && std::atoi(e) == 0);
}();
// The warps of a block the plan prefers: 16 (VXQ_GEMV_TS_WARPS=32 or 8, or
// set_gemv_ternary_stream_warps: 32, or 8 in the half-SM form; for A/B).
int g_ternary_stream_warps = [] {
    const char* e = std::getenv("VXQ_GEMV_TS_WARPS");
    const int v = e ? std::atoi(e) : 16;
    return v == 32 || v == 8 ? v : 16;
}();
// Half an SM a call (VXQ_GEMV_TS_HALF=1 or set_gemv_ternary_half(true)): the stream kernel's block
// within half an SM's registers and shared memory, the lane-piece kernel's grid at half the blocks
// an SM holds, so that the next call's blocks (PDL) start beside this call's. Off by default
// until timed on a GPU.
bool g_ternary_half = [] {
    const char* e = std::getenv("VXQ_GEMV_TS_HALF");
    return e && std::atoi(e) == 1;
}();
struct TernaryStreamPlan {
    int W = 0, R = 0, S = 0, smem = 0;  // R = 0: the stream kernel does not take the matrix
    bool half = false;                  // the half-SM form (MinBlocks 2)
};
// Warps, rows a warp takes together and the depth of its ring: with 16 warps the deepest ring of
// 2 rows, then of 1, of at least 2 stages; with 32 (preferred, or where no 16-warp ring fits) rings
// down to one stage. The first that fits the device's shared memory (a block per SM). In the
// half-SM form, 16 warps (or 8 preferred) within half an SM's shared memory, else as above.
TernaryStreamPlan ternary_stream_plan(const DeviceWeight& w) {
    if (!g_ternary_stream || !is_ternary(w.type) || w.cols > (int64_t(1) << 24) || w.rows > INT_MAX / 2) return {};
    const int sg = w.type == GgmlType::TQ2_G128 ? kQG128 : kQK_K, cols = int(w.cols);
    if (cols % kQK_K != 0 || (cols / sg) % 2 != 0) return {};  // each row's scales a 4-byte multiple
    const auto first_fit = [&](std::span<const int[3]> order, int limit, bool half) -> TernaryStreamPlan {
        for (const auto& o : order) {
            const int bytes = ts_smem_bytes(cols, sg, o[0], o[1], o[2]);
            if (bytes <= limit) return {o[0], o[1], o[2], bytes, half};
        }
        return {};
    };
    // The first fit of `usual`, or of `other` where the preferred warps are other's (or usual has none).
    const auto fit = [&](std::span<const int[3]> usual, std::span<const int[3]> other, bool prefer_other, int limit, bool half) {
        const TernaryStreamPlan a = first_fit(prefer_other ? other : usual, limit, half);
        return a.R ? a : first_fit(prefer_other ? usual : other, limit, half);
    };
    if (g_ternary_half) {
        constexpr int h16[][3] = {{16, 2, 2}, {16, 1, 2}, {16, 1, 1}};
        constexpr int h8[][3] = {{8, 2, 4}, {8, 1, 4}, {8, 2, 2}, {8, 1, 2}};
        if (const TernaryStreamPlan a = fit(h16, h8, g_ternary_stream_warps == 8, smem_half_sm() - kTsStaticSmem, true); a.R) return a;
    }
    constexpr int k16[][3] = {{16, 2, 8}, {16, 2, 4}, {16, 1, 8}, {16, 1, 4}, {16, 2, 2}, {16, 1, 2}};
    constexpr int k32[][3] = {{32, 2, 4}, {32, 1, 4}, {32, 2, 2}, {32, 1, 2}, {32, 2, 1}, {32, 1, 1}};
    return fit(k16, k32, g_ternary_stream_warps == 32, smem_optin(), false);
}
template <int W, int R, int S, int MinBlocks = 1>
void launch_ternary_stream_wrs(const TernaryStreamParams& p, int blocks, int smem, cudaStream_t st) {
    static PerDevice configured;
    allow_smem(ternary_stream_kernel<W, R, S, MinBlocks>, size_t(smem), configured);
    launch_pdl(ternary_stream_kernel<W, R, S, MinBlocks>, dim3(unsigned(blocks)), dim3(W * 32), size_t(smem), st, p);
}
// The stream and lane-piece kernels' parameters over ws (n = 1; x already quantized to q8_K in
// xa, by the kernel before, which lets these start at once; resid: the residual add of one
// matrix, or nullptr), the stacked rows split into `blocks` stretches; returns the grid.
int ternary_params(TernaryStreamParams& p, const DeviceWeight* const* ws, float* const* ys, int count,
                   const QuantX<Q8KScale>& xa, float* resid, int blocks) {
    const DeviceWeight& w = *ws[0];
    p = TernaryStreamParams{};
    p.count = count;
    for (int i = 0; i < count; ++i) {
        p.w[i] = static_cast<const uint8_t*>(ws[i]->data);
        p.scale[i] = ws[i]->scales;
        p.y[i] = ys[i];
        p.first_row[i + 1] = p.first_row[i] + int(ws[i]->rows);
    }
    p.cols = int(w.cols);
    p.scale_group = w.type == GgmlType::TQ2_G128 ? kQG128 : kQK_K;
    p.xq = xa.qs;
    p.xs = xa.s;
    p.evict_first = weight_evict_first_on() ? 1 : 0;
    p.resid = resid;
    const int total = p.first_row[count];
    blocks = std::max(1, std::min(blocks, total));
    p.rows_per_block = (total + blocks - 1) / blocks;
    return (total + p.rows_per_block - 1) / p.rows_per_block;
}
// The lane-piece kernel (ternary_lanes_kernel) over ws where it takes them: rows of whole
// 256-blocks and at most 18432 weights (a thread per 32 of them). Not the default: on H100s it
// measured no faster than the stream kernel (docs/gpu.md; VXQ_GEMV_TQ2_LANES=1 or
// set_gemv_ternary_lanes(true): on; vxq_gpu_gemv --ternary times both).
bool g_ternary_lanes = [] {
    const char* e = std::getenv("VXQ_GEMV_TQ2_LANES");
    return e && std::atoi(e) == 1;
}();
// Its pieces (32 weights) a lane: 1, or 2 (VXQ_GEMV_TQ2_LANES_PIECES=2 or set_gemv_ternary_lanes_pieces).
int g_ternary_lanes_pieces = [] {
    const char* e = std::getenv("VXQ_GEMV_TQ2_LANES_PIECES");
    return e && std::atoi(e) == 2 ? 2 : 1;
}();
bool ternary_lanes_fits(const DeviceWeight& w) {
    return g_ternary_lanes && g_ternary_stream && is_ternary(w.type) && w.cols % kQK_K == 0 && w.cols <= 32 * kTlMaxThreads &&
           w.rows <= INT_MAX / 2;
}
// Blocks of ternary_lanes_kernel<kTlAhead, P> an SM holds at `threads` a block (the device's,
// found once).
template <int P>
int ternary_lanes_blocks_per_sm(int threads) {
    static std::atomic<int> known[kTlMaxThreads / 32 + 1];
    std::atomic<int>& k = known[threads / 32];
    if (const int v = k.load(std::memory_order_relaxed)) return v;
    int n = 0;
    VXQ_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, ternary_lanes_kernel<kTlAhead, P>, threads, 0));
    k.store(std::max(1, n), std::memory_order_relaxed);
    return std::max(1, n);
}
int ternary_lanes_blocks_per_sm(int threads) {
    return g_ternary_lanes_pieces == 2 ? ternary_lanes_blocks_per_sm<2>(threads) : ternary_lanes_blocks_per_sm<1>(threads);
}
// The blocks an SM its grid takes: all it holds, or half of them in the half-SM form (at least 1).
int ternary_lanes_grid_per_sm(int threads) {
    const int per_sm = ternary_lanes_blocks_per_sm(threads);
    return g_ternary_half ? std::max(1, per_sm / 2) : per_sm;
}
void launch_ternary_lanes(const DeviceWeight* const* ws, float* const* ys, int count, const QuantX<Q8KScale>& xa,
                          float* resid, cudaStream_t st) {
    const int threads = ternary_lanes_threads(int(ws[0]->cols), g_ternary_lanes_pieces);
    TernaryStreamParams p;
    const int grid = ternary_params(p, ws, ys, count, xa, resid, sm_count() * ternary_lanes_grid_per_sm(threads));
    if (g_ternary_lanes_pieces == 2) {
        launch_pdl(ternary_lanes_kernel<kTlAhead, 2>, dim3(unsigned(grid)), dim3(unsigned(threads)), 0, st, p);
    } else {
        launch_pdl(ternary_lanes_kernel<kTlAhead, 1>, dim3(unsigned(grid)), dim3(unsigned(threads)), 0, st, p);
    }
}
// The tensor-core TQ2_0 GEMV (ternary_mma_kernels.cuh): at n = 1 in place of the stream kernel
// not by default (it measured no faster end to end, docs/gpu.md, fourth session of 2026-12-06;
// VXQ_GEMV_TQ2_MMA=1 or set_gemv_ternary_mma(true): on); its batch form, 8 tokens a pass, for
// n > 1 in place of the group kernel by default (2x faster at n = 4 there; VXQ_GEMV_TQ2_MMA_BATCH=0
// or set_gemv_ternary_mma_batch(false): the group kernel).
bool g_ternary_mma = [] {
    const char* e = std::getenv("VXQ_GEMV_TQ2_MMA");
    return e && std::atoi(e) == 1;
}();
bool g_ternary_mma_batch = [] {
    const char* e = std::getenv("VXQ_GEMV_TQ2_MMA_BATCH");
    return !(e && std::atoi(e) == 0);
}();
constexpr int kTmWarps = 16;  // its block
// (tile, block) pairs in flight a warp: 4 (128 registers, no spills) or 2 (VXQ_GEMV_TQ2_MMA_DEPTH=2 or
// set_gemv_ternary_mma_depth(2): for A/B).
int g_ternary_mma_depth = [] {
    const char* e = std::getenv("VXQ_GEMV_TQ2_MMA_DEPTH");
    return e && std::atoi(e) == 2 ? 2 : 4;
}();
int64_t stacked_rows(const DeviceWeight* const* ws, int count) {
    int64_t total = 0;
    for (int i = 0; i < count; ++i) total += ws[i]->rows;
    return total;
}
// Its shared memory for n tokens (n > 8: a pass of 8) over a block per SM, or 0 where it does not
// take the matrix: switched off for n (g_ternary_mma at n = 1, g_ternary_mma_batch above), a type
// other than TQ2_0, rows the stream kernel's plan refuses (an odd number of 256-blocks), or more
// than the device's shared memory.
int ternary_mma_smem(const DeviceWeight& w, int64_t total_rows, int64_t n) {
    if (!(n == 1 ? g_ternary_mma : g_ternary_mma_batch) || w.type != GgmlType::TQ2_0 || n < 1 || ternary_lanes_fits(w) ||
        w.cols > (int64_t(1) << 20) || total_rows > INT_MAX / 2 || !ternary_stream_plan(w).R) {
        return 0;
    }
    const int64_t per_block = (total_rows + sm_count() - 1) / sm_count();
    if (per_block > (1 << 16)) return 0;  // (its per-tile sums alone past any shared memory; and int sizes below)
    const int tokens = int(std::min<int64_t>(n, kTmMaxTokens));
    const int bytes = tm_smem_bytes(int(w.cols), kTmWarps, int(per_block), n > 1 ? kTmMaxTokens : 1, tokens);
    return bytes <= smem_optin() ? bytes : 0;
}
template <int D, int NB>
void launch_ternary_mma_d(const TernaryStreamParams& p, int grid, int smem, cudaStream_t st) {
    static PerDevice configured;
    allow_smem(ternary_mma_kernel<kTmWarps, D, NB>, size_t(smem), configured);
    launch_pdl(ternary_mma_kernel<kTmWarps, D, NB>, dim3(unsigned(grid)), dim3(kTmWarps * 32), size_t(smem), st, p);
}
// The tensor-core kernel over p (p.n tokens) at the chosen depth.
void launch_ternary_mma(const TernaryStreamParams& p, int grid, int smem, cudaStream_t st) {
    if (p.n > 1) return g_ternary_mma_depth == 2 ? launch_ternary_mma_d<2, kTmMaxTokens>(p, grid, smem, st)
                                                 : launch_ternary_mma_d<4, kTmMaxTokens>(p, grid, smem, st);
    return g_ternary_mma_depth == 2 ? launch_ternary_mma_d<2, 1>(p, grid, smem, st) : launch_ternary_mma_d<4, 1>(p, grid, smem, st);
}

// The stream kernel over ws (n = 1), a block per SM over the stacked rows (the tensor-core or
// lane-piece kernel instead where they take them). xf: x in f32, which each block quantizes itself
// (xa unused), or nullptr (x in xa, quantized by the kernel before).
// With xf, f: its RMSNorm prologue (norm_in is then xf; the normalized x written to x too).
void launch_ternary_stream(const TernaryStreamPlan& plan, const DeviceWeight* const* ws, float* const* ys, int count,
                           const QuantX<Q8KScale>& xa, float* resid, cudaStream_t st, const float* xf = nullptr,
                           const GemvFusion* f = nullptr, float* x = nullptr) {
    if (ternary_lanes_fits(*ws[0])) return launch_ternary_lanes(ws, ys, count, xa, resid, st);
    TernaryStreamParams p;
    const int grid = ternary_params(p, ws, ys, count, xa, resid, sm_count());
    if (xf && f && f->norm_weight) p.norm_w = f->norm_weight, p.norm_eps = f->norm_eps, p.x_out = x;
    if (xf) p.xq = nullptr, p.xs = nullptr, p.xf = xf;
    if (const int smem = ternary_mma_smem(*ws[0], stacked_rows(ws, count), 1)) return launch_ternary_mma(p, grid, smem, st);
    if (plan.half) {
        switch (plan.W * 256 + plan.R * 16 + plan.S) {
            case 16 * 256 + 2 * 16 + 2: return launch_ternary_stream_wrs<16, 2, 2, 2>(p, grid, plan.smem, st);
            case 16 * 256 + 1 * 16 + 2: return launch_ternary_stream_wrs<16, 1, 2, 2>(p, grid, plan.smem, st);
            case 16 * 256 + 1 * 16 + 1: return launch_ternary_stream_wrs<16, 1, 1, 2>(p, grid, plan.smem, st);
            case 8 * 256 + 2 * 16 + 4: return launch_ternary_stream_wrs<8, 2, 4, 2>(p, grid, plan.smem, st);
            case 8 * 256 + 1 * 16 + 4: return launch_ternary_stream_wrs<8, 1, 4, 2>(p, grid, plan.smem, st);
            case 8 * 256 + 2 * 16 + 2: return launch_ternary_stream_wrs<8, 2, 2, 2>(p, grid, plan.smem, st);
            default: return launch_ternary_stream_wrs<8, 1, 2, 2>(p, grid, plan.smem, st);
        }
    }
    switch (plan.W * 256 + plan.R * 16 + plan.S) {
        case 16 * 256 + 2 * 16 + 8: return launch_ternary_stream_wrs<16, 2, 8>(p, grid, plan.smem, st);
        case 16 * 256 + 2 * 16 + 4: return launch_ternary_stream_wrs<16, 2, 4>(p, grid, plan.smem, st);
        case 16 * 256 + 1 * 16 + 8: return launch_ternary_stream_wrs<16, 1, 8>(p, grid, plan.smem, st);
        case 16 * 256 + 1 * 16 + 4: return launch_ternary_stream_wrs<16, 1, 4>(p, grid, plan.smem, st);
        case 16 * 256 + 2 * 16 + 2: return launch_ternary_stream_wrs<16, 2, 2>(p, grid, plan.smem, st);
        case 16 * 256 + 1 * 16 + 2: return launch_ternary_stream_wrs<16, 1, 2>(p, grid, plan.smem, st);
        case 32 * 256 + 2 * 16 + 4: return launch_ternary_stream_wrs<32, 2, 4>(p, grid, plan.smem, st);
        case 32 * 256 + 1 * 16 + 4: return launch_ternary_stream_wrs<32, 1, 4>(p, grid, plan.smem, st);
        case 32 * 256 + 2 * 16 + 2: return launch_ternary_stream_wrs<32, 2, 2>(p, grid, plan.smem, st);
        case 32 * 256 + 1 * 16 + 2: return launch_ternary_stream_wrs<32, 1, 2>(p, grid, plan.smem, st);
        case 32 * 256 + 2 * 16 + 1: return launch_ternary_stream_wrs<32, 2, 1>(p, grid, plan.smem, st);
        default: return launch_ternary_stream_wrs<32, 1, 1>(p, grid, plan.smem, st);
    }
}

// Whether the stream kernel quantizes x itself where x comes in f32 (gemv_ternary_stream): by
// default (VXQ_GEMV_TS_QUANT=0 or set_gemv_ternary_quantize_in_kernel(false): the quantize kernel
// before it, for A/B).
bool g_ternary_quantize_in_kernel = [] {
    const char* e = std::getenv("VXQ_GEMV_TS_QUANT");
    return !(e && std::atoi(e) == 0);
}();
bool ternary_quantizes_x(const DeviceWeight& w) { return g_ternary_quantize_in_kernel && !ternary_lanes_fits(w); }
// Benchmarks only (set_gemv_ternary_x_given): with the quantize kernel chosen, it is not launched
// and the kernel reads x's q8_K as the scratch holds it, as if the kernel before had written it.
bool g_ternary_x_given = false;

// ws[0..count) share x (n = 1): the stream kernel, which quantizes x to q8_K itself (every block
// into its shared memory: one kernel and one boundary fewer a call), or after the quantize kernel.
void gemv_ternary_stream(const TernaryStreamPlan& plan, const DeviceWeight* const* ws, float* const* ys, int count,
                         const float* x, GemvScratch& s, cudaStream_t st) {
    const DeviceWeight& w = *ws[0];
    const QuantX<Q8KScale> xa = quant_x_in<Q8KScale>(s, 1, w.cols, kQK_K);
    if (ternary_quantizes_x(w)) return launch_ternary_stream(plan, ws, ys, count, xa, nullptr, st, x);
    const int64_t nb = w.cols / kQK_K;
    if (!g_ternary_x_given) launch_pdl(quantize_q8_K_kernel, dim3(unsigned((nb * 32 + 255) / 256)), dim3(256), 0, st, x, xa.qs, xa.s, nb);
    launch_ternary_stream(plan, ws, ys, count, xa, nullptr, st);
}

// The group kernel of a q8_K type over ws, x quantized (xa; its scales in xk_scale).
void launch_q8k_group(const DeviceWeight* const* ws, float* const* ys, int count, const QuantX<Q8KScale>& xa, int64_t n,
                      float* resid, cudaStream_t st) {
    const DeviceWeight& w = *ws[0];
    GemvParams ps[kGemvGroupMax];
    for (int i = 0; i < count; ++i) {
        ps[i] = gemv_params(*ws[i], xa.qs, nullptr, n, ys[i]);
        ps[i].xk_scale = xa.s;
        ps[i].resid = resid;
    }
    if (w.type == GgmlType::Q6_K) return launch_gemv_group<Q6KFormat>(ps, count, st);
    const bool g128 = w.type == GgmlType::TQ2_G128;
    if (tq2_rows() == 2) return g128 ? launch_gemv_group<TQ2G128FormatR<2>>(ps, count, st) : launch_gemv_group<TQ2FormatR<2>>(ps, count, st);
    if (g128) return launch_gemv_group<TQ2G128FormatR<4>>(ps, count, st);
    launch_gemv_group<TQ2FormatR<4>>(ps, count, st);
}

// gemv_quant_fused for the q8_K types: the norm / SwiGLU prologue in the q8_K quantize kernel,
// the residual add in the GEMV's store (the stream kernel where its plan fits, else the group kernel).
void gemv_q8k_fused(const DeviceWeight* const* ws, float* const* ys, int count, float* x, const GemvFusion& f,
                    GemvScratch& s, cudaStream_t st) {
    const DeviceWeight& w = *ws[0];
    const QuantX<Q8KScale> xa = quant_x_in<Q8KScale>(s, 1, w.cols, kQK_K);
    const int64_t nb = w.cols / kQK_K;
    const float* in = f.norm_weight ? f.norm_in : x;
    // The stream kernel's own quantize takes the RMSNorm and the residual add, not the SwiGLU: x =
    // silu(x) * up is written back over the x that every block reads.
    if (const TernaryStreamPlan plan = ternary_stream_plan(w); plan.R && !f.swiglu_up && ternary_quantizes_x(w)) {
        return launch_ternary_stream(plan, ws, ys, count, xa, f.resid, st, in, &f, x);
    }
    const unsigned blocks = unsigned((nb + kQuantFusedThreads / 32 - 1) / (kQuantFusedThreads / 32));
    launch_pdl(quantize_q8_K_fused_kernel, dim3(blocks), dim3(kQuantFusedThreads), 0, st, in, f.norm_weight, f.norm_eps,
               f.swiglu_up, x, w.cols, xa.qs, xa.s);
    if (const TernaryStreamPlan plan = ternary_stream_plan(w); plan.R) return launch_ternary_stream(plan, ws, ys, count, xa, f.resid, st);
    launch_q8k_group(ws, ys, count, xa, 1, f.resid, st);
}

// ws[0..count) share x (TQ2_0, TQ2_G128 or Q6_K): x quantized to q8_K once, then the group kernel
// (one launch) or, TQ2_0 at n > 1, the tensor-core kernel's batch form (a launch per 8 tokens).
// No GEMM path: every batch takes these kernels, 8 tokens per pass over the weights.
void gemv_q8k_group(const DeviceWeight* const* ws, float* const* ys, int count, const float* x, int64_t n,
                    GemvScratch& s, cudaStream_t st) {
    const DeviceWeight& w = *ws[0];
    if (n == 1) {
        if (const TernaryStreamPlan plan = ternary_stream_plan(w); plan.R) return gemv_ternary_stream(plan, ws, ys, count, x, s, st);
    }
    const QuantX<Q8KScale> xa = quantize_x(quantize_q8_K_kernel, x, n, w.cols, kQK_K, s, st);
    if (const int smem = n > 1 ? ternary_mma_smem(w, stacked_rows(ws, count), n) : 0) {
        // The tensor-core kernel's batch form: up to 8 tokens a pass over the weights.
        TernaryStreamParams p;
        const int grid = ternary_params(p, ws, ys, count, xa, nullptr, sm_count());
        for (int64_t t0 = 0; t0 < n; t0 += kTmMaxTokens) {
            TernaryStreamParams q = p;
            q.n = int(std::min<int64_t>(kTmMaxTokens, n - t0));
            q.xq = xa.qs + t0 * w.cols;
            q.xs = xa.s + t0 * (w.cols / kQK_K);
            for (int i = 0; i < count; ++i) q.y[i] = ys[i] + t0 * ws[i]->rows;
            launch_ternary_mma(q, grid, smem, st);
        }
        return;
    }
    launch_q8k_group(ws, ys, count, xa, n, nullptr, st);
}

void gemv_quant(const DeviceWeight& w, const float* x, int64_t n, float* y, GemvScratch& s, cudaStream_t st) {
    const DeviceWeight* ws[] = {&w};
    gemv_quant_group(ws, &y, 1, x, n, s, st);
}

// ---- GEMM (cuBLAS) -----------------------------------------------------------------------------

constexpr int kDequantThreads = 256;
constexpr int kDequantGroupsPerThread = 4;  // 8-element groups per thread, all loaded before the first store

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);  // .x (low half, lower address) = lo
    return *reinterpret_cast<const uint32_t*>(&h);
}

// Rows of a Q8_0/Q4_0 weight as fp16: out = fp16(d * q), [n_rows, cols] row-major. The product
// d * q is exact in f32 (an 11-bit significand times |q| <= 128); __float2half_rn rounds it once,
// to nearest even, as core/fp16.h's fp32_to_fp16. Thread = 8 consecutive elements (a quarter
// block): an 8-byte quant load (Q8_0: its 8 quants; Q4_0: the low or high nibbles of 8 bytes)
// and one 16-byte store, so a warp stores 512 contiguous bytes. wq, wd: the chunk's first row.
template <bool kQ4>
__global__ void __launch_bounds__(kDequantThreads)
dequant_f16_kernel(const uint8_t* __restrict__ wq, const __half* __restrict__ wd, int64_t n_groups,
                   __half* __restrict__ out) {
    constexpr int G = kDequantGroupsPerThread;
    const int64_t g0 = int64_t(blockIdx.x) * kDequantThreads * G + threadIdx.x;
    uint2 q[G];
    float d[G];
#pragma unroll
    for (int j = 0; j < G; ++j) {
        const int64_t gj = g0 + int64_t(j) * kDequantThreads;
        const int64_t g = gj < n_groups ? gj : n_groups - 1;
        const int64_t block = g >> 2;
        const int quarter = int(g & 3);
        q[j] = kQ4 ? __ldg(reinterpret_cast<const uint2*>(wq + block * 16 + 8 * (quarter & 1)))
                   : __ldg(reinterpret_cast<const uint2*>(wq) + g);
        d[j] = __half2float(__ldg(wd + block));
    }
#pragma unroll
    for (int j = 0; j < G; ++j) {
        const int64_t g = g0 + int64_t(j) * kDequantThreads;
        if (g >= n_groups) break;
        const uint32_t words[2] = {q[j].x, q[j].y};
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const uint32_t byte = (words[e / 4] >> (8 * (e % 4))) & 0xffu;
            if constexpr (kQ4) {
                // quarters 0, 1: elements 0-15 = low nibbles; quarters 2, 3: 16-31 = high nibbles
                const int nib = int((g & 3) < 2 ? (byte & 0x0fu) : (byte >> 4));
                v[e] = float(nib - 8) * d[j];
            } else {
                v[e] = float(int(int8_t(byte))) * d[j];
            }
        }
        const uint4 packed = make_uint4(pack_half2(v[0], v[1]), pack_half2(v[2], v[3]), pack_half2(v[4], v[5]),
                                        pack_half2(v[6], v[7]));
        reinterpret_cast<uint4*>(out)[g] = packed;
    }
}

// Rows of a Q8_0/Q4_0 weight dequantized per GEMM: whole matrices up to kDequantChunkBytes of
// fp16 (every Llama-3-8B layer matrix), else chunks of a multiple of 256 rows (the output head:
// 32768-row chunks, each still a GEMM of > 1000 tiles at n = 512).
int64_t dequant_chunk_rows(const DeviceWeight& w) {
    int64_t per = std::max<int64_t>(1, int64_t(kDequantChunkBytes / (size_t(w.cols) * sizeof(__half))));
    if (per >= w.rows) return w.rows;
    if (per >= 256) per -= per % 256;
    return per;
}

// Scratch of the GEMM: [n, cols] activations in the weight's 16-bit type (none for F32), the
// cuBLAS workspace, [chunk rows, cols] fp16 dequantized weights (Q8_0/Q4_0); 256-byte aligned.
struct GemmLayout {
    size_t workspace = 0, weights = 0, total = 0;
    int64_t chunk_rows = 0;
};

GemmLayout gemm_layout(const DeviceWeight& w, int64_t n) {
    GemmLayout l;
    const size_t x_bytes = w.type == GgmlType::F32 ? 0 : size_t(n * w.cols) * sizeof(__half);
    l.workspace = align256(x_bytes);
    l.weights = l.workspace + kCublasWorkspaceBytes;
    l.total = l.weights;
    if (is_quant(w.type)) {
        l.chunk_rows = dequant_chunk_rows(w);
        l.total += size_t(l.chunk_rows * w.cols) * sizeof(__half);
    }
    return l;
}

void gemm(const DeviceWeight& w, const float* x, int64_t n, float* y, GemvScratch& s, cudaStream_t st) {
    if (w.rows > INT_MAX || w.cols > INT_MAX || n > INT_MAX) {
        throw_cuda_error(cudaErrorInvalidValue, "gemm: a dimension above INT_MAX (cuBLAS's int sizes)", __FILE__, __LINE__);
    }
    const GemmLayout l = gemm_layout(w, n);
    uint8_t* base = static_cast<uint8_t*>(s.reserve(l.total));
    // cublasSetStream resets the workspace to cuBLAS's own pool (which allocates): set ours after.
    VXQ_CUBLAS_CHECK(cublas_api().set_stream(s.cublas, st));
    VXQ_CUBLAS_CHECK(cublas_api().set_workspace(s.cublas, base + l.workspace, kCublasWorkspaceBytes));
    const float alpha = 1.0f, beta = 0.0f;
    const int m = int(w.rows), k = int(w.cols), nt = int(n);
    // Column-major view: W [rows, cols] row-major is A^T with A = k x m (lda = cols); x [n, cols]
    // is B = k x n (ldb = cols); y [n, rows] is C = m x n (ldc = rows). C = A^T B.
    auto gemm_ex = [&](int rows, const void* a, cudaDataType_t ab_type, const void* b, float* c,
                       cublasComputeType_t compute) {
        VXQ_CUBLAS_CHECK(cublas_api().gemm_ex(s.cublas, CUBLAS_OP_T, CUBLAS_OP_N, rows, nt, k, &alpha, a, ab_type, k, b, ab_type,
                                      k, &beta, c, CUDA_R_32F, m, compute, CUBLAS_GEMM_DEFAULT));
    };
    switch (w.type) {
        case GgmlType::F32:
            gemm_ex(m, w.data, CUDA_R_32F, x, y, CUBLAS_COMPUTE_32F_PEDANTIC);
            return;
        case GgmlType::BF16: {
            auto* xb = reinterpret_cast<uint16_t*>(base);
            convert_kernel<BF16Elem><<<grid_for(n * w.cols, 256), 256, 0, st>>>(x, xb, n * w.cols);
            VXQ_CUDA_CHECK_LAUNCH();
            gemm_ex(m, w.data, CUDA_R_16BF, xb, y, CUBLAS_COMPUTE_32F);
            return;
        }
        case GgmlType::F16:
        case GgmlType::Q8_0:
        case GgmlType::Q4_0: {
            auto* xh = reinterpret_cast<__half*>(base);
            convert_kernel<F16Elem><<<grid_for(n * w.cols, 256), 256, 0, st>>>(x, xh, n * w.cols);
            VXQ_CUDA_CHECK_LAUNCH();
            if (w.type == GgmlType::F16) {
                gemm_ex(m, w.data, CUDA_R_16F, xh, y, CUBLAS_COMPUTE_32F);
                return;
            }
            auto* wh = reinterpret_cast<__half*>(base + l.weights);
            const bool q4 = w.type == GgmlType::Q4_0;
            const size_t quant_row_bytes = size_t(q4 ? w.cols / 2 : w.cols);
            const int64_t nb = w.cols / kQBlock;
            for (int64_t r0 = 0; r0 < w.rows; r0 += l.chunk_rows) {
                const int64_t rows = std::min(l.chunk_rows, w.rows - r0);
                const uint8_t* wq = static_cast<const uint8_t*>(w.data) + size_t(r0) * quant_row_bytes;
                const __half* wd = w.scales + r0 * nb;
                const int64_t groups = rows * w.cols / 8;
                const unsigned blocks = unsigned((groups + kDequantThreads * kDequantGroupsPerThread - 1) /
                                                 (kDequantThreads * kDequantGroupsPerThread));
                if (q4) {
                    dequant_f16_kernel<true><<<blocks, kDequantThreads, 0, st>>>(wq, wd, groups, wh);
                } else {
                    dequant_f16_kernel<false><<<blocks, kDequantThreads, 0, st>>>(wq, wd, groups, wh);
                }
                VXQ_CUDA_CHECK_LAUNCH();
                gemm_ex(int(rows), wh, CUDA_R_16F, xh, y + r0, CUBLAS_COMPUTE_32F);
            }
            return;
        }
        default:
            throw_cuda_error(cudaErrorInvalidValue, "gemm: a weight type without a CUDA kernel", __FILE__, __LINE__);
    }
}

// ---- embedding rows ----------------------------------------------------------------------------

__device__ float weight_at(const DeviceWeight& w, int64_t r, int64_t c) {
    switch (w.type) {
        case GgmlType::F32: return static_cast<const float*>(w.data)[r * w.cols + c];
        case GgmlType::F16: return __half2float(static_cast<const __half*>(w.data)[r * w.cols + c]);
        case GgmlType::BF16: return bf16_bits_to_float(static_cast<const uint16_t*>(w.data)[r * w.cols + c]);
        case GgmlType::Q8_0: {
            const float d = __half2float(w.scales[r * (w.cols / kQBlock) + c / kQBlock]);
            return d * float(static_cast<const int8_t*>(w.data)[r * w.cols + c]);
        }
        case GgmlType::Q4_0: {
            const float d = __half2float(w.scales[r * (w.cols / kQBlock) + c / kQBlock]);
            const int64_t b = c / kQBlock, j = c % kQBlock;
            const uint8_t byte = static_cast<const uint8_t*>(w.data)[r * (w.cols / 2) + b * 16 + (j % 16)];
            const int q = (j < 16 ? (byte & 0x0F) : (byte >> 4)) - 8;
            return d * float(q);
        }
        case GgmlType::TQ2_0: {  // value e of a block: byte 32 (e / 128) + e % 32, bits 2 ((e % 128) / 32)
            const int64_t b = c / kQK_K, e = c % kQK_K;
            const float d = __half2float(w.scales[r * (w.cols / kQK_K) + b]);
            const uint8_t byte = static_cast<const uint8_t*>(w.data)[r * (w.cols / 4) + b * 64 + 32 * (e / 128) + e % 32];
            return d * float(int((byte >> (2 * ((e % 128) / 32))) & 3) - 1);
        }
        case GgmlType::Q6_K: {  // (d * scale) * q, as the CPU's dequantize_row_kquant
            const float d = __half2float(w.scales[r * (w.cols / kQK_K) + c / kQK_K]);
            const auto* v = static_cast<const int8_t*>(w.data);
            return __fmul_rn(__fmul_rn(d, float(v[w.rows * w.cols + r * (w.cols / 16) + c / 16])), float(v[r * w.cols + c]));
        }
        case GgmlType::TQ2_G128: {  // value e of a 128-block: byte e % 32, bits 2 (e / 32)
            const int64_t b = c / kQG128, e = c % kQG128;
            const float d = __half2float(w.scales[r * (w.cols / kQG128) + b]);
            const uint8_t byte = static_cast<const uint8_t*>(w.data)[r * (w.cols / 4) + b * 32 + e % 32];
            return d * float(int((byte >> (2 * (e / 32))) & 3) - 1);
        }
        default: return __int_as_float(0x7fc00000);  // upload_weight admits no other type
    }
}

__global__ void embed_kernel(DeviceWeight table, const int32_t* __restrict__ ids, float* __restrict__ out) {
    const int64_t i = blockIdx.x;
    const int64_t r = ids[i];
    for (int64_t c = threadIdx.x; c < table.cols; c += blockDim.x) out[i * table.cols + c] = weight_at(table, r, c);
}

}  // namespace

GemvScratch::~GemvScratch() {
    // Destructor path: nothing useful to do with an error here. The handle is detached from the
    // last call's stream first, which its owner may already have destroyed.
    if (cublas) {
        cublas_api().set_stream(cublas, nullptr);
        cublas_api().destroy(cublas);
    }
    cudaFree(buf);
}

void set_gemv1_x_in_registers(bool on) { g_gemv1_x_regs = on; }

void set_gemv_ternary_stream(bool on) { g_ternary_stream = on; }
void set_gemv_ternary_quantize_in_kernel(bool on) { g_ternary_quantize_in_kernel = on; }
void set_gemv_ternary_lanes(bool on) { g_ternary_lanes = on; }
void set_gemv_ternary_lanes_pieces(int pieces) { g_ternary_lanes_pieces = pieces == 2 ? 2 : 1; }
void set_gemv_ternary_stream_warps(int warps) { g_ternary_stream_warps = warps == 32 || warps == 8 ? warps : 16; }
void set_gemv_ternary_half(bool on) { g_ternary_half = on; }
void set_gemv_ternary_mma(bool on) { g_ternary_mma = on; }
void set_gemv_ternary_mma_batch(bool on) { g_ternary_mma_batch = on; }
void set_gemv_ternary_mma_depth(int depth) { g_ternary_mma_depth = depth == 2 ? 2 : 4; }
void set_gemv_ternary_x_given(bool on) { g_ternary_x_given = on; }

void set_weight_evict_first(bool on) {
    g_weight_evict_first = on;
    const int v = on ? 1 : 0;
    VXQ_CUDA_CHECK(cudaMemcpyToSymbol(c_weight_evict_first, &v, sizeof v));
}

void* GemvScratch::reserve(size_t n) {
    if (n > bytes) {
        VXQ_CUDA_CHECK(cudaFree(buf));
        buf = nullptr;
        bytes = 0;
        VXQ_CUDA_CHECK(cudaMalloc(&buf, n));
        bytes = n;
    }
    if (n >= kCublasWorkspaceBytes && !cublas) {
        VXQ_CUBLAS_CHECK(cublas_api().create(&cublas));
        VXQ_CUBLAS_CHECK(cublas_api().set_math_mode(cublas, CUBLAS_DEFAULT_MATH));  // TF32 off for f32 as well
    }
    return buf;
}

MatmulPath gemv_path(const DeviceWeight& w, int64_t n, MatmulPath path) {
    if (path != MatmulPath::Auto) return path;
    if (is_q8k(w.type)) return MatmulPath::Gemv;  // no GEMM path yet
    return n >= (is_quant(w.type) ? kGemmMinTokensQuant : kGemmMinTokensDense) ? MatmulPath::Gemm : MatmulPath::Gemv;
}

size_t gemv_scratch_bytes(const DeviceWeight& w, int64_t n, MatmulPath path) {
    if (n <= 0) return 0;
    if (gemv_path(w, n, path) == MatmulPath::Gemm) return gemm_layout(w, n).total;
    const DeviceWeight* ws[] = {&w};
    if (n == 1 && g1_takes(ws, 1)) return 0;  // x is converted in shared memory
    switch (w.type) {
        case GgmlType::F16:
        case GgmlType::BF16: return size_t(n * w.cols) * sizeof(__half);
        case GgmlType::Q8_0:
        case GgmlType::Q4_0: return gemv_quant_scratch_bytes(w, n);
        case GgmlType::TQ2_0:
        case GgmlType::TQ2_G128:
        case GgmlType::Q6_K: return gemv_q8k_scratch_bytes(w, n);
        default: return 0;  // F32: x is used in place
    }
}

std::string gemv_describe(const DeviceWeight& w, int64_t n, MatmulPath path) {
    char line[200];
    const char* type = w.type == GgmlType::F32    ? "f32"
                       : w.type == GgmlType::F16  ? "f16"
                       : w.type == GgmlType::BF16 ? "bf16"
                       : w.type == GgmlType::Q8_0 ? "q8_0"
                       : w.type == GgmlType::Q4_0 ? "q4_0"
                       : w.type == GgmlType::TQ2_0 ? "tq2_0"
                       : w.type == GgmlType::TQ2_G128 ? "tq2_g128"
                       : w.type == GgmlType::Q6_K ? "q6_K"
                                                  : "?";
    if (gemv_path(w, n, path) == MatmulPath::Gemm) {
        if (w.type == GgmlType::F32) {
            std::snprintf(line, sizeof line, "cublasGemmEx f32 x f32 (COMPUTE_32F_PEDANTIC)");
        } else if (is_quant(w.type)) {
            const int64_t chunk = dequant_chunk_rows(w);
            std::snprintf(line, sizeof line, "dequant %s->f16 (%lld chunk%s) + cublasGemmEx f16 x f16 -> f32", type,
                          (long long)((w.rows + chunk - 1) / chunk), chunk < w.rows ? "s" : "");
        } else {
            std::snprintf(line, sizeof line, "cublasGemmEx %s x %s -> f32 (COMPUTE_32F)", type, type);
        }
        return line;
    }
    if (n == 1) {
        if (ternary_stream_plan(w).R && ternary_lanes_fits(w)) {
            const int threads = ternary_lanes_threads(int(w.cols), g_ternary_lanes_pieces);
            std::snprintf(line, sizeof line, "ternary lanes %s x q8_K dp4a, %d piece(s) a lane, %d threads a block, %d blocks/SM%s, PDL %s",
                          type, g_ternary_lanes_pieces, threads, ternary_lanes_grid_per_sm(threads),
                          !g_ternary_half                              ? ""
                          : ternary_lanes_blocks_per_sm(threads) >= 2 ? " (half-SM)"
                                                                       : " (half-SM asked: 1 fits an SM)",
                          pdl_enabled() ? "on" : "off");
            return line;
        }
        if (const int smem = ternary_mma_smem(w, w.rows, 1)) {
            std::snprintf(line, sizeof line, "ternary mma %s x q8_K m16n8k32 u8.s8, %d warps, %d pairs in flight a warp, %d KB smem, x quantized %s, PDL %s",
                          type, kTmWarps, g_ternary_mma_depth, smem / 1024, ternary_quantizes_x(w) ? "in the kernel" : "before",
                          pdl_enabled() ? "on" : "off");
            return line;
        }
        if (const TernaryStreamPlan plan = ternary_stream_plan(w); plan.R) {
            std::snprintf(line, sizeof line, "ternary stream %s x q8_K dp4a, %d warps, %d rows/warp, ring of %d, %d KB smem%s, x quantized %s, PDL %s",
                          type, plan.W, plan.R, plan.S, plan.smem / 1024, plan.half ? " (half-SM: 2 blocks/SM fit)" : "",
                          ternary_quantizes_x(w) ? "in the kernel" : "before", pdl_enabled() ? "on" : "off");
            return line;
        }
        G1Params p;
        int grid = 0;
        if (g1_describe(w, p, grid)) {
            std::snprintf(line, sizeof line,
                          "gemv1 %s, x converted in shared memory, %d blocks x %d items of %d rows, PDL %s", type, grid,
                          (p.n_items + grid - 1) / grid, p.rows_per_item, pdl_enabled() ? "on" : "off");
            return line;
        }
    }
    if (const int smem = n > 1 ? ternary_mma_smem(w, w.rows, n) : 0) {
        std::snprintf(line, sizeof line, "ternary mma %s x q8_K m16n8k32 u8.s8, %lld tokens in %lld pass(es), %d warps, %d pairs in flight a warp, %d KB smem, PDL %s",
                      type, (long long)n, (long long)((n + kTmMaxTokens - 1) / kTmMaxTokens), kTmWarps, g_ternary_mma_depth, smem / 1024,
                      pdl_enabled() ? "on" : "off");
        return line;
    }
    int64_t units = 0, per_iter = 0;
    const int rows_per_warp = w.type == GgmlType::Q4_0 ? q4_rows() : is_ternary(w.type) ? tq2_rows() : kGemvRowsPerWarp;
    bool vector = true;
    switch (w.type) {
        case GgmlType::F32: units = DenseFormat<F32Elem>::units(w.cols); per_iter = kGemvLoadsPerRow;
                            vector = w.cols % DenseFormat<F32Elem>::kPer16 == 0; break;
        case GgmlType::F16:
        case GgmlType::BF16: units = DenseFormat<F16Elem>::units(w.cols); per_iter = kGemvLoadsPerRow;
                             vector = w.cols % DenseFormat<F16Elem>::kPer16 == 0; break;
        case GgmlType::Q8_0: units = Q8Format::units(w.cols); per_iter = Q8Format::kUnitsPerIter; break;
        case GgmlType::TQ2_0:
        case GgmlType::TQ2_G128: units = TQ2Format::units(w.cols); per_iter = TQ2Format::kUnitsPerIter; break;
        case GgmlType::Q6_K: units = Q6KFormat::units(w.cols); per_iter = Q6KFormat::kUnitsPerIter; break;
        default: units = Q4Format::units(w.cols); per_iter = Q4Format::kUnitsPerIter; break;
    }
    if (!vector) {
        std::snprintf(line, sizeof line, "gemv %s scalar (cols %% 16 bytes != 0)", type);
        return line;
    }
    std::snprintf(line, sizeof line, "gemv %s%s, %d tok/pass, %d rows/warp, split %d", type,
                  is_quant(w.type) ? " x q8_0 dp4a" : is_q8k(w.type) ? " x q8_K dp4a" : "", gemv_tokens_per_pass(n), rows_per_warp,
                  gemv_split(w.rows, units, int(per_iter), rows_per_warp));
    return line;
}

void gemv(const DeviceWeight& w, const float* x, int64_t n, float* y, GemvScratch& s, cudaStream_t st) {
    gemv(w, x, n, y, s, st, MatmulPath::Auto);
}

void gemv(const DeviceWeight& w, const float* x, int64_t n, float* y, GemvScratch& s, cudaStream_t st,
          MatmulPath path) {
    if (n <= 0 || w.rows == 0) return;
    if (gemv_path(w, n, path) == MatmulPath::Gemm) return gemm(w, x, n, y, s, st);
    const DeviceWeight* ws[] = {&w};
    if (n == 1 && g1_dispatch(ws, &y, 1, x, GemvFusion{}, &st)) return;
    switch (w.type) {
        case GgmlType::F32: return gemv_dense<F32Elem>(w, x, n, y, s, st);
        case GgmlType::F16: return gemv_dense<F16Elem>(w, x, n, y, s, st);
        case GgmlType::BF16: return gemv_dense<BF16Elem>(w, x, n, y, s, st);
        case GgmlType::Q8_0:
        case GgmlType::Q4_0: return gemv_quant(w, x, n, y, s, st);
        case GgmlType::TQ2_0:
        case GgmlType::TQ2_G128:
        case GgmlType::Q6_K: {
            const DeviceWeight* one[] = {&w};
            return gemv_q8k_group(one, &y, 1, x, n, s, st);
        }
        default:
            // upload_weight admits no other type
            throw_cuda_error(cudaErrorInvalidValue, "gemv: a weight type without a CUDA kernel", __FILE__, __LINE__);
    }
}

bool gemv_groupable(const DeviceWeight& a, const DeviceWeight& b, int64_t n) {
    if (a.type != b.type || a.cols != b.cols || n <= 0) return false;
    if (gemv_path(a, n) != MatmulPath::Gemv || gemv_path(b, n) != MatmulPath::Gemv) return false;
    switch (a.type) {  // the 16-byte kernels (the scalar fallback has no group form)
        case GgmlType::F32: return a.cols % DenseFormat<F32Elem>::kPer16 == 0;
        case GgmlType::F16:
        case GgmlType::BF16: return a.cols % DenseFormat<F16Elem>::kPer16 == 0;
        case GgmlType::Q8_0:
        case GgmlType::Q4_0:
        case GgmlType::TQ2_0:
        case GgmlType::TQ2_G128:
        case GgmlType::Q6_K: return true;
        default: return false;
    }
}

namespace {

template <class E>
void gemv_group_dense(const DeviceWeight* const* ws, float* const* ys, int count, const float* x, int64_t n,
                      GemvScratch& s, cudaStream_t st) {
    using Raw = typename E::Raw;
    const Raw* xt;
    if constexpr (std::is_same_v<Raw, float>) {
        xt = x;
    } else {
        Raw* conv = static_cast<Raw*>(s.reserve(size_t(n * ws[0]->cols) * sizeof(Raw)));
        convert_kernel<E><<<grid_for(n * ws[0]->cols, 256), 256, 0, st>>>(x, conv, n * ws[0]->cols);
        VXQ_CUDA_CHECK_LAUNCH();
        xt = conv;
    }
    if (reinterpret_cast<uintptr_t>(xt) % 16 != 0) {  // the 16-byte kernels need aligned x: one by one
        for (int i = 0; i < count; ++i) gemv_dense<E>(*ws[i], x, n, ys[i], s, st);
        return;
    }
    GemvParams ps[kGemvGroupMax];
    for (int i = 0; i < count; ++i) ps[i] = gemv_params(*ws[i], xt, nullptr, n, ys[i]);
    launch_gemv_group<DenseFormat<E>>(ps, count, st);
}

}  // namespace

void gemv_group(const DeviceWeight* const* ws, float* const* ys, int count, const float* x, int64_t n, GemvScratch& s,
                cudaStream_t st) {
    if (count < 1 || count > kGemvGroupMax) {
        throw_cuda_error(cudaErrorInvalidValue, "gemv_group: 1 to kGemvGroupMax matrices", __FILE__, __LINE__);
    }
    for (int i = 1; i < count; ++i) {
        if (!gemv_groupable(*ws[0], *ws[i], n)) {
            throw_cuda_error(cudaErrorInvalidValue, "gemv_group: matrices that gemv_groupable refuses", __FILE__, __LINE__);
        }
    }
    if (count == 1 || n <= 0) {
        for (int i = 0; i < count; ++i) gemv(*ws[i], x, n, ys[i], s, st);
        return;
    }
    if (n == 1 && g1_dispatch(ws, ys, count, x, GemvFusion{}, &st)) return;
    switch (ws[0]->type) {
        case GgmlType::F32: return gemv_group_dense<F32Elem>(ws, ys, count, x, n, s, st);
        case GgmlType::F16: return gemv_group_dense<F16Elem>(ws, ys, count, x, n, s, st);
        case GgmlType::BF16: return gemv_group_dense<BF16Elem>(ws, ys, count, x, n, s, st);
        case GgmlType::TQ2_0:
        case GgmlType::TQ2_G128:
        case GgmlType::Q6_K: return gemv_q8k_group(ws, ys, count, x, n, s, st);
        default: return gemv_quant_group(ws, ys, count, x, n, s, st);
    }
}

// The q8_K types' fused forms (gemv_q8k_fused), by default (VXQ_GEMV_Q8K_FUSED=0: the separate
// norm, SwiGLU and add kernels, for A/B).
const bool g_q8k_fused = [] {
    const char* e = std::getenv("VXQ_GEMV_Q8K_FUSED");
    return !(e && std::atoi(e) == 0);
}();

bool gemv_fusable(const DeviceWeight* const* ws, int count, const GemvFusion& fusion) {
    if (count < 1 || count > kGemvGroupMax) return false;
    for (int i = 0; i < count; ++i) {
        if (ws[i]->rows == 0 || gemv_path(*ws[i], 1) != MatmulPath::Gemv) return false;
        if (i > 0 && !gemv_groupable(*ws[0], *ws[i], 1)) return false;
    }
    if (fusion.norm_weight && !fusion.norm_in) return false;
    if (is_q8k(ws[0]->type)) {  // TQ2_0, TQ2_G128, Q6_K: the q8_K quantize kernel's prologue and the GEMV's store
        return g_q8k_fused && !fusion.swiglu && !fusion.l2_next && !(fusion.resid && count != 1) &&
               !(fusion.norm_weight && fusion.swiglu_up) && !fusion.x_q8.qs && ws[0]->cols % kQK_K == 0;
    }
    if (is_quant(ws[0]->type)) {  // the quantize kernel's prologue (or x already quantized) and the GEMV's store
        return !fusion.swiglu && !fusion.l2_next && !(fusion.resid && count != 1) && !(fusion.norm_weight && fusion.swiglu_up) &&
               !(fusion.x_q8.qs && (fusion.norm_weight || fusion.swiglu_up));
    }
    if (fusion.x_q8.qs) return false;
    return !fusion.swiglu_up && g1_dispatch(ws, nullptr, count, nullptr, fusion, nullptr);
}

void gemv_group(const DeviceWeight* const* ws, float* const* ys, int count, float* x, GemvScratch& s, cudaStream_t st,
                const GemvFusion& fusion) {
    if (!gemv_fusable(ws, count, fusion)) {
        throw_cuda_error(cudaErrorInvalidValue, "gemv_group: a fusion that gemv_fusable refuses", __FILE__, __LINE__);
    }
    if (is_q8k(ws[0]->type)) return gemv_q8k_fused(ws, ys, count, x, fusion, s, st);
    if (is_quant(ws[0]->type)) return gemv_quant_fused(ws, ys, count, x, fusion, s, st);
    g1_dispatch(ws, ys, count, x, fusion, &st);
}

void embed_rows(const DeviceWeight& table, const int32_t* ids, int64_t n, float* out, cudaStream_t st) {
    if (n == 0) return;
    embed_kernel<<<unsigned(n), 256, 0, st>>>(table, ids, out);
    VXQ_CUDA_CHECK_LAUNCH();
}

}  // namespace vxq::cuda

// Device arithmetic that more than one kernel needs with the same rounding, so that a fused
// kernel (the batch-1 GEMV's RMSNorm prologue and SwiGLU epilogue) gives the bits of the
// separate ones.
#pragma once

#include <cuda_runtime.h>

namespace vxq::cuda {

constexpr int kNormThreads = 256;  // the threads that sum in block_rms_scale (a caller's block: at least as many)

// Element i of a 4-vector (float4, uint4, ...).
template <class V4>
__host__ __device__ __forceinline__ auto at4(const V4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// for c = threadIdx.x + k N below n (k = 0, 1, ...): f(c, load(c)), the loads of K values
// issued before any f, in c's order, so that a thread has K loads in flight rather than what
// the compiler overlaps of a plain strided loop (the batch-1 GEMV stages 14336 activations per
// block for ffn down; with this and whole_row (gemv.cu) that GEMV went from 39-43 to 32-35 us
// per call inside the graph on the H200: docs/gpu.md, 2026-12-02, fifth session).
template <int N, int K = 16, class Load, class F>
__device__ __forceinline__ void strided_batches(int64_t n, Load load, F f) {
    for (int64_t c0 = threadIdx.x; c0 < n; c0 += int64_t(K) * N) {
        float v[K];
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const int64_t c = c0 + int64_t(k) * N;
            v[k] = c < n ? load(c) : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const int64_t c = c0 + int64_t(k) * N;
            if (c < n) f(c, v[k]);
        }
    }
}

// 1 / sqrt(mean(x^2) + eps) of x[0, dim), by the whole block (all of its threads calling: the
// first kNormThreads sum, any others only meet the barriers). The sum of squares is accumulated
// in double as ggml (ggml_float) and the CPU backend do; the order is a fixed tree (thread t sums
// x[t + 256 k] in k's order, then partial t takes partial t + s for s = 128, 64, ..., 1: the last
// five levels as shuffles within warp 0, the same additions), so every caller gets the same bits,
// and the CPU's value to rounding.
// `partial`: kNormThreads doubles of shared memory. Ends with the block synchronized (partial
// may be reused after it).
__device__ __forceinline__ float block_rms_scale(const float* x, int64_t dim, float eps, double* partial) {
    if (threadIdx.x < kNormThreads) {
        double sum = 0.0;
        strided_batches<kNormThreads>(dim, [&](int64_t c) { return x[c]; },
                                      [&](int64_t, float v) { sum += double(__fmul_rn(v, v)); });
        partial[threadIdx.x] = sum;
    }
    __syncthreads();
    for (int s = kNormThreads / 2; s > 32; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x < 32) {
        double v = partial[threadIdx.x] + partial[threadIdx.x + 32];
#pragma unroll
        for (int s = 16; s > 0; s >>= 1) v += __shfl_down_sync(0xffffffffu, v, s);
        if (threadIdx.x == 0) partial[0] = v;
    }
    __syncthreads();
    // ggml: the mean is rounded to float before eps is added (in float).
    const float mean = float(partial[0] / double(dim));
    __syncthreads();  // every thread has read partial[0]
    return 1.0f / sqrtf(mean + eps);
}

// The normalized element: x * scale * weight, rounded after each product as ggml.
__device__ __forceinline__ float rms_apply(float x, float scale, float weight) {
    return __fmul_rn(__fmul_rn(x, scale), weight);
}

// Sum and maximum over the 32 lanes of a warp (all lanes call; every lane gets the result), in a
// fixed butterfly order.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Maximum (is_max) or sum of v over a block of kWarps warps (all threads call; every thread gets
// it): the warp's butterfly, then the warps' results in order. `shared`: kWarps floats.
template <int kWarps>
__device__ __forceinline__ float block_reduce(float v, float* shared, bool is_max) {
    v = is_max ? warp_max(v) : warp_sum(v);
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    __syncthreads();  // `shared` may still be read from the previous reduction
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float r = shared[0];
    for (int w = 1; w < kWarps; ++w) r = is_max ? fmaxf(r, shared[w]) : r + shared[w];
    return r;
}

// silu(g) * u as ggml's swiglu.
__device__ __forceinline__ float silu_mul(float g, float u) { return __fmul_rn(__fdiv_rn(g, 1.0f + expf(-g)), u); }

}  // namespace vxq::cuda

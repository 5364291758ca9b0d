// Device arithmetic that more than one kernel needs with the same rounding, so that a fused
// kernel (the batch-1 GEMV's RMSNorm prologue and SwiGLU epilogue) gives the bits of the
// separate ones.
#pragma once

#include <cuda_runtime.h>

namespace vxq::cuda {

constexpr int kNormThreads = 256;  // the block size of every block_rms_scale caller

// 1 / sqrt(mean(x^2) + eps) of x[0, dim), by the whole block (kNormThreads threads, all of them
// calling). The sum of squares is accumulated in double as ggml (ggml_float) and the CPU
// backend do; the order is a fixed tree, so every caller gets the same bits, and the CPU's
// value to rounding. `partial`: kNormThreads doubles of shared memory. Ends with the block
// synchronized (partial may be reused after it).
__device__ __forceinline__ float block_rms_scale(const float* x, int64_t dim, float eps, double* partial) {
    double sum = 0.0;
    for (int64_t c = threadIdx.x; c < dim; c += kNormThreads) sum += double(__fmul_rn(x[c], x[c]));
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int s = kNormThreads / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
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

#include "kernels/cuda/ops.cuh"

#include <algorithm>
#include <cmath>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/rope.cuh"

namespace vxq::cuda {

namespace {

unsigned blocks_for(int64_t n, int threads) {
    return unsigned(std::clamp<int64_t>((n + threads - 1) / threads, 1, 65535));
}

// Every kernel here is launched with launch_pdl (launch.cuh): it waits for the previous kernel
// before touching memory, and lets the next one start launching at once.

// One block per row (block_rms_scale: the sum of squares in double, a fixed tree).
__global__ void __launch_bounds__(kNormThreads)
rms_norm_kernel(const float* x, const float* __restrict__ w, int64_t dim, float eps, float* y) {
    __shared__ double partial[kNormThreads];
    pdl_wait();
    pdl_launch_dependents();
    const float* xr = x + blockIdx.x * dim;
    float* yr = y + blockIdx.x * dim;
    const float scale = block_rms_scale(xr, dim, eps, partial);
    strided_batches<kNormThreads>(dim, [&](int64_t c) { return rms_apply(xr[c], scale, w[c]); },
                                  [&](int64_t c, float v) { yr[c] = v; });
}

// One thread per rotated pair (token, head, i), rope.cuh's arithmetic.
__global__ void rope_kernel(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int64_t* pos0_p,
                            int64_t n_rot, float theta_scale, bool neox) {
    pdl_wait();
    pdl_launch_dependents();
    const int64_t pos0 = *pos0_p;
    const int64_t half = n_rot / 2;
    const int64_t total = n_tokens * n_heads * half;
    for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total; idx += int64_t(gridDim.x) * blockDim.x) {
        const int64_t i = idx % half;
        const int64_t th = idx / half;  // token * n_heads + head
        rope_rotate_pair(x + th * head_dim, i, rope_angle(i, pos0 + th / n_heads, theta_scale), n_rot, neox);
    }
}

__global__ void swiglu_kernel(float* gate, const float* __restrict__ up, int64_t n) {
    pdl_wait();
    pdl_launch_dependents();
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        gate[i] = silu_mul(gate[i], up[i]);
    }
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
    pdl_wait();
    pdl_launch_dependents();
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        x[i] += y[i];
    }
}

__global__ void add_bias_kernel(float* x, const float* __restrict__ b, int64_t n, int64_t dim) {
    pdl_wait();
    pdl_launch_dependents();
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        x[i] += b[i % dim];
    }
}

}  // namespace

void rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps, float* y, cudaStream_t st) {
    if (n_rows == 0) return;
    launch_pdl(rms_norm_kernel, dim3(unsigned(n_rows)), dim3(kNormThreads), 0, st, x, weight, dim, eps, y);
}

void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int64_t* pos0, const RopeParams& p,
          cudaStream_t st) {
    const int64_t total = n_tokens * n_heads * (p.n_rot / 2);
    if (total == 0) return;
    const float theta_scale = std::pow(p.freq_base, -2.0f / float(p.n_rot));  // as the CPU computes it
    launch_pdl(rope_kernel, dim3(blocks_for(total, 256)), dim3(256), 0, st, x, n_tokens, n_heads, head_dim, pos0, int64_t(p.n_rot),
               theta_scale, p.neox);
}

void swiglu(float* gate, const float* up, int64_t n, cudaStream_t st) {
    if (n == 0) return;
    launch_pdl(swiglu_kernel, dim3(blocks_for(n, 256)), dim3(256), 0, st, gate, up, n);
}

void add(float* x, const float* y, int64_t n, cudaStream_t st) {
    if (n == 0) return;
    launch_pdl(add_kernel, dim3(blocks_for(n, 256)), dim3(256), 0, st, x, y, n);
}

void add_bias(float* x, const float* b, int64_t n_rows, int64_t dim, cudaStream_t st) {
    if (n_rows * dim == 0) return;
    launch_pdl(add_bias_kernel, dim3(blocks_for(n_rows * dim, 256)), dim3(256), 0, st, x, b, n_rows * dim, dim);
}

}  // namespace vxq::cuda

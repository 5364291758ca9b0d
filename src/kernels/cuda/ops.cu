#include "kernels/cuda/ops.cuh"

#include <algorithm>
#include <cmath>

#include "kernels/cuda/check.cuh"

namespace vxq::cuda {

namespace {

constexpr int kNormThreads = 256;

unsigned blocks_for(int64_t n, int threads) {
    return unsigned(std::clamp<int64_t>((n + threads - 1) / threads, 1, 65535));
}

// One block per row. The sum of squares is accumulated in double as ggml (ggml_float) and the
// CPU backend do; the order differs (a tree), so results agree to rounding, not bit for bit.
__global__ void __launch_bounds__(kNormThreads)
rms_norm_kernel(const float* x, const float* __restrict__ w, int64_t dim, float eps, float* y) {
    __shared__ double partial[kNormThreads];
    const float* xr = x + blockIdx.x * dim;
    float* yr = y + blockIdx.x * dim;
    double sum = 0.0;
    for (int64_t c = threadIdx.x; c < dim; c += kNormThreads) sum += double(__fmul_rn(xr[c], xr[c]));
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int s = kNormThreads / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    // ggml: the mean is rounded to float before eps is added (in float).
    const float mean = float(partial[0] / double(dim));
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int64_t c = threadIdx.x; c < dim; c += kNormThreads) yr[c] = __fmul_rn(__fmul_rn(xr[c], scale), w[c]);
}

// One thread per rotated pair (token, head, i). theta follows ggml_rope_cache_init's recurrence,
// theta_{i+1} = theta_i * theta_scale in float, so each pair's angle rounds as the CPU's does;
// cosf/sinf are CUDA's (within 2 ulp of the CPU's libm, not bit-equal).
__global__ void rope_kernel(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int64_t* pos0_p,
                            int64_t n_rot, float theta_scale, bool neox) {
    const int64_t pos0 = *pos0_p;
    const int64_t half = n_rot / 2;
    const int64_t total = n_tokens * n_heads * half;
    for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total; idx += int64_t(gridDim.x) * blockDim.x) {
        const int64_t i = idx % half;
        const int64_t th = idx / half;  // token * n_heads + head
        const int64_t t = th / n_heads;
        float theta = float(pos0 + t);
        for (int64_t k = 0; k < i; ++k) theta = __fmul_rn(theta, theta_scale);
        const float c = cosf(theta), s = sinf(theta);
        float* v = x + th * head_dim;
        const int64_t a = neox ? i : 2 * i;
        const int64_t b = neox ? i + half : 2 * i + 1;
        const float x0 = v[a], x1 = v[b];
        // ggml's compiled C fuses the first product of each (see kernels/cpu/ops.cpp).
        v[a] = fmaf(x0, c, -__fmul_rn(x1, s));
        v[b] = fmaf(x0, s, __fmul_rn(x1, c));
    }
}

__global__ void swiglu_kernel(float* gate, const float* __restrict__ up, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const float g = gate[i];
        gate[i] = __fmul_rn(__fdiv_rn(g, 1.0f + expf(-g)), up[i]);
    }
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        x[i] += y[i];
    }
}

__global__ void add_bias_kernel(float* x, const float* __restrict__ b, int64_t n, int64_t dim) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        x[i] += b[i % dim];
    }
}

}  // namespace

void rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps, float* y, cudaStream_t st) {
    if (n_rows == 0) return;
    rms_norm_kernel<<<unsigned(n_rows), kNormThreads, 0, st>>>(x, weight, dim, eps, y);
    VXQ_CUDA_CHECK_LAUNCH();
}

void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int64_t* pos0, const RopeParams& p,
          cudaStream_t st) {
    const int64_t total = n_tokens * n_heads * (p.n_rot / 2);
    if (total == 0) return;
    const float theta_scale = std::pow(p.freq_base, -2.0f / float(p.n_rot));  // as the CPU computes it
    rope_kernel<<<blocks_for(total, 256), 256, 0, st>>>(x, n_tokens, n_heads, head_dim, pos0, p.n_rot, theta_scale, p.neox);
    VXQ_CUDA_CHECK_LAUNCH();
}

void swiglu(float* gate, const float* up, int64_t n, cudaStream_t st) {
    if (n == 0) return;
    swiglu_kernel<<<blocks_for(n, 256), 256, 0, st>>>(gate, up, n);
    VXQ_CUDA_CHECK_LAUNCH();
}

void add(float* x, const float* y, int64_t n, cudaStream_t st) {
    if (n == 0) return;
    add_kernel<<<blocks_for(n, 256), 256, 0, st>>>(x, y, n);
    VXQ_CUDA_CHECK_LAUNCH();
}

void add_bias(float* x, const float* b, int64_t n_rows, int64_t dim, cudaStream_t st) {
    if (n_rows * dim == 0) return;
    add_bias_kernel<<<blocks_for(n_rows * dim, 256), 256, 0, st>>>(x, b, n_rows * dim, dim);
    VXQ_CUDA_CHECK_LAUNCH();
}

}  // namespace vxq::cuda

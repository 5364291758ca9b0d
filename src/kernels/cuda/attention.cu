#include "kernels/cuda/attention.cuh"

#include <algorithm>

#include "kernels/cuda/check.cuh"

namespace vxq::cuda {

namespace {

constexpr int kAttnWarps = 4;

__device__ __forceinline__ float block_reduce(float v, float* shared, bool is_max) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    __syncthreads();  // `shared` may still be read from the previous reduction
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float r = shared[0];
    for (int w = 1; w < kAttnWarps; ++w) r = is_max ? fmaxf(r, shared[w]) : r + shared[w];
    return r;
}

// Block (i, h): query token i, query head h, reading KV head h / (n_head / n_head_kv).
__global__ void __launch_bounds__(kAttnWarps * 32) attention_f16_kernel(F16AttentionParams p) {
    __shared__ float red[kAttnWarps];
    const int64_t i = blockIdx.x / p.n_head, h = blockIdx.x % p.n_head;
    const int64_t g = h / (p.n_head / p.n_head_kv);
    const KvHeadDev head = p.heads[g];
    const int64_t seen = *p.pos0 + i + 1;  // positions <= pos0 + i
    const int64_t n_vis = seen < 0 ? 0 : (seen < head.n_tokens ? seen : head.n_tokens);
    const float* q = p.q + (i * p.n_head + h) * p.head_dim;
    const __half* k = reinterpret_cast<const __half*>(head.k);
    const __half* v = reinterpret_cast<const __half*>(head.v);
    float* sc = p.scores + (i * p.n_head + h) * p.max_tokens;
    float* out = p.out + (i * p.n_head + h) * p.head_dim;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;

    for (int64_t t = warp; t < n_vis; t += kAttnWarps) {
        float dot = 0.0f;
        for (int64_t d = lane; d < p.head_dim; d += 32) {
            const float qd = p.round_f16 ? __half2float(__float2half_rn(q[d])) : q[d];
            dot += qd * __half2float(k[t * p.head_dim + d]);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if (lane == 0) sc[t] = dot * p.scale;
    }
    __syncthreads();
    float m = -INFINITY;
    for (int64_t t = threadIdx.x; t < n_vis; t += blockDim.x) m = fmaxf(m, sc[t]);
    m = block_reduce(m, red, true);
    float sum = 0.0f;
    for (int64_t t = threadIdx.x; t < n_vis; t += blockDim.x) {
        const float e = expf(sc[t] - m);
        sc[t] = e;
        sum += e;
    }
    sum = block_reduce(sum, red, false);  // its barriers also publish the exponentials in sc
    if (n_vis == 0) {
        for (int64_t d = threadIdx.x; d < p.head_dim; d += blockDim.x) out[d] = 0.0f;
        return;
    }
    // ggml_soft_max: p = e * float(1 / sum) with the reciprocal taken in double.
    const float inv = float(1.0 / double(sum));
    if (p.round_f16) {
        for (int64_t t = threadIdx.x; t < n_vis; t += blockDim.x) sc[t] = __half2float(__float2half_rn(sc[t] * inv));
        __syncthreads();
    }
    for (int64_t d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int64_t t = 0; t < n_vis; ++t) acc += sc[t] * __half2float(v[t * p.head_dim + d]);
        out[d] = p.round_f16 ? acc : acc * inv;
    }
}

// One thread per stored element: (token t, head g, channel d).
__global__ void store_f16_kernel(F16StoreParams p) {
    const int64_t total = p.n * p.n_head_kv * p.head_dim;
    for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total; idx += int64_t(gridDim.x) * blockDim.x) {
        const int64_t d = idx % p.head_dim;
        const int64_t tg = idx / p.head_dim;  // t * n_head_kv + g
        const int64_t g = tg % p.n_head_kv, t = tg / p.n_head_kv;
        const KvHeadDev h = p.heads[g];
        const int64_t slot = (h.n_tokens + t) * p.head_dim + d;
        reinterpret_cast<__half*>(h.k)[slot] = __float2half_rn(p.k[idx]);
        reinterpret_cast<__half*>(h.v)[slot] = __float2half_rn(p.v[idx]);
    }
}

}  // namespace

void store_f16(const F16StoreParams& p, cudaStream_t st) {
    const int64_t total = p.n * p.n_head_kv * p.head_dim;
    if (total == 0) return;
    const unsigned blocks = unsigned(std::min<int64_t>((total + 255) / 256, 65535));
    store_f16_kernel<<<blocks, 256, 0, st>>>(p);
    VXQ_CUDA_CHECK_LAUNCH();
}

void attention_f16(const F16AttentionParams& p, cudaStream_t st) {
    if (p.n_q * p.n_head == 0) return;
    attention_f16_kernel<<<unsigned(p.n_q * p.n_head), kAttnWarps * 32, 0, st>>>(p);
    VXQ_CUDA_CHECK_LAUNCH();
}

}  // namespace vxq::cuda

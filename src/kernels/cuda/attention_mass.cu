#include "kernels/cuda/attention_mass.cuh"

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/q8_act.cuh"

namespace vxq::cuda {

namespace {

constexpr int kMassWarps = 4;
constexpr int kMassThreads = kMassWarps * 32;

// Score of row r = i * n_head + h against token t of `keys`: the dot times the scale, each
// product rounded on its own (__fmul_rn: no contraction into the exp's subtraction, so both
// kernels get the same bits).
__device__ __forceinline__ float mass_score(const AttentionMassParams& p, const uint8_t* keys, int64_t r, int64_t t) {
    const int hd = int(p.head_dim);
    if (p.k_code == KvCode::F16) {
        const float* q = p.q + r * hd;
        const __half* k = reinterpret_cast<const __half*>(keys) + t * hd;
        float dot = 0.0f;
        for (int c = 0; c < hd; ++c) {
            const float qc = p.round_f16 ? __half2float(__float2half_rn(q[c])) : q[c];
            dot = __fmaf_rn(qc, __half2float(k[c]), dot);
        }
        return __fmul_rn(dot, p.scale);
    }
    // The CPU's q8_0-query dot (kv_read_baseline.cpp, qdot_scores): lane l of 8 holds the exact
    // integer dot of values 4l..4l+3 of each 32-block (|code| <= 128, |q| <= 127: no int16
    // saturation in the AVX2 pairs it follows), fma'd with fp16(d_k) * fp16(d_q).
    const int nb = hd / kQBlock;
    const int bb = p.k_code == KvCode::Q8_0 ? kKvQ8BlockBytes : kKvQ4BlockBytes;
    const uint8_t* tok = keys + t * kv_token_bytes(p.k_code, hd);
    const int8_t* qq = p.q8 + r * hd;
    const float* qd = p.q8_d + r * nb;
    float acc[8] = {};
    for (int b = 0; b < nb; ++b) {
        const uint8_t* blk = tok + b * bb;
        const float dd = __fmul_rn(kv_half_at(blk), qd[b]);
#pragma unroll
        for (int l = 0; l < 8; ++l) {
            int sum = 0;
#pragma unroll
            for (int j = 4 * l; j < 4 * l + 4; ++j) sum += kv_code_at(blk, j, p.k_code) * int(qq[b * kQBlock + j]);
            acc[l] = __fmaf_rn(dd, float(sum), acc[l]);
        }
    }
    // hsum_float_8: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
    const float v0 = __fadd_rn(acc[4], acc[0]), v1 = __fadd_rn(acc[5], acc[1]);
    const float v2 = __fadd_rn(acc[6], acc[2]), v3 = __fadd_rn(acc[7], acc[3]);
    return __fmul_rn(__fadd_rn(__fadd_rn(v0, v2), __fadd_rn(v1, v3)), p.scale);
}

// Block r = i * n_head + h: (q8_0 / q4_0 keys) q's row quantized as the CPU's reader does, then the row's
// max score and 1 / sum exp(s - max) (ggml's reciprocal in double, as the attention kernels).
__global__ void __launch_bounds__(kMassThreads) mass_stats_kernel(const AttentionMassParams p) {
    __shared__ float red[kMassWarps];
    const int64_t r = blockIdx.x, i = r / p.n_head, h = r % p.n_head;
    const int64_t g = h / (p.n_head / p.n_head_kv);
    const KvHeadDev head = p.heads[g];
    const int64_t n_vis = kv_visible(head, *p.pos0, i);
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    if (p.k_code != KvCode::F16) {
        const int nb = int(p.head_dim / kQBlock);
        for (int b = warp; b < nb; b += kMassWarps) {  // a warp per 32-block: whole warps call
            const Q8Lane v = quantize_q8_0_lane(p.q[r * p.head_dim + b * kQBlock + lane]);
            p.q8[r * p.head_dim + b * kQBlock + lane] = int8_t(v.q);
            if (lane == 0) p.q8_d[r * nb + b] = v.d;
        }
        __syncthreads();  // the block's global writes are visible to its threads after the barrier
    }
    const uint8_t* keys = reinterpret_cast<const uint8_t*>(head.k);
    float m = -INFINITY;
    for (int64_t t = threadIdx.x; t < n_vis; t += kMassThreads) m = fmaxf(m, mass_score(p, keys, r, t));
    m = block_reduce<kMassWarps>(m, red, true);
    float sum = 0.0f;
    for (int64_t t = threadIdx.x; t < n_vis; t += kMassThreads) sum += expf(mass_score(p, keys, r, t) - m);
    sum = block_reduce<kMassWarps>(sum, red, false);
    if (threadIdx.x == 0) {
        p.stats[2 * r] = m;
        p.stats[2 * r + 1] = n_vis > 0 ? float(1.0 / double(sum)) : 0.0f;
    }
}

// Thread (token t, KV head g = blockIdx.y): its probabilities from every query that sees it and
// every query head of g, summed in the order (query, head).
__global__ void __launch_bounds__(kMassThreads) mass_sum_kernel(const AttentionMassParams p) {
    const int64_t g = blockIdx.y, t = int64_t(blockIdx.x) * kMassThreads + threadIdx.x;
    const KvHeadDev head = p.heads[g];
    if (t >= head.n_tokens) return;
    const int64_t n_gqa = p.n_head / p.n_head_kv, pos0 = *p.pos0;
    const uint8_t* keys = reinterpret_cast<const uint8_t*>(head.k);
    float acc = 0.0f;
    for (int64_t i = 0; i < p.n_q; ++i) {
        if (t >= kv_visible(head, pos0, i)) continue;
        for (int64_t h = g * n_gqa; h < (g + 1) * n_gqa; ++h) {
            const int64_t r = i * p.n_head + h;
            const float pr = __fmul_rn(expf(mass_score(p, keys, r, t) - p.stats[2 * r]), p.stats[2 * r + 1]);
            acc += p.round_f16 ? __half2float(__float2half_rn(pr)) : pr;
        }
    }
    p.mass[g * p.stride + t] = acc;
}

}  // namespace

void attention_mass(const AttentionMassParams& p, cudaStream_t stream) {
    if (p.n_q == 0 || p.n_head_kv == 0 || p.stride == 0) return;
    mass_stats_kernel<<<unsigned(p.n_q * p.n_head), kMassThreads, 0, stream>>>(p);
    VXQ_CUDA_CHECK_LAUNCH();
    const dim3 grid(unsigned((p.stride + kMassThreads - 1) / kMassThreads), unsigned(p.n_head_kv));
    mass_sum_kernel<<<grid, kMassThreads, 0, stream>>>(p);
    VXQ_CUDA_CHECK_LAUNCH();
}

}  // namespace vxq::cuda

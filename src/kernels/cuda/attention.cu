#include "kernels/cuda/attention.cuh"

#include <algorithm>
#include <climits>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/cublas_api.h"

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

// Block (token t, head g): its key and value rows into the new slot, in the pages' formats.
__global__ void store_kv_kernel(KvStoreParams p) {
    const int64_t t = blockIdx.x / p.n_head_kv, g = blockIdx.x % p.n_head_kv;
    const KvHeadDev h = p.heads[g];
    const int hd = int(p.head_dim);
    const int64_t slot = h.n_tokens + t, row = (t * p.n_head_kv + g) * p.head_dim;
    kv_store_row(p.k_code, p.k + row, reinterpret_cast<uint8_t*>(h.k) + slot * kv_token_bytes(p.k_code, hd), hd,
                 threadIdx.x, blockDim.x);
    kv_store_row(p.v_code, p.v + row, reinterpret_cast<uint8_t*>(h.v) + slot * kv_token_bytes(p.v_code, hd), hd,
                 threadIdx.x, blockDim.x);
}

// ---- decode with -fa: split-K ------------------------------------------------------------------

constexpr int kSplitThreads = 128;
constexpr int kSplitWarps = kSplitThreads / 32;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_add(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Rotates pair i of a row at position pos as rope_kernel does (the same recurrence and products).
__device__ __forceinline__ void rope_pair(float* row, int64_t i, int64_t pos, const RopeStoreParams& p) {
    const int64_t half = p.n_rot / 2;
    float theta = float(pos);
    for (int64_t k = 0; k < i; ++k) theta = __fmul_rn(theta, p.theta_scale);
    const float c = cosf(theta), s = sinf(theta);
    const int64_t a = p.neox ? i : 2 * i;
    const int64_t b = p.neox ? i + half : 2 * i + 1;
    const float x0 = row[a], x1 = row[b];
    row[a] = fmaf(x0, c, -__fmul_rn(x1, s));
    row[b] = fmaf(x0, s, __fmul_rn(x1, c));
}

__device__ __forceinline__ void prefetch_l2(const void* ptr) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(ptr));
}

// The merge of (g, i)'s first `splits` splits (those that hold tokens) by the block that arrived
// last: for each of the REP query heads the splits' maxima and sums (read in parallel: a chain of
// dependent loads would cost a memory latency per split), then o = sum_z o_z exp(m_z - m) /
// sum_z l_z exp(m_z - m). No visible token: 0. Partials of other blocks are read through L2
// (__ldcg): L1 is not coherent. `keep` (shared memory, REP * head_dim floats, or null): the
// merged rows again, for the q8_0 output.
template <int REP>
__device__ void merge_splits(const SplitAttentionParams& p, int g, int i, int splits, float* keep) {
    __shared__ float wz[REP][kAttnSplitMaxSplits], lz[REP][kAttnSplitMaxSplits];
    __shared__ float inv_s[REP];
    const int hd = int(p.head_dim), tid = threadIdx.x, lane = tid & 31;
    const int64_t stride = hd + 2;
    const auto part_of = [&](int r) { return p.partial + (int64_t(i) * p.n_head + int64_t(g) * REP + r) * p.splits * stride; };
    for (int r = tid >> 5; r < REP; r += kSplitWarps) {
        const float* part = part_of(r);
        float m = -INFINITY;
        for (int z = lane; z < splits; z += 32) {
            wz[r][z] = __ldcg(part + z * stride + hd);
            lz[r][z] = __ldcg(part + z * stride + hd + 1);
            m = fmaxf(m, wz[r][z]);
        }
        m = warp_max(m);
        float l = 0.0f;
        for (int z = lane; z < splits; z += 32) {
            const float w = wz[r][z] == -INFINITY ? 0.0f : expf(wz[r][z] - m);
            wz[r][z] = w;
            l += lz[r][z] * w;
        }
        l = warp_add(l);
        // ggml_soft_max: the reciprocal taken in double.
        if (lane == 0) inv_s[r] = l > 0.0f ? float(1.0 / double(l)) : 0.0f;
    }
    __syncthreads();
    for (int e = tid; e < REP * hd; e += kSplitThreads) {
        const int r = e / hd, d = e - r * hd;
        const float* part = part_of(r);
        float acc = 0.0f;
#pragma unroll 8
        for (int z = 0; z < splits; ++z) acc += __ldcg(part + z * stride + d) * wz[r][z];
        p.out[(int64_t(i) * p.n_head + int64_t(g) * REP + r) * hd + d] = acc * inv_s[r];
        if (keep) keep[e] = acc * inv_s[r];
    }
}

// Keys and values of tokens [c0, c0 + len) of a head into a stage of shared memory: whole 16-byte
// pieces (c0 is a multiple of kAttnSplitMinTokens, so every format's tile starts aligned; the last
// piece may run past the last token, never past its page).
__device__ __forceinline__ void load_tile(uint8_t* stage, const KvHeadDev& head, int64_t c0, int len, int ktb, int vtb,
                                          int k_tile_bytes) {
    const uint8_t* ks = reinterpret_cast<const uint8_t*>(head.k) + c0 * ktb;
    const uint8_t* vs = reinterpret_cast<const uint8_t*>(head.v) + c0 * vtb;
    const int kb = (len * ktb + 15) & ~15, vb = (len * vtb + 15) & ~15;
    for (int o = threadIdx.x * 16; o < kb; o += kSplitThreads * 16) cp_async16(stage + o, ks + o);
    for (int o = threadIdx.x * 16; o < vb; o += kSplitThreads * 16) cp_async16(stage + k_tile_bytes + o, vs + o);
    cp_async_commit();
}

// Scores of one key (in shared memory) against the REP query heads, summed over the warp's lanes.
// f16: f32 q times the key's halves. q8_0 / q4_0: q quantized to q8_0 (qq, qd), an exact integer
// dot per 4 codes (dp4a) times d_k * d_q, as the CPU's reader (kv_codes.cuh).
template <int REP, KvCode KC>
__device__ __forceinline__ void score_key(const uint8_t* key, int hd, int lane, const float (*qs)[kAttnSplitMaxHeadDim],
                                          const int (*qq)[kAttnSplitMaxHeadDim / 4],
                                          const float (*qd)[kAttnSplitMaxHeadDim / kQBlock], float* dot) {
    if constexpr (KC == KvCode::F16) {
        const __half2* kr = reinterpret_cast<const __half2*>(key);
        for (int d2 = lane; d2 < hd / 2; d2 += 32) {
            const float2 kv = __half22float2(kr[d2]);
#pragma unroll
            for (int r = 0; r < REP; ++r) dot[r] += qs[r][2 * d2] * kv.x + qs[r][2 * d2 + 1] * kv.y;
        }
    } else {
        for (int u = lane; u < hd / 4; u += 32) {
            float dk;
            const int codes = kv_key_codes4<KC>(key, u, dk);
#pragma unroll
            for (int r = 0; r < REP; ++r) dot[r] += float(__dp4a(codes, qq[r][u], 0)) * (dk * qd[r][u / 8]);
        }
    }
}

// Block (g, i, z): KV head g, query i, split z; REP query heads g * REP + r; keys in format KC,
// values in VC. Dynamic shared memory: two stages of (key tile, value tile).
template <int REP, KvCode KC, KvCode VC>
__global__ void __launch_bounds__(kSplitThreads) attention_split_kernel(const SplitAttentionParams p) {
    extern __shared__ __align__(16) uint8_t tiles[];
    __shared__ float qs[REP][kAttnSplitMaxHeadDim];
    __shared__ __align__(16) int qq[KC == KvCode::F16 ? 1 : REP][kAttnSplitMaxHeadDim / 4];  // q as q8_0 codes
    __shared__ float qd[KC == KvCode::F16 ? 1 : REP][kAttnSplitMaxHeadDim / kQBlock];         // and scales
    __shared__ float kn[kAttnSplitMaxHeadDim];  // with rope: the new key, rotated
    __shared__ float sc[REP][kAttnSplitTile];
    __shared__ float m_run[REP], l_run[REP], factor[REP];
    __shared__ bool merger;
    const int g = blockIdx.x, i = blockIdx.y, z = blockIdx.z;
    const int hd = int(p.head_dim), tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int ktb = int(kv_token_bytes(KC, hd)), vtb = int(kv_token_bytes(VC, hd));
    const int k_tile_bytes = (kAttnSplitTile * ktb + 15) & ~15;
    const int stage_bytes = k_tile_bytes + ((kAttnSplitTile * vtb + 15) & ~15);
    // The step block and the pages of earlier steps were written before this step's first kernel.
    const KvHeadDev head = p.heads[g];
    const int64_t seen = *p.pos0 + i + 1;
    const int64_t n_vis = seen < 0 ? 0 : (seen < head.n_tokens ? seen : head.n_tokens);
    // Stretches of whole granules of kAttnSplitMinTokens: a short context leaves the last splits
    // empty (they only take part in the RoPE and the count of arrivals), so its merge reads few partials.
    const int64_t want = (n_vis + p.splits - 1) / p.splits;
    const int64_t per = max((want + kAttnSplitMinTokens - 1) / kAttnSplitMinTokens * kAttnSplitMinTokens,
                            int64_t(kAttnSplitMinTokens));
    const int active = int((n_vis + per - 1) / per);  // splits holding tokens (0 when n_vis is 0)
    const int64_t t_begin = min(n_vis, int64_t(z) * per), t_end = min(n_vis, t_begin + per);
    {
        const uint8_t* kp = reinterpret_cast<const uint8_t*>(head.k) + t_begin * ktb;
        const uint8_t* vp = reinterpret_cast<const uint8_t*>(head.v) + t_begin * vtb;
        const int64_t len = min(t_end - t_begin, int64_t(kAttnSplitTile));
        for (int64_t l = tid; l < (len * ktb + 127) / 128; l += kSplitThreads) prefetch_l2(kp + 128 * l);
        for (int64_t l = tid; l < (len * vtb + 127) / 128; l += kSplitThreads) prefetch_l2(vp + 128 * l);
    }
    pdl_wait();
    pdl_launch_dependents();
    for (int e = tid; e < REP * hd; e += kSplitThreads) {
        const int r = e / hd, d = e - r * hd;
        qs[r][d] = p.q[(int64_t(i) * p.n_head + int64_t(g) * REP + r) * hd + d];
    }
    if (tid < REP) {
        m_run[tid] = -INFINITY;
        l_run[tid] = 0.0f;
    }
    const bool rope = p.rope.q != nullptr;
    if (rope) {  // n_q == 1: RoPE of q and k, the new token's store (attention.cuh)
        const int64_t pos = *p.rope.pos0, slot = p.rope.heads[g].n_tokens;
        const int half = int(p.rope.n_rot / 2);
        const bool owner = slot < n_vis ? (slot >= t_begin && slot < t_end) : z == 0;
        float* kg = p.rope.k + int64_t(g) * hd;
        if (owner) {
            for (int d = tid; d < hd; d += kSplitThreads) kn[d] = kg[d];
        }
        __syncthreads();
        for (int e = tid; e < REP * half; e += kSplitThreads) rope_pair(qs[e / half], e % half, pos, p.rope);
        if (owner) {
            for (int e = tid; e < half; e += kSplitThreads) rope_pair(kn, e, pos, p.rope);
        }
        __syncthreads();
        if (owner) {
            const KvHeadDev sh = p.rope.heads[g];
            for (int d = tid; d < hd; d += kSplitThreads) kg[d] = kn[d];
            kv_store_row(KC, kn, reinterpret_cast<uint8_t*>(sh.k) + slot * ktb, hd, tid, kSplitThreads);
            kv_store_row(VC, p.rope.v + int64_t(g) * hd, reinterpret_cast<uint8_t*>(sh.v) + slot * vtb, hd, tid,
                         kSplitThreads);
            __threadfence();  // the tile copies below read the new slot through L2
        }
    }
    __syncthreads();  // q (and the new token's page writes) visible to the whole block
    if constexpr (KC != KvCode::F16) {  // q as q8_0, once per block (the CPU reader's prepare_query)
        for (int b = warp; b < REP * hd / kQBlock; b += kSplitWarps) {
            const int r = b / (hd / kQBlock), bb = b % (hd / kQBlock);
            const Q8Lane ql = quantize_q8_0_lane(qs[r][bb * kQBlock + lane]);
            reinterpret_cast<int8_t*>(qq[r])[bb * kQBlock + lane] = int8_t(ql.q);
            if (lane == 0) qd[r][bb] = ql.d;
        }
        __syncthreads();
    }
    float o[REP][kAttnSplitMaxHeadDim / kSplitThreads];
#pragma unroll
    for (int r = 0; r < REP; ++r) {
#pragma unroll
        for (int j = 0; j < kAttnSplitMaxHeadDim / kSplitThreads; ++j) o[r][j] = 0.0f;
    }
    const int n_tiles = int((t_end - t_begin + kAttnSplitTile - 1) / kAttnSplitTile);
    if (n_tiles > 0) load_tile(tiles, head, t_begin, int(min(int64_t(kAttnSplitTile), t_end - t_begin)), ktb, vtb, k_tile_bytes);
    for (int it = 0; it < n_tiles; ++it) {
        const int64_t c0 = t_begin + int64_t(it) * kAttnSplitTile;
        const int len = int(min(int64_t(kAttnSplitTile), t_end - c0));
        if (it + 1 < n_tiles) {  // the next tile in flight while this one is computed
            const int64_t c1 = c0 + kAttnSplitTile;
            load_tile(tiles + ((it + 1) & 1) * stage_bytes, head, c1, int(min(int64_t(kAttnSplitTile), t_end - c1)), ktb,
                      vtb, k_tile_bytes);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // every thread's pieces of this tile have landed
        const uint8_t* kt = tiles + (it & 1) * stage_bytes;
        const uint8_t* vt = kt + k_tile_bytes;
        // Scores: a warp per token, lanes over head_dim, every query head.
        for (int tt = warp; tt < len; tt += kSplitWarps) {
            float dot[REP];
#pragma unroll
            for (int r = 0; r < REP; ++r) dot[r] = 0.0f;
            score_key<REP, KC>(kt + tt * ktb, hd, lane, qs, qq, qd, dot);
#pragma unroll
            for (int r = 0; r < REP; ++r) {
                const float s = warp_add(dot[r]);
                if (lane == 0) sc[r][tt] = s * p.scale;
            }
        }
        __syncthreads();
        // Online softmax per query head: a warp per head.
        for (int r = warp; r < REP; r += kSplitWarps) {
            const float x = lane < len ? sc[r][lane] : -INFINITY;  // kAttnSplitTile == 32: a lane per token
            const float m_new = fmaxf(m_run[r], warp_max(x));
            const float e = lane < len ? expf(x - m_new) : 0.0f;
            if (lane < len) sc[r][lane] = e;
            const float sum = warp_add(e);
            if (lane == 0) {
                const float f = expf(m_run[r] - m_new);  // 0 while m_run is -inf
                factor[r] = f;
                l_run[r] = l_run[r] * f + sum;
                m_run[r] = m_new;
            }
        }
        __syncthreads();
        // V: thread d (and d + 128) for every query head, each value read once.
#pragma unroll
        for (int j = 0; j < kAttnSplitMaxHeadDim / kSplitThreads; ++j) {
            const int d = tid + j * kSplitThreads;
            if (d >= hd) break;
            float acc[REP];
#pragma unroll
            for (int r = 0; r < REP; ++r) acc[r] = o[r][j] * factor[r];
            for (int tt = 0; tt < len; ++tt) {
                const float v = kv_value<VC>(vt + tt * vtb, d);
#pragma unroll
                for (int r = 0; r < REP; ++r) acc[r] += sc[r][tt] * v;
            }
#pragma unroll
            for (int r = 0; r < REP; ++r) o[r][j] = acc[r];
        }
        __syncthreads();  // sc and this stage are rewritten next
    }
    const int64_t stride = hd + 2;
#pragma unroll
    for (int r = 0; r < REP; ++r) {
        if (z >= active) break;  // no tokens: the merge does not read this split
        float* part = p.partial + ((int64_t(i) * p.n_head + int64_t(g) * REP + r) * p.splits + z) * stride;
#pragma unroll
        for (int j = 0; j < kAttnSplitMaxHeadDim / kSplitThreads; ++j) {
            const int d = tid + j * kSplitThreads;
            if (d < hd) part[d] = o[r][j];
        }
        if (tid == 0) {
            part[hd] = m_run[r];
            part[hd + 1] = l_run[r];
        }
    }
    // The last block of (g, i) to get here merges: each block's partial is published (fence)
    // before its arrival is counted, and the merger fences again before reading them.
    __threadfence();
    __syncthreads();
    unsigned* arrivals = p.arrivals + int64_t(i) * p.n_head_kv + g;
    if (tid == 0) merger = atomicAdd(arrivals, 1u) == unsigned(p.splits - 1);
    __syncthreads();
    if (!merger) return;
    __threadfence();
    if (rope) {  // every block of the group has read q: the rotated rows go back (as rope_store leaves them)
        for (int e = tid; e < REP * hd; e += kSplitThreads) p.rope.q[(int64_t(g) * REP + e / hd) * hd + e % hd] = qs[e / hd][e % hd];
        __syncthreads();  // qs is merge_splits' `keep` below
    }
    float* keep = p.out_q8.qs ? &qs[0][0] : nullptr;  // REP * hd <= REP * kAttnSplitMaxHeadDim floats
    merge_splits<REP>(p, g, i, active, keep);
    if (keep) {  // one query: the group's rows of out, contiguous, whole 32-element blocks
        __syncthreads();
        const int64_t b0 = int64_t(g) * REP * hd / kQBlock;
        for (int b = warp; b < REP * hd / kQBlock; b += kSplitWarps) {
            quantize_block_q8_0(keep[b * kQBlock + lane], b0 + b, lane, p.out_q8.qs, p.out_q8.s);
        }
    }
    if (tid == 0) *arrivals = 0;  // ready for the next call (a kernel boundary orders it)
}

// Block (token, head) over the q heads then the k heads; thread e < n_rot / 2 rotates pair e as
// rope_kernel does; then a k head's threads store its rows of k and v as store_kv_kernel does.
__global__ void rope_store_kernel(const RopeStoreParams p) {
    pdl_wait();
    pdl_launch_dependents();
    const int64_t t = blockIdx.x / (p.n_head + p.n_head_kv), hh = blockIdx.x % (p.n_head + p.n_head_kv);
    const bool is_k = hh >= p.n_head;
    const int64_t head = is_k ? hh - p.n_head : hh;
    float* row = is_k ? p.k + (t * p.n_head_kv + head) * p.head_dim : p.q + (t * p.n_head + head) * p.head_dim;
    for (int64_t i = threadIdx.x; i < p.n_rot / 2; i += blockDim.x) rope_pair(row, i, *p.pos0 + t, p);
    if (!is_k) return;
    __syncthreads();  // the rotated row, written by other threads of the block
    const KvHeadDev h = p.heads[head];
    const int hd = int(p.head_dim);
    const int64_t slot = h.n_tokens + t;
    const float* vrow = p.v + (t * p.n_head_kv + head) * p.head_dim;
    kv_store_row(p.k_code, row, reinterpret_cast<uint8_t*>(h.k) + slot * kv_token_bytes(p.k_code, hd), hd, threadIdx.x,
                 blockDim.x);
    kv_store_row(p.v_code, vrow, reinterpret_cast<uint8_t*>(h.v) + slot * kv_token_bytes(p.v_code, hd), hd, threadIdx.x,
                 blockDim.x);
}

// ---- the GEMM path's kernels ---------------------------------------------------------------------

// q into fp16 hi and, where lo is given, the scaled rest (attention.cuh: the split's numerics).
__global__ void split_q_kernel(const float* __restrict__ q, __half* __restrict__ hi, __half* __restrict__ lo, int64_t n) {
    for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
        const float x = q[idx];
        const __half h = __float2half_rn(x);
        hi[idx] = h;
        if (lo) lo[idx] = __float2half_rn((x - __half2float(h)) * kAttnLoScale);
    }
}

// Block r = h * n_q + i: the score row of query i and query head h, turned into its probabilities
// over the GEMM's n_kv tokens (0 for the ones query i does not see). __fmul_rn keeps the products
// s = dot * scale and p = e * inv rounded on their own, as the decode kernel's (no FMA contraction
// into the subtraction that follows).
__global__ void __launch_bounds__(kAttnWarps * 32)
    softmax_rows_kernel(F16AttentionGemmParams p, float* scores, __half* p_hi, __half* p_lo) {
    __shared__ float red[kAttnWarps];
    const int64_t r = blockIdx.x;
    const int64_t h = r / p.n_q, i = r % p.n_q;
    const int64_t g = h / (p.n_head / p.n_head_kv);
    const int64_t n_tokens = p.heads[g].n_tokens < p.n_kv ? p.heads[g].n_tokens : p.n_kv;
    const int64_t seen = *p.pos0 + i + 1;  // positions <= pos0 + i
    const int64_t n_vis = seen < 0 ? 0 : (seen < n_tokens ? seen : n_tokens);
    float* sc = scores + r * p.stride;
    __half* hi = p_hi + r * p.stride;
    __half* lo = p_lo ? p_lo + r * p.stride : nullptr;

    float m = -INFINITY;
    for (int64_t t = threadIdx.x; t < n_vis; t += blockDim.x) m = fmaxf(m, __fmul_rn(sc[t], p.scale));
    m = block_reduce(m, red, true);
    float sum = 0.0f;
    for (int64_t t = threadIdx.x; t < n_vis; t += blockDim.x) {
        const float e = expf(__fmul_rn(sc[t], p.scale) - m);
        sc[t] = e;  // read back below by this same thread
        sum += e;
    }
    sum = block_reduce(sum, red, false);
    // ggml_soft_max: p = e * float(1 / sum) with the reciprocal taken in double.
    const float inv = n_vis > 0 ? float(1.0 / double(sum)) : 0.0f;
    for (int64_t t = threadIdx.x; t < p.n_kv; t += blockDim.x) {
        const float pr = t < n_vis ? __fmul_rn(sc[t], inv) : 0.0f;
        const __half ph = __float2half_rn(pr);
        hi[t] = ph;
        if (lo) lo[t] = __float2half_rn((pr - __half2float(ph)) * kAttnLoScale);
    }
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Threads per block of a kernel that stores rows of head_dim (kv_store_row: a multiple of 32).
int row_threads(int64_t head_dim) { return int(std::clamp<int64_t>((head_dim + 31) / 32 * 32, 32, 256)); }

}  // namespace

void store_kv(const KvStoreParams& p, cudaStream_t st) {
    const int64_t rows = p.n * p.n_head_kv;
    if (rows == 0) return;
    store_kv_kernel<<<unsigned(rows), row_threads(p.head_dim), 0, st>>>(p);
    VXQ_CUDA_CHECK_LAUNCH();
}

void attention_f16(const F16AttentionParams& p, cudaStream_t st) {
    if (p.n_q * p.n_head == 0) return;
    attention_f16_kernel<<<unsigned(p.n_q * p.n_head), kAttnWarps * 32, 0, st>>>(p);
    VXQ_CUDA_CHECK_LAUNCH();
}

bool attention_split_fits(int64_t n_head, int64_t n_head_kv, int64_t head_dim, KvCode k_code, KvCode v_code) {
    if (n_head_kv <= 0 || n_head % n_head_kv != 0) return false;
    const int64_t rep = n_head / n_head_kv;
    return (rep == 1 || rep == 2 || rep == 3 || rep == 4 || rep == 8) && head_dim % 2 == 0 &&
           head_dim <= kAttnSplitMaxHeadDim && kv_code_fits(k_code, head_dim) && kv_code_fits(v_code, head_dim);
}

int64_t attention_splits(int64_t n_q, int64_t n_head_kv) {
    const int64_t want = (int64_t(kAttnSplitBlocksPerSm) * sm_count() + n_q * n_head_kv - 1) / std::max<int64_t>(1, n_q * n_head_kv);
    int64_t s = 1;
    while (s < want && s < kAttnSplitMaxSplits) s *= 2;
    return s;
}

size_t attention_split_scratch_floats(int64_t n_q, int64_t n_head, int64_t head_dim, int64_t splits) {
    return size_t(n_q * n_head * splits * (head_dim + 2));
}

namespace {

size_t split_smem_bytes(const SplitAttentionParams& p) {
    const auto tile = [&](KvCode c) { return size_t(kAttnSplitTile * kv_token_bytes(c, p.head_dim) + 15) / 16 * 16; };
    return 2 * (tile(p.k_code) + tile(p.v_code));
}

template <int REP, KvCode KC, KvCode VC>
void launch_split(const SplitAttentionParams& p, dim3 grid, cudaStream_t st) {
    static const bool sized = [] {  // room for the largest tiles (f16, head_dim kAttnSplitMaxHeadDim)
        const int most = 2 * 2 * kAttnSplitTile * int(kv_token_bytes(KvCode::F16, kAttnSplitMaxHeadDim));
        VXQ_CUDA_CHECK(cudaFuncSetAttribute(attention_split_kernel<REP, KC, VC>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, most));
        return true;
    }();
    (void)sized;
    launch_pdl(attention_split_kernel<REP, KC, VC>, grid, dim3(kSplitThreads), split_smem_bytes(p), st, p);
}

template <int REP, KvCode KC>
void launch_split_v(const SplitAttentionParams& p, dim3 grid, cudaStream_t st) {
    switch (p.v_code) {
        case KvCode::F16: launch_split<REP, KC, KvCode::F16>(p, grid, st); break;
        case KvCode::Q8_0: launch_split<REP, KC, KvCode::Q8_0>(p, grid, st); break;
        case KvCode::Q4_0: launch_split<REP, KC, KvCode::Q4_0>(p, grid, st); break;
    }
}

template <int REP>
void launch_split_kv(const SplitAttentionParams& p, dim3 grid, cudaStream_t st) {
    switch (p.k_code) {
        case KvCode::F16: launch_split_v<REP, KvCode::F16>(p, grid, st); break;
        case KvCode::Q8_0: launch_split_v<REP, KvCode::Q8_0>(p, grid, st); break;
        case KvCode::Q4_0: launch_split_v<REP, KvCode::Q4_0>(p, grid, st); break;
    }
}

}  // namespace

void attention_split(const SplitAttentionParams& p, cudaStream_t st) {
    if (p.n_q * p.n_head == 0) return;
    if (p.out_q8.qs && !attention_split_q8_fits(p)) {
        throw_cuda_error(cudaErrorInvalidValue, "attention_split: q8_0 output needs one query and head_dim % 32 == 0",
                         __FILE__, __LINE__);
    }
    if (!attention_split_fits(p.n_head, p.n_head_kv, p.head_dim, p.k_code, p.v_code)) {
        throw_cuda_error(cudaErrorInvalidValue, "attention_split: shape or format not taken (attention_split_fits)",
                         __FILE__, __LINE__);
    }
    const dim3 grid(unsigned(p.n_head_kv), unsigned(p.n_q), unsigned(p.splits));
    switch (p.n_head / p.n_head_kv) {
        case 1: launch_split_kv<1>(p, grid, st); break;
        case 2: launch_split_kv<2>(p, grid, st); break;
        case 3: launch_split_kv<3>(p, grid, st); break;
        case 4: launch_split_kv<4>(p, grid, st); break;
        default: launch_split_kv<8>(p, grid, st); break;
    }
}

bool attention_split_rope_fits(const SplitAttentionParams& p, const RopeStoreParams& r) {
    return p.n_q == 1 && r.k_code == p.k_code && r.v_code == p.v_code && r.n == 1 && r.q == p.q && r.n_head == p.n_head && r.n_head_kv == p.n_head_kv &&
           r.head_dim == p.head_dim && r.n_rot >= 0 && r.n_rot <= r.head_dim && r.n_rot % 2 == 0;
}

bool attention_split_q8_fits(const SplitAttentionParams& p) { return p.n_q == 1 && p.head_dim % kQBlock == 0; }

void rope_store_kv(const RopeStoreParams& p, cudaStream_t st) {
    const int64_t blocks = p.n * (p.n_head + p.n_head_kv);
    if (blocks == 0) return;
    launch_pdl(rope_store_kernel, dim3(unsigned(blocks)), dim3(row_threads(p.head_dim)), 0, st, p);
}

AttnGemmLayout attn_gemm_layout(const F16AttentionGemmParams& p) {
    const size_t q_bytes = size_t(p.n_q * p.n_head * p.head_dim) * sizeof(__half);
    const size_t rows = size_t(p.n_head * p.n_q * p.stride);
    const bool split = !p.round_f16;
    AttnGemmLayout l{};
    l.q_hi = 0;
    l.q_lo = align256(q_bytes);
    l.scores = l.q_lo + (split ? align256(q_bytes) : 0);
    l.p_hi = l.scores + align256(rows * sizeof(float));
    l.p_lo = l.p_hi + align256(rows * sizeof(__half));
    l.workspace = l.p_lo + (split ? align256(rows * sizeof(__half)) : 0);
    l.total = l.workspace + kAttnCublasWorkspaceBytes;
    return l;
}

bool attention_gemm_fits(int64_t n_q, int64_t n_head, int64_t head_dim, int64_t n_kv, int64_t stride, const float* out) {
    return n_q >= kAttnGemmMinQueries && n_kv >= 1 && n_kv <= stride && stride <= INT_MAX && stride % 8 == 0 &&
           n_q * n_head <= INT_MAX && n_head * head_dim <= INT_MAX && head_dim % 8 == 0 &&
           reinterpret_cast<uintptr_t>(out) % 16 == 0;
}

void attn_gemm_operands(const F16AttentionGemmParams& p, const KvHeadDev* heads, const void** ptrs) {
    const AttnGemmLayout l = attn_gemm_layout(p);
    const auto* base = static_cast<const uint8_t*>(p.scratch);
    const auto* q_hi = reinterpret_cast<const __half*>(base + l.q_hi);
    const auto* q_lo = reinterpret_cast<const __half*>(base + l.q_lo);
    const auto* scores = reinterpret_cast<const float*>(base + l.scores);
    const auto* p_hi = reinterpret_cast<const __half*>(base + l.p_hi);
    const auto* p_lo = reinterpret_cast<const __half*>(base + l.p_lo);
    const int64_t group = p.n_head / p.n_head_kv;
    const auto at = [&](AttnGemmOperand o, int64_t h) -> const void*& { return ptrs[o * p.n_head + h]; };
    for (int64_t h = 0; h < p.n_head; ++h) {
        const KvHeadDev& kv = heads[h / group];
        const int64_t row0 = h * p.n_q * p.stride;  // head h's first score / probability row
        at(kOpKeys, h) = reinterpret_cast<const void*>(uintptr_t(kv.k));
        at(kOpValues, h) = reinterpret_cast<const void*>(uintptr_t(kv.v));
        at(kOpQHi, h) = q_hi + h * p.head_dim;
        at(kOpQLo, h) = q_lo + h * p.head_dim;
        at(kOpScores, h) = scores + row0;
        at(kOpPHi, h) = p_hi + row0;
        at(kOpPLo, h) = p_lo + row0;
        at(kOpOut, h) = p.out + h * p.head_dim;
    }
}

// Column-major, as cuBLAS sees the row-major arrays:
//   keys of head g, [n_kv, head_dim] row-major = a head_dim x n_kv matrix (ld head_dim); op T
//     gives K_g (n_kv x head_dim);
//   q of head h, rows i at n_head * head_dim apart = a head_dim x n_q matrix (ld n_head * head_dim)
//     starting at head h's channels: Q_h^T;
//   scores of head h, [n_q, stride] row-major = an n_kv x n_q matrix (ld stride): S_h^T = K_g Q_h^T;
//   values of head g = a head_dim x n_kv matrix (ld head_dim): V_g^T; probabilities of head h
//     (ld stride) = an n_kv x n_q matrix P_h^T; out of head h (ld n_head * head_dim) = a
//     head_dim x n_q matrix O_h^T = V_g^T P_h^T.
AttnGemmPlan attn_gemm_plan(const F16AttentionGemmParams& p) {
    const int n_kv = int(p.n_kv), n_q = int(p.n_q), hd = int(p.head_dim), stride = int(p.stride);
    const int q_ld = int(p.n_head * p.head_dim);
    const float lo_alpha = 1.0f / kAttnLoScale;
    AttnGemmPlan plan{};
    int n = 0;
    plan.calls[n++] = {CUBLAS_OP_T, CUBLAS_OP_N, n_kv, n_q, hd, 1.0f, 0.0f, kOpKeys, kOpQHi, kOpScores, hd, q_ld, stride};
    if (!p.round_f16) {
        plan.calls[n++] = {CUBLAS_OP_T, CUBLAS_OP_N, n_kv, n_q, hd, lo_alpha, 1.0f, kOpKeys, kOpQLo, kOpScores, hd, q_ld, stride};
    }
    plan.n_scores = n;
    plan.calls[n++] = {CUBLAS_OP_N, CUBLAS_OP_N, hd, n_q, n_kv, 1.0f, 0.0f, kOpValues, kOpPHi, kOpOut, hd, stride, q_ld};
    if (!p.round_f16) {
        plan.calls[n++] = {CUBLAS_OP_N, CUBLAS_OP_N, hd, n_q, n_kv, lo_alpha, 1.0f, kOpValues, kOpPLo, kOpOut, hd, stride, q_ld};
    }
    plan.n_calls = n;
    return plan;
}

void attention_f16_gemm(const F16AttentionGemmParams& p, AttnGemmScratch& s, cudaStream_t st) {
    const AttnGemmLayout l = attn_gemm_layout(p);
    if (!s.cublas || p.scratch != s.buf || s.bytes < l.total) {
        throw_cuda_error(cudaErrorInvalidValue, "attention_f16_gemm: scratch not reserved for this call", __FILE__, __LINE__);
    }
    auto* base = static_cast<uint8_t*>(p.scratch);
    const bool split = !p.round_f16;
    auto* q_hi = reinterpret_cast<__half*>(base + l.q_hi);
    const int64_t n = p.n_q * p.n_head * p.head_dim;
    const unsigned blocks = unsigned(std::min<int64_t>((n + 255) / 256, 65535));
    split_q_kernel<<<blocks, 256, 0, st>>>(p.q, q_hi, split ? reinterpret_cast<__half*>(base + l.q_lo) : nullptr, n);
    VXQ_CUDA_CHECK_LAUNCH();
    // cublasSetStream resets the workspace to cuBLAS's own pool (which allocates): set ours after.
    VXQ_CUBLAS_CHECK(cublas_api().set_stream(s.cublas, st));
    VXQ_CUBLAS_CHECK(cublas_api().set_workspace(s.cublas, base + l.workspace, kAttnCublasWorkspaceBytes));
    const AttnGemmPlan plan = attn_gemm_plan(p);
    const auto operand = [&](AttnGemmOperand o) { return p.operands + o * p.n_head; };
    const auto gemm = [&](const AttnGemmCall& c) {
        VXQ_CUBLAS_CHECK(cublas_api().gemm_batched_ex(
            s.cublas, c.trans_a, c.trans_b, c.m, c.n, c.k, &c.alpha, operand(c.a), CUDA_R_16F, c.lda, operand(c.b),
            CUDA_R_16F, c.ldb, &c.beta, const_cast<void* const*>(operand(c.c)), CUDA_R_32F, c.ldc, int(p.n_head),
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    for (int c = 0; c < plan.n_scores; ++c) gemm(plan.calls[c]);
    softmax_rows_kernel<<<unsigned(p.n_head * p.n_q), kAttnWarps * 32, 0, st>>>(
        p, reinterpret_cast<float*>(base + l.scores), reinterpret_cast<__half*>(base + l.p_hi),
        split ? reinterpret_cast<__half*>(base + l.p_lo) : nullptr);
    VXQ_CUDA_CHECK_LAUNCH();
    for (int c = plan.n_scores; c < plan.n_calls; ++c) gemm(plan.calls[c]);
}

}  // namespace vxq::cuda

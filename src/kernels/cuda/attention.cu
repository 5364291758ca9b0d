#include "kernels/cuda/attention.cuh"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <type_traits>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/attention_tiles.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/cublas_api.h"

namespace vxq::cuda {

namespace {

constexpr int kAttnWarps = 4;

// Block (i, h): query token i, query head h, reading KV head h / (n_head / n_head_kv).
__global__ void __launch_bounds__(kAttnWarps * 32) attention_f16_kernel(F16AttentionParams p) {
    __shared__ float red[kAttnWarps];
    const int64_t i = blockIdx.x / p.n_head, h = blockIdx.x % p.n_head;
    const int64_t g = h / (p.n_head / p.n_head_kv);
    const KvHeadDev head = p.heads[g];
    const int64_t seen = *p.pos0 + i + 1 - head.evicted;  // stored tokens at positions <= pos0 + i
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
        dot = warp_sum(dot);
        if (lane == 0) sc[t] = dot * p.scale;
    }
    __syncthreads();
    float m = -INFINITY;
    for (int64_t t = threadIdx.x; t < n_vis; t += blockDim.x) m = fmaxf(m, sc[t]);
    m = block_reduce<kAttnWarps>(m, red, true);
    float sum = 0.0f;
    for (int64_t t = threadIdx.x; t < n_vis; t += blockDim.x) {
        const float e = expf(sc[t] - m);
        sc[t] = e;
        sum += e;
    }
    sum = block_reduce<kAttnWarps>(sum, red, false);  // its barriers also publish the exponentials in sc
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

// ---- decode with -fa: split-K ------------------------------------------------------------------

constexpr int kSplitThreads = 128;
constexpr int kSplitWarps = kSplitThreads / 32;


// RoPE of a row's pair i at position pos as rope_kernel does (rope.cuh).
__device__ __forceinline__ void rope_pair(float* row, int64_t i, int64_t pos, const RopeStoreParams& p) {
    rope_rotate_pair(row, i, rope_angle(i, pos, p.theta_scale), p.n_rot, p.neox);
}

__device__ __forceinline__ void prefetch_l2(const void* ptr) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(ptr));
}

// The query rows q[0, blocks * 32) as q8_0, the CPU reader's prepare_query (every form's scores of
// q8_0 / q4_0 keys), a warp per 32-block (every thread of the block calls): codes into qc, scales
// into qd and, where qsum is given, each block's sum of codes.
__device__ __forceinline__ void quantize_query_q8_0(const float* q, int blocks, int8_t* qc, float* qd, int* qsum) {
    const int lane = threadIdx.x & 31;
    for (int b = int(threadIdx.x >> 5); b < blocks; b += kSplitWarps) {
        const Q8Lane ql = quantize_q8_0_lane(q[b * kQBlock + lane]);
        qc[b * kQBlock + lane] = int8_t(ql.q);
        if (qsum) {
            const int sum = __reduce_add_sync(0xffffffffu, ql.q);
            if (lane == 0) qsum[b] = sum;
        }
        if (lane == 0) qd[b] = ql.d;
    }
}

// The merge of (g, i)'s first `splits` splits (those that hold tokens) by the block that arrived
// last: for each of the REP query heads the splits' maxima and sums (read in parallel: a chain of
// dependent loads would cost a memory latency per split), then o = sum_z o_z exp(m_z - m) /
// sum_z l_z exp(m_z - m). No visible token: 0. Partials of other blocks are read through L2
// (__ldcg): L1 is not coherent. `keep` (shared memory, REP * head_dim floats, or null): the
// merged rows again, for the q8_0 output. BATCH: splits of loads in flight per thread (2 x BATCH
// float2 registers, which count against the calling kernel's blocks per SM).
template <int REP, int BATCH>
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
        l = warp_sum(l);
        // ggml_soft_max: the reciprocal taken in double.
        if (lane == 0) inv_s[r] = l > 0.0f ? float(1.0 / double(l)) : 0.0f;
    }
    __syncthreads();
    // o: a thread takes two channels (one 8-byte load per split: rows of hd + 2 floats keep 8-byte
    // alignment) of up to two rows' pairs at once, BATCH splits of loads in flight before the first
    // is used: a merge is a few memory latencies, not one per split. The sum over the splits in their
    // order, as before.
    const int pairs = REP * hd / 2;
    for (int e0 = tid; e0 < pairs; e0 += 2 * kSplitThreads) {
        const int e1 = min(e0 + kSplitThreads, pairs - 1);  // past the last pair: the last again (not written)
        const int r0 = 2 * e0 / hd, r1 = 2 * e1 / hd;
        const float* part0 = part_of(r0) + 2 * e0 - r0 * hd;
        const float* part1 = part_of(r1) + 2 * e1 - r1 * hd;
        float2 a0 = make_float2(0.0f, 0.0f), a1 = a0;
        for (int z0 = 0; z0 < splits; z0 += BATCH) {
            float2 v0[BATCH], v1[BATCH];
#pragma unroll
            for (int u = 0; u < BATCH; ++u) {
                const int z = min(z0 + u, splits - 1);
                v0[u] = __ldcg(reinterpret_cast<const float2*>(part0 + z * stride));
                v1[u] = __ldcg(reinterpret_cast<const float2*>(part1 + z * stride));
            }
#pragma unroll
            for (int u = 0; u < BATCH; ++u) {
                if (z0 + u < splits) {
                    const float w0 = wz[r0][z0 + u], w1 = wz[r1][z0 + u];
                    a0.x += v0[u].x * w0;
                    a0.y += v0[u].y * w0;
                    a1.x += v1[u].x * w1;
                    a1.y += v1[u].y * w1;
                }
            }
        }
        const auto put = [&](int e, int r, float2 a) {
            const float2 o = make_float2(a.x * inv_s[r], a.y * inv_s[r]);
            *reinterpret_cast<float2*>(p.out + (int64_t(i) * p.n_head + int64_t(g) * REP) * hd + 2 * e) = o;
            if (keep) {
                keep[2 * e] = o.x;
                keep[2 * e + 1] = o.y;
            }
        };
        put(e0, r0, a0);
        if (e0 + kSplitThreads < pairs) put(e1, r1, a1);
    }
}

// ---- the tensor-core split kernel ----------------------------------------------------------------
// A block's 16 rows are (query, query head) pairs: row r is query q0 + r / REP of its group and
// head g * REP + r % REP; rows past the group's queries are zero. Each tile of p.tile tokens
// (32, 64 or 128; p.stages of them in shared memory, stages - 1 in flight) is two sets of warp-level MMAs (PTX mma.sync, fragments as the PTX ISA lays them out:
// gid = lane / 4, tig = lane % 4):
//   scores  warp w takes the tile's 8-token blocks w, w + 4, ...: S[16 x 8] = Q[16 x hd] K^T.
//           f16 keys: m16n8k16 on fp16 operands; q is split into hi = fp16(q) and lo =
//           fp16((q - hi) * 2^11) and both are multiplied (keys are fp16 already, so every product
//           is exact in f32): s = S_hi + S_lo / 2^11, q to 2^-22 (the prefill GEMM path's split).
//           q8_0 / q4_0 keys: m16n8k32 on int8 per 32-block, q quantized to q8_0 (as the CPU),
//           the exact int32 dot times d_k * d_q, summed over blocks in f32.
//   values  warp w takes channel blocks of 32 (w, w + 4, ...): O[16 x 32] += P[16 x 32 tokens] V.
//           P (f32 probabilities, fp32 softmax in shared memory) is split into hi / lo as q;
//           f16 values are exact fp16 operands; q8_0 / q4_0 values are their integer codes (exact
//           in fp16) and the block scale goes into P: sum_t (p_t d_t) q_t (the CPU: p_t (q_t d_t)).
// Accumulation is f32 in the tensor cores; results match the CPU's f32 kernel to ~1e-6 relative.
constexpr int kMmaRows = 16;

// Where a block's dynamic shared memory goes (byte offsets, each 16-byte aligned).
struct MmaSmem {
    int qs, qf, qcodes, qd, sc, tiles;
    int k_row, v_row;           // bytes per token row of a tile (f16 rows padded by 16 against bank conflicts)
    int k_tile, stage, total;
};
__host__ __device__ inline int pad_row(KvCode c, int hd) {
    const int b = int(kv_token_bytes(c, hd));
    return kv_half_keys(c) ? b + 16 : b;  // f16 and fp8 rows: read a few bytes a token, rows in other banks
}
__host__ __device__ inline int align16(int n) { return (n + 15) & ~15; }
__host__ __device__ inline MmaSmem mma_smem(int hd, KvCode kc, KvCode vc, int tile, int stages) {
    MmaSmem m{};
    m.qs = 0;
    m.qf = m.qs + kMmaRows * hd * 4;
    const bool f16k = kv_half_keys(kc);
    m.qcodes = m.qf + (f16k ? 2 * (hd / 16) * 32 * 16 : (hd / 32) * 32 * 16);
    m.qd = m.qcodes + (f16k ? 0 : kMmaRows * hd);
    m.sc = m.qd + align16(f16k ? 0 : kMmaRows * (hd / 32) * 4);
    m.tiles = m.sc + kMmaRows * tile * 4;
    m.k_row = pad_row(kc, hd);
    m.v_row = pad_row(vc, hd);
    m.k_tile = align16(tile * m.k_row);
    m.stage = m.k_tile + align16(tile * m.v_row);
    m.total = m.tiles + stages * m.stage;
    return m;
}

// Tokens [c0, c0 + len) of one stream into a tile: f16 rows one by one into padded rows, the block
// formats as one contiguous run of 16-byte pieces (c0 is a multiple of kAttnSplitMinTokens, so every
// format's run starts aligned; its last piece may run past the last token, never past its page).
__device__ __forceinline__ void load_stream(uint8_t* dst, const uint8_t* src, int len, int tb, int row) {
    if (row == tb) {
        const int bytes = align16(len * tb);
        for (int o = threadIdx.x * 16; o < bytes; o += kSplitThreads * 16) cp_async16(dst + o, src + o);
    } else {
        const int per = tb / 16;
        for (int e = threadIdx.x; e < len * per; e += kSplitThreads) {
            const int t = e / per, o = (e - t * per) * 16;
            cp_async16(dst + t * row + o, src + t * tb + o);
        }
    }
}

// The short form's V sum: a thread per channel pair and token group (tokens t = k, k + G, ...;
// G a power of two, lanes k = tid % G of a pair adjacent), the groups' sums added by shuffles.
__host__ __device__ inline int short_v_groups(int hd) {
    int g = 1;
    while (2 * g * (hd / 2) <= kSplitThreads) g *= 2;
    return g;
}

// The short form's shared memory (attention.cuh), from the split layout's score buffer on: the
// keys and the values of up to `cap` tokens in the tiles' padded rows, then the scores (cap x REP).
// q (and for q8_0 / q4_0 keys its codes and scales) stays where the split form keeps it.
struct ShortSmem {
    int k, v, sc, cap;
};
__host__ __device__ inline ShortSmem short_smem(const MmaSmem& L, int rep) {
    const int avail = L.total - L.sc;
    int cap = min(kAttnShortTokens, avail / (L.k_row + L.v_row + rep * 4)) / kAttnSplitMinTokens * kAttnSplitMinTokens;
    const auto bytes = [&](int n) { return align16(n * L.k_row) + align16(n * L.v_row) + n * rep * 4; };
    while (cap > 0 && bytes(cap) > avail) cap -= kAttnSplitMinTokens;
    ShortSmem s{};
    s.cap = cap;
    s.k = L.sc;
    s.v = s.k + align16(cap * L.k_row);
    s.sc = s.v + align16(cap * L.v_row);
    return s;
}

// Values j and j + 1 (j even) of token row `row` (its bytes in shared memory) as float: f16, fp8's
// e4m3 numbers (the caller applies the scale), or code * d of their 32-block.
template <KvCode VC>
__device__ __forceinline__ float2 short_value2(const uint8_t* row, int j) {
    if constexpr (VC == KvCode::F16) {
        return __half22float2(reinterpret_cast<const __half2*>(row)[j / 2]);
    } else if constexpr (VC == KvCode::FP8) {
        return kv_fp8x2_to_float2(u16_at(row + j));
    } else {
        constexpr int kBlockBytes = VC == KvCode::Q8_0 ? kKvQ8BlockBytes : kKvQ4BlockBytes;
        const uint8_t* blk = row + (j / kQBlock) * kBlockBytes;
        const float d = kv_half_at(blk);
        return make_float2(float(kv_code_at(blk, j % kQBlock, VC)) * d, float(kv_code_at(blk, j % kQBlock + 1, VC)) * d);
    }
}
// src[0, REP) (16-byte aligned where REP is a multiple of 4, 8-byte where 2) into w.
template <int REP>
__device__ __forceinline__ void load_rep(const float* src, float (&w)[REP]) {
    if constexpr (REP % 4 == 0) {
#pragma unroll
        for (int i = 0; i < REP / 4; ++i) {
            const float4 x = reinterpret_cast<const float4*>(src)[i];
            w[4 * i] = x.x;
            w[4 * i + 1] = x.y;
            w[4 * i + 2] = x.z;
            w[4 * i + 3] = x.w;
        }
    } else if constexpr (REP == 2) {
        const float2 x = *reinterpret_cast<const float2*>(src);
        w[0] = x.x;
        w[1] = x.y;
    } else {
#pragma unroll
        for (int r = 0; r < REP; ++r) w[r] = src[r];
    }
}

// Quarter `quarter` (0..3) of the dot products of token row kr's key with the block's REP query
// rows, added to s: of f16 keys the 8-channel pieces quarter, quarter + 4, ... (16-byte loads; fp8
// keys 8-byte loads, their e4m3 numbers: the caller applies the scale), of q8_0 / q4_0 keys the
// 32-blocks quarter, quarter + 4, ... (the q8_0 query's codes qc and scales
// qd: exact int32 block dots times d_k * d_q, as the split form's MMAs).
template <int REP, KvCode KC>
__device__ __forceinline__ void short_key_dot(const uint8_t* kr, const float* qsm, const int8_t* qc, const float* qd, int hd,
                                              int quarter, float (&s)[REP]) {
    if constexpr (kv_half_keys(KC)) {
        for (int c = quarter * 8; c < hd; c += 4 * 8) {
            uint4 w;
            if constexpr (KC == KvCode::F16) {
                w = *reinterpret_cast<const uint4*>(kr + c * 2);
            } else {
                const uint2 b = *reinterpret_cast<const uint2*>(kr + c);
                w = kv_fp8x8_to_half8(b.x, b.y);
            }
            const unsigned words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float2 kf = __half22float2(*reinterpret_cast<const __half2*>(&words[j]));
#pragma unroll
                for (int r = 0; r < REP; ++r) {
                    const float2 qf = *reinterpret_cast<const float2*>(qsm + r * hd + c + 2 * j);
                    s[r] = fmaf(qf.x, kf.x, s[r]);
                    s[r] = fmaf(qf.y, kf.y, s[r]);
                }
            }
        }
    } else {
        constexpr int kBlockBytes = KC == KvCode::Q8_0 ? kKvQ8BlockBytes : kKvQ4BlockBytes;
        for (int b = quarter; b < hd / kQBlock; b += 4) {
            const uint8_t* blk = kr + b * kBlockBytes;
            int dot[REP];
#pragma unroll
            for (int r = 0; r < REP; ++r) dot[r] = 0;
#pragma unroll
            for (int w = 0; w < 4; ++w) {  // codes 4w..4w+3 and 16+4w..16+4w+3
                int k0, k1;
                if constexpr (KC == KvCode::Q8_0) {
                    k0 = int(u32_at2(blk + 2 + 4 * w));
                    k1 = int(u32_at2(blk + 2 + 16 + 4 * w));
                } else {
                    const unsigned u = u32_at2(blk + 2 + 4 * w);
                    k0 = int(__vsub4(u & 0x0f0f0f0fu, 0x08080808u));
                    k1 = int(__vsub4((u >> 4) & 0x0f0f0f0fu, 0x08080808u));
                }
#pragma unroll
                for (int r = 0; r < REP; ++r) {
                    const int8_t* qr = qc + r * hd + b * kQBlock;
                    dot[r] = __dp4a(k0, *reinterpret_cast<const int*>(qr + 4 * w), dot[r]);
                    dot[r] = __dp4a(k1, *reinterpret_cast<const int*>(qr + 16 + 4 * w), dot[r]);
                }
            }
            const float dk = kv_half_at(blk);
#pragma unroll
            for (int r = 0; r < REP; ++r) s[r] += float(dot[r]) * (dk * qd[r * (hd / kQBlock) + b]);
        }
    }
}

// The short form (attention.cuh) by block (g, 0, 0): n_vis <= p.short_tokens tokens, one query.
// `kn`: the kernel's buffer for the new key. Called by every thread of the block.
template <int REP, KvCode KC, KvCode VC>
__device__ void attention_short(const SplitAttentionParams& p, const KvHeadDev& head, int n, uint8_t* smem, float* kn) {
    __shared__ float inv_s[REP];
    __shared__ float2 rope_cs[kAttnSplitMaxHeadDim / 2];
    const int g = blockIdx.x, hd = int(p.head_dim), tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int ktb = int(kv_token_bytes(KC, hd)), vtb = int(kv_token_bytes(VC, hd));
    const MmaSmem L = mma_smem(hd, KC, VC, p.tile, p.stages);
    const ShortSmem S = short_smem(L, REP);
    float* qsm = reinterpret_cast<float*>(smem + L.qs);  // [REP][hd]: q, later the output rows
    uint8_t* ks = smem + S.k;
    uint8_t* vs = smem + S.v;
    float* sc = reinterpret_cast<float*>(smem + S.sc);  // [n][REP]: scores, then exponentials
    const bool rope = p.rope.q != nullptr;
    // Every visible token's key and value. With `rope` the pages hold earlier steps' tokens only
    // (this kernel writes the new one): copied before waiting for the previous kernel, as are the
    // RoPE's angles (the position is in the step block, written before the step).
    const auto copy = [&] {
        load_stream(ks, reinterpret_cast<const uint8_t*>(head.k), n, ktb, L.k_row);
        load_stream(vs, reinterpret_cast<const uint8_t*>(head.v), n, vtb, L.v_row);
        cp_async_commit();
    };
    const int half = rope ? int(p.rope.n_rot / 2) : 0;
    int64_t pos = 0;
    KvHeadDev sh{};
    if (rope) {
        copy();
        pos = *p.rope.pos0;
        sh = p.rope.heads[g];
        for (int i = tid; i < half; i += kSplitThreads) rope_cs[i] = rope_angle(i, pos, p.rope.theta_scale);
    }
    pdl_wait();
    pdl_launch_dependents();  // this block is resident already: the next kernel's blocks may start loading
    if (!rope) copy();
    const float* qg = p.q + int64_t(g) * REP * hd;
    float* kg = rope ? p.rope.k + int64_t(g) * hd : nullptr;
    {  // q and the new key, all loads issued before any store
        const int nq = REP * hd, nk = rope ? hd : 0;
        strided_batches<kSplitThreads, 8>(
            nq + nk, [&](int64_t e) { return e < nq ? qg[e] : kg[e - nq]; },
            [&](int64_t e, float v) {
                if (e < nq) qsm[e] = v;
                else kn[e - nq] = v;
            });
    }
    if (rope) {  // the split form's RoPE + store, by this block alone
        const int64_t slot = sh.n_tokens;
        __syncthreads();
        pdl_trace_mark(11);
        for (int e = tid; e < (REP + 1) * half; e += kSplitThreads) {  // the REP rows of q, then k
            const int r = e / half, i = e - r * half;
            rope_rotate_pair(r < REP ? qsm + r * hd : kn, i, rope_cs[i], p.rope.n_rot, p.rope.neox);
        }
        __syncthreads();
        pdl_trace_mark(12);
        const float* vg = p.rope.v + int64_t(g) * hd;
        for (int d = tid; d < hd; d += kSplitThreads) kg[d] = kn[d];
        for (int e = tid; e < REP * hd; e += kSplitThreads) p.rope.q[int64_t(g) * REP * hd + e] = qsm[e];
        kv_store_row(KC, kn, reinterpret_cast<uint8_t*>(sh.k) + slot * ktb, hd, tid, kSplitThreads, sh.k_scale);
        kv_store_row(VC, vg, reinterpret_cast<uint8_t*>(sh.v) + slot * vtb, hd, tid, kSplitThreads, sh.v_scale);
        if (slot < n) {  // its copy in shared memory: the same bytes, once the copies have landed there
            cp_async_wait<0>();
            __syncthreads();
            kv_store_row(KC, kn, ks + slot * L.k_row, hd, tid, kSplitThreads, sh.k_scale);
            kv_store_row(VC, vg, vs + slot * L.v_row, hd, tid, kSplitThreads, sh.v_scale);
        }
    }
    // q8_0 / q4_0 keys: q as q8_0, the CPU reader's prepare_query (the split form's codes).
    int8_t* qc = reinterpret_cast<int8_t*>(smem + L.qcodes);
    float* qd = reinterpret_cast<float*>(smem + L.qd);
    if constexpr (!kv_half_keys(KC)) {
        __syncthreads();  // q rotated
        quantize_query_q8_0(qsm, REP * (hd / kQBlock), qc, qd, nullptr);
    }
    cp_async_wait<0>();
    __syncthreads();  // keys, values (and the new row), q and its codes
    pdl_trace_mark(13);
    // Scores: 8 tokens per warp, each token's row in 4 quarters (16-byte pieces or 32-blocks
    // q, q + 4, ...) by lanes t, t + 8, t + 16, t + 24, added by two shuffles.
    const int quarter = lane >> 3;
    const float score_scale = KC == KvCode::FP8 ? p.scale * head.k_scale : p.scale;
    for (int t0 = warp * 8; t0 < n; t0 += kSplitWarps * 8) {
        const int t = t0 + (lane & 7);
        float s[REP];
#pragma unroll
        for (int r = 0; r < REP; ++r) s[r] = 0.0f;
        short_key_dot<REP, KC>(ks + min(t, n - 1) * L.k_row, qsm, qc, qd, hd, quarter, s);
#pragma unroll
        for (int r = 0; r < REP; ++r) {
            s[r] += __shfl_xor_sync(0xffffffffu, s[r], 8);
            s[r] += __shfl_xor_sync(0xffffffffu, s[r], 16);
        }
        if (t < n && quarter == 0) {
#pragma unroll
            for (int r = 0; r < REP; ++r) sc[t * REP + r] = s[r] * score_scale;
        }
    }
    __syncthreads();
    pdl_trace_mark(14);
    // Softmax per query head: a warp per row; p = e * float(1 / double(sum)) (ggml_soft_max).
    for (int r = warp; r < REP; r += kSplitWarps) {
        float mx = -INFINITY;
        for (int t = lane; t < n; t += 32) mx = fmaxf(mx, sc[t * REP + r]);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int t = lane; t < n; t += 32) {
            const float e = expf(sc[t * REP + r] - mx);
            sc[t * REP + r] = e;
            sum += e;
        }
        sum = warp_sum(sum);
        // fp8 values: the stream's scale once per row, not per token.
        if (lane == 0) inv_s[r] = sum > 0.0f ? float(1.0 / double(sum)) * (VC == KvCode::FP8 ? head.v_scale : 1.0f) : 0.0f;
    }
    __syncthreads();
    pdl_trace_mark(15);
    // The V sum (short_v_groups); q's rows (written back above) take the output.
    const int G = short_v_groups(hd), k = tid % G, j = tid / G;  // pair j: channels 2j, 2j + 1
    const bool mine = j < hd / 2;
    float a0[REP], a1[REP];
#pragma unroll
    for (int r = 0; r < REP; ++r) a0[r] = a1[r] = 0.0f;
    if (mine) {
        for (int t = k; t < n; t += G) {
            const float2 v = short_value2<VC>(vs + t * L.v_row, 2 * j);
            float w[REP];
            load_rep<REP>(sc + t * REP, w);
#pragma unroll
            for (int r = 0; r < REP; ++r) {
                a0[r] = fmaf(w[r], v.x, a0[r]);
                a1[r] = fmaf(w[r], v.y, a1[r]);
            }
        }
    }
    for (int o = 1; o < G; o <<= 1) {
#pragma unroll
        for (int r = 0; r < REP; ++r) {
            a0[r] += __shfl_xor_sync(0xffffffffu, a0[r], o);
            a1[r] += __shfl_xor_sync(0xffffffffu, a1[r], o);
        }
    }
    if (mine && k == 0) {
#pragma unroll
        for (int r = 0; r < REP; ++r) {
            const float2 o = make_float2(a0[r] * inv_s[r], a1[r] * inv_s[r]);
            *reinterpret_cast<float2*>(p.out + (int64_t(g) * REP + r) * hd + 2 * j) = o;
            *reinterpret_cast<float2*>(qsm + r * hd + 2 * j) = o;
        }
    }
    if (p.out_q8.qs) {  // the group's rows of out, contiguous, whole 32-element blocks
        __syncthreads();
        pdl_trace_mark(16);
        const int64_t b0 = int64_t(g) * REP * hd / kQBlock;
        for (int b = warp; b < REP * hd / kQBlock; b += kSplitWarps) {
            quantize_block_q8_0(qsm[b * kQBlock + lane], b0 + b, lane, p.out_q8.qs, p.out_q8.s);
        }
    }
    pdl_trace_mark(17);
}

// ---- the stream form (one query) -----------------------------------------------------------------
// Decode (n_q == 1) over more than the short form's tokens, with p.stream_stages > 0 (attention.cuh).
// Each warp of the block streams its own tiles of the block's stretch (tile j of the stretch goes to
// warp j % 4) through a ring of p.stream_stages tiles of its own in shared memory (cp.async; a warp
// waits for its own copies and syncs with __syncwarp, never with the block), keeping the online
// softmax state of its REP query heads in registers:
//   scores  f16 and fp8 keys: two lanes per token (16 tokens a tile), each half a row against q
//           in f32 FMAs (fp8: its e4m3 numbers, the sum times the keys' scale), the halves added
//           by a shuffle; q8_0 / q4_0 keys: a lane per token (32 a tile),
//           dp4a of the codes against the query quantized to q8_0 (the CPU's prepare_query), the
//           exact int32 per 32-block times d_k * d_q (q4_0: sum nib * q - 8 * sum q, the same integer);
//   values  a lane per hd / 32 adjacent channels: for each token of the tile its probabilities
//           (shared memory, broadcast) times the value as f16 or e4m3 (fp8: the output times the
//           values' scale at the end), or (p * d) * code for q8_0 / q4_0.
// At the end the block's four warps are merged (log-sum-exp weights) into the split's partial.
// Against the tensor-core form: the same f32-exact products (q as f32 against fp16 keys; the same
// integers), f32 sums in another order.
constexpr int kStreamWarps = kSplitWarps;
// The stream forms' merge buffers (stream_write_partial): o [warps][rep][hd], then max and sum [warps][rep], f32.
__host__ __device__ constexpr int stream_merge_bytes(int rep, int hd) { return kStreamWarps * rep * (hd + 2) * 4; }
constexpr int kStreamMaxRep = 8;
__host__ __device__ constexpr int stream_tile(KvCode kc) { return kv_half_keys(kc) ? 16 : 32; }
// A key row in the ring: f16 and fp8 rows as two halves (head_dim bytes, fp8: head_dim / 2), each
// followed by 16 bytes of padding (a token's two lanes, and the next tokens', read other banks);
// block formats unpadded.
__host__ __device__ constexpr int stream_krow(KvCode kc, int hd) {
    return kv_half_keys(kc) ? int(kv_token_bytes(kc, hd)) + 32 : int(kv_token_bytes(kc, hd));
}
// Where the stream form's shared memory goes, from `base` on (the tensor-core form's q rows stay
// below it: the RoPE writes them and the merge reads them). q: f16 / fp8 keys: [rep][2][hd / 2 + 4] f32
// (each half padded); block formats: codes [rep][hd] int8, scales and quant sums [rep][hd / 32].
// p: [warps][tile][rep] probabilities. ring: [warps][stages] tiles of keys then values.
struct StreamSmem {
    int q, qd, qsum, p, ring, v, stage, total;
};
__host__ __device__ inline StreamSmem stream_smem(int base, int hd, KvCode kc, KvCode vc, int stages) {
    StreamSmem s{};
    const bool f16k = kv_half_keys(kc);
    const int tw = stream_tile(kc);
    s.q = base;
    s.qd = s.q + align16(f16k ? kStreamMaxRep * 2 * (hd / 2 + 4) * 4 : kStreamMaxRep * hd);
    s.qsum = s.qd + (f16k ? 0 : kStreamMaxRep * (hd / kQBlock) * 4);
    s.p = s.qsum + (f16k ? 0 : kStreamMaxRep * (hd / kQBlock) * 4);
    s.ring = s.p + align16(kStreamWarps * tw * kStreamMaxRep * 4);
    s.v = align16(tw * stream_krow(kc, hd));
    s.stage = s.v + align16(tw * int(kv_token_bytes(vc, hd)));
    s.total = s.ring + kStreamWarps * stages * s.stage;
    return s;
}

// Channels j of a value row (its bytes in shared memory) as float, for j in [j0, j0 + C): f16,
// fp8's e4m3 numbers (the caller applies the scale), or the code (q8_0 / q4_0; the caller
// multiplies by the block's scale, returned in d).
template <KvCode VC, int C>
__device__ __forceinline__ void stream_values(const uint8_t* row, int j0, float (&v)[C], float& d) {
    if constexpr (VC == KvCode::FP8) {
        static_assert(C % 2 == 0);
#pragma unroll
        for (int c = 0; c < C; c += 2) {
            const float2 f = kv_fp8x2_to_float2(u16_at(row + j0 + c));
            v[c] = f.x;
            v[c + 1] = f.y;
        }
        d = 1.0f;
    } else if constexpr (VC == KvCode::F16) {
        const __half2* h = reinterpret_cast<const __half2*>(row) + j0 / 2;
#pragma unroll
        for (int c = 0; c < C / 2; ++c) {
            const float2 f = __half22float2(h[c]);
            v[2 * c] = f.x;
            v[2 * c + 1] = f.y;
        }
        if constexpr (C % 2 == 1) v[C - 1] = __half2float(reinterpret_cast<const __half*>(row)[j0 + C - 1]);
        d = 1.0f;
    } else {
        constexpr int kBlockBytes = VC == KvCode::Q8_0 ? kKvQ8BlockBytes : kKvQ4BlockBytes;
        const uint8_t* blk = row + (j0 / kQBlock) * kBlockBytes;  // C divides 32: one block
        d = kv_half_at(blk);
#pragma unroll
        for (int c = 0; c < C; ++c) v[c] = float(kv_code_at(blk, j0 % kQBlock + c, VC));
    }
}

// The four warps' states of a stream form (wo [warps][REP][hd], then wm and wl [warps][REP] in
// shared memory, written before a barrier) into one partial: o = sum_w o_w exp(m_w - m), l likewise.
template <int REP, KvCode VC, typename PartRow>
__device__ void stream_write_partial(const KvHeadDev& head, const float* wo, int hd, PartRow part_row) {
    const float* wm = wo + kStreamWarps * REP * hd;
    const float* wl = wm + kStreamWarps * REP;
    for (int e = threadIdx.x; e < REP * hd; e += kSplitThreads) {
        const int r = e / hd, dd = e - r * hd;
        float m = -INFINITY;
#pragma unroll
        for (int w = 0; w < kStreamWarps; ++w) m = fmaxf(m, wm[w * REP + r]);
        float o = 0.0f, l = 0.0f;
#pragma unroll
        for (int w = 0; w < kStreamWarps; ++w) {
            const float f = wm[w * REP + r] == -INFINITY ? 0.0f : expf(wm[w * REP + r] - m);
            o += wo[(w * REP + r) * hd + dd] * f;
            l += wl[w * REP + r] * f;
        }
        float* row = part_row(r);
        row[dd] = VC == KvCode::FP8 ? o * head.v_scale : o;  // (l unscaled: the merge divides by it)
        if (dd == 0) {
            row[hd] = m;
            row[hd + 1] = l;
        }
    }
}

// One split's stretch [t_begin, t_end) of head `head` for one query (hd / 32 == C channels per
// lane): its partial (o, max, sum) per query head into part_row(r) (when write_partial). q: the
// block's REP rows in shared memory (after the RoPE). Every thread of the block calls.
template <int REP, KvCode KC, KvCode VC, int C, typename PartRow>
__device__ void attention_stream(const SplitAttentionParams& p, const KvHeadDev& head, const float* q, uint8_t* smem,
                                 int base, int64_t t_begin, int64_t t_end, bool write_partial, PartRow part_row) {
    constexpr int hd = C * 32;
    constexpr int TW = stream_tile(KC);
    constexpr int kBlocks = hd / kQBlock;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int stages = p.stream_stages;
    const StreamSmem S = stream_smem(base, hd, KC, VC, stages);
    constexpr int krow = stream_krow(KC, hd);
    constexpr int ktb = int(kv_token_bytes(KC, hd)), vtb = int(kv_token_bytes(VC, hd));
    constexpr int qrow = hd / 2 + 4;  // f16 / fp8 keys: floats per half row of q
    float* qp = reinterpret_cast<float*>(smem + S.q);
    int8_t* qc = reinterpret_cast<int8_t*>(smem + S.q);
    float* qd = reinterpret_cast<float*>(smem + S.qd);
    int* qsum = reinterpret_cast<int*>(smem + S.qsum);
    // q in the form the scores read it.
    if constexpr (kv_half_keys(KC)) {
        for (int e = tid; e < REP * hd; e += kSplitThreads) {
            const int r = e / hd, dd = e - r * hd, h = dd / (hd / 2);
            qp[(r * 2 + h) * qrow + dd - h * (hd / 2)] = q[e];
        }
    } else {
        quantize_query_q8_0(q, REP * kBlocks, qc, qd, qsum);
    }
    __syncthreads();
    const int64_t n_tok = t_end - t_begin;
    const int n_wt = int((n_tok + TW - 1) / TW);  // tiles of the stretch
    const float score_scale = KC == KvCode::FP8 ? p.scale * head.k_scale : p.scale;
    const int mine = n_wt > warp ? (n_wt - warp + kStreamWarps - 1) / kStreamWarps : 0;
    uint8_t* ring = smem + S.ring + warp * stages * S.stage;
    float* pw = reinterpret_cast<float*>(smem + S.p) + warp * TW * kStreamMaxRep;
    const auto tile_start = [&](int j) { return t_begin + int64_t(warp + kStreamWarps * j) * TW; };
    const auto issue = [&](int j) {  // this warp's j-th tile into its stage j % stages
        if (j < mine) {
            const int64_t c0 = tile_start(j);
            const int len = int(min(int64_t(TW), t_end - c0));
            uint8_t* st = ring + (j % stages) * S.stage;
            const uint8_t* ks = reinterpret_cast<const uint8_t*>(head.k) + c0 * ktb;
            const uint8_t* vs = reinterpret_cast<const uint8_t*>(head.v) + c0 * vtb;
            if constexpr (kv_half_keys(KC)) {  // 16-byte pieces into the padded halves
                constexpr int per = ktb / 16, half = per / 2;
                for (int e = lane; e < len * per; e += 32) {
                    const int t = e / per, o = e - t * per;
                    cp_async16(st + t * krow + o * 16 + (o >= half ? 16 : 0), ks + t * ktb + o * 16);
                }
            } else {  // one contiguous run (c0 is a multiple of 16 tokens: 16-byte aligned; the last piece stays in the page)
                const int bytes = align16(len * ktb);
                for (int o = lane * 16; o < bytes; o += 32 * 16) cp_async16(st + o, ks + o);
            }
            const int vbytes = align16(len * vtb);
            for (int o = lane * 16; o < vbytes; o += 32 * 16) cp_async16(st + S.v + o, vs + o);
        }
        cp_async_commit();
    };
    for (int j = 0; j < stages - 1; ++j) issue(j);
    float m_run[REP], l_run[REP], acc[REP][C];
#pragma unroll
    for (int r = 0; r < REP; ++r) {
        m_run[r] = -INFINITY;
        l_run[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < C; ++c) acc[r][c] = 0.0f;
    }
    for (int j = 0; j < mine; ++j) {
        issue(j + stages - 1);  // into the stage tile j - 1 used (the __syncwarp at the loop's end freed it)
        switch (stages) {  // tile j's group done; stages - 1 newer ones may still be in flight
            case 1: cp_async_wait<0>(); break;
            case 2: cp_async_wait<1>(); break;
            case 3: cp_async_wait<2>(); break;
            default: cp_async_wait<3>(); break;
        }
        __syncwarp();
        const uint8_t* kt = ring + (j % stages) * S.stage;
        const uint8_t* vt = kt + S.v;
        const int len = int(min(int64_t(TW), t_end - tile_start(j)));
        // Scores of this lane's token (f16: its half row; the pair adds them).
        float s[REP];
#pragma unroll
        for (int r = 0; r < REP; ++r) s[r] = 0.0f;
        if constexpr (kv_half_keys(KC)) {
            constexpr int eb = KC == KvCode::F16 ? 2 : 1;  // bytes per key value
            const int tt = lane >> 1, h = lane & 1;
            if (tt < len) {
                const uint8_t* kr = kt + tt * krow + h * (eb * hd / 2 + 16);
                const float* qh = qp + h * qrow;
                // 8 values per step as four fp16 pairs (fp8: two steps per 16-byte load, bank-conflict
                // free over a quarter warp's rows where 8-byte loads would not be).
                const auto dot8 = [&](int c, unsigned w0, unsigned w1, unsigned w2, unsigned w3) {
                    const float2 k0 = __half22float2(*reinterpret_cast<const __half2*>(&w0));
                    const float2 k1 = __half22float2(*reinterpret_cast<const __half2*>(&w1));
                    const float2 k2 = __half22float2(*reinterpret_cast<const __half2*>(&w2));
                    const float2 k3 = __half22float2(*reinterpret_cast<const __half2*>(&w3));
#pragma unroll
                    for (int r = 0; r < REP; ++r) {
                        const float4 a = *reinterpret_cast<const float4*>(qh + r * 2 * qrow + c);
                        const float4 b = *reinterpret_cast<const float4*>(qh + r * 2 * qrow + c + 4);
                        float x = s[r];
                        x = fmaf(a.x, k0.x, x);
                        x = fmaf(a.y, k0.y, x);
                        x = fmaf(a.z, k1.x, x);
                        x = fmaf(a.w, k1.y, x);
                        x = fmaf(b.x, k2.x, x);
                        x = fmaf(b.y, k2.y, x);
                        x = fmaf(b.z, k3.x, x);
                        x = fmaf(b.w, k3.y, x);
                        s[r] = x;
                    }
                };
                if constexpr (KC == KvCode::F16) {
#pragma unroll 4
                    for (int c = 0; c < hd / 2; c += 8) {
                        const uint4 w = *reinterpret_cast<const uint4*>(kr + 2 * c);
                        dot8(c, w.x, w.y, w.z, w.w);
                    }
                } else {
#pragma unroll 2
                    for (int c = 0; c < hd / 2; c += 16) {
                        const uint4 w = *reinterpret_cast<const uint4*>(kr + c);
                        const uint4 a = kv_fp8x8_to_half8(w.x, w.y), b = kv_fp8x8_to_half8(w.z, w.w);
                        dot8(c, a.x, a.y, a.z, a.w);
                        dot8(c + 8, b.x, b.y, b.z, b.w);
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < REP; ++r) s[r] += __shfl_xor_sync(0xffffffffu, s[r], 1);
        } else {
            constexpr int kBlockBytes = KC == KvCode::Q8_0 ? kKvQ8BlockBytes : kKvQ4BlockBytes;
            if (lane < len) {
                const uint8_t* kr = kt + lane * ktb;
#pragma unroll 2
                for (int b = 0; b < kBlocks; ++b) {
                    const uint8_t* blk = kr + b * kBlockBytes;
                    const float dk = kv_half_at(blk);
                    unsigned w[8];
                    if constexpr (KC == KvCode::Q8_0) {
#pragma unroll
                        for (int i = 0; i < 8; ++i) w[i] = u32_at2(blk + 2 + 4 * i);
                    } else {
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            const unsigned x = u32_at2(blk + 2 + 4 * i);
                            w[i] = x & 0x0f0f0f0fu;             // values 4i .. 4i + 3
                            w[i + 4] = (x >> 4) & 0x0f0f0f0fu;  // values 16 + 4i ..
                        }
                    }
#pragma unroll
                    for (int r = 0; r < REP; ++r) {
                        const int4 a = *reinterpret_cast<const int4*>(qc + (r * kBlocks + b) * kQBlock);
                        const int4 c = *reinterpret_cast<const int4*>(qc + (r * kBlocks + b) * kQBlock + 16);
                        int dot = __dp4a(int(w[0]), a.x, 0);
                        dot = __dp4a(int(w[1]), a.y, dot);
                        dot = __dp4a(int(w[2]), a.z, dot);
                        dot = __dp4a(int(w[3]), a.w, dot);
                        dot = __dp4a(int(w[4]), c.x, dot);
                        dot = __dp4a(int(w[5]), c.y, dot);
                        dot = __dp4a(int(w[6]), c.z, dot);
                        dot = __dp4a(int(w[7]), c.w, dot);
                        if constexpr (KC == KvCode::Q4_0) dot -= 8 * qsum[r * kBlocks + b];
                        s[r] += float(dot) * (dk * qd[r * kBlocks + b]);
                    }
                }
            }
        }
        // Online softmax over the tile, per query head; the probabilities into pw for the values.
        constexpr bool kPair = kv_half_keys(KC);  // two lanes per token
        const int tt = kPair ? lane >> 1 : lane;
        const bool real = tt < len;
#pragma unroll
        for (int r = 0; r < REP; ++r) {
            const float sv = real ? s[r] * score_scale : -INFINITY;
            const float m_new = fmaxf(m_run[r], warp_max(sv));  // len >= 1: finite
            const float f = expf(m_run[r] - m_new);              // 0 while m_run is -inf
            const float e = real ? expf(sv - m_new) : 0.0f;
            const float sum = warp_sum(kPair && (lane & 1) ? 0.0f : e);
            l_run[r] = l_run[r] * f + sum;
            m_run[r] = m_new;
#pragma unroll
            for (int c = 0; c < C; ++c) acc[r][c] *= f;
            if (real && (!kPair || !(lane & 1))) pw[tt * kStreamMaxRep + r] = e;
        }
        __syncwarp();
        // Values: this lane's C channels of every token of the tile.
        for (int t = 0; t < len; ++t) {
            float v[C], d;
            stream_values<VC, C>(vt + t * vtb, lane * C, v, d);
            float pr[REP];
            load_rep<REP>(pw + t * kStreamMaxRep, pr);
#pragma unroll
            for (int r = 0; r < REP; ++r) {
                const float pd = VC == KvCode::F16 ? pr[r] : pr[r] * d;
#pragma unroll
                for (int c = 0; c < C; ++c) acc[r][c] = fmaf(pd, v[c], acc[r][c]);
            }
        }
        __syncwarp();  // this stage and pw are rewritten next
    }
    cp_async_wait<0>();  // (only empty groups can be left)
    pdl_launch_dependents();  // as the tensor-core form: after the loads
    __syncthreads();  // every warp is done with its ring: the merge buffers reuse it
    float* wo = reinterpret_cast<float*>(smem + S.ring);        // [warps][REP][hd]
    float* wm = wo + kStreamWarps * REP * hd;                   // [warps][REP]
    float* wl = wm + kStreamWarps * REP;
#pragma unroll
    for (int r = 0; r < REP; ++r) {
#pragma unroll
        for (int c = 0; c < C; ++c) wo[(warp * REP + r) * hd + lane * C + c] = acc[r][c];
        if (lane == 0) {
            wm[warp * REP + r] = m_run[r];
            wl[warp * REP + r] = l_run[r];
        }
    }
    __syncthreads();
    if (write_partial) stream_write_partial<REP, VC>(head, wo, hd, part_row);
}

// ---- the stream form on tensor cores (one query, f16 / fp8 pages, head_dim 64 / 128) ----------------
// attention.cuh says when it runs. Each warp takes every 4th 16-token tile of the split's stretch,
// as the ring form does, but reads a tile straight from global memory (through L2: .cg loads see
// the block's own store of the step's token) into registers laid out as the m16n8k16 MMAs'
// fragments, the next tile's keys while this tile's values are summed and its values while the
// next scores are taken, its next kStreamMmaAhead tiles requested into L2 by a bulk prefetch each
// (one instruction per tile's keys or values, no registers or shared memory held for them):
//   scores  S = Q K^T with the group's query heads as rows and the tile's tokens as two n-tiles:
//           rows 0..7 q hi, rows 8..15 q lo (split once per block, A fragments in shared memory),
//           so one MMA per k-step gives both parts of a score, against the keys as fp16
//           numbers. A lane's B fragments for token 8 n + gid are one load of the 8 dims
//           32 c + 8 tig .. + 7 (16 bytes of f16, 8 of fp8 converted), which serve k-steps 2c and
//           2c + 1, q's A fragments taken at the same dims: the sum over the dims in another order,
//           the same products;
//   softmax each head's 16 scores lie in the 4 lanes of its row (shuffles over tig), its running
//           max and sum in registers;
//   values  O += P V with P's A fragments the two n-tiles' score accumulators as they lie (the
//           flash-attention register reuse), scaled by 2^15 before the hi / lo split (so lo stays
//           a normal fp16 number down to p ~ 4e-6; undone at the end), hi in rows 0..7 and lo in
//           rows 8..15 (one MMA, the two parts added at the end); a lane's B fragments pair two
//           tokens' values at one dim (a PRMT of two loads of the dims 64 h + 8 gid .. + 7 of
//           tokens 2 tig, 2 tig + 1, 2 tig + 8, 2 tig + 9), so n-tile 8 h + e holds the dims
//           64 h + 8 n + e.
// Per 16 tokens a warp issues 16 loads and 32 MMAs (head_dim 128) where the ring form's lanes run
// ~20 f32 FMAs per token and channel group; the four warps' states are merged as the ring form's.
constexpr int kStreamMmaAhead = 3;  // a warp's tiles requested into L2 ahead of the one it loads
// Its shared memory from `base` on: the warps' merge buffers (o [warps][rep][hd], max and sum
// [warps][rep]), then q's A fragments (hd / 16 k-steps of 32 lanes' uint4).
__host__ __device__ constexpr int stream_mma_smem(int rep, int hd) {
    return stream_merge_bytes(rep, hd) + hd / 16 * 32 * 16;
}

// Values e0 .. e0 + 7 of a page row (f16: 16 bytes, fp8: 8 bytes) as loaded, through L2 (.cg);
// `asm volatile` so that the compiler keeps the loads where the loop issues them, ahead of the MMAs
// that run while they are in flight (it would otherwise sink each next to its first use).
template <KvCode C>
__device__ __forceinline__ Raw8<C> load8_raw(const uint8_t* row, int e0) {
    Raw8<C> r;
    if constexpr (C == KvCode::F16) {
        asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                     : "l"(row + 2 * e0));
    } else {
        asm volatile("ld.global.cg.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(row + e0));
    }
    return r;
}

// The step's RoPE and KV store inside a decode launch (p.rope, one query; attention.cuh): every
// block rotates its `rep` q rows (shared memory, q_rows: rep x head_dim floats); the block whose
// stretch [t_begin, t_end) holds the new token's slot (split 0 when the slot is past n_vis) rotates
// k, writes it back and stores k and v in their formats (rope_store_kv's arithmetic, the same bits),
// fenced for the reads of this launch (tile copies through L2, bulk copies). Every thread of the
// block calls, after its q rows are written; the caller's barrier follows.
template <KvCode KC, KvCode VC>
__device__ void rope_store_in_split(const SplitAttentionParams& p, int g, int z, int rep, int64_t t_begin, int64_t t_end,
                                    int64_t n_vis, float* q_rows, float* kn) {
    const int hd = int(p.head_dim), tid = threadIdx.x;
    const int64_t pos = *p.rope.pos0, slot = p.rope.heads[g].n_tokens;
    const int half = int(p.rope.n_rot / 2);
    const bool owner = slot < n_vis ? (slot >= t_begin && slot < t_end) : z == 0;
    float* kg = p.rope.k + int64_t(g) * hd;
    if (owner) {
        for (int d = tid; d < hd; d += kSplitThreads) kn[d] = kg[d];
    }
    __syncthreads();
    for (int e = tid; e < rep * half; e += kSplitThreads) rope_pair(q_rows + (e / half) * hd, e % half, pos, p.rope);
    if (owner) {
        for (int e = tid; e < half; e += kSplitThreads) rope_pair(kn, e, pos, p.rope);
    }
    __syncthreads();
    if (owner) {
        const KvHeadDev sh = p.rope.heads[g];
        for (int d = tid; d < hd; d += kSplitThreads) kg[d] = kn[d];
        kv_store_row(KC, kn, reinterpret_cast<uint8_t*>(sh.k) + slot * kv_token_bytes(KC, hd), hd, tid, kSplitThreads, sh.k_scale);
        kv_store_row(VC, p.rope.v + int64_t(g) * hd, reinterpret_cast<uint8_t*>(sh.v) + slot * kv_token_bytes(VC, hd), hd, tid,
                     kSplitThreads, sh.v_scale);
        __threadfence();              // the tile copies read the new slot through L2
        fence_proxy_async_global();  // and the bulk copies through the async proxy
    }
}

// The end of a decode launch, after the block's partials are written: the block's partials are
// published (fence) before its arrival is counted; the last block of (query group qg, KV head g)
// to arrive merges (merge_splits, queries q0 .. q0 + nq - 1, the first `active` splits), writes the
// rotated q rows back with p.rope (every block of the group has read q by then) and, with
// p.out_q8, the merged rows as q8_0. q_rows: the block's q rows in shared memory (REP x head_dim
// floats at least), rewritten. Every thread of the block calls. MERGE_BATCH: merge_splits' BATCH.
template <int REP, int MERGE_BATCH>
__device__ void arrive_and_merge(const SplitAttentionParams& p, int g, int qg, int q0, int nq, int active, float* q_rows) {
    __shared__ bool merger;
    const int hd = int(p.head_dim), tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // The barrier orders the block's partial writes before thread 0's fence, which makes them
    // visible at device scope before its arrival (a release); the merger's fence after it orders
    // the partial reads after the other arrivals (an acquire), and the barrier passes that on.
    __syncthreads();
    unsigned* arrivals = p.arrivals + int64_t(qg) * p.n_head_kv + g;
    if (tid == 0) {
        __threadfence();
        merger = atomicAdd(arrivals, 1u) == unsigned(p.splits - 1);
        if (merger) __threadfence();
    }
    __syncthreads();
    if (!merger) return;
    if (p.rope.q != nullptr) {  // as rope_store leaves them
        for (int e = tid; e < REP * hd; e += kSplitThreads) p.rope.q[int64_t(g) * REP * hd + e] = q_rows[e];
        __syncthreads();  // q's rows are merge_splits' `keep` below
    }
    float* keep = p.out_q8.qs ? q_rows : nullptr;  // REP * hd floats (one query)
    for (int i = q0; i < q0 + nq; ++i) {
        merge_splits<REP, MERGE_BATCH>(p, g, i, active, keep);
        __syncthreads();  // merge_splits' weights are rewritten by the next query's merge
    }
    if (keep) {  // one query: the group's rows of out, contiguous, whole 32-element blocks
        __syncthreads();
        const int64_t b0 = int64_t(g) * REP * hd / kQBlock;
        for (int b = warp; b < REP * hd / kQBlock; b += kSplitWarps) {
            quantize_block_q8_0(keep[b * kQBlock + lane], b0 + b, lane, p.out_q8.qs, p.out_q8.s);
        }
    }
    if (tid == 0) *arrivals = 0;  // ready for the next call (a kernel boundary orders it)
}

// A warp's state into the merge buffers (wo [warps][REP][HD], wm and wl [warps][REP]), then the
// block's partial (stream_write_partial). Every thread of the block calls.
template <int REP, KvCode VC, int HD, typename PartRow>
__device__ void mma_state_write_partial(const MmaTileState<HD>& st, const KvHeadDev& head, float* wo, bool write_partial,
                                        PartRow part_row) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    float* wm = wo + kStreamWarps * REP * HD;
    float* wl = wm + kStreamWarps * REP;
    if (gid < REP) {
        float* o = wo + (warp * REP + gid) * HD;
#pragma unroll
        for (int nt = 0; nt < HD / 8; ++nt) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {  // P hi's sums plus P lo's (f16 / fp8: both x 2^15; q8_0 / q4_0: lo x 2^11)
                const int c = 2 * tig + i;
                if constexpr (kv_half_keys(VC)) {
                    o[hv_dim(nt, c)] = (st.acc[nt][i] + st.acc[nt][i + 2]) * kPScaleInv;
                } else {
                    o[qv_dim<VC>(nt, c)] = st.acc[nt][i] + st.acc[nt][i + 2] * kLoInv;
                }
            }
        }
        if (tig == 0) {
            wm[warp * REP + gid] = st.m_run;
            wl[warp * REP + gid] = st.l_run;
        }
    }
    __syncthreads();
    if (write_partial) stream_write_partial<REP, VC>(head, wo, HD, part_row);
}

template <int REP, KvCode KC, KvCode VC, int HD, typename PartRow>
__device__ void attention_stream_mma(const SplitAttentionParams& p, const KvHeadDev& head, const float* q, uint8_t* smem,
                                     int base, int64_t t_begin, int64_t t_end, bool write_partial, PartRow part_row) {
    static_assert(REP <= 8 && (HD == 64 || HD == 128) && kv_half_keys(KC) && kv_half_keys(VC));
    constexpr int TW = kStreamMmaTile, KC32 = HD / 32, KS = HD / 16, VH = HD / 64;
    constexpr int ktb = int(kv_token_bytes(KC, HD)), vtb = int(kv_token_bytes(VC, HD));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    // stream_mma_smem's layout: the warps' merge, o [warps][REP][HD], then max and sum [warps][REP],
    // then q's A fragments, once per block, read per k-step.
    float* wo = reinterpret_cast<float*>(smem + base);
    uint4* qf = reinterpret_cast<uint4*>(smem + base + stream_merge_bytes(REP, HD));  // 16-byte aligned: base is, the buffers' bytes are
    for (int e = threadIdx.x; e < KS * 32; e += kSplitThreads) qf[e] = mma_q_fragment<REP, HD>(q, e / 32);  // e % 32: this lane
    __syncthreads();
    const int64_t n_tok = t_end - t_begin;
    const int n_wt = int((n_tok + TW - 1) / TW);  // tiles of the stretch
    const int mine = n_wt > warp ? (n_wt - warp + kStreamWarps - 1) / kStreamWarps : 0;
    const auto tile_start = [&](int j) { return t_begin + int64_t(warp + kStreamWarps * j) * TW; };
    const uint8_t* kpage = reinterpret_cast<const uint8_t*>(head.k);
    const uint8_t* vpage = reinterpret_cast<const uint8_t*>(head.v);
    const auto request = [&](int j) {  // this warp's j-th tile into L2
        if (lane == 0 && j < mine) {
            const int64_t c0 = tile_start(j);
            const unsigned len = unsigned(min(int64_t(TW), t_end - c0));
            prefetch_l2_bulk(kpage + c0 * ktb, len * unsigned(ktb));
            prefetch_l2_bulk(vpage + c0 * vtb, len * unsigned(vtb));
        }
    };
#pragma unroll
    for (int j = 0; j < kStreamMmaAhead; ++j) request(j);
    const float score_scale = KC == KvCode::FP8 ? p.scale * head.k_scale : p.scale;
    MmaTileState<HD> st;
    // A tile's keys and values as mma_tile_scores / mma_tile_values take them (past its last token:
    // the last real token's bytes). The next tile's keys are loaded once this tile's scores are
    // taken, its values once this tile's are summed, so each load is in flight while the other half
    // of the tile is computed.
    Raw8<KC> kw[2][KC32];
    Raw8<VC> vw[4][VH];
    const auto tile_len = [&](int j) { return int(min(int64_t(TW), t_end - tile_start(j))); };
    const auto load_keys = [&](int j) {
        const int len = tile_len(j);
        const uint8_t* kt = kpage + tile_start(j) * ktb;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
            for (int c = 0; c < KC32; ++c) kw[n][c] = load8_raw<KC>(kt + min(8 * n + gid, len - 1) * ktb, 32 * c + 8 * tig);
        }
    };
    const auto load_values = [&](int j) {
        const int len = tile_len(j);
        const uint8_t* vt = vpage + tile_start(j) * vtb;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int t = min(2 * tig + (i & 1) + 8 * (i >> 1), len - 1);
#pragma unroll
            for (int h = 0; h < VH; ++h) vw[i][h] = load8_raw<VC>(vt + t * vtb, 64 * h + 8 * gid);
        }
    };
    if (mine > 0) {
        load_keys(0);
        load_values(0);
    }
    const auto qfrag = [&](int s) { return qf[s * 32 + lane]; };
    for (int j = 0; j < mine; ++j) {
        request(j + kStreamMmaAhead);
        const int len = tile_len(j);
        float sc[2][2];
        mma_tile_scores<KC, HD>(qfrag, kw, len, score_scale, sc);
        if (j + 1 < mine) load_keys(j + 1);
        mma_tile_values<VC, HD>(sc, vw, len, st);
        if (j + 1 < mine) load_values(j + 1);
    }
    pdl_launch_dependents();  // as the other forms: after the loads
    mma_state_write_partial<REP, VC, HD>(st, head, wo, write_partial, part_row);
}

// ---- the one-query kernel: the tensor-core stream form through a ring of bulk copies ------------
// attention.cuh says when it runs. Its own kernel (not a form of attention_split_kernel, whose other
// forms reserve ~90 KB of shared memory and more registers per block): 4 warps, two blocks per SM.
// Each warp takes every 4th tile of the split's stretch, as the other stream forms, and keeps a ring
// of p.tma_stages tiles in shared memory: its lane 0 requests a tile's keys and values with one bulk
// copy each (cp.async.bulk, the TMA unit; no registers or load instructions held for the bytes in
// flight), completing on the stage's mbarrier, stages - 1 tiles ahead of the one the warp computes.
// A tile is kTmaStageBytes of keys and values (16 f16 tokens of 128 dims, 32 fp8 ones), computed as
// 16-token tiles by the tensor-core stream form's arithmetic (mma_tile_scores / mma_tile_values:
// the same products and sums), its fragments loaded from the ring, q's A fragments in registers.
// Tiles of tokens stored before this step are requested before the wait for the previous kernel
// (PDL), so the first bytes are in flight while it ends; the newest token (this launch's or the
// previous kernel's store) only after it.
constexpr int kTmaStageBytes = 8192;
// (q8_0 / q4_0 pages at 128 dims: 16 / 48 tokens. Tried on the H100, 2026-12-05 (sixth session):
// 16-token q4_0 stages with four blocks an SM (128 registers, which spilled) and 64 splits read 32K
// tokens in 31.0-32.0 us against 29.7 for these stages at two blocks an SM and 32 splits; 128K 87.2
// against 75.7.)
__host__ __device__ constexpr int tma_tile_tokens(KvCode kc, KvCode vc, int hd) {
    const int sub = kTmaStageBytes / (kStreamMmaTile * int(kv_token_bytes(kc, hd) + kv_token_bytes(vc, hd)));
    return (sub < 1 ? 1 : sub) * kStreamMmaTile;
}
// Dynamic shared memory: the warps' mbarriers (kTmaMaxStages each), their rings (whose bytes the
// warps' merge reuses after the loop).
constexpr int kTmaMaxStages = 4;
constexpr int kTmaBarrierBytes = kStreamWarps * kTmaMaxStages * 8;
__host__ __device__ constexpr int tma_ring_bytes(int hd, KvCode kc, KvCode vc, int stages) {
    return kStreamWarps * stages * tma_tile_tokens(kc, vc, hd) * int(kv_token_bytes(kc, hd) + kv_token_bytes(vc, hd));
}
__host__ __device__ constexpr int tma_smem(int rep, int hd, KvCode kc, KvCode vc, int stages) {
    const int ring = tma_ring_bytes(hd, kc, vc, stages), merge = stream_merge_bytes(rep, hd);
    return kTmaBarrierBytes + (ring > merge ? ring : merge);
}

template <int REP, KvCode KC, KvCode VC, int HD>
__global__ void __launch_bounds__(kSplitThreads, 2) attention_stream_tma_kernel(const SplitAttentionParams p) {
    static_assert(REP <= 8 && (HD == 64 || HD == 128));
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ __align__(16) float qs[REP * HD];  // the group's q rows (rotated with p.rope), then the merge's `keep`
    __shared__ float kn[HD];                      // with rope: the new key, rotated
    __shared__ __align__(16) int8_t qcs[kv_half_keys(KC) ? 16 : REP * HD];  // q8_0 / q4_0 keys: q as q8_0 codes
    __shared__ float qds[kv_half_keys(KC) ? 1 : REP * HD / kQBlock];        // and scales
    constexpr int KC32 = HD / 32, KS = HD / 16, VH = HD / 64;
    constexpr int ktb = int(kv_token_bytes(KC, HD)), vtb = int(kv_token_bytes(VC, HD));
    constexpr int TT = tma_tile_tokens(KC, VC, HD), stage_bytes = TT * (ktb + vtb);
    const int g = blockIdx.x, z = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
    const int stages = p.tma_stages;
    // The step block and the pages of earlier steps were written before this step's first kernel.
    const KvHeadDev head = p.heads[g];
    const int64_t n_vis = kv_visible(head, *p.pos0, 0);
    const SplitStretch cut = split_stretch(n_vis, p.splits, p.min_stretch);
    const int64_t t_begin = min(n_vis, int64_t(z) * cut.per), t_end = min(n_vis, t_begin + cut.per);
    const int n_wt = int((t_end - t_begin + TT - 1) / TT);  // tiles of the stretch
    const int mine = n_wt > warp ? (n_wt - warp + kStreamWarps - 1) / kStreamWarps : 0;
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem) + warp * kTmaMaxStages;
    uint8_t* ring = smem + kTmaBarrierBytes + warp * stages * stage_bytes;
    const auto tile_start = [&](int j) { return t_begin + int64_t(warp + kStreamWarps * j) * TT; };
    const auto tile_len = [&](int j) { return int(min(int64_t(TT), t_end - tile_start(j))); };
    const uint8_t* kpage = reinterpret_cast<const uint8_t*>(head.k);
    const uint8_t* vpage = reinterpret_cast<const uint8_t*>(head.v);
    const auto issue = [&](int j) {  // lane 0: this warp's j-th tile into stage j % stages
        if (lane == 0 && j < mine) {
            const int64_t c0 = tile_start(j);
            const unsigned len = unsigned(tile_len(j));
            uint8_t* st = ring + (j % stages) * stage_bytes;
            uint64_t* bar = bars + j % stages;
            // Whole 16-byte pieces (q8_0 / q4_0 rows are not; c0 is a multiple of 16 tokens, so the
            // tile starts aligned, and the last piece stays in the page: pages hold whole 64-token runs).
            const unsigned kb = unsigned(align16(int(len) * ktb)), vb = unsigned(align16(int(len) * vtb));
            mbar_expect_tx(bar, kb + vb);
            bulk_copy_to_shared(st, kpage + c0 * ktb, kb, bar);
            bulk_copy_to_shared(st + TT * ktb, vpage + c0 * vtb, vb, bar);
        }
    };
    if (lane == 0) {
        for (int s = 0; s < stages; ++s) mbar_init(bars + s, 1);
        mbar_init_fence();
    }
    __syncwarp();
    // Tiles of tokens before the newest one (written by earlier steps) go out before the wait.
    int issued = 0;
    while (issued < stages - 1 && issued < mine && tile_start(issued) + tile_len(issued) < head.n_tokens) issue(issued++);
    pdl_wait();
    for (int e = tid; e < REP * HD; e += kSplitThreads) qs[e] = p.q[int64_t(g) * REP * HD + e];
    if (p.rope.q != nullptr) rope_store_in_split<KC, VC>(p, g, z, REP, t_begin, t_end, n_vis, qs, kn);
    __syncthreads();  // q (and the new token's page writes) visible to the whole block
    for (; issued < stages - 1; ++issued) issue(issued);
    // q as the score MMAs' A fragments: f16 / fp8 keys hi / lo, q8_0 / q4_0 keys its q8_0 codes (the CPU's prepare_query).
    uint4 qa[kv_half_keys(KC) ? KS : 1] = {};
    QBlockFrag<HD> qb;
    if constexpr (kv_half_keys(KC)) {
#pragma unroll
        for (int s = 0; s < KS; ++s) qa[s] = mma_q_fragment<REP, HD>(qs, s);
    } else {
        quantize_query_q8_0(qs, REP * HD / kQBlock, qcs, qds, nullptr);
        __syncthreads();
        qb = q_block_frag<REP, KC, HD>(qcs, qds);
    }
    const auto qfrag = [&](int s) { return qa[s]; };
    const float score_scale = KC == KvCode::FP8 ? p.scale * head.k_scale : p.scale;
    MmaTileState<HD> st;
    for (int j = 0; j < mine; ++j) {
        issue(j + stages - 1);  // into the stage tile j - 1 used (the __syncwarp ending it freed it)
        mbar_wait(bars + j % stages, unsigned(j / stages) & 1u);
        const uint8_t* kt = ring + (j % stages) * stage_bytes;
        const uint8_t* vt = kt + TT * ktb;
        const int len = tile_len(j);
#pragma unroll
        for (int u = 0; u < TT / kStreamMmaTile; ++u) {
            const int ul = len - u * kStreamMmaTile;  // tokens of this 16-token tile
            if (ul <= 0) break;
            const uint8_t* ku = kt + u * kStreamMmaTile * ktb;
            const uint8_t* vu = vt + u * kStreamMmaTile * vtb;
            float sc[2][2];
            if constexpr (kv_half_keys(KC)) {
                Raw8<KC> kw[2][KC32];
#pragma unroll
                for (int n = 0; n < 2; ++n) {
#pragma unroll
                    for (int c = 0; c < KC32; ++c) {
                        kw[n][c] = *reinterpret_cast<const Raw8<KC>*>(ku + min(8 * n + gid, ul - 1) * ktb + (32 * c + 8 * tig) * ktb / HD);
                    }
                }
                mma_tile_scores<KC, HD>(qfrag, kw, ul, score_scale, sc);
            } else {
                mma_tile_scores_q<KC, HD>(qb, ku, ul, score_scale, sc);
            }
            if constexpr (kv_half_keys(VC)) {
                Raw8<VC> vw[4][VH];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int t = min(2 * tig + (i & 1) + 8 * (i >> 1), ul - 1);
#pragma unroll
                    for (int h = 0; h < VH; ++h) vw[i][h] = *reinterpret_cast<const Raw8<VC>*>(vu + t * vtb + (64 * h + 8 * gid) * vtb / HD);
                }
                mma_tile_values<VC, HD>(sc, vw, ul, st);
            } else {
                mma_tile_values_q<VC, HD>(sc, vu, ul, st);
            }
        }
        __syncwarp();  // every lane is done with this stage
    }
    pdl_launch_dependents();  // after the loads, as the other forms
    __syncthreads();          // every warp is done with its ring: the merge buffers reuse it
    const auto part_row = [&](int r) { return p.partial + ((int64_t(g) * REP + r) * p.splits + z) * (HD + 2); };
    mma_state_write_partial<REP, VC, HD>(st, head, reinterpret_cast<float*>(smem + kTmaBarrierBytes), z < cut.active, part_row);
    arrive_and_merge<REP, 16>(p, g, 0, 0, 1, cut.active, qs);  // registers to spare: two blocks per SM by shared memory
}

// q4_0 pages are planned at two blocks per SM per KV head's split (kAttnSplitBlocksPerSmQ4: 512
// blocks for 8 KV heads on 132 SMs), one wave only at four blocks per SM: registers capped at 128
// up to GQA 4 (at 8 the cap would spill in the loop).
template <int REP, KvCode KC, KvCode VC>
constexpr int kSplitMinBlocks = KC == KvCode::Q4_0 && VC == KvCode::Q4_0 && REP <= 4 ? 4 : 1;

template <int REP, KvCode KC, KvCode VC>
__global__ void __launch_bounds__(kSplitThreads, kSplitMinBlocks<REP, KC, VC>) attention_split_kernel(const SplitAttentionParams p) {
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ float kn[kAttnSplitMaxHeadDim];  // with rope: the new key, rotated
    __shared__ float m_run[kMmaRows], l_run[kMmaRows], factor[kMmaRows];
    constexpr int kQPB = kMmaRows / REP;  // queries per block
    const int g = blockIdx.x, qg = blockIdx.y, z = blockIdx.z;
    const int hd = int(p.head_dim), tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int ktb = int(kv_token_bytes(KC, hd)), vtb = int(kv_token_bytes(VC, hd));
    const int tile = p.tile, stages = p.stages;  // attention_split checked them
    const MmaSmem L = mma_smem(hd, KC, VC, tile, stages);
    float* qsm = reinterpret_cast<float*>(smem + L.qs);
    const auto qrow = [&](int r) { return qsm + r * hd; };
    float* scp = reinterpret_cast<float*>(smem + L.sc);  // [kMmaRows][tile]: scores, then probabilities
    const auto sc = [&](int r, int t) -> float& { return scp[r * tile + t]; };
    const int q0 = qg * kQPB;
    const int nq = min(kQPB, int(p.n_q) - q0);  // queries of this block
    const int rows = nq * REP;
    // The step block and the pages of earlier steps were written before this step's first kernel.
    const KvHeadDev head = p.heads[g];
    const auto visible = [&](int i) {  // tokens query i sees
        const int64_t seen = *p.pos0 + i + 1 - head.evicted;
        return seen < 0 ? int64_t(0) : (seen < head.n_tokens ? seen : head.n_tokens);
    };
    const int64_t n_vis = visible(q0 + nq - 1);  // the group's last query sees the most
    if (p.n_q == 1 && p.short_tokens > 0 && n_vis <= p.short_tokens) {  // the short form: the first split alone (attention.cuh)
        if (z == 0) attention_short<REP, KC, VC>(p, head, int(n_vis), smem, kn);
        return;
    }
    // Stretches of whole granules of kAttnSplitMinTokens, at least p.min_stretch: a short context leaves the last splits
    // empty (they only take part in the RoPE and the count of arrivals), so its merge reads few partials.
    const SplitStretch cut = split_stretch(n_vis, p.splits, p.min_stretch);
    const int64_t per = cut.per;
    const int active = cut.active;  // splits holding tokens (0 when n_vis is 0)
    const int64_t t_begin = min(n_vis, int64_t(z) * per), t_end = min(n_vis, t_begin + per);
    {
        const uint8_t* kp = reinterpret_cast<const uint8_t*>(head.k) + t_begin * ktb;
        const uint8_t* vp = reinterpret_cast<const uint8_t*>(head.v) + t_begin * vtb;
        const int64_t len = min(t_end - t_begin, int64_t(tile));
        for (int64_t l = tid; l < (len * ktb + 127) / 128; l += kSplitThreads) prefetch_l2(kp + 128 * l);
        for (int64_t l = tid; l < (len * vtb + 127) / 128; l += kSplitThreads) prefetch_l2(vp + 128 * l);
    }
    pdl_wait();
    const int n_tiles = int((t_end - t_begin + tile - 1) / tile);
    const bool rope = p.rope.q != nullptr;
    // A split without tokens needs q only for the RoPE it takes part in (the merger writes q back).
    if (n_tiles > 0 || rope) {
        for (int e = tid; e < kMmaRows * hd; e += kSplitThreads) {
            const int r = e / hd, d = e - r * hd;
            qrow(r)[d] = r < rows ? p.q[(int64_t(q0 + r / REP) * p.n_head + int64_t(g) * REP + r % REP) * hd + d] : 0.0f;
        }
    }
    if (tid < kMmaRows) {
        m_run[tid] = -INFINITY;
        l_run[tid] = 0.0f;
    }
    if (rope) rope_store_in_split<KC, VC>(p, g, z, REP, t_begin, t_end, n_vis, qrow(0), kn);  // n_q == 1 (attention.cuh)
    __syncthreads();  // q (and the new token's page writes) visible to the whole block
    if (p.n_q == 1 && p.stream_stages > 0) {  // the stream form (above); attention_split checked head_dim
        const auto part_row1 = [&](int r) { return p.partial + ((int64_t(g) * REP + r) * p.splits + z) * (hd + 2); };
        bool on_mma = false;  // the form on tensor cores (attention_stream_mma_fits)
        if constexpr (kv_half_keys(KC) && kv_half_keys(VC)) {
            on_mma = p.stream_mma && (hd == 64 || hd == 128);
            if (on_mma && hd == 64) {
                attention_stream_mma<REP, KC, VC, 64>(p, head, qrow(0), smem, L.qf, t_begin, t_end, z < active, part_row1);
            } else if (on_mma) {
                attention_stream_mma<REP, KC, VC, 128>(p, head, qrow(0), smem, L.qf, t_begin, t_end, z < active, part_row1);
            }
        }
        if (!on_mma) switch (hd) {
            case 64: attention_stream<REP, KC, VC, 2>(p, head, qrow(0), smem, L.qf, t_begin, t_end, z < active, part_row1); break;
            case 128: attention_stream<REP, KC, VC, 4>(p, head, qrow(0), smem, L.qf, t_begin, t_end, z < active, part_row1); break;
            default: attention_stream<REP, KC, VC, 8>(p, head, qrow(0), smem, L.qf, t_begin, t_end, z < active, part_row1); break;
        }
    } else {
        // q as the score MMAs' A fragments, once per block (q8_0 / q4_0 keys: quantized first, the
        // CPU reader's prepare_query).
        uint4* qf = reinterpret_cast<uint4*>(smem + L.qf);
        float* qd = reinterpret_cast<float*>(smem + L.qd);
        if (n_tiles == 0) {
        } else if constexpr (kv_half_keys(KC)) {
            for (int e = tid; e < (hd / 16) * 32; e += kSplitThreads) {
                const int ks = e / 32, ln = e % 32, r = ln >> 2, c = ks * 16 + (ln & 3) * 2;
                uint4 hi, lo;
                split_pair(qrow(r)[c], qrow(r)[c + 1], hi.x, lo.x);
                split_pair(qrow(r + 8)[c], qrow(r + 8)[c + 1], hi.y, lo.y);
                split_pair(qrow(r)[c + 8], qrow(r)[c + 9], hi.z, lo.z);
                split_pair(qrow(r + 8)[c + 8], qrow(r + 8)[c + 9], hi.w, lo.w);
                qf[2 * e] = hi;
                qf[2 * e + 1] = lo;
            }
        } else {
            int8_t* qc = reinterpret_cast<int8_t*>(smem + L.qcodes);
            quantize_query_q8_0(qrow(0), rows * (hd / kQBlock), qc, qd, nullptr);  // the real rows
            for (int e = rows * hd + tid; e < kMmaRows * hd; e += kSplitThreads) qc[e] = 0;  // padding rows
            for (int e = rows * (hd / kQBlock) + tid; e < kMmaRows * (hd / kQBlock); e += kSplitThreads) qd[e] = 0.0f;
            __syncthreads();
            for (int e = tid; e < (hd / kQBlock) * 32; e += kSplitThreads) {
                const int b = e / 32, ln = e % 32, r = ln >> 2, c = b * kQBlock + (ln & 3) * 4;
                const auto word = [&](int row, int col) { return *reinterpret_cast<const unsigned*>(qc + row * hd + col); };
                qf[e] = uint4{word(r, c), word(r + 8, c), word(r, c + 16), word(r + 8, c + 16)};
            }
        }
        // O accumulators: warp w holds rows x 32 channels of blocks w, w + 4, ...; hi and lo parts.
        constexpr int kChunks = kAttnSplitMaxHeadDim / 32 / kSplitWarps;
        float acc[kChunks][4][4], acc_lo[kChunks][4][4];
    #pragma unroll
        for (int c = 0; c < kChunks; ++c)
    #pragma unroll
            for (int n = 0; n < 4; ++n)
    #pragma unroll
                for (int j = 0; j < 4; ++j) acc[c][n][j] = acc_lo[c][n][j] = 0.0f;
        // Tokens each of this thread's two C rows sees, relative to t_begin (padding rows: none).
        const auto row_vis = [&](int r) { return r < rows ? visible(q0 + r / REP) - t_begin : int64_t(0); };
        const int64_t vis_a = row_vis(gid), vis_b = row_vis(gid + 8);
        const float score_scale = KC == KvCode::FP8 ? p.scale * head.k_scale : p.scale;  // fp8: the keys' scale once per score
        // Tile it goes to stage it % stages; stages - 1 tiles ahead are in flight (a group is
        // committed for every tile, empty past the last, so cp_async_wait counts the same).
        const auto issue = [&](int it) {
            if (it < n_tiles) {
                const int64_t c0 = t_begin + int64_t(it) * tile;
                const int len = int(min(int64_t(tile), t_end - c0));
                uint8_t* stage = smem + L.tiles + (it % stages) * L.stage;
                load_stream(stage, reinterpret_cast<const uint8_t*>(head.k) + c0 * ktb, len, ktb, L.k_row);
                load_stream(stage + L.k_tile, reinterpret_cast<const uint8_t*>(head.v) + c0 * vtb, len, vtb, L.v_row);
            }
            cp_async_commit();
        };
        if (n_tiles > 0) {
            for (int it = 0; it < stages - 1; ++it) issue(it);
        }
        __syncthreads();  // the q fragments
        for (int it = 0; it < n_tiles; ++it) {
            const int tile0 = it * tile;  // relative to t_begin
            const int len = int(min(int64_t(tile), t_end - t_begin - tile0));
            issue(it + stages - 1);  // into the stage tile it - 1 used (the barrier at the loop's end freed it)
            switch (stages) {  // this tile's group done; stages - 2 newer ones may still be in flight
                case 2: cp_async_wait<1>(); break;
                case 3: cp_async_wait<2>(); break;
                default: cp_async_wait<3>(); break;
            }
            __syncthreads();  // every thread's pieces of this tile have landed
            const uint8_t* kt = smem + L.tiles + (it % stages) * L.stage;
            const uint8_t* vt = kt + L.k_tile;
            if (len < tile) {  // the values past len are multiplied by p = 0: make them 0, not stale bytes (NaN)
                uint8_t* tail = smem + L.tiles + (it % stages) * L.stage + L.k_tile;
                for (int o = len * L.v_row + tid * 2; o < tile * L.v_row; o += kSplitThreads * 2) {
                    *reinterpret_cast<uint16_t*>(tail + o) = 0;  // rows are an even number of bytes
                }
                __syncthreads();
            }
            // Scores: warp w takes the tile's n8 blocks w, w + 4, ... (tokens 8nb .. 8nb + 7; a token
            // past len reads stale bytes and is masked below).
            for (int nb = warp; nb < tile / 8; nb += kSplitWarps) {
                const int tok = nb * 8 + gid;  // this lane's B column (token) in the tile
                const uint8_t* krow = kt + tok * L.k_row;
                float s[4];
                if constexpr (kv_half_keys(KC)) {
                    float hi[4] = {0, 0, 0, 0}, lo[4] = {0, 0, 0, 0};
                    for (int ks = 0; ks < hd / 16; ++ks) {
                        const uint4 ah = qf[2 * (ks * 32 + lane)], al = qf[2 * (ks * 32 + lane) + 1];
                        unsigned b0, b1;
                        if constexpr (KC == KvCode::F16) {
                            b0 = *reinterpret_cast<const unsigned*>(krow + (ks * 16 + tig * 2) * 2);
                            b1 = *reinterpret_cast<const unsigned*>(krow + (ks * 16 + 8 + tig * 2) * 2);
                        } else {  // fp8: two codes become two fp16 numbers, exactly
                            b0 = kv_fp8x2_to_half2(u16_at(krow + ks * 16 + tig * 2));
                            b1 = kv_fp8x2_to_half2(u16_at(krow + ks * 16 + 8 + tig * 2));
                        }
                        mma_f16(hi, ah.x, ah.y, ah.z, ah.w, b0, b1);
                        mma_f16(lo, al.x, al.y, al.z, al.w, b0, b1);
                    }
    #pragma unroll
                    for (int j = 0; j < 4; ++j) s[j] = hi[j] + lo[j] * kLoInv;
                } else {
                    constexpr int kBlockBytes = KC == KvCode::Q8_0 ? kKvQ8BlockBytes : kKvQ4BlockBytes;
                    s[0] = s[1] = s[2] = s[3] = 0.0f;
                    const int t0 = nb * 8 + tig * 2;  // the C columns (tokens) of this lane
                    for (int b = 0; b < hd / kQBlock; ++b) {
                        const uint8_t* blk = krow + b * kBlockBytes;
                        unsigned b0, b1;
                        if constexpr (KC == KvCode::Q8_0) {
                            b0 = u32_at2(blk + 2 + tig * 4);
                            b1 = u32_at2(blk + 2 + 16 + tig * 4);
                        } else {
                            const unsigned w = u32_at2(blk + 2 + tig * 4);
                            b0 = __vsub4(w & 0x0f0f0f0fu, 0x08080808u);
                            b1 = __vsub4((w >> 4) & 0x0f0f0f0fu, 0x08080808u);
                        }
                        int c[4] = {0, 0, 0, 0};
                        mma_s8(c, qf[b * 32 + lane], b0, b1);
                        const float dk0 = kv_half_at(kt + t0 * L.k_row + b * kBlockBytes);
                        const float dk1 = kv_half_at(kt + (t0 + 1) * L.k_row + b * kBlockBytes);
                        const float dqa = qd[gid * (hd / kQBlock) + b], dqb = qd[(gid + 8) * (hd / kQBlock) + b];
                        s[0] += float(c[0]) * (dk0 * dqa);
                        s[1] += float(c[1]) * (dk1 * dqa);
                        s[2] += float(c[2]) * (dk0 * dqb);
                        s[3] += float(c[3]) * (dk1 * dqb);
                    }
                }
                const int t0 = nb * 8 + tig * 2;
    #pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int t = tile0 + t0 + (j & 1);
                    const bool seen = t < (j < 2 ? vis_a : vis_b) && t0 + (j & 1) < len;
                    sc(gid + (j < 2 ? 0 : 8), t0 + (j & 1)) = seen ? s[j] * score_scale : -INFINITY;
                }
            }
            __syncthreads();
            // Online softmax per real row: a warp per row, a lane per 32nd token (padding rows' P
            // stays -inf: an MMA row only feeds its own output row, which is not written).
            for (int r = warp; r < rows; r += kSplitWarps) {
                float mx = -INFINITY;
                for (int t = lane; t < tile; t += 32) mx = fmaxf(mx, sc(r, t));
                const float m_new = fmaxf(m_run[r], warp_max(mx));
                float part = 0.0f;
                for (int t = lane; t < tile; t += 32) {
                    const float e = m_new == -INFINITY ? 0.0f : expf(sc(r, t) - m_new);
                    sc(r, t) = e;
                    part += e;
                }
                const float sum = warp_sum(part);
                if (lane == 0) {
                    const float f = m_new == -INFINITY ? 0.0f : expf(m_run[r] - m_new);  // 0 while m_run is -inf
                    factor[r] = f;
                    l_run[r] = l_run[r] * f + sum;
                    m_run[r] = m_new;
                }
            }
            __syncthreads();
            // O += P V over the tile's tokens (k16 steps), channel blocks w, w + 4, ...
            const float fa = factor[gid], fb = factor[gid + 8];
    #pragma unroll
            for (int ch = 0; ch < kChunks; ++ch) {
                const int cb = warp + ch * kSplitWarps;  // channel block
                if (cb >= hd / 32) break;
    #pragma unroll
                for (int n = 0; n < 4; ++n) {
                    acc[ch][n][0] *= fa;
                    acc[ch][n][1] *= fa;
                    acc[ch][n][2] *= fb;
                    acc[ch][n][3] *= fb;
                    acc_lo[ch][n][0] *= fa;
                    acc_lo[ch][n][1] *= fa;
                    acc_lo[ch][n][2] *= fb;
                    acc_lo[ch][n][3] *= fb;
                }
                for (int ks = 0; ks < tile / 16; ++ks) {
                    const int ta = ks * 16 + tig * 2, tb = ta + 8;  // the A columns (tokens) of this lane
                    float pa0 = sc(gid, ta), pa1 = sc(gid, ta + 1), pb0 = sc(gid + 8, ta), pb1 = sc(gid + 8, ta + 1);
                    float pc0 = sc(gid, tb), pc1 = sc(gid, tb + 1), pd0 = sc(gid + 8, tb), pd1 = sc(gid + 8, tb + 1);
                    if constexpr (VC == KvCode::Q8_0 || VC == KvCode::Q4_0) {  // the block scale of each token goes into P
                        constexpr int kBlockBytes = VC == KvCode::Q8_0 ? kKvQ8BlockBytes : kKvQ4BlockBytes;
                        const float d0 = kv_half_at(vt + ta * L.v_row + cb * kBlockBytes);
                        const float d1 = kv_half_at(vt + (ta + 1) * L.v_row + cb * kBlockBytes);
                        const float d2 = kv_half_at(vt + tb * L.v_row + cb * kBlockBytes);
                        const float d3 = kv_half_at(vt + (tb + 1) * L.v_row + cb * kBlockBytes);
                        pa0 *= d0; pb0 *= d0; pa1 *= d1; pb1 *= d1;
                        pc0 *= d2; pd0 *= d2; pc1 *= d3; pd1 *= d3;
                    }
                    unsigned h0, h1, h2, h3, l0, l1, l2, l3;
                    split_pair(pa0, pa1, h0, l0);
                    split_pair(pb0, pb1, h1, l1);
                    split_pair(pc0, pc1, h2, l2);
                    split_pair(pd0, pd1, h3, l3);
    #pragma unroll
                    for (int n = 0; n < 4; ++n) {
                        const int col = cb * 32 + n * 8 + gid;  // this lane's B column (channel)
                        unsigned b0, b1;
                        if constexpr (VC == KvCode::F16) {
                            const auto v = [&](int t) { return u16_at(vt + t * L.v_row + col * 2); };
                            b0 = v(ta) | (v(ta + 1) << 16);
                            b1 = v(tb) | (v(tb + 1) << 16);
                        } else if constexpr (VC == KvCode::FP8) {  // the values' scale goes on the output
                            const auto v = [&](int t) { return unsigned(vt[t * L.v_row + col]); };
                            b0 = kv_fp8x2_to_half2(v(ta) | (v(ta + 1) << 8));
                            b1 = kv_fp8x2_to_half2(v(tb) | (v(tb + 1) << 8));
                        } else {
                            constexpr int kBlockBytes = VC == KvCode::Q8_0 ? kKvQ8BlockBytes : kKvQ4BlockBytes;
                            const int j = n * 8 + gid;
                            const auto v = [&](int t) { return float(kv_code_at(vt + t * L.v_row + cb * kBlockBytes, j, VC)); };
                            b0 = pack_half2(v(ta), v(ta + 1));
                            b1 = pack_half2(v(tb), v(tb + 1));
                        }
                        mma_f16(acc[ch][n], h0, h1, h2, h3, b0, b1);
                        mma_f16(acc_lo[ch][n], l0, l1, l2, l3, b0, b1);
                    }
                }
            }
            __syncthreads();  // sc and this stage are rewritten next
        }
        cp_async_wait<0>();  // (only empty groups can be left)
        // The next kernel may start launching now (PDL): its blocks wait at its pdl_wait() holding
        // shared memory and registers, which the main loop above needs more.
        pdl_launch_dependents();
        // The partial of each real row: o (hi + lo / 2^11), then max and sum.
        const int64_t stride = hd + 2;
        const auto part_row = [&](int r) {
            return p.partial + ((int64_t(q0 + r / REP) * p.n_head + int64_t(g) * REP + r % REP) * p.splits + z) * stride;
        };
        if (z < active) {  // a split without tokens is not read by the merge
    #pragma unroll
            for (int ch = 0; ch < kChunks; ++ch) {
                const int cb = warp + ch * kSplitWarps;
                if (cb >= hd / 32) break;
    #pragma unroll
                for (int n = 0; n < 4; ++n) {
                    const int col = cb * 32 + n * 8 + tig * 2;
    #pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const int r = gid + (j < 2 ? 0 : 8);
                        if (r < rows) {
                            const float o = acc[ch][n][j] + acc_lo[ch][n][j] * kLoInv;
                            part_row(r)[col + (j & 1)] = VC == KvCode::FP8 ? o * head.v_scale : o;
                        }
                    }
                }
            }
            if (tid < rows) {
                part_row(tid)[hd] = m_run[tid];
                part_row(tid)[hd + 1] = l_run[tid];
            }
        }
    }
    // 8 splits of loads a batch: 16 would take the q4_0 / q8_0 stream forms' instances past 128
    // registers (three blocks per SM instead of four).
    arrive_and_merge<REP, 8>(p, g, qg, q0, nq, active, qrow(0));
}

// Block (token, head) over the q heads then the k heads; thread e < n_rot / 2 rotates pair e as
// rope_kernel does; then a k head's threads store its rows of k and v as store_kv does (kv_store.cu).
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
                 blockDim.x, h.k_scale);
    kv_store_row(p.v_code, vrow, reinterpret_cast<uint8_t*>(h.v) + slot * kv_token_bytes(p.v_code, hd), hd, threadIdx.x,
                 blockDim.x, h.v_scale);
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
    const int64_t seen = *p.pos0 + i + 1 - p.heads[g].evicted;  // stored tokens at positions <= pos0 + i
    const int64_t n_vis = seen < 0 ? 0 : (seen < n_tokens ? seen : n_tokens);
    float* sc = scores + r * p.stride;
    __half* hi = p_hi + r * p.stride;
    __half* lo = p_lo ? p_lo + r * p.stride : nullptr;

    float m = -INFINITY;
    for (int64_t t = threadIdx.x; t < n_vis; t += blockDim.x) m = fmaxf(m, __fmul_rn(sc[t], p.scale));
    m = block_reduce<kAttnWarps>(m, red, true);
    float sum = 0.0f;
    for (int64_t t = threadIdx.x; t < n_vis; t += blockDim.x) {
        const float e = expf(__fmul_rn(sc[t], p.scale) - m);
        sc[t] = e;  // read back below by this same thread
        sum += e;
    }
    sum = block_reduce<kAttnWarps>(sum, red, false);
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


}  // namespace

void attention_f16(const F16AttentionParams& p, cudaStream_t st) {
    if (p.n_q * p.n_head == 0) return;
    attention_f16_kernel<<<unsigned(p.n_q * p.n_head), kAttnWarps * 32, 0, st>>>(p);
    VXQ_CUDA_CHECK_LAUNCH();
}

bool attention_split_fits(int64_t n_head, int64_t n_head_kv, int64_t head_dim, KvCode k_code, KvCode v_code) {
    if (n_head_kv <= 0 || n_head % n_head_kv != 0) return false;
    const int64_t rep = n_head / n_head_kv;
    return (rep == 1 || rep == 2 || rep == 3 || rep == 4 || rep == 8) && head_dim % 32 == 0 &&
           head_dim <= kAttnSplitMaxHeadDim && kv_code_fits(k_code, head_dim) && kv_code_fits(v_code, head_dim);
}

size_t attention_split_smem(const SplitAttentionParams& p) {
    const MmaSmem L = mma_smem(int(p.head_dim), p.k_code, p.v_code, p.tile, p.stages);
    if (p.n_q != 1 || p.stream_stages <= 0) return size_t(L.total);
    return size_t(std::max(L.total, stream_smem(L.qf, int(p.head_dim), p.k_code, p.v_code, p.stream_stages).total));
}

bool attention_stream_fits(const SplitAttentionParams& p) {
    if (!(p.n_q == 1 && (p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256) && p.stream_stages >= 1 &&
          p.stream_stages <= 4 && attention_split_fits(p.n_head, p.n_head_kv, p.head_dim, p.k_code, p.v_code) &&
          attention_split_smem(p) <= size_t(kAttnSplitMaxSmem))) {
        return false;
    }
    // The warps' merge reuses the rings: o, max and sum of every warp's query heads.
    const StreamSmem S = stream_smem(0, int(p.head_dim), p.k_code, p.v_code, p.stream_stages);
    const int64_t rep = p.n_head / p.n_head_kv;
    return S.total - S.ring >= stream_merge_bytes(int(rep), int(p.head_dim));
}

bool attention_stream_mma_fits(const SplitAttentionParams& p) {
    return attention_stream_fits(p) && (p.head_dim == 64 || p.head_dim == 128) && kv_half_keys(p.k_code) &&
           kv_half_keys(p.v_code) &&
           size_t(mma_smem(int(p.head_dim), p.k_code, p.v_code, p.tile, p.stages).qf +
                  stream_mma_smem(kStreamMaxRep, int(p.head_dim))) <= attention_split_smem(p);
}

bool attention_stream_tma_formats(KvCode k, KvCode v, int64_t head_dim) {
    return (head_dim == 64 || head_dim == 128) && kv_half_keys(k) == kv_half_keys(v);
}

bool attention_stream_tma_fits(const SplitAttentionParams& p) {
    const int64_t rep = p.n_head_kv > 0 ? p.n_head / p.n_head_kv : 0;
    return p.n_q == 1 && attention_stream_tma_formats(p.k_code, p.v_code, p.head_dim) &&
           attention_split_fits(p.n_head, p.n_head_kv, p.head_dim, p.k_code, p.v_code) && p.short_tokens == 0 &&
           p.tma_stages >= 1 && p.tma_stages <= kTmaMaxStages && p.splits >= 1 && p.splits <= kAttnSplitMaxSplits &&
           tma_smem(int(rep), int(p.head_dim), p.k_code, p.v_code, p.tma_stages) <= kAttnSplitMaxSmem;
}

int32_t attention_stream_stages(const SplitAttentionParams& p) {
    SplitAttentionParams s = p;
    s.stream_stages = kAttnStreamStages;
    return attention_stream_fits(s) ? s.stream_stages : 0;
}

bool attention_split_tiling_fits(const SplitAttentionParams& p) {
    return (p.tile == 32 || p.tile == 64 || p.tile == 128) && p.stages >= 2 && p.stages <= 4 &&
           attention_split_smem(p) <= size_t(kAttnSplitMaxSmem);
}

int32_t attention_split_short_cap(const SplitAttentionParams& p) {
    if (!attention_split_fits(p.n_head, p.n_head_kv, p.head_dim, p.k_code, p.v_code) || !attention_split_tiling_fits(p)) return 0;
    const MmaSmem L = mma_smem(int(p.head_dim), p.k_code, p.v_code, p.tile, p.stages);
    return short_smem(L, int(p.n_head / p.n_head_kv)).cap;
}

namespace {
// VXQ_CUDA_ATTN_BLOCKS_PER_SM=N (1..64) overrides the planned blocks per SM of every form (benchmarks); 0: not set.
int64_t forced_blocks_per_sm() {
    static const int64_t forced = [] {
        const char* e = std::getenv("VXQ_CUDA_ATTN_BLOCKS_PER_SM");
        const long v = e ? std::strtol(e, nullptr, 10) : 0;
        return v >= 1 && v <= 64 ? int64_t(v) : int64_t(0);
    }();
    return forced;
}
// About per_sm blocks per SM for `rows` (query group, KV head) pairs: splits a power of two, at most kAttnSplitMaxSplits,
// the smallest whose blocks reach per_sm an SM, or (within) the largest whose blocks the SMs hold at per_sm each.
int64_t splits_for(int64_t per_sm, int64_t rows, bool within = false) {
    const int64_t room = per_sm * sm_count();
    int64_t s = 1;
    if (within) {
        while (2 * s * std::max<int64_t>(1, rows) <= room && s < kAttnSplitMaxSplits) s *= 2;
        return s;
    }
    const int64_t want = (room + rows - 1) / std::max<int64_t>(1, rows);
    while (s < want && s < kAttnSplitMaxSplits) s *= 2;
    return s;
}
}  // namespace

int64_t attention_splits(int64_t n_q, int64_t n_head_kv, KvCode k_code) {
    const int64_t forced = forced_blocks_per_sm();
    const int64_t per_sm = forced                    ? forced
                           : k_code == KvCode::F16  ? int64_t(kAttnSplitBlocksPerSmF16)
                           : k_code == KvCode::Q8_0 ? int64_t(kAttnSplitBlocksPerSmQ8)
                           : k_code == KvCode::FP8  ? int64_t(kAttnSplitBlocksPerSmFp8)
                                                    : int64_t(kAttnSplitBlocksPerSmQ4);
    return splits_for(per_sm, n_q * n_head_kv);
}

int64_t attention_stream_tma_splits(int64_t n_head_kv, KvCode k_code) {
    const int64_t forced = forced_blocks_per_sm();
    if (k_code == KvCode::F16 && !forced) return splits_for(1, n_head_kv, true);  // a block per SM
    return splits_for(forced ? forced : int64_t(kAttnTmaBlocksPerSm), n_head_kv);
}

int attention_stream_tma_stages(KvCode k_code) {
    return k_code == KvCode::F16 || k_code == KvCode::Q8_0 ? 4 : kAttnTmaStages;
}

size_t attention_split_scratch_floats(int64_t n_q, int64_t n_head, int64_t head_dim, int64_t splits) {
    return size_t(n_q * n_head * splits * (head_dim + 2));
}

namespace {

template <int REP, KvCode KC, KvCode VC>
void launch_split(const SplitAttentionParams& p, cudaStream_t st) {
    static PerDevice sized;
    once_per_device(sized, [] {  // room for the largest layout attention_split_tiling_fits admits
        cudaFuncAttributes fa{};
        VXQ_CUDA_CHECK(cudaFuncGetAttributes(&fa, attention_split_kernel<REP, KC, VC>));
        int dev = 0, optin = 0;
        VXQ_CUDA_CHECK(cudaGetDevice(&dev));
        VXQ_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        if (fa.sharedSizeBytes + size_t(kAttnSplitMaxSmem) > size_t(optin)) {
            throw_cuda_error(cudaErrorInvalidValue, "attention: static + largest dynamic shared memory above the device's limit",
                             __FILE__, __LINE__);
        }
        VXQ_CUDA_CHECK(cudaFuncSetAttribute(attention_split_kernel<REP, KC, VC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            kAttnSplitMaxSmem));
        // All of L1 as shared memory, so kAttnSplitBlocksPerSm* blocks fit (by default the driver
        // may keep a carveout that holds one or two).
        VXQ_CUDA_CHECK(cudaFuncSetAttribute(attention_split_kernel<REP, KC, VC>,
                                            cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    });
    const int64_t groups = (p.n_q + kMmaRows / REP - 1) / (kMmaRows / REP);
    const dim3 grid(unsigned(p.n_head_kv), unsigned(groups), unsigned(p.splits));
    launch_pdl(attention_split_kernel<REP, KC, VC>, grid, dim3(kSplitThreads), attention_split_smem(p), st, p);
}

template <int REP, KvCode KC, KvCode VC, int HD>
void launch_stream_tma(const SplitAttentionParams& p, cudaStream_t st) {
    static PerDevice sized;
    once_per_device(sized, [] {  // room for the deepest ring
        VXQ_CUDA_CHECK(cudaFuncSetAttribute(attention_stream_tma_kernel<REP, KC, VC, HD>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, tma_smem(REP, HD, KC, VC, kTmaMaxStages)));
        VXQ_CUDA_CHECK(cudaFuncSetAttribute(attention_stream_tma_kernel<REP, KC, VC, HD>,
                                            cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    });
    const dim3 grid(unsigned(p.n_head_kv), 1u, unsigned(p.splits));
    launch_pdl(attention_stream_tma_kernel<REP, KC, VC, HD>, grid, dim3(kSplitThreads),
               size_t(tma_smem(REP, HD, KC, VC, p.tma_stages)), st, p);
}

template <int REP>
void launch_split_kv(const SplitAttentionParams& p, cudaStream_t st) {
    with_kv_codes(p.k_code, p.v_code, [&]<KvCode KC, KvCode VC>() {
        if constexpr (kv_half_keys(KC) == kv_half_keys(VC)) {
            if (p.tma_stages > 0) {  // attention_split checked attention_stream_tma_fits
                if (p.head_dim == 64) {
                    launch_stream_tma<REP, KC, VC, 64>(p, st);
                } else {
                    launch_stream_tma<REP, KC, VC, 128>(p, st);
                }
                return;
            }
        }
        launch_split<REP, KC, VC>(p, st);
    });
}

}  // namespace

void attention_split(const SplitAttentionParams& p, cudaStream_t st) {
    if (p.n_q * p.n_head == 0) return;
    if (p.out_q8.qs && !attention_split_q8_fits(p)) {
        throw_cuda_error(cudaErrorInvalidValue, "attention_split: q8_0 output needs one query and head_dim % 32 == 0",
                         __FILE__, __LINE__);
    }
    if (!attention_split_fits(p.n_head, p.n_head_kv, p.head_dim, p.k_code, p.v_code) || !attention_split_tiling_fits(p)) {
        throw_cuda_error(cudaErrorInvalidValue, "attention_split: shape or format not taken (attention_split_fits)",
                         __FILE__, __LINE__);
    }
    if (p.tma_stages != 0 && !attention_stream_tma_fits(p)) {
        throw_cuda_error(cudaErrorInvalidValue, "attention_split: the bulk-copy stream form not taken (attention_stream_tma_fits)",
                         __FILE__, __LINE__);
    }
    if (p.n_q == 1 && p.tma_stages == 0 && p.stream_stages != 0 && !attention_stream_fits(p)) {
        throw_cuda_error(cudaErrorInvalidValue, "attention_split: stream form not taken (attention_stream_fits)", __FILE__,
                         __LINE__);
    }
    switch (p.n_head / p.n_head_kv) {
        case 1: launch_split_kv<1>(p, st); break;
        case 2: launch_split_kv<2>(p, st); break;
        case 3: launch_split_kv<3>(p, st); break;
        case 4: launch_split_kv<4>(p, st); break;
        default: launch_split_kv<8>(p, st); break;
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
    launch_pdl(rope_store_kernel, dim3(unsigned(blocks)), dim3(kv_row_threads(p.head_dim)), 0, st, p);
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

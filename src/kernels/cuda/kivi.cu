// KIVI caches in device memory: the store (encoders + window write), the prefill attention and
// the launchers of the split-K decode attention, whose kernels are in kivi_attention_kernels.cuh
// (kivi.cuh says what each does). The encoders follow kivi::quantize_group step for step
// (kv/codecs/kivi.cpp): the same f32 operations, each rounded on its own (__f*_rn), so the bytes
// are the CPU codec's.
#include "kernels/cuda/kivi.cuh"

#include <algorithm>
#include <cmath>

#include <cuda_fp16.h>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/flash_prefill.cuh"
#include "kernels/cuda/kivi_attention_kernels.cuh"
#include "kernels/cuda/kivi_code.h"
#include "kernels/cuda/kivi_flush_kernels.cuh"
#include "kernels/cuda/kivi_quantize.cuh"
#include "kernels/cuda/kv_codes.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/rope.cuh"

namespace vxq::cuda {

namespace {

constexpr int kMaxSplits = 128;
constexpr int kMaxTailSplits = 64;  // the tensor-core form's tail splits (windows up to 2K tokens)

// The store works through shared memory: a block stages up to a chunk of write-local tokens of
// one stream (fp16, as the window holds them: rows of head_dim + 4 halves, so that consecutive
// tokens start in different banks) with every thread's loads in flight, then quantizes rows from
// there: keys a thread per (block, channel), values a thread per (token, row of G channels), or a
// warp per row where a chunk has no more rows than the block has warps (a decode step's token).
// A chunk is whole key blocks, at least 32 tokens.
__host__ __device__ constexpr int kivi_store_chunk(int key_group) { return key_group < 32 ? 32 : key_group; }
__host__ __device__ constexpr int kivi_store_ld(int64_t head_dim) { return int(head_dim) + 4; }
// The store's short path (a decode step) takes (GQA + 2) head_dim floats and head_dim halves of it.
static_assert((kKiviMaxGqa + 2) * sizeof(float) + sizeof(__half) <= 32 * sizeof(__half), "short path fits a chunk's rows");
size_t kivi_store_smem(const KiviStoreParams& p) {
    return size_t(kivi_store_chunk(p.kf.group)) * size_t(kivi_store_ld(p.head_dim)) * sizeof(__half);
}

// Write-local tokens [i0, i0 + cnt) of stream w into s (row t at s + t ld): the window's oldest
// `pending` tokens from its ring, then new rows of x (`stride` floats apart) rounded to fp16.
// Four channels a load (head_dim is a multiple of 32: kivi_attention_fits; 16 bytes of x where x
// is 16-byte aligned, else four floats; 8 bytes of the ring), U loads of a thread in flight
// before its stores.
__device__ void stage_tokens(const KvWindowWrite& w, const __half* ring, const float* x, int64_t stride, int d, int64_t i0,
                             int cnt, __half* s, int ld, int tid, int nthreads) {
    constexpr int U = 4;
    const int pending = int(w.pending), head = int(w.head), slots = int(w.slots), quads = d / 4, n = cnt * quads;
    const bool x16 = (reinterpret_cast<uintptr_t>(x) | uintptr_t(stride * 4)) % 16 == 0;
    for (int q0 = tid; q0 < n; q0 += U * nthreads) {
        uint2 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int q = q0 + u * nthreads, t = q / quads, c = 4 * (q - t * quads), i = int(i0) + t;
            if (q >= n) {
                v[u] = make_uint2(0, 0);
            } else if (i < pending) {
                const int slot = head + i < slots ? head + i : head + i - slots;
                v[u] = *reinterpret_cast<const uint2*>(ring + int64_t(slot) * d + c);
            } else {
                const float* r = x + (i - pending) * stride + c;
                const float4 f = x16 ? *reinterpret_cast<const float4*>(r) : make_float4(r[0], r[1], r[2], r[3]);
                v[u] = make_uint2(pack_half2(f.x, f.y), pack_half2(f.z, f.w));
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int q = q0 + u * nthreads, t = q / quads;
            if (q < n) *reinterpret_cast<uint2*>(s + t * ld + 4 * (q - t * quads)) = v[u];
        }
    }
}

// Chunk `chunk` of KV head g's write (write-local tokens chunk * T ...): the key blocks and the
// value tokens of it that the plan encodes. Every thread of the block calls (it synchronizes).
__device__ void encode_chunk(const KiviStoreParams& p, int64_t g, int64_t chunk, __half* s, int tid, int nthreads) {
    const int d = int(p.head_dim), ld = kivi_store_ld(d), T = kivi_store_chunk(p.kf.group);
    const int64_t stride = p.n_head_kv * d, i0 = chunk * T;
    const KiviHeadDev h = p.heads[g];
    for (int role = 0; role < 2; ++role) {
        const KvWindowWrite w = p.plan[role];
        const int cnt = int(min64(T, w.encoded - i0));
        if (cnt <= 0 || (role == 0 && p.kf.bits == 0)) continue;  // the same for the whole block (bits 0: keys encoded elsewhere)
        const float* x = (role ? p.v : p.k) + g * d;
        stage_tokens(w, reinterpret_cast<const __half*>(role ? h.vw : h.kw), x, stride, d, i0, cnt, s, ld, tid, nthreads);
        __syncthreads();
        if (role == 0) {
            // Key block b of the chunk, channel c: G tokens of one channel (cnt is whole blocks).
            const int G = p.kf.group, bits = p.kf.bits, rb = G * bits / 8;
            for (int idx = tid; idx < cnt / G * d; idx += nthreads) {
                const int b = idx / d, c = idx - b * d;
                uint8_t* blk = reinterpret_cast<uint8_t*>(h.k) + (w.packed / G + i0 / G + b) * p.kf.block_bytes;
                const __half* col = s + b * G * ld + c;
                quantize_row([&](int t) { return __half2float(col[t * ld]); }, G, bits, blk + 2 * c, blk + 2 * d + 2 * c,
                             blk + 4 * d + c * rb);
            }
        } else {
            // Value token t of the chunk, row r: G channels (a ragged last row repeats its last
            // real channel, as the CPU pads it); a warp per row when there are few rows.
            const int rows = p.vf.rows, warps = nthreads / 32;
            const bool by_warp = cnt * rows <= warps;
            for (int idx = by_warp ? tid / 32 : tid; idx < cnt * rows; idx += by_warp ? warps : nthreads) {
                const int t = idx / rows, r = idx - t * rows;
                uint8_t* blk = reinterpret_cast<uint8_t*>(h.v) + (w.packed + i0 + t) * p.vf.block_bytes;
                if (by_warp) {
                    quantize_value_row<true>(s + t * ld, d, r, p.vf, blk, tid & 31);
                } else {
                    quantize_value_row<false>(s + t * ld, d, r, p.vf, blk, 0);
                }
            }
        }
        __syncthreads();  // the next role stages into the same rows
    }
}

// New token j of the write into KV head g's window of keys (role 0) or values (role 1), unless
// it is encoded.
__device__ void window_token(const KiviStoreParams& p, int role, int64_t g, int64_t j, int tid, int nthreads) {
    const KvWindowWrite w = p.plan[role];
    const int64_t d = p.head_dim;
    if (j >= p.n || w.pending + j < w.encoded) return;
    const KiviHeadDev h = p.heads[g];
    const int64_t slot = (w.head + w.pending + j) % w.slots;
    auto* dst = reinterpret_cast<uint16_t*>(role ? h.vw : h.kw) + slot * d;
    const float* x = (role ? p.v : p.k) + (j * p.n_head_kv + g) * d;
    for (int64_t c = tid; c < d; c += nthreads) dst[c] = kv_half_bits(x[c]);
}

// The store of a large write in two kernels: block (chunk, g) encodes a chunk; then the window
// rows (block (x, g, role): new tokens n - nw + 8 x .. + 7 of the last nw = min(n, most slots),
// which hold every token the window keeps) -- the encoders read old window slots the window
// write may overwrite.
constexpr int kStoreThreads = 128;
constexpr int kWindowTokens = 8;  // tokens a window block writes
__global__ void __launch_bounds__(kStoreThreads) kivi_encode_kernel(KiviStoreParams p) {
    extern __shared__ float4 store_smem4[];
    pdl_wait();
    encode_chunk(p, blockIdx.y, blockIdx.x, reinterpret_cast<__half*>(store_smem4), threadIdx.x, kStoreThreads);
}
// A window block's tokens: every row's loads first, then the stores (token by token, each load
// waited for after the store before it, which may alias it to the compiler, made a block a chain
// of 8 memory latencies; on the H200 the 2048-token flush measured no faster for it, the encoder
// before it takes most of the time: docs/gpu.md, 2026-12-05).
__global__ void kivi_window_kernel(KiviStoreParams p, int64_t first) {
    pdl_wait();
    const int role = int(blockIdx.z);
    const int64_t g = blockIdx.y, d = p.head_dim, j0 = first + int64_t(blockIdx.x) * kWindowTokens;
    const KvWindowWrite w = p.plan[role];
    const KiviHeadDev h = p.heads[g];
    const float* x = (role ? p.v : p.k) + (j0 * p.n_head_kv + g) * d;
    auto* dst = reinterpret_cast<uint16_t*>(role ? h.vw : h.kw);
    const int64_t slot0 = (w.head + w.pending + j0) % w.slots;
    // Token j0 + u is written unless past the write or encoded (those are the first ones).
    const int n = int(min64(kWindowTokens, p.n - j0)), skip = int(max64(0, min64(n, w.encoded - w.pending - j0)));
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
        float v[kWindowTokens];
#pragma unroll
        for (int u = 0; u < kWindowTokens; ++u) v[u] = u >= skip && u < n ? x[u * p.n_head_kv * d + c] : 0.0f;
#pragma unroll
        for (int u = 0; u < kWindowTokens; ++u) {
            if (u < skip || u >= n) continue;
            int64_t slot = slot0 + u;
            if (slot >= w.slots) slot -= w.slots;
            dst[slot * d + c] = kv_half_bits(v[u]);
        }
    }
}

// Whether kivi_flush_kernel (kivi_flush_kernels.cuh) takes p's formats: its default layout.
bool kivi_flush_fits(const KiviStoreParams& p) {
    const bool aligned = (reinterpret_cast<uintptr_t>(p.k) | reinterpret_cast<uintptr_t>(p.v)) % 16 == 0;  // float4 rows
    return aligned && (p.head_dim == 64 || p.head_dim == 128) && (p.kf.bits == 2 || p.kf.bits == 4) &&
           (p.vf.bits == 2 || p.vf.bits == 4) && kivi_group32(p.kf, p.head_dim) && kivi_group32(p.vf, p.head_dim / 32);
}
template <int D, int KB, int VB>
void launch_flush(const KiviStoreParams& p, dim3 grid, cudaStream_t st) {
    launch_pdl(kivi_flush_kernel<D, KB, VB>, grid, dim3(kFlushThreads), 0, st, p);
}
template <int D>
void launch_flush(const KiviStoreParams& p, unsigned chunks, cudaStream_t st) {
    const dim3 grid(chunks * unsigned(kFlushQuarters<D>), unsigned(p.n_head_kv), 2);
    if (p.kf.bits == 2) {
        p.vf.bits == 2 ? launch_flush<D, 2, 2>(p, grid, st) : launch_flush<D, 2, 4>(p, grid, st);
    } else {
        p.vf.bits == 2 ? launch_flush<D, 4, 2>(p, grid, st) : launch_flush<D, 4, 4>(p, grid, st);
    }
}

// ... and of a small one (a decode step) in one: block g encodes what the plan flushes, then
// writes the window rows. A decode step whose keys flush nothing (all but one step in R) takes a
// short path: the plan and the heads' table (the step block, written before the pass starts:
// launch.cuh) are read before the wait; the values' oldest window token, which such a step
// encodes once the window is full, a warp per row from its ring slot (the new token's slot is
// another: at most slots - 1 are pending); RoPE and the new k and v from one round of loads;
// the attention's launch let go at once (this grid is one small block per KV head). On the H200
// the store took 5.7-7.5 us from its wait to the attention's (VXQ_CUDA_PROFILE=timeline, 1K)
// when it staged the value token and re-read the rotated k through global memory.
__global__ void __launch_bounds__(kStoreThreads) kivi_store_small_kernel(KiviStoreParams p) {
    extern __shared__ float4 store_smem4[];
    __shared__ float2 rope_cs[kKiviMaxRopePairs];
    const KiviRope& r = p.rope;
    const int half = r.q != nullptr ? int(r.n_rot / 2) : 0;
    const int64_t g = blockIdx.x, d = p.head_dim;
    const KvWindowWrite wk = p.plan[0], wv = p.plan[1];
    if (half > 0) {
        const int64_t pos = *r.pos0;
        for (int i = threadIdx.x; i < half; i += kStoreThreads) rope_cs[i] = rope_angle(i, pos, r.theta_scale);
    }
    const int gqa = int(p.n_head_kv > 0 ? r.n_head / p.n_head_kv : 0);
    if (p.n == 1 && wk.encoded == 0 && (wv.encoded == 0 || (wv.encoded == 1 && wv.pending >= 1))) {
        const KiviHeadDev h = p.heads[g];
        auto* kd = reinterpret_cast<uint16_t*>(h.kw) + (wk.head + wk.pending) % wk.slots * d;
        auto* vd = reinterpret_cast<uint16_t*>(h.vw) + (wv.head + wv.pending) % wv.slots * d;
        // Every load first, one round: shared memory [gqa][d] q rows (with RoPE), [d] k, [d] v,
        // then the values' oldest window token (write-local token 0, ring slot wv.head: an
        // earlier step's, so loaded before the wait). kivi_store_smem holds it for GQA <= 8.
        const int nq = half > 0 ? gqa * int(d) : 0;
        auto* sq = reinterpret_cast<float*>(store_smem4);
        float *sk = sq + nq, *sv = sk + d;
        auto* sr = reinterpret_cast<__half*>(sv + d);
        const bool flush_v = wv.encoded == 1;
        if (flush_v) {
            const auto* src = reinterpret_cast<const __half*>(h.vw) + wv.head * d;
            for (int c = threadIdx.x; c < d; c += kStoreThreads) sr[c] = src[c];
        }
        pdl_launch_dependents();
        pdl_wait();
        const float* qg = half > 0 ? r.q + g * gqa * d : nullptr;
#pragma unroll 4
        for (int e = threadIdx.x; e < nq + 2 * int(d); e += kStoreThreads) {
            sq[e] = e < nq ? qg[e] : e < nq + d ? p.k[g * d + e - nq] : p.v[g * d + e - nq - d];
        }
        __syncthreads();
        if (flush_v) {  // a warp per row
            uint8_t* blk = reinterpret_cast<uint8_t*>(h.v) + wv.packed * p.vf.block_bytes;
            for (int row = threadIdx.x / 32; row < p.vf.rows; row += kStoreThreads / 32) {
                quantize_value_row<true>(sr, int(d), row, p.vf, blk, threadIdx.x & 31);
            }
        }
        for (int e = threadIdx.x; e < gqa * half; e += kStoreThreads) {
            const int row = e / half, i = e - row * half;
            const RopePair y = rope_pair(sq + row * d, i, rope_cs[i], r.n_rot, r.neox != 0);
            float* qr = r.q + (g * gqa + row) * d;
            qr[y.a] = y.ya, qr[y.b] = y.yb;
        }
        for (int e = threadIdx.x; e < d - half; e += kStoreThreads) {  // k's pairs, then its channels past n_rot
            if (e < half) {
                const RopePair y = rope_pair(sk, e, rope_cs[e], r.n_rot, r.neox != 0);
                r.k[g * d + y.a] = y.ya, r.k[g * d + y.b] = y.yb;  // r.k is p.k where it rotates (the backend checks)
                kd[y.a] = kv_half_bits(y.ya), kd[y.b] = kv_half_bits(y.yb);
            } else {
                kd[e + half] = kv_half_bits(sk[e + half]);
            }
        }
        for (int c = threadIdx.x; c < d; c += kStoreThreads) vd[c] = kv_half_bits(sv[c]);
        return;
    }
    pdl_wait();
    const int64_t T = kivi_store_chunk(p.kf.group);
    if (half > 0) {  // the step's RoPE (KiviRope): q's rows of g's query heads, then k's row of g
        __syncthreads();
        rope_rotate_group(r.q, r.k, g, gqa, d, rope_cs, r.n_rot, r.neox != 0, int(threadIdx.x), kStoreThreads);
        __syncthreads();  // the rotated k row is read below (global memory, this block)
    }
    const int64_t most = max64(wk.encoded, wv.encoded);
    for (int64_t chunk = 0; chunk * T < most; ++chunk) {
        encode_chunk(p, g, chunk, reinterpret_cast<__half*>(store_smem4), threadIdx.x, kStoreThreads);
    }
    // No early pdl_launch_dependents here: the attention's grid fills the GPU, and its blocks
    // would queue behind this kernel's on the SMs this kernel holds while it encodes.
    for (int role = 0; role < 2; ++role) {
        for (int64_t j = 0; j < p.n; ++j) window_token(p, role, g, j, threadIdx.x, kStoreThreads);
    }
}

// The merge (kivi_merge_block) and, in blocks (n_q n_head + g, 0), KV head g's values' oldest
// window token encoded ahead (kivi_pack_ahead), before the wait. After a fused store
// (p.fresh), these blocks then leave q's rows of g's query heads and k's row of g rotated in
// place, as the store kernel does (the RoPE ops' results; the attention read them before RoPE):
// after the wait, when no block of the attention reads them any more.
__global__ void __launch_bounds__(kMergeThreads) kivi_merge_pack_kernel(KiviAttentionParams p) {
    const int64_t rows = p.n_q * p.n_head;
    if (int64_t(blockIdx.x) < rows) return kivi_merge_block(p);
    const int64_t g = int64_t(blockIdx.x) - rows, d = p.head_dim;
    if (blockIdx.y != 0 || g >= p.n_head_kv) return;
    const KiviFresh& fr = p.fresh;
    const int half = fr.k ? int(fr.n_rot / 2) : 0;
    __shared__ float2 rope_cs[kKiviMaxRopePairs];
    if (half > 0) {
        const int64_t pos = *fr.pos0;
        for (int i = threadIdx.x; i < half; i += kMergeThreads) rope_cs[i] = rope_angle(i, pos, fr.theta_scale);
    }
    kivi_pack_ahead(p, g, kMergeWarps);
    if (half == 0) return;
    __syncthreads();
    pdl_wait();
    rope_rotate_group(fr.q, fr.k, g, int(p.n_head / p.n_head_kv), d, rope_cs, fr.n_rot, fr.neox != 0, int(threadIdx.x), kMergeThreads);
}

// ---- prefill: a block of queries on tensor cores (flash-style) ----------------------------------
// flash_prefill.cuh's block of 64 (query, head) rows of one KV head: all 128 threads stage each
// 32-token tile's keys ([token][channel]) and values (transposed, [channel][token]) in shared
// memory as fp16 hi + lo halves of the f32 numbers kivi.h's reader gives (packed tokens
// fma(code, s, z), window tokens their fp16: both exact in f32), then each warp takes its rows'
// scores, online softmax and P V there. The tile's keys and values are staged once for the
// block's 64 rows, where the per-query form (above) reads and converts them once per query (4
// rows at GQA 4).
__host__ __device__ constexpr size_t kivi_pf_smem(int d) {  // q, k, v^T hi / lo (the raw stages follow)
    return 2 * 2 * (size_t(kFlashRows + kFlashTile) * size_t(flash_qpitch(d)) + size_t(d) * kFlashVPitch);
}
}  // namespace

bool kivi_prefill(const KiviAttentionParams& p) {
    const int64_t least = p.prefill_min > 0 ? p.prefill_min : kKiviPrefillMinQueries;
    return !p.simt && p.n_q >= least && (p.head_dim == 32 || p.head_dim == 64 || p.head_dim == 96 || p.head_dim == 128);
}

namespace {

// The prefill's reads of a staged tile (kivi_issue's layout), kivi_tail_packed8's arithmetic.
// Channels c .. c + 7 of a packed key as f32, fma(code, s, z) as kivi.h reads them: zs holds the
// block's zeros [D] then scales [D] (16-byte aligned), row0 the token's code byte in channel c's
// row (rows rb bytes apart), the code at bit `shift` of it.
template <int D>
__device__ __forceinline__ void kivi_pf_key8(const uint8_t* zs, const uint8_t* row0, int rb, int shift, unsigned mask, int c, float* x) {
    const uint4 zr = *reinterpret_cast<const uint4*>(zs + 2 * c), sr = *reinterpret_cast<const uint4*>(zs + 2 * D + 2 * c);
    const auto* z2 = reinterpret_cast<const __half2*>(&zr);
    const auto* s2 = reinterpret_cast<const __half2*>(&sr);
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
        const float2 z = __half22float2(z2[e / 2]), s = __half22float2(s2[e / 2]);
        x[e] = fmaf(float((row0[e * rb] >> shift) & mask), s.x, z.x);
        x[e + 1] = fmaf(float((row0[(e + 1) * rb] >> shift) & mask), s.y, z.y);
    }
}
// Channels c .. c + 7 of the value token whose block is blk, where they lie in one row (G % 8 == 0).
__device__ __forceinline__ void kivi_pf_value8(const KiviFormatDev& f, const uint8_t* blk, int c, float* x) {
    const unsigned mask = (1u << f.bits) - 1;
    const int r = c / f.group, bit0 = (c - r * f.group) * f.bits;
    const float s = kv_half_at(blk + 2 * f.rows + 2 * r), z = kv_half_at(blk + 2 * r);
    const uint8_t* codes = blk + 4 * f.rows + r * (f.group * f.bits / 8);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int bit = bit0 + e * f.bits;
        x[e] = fmaf(float((codes[bit >> 3] >> (bit & 7)) & mask), s, z);
    }
}

// Whether tile t0's raw bytes go through the prefill's cp.async stage: keys in one packed block
// (G a multiple of 32), values packed, in rows of a multiple of 8 channels.
__device__ __forceinline__ bool kivi_pf_staged(const KiviAttentionParams& p, const KiviHeadDev& hd, int64_t t0) {
    return kivi_fast_keys(p, hd, t0) && t0 + kKiviTile <= hd.v_packed && p.vf.group % 8 == 0;
}
template <int D>
__global__ void __launch_bounds__(kFlashWarps * 32) kivi_prefill_kernel(KiviAttentionParams p) {
    extern __shared__ float4 smem4[];
    constexpr int QP = flash_qpitch(D), VP = kFlashVPitch;
    auto* qh = reinterpret_cast<__half*>(smem4);
    __half* ql = qh + kFlashRows * QP;
    __half* kh = ql + kFlashRows * QP;
    __half* kl = kh + kFlashTile * QP;
    __half* vh = kl + kFlashTile * QP;
    __half* vl = vh + D * VP;
    const int gqa = int(p.n_head / p.n_head_kv), qb = kFlashRows / gqa;  // queries a block takes
    const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
    const int64_t g = blockIdx.y, i0 = int64_t(blockIdx.x) * qb;
    const KiviHeadDev hd = p.heads[g];  // the step block: written before the pass starts (launch.cuh)
    pdl_wait();
    flash_load_q<D>(p.q, p.n_q, p.n_head, gqa, i0, g, qh, ql);
    // This thread's rows ra = 16 warp + gid and rb = ra + 8: the tokens their queries see.
    const int64_t i_last = min64(p.n_q, i0 + qb) - 1, base = hd.n_tokens - p.n_q;
    const int ra = 16 * warp + gid, rbw = ra + 8;
    const auto visible = [&](int r) {
        const int64_t i = i0 + r / gqa;
        return r < qb * gqa && i < p.n_q ? base + i + 1 : base + i_last + 1;  // padding rows: any count (q is 0)
    };
    const int64_t vis_a = visible(ra), vis_b = visible(rbw), n_end = base + i_last + 1;
    FlashRows<D> rows;
    rows.init();

    // The raw bytes of packed tiles (kivi_pf_staged) come through two cp.async stages after the
    // hi / lo buffers, the next tile's in flight while one is converted and computed; others
    // (the windows, a partial tile, other layouts) are read from global memory as they are staged.
    const int stage_bytes = kivi_stage_bytes(D, p.kf.bits, p.vf.block_bytes);  // whole 16-byte units (D % 32 == 0)
    uint8_t* raw_stage = reinterpret_cast<uint8_t*>(smem4) + kivi_pf_smem(D);
    if (kivi_pf_staged(p, hd, 0) && n_end > 0) kivi_issue<D>(p, hd, 0, raw_stage, tid, kFlashWarps * 32);
    cp_async_commit();
    int s = 0;
    for (int64_t t0 = 0; t0 < n_end; t0 += kFlashTile, s ^= 1) {
        const int64_t tn = t0 + kFlashTile;
        if (tn < n_end && kivi_pf_staged(p, hd, tn)) kivi_issue<D>(p, hd, tn, raw_stage + (s ^ 1) * stage_bytes, tid, kFlashWarps * 32);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();  // the tile's raw bytes have landed, the previous tile is read by every warp (q staged)
        const bool staged = kivi_pf_staged(p, hd, t0);
        const uint8_t* st = raw_stage + s * stage_bytes;
        const unsigned kmask = (1u << p.kf.bits) - 1;
        // Stage: item it = (role, 8-channel chunk, token), tokens fastest (a warp's lanes take 32
        // tokens of one chunk: the transposed value stores fall in distinct banks).
        for (int it = tid; it < 2 * kFlashTile * (D / 8); it += kFlashWarps * 32) {
            const int role = it / (kFlashTile * (D / 8)), rem = it - role * (kFlashTile * (D / 8));
            const int t = rem % kFlashTile, c = 8 * (rem / kFlashTile);
            const int64_t tok = t0 + t;
            float x[8];
            uint4 raw;
            if (staged) {
                if (role == 0) {
                    const int bit = t * p.kf.bits;
                    kivi_pf_key8<D>(st, st + 4 * D + c * 4 * p.kf.bits + (bit >> 3), 4 * p.kf.bits, bit & 7, kmask, c, x);
                } else {
                    kivi_pf_value8(p.vf, st + 4 * D + 4 * D * p.kf.bits + t * p.vf.block_bytes, c, x);
                }
            } else if (tok >= n_end) {
#pragma unroll
                for (int e = 0; e < 8; ++e) x[e] = 0.0f;
            } else if (kivi_tail_window8<D>(p, hd, role, int(tok), c, raw)) {
                const auto* h2 = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float2 f = __half22float2(h2[e]);
                    x[2 * e] = f.x, x[2 * e + 1] = f.y;
                }
            } else {
                kivi_tail_packed8<D>(p, hd, role, int(tok), c, x);
            }
            unsigned hi[4], lo[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) split_pair(x[2 * e], x[2 * e + 1], hi[e], lo[e]);
            if (role == 0) {
                *reinterpret_cast<uint4*>(kh + t * QP + c) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
                *reinterpret_cast<uint4*>(kl + t * QP + c) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
            } else {
                flash_put_values8<true>(vh, vl, c, t, hi, lo);
            }
        }
        __syncthreads();

        float sc[4][4];
        flash_scores<D, true>(qh, ql, kh, kl, ra, rbw, gid, tig, sc);
        flash_softmax_pv<D, true>(sc, p.scale, t0, vis_a, vis_b, vh, vl, gid, tig, rows);
    }
    pdl_launch_dependents();
    flash_store<D>(rows, p.out, p.n_q, p.n_head, gqa, i0, g, ra, rbw, tig, 1.0f);
}

template <int D>
void launch_prefill(const KiviAttentionParams& p, cudaStream_t st) {
    const int qb = kFlashRows / int(p.n_head / p.n_head_kv);
    const size_t smem = kivi_pf_smem(D) + 2 * size_t(kivi_stage_bytes(D, p.kf.bits, p.vf.block_bytes));
    static PerDevice configured;
    allow_smem(kivi_prefill_kernel<D>, smem, configured);
    launch_pdl(kivi_prefill_kernel<D>, dim3(unsigned((p.n_q + qb - 1) / qb), unsigned(p.n_head_kv)), dim3(kFlashWarps * 32), smem, st, p);
}

template <int D, int B, int NT, int VGS = 0, int MB = 4, bool F = false>
void launch_attention(const KiviAttentionParams& p, cudaStream_t st) {
    if constexpr (NT == 1 && MB == 4 && !F) {
        if (kivi_blocks_per_sm(p) == 5) return launch_attention<D, B, NT, VGS, 5>(p, st);
    }
    if constexpr (B != 0 && MB == 4 && !F) {
        if (p.fresh.k) return launch_attention<D, B, NT, VGS, 4, true>(p, st);
    }
    const int gqa = int(p.n_head / p.n_head_kv);
    size_t smem = kivi_smem_bytes(D, p.kf.bits, p.vf.block_bytes, gqa, B != 0);
    if (p.arrivals != nullptr) smem = std::max(smem, kivi_merge_inside_bytes(gqa, p.parts, D));
    static PerDevice configured, carveout;  // the largest size set so far for this kernel, per device
    allow_smem(kivi_attention_kernel<D, B, NT, VGS, MB, F>, smem, configured);
    if constexpr (MB == 5) {  // 5 blocks of ~37 KB: the largest shared-memory carveout
        once_per_device(carveout, [] {
            VXQ_CUDA_CHECK(cudaFuncSetAttribute(kivi_attention_kernel<D, B, NT, VGS, MB>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                int(cudaSharedmemCarveoutMaxShared)));
        });
    }
    launch_pdl(kivi_attention_kernel<D, B, NT, VGS, MB, F>, dim3(unsigned(p.parts), unsigned(p.n_head_kv), unsigned(p.n_q)),
               dim3(kKiviWarps * 32), smem, st, p);
}
// The tensor-core form with B-bit codes: one or two n-tiles (GQA <= 4 or <= 8), the groups of 32
// at compile time where both streams have them (VGS = 32: the values' rows, the tiles' copies).
template <int D, int B>
void launch_tensor_cores(const KiviAttentionParams& p, cudaStream_t st) {
    const bool two_tiles = p.n_head / p.n_head_kv > 4;
    if (kivi_groups32(p, D)) {
        two_tiles ? launch_attention<D, B, 2, 32>(p, st) : launch_attention<D, B, 1, 32>(p, st);
    } else {
        two_tiles ? launch_attention<D, B, 2>(p, st) : launch_attention<D, B, 1>(p, st);
    }
}

// The tensor-core form for head_dim D where the codes allow it (kivi_tensor_cores), else SIMT.
template <int D>
void launch_attention(const KiviAttentionParams& p, cudaStream_t st) {
    if constexpr (D == 64 || D == 128) {
        if (kivi_tensor_cores(p)) {
            p.kf.bits == 2 ? launch_tensor_cores<D, 2>(p, st) : launch_tensor_cores<D, 4>(p, st);
            return;
        }
    }
    launch_attention<D, 0, 0>(p, st);
}

}  // namespace

void kivi_store(const KiviStoreParams& p, cudaStream_t st) {
    if (p.n == 0) return;
    const KiviRope& r = p.rope;
    if (r.q != nullptr && (p.n != 1 || r.n_rot <= 0 || r.n_rot % 2 != 0 || r.n_rot > p.head_dim || r.n_rot / 2 > kKiviMaxRopePairs ||
                           r.n_head % p.n_head_kv != 0)) {
        throw_cuda_error(cudaErrorInvalidValue, "kivi_store: RoPE with a write of one token, an even n_rot <= head_dim and whole GQA groups",
                         __FILE__, __LINE__);
    }
    const unsigned hk = unsigned(p.n_head_kv);
    const size_t smem = kivi_store_smem(p);
    if (p.n <= kKiviSmallWrite) {
        static PerDevice small_smem;
        allow_smem(kivi_store_small_kernel, smem, small_smem);
        launch_pdl(kivi_store_small_kernel, dim3(hk), dim3(kStoreThreads), smem, st, p);
        return;
    }
    // At most slots - 1 pending tokens and the n new ones are encoded; at most `slots` new ones
    // stay in a window, the last ones. Where the host passes the plan's bounds, no block past
    // them: no encoder blocks past the tokens encoded, no window kernel when no new token goes
    // into a window.
    const int64_t slots = std::max<int64_t>(p.kf.slots, p.vf.slots), T = kivi_store_chunk(p.kf.group);
    const bool bounds = p.plan_bounds != 0;
    const int64_t chunks = bounds ? (p.encoded_most + T - 1) / T : (slots - 1 + p.n + T - 1) / T;
    if (chunks > 0 && kivi_flush_fits(p)) {
        p.head_dim == 64 ? launch_flush<64>(p, unsigned(chunks), st) : launch_flush<128>(p, unsigned(chunks), st);
    } else if (chunks > 0) {
        static PerDevice encode_smem;
        allow_smem(kivi_encode_kernel, smem, encode_smem);
        launch_pdl(kivi_encode_kernel, dim3(unsigned(chunks), hk), dim3(kStoreThreads), smem, st, p);
    }
    const int64_t first = std::max<int64_t>(p.n - std::min<int64_t>(p.n, slots), bounds ? p.window_first : 0);
    if (first >= p.n) return;
    launch_pdl(kivi_window_kernel, dim3(unsigned((p.n - first + kWindowTokens - 1) / kWindowTokens), hk, 2),
               dim3(unsigned(std::min<int64_t>(p.head_dim, 128))), 0, st, p, first);
}

bool kivi_attention_fits(int64_t n_head, int64_t n_head_kv, int64_t head_dim) {
    return n_head_kv > 0 && n_head % n_head_kv == 0 && n_head / n_head_kv <= kKiviMaxGqa && head_dim % 32 == 0 &&
           head_dim >= 32 && head_dim <= 256;
}

static int64_t kivi_tail_splits(const KiviFormatDev& kf, const KiviFormatDev& vf);
// The tensor-core form with one n-tile (GQA <= 4; head_dim 64 / 128): 128 registers, 4 or 5 blocks an SM.
static bool kivi_one_tile(const KiviAttentionParams& p) { return kivi_tensor_cores(p) && p.n_head <= 4 * p.n_head_kv; }

// One query on tensor cores at GQA <= 4 and head_dim <= 128 (4 blocks an SM): as many splits as
// leave one wave with the tail's blocks (on 132 SMs, 8 KV heads and 5 tail splits: 61). The
// power of two below (64 + 5 = 1.05 waves) measured on the H100 in the same run: kivi-2 at 4K /
// 32K / 128K 17.6 / 32.3 / 81.7 us against 15.3 / 27.9 / 80.2 with 61, kivi-4 19.1 / 37.2 / 89.1
// against 17.6 / 31.8 / 86.7 (docs/gpu.md, second session of 2026-12-06). Else a power of two
// near 4 blocks an SM.
int64_t kivi_attention_splits(const KiviAttentionParams& p) {
    const int64_t hq = std::max<int64_t>(1, p.n_head_kv * p.n_q);
    const int64_t fit = 4 * sm_count() / hq;  // blocks a (query, KV head) in one wave
    if (p.n_q == 1 && kivi_one_tile(p)) {
        const int64_t wave = kivi_blocks_per_sm(p) * sm_count() / hq;
        const int64_t s = wave - kivi_tail_splits(p.kf, p.vf);
        if (s >= wave / 2) return std::min<int64_t>(s, kMaxSplits);
    }
    const int64_t want = std::max<int64_t>(1, fit);
    int64_t s = 1;
    while (s * 2 <= want && s < kMaxSplits) s *= 2;
    return s;
}


// The tensor-core form's tail splits (kivi_tail_block): a tile each of the most a tail holds (a
// window and a partial tile: slots + 31 tokens); windows past kMaxTailSplits tiles take the SIMT
// form (kivi_tensor_cores). With a 128-token window that is 5 or 6 blocks after the 64 splits:
// for 8 KV heads past one wave (66 blocks per head at 4 blocks per SM on 132 SMs), which costs
// 1-7 % at 32K-128K; a tail of 2 blocks (3 tiles each, one wave) measured no faster there and
// slower at 1K-4K (docs/gpu.md, 2026-12-03, sixth session).
static int64_t kivi_tail_splits(const KiviFormatDev& kf, const KiviFormatDev& vf) {
    const int64_t most = std::max(kf.slots, vf.slots) + kKiviTile - 1;
    return (most + kKiviTile - 1) / kKiviTile;
}

bool kivi_tensor_cores(int64_t head_dim, const KiviFormatDev& kf, const KiviFormatDev& vf) {
    return (head_dim == 64 || head_dim == 128) && kf.bits == vf.bits && (kf.bits == 2 || kf.bits == 4) &&
           kf.group % kKiviTile == 0 && vf.group % 16 == 0 && kivi_tail_splits(kf, vf) <= kMaxTailSplits;
}

bool kivi_fused_store_fits(const KiviAttentionParams& p) {
    return p.n_q == 1 && kivi_tensor_cores(p) && kivi_blocks_per_sm(p) == 4;
}

int kivi_blocks_per_sm(const KiviAttentionParams& p) { return p.blocks_per_sm == 5 && kivi_one_tile(p) && !kivi_prefill(p) ? 5 : 4; }

int64_t kivi_attention_parts(const KiviAttentionParams& p) {
    return p.splits + (kivi_tensor_cores(p) ? kivi_tail_splits(p.kf, p.vf) : 0);
}

size_t kivi_attention_scratch_floats(const KiviAttentionParams& p) {
    if (kivi_prefill(p)) return 0;  // writes out directly
    return size_t(p.n_q * p.n_head * kivi_attention_parts(p) * (p.head_dim + 2));
}

void kivi_attention(const KiviAttentionParams& params, cudaStream_t st) {
    if (params.n_q == 0) return;
    if (params.splits < 1 || params.splits > kMaxSplits) {
        throw_cuda_error(cudaErrorInvalidValue, "kivi_attention: splits must be 1..128", __FILE__, __LINE__);
    }
    const KiviFresh& fr = params.fresh;
    if (fr.k != nullptr && !(kivi_fused_store_fits(params) && fr.v != nullptr && fr.q == params.q && fr.n_rot >= 0 &&
                             fr.n_rot % 2 == 0 && fr.n_rot <= params.head_dim && (fr.n_rot == 0 || fr.pos0 != nullptr))) {
        throw_cuda_error(cudaErrorInvalidValue,
                         "kivi_attention: a fused store needs one query in the tensor-core form at 4 blocks an SM and an even n_rot <= head_dim",
                         __FILE__, __LINE__);
    }
    if (params.pack_ahead && params.n_q != 1) {
        throw_cuda_error(cudaErrorInvalidValue, "kivi_attention: values encoded ahead in a decode step only", __FILE__, __LINE__);
    }
    if (params.out_q8.qs != nullptr && (kivi_prefill(params) || params.out_q8.s == nullptr)) {
        throw_cuda_error(cudaErrorInvalidValue, "kivi_attention: q8_0 output from the merge only (not the prefill form), with its scales", __FILE__, __LINE__);
    }
    KiviAttentionParams p = params;
    if (kivi_prefill(p)) {
        switch (p.head_dim) {
            case 32: launch_prefill<32>(p, st); return;
            case 64: launch_prefill<64>(p, st); return;
            case 96: launch_prefill<96>(p, st); return;
            default: launch_prefill<128>(p, st); return;
        }
    }
    p.parts = kivi_attention_parts(p);
    switch (p.head_dim) {
        case 32: launch_attention<32>(p, st); break;
        case 64: launch_attention<64>(p, st); break;
        case 96: launch_attention<96>(p, st); break;
        case 128: launch_attention<128>(p, st); break;
        case 160: launch_attention<160>(p, st); break;
        case 192: launch_attention<192>(p, st); break;
        case 224: launch_attention<224>(p, st); break;
        case 256: launch_attention<256>(p, st); break;
        default: throw_cuda_error(cudaErrorInvalidValue, "kivi_attention: head_dim not a multiple of 32 up to 256 (the caller checks kivi_attention_fits)", __FILE__, __LINE__);
    }
    if (p.arrivals != nullptr) return;  // merged inside
    const unsigned rows = unsigned(p.n_q * p.n_head), chunks = unsigned((p.head_dim + 31) / 32);
    if (p.pack_ahead) {
        launch_pdl(kivi_merge_pack_kernel, dim3(rows + unsigned(p.n_head_kv), chunks), dim3(kMergeThreads), 0, st, p);
    } else {
        launch_pdl(kivi_merge_kernel, dim3(rows, chunks), dim3(kMergeThreads), 0, st, p);
    }
}

}  // namespace vxq::cuda

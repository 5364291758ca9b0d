// The reader-policy split-K attention (reader_attention.cuh) and its merge, apart from their
// launchers so that a test can run them on the CPU (tests/support/simt.h: a SIMT emulator that
// compiles this header as C++ and runs each block's threads as fibers). Included by the codecs'
// kernel headers (rotated_kv_kernels.cuh, qjl_kv_kernels.cuh) only: everything is in an unnamed
// namespace.
//
// A reader policy Reader<NC, GM> (NC = head_dim / 32 channels a lane, GM rows a block) has:
//   KFormat, VFormat, Head, Params = ReaderAttentionParams<KFormat, VFormat, Head>; D = 32 NC;
//   extra_bytes(kf)             its shared memory past the queries (the block's, filled once);
//   key_tile_bytes(kf), value_tile_bytes(vf), warp_scratch_bytes(kf)
//                               a warp's buffers for one 32-token tile;
//   Reader(kf, vf, extra, tid)  what no kernel writes (tables), before pdl_wait;
//   prepare_query(qraw, qr, scale, tid, warp, lane)
//                               qr = the rows' queries as the scores read them (scaled, rotated,
//                               sketched into `extra`), once per block; every thread calls, and
//                               the block is synchronized after;
//   load(head, tile, qr, lane)  a warp's tile (tokens tile.t0 .. + 31) into its buffers, and
//                               whatever the tile's scores need (ending __syncwarp'ed);
//   score(head, tile, lane, qr, s)   s[h] = <qr_h, k^_t> for tile token t0 + lane;
//   value_scale(tile, lane)     a factor of token t0 + lane's value (its norm), 1 without;
//   value(head, tile, i, j)     channel lane + 32 j of token t0 + i's value, in the reader's domain;
//   map_back(vf, o, out, d, tid)   out = the merged o mapped back (un-rotated), once per (query, head).
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/reader_attention.cuh"

namespace vxq::cuda {
namespace {

constexpr int kAttnWarps = 4, kAttnThreads = kAttnWarps * 32, kTile = 32;
constexpr int64_t kReaderMinSplitTiles = kAttnWarps;  // the least stretch of a split that holds tokens

// core/fp16.h's fp32_to_fp16 for a norm (>= 0 or NaN): round to nearest even; a NaN norm (a NaN
// among the vector's values) as 0x7e00, what the CPU stores for a NaN of quiet_NaN's bits (the
// host keeps a NaN's payload through its conversions and double arithmetic; the device's replace
// it, so the input's payload is gone by the time the norm is a NaN).
__device__ __forceinline__ unsigned norm_fp16_bits(float n) { return n != n ? 0x7e00u : __half_as_ushort(__float2half_rn(n)); }

// The 32 bits from bit `bit` of the words on (the word after it is readable), and the `nb`-bit
// code there (nb <= 8).
__device__ __forceinline__ unsigned word_at(const uint32_t* words, int bit) {
    const int w = bit >> 5;
    return __funnelshift_r(words[w], words[w + 1], unsigned(bit) & 31u);
}
__device__ __forceinline__ unsigned code_at(const uint32_t* words, int bit, int nb) {
    return word_at(words, bit) & ((1u << nb) - 1u);
}

// `bytes` from src into shared memory (16-byte aligned) by a warp, in the widest loads that
// src's alignment and the size allow.
__device__ __forceinline__ void copy_tile(uint8_t* dst, const uint8_t* src, int bytes, int lane) {
    const unsigned at = unsigned(reinterpret_cast<uintptr_t>(src)) | unsigned(bytes);
    if ((at & 15u) == 0) {
        for (int o = lane * 16; o < bytes; o += 32 * 16) {
            *reinterpret_cast<uint4*>(dst + o) = __ldg(reinterpret_cast<const uint4*>(src + o));
        }
    } else if ((at & 3u) == 0) {
        for (int o = lane * 4; o < bytes; o += 32 * 4) {
            *reinterpret_cast<uint32_t*>(dst + o) = __ldg(reinterpret_cast<const uint32_t*>(src + o));
        }
    } else if ((at & 1u) == 0) {
        for (int o = lane * 2; o < bytes; o += 32 * 2) {
            *reinterpret_cast<uint16_t*>(dst + o) = __ldg(reinterpret_cast<const uint16_t*>(src + o));
        }
    } else {
        for (int o = lane; o < bytes; o += 32) dst[o] = __ldg(src + o);
    }
}

__host__ __device__ constexpr int align16(int bytes) { return (bytes + 15) / 16 * 16; }
// A buffer of `bytes` and a spare word (code_at reads the word after a code).
__host__ __device__ constexpr int words_buffer(int bytes) { return align16(bytes + 4); }

// The shared memory of the attention kernel and where each part starts (bytes): the prepared
// queries, the reader's own part, then the warps' tiles and scratch (aliased by the raw queries
// before and the warps' merge after).
struct AttnSmem {
    int qr, extra, work, warp_bytes, total;
    __host__ __device__ AttnSmem(int d, int gm, int ktile, int vtile, int scratch, int extra_bytes) {
        qr = 0;
        extra = qr + align16(gm * d * 4);
        work = extra + align16(extra_bytes);
        warp_bytes = align16(ktile) + align16(vtile) + gm * kTile * 4 + align16(scratch);
        int w = kAttnWarps * warp_bytes;
        w = w > kAttnWarps * gm * (d + 2) * 4 ? w : kAttnWarps * gm * (d + 2) * 4;  // the warps' merge
        w = w > gm * d * 4 ? w : gm * d * 4;                                        // the raw queries
        total = work + align16(w);
    }
};
template <class R>
__host__ __device__ AttnSmem attn_smem_of(const typename R::KFormat& kf, const typename R::VFormat& vf, int gm) {
    return AttnSmem(R::D, gm, R::key_tile_bytes(kf), R::value_tile_bytes(vf), R::warp_scratch_bytes(kf), R::extra_bytes(kf));
}

// A warp's buffers for the tile of tokens t0 .. t0 + 31.
struct ReaderTile {
    uint8_t* k;
    uint8_t* v;
    float* scratch;
    int64_t t0;
};

// Block (queries, KV head, split): NC = head_dim / 32 channels a lane; GM rows, a row a (query,
// query head of the KV head's group): QB = GM / G consecutive queries of G heads each (GM
// = reader_rows_per_block: one query and its group rounded up for a decode step, 8 rows for a
// batch), the rows past them zero and their results unused; Reader<NC, GM> reads the blocks.
// Row r's query sees its own causal stretch.
template <template <int, int> class Reader, int NC, int GM>
__global__ void __launch_bounds__(kAttnThreads) reader_attention_kernel(const typename Reader<NC, GM>::Params p) {
    using R = Reader<NC, GM>;
    VXQ_DYNAMIC_SMEM(smem);
    constexpr int D = NC * 32;
    const int g = int(blockIdx.y), split = int(blockIdx.z);
    const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
    const int G = int(p.n_head / p.n_head_kv), QB = GM / G;
    const int64_t q0 = int64_t(blockIdx.x) * QB;                  // the block's first query
    const int rows = int(p.n_q - q0 < QB ? p.n_q - q0 : QB) * G;  // the valid rows: whole queries
    const AttnSmem L = attn_smem_of<R>(p.kf, p.vf, GM);
    auto* qr = reinterpret_cast<float*>(smem + L.qr);
    uint8_t* work = smem + L.work;
    R reader(p.kf, p.vf, smem + L.extra, tid);
    pdl_wait();

    const typename R::Head head = p.heads[g];
    // Row r's tokens: query q0 + r / G sees the first n_tokens - n_q + query + 1.
    int64_t limit[GM];
#pragma unroll
    for (int r = 0; r < GM; ++r) limit[r] = r < rows ? head.n_tokens - p.n_q + q0 + r / G + 1 : 0;
    const int64_t most = head.n_tokens - p.n_q + q0 + rows / G;  // the last valid query's
    const int64_t tiles = most > 0 ? (most + kTile - 1) / kTile : 0;
    // Split z: tiles [z per, (z + 1) per), per at least a tile for each warp, so that at a short
    // depth the later splits hold none and skip the query's preparation (a block of turbo-prod or
    // QJL keys multiplies the query by a d x d or m x d sketch there) and leave at once.
    const int64_t per_even = (tiles + p.splits - 1) / p.splits;
    const int64_t per = per_even > kReaderMinSplitTiles ? per_even : kReaderMinSplitTiles;
    const int64_t tb = split * per < tiles ? split * per : tiles, te = tb + per < tiles ? tb + per : tiles;

    if (tb < te) {  // the rows' queries, prepared once per block (never per cached token)
        auto* qraw = reinterpret_cast<float*>(work);
        for (int i = tid; i < GM * D; i += kAttnThreads) {
            const int r = i / D;
            qraw[i] = r < rows ? p.q[((q0 + r / G) * p.n_head + int64_t(g) * G + r % G) * D + i % D] : 0.0f;
        }
        __syncthreads();
        reader.prepare_query(qraw, qr, p.scale, tid, warp, lane);
    }

    // Each warp: every 4th tile of [tb, te), an online softmax per query head.
    ReaderTile tile;
    tile.k = work + warp * L.warp_bytes;
    tile.v = tile.k + align16(R::key_tile_bytes(p.kf));
    auto* wsm = reinterpret_cast<float*>(tile.v + align16(R::value_tile_bytes(p.vf)));
    tile.scratch = wsm + GM * kTile;
    float m[GM], l[GM], acc[GM][NC];
#pragma unroll
    for (int h = 0; h < GM; ++h) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int j = 0; j < NC; ++j) acc[h][j] = 0.0f;
    }
    for (int64_t t = tb + warp; t < te; t += kAttnWarps) {
        tile.t0 = t * kTile;
        reader.load(head, tile, qr, lane);
        // Scores: a token per lane. A row may have no token in this tile (a batch's earlier
        // queries): its max stays -inf and nothing is added.
        float s[GM];
        reader.score(head, tile, lane, qr, s);
        const float nv = reader.value_scale(tile, lane);
#pragma unroll
        for (int h = 0; h < GM; ++h) {
            const bool valid = tile.t0 + lane < limit[h];
            const float sc = valid ? s[h] : -INFINITY;
            const float mn = fmaxf(m[h], warp_max(sc));
            const float corr = mn == -INFINITY ? 1.0f : expf(m[h] - mn);
            const float pr = valid ? expf(sc - mn) : 0.0f;
            l[h] = l[h] * corr + warp_sum(pr);
            m[h] = mn;
#pragma unroll
            for (int j = 0; j < NC; ++j) acc[h][j] *= corr;
            wsm[h * kTile + lane] = pr * nv;
        }
        __syncwarp();
        // Values: a channel per lane and NC of them, token after token (masked rows add 0).
        const int cnt = int(most - tile.t0 < kTile ? most - tile.t0 : kTile);
        for (int i = 0; i < cnt; ++i) {
            float wv[GM];
#pragma unroll
            for (int h = 0; h < GM; ++h) wv[h] = wsm[h * kTile + i];
#pragma unroll
            for (int j = 0; j < NC; ++j) {
                const float y = reader.value(head, tile, i, j);
#pragma unroll
                for (int h = 0; h < GM; ++h) acc[h][j] = fmaf(wv[h], y, acc[h][j]);
            }
        }
        __syncwarp();  // the next tile overwrites the buffers
    }

    // The warps' states, merged into this split's partial (o in the reader's domain, max, sum).
    __syncthreads();
    auto* comb = reinterpret_cast<float*>(work);
#pragma unroll
    for (int h = 0; h < GM; ++h) {
        float* row = comb + (warp * GM + h) * (D + 2);
#pragma unroll
        for (int j = 0; j < NC; ++j) row[lane + 32 * j] = acc[h][j];
        if (lane == 0) {
            row[D] = m[h];
            row[D + 1] = l[h];
        }
    }
    __syncthreads();
    for (int i = tid; i < rows * (D + 2); i += kAttnThreads) {
        const int h = i / (D + 2), c = i % (D + 2);
        float mx = -INFINITY;
        for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, comb[(w * GM + h) * (D + 2) + D]);
        float v = 0.0f;
        if (c == D) {
            v = mx;
        } else if (mx != -INFINITY) {
            for (int w = 0; w < kAttnWarps; ++w) {
                const float* row = comb + (w * GM + h) * (D + 2);
                if (row[D] != -INFINITY) v += expf(row[D] - mx) * row[c];
            }
        }
        p.partial[(((q0 + h / G) * p.n_head + int64_t(g) * G + h % G) * p.splits + split) * (D + 2) + c] = v;
    }
}

// Block (query, head): the splits' partials merged, then mapped back once (Reader::map_back).
template <template <int, int> class Reader>
__global__ void __launch_bounds__(kAttnThreads) reader_merge_kernel(const typename Reader<1, 1>::Params p) {
    __shared__ float e[kReaderMaxSplits];
    __shared__ float o[kReaderMaxHeadDim];
    const int d = int(p.head_dim), tid = int(threadIdx.x);
    const int64_t row = blockIdx.x;
    pdl_wait();
    const float* part = p.partial + row * p.splits * (d + 2);
    float mx = -INFINITY;
    for (int s = 0; s < p.splits; ++s) mx = fmaxf(mx, part[s * (d + 2) + d]);
    for (int s = tid; s < p.splits; s += kAttnThreads) {
        const float ms = part[s * (d + 2) + d];
        e[s] = ms == -INFINITY ? 0.0f : expf(ms - mx);
    }
    __syncthreads();
    float sum = 0.0f;
    for (int s = 0; s < p.splits; ++s) sum += e[s] * part[s * (d + 2) + d + 1];
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int c = tid; c < d; c += kAttnThreads) {
        float v = 0.0f;
        for (int s = 0; s < p.splits; ++s) v += e[s] * part[s * (d + 2) + c];
        o[c] = v * inv;
    }
    __syncthreads();
    Reader<1, 1>::map_back(p.vf, o, p.out + row * d, d, tid);
}

#ifdef __CUDACC__
// The launchers: the attention at GM rows a block, then the merge.
template <template <int, int> class Reader, int NC, int GM>
void launch_reader_attention_gm(const typename Reader<NC, GM>::Params& p, cudaStream_t st) {
    static PerDevice configured;
    const size_t smem = size_t(attn_smem_of<Reader<NC, GM>>(p.kf, p.vf, GM).total);
    allow_smem(reader_attention_kernel<Reader, NC, GM>, smem, configured);
    const int64_t blocks = reader_query_blocks(p.n_q, p.n_head / p.n_head_kv);
    launch_pdl(reader_attention_kernel<Reader, NC, GM>, dim3(unsigned(blocks), unsigned(p.n_head_kv), unsigned(p.splits)),
               dim3(kAttnThreads), smem, st, p);
}
template <template <int, int> class Reader, int NC>
void launch_reader_attention_nc(const typename Reader<NC, 1>::Params& p, cudaStream_t st) {
    switch (reader_rows_per_block(p.n_q, p.n_head / p.n_head_kv)) {
        case 1: launch_reader_attention_gm<Reader, NC, 1>(p, st); break;
        case 2: launch_reader_attention_gm<Reader, NC, 2>(p, st); break;
        case 4: launch_reader_attention_gm<Reader, NC, 4>(p, st); break;
        default: launch_reader_attention_gm<Reader, NC, 8>(p, st); break;
    }
}
// NCs: the head_dim / 32 the reader is built for (others: cudaErrorInvalidValue).
template <template <int, int> class Reader, int... NCs>
void launch_reader_attention(const typename Reader<1, 1>::Params& p, cudaStream_t st) {
    const bool launched = ((p.head_dim == 32 * NCs ? (launch_reader_attention_nc<Reader, NCs>(p, st), true) : false) || ...);
    if (!launched) throw_cuda_error(cudaErrorInvalidValue, "reader attention: head_dim", __FILE__, __LINE__);
    launch_pdl(reader_merge_kernel<Reader>, dim3(unsigned(p.n_q * p.n_head)), dim3(kAttnThreads), 0, st, p);
}
#endif

}  // namespace
}  // namespace vxq::cuda

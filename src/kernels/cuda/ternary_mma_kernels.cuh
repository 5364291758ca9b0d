// The TQ2_0 GEMV on the tensor cores (y = W x, x in q8_K, 1-8 tokens): int8 MMAs on the weights'
// 2-bit digits as they are stored, masked in place. Apart from gemv.cu (which launches it) so that
// the SIMT emulator's tests run it on the CPU (tests/support/simt.h), as the stream kernel's.
//
// Why: the stream kernel (ternary_stream_kernels.cuh) spends ~195 warp instructions a KB of
// weights (dp4a on masked digits, 4 shared-memory loads of x a 16-byte unit, the weights through a
// shared-memory ring) and runs at ~50 % of the copy bandwidth, bound by issuing them (docs/gpu.md).
// An m16n8k32 MMA (u8 x s8) takes 16 rows x 32 weights: here ~125 instructions a KB (SASS), the
// weights straight from global memory into registers. Measured (H100, docs/gpu.md, fourth session
// of 2026-12-06): at one token no faster than the stream kernel (every block quantizes all of x
// first, ~2/3 of its instructions at 17408 columns), so gemv.cu takes it at n = 1 only on request;
// for 2-8 tokens (B's columns) about the time of one, 2x the group kernel at 4: the default there.
//
// A tile is 16 stacked rows x one 256-block (64 bytes a row): lane (gid, tig) loads unit tig (16
// bytes) of rows gid and gid + 8. Byte k of unit c holds in bits 2 l the digit (t + 1, 0..2) of
// value 128 (c / 2) + 16 (c % 2) + 32 l + k; masked in place (& 0x03030303 << 2 l) a word of the
// unit is four such values' digits times 4^l, exact u8 numbers (<= 192), at consecutive values. So
// for each l two MMAs (words 0, 1, then 2, 3 as A's column pairs 4 tig.., 16 + 4 tig..) take the
// tile's 256 values of run l, B the matching x: x's 16 bytes of quarter-run l of unit tig, which
// every lane of that tig holds alike (all 8 columns of B and C equal; n = 1 uses one). Run l's
// int32 sum is 4^l times the digit x sum, so sum_l acc_l >> 2 l (exact) less the block's quant sum
// of x (sum (digit - 1) x = sum digit x - sum x) is the block's integer dot, times d_w d_x in
// float: ggml's TQ2_0 dot, block by block.
//
// Work: a block per SM over a stretch of stacked rows (TernaryStreamParams::rows_per_block, as the
// stream kernel), tiles of 16 rows (the last cut short: its rows past the stretch load the last
// row and are not stored); the stretch's (tile, 256-block) pairs are dealt to the W warps in turn,
// each warp keeping D pairs' loads in flight in registers (the first D issued before the wait for
// x, which ts_stage_x quantizes into shared memory, laid out [256-block][l][unit] so that the 4
// distinct 16-byte reads of a run, one a tig, are 64 consecutive bytes). A lane sums its rows'
// block products in float in its pairs' order; each warp's per-tile sums go to shared memory, and
// the block adds them in warp order: the same bits every run.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ternary_stream_kernels.cuh"

namespace vxq::cuda {

constexpr int kTmRows = 16;     // rows of an MMA tile
constexpr int kTmMaxTokens = 8;  // the batch form's tokens: B's and C's 8 columns

// Shared memory (bytes) for `tokens` rows of x and NB token columns: x [tokens][cols / 256][4 l][4
// units] runs of 16 bytes, the blocks' Q8KScale and TmXBlock [tokens][cols / 256], then the warps'
// sums [tiles][W][NB][16].
__host__ __device__ constexpr int tm_tiles(int rows_per_block) { return (rows_per_block + kTmRows - 1) / kTmRows; }
// x's d and whole quant sum of a 256-block, as the loop reads them (one 8-byte load).
struct TmXBlock {
    float d;
    int sum;
};
__host__ __device__ constexpr int tm_x_bytes(int cols, int tokens) {
    return ts_align16(tokens * cols) + ts_align16(int(sizeof(Q8KScale)) * tokens * (cols / kQK_K)) +
           ts_align16(int(sizeof(TmXBlock)) * tokens * (cols / kQK_K));
}
__host__ __device__ constexpr int tm_smem_bytes(int cols, int W, int rows_per_block, int NB = 1, int tokens = 1) {
    return tm_x_bytes(cols, tokens) + tm_tiles(rows_per_block) * W * NB * kTmRows * int(sizeof(float));
}

// A lane's two rows of a tile: their quant bytes at this lane's unit of 256-block 0, and scales.
struct TmRows {
    const uint8_t* w0;
    const uint8_t* w1;
    const __half* s0;
    const __half* s1;
};
__device__ __forceinline__ TmRows tm_rows(const TernaryStreamParams& p, int first, int end, int tile, int gid, int tig) {
    const int rb = p.cols / 4, ns = p.cols / kQK_K;
    TmRows r;
    const auto one = [&](int row, const uint8_t*& w, const __half*& s) {
        row = row < end ? row : end - 1;
        const int m = ts_matrix(p, row);
        const int64_t local = row - ts_pick(p.first_row, m);
        w = ts_pick(p.w, m) + local * rb + 16 * tig;
        s = ts_pick(p.scale, m) + local * ns;
    };
    one(first + kTmRows * tile + gid, r.w0, r.s0);
    one(first + kTmRows * tile + gid + 8, r.w1, r.s1);
    return r;
}

// A row's integer dot over a 256-block from run l's accumulators (4^l times its digit sums) less
// x's quant sum.
__device__ __forceinline__ int tm_block_dot(const int (&acc)[4][4], int e, int xsum) {
    return acc[0][e] + (acc[1][e] >> 2) + (acc[2][e] >> 4) + (acc[3][e] >> 6) - xsum;
}

// W warps, D (tile, block) pairs in flight a warp; NB = 1: one token (x in f32 quantized here, or
// q8_K; the fusions), NB = kTmMaxTokens: p.n <= 8 tokens of q8_K x (B's column j token j, lanes of
// gid >= n reading token n - 1's), y [n, rows_i]. TQ2_0 only (a scale per 256-block).
template <int W, int D, int NB>
__global__ void __launch_bounds__(W * 32, 1) ternary_mma_kernel(const TernaryStreamParams p) {
    static_assert(NB == 1 || NB == kTmMaxTokens);
    VXQ_DYNAMIC_SMEM(smem);
    const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
    const int cols = p.cols, nkb = cols / kQK_K, n = NB == 1 ? 1 : p.n;
    const int first = int(blockIdx.x) * p.rows_per_block;
    const int total = ts_pick(p.first_row, p.count);
    const int end = total - first < p.rows_per_block ? total : first + p.rows_per_block;
    const int tiles = (end - first + kTmRows - 1) / kTmRows;
    const int pairs = tiles * nkb;
    auto* xsc = reinterpret_cast<Q8KScale*>(smem + ts_align16(n * cols));  // [n][nkb]
    auto* xt = reinterpret_cast<TmXBlock*>(smem + ts_align16(n * cols) + ts_align16(int(sizeof(Q8KScale)) * n * nkb));
    auto* red = reinterpret_cast<float*>(smem + tm_x_bytes(cols, n));  // [tiles][W][NB][16]
    const uint64_t policy = ts_policy(p.evict_first);

    // Pair j of this warp is warp + j W: tile t, block kb. The issue cursor walks them.
    const int mine = pairs > warp ? (pairs - warp + W - 1) / W : 0;
    int it = warp / nkb, ikb = warp - it * nkb, rows_tile = -1;
    TmRows rows{};
    uint4 wa[D], wb[D];
    __half sa[D], sb[D];
    int kbs[D], tls[D];
    const auto issue = [&](int s, int j) {
        if (j < mine) {
            if (it != rows_tile) rows = tm_rows(p, first, end, it, gid, tig), rows_tile = it;
            wa[s] = tl_load_pieces<2>(rows.w0 + 64 * ikb, policy);
            wb[s] = tl_load_pieces<2>(rows.w1 + 64 * ikb, policy);
            sa[s] = tl_load_scale(rows.s0 + ikb, policy);
            sb[s] = tl_load_scale(rows.s1 + ikb, policy);
            kbs[s] = ikb;
            tls[s] = it;
            for (ikb += W; ikb >= nkb; ikb -= nkb) ++it;
        }
    };
#pragma unroll
    for (int s = 0; s < D; ++s) issue(s, s);

    for (int i = tid; i < tiles * W * NB * kTmRows; i += W * 32) red[i] = 0.0f;
    ts_stage_x<W, 1>(p, total, smem, xsc, [](int b, int c, int l) { return b * kQK_K + 64 * l + 16 * c; }, n);
    __syncthreads();
    pdl_launch_dependents();
    for (int i = tid; i < n * nkb; i += W * 32) xt[i] = TmXBlock{xsc[i].d, (xsc[i].sum[0] + xsc[i].sum[1]) + (xsc[i].sum[2] + xsc[i].sum[3])};
    __syncthreads();

    // This lane's B column: token gid (the last token's where gid >= n); its C columns 2 tig, 2 tig
    // + 1: tokens t0, t1 (NB = 1: token 0 in every column).
    const int bt = NB == 1 ? 0 : min(gid, n - 1);
    const int t0 = NB == 1 ? 0 : min(2 * tig, n - 1), t1 = NB == 1 ? 0 : min(2 * tig + 1, n - 1);
    const uint8_t* xbase = smem + bt * cols + 16 * tig;
    // y[i][k]: row gid + 8 i (i < 2) of the current tile, token t0 (k = 0) or t1 (k = 1; NB > 1).
    constexpr int K = NB == 1 ? 1 : 2;
    float y[2][K] = {};
    int cur = mine ? tls[0] : -1;
    const auto flush = [&] {
        float* rt = red + (cur * W + warp) * NB * kTmRows;
        if (NB == 1) {
            if (tig == 0) rt[gid] = y[0][0], rt[gid + 8] = y[1][0];
        } else {
#pragma unroll
            for (int k = 0; k < K; ++k) {
                const int t = 2 * tig + k;
                if (t < n) rt[t * kTmRows + gid] = y[0][k], rt[t * kTmRows + gid + 8] = y[1][k];
            }
        }
    };
    for (int j0 = 0; j0 < mine; j0 += D) {
#pragma unroll
        for (int s = 0; s < D; ++s) {
            if (j0 + s >= mine) break;  // warp-uniform
            const uint4 a = wa[s], b = wb[s];
            const float dw[2] = {__half2float(sa[s]), __half2float(sb[s])};
            const int kb = kbs[s], t = tls[s];
            issue(s, j0 + s + D);
            if (t != cur) {
                flush();
#pragma unroll
                for (int i = 0; i < 2; ++i) {
#pragma unroll
                    for (int k = 0; k < K; ++k) y[i][k] = 0.0f;
                }
                cur = t;
            }
            const auto* xr = reinterpret_cast<const uint4*>(xbase + kb * kQK_K);
            int acc[4][4];
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                const unsigned m = 0x03030303u << (2 * l);
                const uint4 x = xr[4 * l];
                mma_u8s8_first(acc[l], make_uint4(a.x & m, b.x & m, a.y & m, b.y & m), x.x, x.y);
                mma_u8s8(acc[l], make_uint4(a.z & m, b.z & m, a.w & m, b.w & m), x.z, x.w);
            }
#pragma unroll
            for (int k = 0; k < K; ++k) {
                const TmXBlock xk = xt[(k ? t1 : t0) * nkb + kb];
#pragma unroll
                for (int i = 0; i < 2; ++i) y[i][k] += float(tm_block_dot(acc, 2 * i + k, xk.sum)) * (dw[i] * xk.d);
            }
        }
    }
    if (mine) flush();
    __syncthreads();

    // Row r of the stretch, token t: its warps' sums in warp order.
    const int span = end - first;
    for (int e = tid; e < n * span; e += W * 32) {
        const int t = NB == 1 ? 0 : e / span, r = e - t * span;
        const float* rs = red + ((r / kTmRows) * W * NB + t) * kTmRows + r % kTmRows;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < W; ++w) v += rs[w * NB * kTmRows];
        const int row = first + r, m = ts_matrix(p, row), m0 = ts_pick(p.first_row, m);
        ts_pick(p.y, m)[int64_t(t) * (ts_pick(p.first_row, m + 1) - m0) + row - m0] = v;  // y_m [n, rows_m]
        if (p.resid) p.resid[row] += v;  // n == 1, count == 1: row is the matrix's own
    }
}

}  // namespace vxq::cuda

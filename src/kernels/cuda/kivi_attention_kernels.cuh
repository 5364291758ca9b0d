// KIVI's split-K decode attention (kivi.cuh: kivi_attention) and its merge, apart from their
// launchers in kivi.cu so that a test runs them on the CPU (tests/support/simt.h, a SIMT emulator
// that compiles this header as C++ and runs a block's threads as fibers; tests/test_kivi_attention_simt.cpp):
// the SIMT form, the tensor-core form over whole packed tiles and its tail over the fp16 windows.
// Included by kivi.cu and that test only: everything is in an unnamed namespace.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/kivi.cuh"
#include "kernels/cuda/kivi_quantize.cuh"
#include "kernels/cuda/kv_codes.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/rope.cuh"

namespace vxq::cuda {
namespace {

constexpr int kKiviWarps = 4;
constexpr int kKiviTile = 32;     // tokens a warp takes at a time: a lane per token
constexpr int kKiviMaxGqa = 8;
constexpr int kKiviMinStretch = 64;

__host__ __device__ constexpr int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ constexpr int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// Whether a stream is in groups of 32 with `rows` rows of a block (keys: head_dim channels of 32
// tokens; values: head_dim / 32 rows of a token), each its zero, scale and 32 codes: the values'
// group the tensor-core form takes at compile time (VGS = 32), and the flush's layout.
__host__ __device__ constexpr int64_t kivi_block32_bytes(int64_t rows, int bits) { return rows * (4 + 4 * bits); }
inline bool kivi_group32(const KiviFormatDev& f, int64_t rows) {
    return f.group == 32 && f.rows == rows && f.block_bytes == kivi_block32_bytes(rows, f.bits);
}

// Whether the tensor-core form takes both streams in groups of 32 (its VGS = 32 instances).
inline bool kivi_groups32(const KiviAttentionParams& p, int64_t d) { return kivi_group32(p.vf, d / 32) && kivi_group32(p.kf, d); }

// ---- attention --------------------------------------------------------------------------------

// Shared memory: q of the group's heads [g4][D] f32 (heads past the group zero), then per warp two
// stages of a tile's bytes, each [zeros and scales of its key block: 4 D][its key codes: D rows of
// 4 bits bytes][its packed value blocks: 32 x vbb] (cp.async, the next tile's in flight while one
// is computed), then the SIMT form's q * s per channel [D][g4] and the tile's probabilities
// [32][g4] (the tensor-core form: probabilities [g4][32] there); at the end each warp's region
// holds its state for the merge. g4: gqa rounded up to 4 (float4 loads; a tensor-core n-tile).
__host__ __device__ constexpr int kivi_g4(int gqa) { return (gqa + 3) & ~3; }
__host__ __device__ constexpr int kivi_stage_bytes(int d, int kbits, int vbb) { return 4 * d + 4 * d * kbits + kKiviTile * vbb; }
__host__ __device__ constexpr int kivi_warp_bytes(int d, int kbits, int vbb, int g4) {
    return 2 * kivi_stage_bytes(d, kbits, vbb) + 4 * (d * g4 + kKiviTile * g4);
}

// A tile's keys lie in one packed block (G a multiple of 32): its codes go through shared memory.
__device__ __forceinline__ bool kivi_fast_keys(const KiviAttentionParams& p, const KiviHeadDev& hd, int64_t t0) {
    return p.kf.group % kKiviTile == 0 && t0 + kKiviTile <= hd.k_packed;
}

// Starts the copies of tile t0's bytes into a stage by threads tid of nthreads (the caller
// commits them: one group per tile, empty or not).
template <int D>
__device__ void kivi_issue(const KiviAttentionParams& p, const KiviHeadDev& hd, int64_t t0, uint8_t* stage, int tid, int nthreads) {
    const int kbits = p.kf.bits, KG = p.kf.group, krb = KG * kbits / 8, vbb = p.vf.block_bytes;
    const int t = int(t0);  // a cache's token counts fit 32 bits (its context): no 64-bit division
    if (kivi_fast_keys(p, hd, t0)) {
        const uint8_t* blk = reinterpret_cast<const uint8_t*>(hd.k) + int64_t(KG == kKiviTile ? t >> 5 : t / KG) * p.kf.block_bytes;
        if (KG == kKiviTile) {
            // The tile is the key block: its zeros, scales and code rows (4 bits bytes each) are
            // laid out as the stage holds them, one contiguous copy.
            for (int u = tid; u < D / 4 + D * kbits / 4; u += nthreads) cp_async16(stage + 16 * u, blk + 16 * u);
        } else {
            for (int u = tid; u < D / 4; u += nthreads) cp_async16(stage + 16 * u, blk + 16 * u);
            const uint8_t* codes = blk + 4 * D + (t % KG) * kbits / 8;
            uint8_t* kc = stage + 4 * D;
            if (kbits == 2) {
                for (int c = tid; c < D; c += nthreads) cp_async8(kc + 8 * c, codes + c * krb);
            } else {
                const int units = kbits / 4;  // 16-byte units of a row's 4 bits bytes
                for (int idx = tid; idx < D * units; idx += nthreads) {
                    const int c = idx / units, u = idx - c * units;
                    cp_async16(kc + c * 4 * kbits + 16 * u, codes + c * krb + 16 * u);
                }
            }
        }
    }
    if (t0 < hd.v_packed) {
        const int units = (int(min64(kKiviTile, hd.v_packed - t0)) * vbb + 15) / 16;
        const uint8_t* src = reinterpret_cast<const uint8_t*>(hd.v) + int64_t(t) * vbb;
        uint8_t* dst = stage + 4 * D + 4 * D * kbits;
        for (int u = tid; u < units; u += nthreads) cp_async16(dst + 16 * u, src + 16 * u);
    }
}

// kivi_issue by a warp where the tile is known whole and packed in both streams, and both are in
// groups of 32 of PB bits (kivi_group32: the tensor-core form's VGS = 32 instance): its key block
// and its 32 value blocks are two contiguous runs of compile-time size, copied straight (the
// general form above tests the format and loops per tile). PB = 0: the general form.
// Bytes [0, N) (a multiple of 16, known at compile time) from src to dst by a warp's lanes.
// Hint: the copies carry an L2 policy (l2_policy), else they are plain cp.async.
template <int N, bool Hint>
__device__ __forceinline__ void kivi_copy_warp(uint8_t* dst, const uint8_t* src, int lane, [[maybe_unused]] uint64_t policy) {
    constexpr int U = N / 16;
#pragma unroll
    for (int j = 0; j < (U + 31) / 32; ++j) {
        const int u = lane + 32 * j;
        if (U % 32 == 0 || u < U) {
            if constexpr (Hint) {
                cp_async16_hint(dst + 16 * u, src + 16 * u, policy);
            } else {
                cp_async16(dst + 16 * u, src + 16 * u);
            }
        }
    }
}
template <int D, int PB>
__device__ __forceinline__ void kivi_issue_warp(const KiviAttentionParams& p, const KiviHeadDev& hd, int64_t t0, uint8_t* stage, int lane) {
    if constexpr (PB == 0) {
        kivi_issue<D>(p, hd, t0, stage, lane, 32);
    } else {
        constexpr int KB = int(kivi_block32_bytes(D, PB)), VB = int(kivi_block32_bytes(D / 32, PB));  // a key block, a value token's
        const int t = int(t0);
        const uint8_t *k = reinterpret_cast<const uint8_t*>(hd.k) + int64_t(t >> 5) * KB, *v = reinterpret_cast<const uint8_t*>(hd.v) + int64_t(t) * VB;
        if (p.tiles_evict_first != 0) {  // (KiviAttentionParams::tiles_evict_first)
            const uint64_t policy = l2_policy(true);
            kivi_copy_warp<KB, true>(stage, k, lane, policy);
            kivi_copy_warp<kKiviTile * VB, true>(stage + KB, v, lane, policy);
        } else {
            kivi_copy_warp<KB, false>(stage, k, lane, 0);
            kivi_copy_warp<kKiviTile * VB, false>(stage + KB, v, lane, 0);
        }
    }
}

// Warp w's tiles of [t_begin, t_end) (t_begin a multiple of 32): every 4th 32-token tile, its
// bytes in a stage of the warp's 2-stage ring, the next tile's copies in flight while
// f(t0, stage) computes one; the ring is drained at the end. PB: kivi_issue_warp's.
template <int D, int PB = 0, class F>
__device__ __forceinline__ void kivi_tiles(const KiviAttentionParams& p, const KiviHeadDev& hd, uint8_t* wbase, int stage_bytes,
                                           int64_t t_begin, int64_t t_end, int warp, int lane, F&& f, bool issued = false) {
    int64_t t0 = t_begin + warp * kKiviTile;
    if (t0 < t_end && !issued) {  // (issued: the caller copied the first tile into stage 0 and committed it)
        kivi_issue_warp<D, PB>(p, hd, t0, wbase, lane);
        cp_async_commit();
    }
    for (int k = 0; t0 < t_end; ++k, t0 += kKiviWarps * kKiviTile) {
        const int64_t tn = t0 + kKiviWarps * kKiviTile;
        if (tn < t_end) kivi_issue_warp<D, PB>(p, hd, tn, wbase + ((k + 1) & 1) * stage_bytes, lane);
        cp_async_commit();
        cp_async_wait<1>();
        __syncwarp();
        f(t0, wbase + (k & 1) * stage_bytes);
        __syncwarp();  // the next issue overwrites this stage; f's scratch is rewritten
    }
    cp_async_wait<0>();
    __syncwarp();
}

// The tokens each of `splits` splits of n takes: whole tiles, at least `least`. On the integer
// type I: the fused store's test for the tail's owner runs it in 32 bits (a 64-bit division is a
// call).
template <class I>
__device__ __forceinline__ I kivi_stretch_per(I n, I splits, I least) {
    const I per = ((n + splits - 1) / splits + kKiviTile - 1) / kKiviTile * kKiviTile;
    return per > least ? per : least;
}
// The stretch [begin, end) of n tokens that split z of `splits` takes (kivi_stretch_per's), at
// least kKiviMinStretch tokens unless told.
__device__ __forceinline__ void kivi_stretch(int64_t n, int64_t splits, int64_t z, int64_t& begin, int64_t& end,
                                             int64_t least = kKiviMinStretch) {
    const int64_t per = kivi_stretch_per<int64_t>(n, splits, least);
    begin = z * per;
    end = min64(n, begin + per);
}

// A warp's online softmax over its tokens for up to H query heads with CPL value channels a lane
// (the SIMT form and the tail), and its state where the block's merge reads it: o [gqa][D], then
// (max, sum) per head.
template <int H, int CPL>
struct KiviWarpSoftmax {
    float m[H], l[H], o[H][CPL];
    __device__ __forceinline__ KiviWarpSoftmax() {
#pragma unroll
        for (int h = 0; h < H; ++h) {
            m[h] = -INFINITY;
            l[h] = 0.0f;
#pragma unroll
            for (int j = 0; j < CPL; ++j) o[h][j] = 0.0f;
        }
    }
    // channel(j): the lane's j-th value channel.
    template <class Channel>
    __device__ __forceinline__ void store(float* ws, int gqa, int d, int lane, Channel channel) const {
#pragma unroll
        for (int h = 0; h < H; ++h) {
            if (h >= gqa) continue;
#pragma unroll
            for (int j = 0; j < CPL; ++j) ws[h * d + channel(j)] = o[h][j];
            if (lane == 0) {
                ws[gqa * d + 2 * h] = m[h];
                ws[gqa * d + 2 * h + 1] = l[h];
            }
        }
    }
};

// The SIMT form: warp w of the block takes every 4th 32-token tile of [t_begin, t_end) (t_begin a
// multiple of 32) and leaves its state (o [gqa][D], then (m, l) per head) at wbase.
template <int D>
__device__ void kivi_simt_warp(const KiviAttentionParams& p, const KiviHeadDev& hd, const float* q_s, uint8_t* wbase,
                               int64_t t_begin, int64_t t_end, int warp, int lane, int gqa, int g4) {
    constexpr int CPL = D / 32;  // value channels per lane
    const int kbits = p.kf.bits, KG = p.kf.group, krb = KG * kbits / 8;
    const int VG = p.vf.group, vbits = p.vf.bits, vrows = p.vf.rows, vrb = VG * vbits / 8, vbb = p.vf.block_bytes;
    const unsigned kmask = (1u << kbits) - 1, vmask = (1u << vbits) - 1;
    const int stage_bytes = kivi_stage_bytes(D, kbits, vbb);
    auto* qs_s = reinterpret_cast<float*>(wbase + 2 * stage_bytes);
    float* p_s = qs_s + D * g4;
    const auto* kbase = reinterpret_cast<const uint8_t*>(hd.k);

    KiviWarpSoftmax<kKiviMaxGqa, CPL> st;
    const int c0 = lane * CPL;
    // Value channels of a lane in one row (CPL divides G): its codes are one run of bits.
    const bool one_row = VG % CPL == 0;
    const int vr = c0 / VG, vbit0 = (c0 % VG) * vbits;
    const int vbytes = ((vbit0 & 7) + CPL * vbits + 7) >> 3;
    // This lane's channels of a packed value token whose channels lie in one row (one_row).
    const auto row_values = [&](const uint8_t* blk, float* x) {
        const float zf = kv_half_at(blk + 2 * vr), sf = kv_half_at(blk + 2 * vrows + 2 * vr);
        const uint8_t* cb = blk + 4 * vrows + vr * vrb + (vbit0 >> 3);
        uint64_t bits = cb[0];
        for (int e = 1; e < vbytes; ++e) bits |= uint64_t(cb[e]) << (8 * e);
        bits >>= (vbit0 & 7);
#pragma unroll
        for (int j = 0; j < CPL; ++j) x[j] = fmaf(float(unsigned(bits >> (j * vbits)) & vmask), sf, zf);
    };
    // o += p_h(t) x for the group's heads (the tile's probabilities in p_s).
    const auto accumulate = [&](int t, const float* x) {
        const float4 pa = *reinterpret_cast<const float4*>(p_s + t * g4);
        const float4 pb = g4 > 4 ? *reinterpret_cast<const float4*>(p_s + t * g4 + 4) : pa;
        const float pv[kKiviMaxGqa] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
#pragma unroll
        for (int h = 0; h < kKiviMaxGqa; ++h) {
            if (h >= gqa) continue;
#pragma unroll
            for (int j = 0; j < CPL; ++j) st.o[h][j] = fmaf(pv[h], x[j], st.o[h][j]);
        }
    };

    kivi_tiles<D>(p, hd, wbase, stage_bytes, t_begin, t_end, warp, lane, [&](int64_t t0, const uint8_t* stage) {
        const int cnt = int(min64(kKiviTile, t_end - t0));
        float acc[kKiviMaxGqa];
#pragma unroll
        for (int h = 0; h < kKiviMaxGqa; ++h) acc[h] = 0.0f;
        if (kivi_fast_keys(p, hd, t0)) {
            // sum_c (q_c s_c) code_c,t + sum_c q_c z_c: q * s per channel, then a lane per token.
            const auto* kc = reinterpret_cast<const uint32_t*>(stage + 4 * D);
            float zs[kKiviMaxGqa];
#pragma unroll
            for (int h = 0; h < kKiviMaxGqa; ++h) zs[h] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < CPL; ++kk) {
                const int c = lane + 32 * kk;
                const float zc = kv_half_at(stage + 2 * c), sc = kv_half_at(stage + 2 * D + 2 * c);
#pragma unroll
                for (int h = 0; h < kKiviMaxGqa; ++h) {
                    if (h < gqa) {
                        const float qv = q_s[h * D + c];
                        qs_s[c * g4 + h] = qv * sc;
                        zs[h] = fmaf(qv, zc, zs[h]);
                    }
                }
            }
#pragma unroll
            for (int h = 0; h < kKiviMaxGqa; ++h) zs[h] = h < gqa ? warp_sum(zs[h]) : 0.0f;
            __syncwarp();
            const int wi = (lane * kbits) >> 5, sh = (lane * kbits) & 31;
#pragma unroll 4
            for (int c = 0; c < D; ++c) {
                const float f = float((kc[c * kbits + wi] >> sh) & kmask);
                const float4* qc = reinterpret_cast<const float4*>(qs_s + c * g4);
                const float4 a = qc[0];
                acc[0] = fmaf(a.x, f, acc[0]);
                acc[1] = fmaf(a.y, f, acc[1]);
                acc[2] = fmaf(a.z, f, acc[2]);
                acc[3] = fmaf(a.w, f, acc[3]);
                if (g4 > 4) {
                    const float4 b = qc[1];
                    acc[4] = fmaf(b.x, f, acc[4]);
                    acc[5] = fmaf(b.y, f, acc[5]);
                    acc[6] = fmaf(b.z, f, acc[6]);
                    acc[7] = fmaf(b.w, f, acc[7]);
                }
            }
#pragma unroll
            for (int h = 0; h < kKiviMaxGqa; ++h) acc[h] += zs[h];
        } else if (lane < cnt) {
            // Keys a lane per token: packed element by element (G < 32), or the fp16 window's row.
            const int64_t tt = t0 + lane;
            if (tt < hd.k_packed) {
                const uint8_t* blk = kbase + (tt / KG) * p.kf.block_bytes;
                const int bit = int(tt % KG) * kbits;
                const uint8_t* codes = blk + 4 * D + (bit >> 3);
                for (int c = 0; c < D; ++c) {
                    const unsigned code = (codes[c * krb] >> (bit & 7)) & kmask;
                    const float x = fmaf(float(code), kv_half_at(blk + 2 * D + 2 * c), kv_half_at(blk + 2 * c));
#pragma unroll
                    for (int h = 0; h < kKiviMaxGqa; ++h) {
                        if (h < gqa) acc[h] = fmaf(q_s[h * D + c], x, acc[h]);
                    }
                }
            } else {
                const auto* row =
                    reinterpret_cast<const uint8_t*>(hd.kw) + ((hd.k_head + tt - hd.k_packed) % p.kf.slots) * D * 2;
#pragma unroll 4
                for (int cb = 0; cb < D; cb += 8) {
                    const uint4 u = *reinterpret_cast<const uint4*>(row + 2 * cb);
                    const auto* h2 = reinterpret_cast<const __half2*>(&u);
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const float2 f = __half22float2(h2[e]);
#pragma unroll
                        for (int h = 0; h < kKiviMaxGqa; ++h) {
                            if (h < gqa) {
                                acc[h] = fmaf(q_s[h * D + cb + 2 * e], f.x, acc[h]);
                                acc[h] = fmaf(q_s[h * D + cb + 2 * e + 1], f.y, acc[h]);
                            }
                        }
                    }
                }
            }
        }
        // The online softmax of each head over the tile (a lane per token).
#pragma unroll
        for (int h = 0; h < kKiviMaxGqa; ++h) {
            if (h >= gqa) continue;
            const float s = lane < cnt ? acc[h] * p.scale : -INFINITY;
            const float mn = fmaxf(st.m[h], warp_max(s));
            const float corr = expf(st.m[h] - mn);
            const float pv = lane < cnt ? expf(s - mn) : 0.0f;
            st.l[h] = st.l[h] * corr + warp_sum(pv);
#pragma unroll
            for (int j = 0; j < CPL; ++j) st.o[h][j] *= corr;
            st.m[h] = mn;
            p_s[lane * g4 + h] = pv;
        }
        __syncwarp();
        // Values: lane l owns channels [l CPL, l CPL + CPL).
        const uint8_t* vstage = stage + 4 * D + 4 * D * kbits;
        if (one_row && cnt == kKiviTile && t0 + kKiviTile <= hd.v_packed) {
            // A whole packed tile (the common case): no per-token branches, tokens unrolled.
#pragma unroll 4
            for (int t = 0; t < kKiviTile; ++t) {
                float x[CPL];
                row_values(vstage + t * vbb, x);
                accumulate(t, x);
            }
        } else {
            // Token by token, 4 at a time with their loads first (the window's rows come from
            // global memory: one at a time, their latencies would add up).
            // The window's ring slot of the tile's first window token, once (a 64-bit % per token
            // made this loop, on one warp's critical path, the slowest part of a short call).
            const int tw = int(max64(0, hd.v_packed - t0));
            const int slot_w = t0 + kKiviTile > hd.v_packed ? int((hd.v_head + t0 + tw - hd.v_packed) % p.vf.slots) : 0;
            const auto values = [&](int t, float* x) {
                if (t >= tw) {  // the fp16 window
                    int slot = slot_w + t - tw;
                    while (slot >= p.vf.slots) slot -= p.vf.slots;
                    const auto* row = reinterpret_cast<const uint8_t*>(hd.vw) + int64_t(slot) * D * 2 + 2 * c0;
                    if constexpr (CPL % 4 == 0) {
#pragma unroll
                        for (int j = 0; j < CPL; j += 4) {
                            const uint2 u = *reinterpret_cast<const uint2*>(row + 2 * j);
                            const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
                            const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
                            x[j] = a.x;
                            x[j + 1] = a.y;
                            x[j + 2] = b.x;
                            x[j + 3] = b.y;
                        }
                    } else {
#pragma unroll
                        for (int j = 0; j < CPL; ++j) x[j] = kv_half_at(row + 2 * j);
                    }
                } else if (one_row) {
                    row_values(vstage + t * vbb, x);
                } else {
                    const uint8_t* blk = vstage + t * vbb;
#pragma unroll
                    for (int j = 0; j < CPL; ++j) {
                        const int c = c0 + j, r = c / VG, bit = (c % VG) * vbits;
                        const unsigned code = (blk[4 * vrows + r * vrb + (bit >> 3)] >> (bit & 7)) & vmask;
                        x[j] = fmaf(float(code), kv_half_at(blk + 2 * vrows + 2 * r), kv_half_at(blk + 2 * r));
                    }
                }
            };
            constexpr int kBatch = 4;
            for (int t = 0; t < cnt; t += kBatch) {
                float x[kBatch][CPL];
#pragma unroll
                for (int u = 0; u < kBatch; ++u) {
                    if (t + u < cnt) values(t + u, x[u]);
                }
#pragma unroll
                for (int u = 0; u < kBatch; ++u) {
                    if (t + u < cnt) accumulate(t + u, x[u]);
                }
            }
        }
    });

    st.store(reinterpret_cast<float*>(wbase), gqa, D, lane, [&](int j) { return c0 + j; });
}

// ---- the tensor-core form: whole tiles of packed 2- or 4-bit keys and values ----
// Tokens [0, t_tc) of a query where every 32-token tile lies in one packed key block and its
// values are packed; the rest (the fp16 windows, a partial tile) goes to the SIMT form.
__device__ __forceinline__ int64_t kivi_tc_tokens(const KiviHeadDev& hd, int64_t n_vis) {
    return min64(hd.k_packed, min64(hd.v_packed, n_vis)) & ~int64_t(kKiviTile - 1);
}

// A lane's codes as exact fp16 MMA operands: two words' bytes picked by one PRMT put the lane's
// code (row gid: a token of a key row, a channel of a value token) at bit `pos` < 8 of each 16-bit
// half, where a mask keeps it and or-s in 1024's exponent, and subtracting 1024 leaves code 2^pos,
// the same factor for every element of the lane's rows gid and gid + 8, which `unscale` = 2^-pos
// undoes on its accumulators. (Before: a shift per word as well, to bit 0. Codes as fp16
// subnormals, code 2^(pos - 24), would save the subtraction, but the H200's tensor cores added
// them with ~2^-15 relative error, against ~2^-20 for these.)
//   2 bits: 16 codes a word, gid's at bit 2 gid of a half (gid + 8's in the high half): gid < 4
//           in its low byte, else its second byte (moved down by the PRMT); pos = 2 (gid % 4).
//   4 bits: 8 codes a word at bit 4 gid: byte gid / 2, pos = 4 (gid % 2); lo() only.
template <int B>
struct KiviCodeLane {
    unsigned sel_lo, sel_hi, mask;
    float unscale;
    __device__ __forceinline__ explicit KiviCodeLane(int gid) {
        int pos;
        if constexpr (B == 2) {
            pos = 2 * (gid & 3);
            sel_lo = gid < 4 ? 0x5410u : 0x6521u;  // low halves of x, y, or those halves' second bytes
            sel_hi = gid < 4 ? 0x7632u : 0x7733u;  // high halves, or their second bytes
            mask = 0x00030003u << pos;
        } else {
            const unsigned b = unsigned(gid) >> 1;
            pos = 4 * (gid & 1);
            sel_lo = sel_hi = b | (b << 4) | ((4 + b) << 8) | ((4 + b) << 12);
            mask = 0x000F000Fu << pos;
        }
        unscale = __int_as_float((127 - pos) << 23);
    }
    // The lane's code of word x (low half) and of word y (high half): lo from the words' low
    // halves (4 bits: from the byte holding it), hi from their high halves (2 bits).
    __device__ __forceinline__ unsigned lo(unsigned x, unsigned y) const { return exact(__byte_perm(x, y, sel_lo)); }
    __device__ __forceinline__ unsigned hi(unsigned x, unsigned y) const { return exact(__byte_perm(x, y, sel_hi)); }

private:
    __device__ __forceinline__ unsigned exact(unsigned v) const {
        const unsigned h = (v & mask) | 0x64006400u;  // 1024 + code 2^pos: exact, pos + bits <= 10
        const __half2 x = __hsub2(*reinterpret_cast<const __half2*>(&h), __halves2half2(__ushort_as_half(0x6400), __ushort_as_half(0x6400)));
        return *reinterpret_cast<const unsigned*>(&x);
    }
};
// The tensor-core form's operands x = hi + lo / kKiviLo (hi = fp16(x), lo = fp16(kKiviLo (x - hi)),
// mma.cuh's split at a scale of 2^8: lo stays a normal fp16 number for |x| >= 2^-11, and 2^8 |hi|
// overflows fp16 only past |x| = 255.9, where kivi_tc_warp falls back to the SIMT form).
constexpr float kKiviLo = 256.0f, kKiviLoInv = 1.0f / 256.0f;
// The hi (part 0) or lo (part 1) half pair of f32 (x0, x1) by one sequence for both parts: fp16(y)
// with y = x sc + fp16(x) nsc, (sc, nsc) = (1, 0) for hi and (2^8, -2^8) for lo (x - fp16(x) is
// exact in f32); `hi` gets fp16(x) for both.
struct KiviPart {
    float sc, nsc;
    __device__ __forceinline__ explicit KiviPart(int part) : sc(part ? kKiviLo : 1.0f), nsc(part ? -kKiviLo : 0.0f) {}
    __device__ __forceinline__ unsigned operator()(float x0, float x1, unsigned& hi) const {
        const __half2 h2 = __floats2half2_rn(x0, x1);
        hi = *reinterpret_cast<const unsigned*>(&h2);
        const float2 h = __half22float2(h2);
        const __half2 y = __floats2half2_rn(fmaf(h.x, nsc, x0 * sc), fmaf(h.y, nsc, x1 * sc));
        return *reinterpret_cast<const unsigned*>(&y);
    }
};
// The hi or lo part of x = y s for a pair of y given in parts (yh = fp16(y), a = the lane's part
// of y: yh for hi, fp16(2^8 (y - yh)) for lo) and fp16 s, in fp16x2 arithmetic, 5 instructions a
// pair where KiviPart on f32 products takes ~10: h = fp16(yh s) for both parts; for lo,
// e = 2^8 yh s - 2^8 h (exact: an fp16 product's rounding error, scaled out of the subnormals for
// |x| >= 2^-12) and lo = fp16(a s + e) = fp16(2^8 (y s - h)) within 2^-11 of itself. For hi the
// constants are 0, so e = 0 and the result is fp16(yh s) = h. Together hi + lo / 2^8 is y s within
// ~2^-21 |y s| (2^-33 absolutely below 2^-12). Past |h| = 255.9, 2^8 h overflows: the lo part is
// then infinite or NaN, which the caller detects.
struct KiviHalfPart {
    unsigned k, nk;  // fp16x2 (2^8, 2^8) and (-2^8, -2^8) for lo, zeros for hi
    __device__ __forceinline__ explicit KiviHalfPart(int part) : k(part ? 0x5C005C00u : 0u), nk(part ? 0xDC00DC00u : 0u) {}
    __device__ __forceinline__ unsigned operator()(unsigned a, unsigned yh, unsigned s) const {
        const unsigned h = h2_mul(yh, s);
        return h2_fma(a, s, h2_fma(h2_mul(yh, k), s, h2_mul(h, nk)));
    }
};

// Warp w takes every 4th 32-token tile of [t_begin, t_end) (whole tiles, kivi_tc_tokens) with
// m16n8k16 MMAs (mma.cuh's fragments; gid = lane / 4, tig = lane % 4). An n-tile's 8 columns are
// 4 query heads x (hi, lo): column n is head 4 nt + n / 2, part n % 2.
//   keys    S[32 tokens x 8] = codes[32 x D] B, B[c][n] = the hi / lo part of q'_h(c) s(c) (q' = q
//           scale, from the block's table q_tab in parts; the key block's scales), the codes
//           exact fp16 numbers; s = S_hi + S_lo / 2^8 + scale sum_c q_h(c) z(c). Thread (gid, tig)
//           holds head tig's scores of tokens gid, gid + 8, 16 + gid, 24 + gid.
//   values  O[D x 8] += codes^T[D x 32 tokens] P', P'[t][n] = the part of p_h(t) s_t(r) for the
//           channels' value row r, and sum_t p_h(t) z_t(r) per (head, row) on the side (lane (gid,
//           tig): head tig, row gid), added when the state is written.
// B's parts are made in fp16x2 arithmetic (KiviHalfPart). Where a part overflows (|q' s| or |p s|
// past 255.9: keys or values of a range beyond ~700 at 2 bits) a score or the state is not finite,
// and the warp does its stretch again in the SIMT form. The tensor cores add in f32:
// dequantize-then-attend within ~1e-6 relative (mma.cuh).
// VGS: 32 where both streams are in groups of 32 (kivi_group32; the default: every value row's
// offset in a token's block is then a constant, a tile's copies straight), else 0 (the values'
// group read from p: a division per m-tile).
template <int D, int B, int NT, int VGS, int MB>
__device__ bool kivi_tc_warp(const KiviAttentionParams& p, const KiviHeadDev& hd, const float* q_s, const uint4* q_tab, uint8_t* wbase,
                             int64_t t_begin, int64_t t_end, int warp, int lane, int gqa, bool issued) {
    constexpr int MT = D / 16;                   // 16-channel steps (keys) / m-tiles (values)
    const int gid = lane >> 2, tig = lane & 3, hq = gid >> 1, part = gid & 1;
    const int VG = VGS ? VGS : p.vf.group, vrows = VGS ? D / VGS : p.vf.rows, vrb = VG * B / 8;
    const int vbb = VGS ? (D / VGS) * (4 + VGS * B / 8) : p.vf.block_bytes;
    const int stage_bytes = kivi_stage_bytes(D, B, vbb);
    float* p_s = reinterpret_cast<float*>(wbase + 2 * stage_bytes);  // [4 NT heads][32 tokens]
    const KiviCodeLane<B> cl(gid);
    const KiviPart split(part);
    const KiviHalfPart hpart(part);
    bool bad = false;  // a score that is not finite: a B part overflowed

    float o[MT][NT][4], m[NT], l[NT], bias[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        m[nt] = -INFINITY;
        l[nt] = 0.0f;
        bias[nt][0] = bias[nt][1] = 0.0f;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int j = 0; j < 4; ++j) o[mt][nt][j] = 0.0f;
        }
    }

    kivi_tiles<D, VGS ? B : 0>(p, hd, wbase, stage_bytes, t_begin, t_end, warp, lane, [&](int64_t t0, const uint8_t* stage) {
        // Scores: two 16-token m-tiles, D / 16 steps over the channels; and sum_c q' z of the key
        // block per head by an MMA on the same B parts (A = the zeros z(c), exact fp16, in every
        // row, so each lane's row holds its head's sum: zacc[nt][0] hi, [1] lo). Each tile, as
        // each tile of G = 32 has its own block (where a sum of 4 FMAs a channel, a conversion
        // of z and a 3-shuffle reduction took ~47 instructions a head group, 8 MMAs and 16 loads);
        // at G = 64 a block's second tile computes the same sum again.
        float sacc[2][NT][4], zacc[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int j = 0; j < 4; ++j) sacc[0][nt][j] = sacc[1][nt][j] = zacc[nt][j] = 0.0f;
        }
        const uint8_t* kc = stage + 4 * D;  // row c: the tile's 32 codes of channel c, 4 B bytes
        // Each step's B fragments made where they are used: the hi / lo part of q'_h(c) s(c), from
        // the tile's key block's scales (at G = 32, the default, every tile has its own; holding
        // the fragments of a block for its tiles saved nothing there). Unrolled: a rolled loop
        // measured 1 % slower at 32K (docs/gpu.md, 2026-12-06, third session), unrolled by 2 or 4
        // no faster (third session of 2026-12-07).
#pragma unroll
        for (int kk = 0; kk < MT; ++kk) {
            unsigned a[2][4], bq[NT][2];
            const int c = 16 * kk + 2 * tig;
            {
                const unsigned sa = *reinterpret_cast<const unsigned*>(stage + 2 * D + 2 * c);  // s(c), s(c + 1)
                const unsigned sb = *reinterpret_cast<const unsigned*>(stage + 2 * D + 2 * c + 16);
                const unsigned za = *reinterpret_cast<const unsigned*>(stage + 2 * c);  // z(c), z(c + 1)
                const unsigned zb = *reinterpret_cast<const unsigned*>(stage + 2 * c + 16);
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const auto* e = reinterpret_cast<const uint2*>(q_tab + ((kk * 4 * NT + 4 * nt + hq) * 4 + tig));
                    const uint2 qh = e[0], qa = e[part];
                    bq[nt][0] = hpart(qa.x, qh.x, sa);
                    bq[nt][1] = hpart(qa.y, qh.y, sb);
                    mma_f16(zacc[nt], za, za, zb, zb, qa.x, qa.y);
                }
            }
            if constexpr (B == 2) {
                // Rows c, c + 1 (and c + 8, c + 9): 8 bytes each, word mt = tokens 16 mt .. + 15
                // (token gid in the low half, gid + 8 in the high half).
                const uint4 r01 = *reinterpret_cast<const uint4*>(kc + 8 * c);
                const uint4 r89 = *reinterpret_cast<const uint4*>(kc + 8 * (c + 8));
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    a[mt][0] = cl.lo(mt ? r01.y : r01.x, mt ? r01.w : r01.z);  // token gid
                    a[mt][1] = cl.hi(mt ? r01.y : r01.x, mt ? r01.w : r01.z);  // token gid + 8
                    a[mt][2] = cl.lo(mt ? r89.y : r89.x, mt ? r89.w : r89.z);
                    a[mt][3] = cl.hi(mt ? r89.y : r89.x, mt ? r89.w : r89.z);
                }
            } else {
                // 16 bytes a row, word w = tokens 8 w .. 8 w + 7.
                const uint4 ra = *reinterpret_cast<const uint4*>(kc + 16 * c);
                const uint4 rb = *reinterpret_cast<const uint4*>(kc + 16 * (c + 1));
                const uint4 rc = *reinterpret_cast<const uint4*>(kc + 16 * (c + 8));
                const uint4 rd = *reinterpret_cast<const uint4*>(kc + 16 * (c + 9));
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    a[mt][0] = cl.lo(mt ? ra.z : ra.x, mt ? rb.z : rb.x);
                    a[mt][1] = cl.lo(mt ? ra.w : ra.y, mt ? rb.w : rb.y);
                    a[mt][2] = cl.lo(mt ? rc.z : rc.x, mt ? rd.z : rd.x);
                    a[mt][3] = cl.lo(mt ? rc.w : rc.y, mt ? rd.w : rd.y);
                }
            }
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) mma_f16(sacc[mt][nt], a[mt][0], a[mt][1], a[mt][2], a[mt][3], bq[nt][0], bq[nt][1]);
            }
        }

        // The online softmax of head 4 nt + tig over the tile: tokens gid, gid + 8, 16 + gid, 24 + gid here.
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const float zs = zacc[nt][0] + zacc[nt][1] * kKiviLoInv;  // scale sum_c q z, head tig
            float s[4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                s[2 * mt] = fmaf(sacc[mt][nt][0] + sacc[mt][nt][1] * kKiviLoInv, cl.unscale, zs);
                s[2 * mt + 1] = fmaf(sacc[mt][nt][2] + sacc[mt][nt][3] * kKiviLoInv, cl.unscale, zs);
            }
            bad |= !(fabsf(s[0]) + fabsf(s[1]) + fabsf(s[2]) + fabsf(s[3]) < INFINITY);
            float mx = fmaxf(fmaxf(s[0], s[1]), fmaxf(s[2], s[3]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
            const float mn = fmaxf(m[nt], mx);
            const float corr = __expf(m[nt] - mn);  // (__expf: as mma_tile_softmax, attention_tiles.cuh)
            float pv[4], sum = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                pv[j] = __expf(s[j] - mn);
                sum += pv[j];
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 4);
            sum += __shfl_xor_sync(0xffffffffu, sum, 8);
            sum += __shfl_xor_sync(0xffffffffu, sum, 16);
            l[nt] = l[nt] * corr + sum;
            m[nt] = mn;
            // The state's rescale, where a lane's maximum moved (else corr = e^0 = 1: the same bits);
            // past the first tiles it seldom does.
            if (__any_sync(0xffffffffu, corr != 1.0f)) {
                bias[nt][0] *= corr;
                bias[nt][1] *= corr;
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
                    for (int j = 0; j < 4; ++j) o[mt][nt][j] *= corr;
                }
            }
            float* ph = p_s + (4 * nt + tig) * kKiviTile;
            ph[gid] = pv[0];
            ph[gid + 8] = pv[1];
            ph[gid + 16] = pv[2];
            ph[gid + 24] = pv[3];
        }
        __syncwarp();

        const uint8_t* vstage = stage + 4 * D + 4 * D * B;
        // The tile's sums p z, added to bias in f32 after the tile: the tensor cores' accumulation
        // across a split's tiles lost ~2^-15 of the sum (it cancels against o's).
        float zt[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int j = 0; j < 4; ++j) zt[nt][j] = 0.0f;
        }
        // Values: two 16-token k-steps; m-tile mt is channels 16 mt .. + 15 of value row 16 mt / VG.
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
            const int tk = 16 * ks + 2 * tig;  // this thread's tokens: tk, tk + 1, tk + 8, tk + 9
            // p of head hq's tokens (tk, tk + 1) and (tk + 8, tk + 9) as fp16 pairs ph and the lane's
            // parts pa (zt's B; KiviHalfPart's y for the values' B).
            unsigned ph[NT][2], pa[NT][2];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const float* pr = p_s + (4 * nt + hq) * kKiviTile + tk;
                const float2 x = *reinterpret_cast<const float2*>(pr), y = *reinterpret_cast<const float2*>(pr + 8);
                pa[nt][0] = split(x.x, x.y, ph[nt][0]);
                pa[nt][1] = split(y.x, y.y, ph[nt][1]);
            }
            // This thread's token blocks: tokens tk, tk + 1, tk + 8, tk + 9.
            const uint8_t* tb[4] = {vstage + tk * vbb, vstage + (tk + 1) * vbb, vstage + (tk + 8) * vbb, vstage + (tk + 9) * vbb};
            // kRows (head_dim 128, 2 bits, the values' group 32 at compile time: blocks of 48
            // bytes, 4 rows): a token's zeros and scales by one 16-byte load, its codes of a row by
            // one 8-byte load, where 2- and 4-byte loads took 2.4x as many instructions. Not at 4
            // bits: there the kernel spilled 112 / 152 bytes (stores / loads; 36 / 36 without them:
            // ptxas), 10 stores and 19 loads inside the tile loop (SASS), and ran 10 % slower than
            // the narrow loads (32.1 against 28.9 us at 32K on the H100; docs/gpu.md, third
            // session of 2026-12-07). Not at 5 blocks an SM: in 96 registers they spilled more.
            constexpr bool kRows = D == 128 && B == 2 && VGS == 32 && MB == 4;
            uint4 zs[4];  // kRows: each token's zeros (rows 0..3), then its scales
            if constexpr (kRows) {
#pragma unroll
                for (int j = 0; j < 4; ++j) zs[j] = *reinterpret_cast<const uint4*>(tb[j]);
            }
            // The fp16 pair of row r's zero (role 0) or scale (role 1) of tokens j, j + 1.
            const auto pair = [&](int j, int role, int r) {
                if constexpr (kRows) {  // (selects, not an index: r is the lane's for the zeros)
                    const auto word = [&](const uint4& x) { return role ? (r < 2 ? x.z : x.w) : (r < 2 ? x.x : x.y); };
                    return __byte_perm(word(zs[j]), word(zs[j + 1]), (r & 1) ? 0x7632u : 0x5410u);
                } else {
                    const int off = 2 * vrows * role + 2 * r;
                    return unsigned(*reinterpret_cast<const uint16_t*>(tb[j] + off)) |
                           (unsigned(*reinterpret_cast<const uint16_t*>(tb[j + 1] + off)) << 16);
                }
            };
            // sum_t p z per (value row, head) by an MMA too: A = the zeros [row gid][token] (exact
            // fp16; rows past vrows and 8.. zero), B = p's hi / lo parts; C row gid, columns
            // 2 tig, 2 tig + 1 = head tig's hi and lo, as the state below reads them.
            {
                const bool has = gid < vrows;
                const unsigned za = has ? pair(0, 0, gid) : 0u, zb = has ? pair(2, 0, gid) : 0u;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) mma_f16(zt[nt], za, 0u, zb, 0u, pa[nt][0], pa[nt][1]);
            }
            unsigned bp[NT][2] = {};  // set at each value row's first m-tile (VG a multiple of 16)
            uint2 cw[4] = {};         // kRows: each token's codes of row r
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const int r = 16 * mt / VG;
                if ((16 * mt) % VG == 0) {  // the first m-tile of row r: P' for it
                    const unsigned s01 = pair(0, 1, r), s89 = pair(2, 1, r);
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
                        bp[nt][0] = hpart(pa[nt][0], ph[nt][0], s01);
                        bp[nt][1] = hpart(pa[nt][1], ph[nt][1], s89);
                    }
                }
                if constexpr (kRows) {
                    if (mt % 2 == 0) {
#pragma unroll
                        for (int j = 0; j < 4; ++j) cw[j] = *reinterpret_cast<const uint2*>(tb[j] + 16 + 8 * r);
                    }
                }
                // Word e of this m-tile's codes of token j.
                const auto w = [&](int j, int e) {
                    if constexpr (kRows) {
                        return (mt & 1) ? cw[j].y : cw[j].x;
                    } else {
                        return *reinterpret_cast<const unsigned*>(tb[j] + 4 * vrows + r * vrb + (16 * mt) % VG * B / 8 + 4 * e);
                    }
                };
                unsigned a[4];
                if constexpr (B == 2) {
                    // A token's 16 channels are one word: channel gid at bit 2 gid, gid + 8 at 2 gid + 16.
                    a[0] = cl.lo(w(0, 0), w(1, 0));  // channel gid
                    a[1] = cl.hi(w(0, 0), w(1, 0));  // channel gid + 8
                    a[2] = cl.lo(w(2, 0), w(3, 0));
                    a[3] = cl.hi(w(2, 0), w(3, 0));
                } else {
                    // Two words: channels 0..7 and 8..15, channel gid (+ 8) at bit 4 gid.
                    a[0] = cl.lo(w(0, 0), w(1, 0));
                    a[1] = cl.lo(w(0, 1), w(1, 1));
                    a[2] = cl.lo(w(2, 0), w(3, 0));
                    a[3] = cl.lo(w(2, 1), w(3, 1));
                }
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) mma_f16(o[mt][nt], a[0], a[1], a[2], a[3], bp[nt][0], bp[nt][1]);
            }
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            bias[nt][0] += zt[nt][0];
            bias[nt][1] += zt[nt][1];
        }
    }, issued);

    // The state: o = hi + lo / 2^8 + the row's sum p z (from lane (row, tig)).
    auto* ws = reinterpret_cast<float*>(wbase);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int h = 4 * nt + tig;
        float sum = fabsf(l[nt]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const float b = __shfl_sync(0xffffffffu, bias[nt][0] + bias[nt][1] * kKiviLoInv, (16 * mt / VG) * 4 + tig);
            const float x0 = fmaf(o[mt][nt][0] + o[mt][nt][1] * kKiviLoInv, cl.unscale, b);
            const float x8 = fmaf(o[mt][nt][2] + o[mt][nt][3] * kKiviLoInv, cl.unscale, b);
            sum += fabsf(x0) + fabsf(x8);
            if (h < gqa) {
                ws[h * D + 16 * mt + gid] = x0;
                ws[h * D + 16 * mt + gid + 8] = x8;
            }
        }
        bad |= !(sum < INFINITY);
        if (h < gqa && gid == 0) {
            ws[gqa * D + 2 * h] = m[nt];
            ws[gqa * D + 2 * h + 1] = l[nt];
        }
    }
    // Whether a B part overflowed (scores or state not finite: each overflow gives an infinity or a
    // NaN, which the MMAs' sums and the softmax carry; kivi_attention_kernel then does the stretch
    // again in the SIMT form, whose f32 arithmetic has no such bound).
    return __any_sync(0xffffffffu, bad);
}

// ---- the tensor-core form's tail: what lies past kivi_tc_tokens, by whole blocks ----
// Tokens [t_begin, t_end) of a query past its tensor-core tiles: the fp16 windows, packed
// tokens whose key or value is still in a window, a partial tile. A 32-token tile at a time by
// the whole block: its keys and values staged in shared memory as f32 (packed ones dequantized,
// fma(code, s, z) as kivi.h reads them; window ones converted from fp16: both exact), every
// thread's loads in flight at once, then warp w takes tokens 8 w .. 8 w + 7 of the tile: scores
// by 4 lanes a token, an online softmax per head, values a lane per D / 32 channels. (Before,
// a warp took a window tile alone, each lane a token's row from global memory: a chain of load
// latencies that set the whole call's time at short contexts.)
__host__ __device__ constexpr int kivi_tail_ld(int d) { return d + 4; }  // f32 row pitch: 4 lanes' rows in other banks
__host__ __device__ constexpr int kivi_tail_bytes(int d, int g4) {
    return 2 * kKiviTile * kivi_tail_ld(d) * 4 + kKiviWarps * (kKiviTile / kKiviWarps) * g4 * 4;
}

// The attention kernel's first shared bytes: q [g4][D] f32, and for the tensor-core form (tc) its
// table of q scale in fp16 parts, [D / 16 steps][g4 heads][4 tig] x 16 bytes (kivi_attention_kernel).
__host__ __device__ constexpr int kivi_q_bytes(int d, int g4, bool tc) { return (tc ? 8 : 4) * g4 * d; }
// The attention kernel's shared memory: q (and its table), then the warps' regions or the tail's tile.
inline size_t kivi_smem_bytes(int d, int kbits, int vbb, int gqa, bool tc) {
    const int g4 = kivi_g4(gqa);
    const size_t warps = size_t(kKiviWarps) * size_t(kivi_warp_bytes(d, kbits, vbb, g4));
    return size_t(kivi_q_bytes(d, g4, tc)) + std::max(warps, size_t(kivi_tail_bytes(d, g4)));
}

// The ring slot of window token t (t >= packed: below packed + slots) of role 0 (keys) or 1.
__device__ __forceinline__ int kivi_ring_slot(const KiviAttentionParams& p, const KiviHeadDev& hd, int role, int t) {
    const int packed = int(role ? hd.v_packed : hd.k_packed), slots = role ? p.vf.slots : p.kf.slots;
    const int slot = int(role ? hd.v_head : hd.k_head) + t - packed;
    return slot >= slots ? slot - slots : slot;
}
// Token t's key (role 0) or value (role 1) where it is in the fp16 window: its channels c .. c + 7
// (c a multiple of 8), 16 bytes of its ring slot (head + t - packed, below 2 slots); false where
// t is packed.
template <int D>
__device__ __forceinline__ bool kivi_tail_window8(const KiviAttentionParams& p, const KiviHeadDev& hd, int role, int t, int c, uint4& raw) {
    if (t < int(role ? hd.v_packed : hd.k_packed)) return false;
    const int slot = kivi_ring_slot(p, hd, role, t);
    raw = *reinterpret_cast<const uint4*>(reinterpret_cast<const uint8_t*>(role ? hd.vw : hd.kw) + (int64_t(slot) * D + c) * 2);
    return true;
}

// The same channels of a packed token as f32: fma(code, s, z) as kivi.h's reader.
template <int D>
__device__ __forceinline__ void kivi_tail_packed8(const KiviAttentionParams& p, const KiviHeadDev& hd, int role, int t, int c, float* x) {
    const KiviFormatDev& f = role ? p.vf : p.kf;
    const unsigned mask = (1u << f.bits) - 1;
    const int G = f.group, rb = G * f.bits / 8;
    if (role == 0) {  // key block t / G: zeros [D], scales [D], then a row of G codes per channel
        const int bit = (t % G) * f.bits;
        const uint8_t* blk = reinterpret_cast<const uint8_t*>(hd.k) + int64_t(t / G) * f.block_bytes;
        const uint8_t* codes = blk + 4 * D + c * rb + (bit >> 3);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const unsigned code = (codes[e * rb] >> (bit & 7)) & mask;
            x[e] = fmaf(float(code), kv_half_at(blk + 2 * D + 2 * (c + e)), kv_half_at(blk + 2 * (c + e)));
        }
    } else {  // value token t: zeros [rows], scales [rows], then rows of G channels' codes
        const int rows = f.rows;
        const uint8_t* blk = reinterpret_cast<const uint8_t*>(hd.v) + int64_t(t) * f.block_bytes;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const int r = (c + e) / G, bit = ((c + e) % G) * f.bits;
            const unsigned code = (blk[4 * rows + r * rb + (bit >> 3)] >> (bit & 7)) & mask;
            x[e] = fmaf(float(code), kv_half_at(blk + 2 * rows + 2 * r), kv_half_at(blk + 2 * r));
        }
    }
}

// A fused decode step's new token (KiviFresh; stored token n_tokens - 1, role 0 its key after
// RoPE, role 1 its value), channels c .. c + 7 rounded to fp16 as the store's window write rounds
// them (kv_half_bits of the rotation rope_pair computes), written to the token's ring slot, where
// kivi_tail_window8 reads them.
template <int D>
__device__ __forceinline__ void kivi_fresh8(const KiviAttentionParams& p, const KiviHeadDev& hd, int64_t g, int role, int c,
                                            const float2* rope_cs) {
    const KiviFresh& fr = p.fresh;
    const float* row = (role ? fr.v : fr.k) + g * D;
    const int n_rot = role ? 0 : int(fr.n_rot);
    unsigned w[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const float a = rope_channel(row, c + 2 * e, rope_cs, n_rot, fr.neox != 0);
        const float b = rope_channel(row, c + 2 * e + 1, rope_cs, n_rot, fr.neox != 0);
        w[e] = unsigned(kv_half_bits(a)) | unsigned(kv_half_bits(b)) << 16;
    }
    const int slot = kivi_ring_slot(p, hd, role, int(hd.n_tokens - 1));
    *reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(role ? hd.vw : hd.kw) + (int64_t(slot) * D + c) * 2) =
        make_uint4(w[0], w[1], w[2], w[3]);
}

template <int D, int H>
__device__ void kivi_tail_block(const KiviAttentionParams& p, const KiviHeadDev& hd, const float* q_s, uint8_t* region,
                                int warp_bytes, int64_t t_begin, int64_t t_end, int warp, int lane, int gqa, int g4) {
    constexpr int LD = kivi_tail_ld(D), CPL = D / 32, TPW = kKiviTile / kKiviWarps;  // tokens per warp and tile
    constexpr int kItems = 2 * kKiviTile * (D / 8), kThreads = kKiviWarps * 32, U = 4;
    auto* ks = reinterpret_cast<float*>(region);
    float* vs = ks + kKiviTile * LD;
    float* p_s = vs + kKiviTile * LD + warp * TPW * g4;  // this warp's [TPW tokens][g4]
    const int tid = threadIdx.x, part = lane & 3, tw = warp * TPW + (lane >> 2);

    KiviWarpSoftmax<H, CPL> st;
    for (int64_t t0 = t_begin; t0 < t_end; t0 += kKiviTile) {
        const int cnt = int(min64(kKiviTile, t_end - t0));
        // Item i: role i / (32 D / 8), token (i / (D / 8)) % 32, channels 8 (i % (D / 8)) .. + 7.
        for (int i0 = tid; i0 < kItems; i0 += U * kThreads) {
            // Window rows' loads first, all in flight; packed tokens (few: the tail's start) in turn.
            uint4 raw[U];
            bool pk[U];
            const auto row = [&](int i, int& t, int& c) {
                t = (i / (D / 8)) % kKiviTile;
                c = 8 * (i % (D / 8));
                return (i / (kKiviTile * D / 8) ? vs : ks) + t * LD + c;
            };
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int i = i0 + u * kThreads, role = i / (kKiviTile * D / 8);
                int t, c;
                float* dst = row(i, t, c);
                raw[u] = make_uint4(0, 0, 0, 0);  // past the stretch: zeros (their weights are 0)
                pk[u] = i < kItems && t < cnt && !kivi_tail_window8<D>(p, hd, role, int(t0) + t, c, raw[u]);
                if (pk[u]) {
                    float x[8];
                    kivi_tail_packed8<D>(p, hd, role, int(t0) + t, c, x);
                    reinterpret_cast<float4*>(dst)[0] = make_float4(x[0], x[1], x[2], x[3]);
                    reinterpret_cast<float4*>(dst)[1] = make_float4(x[4], x[5], x[6], x[7]);
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int i = i0 + u * kThreads;
                int t, c;
                float* dst = row(i, t, c);
                if (i < kItems && !pk[u]) {
                    const auto* h2 = reinterpret_cast<const __half2*>(&raw[u]);
                    const float2 a = __half22float2(h2[0]), b = __half22float2(h2[1]), e = __half22float2(h2[2]), f = __half22float2(h2[3]);
                    reinterpret_cast<float4*>(dst)[0] = make_float4(a.x, a.y, b.x, b.y);
                    reinterpret_cast<float4*>(dst)[1] = make_float4(e.x, e.y, f.x, f.y);
                }
            }
        }
        __syncthreads();
        // Scores of token tw: lane part takes channels part, part + 4, ...
        const bool valid = tw < cnt;
        float acc[H];
#pragma unroll
        for (int h = 0; h < H; ++h) acc[h] = 0.0f;
        const float* kr = ks + tw * LD;
#pragma unroll 8
        for (int c = part; c < D; c += 4) {
            const float kv = kr[c];
#pragma unroll
            for (int h = 0; h < H; ++h) {
                if (h < gqa) acc[h] = fmaf(q_s[h * D + c], kv, acc[h]);
            }
        }
#pragma unroll
        for (int h = 0; h < H; ++h) {
            if (h >= gqa) continue;
            float a = acc[h];
            a += __shfl_xor_sync(0xffffffffu, a, 1);
            a += __shfl_xor_sync(0xffffffffu, a, 2);
            const float s = valid ? a * p.scale : -INFINITY;
            float mx = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, 4));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
            const float mn = fmaxf(st.m[h], mx);
            // A warp whose tokens are all past the end keeps its empty state (no -inf - -inf).
            const float corr = mn == -INFINITY ? 1.0f : expf(st.m[h] - mn);
            const float pv = valid ? expf(s - mn) : 0.0f;
            float sum = pv + __shfl_xor_sync(0xffffffffu, pv, 4);
            sum += __shfl_xor_sync(0xffffffffu, sum, 8);
            sum += __shfl_xor_sync(0xffffffffu, sum, 16);
            st.l[h] = st.l[h] * corr + sum;
            st.m[h] = mn;
#pragma unroll
            for (int j = 0; j < CPL; ++j) st.o[h][j] *= corr;
            if (part == 0) p_s[(lane >> 2) * g4 + h] = pv;
        }
        __syncwarp();
        // Values: lane takes channels lane + 32 j of the warp's tokens.
#pragma unroll
        for (int t = 0; t < TPW; ++t) {
            const float* vr = vs + (warp * TPW + t) * LD + lane;
            float x[CPL];
#pragma unroll
            for (int j = 0; j < CPL; ++j) x[j] = vr[32 * j];
#pragma unroll
            for (int h = 0; h < H; ++h) {
                if (h >= gqa) continue;
                const float pv = p_s[t * g4 + h];
#pragma unroll
                for (int j = 0; j < CPL; ++j) st.o[h][j] = fmaf(pv, x[j], st.o[h][j]);
            }
        }
        __syncthreads();  // the next tile is staged over this one
    }
    // The warp's state where the block's merge reads it (over the staged tile: after the barrier).
    st.store(reinterpret_cast<float*>(region + warp * warp_bytes), gqa, D, lane, [&](int j) { return lane + 32 * j; });
}

// KV head g's values' oldest window token encoded where the next step's store would encode it
// (KiviAttentionParams::pack_ahead: the window holds slots - 1 tokens), into its packed block, a
// warp a row (the store's short path's encoding). It needs nothing of this step: the slot was
// written steps ago and no block of this step reads the packed block.
__device__ __forceinline__ void kivi_pack_ahead(const KiviAttentionParams& p, int64_t g, int warps) {
    const KiviHeadDev h = p.heads[g];
    // (h.v is null while the stream holds no packed block: the step after encodes the token itself.)
    if (h.v != 0 && p.vf.slots > 1 && h.n_tokens - h.v_packed >= p.vf.slots - 1) {
        const auto* tok = reinterpret_cast<const __half*>(h.vw) + h.v_head * p.head_dim;
        uint8_t* blk = reinterpret_cast<uint8_t*>(h.v) + h.v_packed * p.vf.block_bytes;
        for (int row = threadIdx.x / 32; row < p.vf.rows; row += warps) {
            quantize_value_row<true>(tok, int(p.head_dim), row, p.vf, blk, threadIdx.x & 31);
        }
    }
}

// The merge inside the attention kernel (KiviAttentionParams::arrivals): its shared memory, from
// the start of the kernel's (free by then): the parts' weights [gqa][parts], each row's sum
// [kKiviMaxGqa], the merged rows [gqa][d].
inline size_t kivi_merge_inside_bytes(int gqa, int64_t parts, int64_t d) {
    return (size_t(gqa) * size_t(parts) + 8 + size_t(gqa) * size_t(d)) * sizeof(float);
}

// After the block's partial is written: the block published it (fence) and counted its arrival;
// the one that arrives last for (i, g) merges g's query heads over all parts, as merge_splits
// (attention.cu) does for the split attention: each row's maximum, weights e^(m_z - M) and sum
// over the parts first (a warp a row), then o = sum_z o_z e^(m_z - M) / sum_z l_z e^(m_z - M), a
// thread per two channel pairs with kMergeInsideBatch parts' loads in flight (partials of other
// blocks through L2, __ldcg: L1 is not coherent); out, and out_q8 by a warp per 32-channel block.
// After a fused store (p.fresh, rope_cs its angles) it then leaves q's rows of g's heads and k's
// row of g rotated in place, as the store kernel does: every block of g has read them.
constexpr int kMergeInsideBatch = 16;
template <int D>
__device__ __forceinline__ void kivi_merge_inside(const KiviAttentionParams& p, int64_t g, int64_t i, int gqa, uint8_t* smem,
                                                   const float2* rope_cs) {
    __shared__ bool merger;
    constexpr int T = kKiviWarps * 32;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // The barrier orders the block's partial writes before thread 0's fence, which makes them
    // visible at device scope before its arrival (a release); the merger's fence after it orders
    // its reads after the other arrivals (an acquire), and the barrier passes that on.
    __syncthreads();
    unsigned* arrivals = p.arrivals + i * p.n_head_kv + g;
    if (tid == 0) {
        __threadfence();
        merger = atomicAdd(arrivals, 1u) == unsigned(p.parts - 1);
        if (merger) __threadfence();
    }
    __syncthreads();
    if (!merger) return;
    const int parts = int(p.parts);
    constexpr int64_t stride = D + 2;
    const int64_t row0 = i * p.n_head + g * gqa;
    auto* wz = reinterpret_cast<float*>(smem);  // [gqa][parts]
    float* lsum = wz + gqa * parts;             // [kKiviMaxGqa]
    float* keep = lsum + 8;                     // [gqa][D]
    for (int h = warp; h < gqa; h += kKiviWarps) {
        const float* part = p.partial + (row0 + h) * parts * stride;
        float* w = wz + h * parts;
        float m = -INFINITY;
        for (int z = lane; z < parts; z += 32) {
            w[z] = __ldcg(part + z * stride + D);
            m = fmaxf(m, w[z]);
        }
        m = warp_max(m);
        float l = 0.0f;
        for (int z = lane; z < parts; z += 32) {
            const float e = w[z] == -INFINITY ? 0.0f : expf(w[z] - m);
            w[z] = e;
            l = fmaf(e, __ldcg(part + z * stride + D + 1), l);
        }
        l = warp_sum(l);
        if (lane == 0) lsum[h] = l;
    }
    __syncthreads();
    const int pairs = gqa * D / 2;
    for (int e0 = tid; e0 < pairs; e0 += 2 * T) {
        const int e1 = min(e0 + T, pairs - 1);  // past the last pair: the last again (not written)
        const int r0 = 2 * e0 / D, r1 = 2 * e1 / D;
        const float* part0 = p.partial + (row0 + r0) * parts * stride + (2 * e0 - r0 * D);
        const float* part1 = p.partial + (row0 + r1) * parts * stride + (2 * e1 - r1 * D);
        float2 a0 = make_float2(0.0f, 0.0f), a1 = a0;
        for (int z0 = 0; z0 < parts; z0 += kMergeInsideBatch) {
            float2 v0[kMergeInsideBatch], v1[kMergeInsideBatch];
#pragma unroll
            for (int u = 0; u < kMergeInsideBatch; ++u) {
                const int z = min(z0 + u, parts - 1);
                v0[u] = __ldcg(reinterpret_cast<const float2*>(part0 + z * stride));
                v1[u] = __ldcg(reinterpret_cast<const float2*>(part1 + z * stride));
            }
#pragma unroll
            for (int u = 0; u < kMergeInsideBatch; ++u) {
                if (z0 + u < parts) {
                    const float w0 = wz[r0 * parts + z0 + u], w1 = wz[r1 * parts + z0 + u];
                    a0 = make_float2(fmaf(w0, v0[u].x, a0.x), fmaf(w0, v0[u].y, a0.y));
                    a1 = make_float2(fmaf(w1, v1[u].x, a1.x), fmaf(w1, v1[u].y, a1.y));
                }
            }
        }
        const auto put = [&](int e, int r, float2 a) {
            const float2 o = make_float2(a.x / lsum[r], a.y / lsum[r]);
            *reinterpret_cast<float2*>(p.out + row0 * D + 2 * e) = o;
            keep[2 * e] = o.x;
            keep[2 * e + 1] = o.y;
        };
        put(e0, r0, a0);
        if (e0 + T < pairs) put(e1, r1, a1);
    }
    if (p.out_q8.qs != nullptr) {
        __syncthreads();
        for (int b = warp; b < gqa * D / kQBlock; b += kKiviWarps) {
            quantize_block_q8_0(keep[b * kQBlock + lane], row0 * D / kQBlock + b, lane, p.out_q8.qs, p.out_q8.s);
        }
    }
    const int n_rot = rope_cs != nullptr && p.fresh.k != nullptr ? int(p.fresh.n_rot) : 0;
    if (n_rot > 0) rope_rotate_group(p.fresh.q, p.fresh.k, g, gqa, D, rope_cs, n_rot, p.fresh.neox != 0, tid, T);
    if (tid == 0) *arrivals = 0;  // ready for the next launch (a kernel boundary orders it)
}

// Block (split z, KV head g, query i) for the query heads of g. B = 0: the SIMT form over split z
// of the tokens the query sees; B = 2 or 4: splits 0 .. splits - 1 take the tensor-core form over
// kivi_tc_tokens, splits `splits` .. parts - 1 the rest a tile each (kivi_tail_block). The warps'
// states are merged into the block's partial (o, max, sum). 128 registers (4 blocks per SM) where
// one n-tile or the SIMT form at head_dim <= 128 fits them with at most a few bytes spilled; MB = 5
// (one n-tile, p.blocks_per_sm) 96 registers: 20 warps an SM (ptxas: 0-28 bytes spilled; at 6
// blocks, 80 registers, 344-388). F: the form with a decode step's store inside (p.fresh: the
// RoPE angles, q rotated as read, the new token in the tail), an instance of its own, so that the
// others compile as before (with it in the same instance ptxas spilled 28 -> 164 bytes).
template <int D, int B, int NT, int VGS, int MB = 4, bool F = false>
__global__ void __launch_bounds__(kKiviWarps * 32, NT == 1 ? MB : (NT == 0 && D <= 128) ? 4 : 1) kivi_attention_kernel(KiviAttentionParams p) {
    VXQ_DYNAMIC_SMEM(smem);
    const int gqa = int(p.n_head / p.n_head_kv), g4 = kivi_g4(gqa);
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int64_t z = blockIdx.x, g = blockIdx.y, i = blockIdx.z;
    const KiviHeadDev hd = p.heads[g];  // the step block: written before the pass starts (launch.cuh)
    // A fused store (p.fresh): the angles of the step's RoPE before the wait (the position is in
    // the step block), q rotated as it is read.
    __shared__ float2 rope_cs[F ? kKiviMaxRopePairs : 1];
    const int n_rot = F ? int(p.fresh.n_rot) : 0;
    if (n_rot > 0) {
        const int64_t pos = *p.fresh.pos0;
        for (int e = threadIdx.x; e < n_rot / 2; e += kKiviWarps * 32) rope_cs[e] = rope_angle(e, pos, p.fresh.theta_scale);
        __syncthreads();
    }
    const int64_t n_vis = hd.n_tokens - p.n_q + i + 1;
    const int64_t t_tc = B != 0 ? kivi_tc_tokens(hd, n_vis) : 0;  // the tensor-core form's tokens (the tail's after them)
    const int q_bytes = kivi_q_bytes(D, g4, B != 0);
    const int warp_bytes = kivi_warp_bytes(D, p.kf.bits, p.vf.block_bytes, g4);
    uint8_t* wbase = smem + q_bytes + warp * warp_bytes;
    int64_t begin, end;
    // A fused store's step (KiviFresh::early): a tensor-core warp's first tile in flight before
    // the wait, into stage 0 of its ring (kivi_tiles then starts from it). (The split's stretch is
    // taken again after the wait: kept live across the prologue, it spilled in the usual instance.)
    bool issued = false;
    if constexpr (F && B != 0) {
        if (p.fresh.early != 0 && z < p.splits) {
            kivi_stretch(t_tc, p.splits, z, begin, end);
            const int64_t t0 = begin + warp * kKiviTile;
            if (t0 < end) {
                kivi_issue_warp<D, VGS ? B : 0>(p, hd, t0, wbase, lane);
                cp_async_commit();
            }
            issued = true;
        }
    }
    // Merging inside: a decode step's value token encoded ahead by the last block of each KV head
    // (a tail split, the shortest), before the wait: it needs nothing of this step.
    if (p.arrivals != nullptr && p.pack_ahead && z == p.parts - 1) kivi_pack_ahead(p, g, kKiviWarps);
    pdl_wait();
    auto* q_s = reinterpret_cast<float*>(smem);
    const float* qg = p.q + (i * p.n_head + g * gqa) * D;
    for (int idx = threadIdx.x; idx < g4 * D; idx += kKiviWarps * 32) {
        const int c = idx % D;
        q_s[idx] = idx >= gqa * D ? 0.0f : n_rot > 0 ? rope_channel(qg + (idx - c), c, rope_cs, n_rot, p.fresh.neox != 0) : qg[idx];
    }
    if constexpr (F) {
        // The block whose tail stretch holds the new token writes its key and value into the
        // windows (a thread per 8 channels), where its tail reads them after the barrier (the
        // block's own global writes are visible to it there).
        const int tail = int(n_vis - t_tc);
        const int per = kivi_stretch_per<int>(tail, int(p.parts - p.splits), kKiviTile);
        if (z >= p.splits && int(z - p.splits) == (tail - 1) / per && int(threadIdx.x) < 2 * (D / 8)) {
            const int role = int(threadIdx.x) / (D / 8);
            kivi_fresh8<D>(p, hd, g, role, 8 * (int(threadIdx.x) % (D / 8)), rope_cs);
        }
    }
    __syncthreads();
    pdl_trace_mark(41);  // trace builds: block 0's q read (then its tiles: 42, its partial: 43)
    if constexpr (B != 0) {
        if (z < p.splits) {
            // The keys' B parts of q' = q scale, once a block: entry (kk, h, tig) = the fp16 pairs
            // q'h(c, c + 1), q'h(c + 8, c + 9), then q'l of the same (q'h = fp16(q'), q'l =
            // fp16(2^8 (q' - q'h))), c = 16 kk + 2 tig: what lanes (head h, tig) of step kk read.
            auto* q_tab = reinterpret_cast<uint4*>(smem + 4 * g4 * D);
            for (int idx = threadIdx.x; idx < (D / 16) * g4 * 4; idx += kKiviWarps * 32) {
                const int tg = idx & 3, h = (idx >> 2) % g4, kk = (idx >> 2) / g4;
                const float* qc = q_s + h * D + 16 * kk + 2 * tg;
                unsigned h01, h89, l01, l89;
                split_pair(qc[0] * p.scale, qc[1] * p.scale, h01, l01, kKiviLo);
                split_pair(qc[8] * p.scale, qc[9] * p.scale, h89, l89, kKiviLo);
                q_tab[idx] = make_uint4(h01, h89, l01, l89);
            }
            __syncthreads();
            kivi_stretch(t_tc, p.splits, z, begin, end);
            if (kivi_tc_warp<D, B, NT, VGS, MB>(p, hd, q_s, q_tab, wbase, begin, end, warp, lane, gqa, issued)) {
                // A B part overflowed: the warp's stretch again in the SIMT form (data that are not
                // finite themselves come out as they would there). Its head is read again through a
                // pointer the compiler cannot see through, so that nothing of the prologue's stays
                // live across the tensor-core loop for this path.
                const KiviHeadDev* heads = p.heads;
#if !defined(VXQ_SIMT)
                asm volatile("" : "+l"(heads));
#endif
                if (p.fallbacks != nullptr && lane == 0) atomicAdd(p.fallbacks, 1);
                const KiviHeadDev h2 = heads[g];
                const int64_t n2 = h2.n_tokens - p.n_q + i + 1;
                kivi_stretch(kivi_tc_tokens(h2, n2), p.splits, z, begin, end);
                kivi_simt_warp<D>(p, h2, q_s, wbase, begin, end, warp, lane, gqa, g4);
            }
        } else {
            kivi_stretch(n_vis - t_tc, p.parts - p.splits, z - p.splits, begin, end, kKiviTile);
            kivi_tail_block<D, 4 * NT>(p, hd, q_s, smem + q_bytes, warp_bytes, t_tc + begin, t_tc + end, warp, lane, gqa, g4);
        }
    } else {
        kivi_stretch(n_vis, p.splits, z, begin, end);
        kivi_simt_warp<D>(p, hd, q_s, wbase, begin, end, warp, lane, gqa, g4);
    }
    __syncthreads();
    pdl_trace_mark(42);
    pdl_launch_dependents();

    // The block's partial: the four warps' states merged with their log-sum-exp weights, taken
    // once a head (a thread each: the maximum, then each warp's e^(m_w - max), -1 for a warp with
    // no token), then a thread per channel.
    __shared__ float wt[kKiviMaxGqa][kKiviWarps + 1];  // the warps' weights, then the maximum
    const int wwords = warp_bytes / 4;
    const auto* w0 = reinterpret_cast<const float*>(smem + q_bytes);
    if (int(threadIdx.x) < gqa) {
        const int h = threadIdx.x;
        float mx = -INFINITY;
        for (int w = 0; w < kKiviWarps; ++w) mx = fmaxf(mx, w0[w * wwords + gqa * D + 2 * h]);
        for (int w = 0; w < kKiviWarps; ++w) {
            const float mw = w0[w * wwords + gqa * D + 2 * h];
            wt[h][w] = mw == -INFINITY ? -1.0f : expf(mw - mx);
        }
        wt[h][kKiviWarps] = mx;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < gqa * (D + 2); idx += kKiviWarps * 32) {
        const int h = idx / (D + 2), c = idx - h * (D + 2);
        float sum = 0.0f;
        for (int w = 0; w < kKiviWarps; ++w) {
            const float* st = w0 + w * wwords;
            if (wt[h][w] < 0.0f) continue;
            sum += wt[h][w] * (c < D ? st[h * D + c] : st[gqa * D + 2 * h + 1]);
        }
        float* part = p.partial + ((i * p.n_head + g * gqa + h) * p.parts + z) * (D + 2);
        part[c] = c == D ? wt[h][kKiviWarps] : sum;
    }
    pdl_trace_mark(43);
    if (p.arrivals != nullptr) kivi_merge_inside<D>(p, g, i, gqa, smem, F ? rope_cs : nullptr);
}

// out = the splits' partials merged: sum_z o_z e^(m_z - M) / sum_z l_z e^(m_z - M). Block (row,
// 32-channel chunk) of 8 warps: warp w folds parts w, w + 8, ... into a running (max, sum, o: a
// channel a lane) with kMergeUnroll parts' loads in flight (at 32K tokens, ~70 parts: one round of
// loads), then warp 0 merges the eight states. Before: the maximum, the weights and the sums in
// three rounds of loads (~3 us a layer end to end at 1K on the H200, the launch included); before
// that a block per row walking ~70 splits serially (~12 us at 32K).
constexpr int kMergeWarps = 8, kMergeThreads = 32 * kMergeWarps, kMergeUnroll = 12;
__device__ __forceinline__ void kivi_merge_block(const KiviAttentionParams& p) {
    __shared__ float state[kMergeWarps][34];  // o of the block's 32 channels, max, sum
    pdl_wait();
    // Resident already (128 blocks): the next kernel's blocks (the O projection's GEMV) may start
    // and put their first weights in flight before their own wait, which still waits for this
    // grid to end. Without it they were launched only once this kernel had ended.
    if (p.merge_launch_early != 0) pdl_launch_dependents();
    const int64_t row = blockIdx.x, d = p.head_dim, n = p.parts;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int64_t c = int64_t(blockIdx.y) * 32 + lane, cl = c < d ? c : d - 1;  // lanes past d load a channel, write none
    const float* part = p.partial + row * n * (d + 2);
    float m = -INFINITY, l = 0.0f, o = 0.0f;
    for (int64_t z0 = warp; z0 < n; z0 += kMergeWarps * kMergeUnroll) {
        float mz[kMergeUnroll], lz[kMergeUnroll], oz[kMergeUnroll];
#pragma unroll
        for (int u = 0; u < kMergeUnroll; ++u) {
            const int64_t z = z0 + int64_t(u) * kMergeWarps;
            const float* pz = part + (z < n ? z : 0) * (d + 2);
            mz[u] = z < n ? pz[d] : -INFINITY;
            lz[u] = pz[d + 1];
            oz[u] = pz[cl];
        }
        float mn = m;
#pragma unroll
        for (int u = 0; u < kMergeUnroll; ++u) mn = fmaxf(mn, mz[u]);
        if (mn == -INFINITY) continue;  // no token in these parts
        const float a = m == -INFINITY ? 0.0f : expf(m - mn);
        l *= a;
        o *= a;
#pragma unroll
        for (int u = 0; u < kMergeUnroll; ++u) {
            const float w = mz[u] == -INFINITY ? 0.0f : expf(mz[u] - mn);
            l = fmaf(w, lz[u], l);
            o = fmaf(w, oz[u], o);
        }
        m = mn;
    }
    state[warp][lane] = o;
    if (lane == 0) state[warp][32] = m, state[warp][33] = l;
    __syncthreads();
    if (warp == 0) {
        float mx = -INFINITY, total = 0.0f, acc = 0.0f;
        for (int w = 0; w < kMergeWarps; ++w) mx = fmaxf(mx, state[w][32]);
        for (int w = 0; w < kMergeWarps; ++w) {
            if (state[w][32] == -INFINITY) continue;
            const float e = expf(state[w][32] - mx);
            total = fmaf(e, state[w][33], total);
            acc = fmaf(e, state[w][lane], acc);
        }
        const float o = acc / total;
        if (c < d) p.out[row * d + c] = o;
        // The block's 32 channels as one q8_0 block of out's row-major rows (d is a multiple of
        // 32 wherever the attention runs: every lane holds a channel of it).
        if (p.out_q8.qs != nullptr) quantize_block_q8_0(o, (row * d + c - lane) / kQBlock, lane, p.out_q8.qs, p.out_q8.s);
    }
}
// Block (row, chunk) for rows n_q n_head; kivi.cu's launcher adds blocks past them for the values'
// token encoded ahead (p.pack_ahead).
__global__ void __launch_bounds__(kMergeThreads) kivi_merge_kernel(KiviAttentionParams p) { kivi_merge_block(p); }

}  // namespace
}  // namespace vxq::cuda

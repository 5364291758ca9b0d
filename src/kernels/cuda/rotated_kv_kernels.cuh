// The rotated-domain KV kernels (TurboQuant, VecInfer; rotated_kv.cuh says what each computes),
// apart from their launchers (rotated_kv.cu) so that a test can run them on the CPU
// (tests/support/simt.h: a SIMT emulator that compiles this header as C++ and runs each block's
// threads as fibers). Included by rotated_kv.cu and tests/test_rotated_kv_simt.cpp only:
// everything is in an unnamed namespace.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/reader_attention_kernels.cuh"
#include "kernels/cuda/rotated_kv.cuh"

namespace vxq::cuda {
namespace {

constexpr int kStoreWarps = 4;
// A block's bytes at head_dim 256 in words: at most 258 (turbo-rvq, two areas of 4 bits a
// coordinate beside the norm; VecInfer at most 256), and a word more for the straddling write of
// the last index.
constexpr int kStageWords = (2 + 2 * int(kTurboMaxHeadDim) / 2) / 4 + 2;

// std::upper_bound over thr[0, count): the first threshold y is below, so a NaN takes `count`,
// as the CPU codec's Codebook::index (the same comparisons in the same order).
__device__ __forceinline__ int upper_bound_of(const float* thr, int count, float y) {
    int lo = 0;
    while (count > 0) {
        const int half = count >> 1;
        if (y < thr[lo + half]) {
            count = half;
        } else {
            lo += half + 1;
            count -= half + 1;
        }
    }
    return lo;
}

// ORs the `bits`-bit value v (bits <= 16) in at bit `bit` of the staging words (LSB first, the
// bytes of a little-endian word in order: turbo::put_bits's layout).
__device__ __forceinline__ void put_bits_shared(uint32_t* stage, int bit, int bits, unsigned v) {
    const int w = bit >> 5, s = bit & 31;
    atomicOr(&stage[w], v << s);
    if (s + bits > 32) atomicOr(&stage[w + 1], v >> (32 - s));
}

// The unnormalized fast Walsh-Hadamard transform of x[0, d) in shared memory by one warp: turbo::fwht's
// levels in its order (a level's pairs are independent, so any lane may take any pair: the same bits).
__device__ __forceinline__ void warp_fwht(float* x, int d, int lane) {
    for (int len = 1; len < d; len <<= 1) {
        __syncwarp();
        for (int pr = lane; pr < d / 2; pr += 32) {
            const int j = (pr & ~(len - 1)) * 2 + (pr & (len - 1));
            const float a = x[j], b = x[j + len];
            x[j] = __fadd_rn(a, b);
            x[j + len] = __fsub_rn(a, b);
        }
    }
    __syncwarp();
}

// ---- the store ------------------------------------------------------------------------------

// What a store's warp encodes: item (token t, KV head g, role) of the write, the role fastest:
// its input row and destination block (`valid` false past the last item; `value`: the role).
// (The format is picked by the kernel itself: a pointer to a kernel parameter would copy the
// parameters to local memory.)
struct StoreItem {
    bool valid, value;
    const float* x;
    uint8_t* dst;
};
template <class F>
__device__ __forceinline__ StoreItem store_item(const RotatedStoreParams<F>& p, int warp) {
    const int64_t item = int64_t(blockIdx.x) * kStoreWarps + warp;
    if (item >= 2 * p.n * p.n_head_kv) return {false, false, nullptr, nullptr};
    const bool value = item & 1;
    const int64_t th = item >> 1, t = th / p.n_head_kv, g = th % p.n_head_kv;
    const int d = value ? p.vf.d : p.kf.d, bb = value ? p.vf.block_bytes : p.kf.block_bytes;
    const KvHeadDev& h = p.heads[g];
    return {true, value, (value ? p.v : p.k) + th * d, reinterpret_cast<uint8_t*>(value ? h.v : h.k) + (h.n_tokens + t) * bb};
}

// The staged block (`bytes` of it: a VecInfer block may have an odd size) to its slot, by a warp.
__device__ __forceinline__ void copy_block(uint8_t* dst, const uint32_t* stage, int bytes, int lane) {
    const auto* s8 = reinterpret_cast<const uint8_t*>(stage);
    for (int j = lane; j < bytes; j += 32) dst[j] = s8[j];
}

// A warp per (token, KV head, role).
__global__ void __launch_bounds__(kStoreWarps * 32) turbo_store_kernel(const TurboStoreParams p) {
    __shared__ float xs[kStoreWarps][kTurboMaxHeadDim];
    __shared__ float ys[kStoreWarps][kTurboMaxHeadDim];
    __shared__ uint32_t stage[kStoreWarps][kStageWords];
    const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
    pdl_wait();
    const StoreItem it = store_item(p, warp);
    if (!it.valid) return;
    const TurboFormatDev& f = it.value ? p.vf : p.kf;
    const int d = f.d;
    const float* x = it.x;
    uint8_t* dst = it.dst;
    float* xw = xs[warp];
    float* yw = ys[warp];
    uint32_t* st = stage[warp];
    for (int c = lane; c < d; c += 32) xw[c] = x[c];
    for (int w = lane; w < kStageWords; w += 32) st[w] = 0u;
    __syncwarp();
    // n = ||x||: the CPU's sum of squares in double, channel after channel (the products are exact).
    float n = 0.0f;
    if (lane == 0) {
        double nn = 0.0;
        for (int c = 0; c < d; ++c) nn = fma(double(xw[c]), double(xw[c]), nn);
        n = float(sqrt(nn));
        atomicOr(&st[0], norm_fp16_bits(n));
    }
    n = __shfl_sync(0xffffffffu, n, 0);
    const float inv = n > 0.0f ? __fdiv_rn(1.0f, n) : 0.0f;  // a zero vector codes as y = 0
    for (int c = lane; c < d; c += 32) yw[c] = __fmul_rn(xw[c], inv);
    // y = Pi y (Rotation::apply); dense rows write into xw (x is read no more), which becomes y.
    float* y = yw;
    float* rw = xw;  // the residual r = y - c[idx] (turbo-prod keys)
    if (f.hadamard) {
        for (int c = lane; c < d; c += 32) yw[c] = __fmul_rn(yw[c], f.signs[c]);
        warp_fwht(yw, d, lane);
        for (int c = lane; c < d; c += 32) yw[c] = __fmul_rn(yw[c], f.inv_sqrt_d);
    } else {
        __syncwarp();
        for (int i = lane; i < d; i += 32) {
            const float* r = f.rows + int64_t(i) * d;
            double s = 0.0;
            for (int c = 0; c < d; ++c) s = fma(double(r[c]), double(yw[c]), s);
            xw[i] = float(s);
        }
        y = xw;
        rw = yw;
    }
    __syncwarp();
    // The indices (turbo::encode's order of operations).
    for (int c = lane; c < d; c += 32) {
        const float yc = y[c];
        if (f.calibrated) {
            const int at = f.coord_at[c], b = at & 0xff;
            if (b == 0) continue;
            const float sc = f.coord_scale[c];
            const int i = upper_bound_of(f.cbk_thr + (1 << b) - 1 - b, (1 << b) - 1, sc > 0.0f ? __fdiv_rn(yc, sc) : 0.0f);
            put_bits_shared(st, f.idx1_offset * 8 + (at >> 8), b, unsigned(i));
            continue;
        }
        const int i1 = upper_bound_of(f.thr1, (1 << f.bits1) - 1, yc);
        put_bits_shared(st, f.idx1_offset * 8 + c * f.bits1, f.bits1, unsigned(i1));
        const float r = __fsub_rn(yc, f.cent1[i1]);
        if (f.bits2 > 0) {
            const int i2 = upper_bound_of(f.thr2, (1 << f.bits2) - 1, r);
            put_bits_shared(st, f.idx2_offset * 8 + c * f.bits2, f.bits2, unsigned(i2));
        }
        rw[c] = r;  // (a lane writes the channels it read)
    }
    __syncwarp();
    if (f.qjl) {  // gamma = ||r|| (double, channel order), then sign(S r) a sketch row per lane
        if (lane == 0) {
            double rr = 0.0;
            for (int c = 0; c < d; ++c) rr = fma(double(rw[c]), double(rw[c]), rr);
            put_bits_shared(st, f.gamma_offset * 8, 16, norm_fp16_bits(float(sqrt(rr))));
        }
        for (int i = lane; i < d; i += 32) {
            float dot = 0.0f;  // row i of S: column i of S^T
            for (int c = 0; c < d; ++c) dot = __fadd_rn(dot, __fmul_rn(f.sketch_t[int64_t(c) * d + i], rw[c]));
            if (dot >= 0.0f) put_bits_shared(st, f.sign_offset * 8 + i, 1, 1u);
        }
        __syncwarp();
    }
    copy_block(dst, st, f.block_bytes, lane);
}

// A warp per (token, KV head, role): vecinfer::encode's operations in its order.
__global__ void __launch_bounds__(kStoreWarps * 32) vecinfer_store_kernel(const VecinferStoreParams p) {
    __shared__ float ys[kStoreWarps][kTurboMaxHeadDim];
    __shared__ uint32_t stage[kStoreWarps][kStageWords];
    const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
    pdl_wait();
    const StoreItem it = store_item(p, warp);
    if (!it.valid) return;
    const VecinferFormatDev f = it.value ? p.vf : p.kf;  // (a copy: 40 bytes of registers)
    const int d = f.d, n = f.n;
    const float* x = it.x;
    uint8_t* dst = it.dst;
    float* yw = ys[warp];
    uint32_t* st = stage[warp];
    for (int w = lane; w < kStageWords; w += 32) st[w] = 0u;
    // y = H (x / lambda) / sqrt(d) (vecinfer::forward_transform).
    for (int c = lane; c < d; c += 32) yw[c] = f.lambda ? __fdiv_rn(x[c], f.lambda[c]) : x[c];
    warp_fwht(yw, d, lane);
    for (int c = lane; c < d; c += 32) yw[c] = __fmul_rn(yw[c], f.inv_sqrt_d);
    __syncwarp();
    // vecinfer::nearest per sub-vector: the first centroid of least squared distance.
    for (int j = lane; j < d / n; j += 32) {
        const float* v = yw + j * n;
        const float* cb = f.codebook + (int64_t(j) << f.m) * n;
        int best = 0;
        float best_d = INFINITY;
        for (int i = 0; i < (1 << f.m); ++i) {
            float dist = 0.0f;
            for (int e = 0; e < n; ++e) {
                const float df = __fsub_rn(v[e], cb[i * n + e]);
                dist = __fadd_rn(dist, __fmul_rn(df, df));
            }
            if (dist < best_d) {
                best_d = dist;
                best = i;
            }
        }
        put_bits_shared(st, j * f.m, f.m, unsigned(best));
    }
    __syncwarp();
    copy_block(dst, st, f.block_bytes, lane);
}

// ---- the attention --------------------------------------------------------------------------

// Coordinate c of a format as the attention decodes it: x / y the bit positions of its first and
// (rvq) second index in a block, z = bits1 | bits2 << 4 | base1 << 8 | base2 << 20 (bases into the
// role's centroid pool), w the scale's bits (1 for the uniform formats).
__device__ __forceinline__ int4 coordinate_of(const TurboFormatDev& f, int c) {
    if (f.calibrated) {
        const int at = f.coord_at[c], b = at & 0xff;
        return make_int4(f.idx1_offset * 8 + (at >> 8), 0, b | (((1 << b) - 1) << 8), __float_as_int(f.coord_scale[c]));
    }
    return make_int4(f.idx1_offset * 8 + c * f.bits1, f.idx2_offset * 8 + c * f.bits2,
                     f.bits1 | (f.bits2 << 4) | ((1 << f.bits1) << 20), __float_as_int(1.0f));
}
__device__ __forceinline__ int pool_floats(const TurboFormatDev& f) {
    return f.calibrated ? f.cbk_floats : (1 << f.bits1) + (f.bits2 > 0 ? 1 << f.bits2 : 0);
}
__device__ __forceinline__ float pool_entry(const TurboFormatDev& f, int i) {
    if (f.calibrated) return f.cbk_cent[i];
    return i < (1 << f.bits1) ? f.cent1[i] : f.cent2[i - (1 << f.bits1)];
}

// The rotated-domain value of one coordinate of the block at bit `blk` of the words.
__device__ __forceinline__ float coord_value(const uint32_t* words, int blk, int4 t, const float* pool) {
    const int nb1 = t.z & 15, nb2 = (t.z >> 4) & 15;
    float y = __int_as_float(t.w) * pool[((t.z >> 8) & 0xfff) + int(code_at(words, blk + t.x, nb1))];
    if (nb2 != 0) y += pool[(t.z >> 20) + int(code_at(words, blk + t.y, nb2))];
    return y;
}

// The unnormalized FWHT of o[0, d) in shared memory by the whole block (kAttnThreads threads),
// ending synchronized.
__device__ __forceinline__ void block_fwht(float* o, int d, int tid) {
    for (int len = 1; len < d; len <<= 1) {
        for (int pr = tid; pr < d / 2; pr += kAttnThreads) {
            const int j = (pr & ~(len - 1)) * 2 + (pr & (len - 1));
            const float a = o[j], b = o[j + len];
            o[j] = a + b;
            o[j + len] = a - b;
        }
        __syncthreads();
    }
}

// Token-wise pages (KvHeadDev: token t's block at t * block_bytes): a warp's tile is the 32
// blocks of each role, copied whole into shared memory (the pages hold whole tiles).
template <class F>
struct TokenPages {
    using KFormat = F;
    using VFormat = F;
    using Head = KvHeadDev;
    using Params = ReaderAttentionParams<F, F, KvHeadDev>;
    __host__ __device__ static int key_tile_bytes(const F& f) { return words_buffer(kTile * f.block_bytes); }
    __host__ __device__ static int value_tile_bytes(const F& f) { return words_buffer(kTile * f.block_bytes); }
    __host__ __device__ static int warp_scratch_bytes(const F&) { return 0; }
    __device__ static void copy_tiles(const KvHeadDev& h, const ReaderTile& t, const F& kf, const F& vf, int lane) {
        copy_tile(t.k, reinterpret_cast<const uint8_t*>(h.k) + t.t0 * kf.block_bytes, kTile * kf.block_bytes, lane);
        copy_tile(t.v, reinterpret_cast<const uint8_t*>(h.v) + t.t0 * vf.block_bytes, kTile * vf.block_bytes, lane);
        __syncwarp();
    }
};

// How the attention reads TurboQuant blocks (a reader policy of reader_attention_kernel): per
// coordinate a table entry (coordinate_of) and the role's centroid pool in shared memory; a
// token's fp16 norm scales its score and its value; turbo-prod keys add the QJL term.
template <int NC, int GM>
struct TurboReader : TokenPages<TurboFormatDev> {
    using Format = TurboFormatDev;
    static constexpr int D = NC * 32;
    // Shared memory past the queries: S q' (turbo-prod keys), the tables and the pools.
    __host__ __device__ static int extra_bytes(const Format&) {
        return align16(GM * D * 4) + 2 * D * 16 + 2 * align16(kTurboPoolFloats * 4);
    }
    const Format &kf, &vf;
    float* sq;
    int4 *tab_k, *tab_v;
    float *pool_k, *pool_v;
    int4 tv[NC] = {};  // the value tables of this lane's channels (prepare_query; blocks without tokens never read them)

    // Fills the tables (what no kernel writes: before pdl_wait).
    __device__ TurboReader(const Format& k, const Format& v, uint8_t* extra, int tid) : kf(k), vf(v) {
        sq = reinterpret_cast<float*>(extra);
        tab_k = reinterpret_cast<int4*>(extra + align16(GM * D * 4));
        tab_v = tab_k + D;
        pool_k = reinterpret_cast<float*>(tab_v + D);
        pool_v = pool_k + align16(kTurboPoolFloats * 4) / 4;
        for (int c = tid; c < D; c += kAttnThreads) {
            tab_k[c] = coordinate_of(kf, c);
            tab_v[c] = coordinate_of(vf, c);
        }
        for (int i = tid; i < pool_floats(kf); i += kAttnThreads) pool_k[i] = pool_entry(kf, i);
        for (int i = tid; i < pool_floats(vf); i += kAttnThreads) pool_v[i] = pool_entry(vf, i);
    }
    // qr = scale * Pi q for the GM rows of qraw, and S q' for turbo-prod keys; every thread calls,
    // the tables are synchronized before and everything after.
    __device__ void prepare_query(const float* qraw, float* qr, float scale, int tid, int warp, int lane) {
#pragma unroll
        for (int j = 0; j < NC; ++j) tv[j] = tab_v[lane + 32 * j];
        if (kf.hadamard) {
            for (int h = warp; h < GM; h += kAttnWarps) {
                float* x = qr + h * D;
                for (int c = lane; c < D; c += 32) x[c] = __fmul_rn(qraw[h * D + c], kf.signs[c]);
                warp_fwht(x, D, lane);
                for (int c = lane; c < D; c += 32) x[c] = x[c] * kf.inv_sqrt_d * scale;
            }
        } else {
            for (int i = tid; i < GM * D; i += kAttnThreads) {
                const int h = i / D, r = i % D;
                const float* row = kf.rows + int64_t(r) * D;
                float s = 0.0f;
                for (int c = 0; c < D; ++c) s = fmaf(row[c], qraw[h * D + c], s);
                qr[i] = s * scale;
            }
        }
        __syncthreads();
        if (kf.qjl) {  // turbo-prod keys: the query's sketch S q', once per block
            for (int i = tid; i < GM * D; i += kAttnThreads) {
                const int h = i / D, r = i % D;
                float s = 0.0f;  // row r of S: column r of S^T, adjacent threads adjacent floats
                for (int c = 0; c < D; ++c) s = fmaf(__ldg(kf.sketch_t + int64_t(c) * D + r), qr[h * D + c], s);
                sq[i] = s;
            }
            __syncthreads();
        }
    }
    __device__ void load(const KvHeadDev& h, const ReaderTile& t, const float*, int lane) const { copy_tiles(h, t, kf, vf, lane); }
    // s[h] = <q'_h, x^_t> for the key of tile token `lane` (its norm included).
    __device__ void score(const KvHeadDev&, const ReaderTile& t, int lane, const float* qr, float (&s)[GM]) const {
        const auto* kw = reinterpret_cast<const uint32_t*>(t.k);
        const uint8_t* ktile = t.k;
        const int kb = lane * kf.block_bytes * 8;
#pragma unroll
        for (int h = 0; h < GM; ++h) s[h] = 0.0f;
#pragma unroll 4
        for (int c = 0; c < D; ++c) {
            const float y = coord_value(kw, kb, tab_k[c], pool_k);
#pragma unroll
            for (int h = 0; h < GM; ++h) s[h] = fmaf(qr[h * D + c], y, s[h]);
        }
        if (kf.qjl) {  // + qjl_scale * gamma * <S q', sign>
            const float gk =
                kf.qjl_scale * __half2float(reinterpret_cast<const __half*>(ktile)[(lane * kf.block_bytes + kf.gamma_offset) / 2]);
            const int sb = (lane * kf.block_bytes + kf.sign_offset) * 8;
            float t[GM];
#pragma unroll
            for (int h = 0; h < GM; ++h) t[h] = 0.0f;
            for (int w = 0; w < NC; ++w) {
                const unsigned bits = word_at(kw, sb + 32 * w);
#pragma unroll 4
                for (int i = 0; i < 32; ++i) {
                    const float sg = (bits >> i) & 1u ? 1.0f : -1.0f;
#pragma unroll
                    for (int h = 0; h < GM; ++h) t[h] = fmaf(sq[h * D + 32 * w + i], sg, t[h]);
                }
            }
#pragma unroll
            for (int h = 0; h < GM; ++h) s[h] += gk * t[h];
        }
        const float nk = __half2float(reinterpret_cast<const __half*>(ktile)[lane * kf.block_bytes / 2]);
#pragma unroll
        for (int h = 0; h < GM; ++h) s[h] *= nk;
    }
    // The value's norm of tile token `lane`, and channel lane + 32 j of tile token i's coded value.
    __device__ float value_scale(const ReaderTile& t, int lane) const {
        return __half2float(reinterpret_cast<const __half*>(t.v)[lane * vf.block_bytes / 2]);
    }
    __device__ float value(const KvHeadDev&, const ReaderTile& t, int i, int j) const {
        return coord_value(reinterpret_cast<const uint32_t*>(t.v), i * vf.block_bytes * 8, tv[j], pool_v);
    }
    // out = Pi^T o (Rotation::apply_t) of the merged output o (shared memory, clobbered).
    __device__ static void map_back(const Format& vf, float* o, float* out, int d, int tid) {
        if (vf.hadamard) {
            block_fwht(o, d, tid);
            for (int c = tid; c < d; c += kAttnThreads) out[c] = o[c] * (vf.signs[c] * vf.inv_sqrt_d);
        } else {
            for (int c = tid; c < d; c += kAttnThreads) {
                float v = 0.0f;
                for (int i = 0; i < d; ++i) v = fmaf(vf.rows[int64_t(i) * d + c], o[i], v);
                out[c] = v;
            }
        }
    }
};

// How the attention reads VecInfer blocks: a token's sub-vector j is centroid idx_j of codebook
// C_j (global memory: d x 2^m floats a role, cached), no norm; the query is smoothed and
// transformed once per block (q~ = scale * H (lambda q) / sqrt(d)), the output transformed back
// once in the merge (H / sqrt(d): its own inverse).
template <int NC, int GM>
struct VecinferReader : TokenPages<VecinferFormatDev> {
    using Format = VecinferFormatDev;
    static constexpr int D = NC * 32;
    __host__ __device__ static int extra_bytes(const Format&) { return 0; }
    const Format &kf, &vf;
    __device__ VecinferReader(const Format& k, const Format& v, uint8_t*, int) : kf(k), vf(v) {}
    __device__ void load(const KvHeadDev& h, const ReaderTile& t, const float*, int lane) const { copy_tiles(h, t, kf, vf, lane); }
    __device__ void prepare_query(const float* qraw, float* qr, float scale, int, int warp, int lane) {
        for (int h = warp; h < GM; h += kAttnWarps) {
            float* x = qr + h * D;
            for (int c = lane; c < D; c += 32) x[c] = kf.lambda ? qraw[h * D + c] * kf.lambda[c] : qraw[h * D + c];
            warp_fwht(x, D, lane);
            for (int c = lane; c < D; c += 32) x[c] = x[c] * kf.inv_sqrt_d * scale;
        }
        __syncthreads();
    }
    __device__ void score(const KvHeadDev&, const ReaderTile& t, int lane, const float* qr, float (&s)[GM]) const {
        const auto* kw = reinterpret_cast<const uint32_t*>(t.k);
        const int kb = lane * kf.block_bytes * 8, n = kf.n;
#pragma unroll
        for (int h = 0; h < GM; ++h) s[h] = 0.0f;
        for (int j = 0; j < D / n; ++j) {
            const float* cj = kf.codebook + ((int64_t(j) << kf.m) + code_at(kw, kb + j * kf.m, kf.m)) * n;
            for (int e = 0; e < n; ++e) {
                const float y = __ldg(cj + e);
#pragma unroll
                for (int h = 0; h < GM; ++h) s[h] = fmaf(qr[h * D + j * n + e], y, s[h]);
            }
        }
    }
    __device__ float value_scale(const ReaderTile&, int) const { return 1.0f; }
    __device__ float value(const KvHeadDev&, const ReaderTile& t, int i, int j) const {
        const auto* vw = reinterpret_cast<const uint32_t*>(t.v);
        const int c = int(threadIdx.x & 31u) + 32 * j, sub = c / vf.n;
        const unsigned idx = code_at(vw, i * vf.block_bytes * 8 + sub * vf.m, vf.m);
        return __ldg(vf.codebook + ((int64_t(sub) << vf.m) + idx) * vf.n + (c - sub * vf.n));
    }
    __device__ static void map_back(const Format& vf, float* o, float* out, int d, int tid) {
        block_fwht(o, d, tid);
        for (int c = tid; c < d; c += kAttnThreads) out[c] = o[c] * vf.inv_sqrt_d;
    }
};

}  // namespace
}  // namespace vxq::cuda

// The QJL KV kernels (qjl_kv.cuh says what each computes): the key store and the attention's
// reader policy, apart from their launchers (qjl_kv.cu) so that a test can run them on the CPU
// (tests/support/simt.h). Included by qjl_kv.cu and tests/test_qjl_kv_simt.cpp only: everything
// is in an unnamed namespace.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/qjl_kv.cuh"
#include "kernels/cuda/reader_attention_kernels.cuh"

namespace vxq::cuda {
namespace {

constexpr int kQjlBlock = 32;  // tokens a key block (qjl::kBlockTokens)
constexpr int kQjlStoreThreads = 128, kQjlStoreWarps = kQjlStoreThreads / 32;
constexpr int kQjlLd = int(kReaderMaxHeadDim) + 1;  // a staged token's floats: lane t's reads of channel c in bank t + c

// An fp16's bits at any byte offset (a block's norms follow O outlier bytes).
__device__ __forceinline__ void put_fp16_bytes(uint8_t* dst, unsigned bits) {
    dst[0] = uint8_t(bits & 0xffu);
    dst[1] = uint8_t(bits >> 8);
}
__device__ __forceinline__ float fp16_bytes(const uint8_t* src) {
    return __half2float(__ushort_as_half(uint16_t(src[0] | (src[1] << 8))));
}

// One byte of sign bits of every token of the block (qjl::Sketch::signs, lane t: token t, x its
// staged row): bit r of byte bi is sign(<S[8 bi + r], x_part>) >= 0, the dot product in f32 in
// channel order, x_part x on the outlier channels (outliers) or on the others (zero elsewhere, as
// the CPU splits k). Warp w takes bytes w, w + 4, ...
__device__ __forceinline__ void sketch_sign_bytes(const float* S, int rows, int d, const float* x, const uint8_t* is_out,
                                                  bool outliers, uint8_t* dst, int warp, int lane) {
    for (int bi = warp; bi < rows / 8; bi += kQjlStoreWarps) {
        unsigned byte = 0;
        for (int r = 0; r < 8; ++r) {
            const float* row = S + int64_t(8 * bi + r) * d;
            float dot = 0.0f;
            for (int c = 0; c < d; ++c) {
                const float v = (is_out[c] != 0) == outliers ? x[c] : 0.0f;
                dot = __fadd_rn(dot, __fmul_rn(__ldg(row + c), v));
            }
            if (dot >= 0.0f) byte |= 1u << r;
        }
        dst[int64_t(lane) * (rows / 8) + bi] = uint8_t(byte);
    }
}

// Block (key block b of the write, KV head g): qjl::encode of write-local tokens 32 b .. 32 b + 31
// (the window's oldest `pending` from its ring, then new ones rounded to fp16 as the window holds
// them), into the head's packed block packed / 32 + b. Blocks past what the plan encodes return.
__global__ void __launch_bounds__(kQjlStoreThreads) qjl_key_store_kernel(const QjlKeyStoreParams p) {
    __shared__ float xs[kQjlBlock * kQjlLd];
    __shared__ double norm2[kReaderMaxHeadDim];
    __shared__ uint8_t is_out[kReaderMaxHeadDim];
    const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
    const int64_t b = blockIdx.x, g = blockIdx.y;
    pdl_wait();
    const KvWindowWrite w = *p.plan;
    if (b * kQjlBlock >= w.encoded) return;  // the whole block
    const int d = p.kf.d, O = p.kf.outliers;
    const KiviHeadDev h = p.heads[g];
    const auto* ring = reinterpret_cast<const __half*>(h.kw);
    uint8_t* blk = reinterpret_cast<uint8_t*>(h.k) + (w.packed / kQjlBlock + b) * int64_t(p.kf.block_bytes);
    for (int e = tid; e < kQjlBlock * d; e += kQjlStoreThreads) {
        const int t = e / d, c = e - t * d;
        const int64_t i = b * kQjlBlock + t;
        xs[t * kQjlLd + c] = i < w.pending ? __half2float(ring[(w.head + i) % w.slots * d + c])
                                           : __half2float(__float2half_rn(p.k[((i - w.pending) * p.n_head_kv + g) * d + c]));
    }
    for (int c = tid; c < d; c += kQjlStoreThreads) is_out[c] = 0;
    __syncthreads();
    // Each channel's sum of squares over the block: double, token order (the products are exact);
    // a NaN sum counts as the largest.
    for (int c = tid; c < d; c += kQjlStoreThreads) {
        double s = 0.0;
        for (int t = 0; t < kQjlBlock; ++t) {
            const double x = xs[t * kQjlLd + c];
            s = fma(x, x, s);
        }
        norm2[c] = isnan(s) ? double(INFINITY) : s;
    }
    __syncthreads();
    // The outliers: O times the largest remaining sum, of equal ones the lowest channel (the first
    // O of the CPU's stable descending sort), stored in ascending order.
    if (warp == 0) {
        for (int j = 0; j < O; ++j) {
            double best = -1.0;  // below every sum
            int at = d;
            for (int c = lane; c < d; c += 32) {
                if (is_out[c] == 0 && norm2[c] > best) {
                    best = norm2[c];
                    at = c;
                }
            }
            for (int o = 16; o > 0; o >>= 1) {
                const double ob = __shfl_xor_sync(0xffffffffu, best, o);
                const int oa = __shfl_xor_sync(0xffffffffu, at, o);
                if (ob > best || (ob == best && oa < at)) {
                    best = ob;
                    at = oa;
                }
            }
            if (lane == 0) is_out[at] = 1;
            __syncwarp();
        }
        if (lane == 0) {
            int j = 0;
            for (int c = 0; c < d; ++c) {
                if (is_out[c] != 0) blk[j++] = uint8_t(c);
            }
        }
    }
    __syncthreads();
    // Token `lane`'s two norms (double, channel order), then its sign bytes.
    const float* x = xs + lane * kQjlLd;
    if (warp == 0) {
        double nin = 0.0, nout = 0.0;
        for (int c = 0; c < d; ++c) {
            const double v = x[c];
            if (is_out[c] != 0) {
                nout = fma(v, v, nout);
            } else {
                nin = fma(v, v, nin);
            }
        }
        put_fp16_bytes(blk + p.kf.norm_in + 2 * lane, norm_fp16_bits(float(sqrt(nin))));
        if (O > 0) put_fp16_bytes(blk + p.kf.norm_out + 2 * lane, norm_fp16_bits(float(sqrt(nout))));
    }
    sketch_sign_bytes(p.kf.s_in, p.kf.m, d, x, is_out, false, blk + p.kf.signs_in, warp, lane);
    if (O > 0) sketch_sign_bytes(p.kf.s_out, p.kf.mo, d, x, is_out, true, blk + p.kf.signs_out, warp, lane);
}

// How the attention reads a QJL cache (a reader policy of reader_attention_kernel): keys in
// 32-token blocks (a tile is one block) and values KIVI per token, each with an fp16 window past
// its packed tokens (KiviHeadDev). The query is scaled and sketched once per block into `extra`
// (u = S q'); a packed key tile copies its block and corrects u by its outlier columns into the
// warp's scratch (per row: S q'_in [m], then S_o q'_out [m_o]); a window tile reads the fp16 keys
// in place. Values: the tile's packed tokens copied, window ones read in place; no map back.
template <int NC, int GM>
struct QjlReader {
    using KFormat = QjlFormatDev;
    using VFormat = KiviFormatDev;
    using Head = KiviHeadDev;
    using Params = QjlAttentionParams;
    static constexpr int D = NC * 32;
    __host__ __device__ static int extra_bytes(const KFormat& f) { return GM * f.m * 4; }
    __host__ __device__ static int key_tile_bytes(const KFormat& f) { return words_buffer(f.block_bytes); }
    __host__ __device__ static int value_tile_bytes(const VFormat& f) { return words_buffer(kTile * f.block_bytes); }
    __host__ __device__ static int warp_scratch_bytes(const KFormat& f) { return GM * (f.m + f.mo) * 4; }
    const KFormat& kf;
    const VFormat& vf;
    float* u;  // [GM, m]

    __device__ QjlReader(const KFormat& k, const VFormat& v, uint8_t* extra, int) : kf(k), vf(v) {
        u = reinterpret_cast<float*>(extra);
    }
    // qr = scale * q, u = S qr: f32, channel order.
    __device__ void prepare_query(const float* qraw, float* qr, float scale, int tid, int, int) {
        for (int i = tid; i < GM * D; i += kAttnThreads) qr[i] = qraw[i] * scale;
        __syncthreads();
        for (int i = tid; i < GM * kf.m; i += kAttnThreads) {
            const int h = i / kf.m, r = i - h * kf.m;
            float s = 0.0f;
            for (int c = 0; c < D; ++c) s = fmaf(__ldg(kf.t_in + int64_t(c) * kf.m + r), qr[h * D + c], s);
            u[i] = s;
        }
        __syncthreads();
    }
    __device__ void load(const KiviHeadDev& h, const ReaderTile& t, const float* qr, int lane) const {
        const int packed = int(h.v_packed - t.t0 < kTile ? h.v_packed - t.t0 : kTile);
        if (packed > 0) copy_tile(t.v, reinterpret_cast<const uint8_t*>(h.v) + t.t0 * vf.block_bytes, packed * vf.block_bytes, lane);
        if (t.t0 >= h.k_packed) {
            __syncwarp();
            return;
        }
        copy_tile(t.k, reinterpret_cast<const uint8_t*>(h.k) + t.t0 / kTile * kf.block_bytes, kf.block_bytes, lane);
        __syncwarp();
        const int rows = kf.m + kf.mo;
        for (int e = lane; e < GM * rows; e += 32) {
            const int r = e / rows, i = e - r * rows;
            const float* q = qr + r * D;
            float v;
            if (i < kf.m) {
                v = u[r * kf.m + i];
                for (int j = 0; j < kf.outliers; ++j) {
                    const int c = t.k[j];
                    v = fmaf(-q[c], __ldg(kf.t_in + int64_t(c) * kf.m + i), v);
                }
            } else {
                v = 0.0f;
                for (int j = 0; j < kf.outliers; ++j) {
                    const int c = t.k[j];
                    v = fmaf(q[c], __ldg(kf.t_out + int64_t(c) * kf.mo + (i - kf.m)), v);
                }
            }
            t.scratch[e] = v;
        }
        __syncwarp();
    }
    // <sketched query, signs> over `rows` sign bits from bit `bit` of the words, for every row
    // (a = the row's corrected sketch in the scratch, `stride` floats between rows).
    __device__ static void sign_sums(const uint32_t* words, int bit, int rows, const float* a, int stride, float (&s)[GM]) {
#pragma unroll
        for (int h = 0; h < GM; ++h) s[h] = 0.0f;
        for (int i0 = 0; i0 < rows; i0 += 32) {
            const unsigned bits = word_at(words, bit + i0);
            const int n = rows - i0 < 32 ? rows - i0 : 32;
            for (int i = 0; i < n; ++i) {
                const float sg = (bits >> i) & 1u ? 1.0f : -1.0f;
#pragma unroll
                for (int h = 0; h < GM; ++h) s[h] = fmaf(a[h * stride + i0 + i], sg, s[h]);
            }
        }
    }
    // s[h] = <qr_h, k^_t> for tile token t = t0 + lane: the estimator of a packed key, the fp16
    // window key's product (0 past the stored tokens: masked by the caller).
    __device__ void score(const KiviHeadDev& h, const ReaderTile& t, int lane, const float* qr, float (&s)[GM]) const {
        const int64_t tok = t.t0 + lane;
        if (t.t0 < h.k_packed) {
            const auto* kw = reinterpret_cast<const uint32_t*>(t.k);
            const int stride = kf.m + kf.mo;
            sign_sums(kw, (kf.signs_in + lane * (kf.m / 8)) * 8, kf.m, t.scratch, stride, s);
            const float w_in = kf.scale_in * fp16_bytes(t.k + kf.norm_in + 2 * lane);
#pragma unroll
            for (int r = 0; r < GM; ++r) s[r] *= w_in;
            if (kf.outliers > 0) {
                float so[GM];
                sign_sums(kw, (kf.signs_out + lane * (kf.mo / 8)) * 8, kf.mo, t.scratch + kf.m, stride, so);
                const float w_out = kf.scale_out * fp16_bytes(t.k + kf.norm_out + 2 * lane);
#pragma unroll
                for (int r = 0; r < GM; ++r) s[r] = fmaf(w_out, so[r], s[r]);
            }
            return;
        }
#pragma unroll
        for (int r = 0; r < GM; ++r) s[r] = 0.0f;
        if (tok >= h.n_tokens) return;
        const auto* key = reinterpret_cast<const __half*>(h.kw) + (h.k_head + tok - h.k_packed) % kf.slots * D;
        for (int c = 0; c < D; ++c) {
            const float kc = __half2float(key[c]);
#pragma unroll
            for (int r = 0; r < GM; ++r) s[r] = fmaf(qr[r * D + c], kc, s[r]);
        }
    }
    __device__ float value_scale(const ReaderTile&, int) const { return 1.0f; }
    // Channel lane + 32 j of token t0 + i: fma(code, scale, zero) of row j of the packed token
    // (groups of 32 channels), or the window's fp16.
    __device__ float value(const KiviHeadDev& h, const ReaderTile& t, int i, int j) const {
        const int lane = int(threadIdx.x & 31u);
        const int64_t tok = t.t0 + i;
        if (tok < h.v_packed) {
            const uint8_t* blk = t.v + i * vf.block_bytes;
            const float z = fp16_bytes(blk + 2 * j), sc = fp16_bytes(blk + 2 * vf.rows + 2 * j);
            const int bit = (i * vf.block_bytes + 4 * vf.rows + j * (32 * vf.bits / 8)) * 8 + lane * vf.bits;
            return fmaf(float(code_at(reinterpret_cast<const uint32_t*>(t.v), bit, vf.bits)), sc, z);
        }
        const auto* val = reinterpret_cast<const __half*>(h.vw) + (h.v_head + tok - h.v_packed) % vf.slots * D;
        return __half2float(val[lane + 32 * j]);
    }
    __device__ static void map_back(const VFormat&, float* o, float* out, int d, int tid) {
        for (int c = tid; c < d; c += kAttnThreads) out[c] = o[c];
    }
};

}  // namespace
}  // namespace vxq::cuda

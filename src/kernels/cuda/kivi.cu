// KIVI caches in device memory: the store (encoders + window write) and the split-K attention
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
#include "kernels/cuda/kv_codes.cuh"
#include "kernels/cuda/launch.cuh"

namespace vxq::cuda {

namespace {

constexpr int kKiviWarps = 4;
constexpr int kKiviTile = 32;     // tokens a warp takes at a time: a lane per token
constexpr int kKiviMaxGqa = 8;
constexpr int kKiviMinStretch = 64;
constexpr int kMaxSplits = 128;

__host__ __device__ constexpr int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ constexpr int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }


// Element c of write-local token i (plan w), as the encoder takes it: the fp16 window's, or the
// new input rounded to fp16 as the window would hold it.   x: the head's new rows, `stride` apart
__device__ __forceinline__ float write_token(const KvWindowWrite& w, const uint8_t* ring, const float* x, int64_t stride,
                                             int64_t d, int64_t i, int64_t c) {
    if (i < w.pending) return kv_half_at(ring + ((w.head + i) % w.slots) * d * 2 + 2 * c);
    return __half2float(__float2half_rn(x[(i - w.pending) * stride + c]));
}

// kivi::quantize_group + pack_row for the n values get(0..n-1): zero and scale (fp16) and the
// packed codes of one row.
template <class Get>
__device__ void quantize_row(Get get, int n, int bits, uint8_t* zero, uint8_t* scale, uint8_t* row) {
    float mn = get(0), mx = mn;
    bool nan = false;
    for (int i = 0; i < n; ++i) {
        const float x = get(i);
        if (x < mn) mn = x;
        if (x > mx) mx = x;
        nan |= x != x;
    }
    const float qmax = float((1 << bits) - 1);
    // A NaN group stores the CPU's fp16 of quiet_NaN() (0x7e00; __float2half_rn gives 0x7fff).
    const uint16_t z16 = nan ? uint16_t(0x7e00) : kv_half_bits(mn);
    const uint16_t s16 = nan ? uint16_t(0x7e00) : kv_half_bits(__fdiv_rn(__fsub_rn(mx, mn), qmax));
    *reinterpret_cast<uint16_t*>(zero) = z16;
    *reinterpret_cast<uint16_t*>(scale) = s16;
    const float z = __half2float(__ushort_as_half(z16)), s = __half2float(__ushort_as_half(s16));
    unsigned acc = 0;
    int filled = 0;
    for (int i = 0; i < n; ++i) {
        unsigned code = 0;
        if (s > 0.0f) {
            const float t = __fdiv_rn(__fsub_rn(get(i), z), s);
            code = unsigned(rintf(t >= 0.0f ? fminf(t, qmax) : 0.0f));
        }
        acc |= code << filled;
        filled += bits;
        if (filled == 8) {
            *row++ = uint8_t(acc);
            acc = 0;
            filled = 0;
        }
    }
}

// Key block j of the write (G tokens): a thread per channel (its row), adjacent threads adjacent
// channels, so every token's loads coalesce.
__global__ void kivi_encode_keys_kernel(KiviStoreParams p) {
    const KvWindowWrite w = p.plan[0];
    const int G = p.kf.group, bits = p.kf.bits;
    const int64_t j = blockIdx.x, g = blockIdx.y, d = p.head_dim, stride = p.n_head_kv * d;
    if (j * G >= w.encoded) return;
    const KiviHeadDev h = p.heads[g];
    const float* x = p.k + g * d;
    const auto* ring = reinterpret_cast<const uint8_t*>(h.kw);
    uint8_t* blk = reinterpret_cast<uint8_t*>(h.k) + (w.packed / G + j) * p.kf.block_bytes;
    const int64_t rb = G * bits / 8;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
        const auto get = [&](int t) { return write_token(w, ring, x, stride, d, j * G + t, c); };
        quantize_row(get, G, bits, blk + 2 * c, blk + 2 * d + 2 * c, blk + 4 * d + c * rb);
    }
}

// Value rows of the write: a thread per (token j, row r) of G channels (a ragged last row repeats
// its last real channel, as the CPU pads it).
constexpr int kValueThreads = 128;
__global__ void __launch_bounds__(kValueThreads) kivi_encode_values_kernel(KiviStoreParams p) {
    const KvWindowWrite w = p.plan[1];
    const int G = p.vf.group, bits = p.vf.bits, rows = p.vf.rows;
    const int64_t idx = int64_t(blockIdx.x) * kValueThreads + threadIdx.x, j = idx / rows, g = blockIdx.y;
    const int r = int(idx - j * rows);
    const int64_t d = p.head_dim, stride = p.n_head_kv * d;
    if (j >= w.encoded) return;
    const KiviHeadDev h = p.heads[g];
    const float* x = p.v + g * d;
    const auto* ring = reinterpret_cast<const uint8_t*>(h.vw);
    uint8_t* blk = reinterpret_cast<uint8_t*>(h.v) + (w.packed + j) * p.vf.block_bytes;
    const int64_t rb = G * bits / 8, c0 = int64_t(r) * G, last = min64(d, c0 + G) - 1;
    const auto get = [&](int t) { return write_token(w, ring, x, stride, d, j, min64(c0 + t, last)); };
    quantize_row(get, G, bits, blk + 2 * r, blk + 2 * rows + 2 * r, blk + 4 * rows + r * rb);
}

// New token j of the write into the window of keys (z = 0) or values (z = 1), unless encoded.
__global__ void kivi_window_kernel(KiviStoreParams p) {
    const int role = blockIdx.z;
    const KvWindowWrite w = p.plan[role];
    const int64_t j = blockIdx.x, g = blockIdx.y, d = p.head_dim;
    if (w.pending + j < w.encoded) return;
    const KiviHeadDev h = p.heads[g];
    const int64_t slot = (w.head + w.pending + j) % w.slots;
    auto* dst = reinterpret_cast<uint16_t*>(role ? h.vw : h.kw) + slot * d;
    const float* x = (role ? p.v : p.k) + (j * p.n_head_kv + g) * d;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) dst[c] = kv_half_bits(x[c]);
}

// ---- attention --------------------------------------------------------------------------------

// Shared memory: q of the group's heads [gqa][D] f32, then per warp two stages of a tile's bytes,
// each [zeros and scales of its key block: 4 D][its key codes: D rows of 4 bits bytes][its packed
// value blocks: 32 x vbb] (cp.async, the next tile's in flight while one is computed), then q * s
// per channel [D][G4] (G4: gqa rounded up to 4, for float4 loads) and the tile's probabilities
// [32][G4]; at the end each warp's region holds its state for the merge.
__host__ __device__ constexpr int kivi_g4(int gqa) { return (gqa + 3) & ~3; }
__host__ __device__ constexpr int kivi_stage_bytes(int d, int kbits, int vbb) { return 4 * d + 4 * d * kbits + kKiviTile * vbb; }
__host__ __device__ constexpr int kivi_warp_bytes(int d, int kbits, int vbb, int g4) {
    return 2 * kivi_stage_bytes(d, kbits, vbb) + 4 * (d * g4 + kKiviTile * g4);
}
size_t kivi_smem_bytes(int d, int kbits, int vbb, int gqa) {
    return size_t(4 * gqa * d) + size_t(kKiviWarps) * size_t(kivi_warp_bytes(d, kbits, vbb, kivi_g4(gqa)));
}

template <int D>
__global__ void __launch_bounds__(kKiviWarps * 32) kivi_attention_kernel(KiviAttentionParams p) {
    constexpr int CPL = D / 32;  // value channels per lane
    extern __shared__ float4 smem4[];
    auto* smem = reinterpret_cast<uint8_t*>(smem4);
    const int gqa = int(p.n_head / p.n_head_kv), g4 = kivi_g4(gqa);
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int64_t z = blockIdx.x, g = blockIdx.y, i = blockIdx.z;
    const KiviHeadDev hd = p.heads[g];
    const int64_t n_vis = hd.n_tokens - p.n_q + i + 1;
    int64_t per = (n_vis + p.splits - 1) / p.splits;
    per = max64((per + kKiviTile - 1) / kKiviTile * kKiviTile, kKiviMinStretch);
    const int64_t t_begin = z * per, t_end = min64(n_vis, t_begin + per);

    const int kbits = p.kf.bits, KG = p.kf.group, krb = KG * kbits / 8;
    const int VG = p.vf.group, vbits = p.vf.bits, vrows = p.vf.rows, vrb = VG * vbits / 8, vbb = p.vf.block_bytes;
    const unsigned kmask = (1u << kbits) - 1, vmask = (1u << vbits) - 1;
    const int stage_bytes = kivi_stage_bytes(D, kbits, vbb), warp_bytes = kivi_warp_bytes(D, kbits, vbb, g4);
    auto* q_s = reinterpret_cast<float*>(smem);
    uint8_t* wbase = smem + 4 * gqa * D + warp * warp_bytes;
    auto* qs_s = reinterpret_cast<float*>(wbase + 2 * stage_bytes);
    float* p_s = qs_s + D * g4;
    const float* qg = p.q + (i * p.n_head + g * gqa) * D;
    for (int idx = threadIdx.x; idx < gqa * D; idx += blockDim.x) q_s[idx] = qg[idx];
    __syncthreads();

    const auto* kbase = reinterpret_cast<const uint8_t*>(hd.k);
    const auto* vbase = reinterpret_cast<const uint8_t*>(hd.v);
    // A tile's keys are read from shared memory when they lie in one packed block.
    const auto fast_keys = [&](int64_t t0) { return KG % kKiviTile == 0 && t0 + kKiviTile <= hd.k_packed; };
    // Starts the copies of tile t0's bytes into a stage (one commit group per tile, empty or not).
    const auto issue = [&](int64_t t0, uint8_t* stage) {
        if (fast_keys(t0)) {
            const uint8_t* blk = kbase + (t0 / KG) * p.kf.block_bytes;
            for (int u = lane; u < D / 4; u += 32) cp_async16(stage + 16 * u, blk + 16 * u);
            const uint8_t* codes = blk + 4 * D + (t0 % KG) * kbits / 8;
            uint8_t* kc = stage + 4 * D;
            if (kbits == 2) {
                for (int c = lane; c < D; c += 32) cp_async8(kc + 8 * c, codes + c * krb);
            } else {
                const int units = kbits / 4;  // 16-byte units of a row's 4 bits bytes
                for (int idx = lane; idx < D * units; idx += 32) {
                    const int c = idx / units, u = idx - c * units;
                    cp_async16(kc + c * 4 * kbits + 16 * u, codes + c * krb + 16 * u);
                }
            }
        }
        if (t0 < hd.v_packed) {
            const int units = int((min64(kKiviTile, hd.v_packed - t0) * vbb + 15) / 16);
            const uint8_t* src = vbase + t0 * vbb;
            uint8_t* dst = stage + 4 * D + 4 * D * kbits;
            for (int u = lane; u < units; u += 32) cp_async16(dst + 16 * u, src + 16 * u);
        }
        cp_async_commit();
    };

    float m[kKiviMaxGqa], l[kKiviMaxGqa], o[kKiviMaxGqa][CPL];
#pragma unroll
    for (int h = 0; h < kKiviMaxGqa; ++h) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int j = 0; j < CPL; ++j) o[h][j] = 0.0f;
    }
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
            for (int j = 0; j < CPL; ++j) o[h][j] = fmaf(pv[h], x[j], o[h][j]);
        }
    };

    int64_t t0 = t_begin + warp * kKiviTile;
    if (t0 < t_end) issue(t0, wbase);
    for (int k = 0; t0 < t_end; ++k, t0 += kKiviWarps * kKiviTile) {
        const int64_t tn = t0 + kKiviWarps * kKiviTile;
        if (tn < t_end) {
            issue(tn, wbase + ((k + 1) & 1) * stage_bytes);
        } else {
            cp_async_commit();
        }
        cp_async_wait<1>();
        __syncwarp();
        const uint8_t* stage = wbase + (k & 1) * stage_bytes;
        const int cnt = int(min64(kKiviTile, t_end - t0));
        float acc[kKiviMaxGqa];
#pragma unroll
        for (int h = 0; h < kKiviMaxGqa; ++h) acc[h] = 0.0f;
        if (fast_keys(t0)) {
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
            const float mn = fmaxf(m[h], warp_max(s));
            const float corr = expf(m[h] - mn);
            const float pv = lane < cnt ? expf(s - mn) : 0.0f;
            l[h] = l[h] * corr + warp_sum(pv);
#pragma unroll
            for (int j = 0; j < CPL; ++j) o[h][j] *= corr;
            m[h] = mn;
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
            for (int t = 0; t < cnt; ++t) {
                const int64_t tt = t0 + t;
                float x[CPL];
                if (tt >= hd.v_packed) {  // the fp16 window
                    const auto* row = reinterpret_cast<const uint8_t*>(hd.vw) +
                                      ((hd.v_head + tt - hd.v_packed) % p.vf.slots) * D * 2 + 2 * c0;
#pragma unroll
                    for (int j = 0; j < CPL; ++j) x[j] = kv_half_at(row + 2 * j);
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
                accumulate(t, x);
            }
        }
        __syncwarp();  // the next issue overwrites this stage; q * s and probabilities are rewritten
    }
    cp_async_wait<0>();

    // The block's partial: the four warps' states merged with their log-sum-exp weights.
    auto* ws = reinterpret_cast<float*>(wbase);
    const int wwords = warp_bytes / 4;
#pragma unroll
    for (int h = 0; h < kKiviMaxGqa; ++h) {
        if (h >= gqa) continue;
#pragma unroll
        for (int j = 0; j < CPL; ++j) ws[h * D + c0 + j] = o[h][j];
        if (lane == 0) {
            ws[gqa * D + 2 * h] = m[h];
            ws[gqa * D + 2 * h + 1] = l[h];
        }
    }
    __syncthreads();
    const auto* w0 = reinterpret_cast<const float*>(smem + 4 * gqa * D);
    for (int idx = threadIdx.x; idx < gqa * (D + 2); idx += blockDim.x) {
        const int h = idx / (D + 2), c = idx - h * (D + 2);
        float mx = -INFINITY;
        for (int w = 0; w < kKiviWarps; ++w) mx = fmaxf(mx, w0[w * wwords + gqa * D + 2 * h]);
        float sum = 0.0f;
        for (int w = 0; w < kKiviWarps; ++w) {
            const float* st = w0 + w * wwords;
            const float mw = st[gqa * D + 2 * h];
            if (mw == -INFINITY) continue;
            sum += expf(mw - mx) * (c < D ? st[h * D + c] : st[gqa * D + 2 * h + 1]);
        }
        float* part = p.partial + ((i * p.n_head + g * gqa + h) * p.splits + z) * (D + 2);
        part[c] = c == D ? mx : sum;
    }
}

// out = the splits' partials merged: sum_z o_z e^(m_z - M) / sum_z l_z e^(m_z - M). The block's
// threads take the splits' weights in parallel (shared memory), then a thread per channel sums
// the splits' o with several loads in flight (a serial chain of loads made it the larger half of
// a decode step's KIVI attention).
constexpr int kMergeThreads = 128;
__global__ void __launch_bounds__(kMergeThreads) kivi_merge_kernel(KiviAttentionParams p) {
    __shared__ float weight[kMaxSplits];
    __shared__ float red[kMergeThreads / 32];
    const int64_t row = blockIdx.x, d = p.head_dim, n = p.splits;
    const float* part = p.partial + row * n * (d + 2);
    float m = -INFINITY;
    for (int64_t z = threadIdx.x; z < n; z += kMergeThreads) m = fmaxf(m, part[z * (d + 2) + d]);
    const float mx = block_reduce<kMergeThreads / 32>(m, red, true);
    float sum = 0.0f;
    for (int64_t z = threadIdx.x; z < n; z += kMergeThreads) {
        const float mz = part[z * (d + 2) + d];
        const float w = mz == -INFINITY ? 0.0f : expf(mz - mx);
        weight[z] = w;
        sum += w * part[z * (d + 2) + d + 1];
    }
    const float total = block_reduce<kMergeThreads / 32>(sum, red, false);
    for (int64_t c = threadIdx.x; c < d; c += kMergeThreads) {
        float acc = 0.0f;
#pragma unroll 8
        for (int64_t z = 0; z < n; ++z) acc += weight[z] * part[z * (d + 2) + c];
        p.out[row * d + c] = acc / total;
    }
}

template <int D>
void launch_attention(const KiviAttentionParams& p, cudaStream_t st) {
    const int gqa = int(p.n_head / p.n_head_kv);
    const size_t smem = kivi_smem_bytes(D, p.kf.bits, p.vf.block_bytes, gqa);
    static size_t configured = 0;  // the largest size set so far (48 KB without the attribute)
    if (smem > 48 * 1024 && smem > configured) {
        VXQ_CUDA_CHECK(cudaFuncSetAttribute(kivi_attention_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        configured = smem;
    }
    kivi_attention_kernel<D><<<dim3(unsigned(p.splits), unsigned(p.n_head_kv), unsigned(p.n_q)), kKiviWarps * 32, smem, st>>>(p);
    VXQ_CUDA_CHECK_LAUNCH();
}

}  // namespace

void kivi_store(const KiviStoreParams& p, cudaStream_t st) {
    if (p.n == 0) return;
    const unsigned hk = unsigned(p.n_head_kv), n = unsigned(p.n);
    // At most slots - 1 pending keys and the n new ones are flushed, in whole blocks.
    const unsigned key_blocks = unsigned((p.kf.slots - 1 + p.n + p.kf.group - 1) / p.kf.group);
    kivi_encode_keys_kernel<<<dim3(key_blocks, hk), unsigned(std::min<int64_t>(p.head_dim, 256)), 0, st>>>(p);
    VXQ_CUDA_CHECK_LAUNCH();
    const unsigned value_blocks = unsigned((p.n * p.vf.rows + kValueThreads - 1) / kValueThreads);
    kivi_encode_values_kernel<<<dim3(value_blocks, hk), kValueThreads, 0, st>>>(p);
    VXQ_CUDA_CHECK_LAUNCH();
    kivi_window_kernel<<<dim3(n, hk, 2), unsigned(std::min<int64_t>(p.head_dim, 128)), 0, st>>>(p);
    VXQ_CUDA_CHECK_LAUNCH();
}

bool kivi_attention_fits(int64_t n_head, int64_t n_head_kv, int64_t head_dim) {
    return n_head_kv > 0 && n_head % n_head_kv == 0 && n_head / n_head_kv <= kKiviMaxGqa && head_dim % 32 == 0 &&
           head_dim >= 32 && head_dim <= 256;
}

int64_t kivi_attention_splits(int64_t n_q, int64_t n_head_kv) {
    const int64_t want = std::max<int64_t>(1, 4 * sm_count() / std::max<int64_t>(1, n_head_kv * n_q));
    int64_t s = 1;
    while (s * 2 <= want && s < kMaxSplits) s *= 2;
    return s;
}

size_t kivi_attention_scratch_floats(int64_t n_q, int64_t n_head, int64_t head_dim, int64_t splits) {
    return size_t(n_q * n_head * splits * (head_dim + 2));
}

void kivi_attention(const KiviAttentionParams& p, cudaStream_t st) {
    if (p.n_q == 0) return;
    if (p.splits < 1 || p.splits > kMaxSplits) {
        throw_cuda_error(cudaErrorInvalidValue, "kivi_attention: splits must be 1..128", __FILE__, __LINE__);
    }
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
    kivi_merge_kernel<<<unsigned(p.n_q * p.n_head), kMergeThreads, 0, st>>>(p);
    VXQ_CUDA_CHECK_LAUNCH();
}

}  // namespace vxq::cuda

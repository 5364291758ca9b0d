// The compute of the flash-style prefill attention, shared by the KIVI prefill (kivi.cu) and the
// prefill of the token-wise formats (attention.cu). A block takes kFlashRows (query, head) rows of
// one KV head: the kFlashRows / gqa consecutive queries of the block times the head's query heads,
// row r = query r / gqa, head r % gqa; warp w owns rows 16 w .. 16 w + 15 (an MMA m-tile), thread
// (gid, tig) rows ra = 16 w + gid and rb = ra + 8. The block walks the tokens its last query sees in
// kFlashTile-token tiles; each kernel stages a tile in shared memory in its own way (keys
// [token][channel], values transposed [channel][token], fp16 hi and, where the numbers need it, lo
// halves of the f32 numbers the CPU's reader gives), then every warp:
//   scores   q hi / lo x k hi / lo: hi*hi in one accumulator, hi*lo + lo*hi (scaled by 2^11, mma.cuh)
//            in another (flash_scores; keys without lo parts skip hi*lo);
//   softmax  online, a row's 32 tokens on its 4 lanes tig (flash_softmax_pv);
//   P V      into one accumulator of 2^11 o: (2^11 p_hi) v_hi + p_hi v_lo + p_lo v_hi (p <= 1, so
//            2^11 p_hi is an exact fp16 number; values without lo parts skip p_hi v_lo).
// The products are f32-exact to ~2^-22 and the tensor cores add in f32: dequantize-then-attend
// within ~1e-6 relative. out = o / (2^11 l) (flash_store). A tile's keys and values are read and
// converted once for the block's 64 rows.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

#include "kernels/cuda/mma.cuh"

namespace vxq::cuda {

constexpr int kFlashWarps = 4, kFlashRows = 16 * kFlashWarps, kFlashTile = 32;
__host__ __device__ constexpr int flash_qpitch(int d) { return d + 8; }  // halves: rows 4 banks apart
constexpr int kFlashVPitch = kFlashTile + 8;                              // halves of a value channel's row

#ifdef __CUDACC__
// One thread's share of its warp's rows: the output accumulators of rows ra (o[.][0, 1]) and rb
// (o[.][2, 3]), channels 8 nt + 2 tig (+1); each row's running max and this lane's part of its sum.
template <int D>
struct FlashRows {
    float o[D / 8][4];
    float m[2], l[2];
    __device__ __forceinline__ void init() {
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.0f;
    }
};

// The block's q rows (query i0 + r / gqa, head g gqa + r % gqa of q [n_q, n_head, D]) as hi / lo
// halves [kFlashRows][flash_qpitch(D)]; rows past the block's queries zero. Every thread calls.
template <int D>
__device__ __forceinline__ void flash_load_q(const float* q, int64_t n_q, int64_t n_head, int gqa, int64_t i0, int64_t g,
                                             __half* qh, __half* ql) {
    constexpr int QP = flash_qpitch(D);
    const int qb = kFlashRows / gqa;
    for (int e = threadIdx.x; e < kFlashRows * D / 2; e += kFlashWarps * 32) {
        const int r = e / (D / 2), c = 2 * (e - r * (D / 2));
        const int64_t i = i0 + r / gqa;
        float2 x = make_float2(0.0f, 0.0f);
        if (r < qb * gqa && i < n_q) x = *reinterpret_cast<const float2*>(q + (i * n_head + g * gqa + r % gqa) * D + c);
        unsigned hi, lo;
        split_pair(x.x, x.y, hi, lo);
        *reinterpret_cast<unsigned*>(qh + r * QP + c) = hi;
        *reinterpret_cast<unsigned*>(ql + r * QP + c) = lo;
    }
}

// Channels c .. c + 7 of tile token t into the transposed value buffers [D][kFlashVPitch]: hi (and
// lo where kValLo) as four fp16 pairs each (a warp's lanes taking 32 tokens of one chunk write
// distinct banks).
template <bool kValLo>
__device__ __forceinline__ void flash_put_values8(__half* vh, __half* vl, int c, int t, const unsigned (&hi)[4],
                                                  const unsigned (&lo)[4]) {
    auto* h16 = reinterpret_cast<uint16_t*>(vh);
    auto* l16 = reinterpret_cast<uint16_t*>(vl);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        h16[(c + e) * kFlashVPitch + t] = uint16_t(hi[e / 2] >> (16 * (e & 1)));
        if constexpr (kValLo) l16[(c + e) * kFlashVPitch + t] = uint16_t(lo[e / 2] >> (16 * (e & 1)));
    }
}

// Unscaled scores of rows ra, rb against the staged tile's 4 n-tiles of 8 tokens: s[nt][j] for
// token 8 nt + 2 tig + (j & 1), row ra (j < 2) or rb. kKeyLo: the keys have lo halves (kl).
template <int D, bool kKeyLo>
__device__ __forceinline__ void flash_scores(const __half* qh, const __half* ql, const __half* kh, const __half* kl, int ra,
                                             int rb, int gid, int tig, float (&s)[4][4]) {
    constexpr int QP = flash_qpitch(D);
    float sx[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int j = 0; j < 4; ++j) s[nt][j] = sx[nt][j] = 0.0f;
    }
    const auto ld = [](const __half* a) { return *reinterpret_cast<const unsigned*>(a); };
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const int c = 16 * kk + 2 * tig;
        const unsigned ah[4] = {ld(qh + ra * QP + c), ld(qh + rb * QP + c), ld(qh + ra * QP + c + 8), ld(qh + rb * QP + c + 8)};
        const unsigned al[4] = {ld(ql + ra * QP + c), ld(ql + rb * QP + c), ld(ql + ra * QP + c + 8), ld(ql + rb * QP + c + 8)};
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
            const int tk = (8 * nt + gid) * QP + c;
            const unsigned bh0 = ld(kh + tk), bh1 = ld(kh + tk + 8);
            mma_f16(s[nt], ah[0], ah[1], ah[2], ah[3], bh0, bh1);
            if constexpr (kKeyLo) mma_f16(sx[nt], ah[0], ah[1], ah[2], ah[3], ld(kl + tk), ld(kl + tk + 8));
            mma_f16(sx[nt], al[0], al[1], al[2], al[3], bh0, bh1);
        }
    }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int j = 0; j < 4; ++j) s[nt][j] += sx[nt][j] * kLoInv;
    }
}

// The tile (tokens t0 ..) into rows ra / rb's state: scores s (unscaled) times `scale` where a row
// sees the token (vis_a, vis_b: tokens rows ra, rb see), the online softmax, then P V against the
// staged values vh (and vl where kValLo) [D][kFlashVPitch].
template <int D, bool kValLo>
__device__ __forceinline__ void flash_softmax_pv(const float (&s)[4][4], float scale, int64_t t0, int64_t vis_a, int64_t vis_b,
                                                 const __half* vh, const __half* vl, int gid, int tig, FlashRows<D>& st) {
    constexpr int VP = kFlashVPitch;
    float pr[4][4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int64_t vis = half ? vis_b : vis_a;
        float x[4][2], mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int64_t tok = t0 + 8 * nt + 2 * tig + u;
                x[nt][u] = tok < vis ? s[nt][2 * half + u] * scale : -INFINITY;
                mx = fmaxf(mx, x[nt][u]);
            }
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(st.m[half], mx);
        const float corr = mn == -INFINITY ? 1.0f : expf(st.m[half] - mn);
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const float e = x[nt][u] == -INFINITY ? 0.0f : expf(x[nt][u] - mn);
                pr[nt][2 * half + u] = e;
                sum += e;
            }
        }
        st.l[half] = st.l[half] * corr + sum;  // this lane's part of the row's sum (added across tig at the end)
        st.m[half] = mn;
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
            st.o[nt][2 * half] *= corr;
            st.o[nt][2 * half + 1] *= corr;
        }
    }
    // Two 16-token k-steps; P's A fragments are the score fragments of n-tiles 2 ks, 2 ks + 1.
    const unsigned two11 = 0x68006800u;  // fp16 2048 in both halves
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
        unsigned ph[4], pl[4], p11[4];
        split_pair(pr[2 * ks][0], pr[2 * ks][1], ph[0], pl[0]);
        split_pair(pr[2 * ks][2], pr[2 * ks][3], ph[1], pl[1]);
        split_pair(pr[2 * ks + 1][0], pr[2 * ks + 1][1], ph[2], pl[2]);
        split_pair(pr[2 * ks + 1][2], pr[2 * ks + 1][3], ph[3], pl[3]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const __half2 x = __hmul2(*reinterpret_cast<const __half2*>(&ph[j]), *reinterpret_cast<const __half2*>(&two11));
            p11[j] = *reinterpret_cast<const unsigned*>(&x);
        }
        const int tk = 16 * ks + 2 * tig;
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
            const int vr = (8 * nt + gid) * VP + tk;
            const unsigned bh0 = *reinterpret_cast<const unsigned*>(vh + vr), bh1 = *reinterpret_cast<const unsigned*>(vh + vr + 8);
            mma_f16(st.o[nt], p11[0], p11[1], p11[2], p11[3], bh0, bh1);
            if constexpr (kValLo) {
                const unsigned bl0 = *reinterpret_cast<const unsigned*>(vl + vr), bl1 = *reinterpret_cast<const unsigned*>(vl + vr + 8);
                mma_f16(st.o[nt], ph[0], ph[1], ph[2], ph[3], bl0, bl1);
            }
            mma_f16(st.o[nt], pl[0], pl[1], pl[2], pl[3], bh0, bh1);
        }
    }
}

// out = o / (2^11 l) times out_scale for rows ra, rb (as flash_load_q reads q; padding rows skipped).
template <int D>
__device__ __forceinline__ void flash_store(const FlashRows<D>& st, float* out, int64_t n_q, int64_t n_head, int gqa, int64_t i0,
                                            int64_t g, int ra, int rb, int tig, float out_scale) {
    const int qb = kFlashRows / gqa;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        float sum = st.l[half];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int r = half ? rb : ra;
        const int64_t i = i0 + r / gqa;
        if (r >= qb * gqa || i >= n_q) continue;
        const float inv = sum > 0.0f ? kLoInv / sum * out_scale : 0.0f;
        float* dst = out + (i * n_head + g * gqa + r % gqa) * D;
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
            *reinterpret_cast<float2*>(dst + 8 * nt + 2 * tig) = make_float2(st.o[nt][2 * half] * inv, st.o[nt][2 * half + 1] * inv);
        }
    }
}
#endif

}  // namespace vxq::cuda

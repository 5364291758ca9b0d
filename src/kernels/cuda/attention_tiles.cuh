// The tensor-core decode attention's arithmetic on one 16-token tile, shared by the stream form
// (attention_stream_mma: tiles loaded from global memory into registers) and the bulk-copy kernel
// (attention_stream_tma_kernel: tiles in a shared-memory ring), both in attention.cu. Header-only
// and free of inline PTX but for the MMAs (mma.cuh), so the SIMT emulator (tests/support/simt.h)
// runs the same source: tests/test_attention_tiles_simt.cpp checks every format's tile against a
// scalar reference on the CPU, where CI runs it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cuda_fp16.h>

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/kv_codes.cuh"
#include "kernels/cuda/mma.cuh"

namespace vxq::cuda {

constexpr int kStreamMmaTile = 16;  // tokens a tile
constexpr float kPScale = 32768.0f, kPScaleInv = 1.0f / 32768.0f;

// Eight values of a page row as loaded (f16: 16 bytes, fp8: 8 bytes).
template <KvCode C>
using Raw8 = std::conditional_t<C == KvCode::F16, uint4, uint2>;
// The same 8 values as four fp16 pairs (fp8: converted exactly).
template <KvCode C>
__device__ __forceinline__ uint4 half8(const Raw8<C>& w) {
    if constexpr (C == KvCode::F16) {
        return w;
    } else {
        return kv_fp8x8_to_half8(w.x, w.y);
    }
}


// The tensor-core stream forms' arithmetic on one 16-token tile (attention_stream_mma from registers
// loaded out of global memory, attention_stream_tma from its shared-memory ring). A lane holds keys of
// tokens gid and 8 + gid (kw[n][c]: dims 32 c + 8 tig .. + 7) and values of tokens 2 tig, 2 tig + 1,
// 2 tig + 8, 2 tig + 9 (vw[i][h]: dims 64 h + 8 gid .. + 7); past the tile's len tokens, any bytes
// (scores masked, values zeroed). qfrag(s): q's A fragments of k-step s (rows gid < REP q hi, rows
// gid + 8 its lo; k-step 2c + h takes the dims 32c + 8 tig + 4h + {0, 1} and + {2, 3}).
template <int HD>
struct MmaTileState {
    float m_run = -INFINITY, l_run = 0.0f;
    float acc[HD / 8][4] = {};  // n-tile 8 h + x: dims 64 h + 8 n + x (rows gid: P hi, gid + 8: P lo)
};

// Scores of the tile: sc[n][i] for token 8 n + 2 tig + i of head gid (-inf past len). Four
// accumulator chains (n-tile x k-step parity), so the MMAs of a k-step pair do not wait on each other.
template <KvCode KC, int HD, typename QFrag>
__device__ __forceinline__ void mma_tile_scores(QFrag qfrag, const Raw8<KC> (&kw)[2][HD / 32], int len, float score_scale,
                                                float (&sc)[2][2]) {
    const int tig = threadIdx.x & 3;
    float ca[2][2][4] = {};
#pragma unroll
    for (int c = 0; c < HD / 32; ++c) {
        const uint4 a0 = qfrag(2 * c), a1 = qfrag(2 * c + 1);
#pragma unroll
        for (int n = 0; n < 2; ++n) {
            const uint4 w = half8<KC>(kw[n][c]);
            mma_f16(ca[n][0], a0.x, a0.y, a0.z, a0.w, w.x, w.y);
            mma_f16(ca[n][1], a1.x, a1.y, a1.z, a1.w, w.z, w.w);
        }
    }
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {  // c0, c1: q hi's part, c2, c3: q lo's
            const float hi = ca[n][0][i] + ca[n][1][i], lo = ca[n][0][i + 2] + ca[n][1][i + 2];
            sc[n][i] = 8 * n + 2 * tig + i < len ? (hi + lo * kLoInv) * score_scale : -INFINITY;
        }
    }
}

// The online softmax of head gid over the tile's scores (its row's four lanes): the running max and
// sum, the accumulators rescaled only when a row's maximum moved (any lane's factor below 1:
// multiplying by 1 changes no bit), and the tile's exponentials e[n][i] (token 8 n + 2 tig + i; 0
// past len) for O += P V. The exponentials by __expf (ex2.approx of x log2 e: two instructions
// where expf takes ~11, the tile's softmax a tenth of its instructions): within 2 + 1.2 |x| ulp,
// so ~1e-7 relative where p is near 1 and ~2e-6 at x = -20, where p is 2e-9 of the largest.
template <int HD>
__device__ __forceinline__ void mma_tile_softmax(const float (&sc)[2][2], MmaTileState<HD>& st, float (&e)[2][2]) {
    float mx = fmaxf(fmaxf(sc[0][0], sc[0][1]), fmaxf(sc[1][0], sc[1][1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(st.m_run, mx);  // len >= 1: finite
    const float f = __expf(st.m_run - m_new);  // 0 while m_run is -inf
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            e[n][i] = __expf(sc[n][i] - m_new);  // masked: exp(-inf) = 0
            sum += e[n][i];
        }
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    st.l_run = st.l_run * f + sum;
    st.m_run = m_new;
    if (__any_sync(0xffffffffu, f != 1.0f)) {
#pragma unroll
        for (int v = 0; v < HD / 8; ++v) {
#pragma unroll
            for (int i = 0; i < 4; ++i) st.acc[v][i] *= f;
        }
    }
}

// The online softmax (mma_tile_softmax) and O += P V: P x 2^15 split hi / lo as the A fragments
// (rows gid / gid + 8), a lane's B fragments two tokens' values at one dim (a PRMT of two of its loads).
template <KvCode VC, int HD>
__device__ __forceinline__ void mma_tile_values(const float (&sc)[2][2], const Raw8<VC> (&vw)[4][HD / 64], int len,
                                                MmaTileState<HD>& st) {
    const int tig = threadIdx.x & 3;
    float e[2][2];
    mma_tile_softmax<HD>(sc, st, e);
    unsigned ph0, pl0, ph2, pl2;  // P's A fragments (tokens 2 tig, + 1 and 2 tig + 8, + 9; hi rows gid, lo rows gid + 8)
    split_pair(e[0][0] * kPScale, e[0][1] * kPScale, ph0, pl0, 1.0f);
    split_pair(e[1][0] * kPScale, e[1][1] * kPScale, ph2, pl2, 1.0f);
#pragma unroll
    for (int h = 0; h < HD / 64; ++h) {
        uint4 v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            v[i] = 2 * tig + (i & 1) + 8 * (i >> 1) < len ? half8<VC>(vw[i][h]) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int x = 0; x < 8; ++x) {
            const unsigned sel = x % 2 ? 0x7632u : 0x5410u;  // the high or the low fp16 of both words
            const unsigned b0 = __byte_perm(at4(v[0], x / 2), at4(v[1], x / 2), sel);
            const unsigned b1 = __byte_perm(at4(v[2], x / 2), at4(v[3], x / 2), sel);
            mma_f16(st.acc[8 * h + x], ph0, pl0, ph2, pl2, b0, b1);  // rows gid: P hi, rows gid + 8: P lo
        }
    }
}

// ---- the same tile arithmetic for q8_0 / q4_0 pages (the bulk-copy kernel's block formats) ------
// A 16-token tile's rows in shared memory (row t at t * kv_token_bytes; tokens past len are the
// last real token's row, so every scale read is a real fp16 number).
//   scores  int8 MMAs (m16n8k32), one per 32-block and n-tile: A = the query's q8_0 codes (rows
//           gid < REP: head gid; rows gid + 8: zero), B = the keys' codes of token 8 n + gid (a
//           lane's word at block byte 4 tig holds the dims 4 tig .. + 3 and, q4_0, their nibbles
//           16 + 4 tig .. + 3: the fragment's two registers; q4_0 codes centred by __vsub4), the
//           exact int32 block dot times d_k d_q added in f32 per block, in block order: the stream
//           form's products and order;
//   values  O += (P d_v) codes: per 32-block b the A fragments are P times each token's d_v split
//           hi / lo (rows gid / gid + 8, lo = (x - hi) 2^11: no 2^15 as the f16 form's P, which d_v up
//           to 65504 would overflow; where hi is subnormal lo keeps the rest, so the pair holds x
//           within ~2^-36 absolute), and B the codes as exact fp16
//           numbers (a byte under 0x64 is 1024 + byte, less 1024 + 8 (q4_0) or 1024 + 128 (q8_0,
//           the code's sign bit flipped) by one HSUB2). A lane reads its two tokens' (2 tig, + 1 and
//           + 8, + 9) bytes 2 gid, 2 gid + 1 (q4_0: four dims, the nibbles) or 4 gid .. + 3 (q8_0) of
//           each block, so n-tile 4 b + x, column c holds dim qv_dim(VC, 4 b + x, c), undone when
//           the partial is written.
template <KvCode VC>
__host__ __device__ constexpr int qv_dim(int nt, int c) {
    const int b = nt / 4, x = nt % 4;
    return VC == KvCode::Q8_0 ? 32 * b + 4 * c + x : 32 * b + 2 * c + (x & 1) + 16 * (x >> 1);
}
// Dims of the f16 / fp8 form's n-tile 8 h + x, column c.
__host__ __device__ constexpr int hv_dim(int nt, int c) { return 64 * (nt / 8) + 8 * c + nt % 8; }

// A 32-bit word at p (2-byte aligned; `aligned`: known 4-byte aligned, one load).
__device__ __forceinline__ unsigned u32_at(const uint8_t* p, bool aligned) {
    return aligned ? *reinterpret_cast<const unsigned*>(p) : u32_at2(p);
}

// An int32 accumulator that starts at kAccBias holds 12582912 + c in its f32 bits while |c| < 2^22
// (1.5 x 2^23: the exponent stays, the mantissa is 2^22 + c), so one FADD gives float(c) exactly
// where a conversion instruction (I2F, a quarter-rate pipe) would; a block's dot is at most
// 32 x 127 x 127 in magnitude.
constexpr int kAccBias = 0x4B400000;
constexpr float kAccBiasValue = 12582912.0f;

// The query for block-format keys: per 32-block b the int8 MMA's A registers of this lane (rows gid:
// codes of head gid at dims 32 b + 4 tig .. + 3 and + 16; rows gid + 8 are zero), head gid's scale
// and the accumulator's start for its row: kAccBias, less 8 times the sum of the block's query
// codes for q4_0 keys, whose codes then enter the MMA as they are stored (0..15) where the dot
// wants code - 8 (sum_j q_j (k_j - 8) = sum_j q_j k_j - 8 sum_j q_j, all exact in int32).
template <int HD>
struct QBlockFrag {
    unsigned a[HD / 32][2];
    float d[HD / 32];
    int acc0[HD / 32];
};
// From the group's q rows quantized to q8_0 (qc [REP][HD] codes, qd [REP][HD / 32] scales, shared
// memory), for keys in format KC. Every lane of the warp calls (shuffles).
template <int REP, KvCode KC, int HD>
__device__ __forceinline__ QBlockFrag<HD> q_block_frag(const int8_t* qc, const float* qd) {
    const int lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
    QBlockFrag<HD> f;
#pragma unroll
    for (int b = 0; b < HD / 32; ++b) {
        const bool real = gid < REP;
        f.a[b][0] = real ? *reinterpret_cast<const unsigned*>(qc + gid * HD + 32 * b + 4 * tig) : 0u;
        f.a[b][1] = real ? *reinterpret_cast<const unsigned*>(qc + gid * HD + 32 * b + 16 + 4 * tig) : 0u;
        f.d[b] = real ? qd[gid * (HD / 32) + b] : 0.0f;
        int sum = __dp4a(int(f.a[b][0]), 0x01010101, __dp4a(int(f.a[b][1]), 0x01010101, 0));  // this lane's 8 codes
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);  // the row's 32
        f.acc0[b] = KC == KvCode::Q4_0 ? kAccBias - 8 * sum : kAccBias;
    }
    return f;
}

// Scores of a tile of q8_0 / q4_0 keys (ku: its rows): sc[n][i] for token 8 n + 2 tig + i of head gid (-inf past len).
template <KvCode KC, int HD>
__device__ __forceinline__ void mma_tile_scores_q(const QBlockFrag<HD>& qf, const uint8_t* ku, int len, float score_scale,
                                                  float (&sc)[2][2]) {
    constexpr int bb = KC == KvCode::Q8_0 ? kKvQ8BlockBytes : kKvQ4BlockBytes, ktb = HD / 32 * bb;
    const int lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
        const uint8_t* kb = ku + min(8 * n + gid, len - 1) * ktb;  // B: token 8 n + gid
        const uint8_t* k0 = ku + min(8 * n + 2 * tig, len - 1) * ktb;
        const uint8_t* k1 = ku + min(8 * n + 2 * tig + 1, len - 1) * ktb;
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int b = 0; b < HD / 32; ++b) {
            const uint8_t* codes = kb + b * bb + 2;
            const bool aligned = (b * bb + 2) % 4 == 0;  // rows are 4-byte multiples apart
            unsigned b0, b1;
            if constexpr (KC == KvCode::Q8_0) {
                b0 = u32_at(codes + 4 * tig, aligned);
                b1 = u32_at(codes + 16 + 4 * tig, aligned);
            } else {  // the codes as stored, 0..15 (the accumulator's start takes the 8 off)
                const unsigned w = u32_at(codes + 4 * tig, aligned);
                b0 = w & 0x0f0f0f0fu;
                b1 = (w >> 4) & 0x0f0f0f0fu;
            }
            int c[4] = {qf.acc0[b], qf.acc0[b], 0, 0};  // rows gid + 8 are zero: c2, c3 unused
            mma_s8(c, make_uint4(qf.a[b][0], 0u, qf.a[b][1], 0u), b0, b1);
            s0 += (__int_as_float(c[0]) - kAccBiasValue) * (kv_half_at(k0 + b * bb) * qf.d[b]);
            s1 += (__int_as_float(c[1]) - kAccBiasValue) * (kv_half_at(k1 + b * bb) * qf.d[b]);
        }
        sc[n][0] = 8 * n + 2 * tig < len ? s0 * score_scale : -INFINITY;
        sc[n][1] = 8 * n + 2 * tig + 1 < len ? s1 * score_scale : -INFINITY;
    }
}

// Two tokens' codes at one dim as the fp16 pair of the B fragment: bytes (lo, hi) of `pair` are the
// two tokens' code bytes (q4_0: a nibble each, q8_0: the code with its sign bit flipped); `bias` is
// 1024 + the codes' offset (8 or 128).
__device__ __forceinline__ unsigned codes_half2(unsigned pair_bytes, unsigned sel, __half2 bias) {
    const unsigned h = __byte_perm(pair_bytes, 0x64646464u, sel);  // 0x64XX = 1024 + XX
    __half2 x;
    memcpy(static_cast<void*>(&x), &h, sizeof x);  // (register moves on the device; no type punning for the emulator's host compiler)
    const __half2 r = __hsub2(x, bias);
    unsigned u;
    memcpy(&u, &r, sizeof u);
    return u;
}

// The online softmax and O += P V for a tile of q8_0 / q4_0 values (vu: its rows; above).
template <KvCode VC, int HD>
__device__ __forceinline__ void mma_tile_values_q(const float (&sc)[2][2], const uint8_t* vu, int len, MmaTileState<HD>& st) {
    constexpr int bb = VC == KvCode::Q8_0 ? kKvQ8BlockBytes : kKvQ4BlockBytes, vtb = HD / 32 * bb;
    const int lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
    float e[2][2];
    mma_tile_softmax<HD>(sc, st, e);
    int rows[4];  // offsets of tokens 2 tig, 2 tig + 1, 2 tig + 8, 2 tig + 9 (past len: the last token; its p is 0)
#pragma unroll
    for (int i = 0; i < 4; ++i) rows[i] = min(2 * tig + (i & 1) + 8 * (i >> 1), len - 1) * vtb;
    const __half2 bias = __float2half2_rn(VC == KvCode::Q8_0 ? 1152.0f : 1032.0f);
#pragma unroll
    for (int b = 0; b < HD / 32; ++b) {
        unsigned ph0, pl0, ph2, pl2;
        split_pair(e[0][0] * kv_half_at(vu + rows[0] + b * bb), e[0][1] * kv_half_at(vu + rows[1] + b * bb), ph0, pl0);
        split_pair(e[1][0] * kv_half_at(vu + rows[2] + b * bb), e[1][1] * kv_half_at(vu + rows[3] + b * bb), ph2, pl2);
        unsigned bf[4][2];  // [x][token pair]
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const uint8_t* ra = vu + rows[2 * k] + b * bb + 2;
            const uint8_t* rb = vu + rows[2 * k + 1] + b * bb + 2;
            if constexpr (VC == KvCode::Q8_0) {
                const bool aligned = (b * bb + 2) % 4 == 0;
                const unsigned wa = u32_at(ra + 4 * gid, aligned), wb = u32_at(rb + 4 * gid, aligned);
                const unsigned lo = __byte_perm(wa, wb, 0x5140u) ^ 0x80808080u;  // a0 b0 a1 b1
                const unsigned hi = __byte_perm(wa, wb, 0x7362u) ^ 0x80808080u;  // a2 b2 a3 b3
                bf[0][k] = codes_half2(lo, 0x4140u, bias);
                bf[1][k] = codes_half2(lo, 0x4342u, bias);
                bf[2][k] = codes_half2(hi, 0x4140u, bias);
                bf[3][k] = codes_half2(hi, 0x4342u, bias);
            } else {
                const unsigned w = __byte_perm(u16_at(ra + 2 * gid), u16_at(rb + 2 * gid), 0x5140u);  // a0 b0 a1 b1
                const unsigned lo = w & 0x0f0f0f0fu, hi = (w >> 4) & 0x0f0f0f0fu;
                bf[0][k] = codes_half2(lo, 0x4140u, bias);  // dim 2 gid
                bf[1][k] = codes_half2(lo, 0x4342u, bias);  // dim 2 gid + 1
                bf[2][k] = codes_half2(hi, 0x4140u, bias);  // dim 16 + 2 gid
                bf[3][k] = codes_half2(hi, 0x4342u, bias);  // dim 17 + 2 gid
            }
        }
#pragma unroll
        for (int x = 0; x < 4; ++x) mma_f16(st.acc[4 * b + x], ph0, pl0, ph2, pl2, bf[x][0], bf[x][1]);
    }
}

// q's A fragment of k-step s for this lane from the group's REP q rows (shared memory, hd floats apart).
template <int REP, int HD>
__device__ __forceinline__ uint4 mma_q_fragment(const float* q, int s) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const float4 x = g < REP ? *reinterpret_cast<const float4*>(q + g * HD + 32 * (s / 2) + 8 * t + 4 * (s % 2))
                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    uint4 a;
    split_pair(x.x, x.y, a.x, a.y);
    split_pair(x.z, x.w, a.z, a.w);
    return a;
}

}  // namespace vxq::cuda

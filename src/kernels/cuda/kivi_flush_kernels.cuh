// The flush of a large KIVI write in the default layout (keys and values in groups of 32, 2 or 4
// bits, head_dim D 64 or 128): every group the plan encodes, read from the fp16 window ring
// (pending tokens) or from the f32 rows of the write (rounded to fp16 as the window holds them),
// quantized in registers and stored, bit-exact with kivi::quantize_group (kv/codecs/kivi.cpp).
// Apart from kivi.cu (which launches it, then the window kernel) so that a test runs it on the
// CPU (tests/support/simt.h; tests/test_kivi_flush_simt.cpp).
//
// Blocks (chunk of 32 write-local tokens, quarter of the chunk's groups, KV head, role), 128
// threads; a group of 32 values is taken by 4 adjacent lanes, 8 values each. Keys: lane (channel,
// part) loads tokens 8 part .. + 7 of its channel (a warp's load of a token: 8 adjacent channels,
// one 32-byte sector); values: lane (token, row of 32 channels, part) loads channels 4 part .. + 3
// and 16 + 4 part .. + 3 of the row (each of its two 16-byte loads of x, or 8-byte loads of the
// ring, is one contiguous run with its 3 neighbours': whole sectors).
//
// Per group, as the CPU's loop leaves it: the first minimum and maximum in order, NaN if any
// value is one. The minimum and maximum values do not depend on the order; only a zero's sign
// does: a group whose minimum is 0 stores the first zero's sign in its zero (its maximum's sign
// never reaches a byte: mx - mn is the same either way, and +0 where both are zeros). So the range
// is taken by fp16 min / max (NaN-propagating: a NaN group stores NaN zero and scale, codes 0)
// over the lane's values and its 3 neighbours', and only a group whose minimum is 0 looks for its
// first zero (a min over the places of the lanes' first zeros). Each code from two fused
// multiply-adds (kivi_code.h, kivi_code_fma), the division where that lands near a half-integer.
// The earlier form (a sequential loop over each lane's 8 values, then the lanes' first minimum
// and maximum in order by shuffles, and ~20 instructions a code) issued 6.2 M warp instructions
// for the flush of 2048 tokens x 8 heads (Nsight Compute on the H100, docs/gpu.md, 2026-12-06):
// about as long as the transfer at full issue rate. This one: 4.1 M, 32 registers (was 40), 12.2 ->
// 10.2 us (the window kernel's launch included; 8.2 us without it, kivi_store_bounds).
#pragma once

#include <cstdint>
#include <cstring>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/kivi.cuh"
#include "kernels/cuda/kivi_code.h"
#include "kernels/cuda/kv_codes.cuh"
#include "kernels/cuda/launch.cuh"

namespace vxq::cuda {

constexpr int kFlushThreads = 128;
constexpr int kFlushGroup = 32, kFlushParts = 4, kFlushPer = kFlushGroup / kFlushParts;
// Blocks per chunk and role: 4 lanes per group of 32, D groups of keys or 32 tokens x D / 32 rows of values.
template <int D>
constexpr int kFlushQuarters = kFlushParts * D / kFlushThreads;

// Write-local token i's slot in stream w's window (i < w.pending) or -1 (a row of x).
__device__ __forceinline__ int kivi_flush_slot(const KvWindowWrite& w, int i) {
    if (i >= int(w.pending)) return -1;
    const int slot = int(w.head) + i;
    return slot >= int(w.slots) ? slot - int(w.slots) : slot;
}

__device__ __forceinline__ unsigned kivi_h2_bits(__half2 h) {
    unsigned u;
    memcpy(&u, &h, sizeof u);
    return u;
}
__device__ __forceinline__ __half2 kivi_h2(unsigned u) {
    return __halves2half2(__ushort_as_half(uint16_t(u)), __ushort_as_half(uint16_t(u >> 16)));
}

// kKiviRoundBiasBits << BITS j summed over a lane's 8 codes (mod 2^32): what the packed sum of
// the codes' biased bits has over the codes.
template <int BITS>
__host__ __device__ constexpr unsigned kivi_packed_bias() {
    unsigned s = 0;
    for (int j = 0; j < kFlushPer; ++j) s += kKiviRoundBiasBits << (BITS * j);
    return s;
}

// A lane's 8 values of a group (h: 4 fp16 pairs, value j in h[j / 2]; pos(j): its place in the
// group), quantized: the group's zero and scale (fp16 bits) and this lane's codes, code j at bits
// BITS j. All 32 lanes of the warp call (shuffles); `mine`: whether this lane's group is stored.
struct KiviFlushCodes {
    uint16_t z16, s16;
    unsigned word;
};
template <int BITS, class Pos>
__device__ __forceinline__ KiviFlushCodes kivi_flush_quantize(const __half2 (&h)[kFlushPer / 2], bool mine, Pos pos) {
    constexpr float qmax = float((1 << BITS) - 1);
    __half2 lo = h[0], hi = h[0];
#pragma unroll
    for (int k = 1; k < kFlushPer / 2; ++k) lo = __hmin2_nan(lo, h[k]), hi = __hmax2_nan(hi, h[k]);
    __half2 r = __halves2half2(__hmin_nan(__low2half(lo), __high2half(lo)), __hmax_nan(__low2half(hi), __high2half(hi)));
#pragma unroll
    for (int o = 1; o < kFlushParts; o <<= 1) {  // the group's 4 lanes (lane % 4 = part)
        const __half2 other = kivi_h2(__shfl_xor_sync(0xffffffffu, kivi_h2_bits(r), o));
        r = __halves2half2(__hmin_nan(__low2half(r), __low2half(other)), __hmax_nan(__high2half(r), __high2half(other)));
    }
    const float mn = __low2float(r), mx = __high2float(r);
    const bool nan = mx != mx;
    float v[kFlushPer];
#pragma unroll
    for (int k = 0; k < kFlushPer / 2; ++k) v[2 * k] = __low2float(h[k]), v[2 * k + 1] = __high2float(h[k]);
    uint16_t z16 = uint16_t(kivi_h2_bits(r));
    if (__any_sync(0xffffffffu, mine && mn == 0.0f)) {  // the first zero's sign: 2 place + sign, least over the group
        unsigned first = 2u * kFlushGroup;
#pragma unroll
        for (int j = kFlushPer - 1; j >= 0; --j) {
            if (v[j] == 0.0f) first = 2u * unsigned(pos(j)) + (__float_as_uint(v[j]) >> 31);
        }
#pragma unroll
        for (int o = 1; o < kFlushParts; o <<= 1) {
            const unsigned other = __shfl_xor_sync(0xffffffffu, first, o);
            first = other < first ? other : first;
        }
        if (mn == 0.0f) z16 = uint16_t((first & 1u) << 15);
    }
    const float d = __fadd_rn(__fsub_rn(mx, mn), 0.0f);  // (+0 for a group of zeros, as mx - mn of one element)
    const uint16_t s16 = kv_half_bits(__fdiv_rn(d, qmax));
    KiviFlushCodes out{nan ? uint16_t(0x7e00) : z16, nan ? uint16_t(0x7e00) : s16, 0u};
    const float z = __half2float(__ushort_as_half(out.z16)), s = __half2float(__ushort_as_half(out.s16));
    if (!(s > 0.0f)) return out;  // every code 0 (a constant group, NaN)
    const float inv_s = __frcp_rn(s);
    bool tie = false;
    unsigned word = 0;
#pragma unroll
    for (int j = kFlushPer - 1; j >= 0; --j) {
        const KiviFmaCode c = kivi_code_fma(__fsub_rn(v[j], z), inv_s);
        tie |= c.near_tie;
        const unsigned most = kKiviRoundBiasBits + unsigned(qmax);
        word = (word << BITS) + (c.biased_bits < most ? c.biased_bits : most);
    }
    out.word = word - kivi_packed_bias<BITS>();
    if (tie) {  // near a half-integer (rare) or an infinite value: each code by the division
        out.word = 0;
#pragma unroll
        for (int j = 0; j < kFlushPer; ++j) out.word |= kivi_code(v[j], z, s, qmax) << (BITS * j);
    }
    return out;
}

template <int D, int KB, int VB>
__global__ void __launch_bounds__(kFlushThreads) kivi_flush_kernel(KiviStoreParams p) {
    pdl_wait();
    // (No early pdl_launch_dependents: with one here and in the window kernel the 2048-token flush
    // measured 2 % slower on the H100, 2026-12-06, the window kernel's blocks likely taking slots
    // in this grid's last wave.)
    constexpr int G = kFlushGroup, Q = kFlushQuarters<D>;
    const int g = blockIdx.y, role = blockIdx.z, i0 = int(blockIdx.x / Q) * G;
    const int e = int(blockIdx.x % Q) * kFlushThreads + threadIdx.x, part = e % kFlushParts;
    const KvWindowWrite w = p.plan[role];
    const int cnt = min(G, int(w.encoded) - i0);
    if (cnt <= 0) return;  // the whole block
    const KiviHeadDev hd = p.heads[g];
    const int64_t stride = p.n_head_kv * D;
    const float* x = (role ? p.v : p.k) + int64_t(g) * D;
    const auto* ring = reinterpret_cast<const __half*>(role ? hd.vw : hd.kw);
    __half2 h[kFlushPer / 2];
    if (role == 0) {  // cnt == G: keys are encoded in whole blocks
        const int c = e / kFlushParts, t0 = i0 + part * kFlushPer;
        if (t0 >= int(w.pending)) {  // all 8 from x (a prefill's write: no pending window tokens)
            const float* src = x + int64_t(t0 - int(w.pending)) * stride + c;
            float f[kFlushPer];
#pragma unroll
            for (int j = 0; j < kFlushPer; ++j) f[j] = src[j * stride];
#pragma unroll
            for (int k = 0; k < kFlushPer / 2; ++k) h[k] = __floats2half2_rn(f[2 * k], f[2 * k + 1]);
        } else {
            __half f[kFlushPer];
#pragma unroll
            for (int j = 0; j < kFlushPer; ++j) {
                const int t = t0 + j, slot = kivi_flush_slot(w, t);
                f[j] = slot >= 0 ? ring[int64_t(slot) * D + c] : __float2half_rn(x[int64_t(t - int(w.pending)) * stride + c]);
            }
#pragma unroll
            for (int k = 0; k < kFlushPer / 2; ++k) h[k] = __halves2half2(f[2 * k], f[2 * k + 1]);
        }
        const KiviFlushCodes q = kivi_flush_quantize<KB>(h, true, [&](int j) { return part * kFlushPer + j; });
        uint8_t* blk = reinterpret_cast<uint8_t*>(hd.k) + (w.packed / G + i0 / G) * int64_t(D * (4 + G * KB / 8));
        if (part == 0) {
            reinterpret_cast<uint16_t*>(blk)[c] = q.z16;
            reinterpret_cast<uint16_t*>(blk + 2 * D)[c] = q.s16;
        }
        uint8_t* codes = blk + 4 * D + c * (G * KB / 8);
        if constexpr (KB == 2) {
            reinterpret_cast<uint16_t*>(codes)[part] = uint16_t(q.word);
        } else {
            reinterpret_cast<unsigned*>(codes)[part] = q.word;
        }
        return;
    }
    constexpr int R = D / G, RB = G * VB / 8, TB = R * (4 + RB);  // value rows, bytes a row's codes, a token's block
    const int t = e / (kFlushParts * R), r = e / kFlushParts - t * R;
    const bool mine = t < cnt;  // the 4 lanes of a row alike
    const int slot = mine ? kivi_flush_slot(w, i0 + t) : -1;
    const int c0 = r * G + part * 4;  // and c0 + 16
    if (!mine) {
#pragma unroll
        for (int k = 0; k < kFlushPer / 2; ++k) h[k] = __floats2half2_rn(0.0f, 0.0f);
    } else if (slot >= 0) {
        const auto* src = reinterpret_cast<const uint2*>(ring + int64_t(slot) * D + c0);  // 8-byte aligned
        const uint2 a = src[0], b = src[4];
        h[0] = kivi_h2(a.x), h[1] = kivi_h2(a.y), h[2] = kivi_h2(b.x), h[3] = kivi_h2(b.y);
    } else {
        const auto* src = reinterpret_cast<const float4*>(x + int64_t(i0 + t - int(w.pending)) * stride + c0);
        const float4 a = src[0], b = src[4];
        h[0] = __floats2half2_rn(a.x, a.y), h[1] = __floats2half2_rn(a.z, a.w);
        h[2] = __floats2half2_rn(b.x, b.y), h[3] = __floats2half2_rn(b.z, b.w);
    }
    const KiviFlushCodes q = kivi_flush_quantize<VB>(h, mine, [&](int j) { return (j < 4 ? 0 : 16 - 4) + part * 4 + j; });
    if (!mine) return;
    uint8_t* blk = reinterpret_cast<uint8_t*>(hd.v) + (w.packed + i0 + t) * int64_t(TB);
    if (part == 0) {
        reinterpret_cast<uint16_t*>(blk)[r] = q.z16;
        reinterpret_cast<uint16_t*>(blk + 2 * R)[r] = q.s16;
    }
    uint8_t* codes = blk + 4 * R + r * RB;  // codes 4 part .. + 3 (the word's low half), 16 + 4 part .. + 3
    if constexpr (VB == 2) {
        codes[part] = uint8_t(q.word);
        codes[4 + part] = uint8_t(q.word >> 8);
    } else {
        reinterpret_cast<uint16_t*>(codes)[part] = uint16_t(q.word);
        reinterpret_cast<uint16_t*>(codes)[4 + part] = uint16_t(q.word >> 16);
    }
}

}  // namespace vxq::cuda

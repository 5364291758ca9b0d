// KIVI's group quantizer on the device: kivi::quantize_group and pack_row's bytes (kivi.h), by one
// thread or by a warp. The store (kivi.cu) encodes with it, and the decode attention
// (kivi_attention_kernels.cuh) encodes a value token ahead with it where it merges inside.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/kivi.cuh"
#include "kernels/cuda/kivi_code.h"
#include "kernels/cuda/kv_codes.cuh"

#if defined(__CUDACC__) || defined(VXQ_SIMT)
namespace vxq::cuda {

// A group's zero and scale (fp16 bits) from its first minimum and maximum (kivi::quantize_group).
// A NaN group stores the CPU's fp16 of quiet_NaN() (0x7e00; __float2half_rn gives 0x7fff).
// code(x): x's code in the group (kivi_code.h: from the scale's reciprocal; 0 where s is not > 0).
struct KiviZeroScale {
    uint16_t z16, s16;
    float z, s, inv_s, qmax;  // z and s as the codes are computed from them
    __device__ __forceinline__ KiviZeroScale(float mn, float mx, bool nan, float qmax_) : qmax(qmax_) {
        z16 = nan ? uint16_t(0x7e00) : kv_half_bits(mn);
        s16 = nan ? uint16_t(0x7e00) : kv_half_bits(__fdiv_rn(__fsub_rn(mx, mn), qmax));
        z = __half2float(__ushort_as_half(z16));
        s = __half2float(__ushort_as_half(s16));
        inv_s = s > 0.0f ? __frcp_rn(s) : 0.0f;
    }
    __device__ __forceinline__ unsigned code(float x) const { return s > 0.0f ? kivi_code_rcp(x, z, s, inv_s, qmax) : 0u; }
};


// kivi::quantize_group + pack_row for the n values get(0..n-1): zero and scale (fp16) and the
// packed codes of one row.
template <class Get>
__device__ void quantize_row(Get get, int n, int bits, uint8_t* zero, uint8_t* scale, uint8_t* row) {
    const KiviRange g = kivi_range(get, n);
    const float qmax = float((1 << bits) - 1);
    const KiviZeroScale zs(g.mn, g.mx, g.nan, qmax);
    *reinterpret_cast<uint16_t*>(zero) = zs.z16;
    *reinterpret_cast<uint16_t*>(scale) = zs.s16;
    unsigned acc = 0;
    int filled = 0;
    for (int i = 0; i < n; ++i) {
        const unsigned code = zs.code(get(i));
        acc |= code << filled;
        filled += bits;
        if (filled == 8) {
            *row++ = uint8_t(acc);
            acc = 0;
            filled = 0;
        }
    }
}

// The same by the 32 lanes of a warp (all call; lane l takes values l, l + 32, ...): the first
// smallest and the first largest value as the loop above finds them (so a -0 / +0 tie keeps the
// same one), then a code a lane, packed by shuffles (G and 8 / bits are powers of two).
template <class Get>
__device__ void quantize_row_warp(Get get, int n, int bits, uint8_t* zero, uint8_t* scale, uint8_t* row, int lane) {
    float mn = INFINITY, mx = -INFINITY;
    int imn = n, imx = n;
    bool nan = false;
    for (int i = lane; i < n; i += 32) {
        const float x = get(i);
        nan |= x != x;
        if (x < mn) mn = x, imn = i;
        if (x > mx) mx = x, imx = i;
    }
    float neg_mn = -mn;  // the first smallest is the first largest of the negated values (exact)
    first_max_lanes<16>(neg_mn, imn);
    first_max_lanes<16>(mx, imx);
    mn = -neg_mn;
    nan = __any_sync(0xffffffffu, nan);
    const float qmax = float((1 << bits) - 1);
    const KiviZeroScale zs(mn, mx, nan, qmax);
    if (lane == 0) {
        *reinterpret_cast<uint16_t*>(zero) = zs.z16;
        *reinterpret_cast<uint16_t*>(scale) = zs.s16;
    }
    for (int base = 0; base < n; base += 32) {
        const int i = base + lane;
        const unsigned code = i < n ? zs.code(get(i)) : 0u;
        unsigned v = code << ((i * bits) & 7);
        for (int o = 1; o < 8 / bits; o <<= 1) v |= __shfl_xor_sync(0xffffffffu, v, o);
        if (i < n && (i * bits) % 8 == 0) row[i * bits / 8] = uint8_t(v);
    }
}

// Value row r of a token (its d channels in fp16 at tok) into the token's block blk: G channels
// (a ragged last row repeats its last real channel, as the CPU pads it), by one thread or, Warp,
// by the 32 lanes of a warp.
template <bool Warp>
__device__ __forceinline__ void quantize_value_row(const __half* tok, int d, int r, const KiviFormatDev& vf, uint8_t* blk, int lane) {
    const int G = vf.group, bits = vf.bits, rows = vf.rows, c0 = r * G, last = min(d, c0 + G) - 1 - c0;
    const auto get = [&](int i) { return __half2float(tok[c0 + min(i, last)]); };
    uint8_t *zero = blk + 2 * r, *scale = blk + 2 * rows + 2 * r, *codes = blk + 4 * rows + r * (G * bits / 8);
    if constexpr (Warp) {
        quantize_row_warp(get, G, bits, zero, scale, codes, lane);
    } else {
        quantize_row(get, G, bits, zero, scale, codes);
    }
}

}  // namespace vxq::cuda
#endif

// The KV formats the CUDA backend stores and reads in place: their bytes per token, the device
// encoder of a row (bit-exact with the CPU codec, kv/formats/baseline.h) and the attention's
// readers of a token held in shared memory. A token's bytes are those of the CPU codec, so the
// host's bookkeeping (kv/kv_cache.h) and `KvCache::dequantize` read device pages unchanged.
//
//   f16   head_dim fp16, round to nearest even
//   q8_0  head_dim/32 blocks {fp16 d; int8 qs[32]}: ggml's AVX2 quantize_row_q8_0, as the CPU's
//         codec (d = fp16(amax / 127), q = x * (127 / amax) rounded to nearest even, NaN or
//         |x * id| >= 2^31 -> -128, saturated to int8)
//   q4_0  head_dim/32 blocks {fp16 d; uint8 qs[16]}: ggml's quantize_row_q4_0_ref (m = the first
//         value of largest magnitude, d = m / -8, q = min(15, int8(trunc(x / d + 8.5)))), value j
//         in the low nibble of qs[j], value j + 16 in its high nibble
//   fp8   head_dim e4m3fn codes of x / scale (kvfmt::e4m3_encode: round to nearest even,
//         saturated at 448, NaN -> 0x7f with x's sign), one f32 scale per (layer, KV head) and
//         stream, set by the host codec from the first batch (KvHeadDev::k_scale / v_scale)
//
// The attention (attention.cu) reads these bytes in place: q8_0 / q4_0 keys as the CPU does
// (kernels/cpu/kv_read_baseline.cpp: the query quantized to q8_0 once per step, each 32-block's
// integer dot exact, times d_k * d_q), values as float(q) * d; fp8 codes as fp16 numbers (every
// e4m3 value is one: 3 mantissa bits, exponents 2^-9 .. 2^8), the stream's scale applied once to
// a score or an output row, not per token.
#pragma once

#include <algorithm>
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/q8_act.cuh"
#if defined(__CUDACC__) || defined(VXQ_SIMT)
#include "kernels/cuda/device_math.cuh"
#endif
#if defined(VXQ_SIMT)
#include "kv/formats/baseline.h"  // e4m3 values: the emulator's form of the fp8 conversion
#endif

namespace vxq::cuda {

enum class KvCode : uint8_t { F16, Q8_0, Q4_0, FP8 };
struct KvCodes {  // a layer's key and value formats
    KvCode k, v;
};

constexpr int kKvQ8BlockBytes = 34, kKvQ4BlockBytes = 18;

__host__ __device__ constexpr int64_t kv_token_bytes(KvCode c, int64_t head_dim) {
    return c == KvCode::F16   ? 2 * head_dim
           : c == KvCode::FP8 ? head_dim
                              : head_dim / kQBlock * (c == KvCode::Q8_0 ? kKvQ8BlockBytes : kKvQ4BlockBytes);
}
// Whether a format's keys enter the attention's MMAs as fp16 numbers against hi / lo fp16 splits
// of q (f16, fp8), not as integers against q as q8_0 (q8_0, q4_0).
__host__ __device__ constexpr bool kv_half_keys(KvCode c) { return c == KvCode::F16 || c == KvCode::FP8; }
// What a format's row length must be a multiple of: the block formats need whole 32-blocks, fp8
// rows are copied in 16-byte pieces, f16 takes any.
constexpr int kv_row_multiple(KvCode c) { return c == KvCode::F16 ? 1 : c == KvCode::FP8 ? 16 : kQBlock; }
constexpr bool kv_code_fits(KvCode c, int64_t head_dim) { return head_dim % kv_row_multiple(c) == 0; }

// Calls f.template operator()<KC, VC>() with the key and value formats (k, v) as template
// arguments: the launchers' dispatch to a kernel instance per format pair.
template <class F>
void with_kv_codes(KvCode k, KvCode v, F&& f) {
    const auto on_v = [&]<KvCode KC>() {
        switch (v) {
            case KvCode::F16: f.template operator()<KC, KvCode::F16>(); break;
            case KvCode::Q8_0: f.template operator()<KC, KvCode::Q8_0>(); break;
            case KvCode::Q4_0: f.template operator()<KC, KvCode::Q4_0>(); break;
            case KvCode::FP8: f.template operator()<KC, KvCode::FP8>(); break;
        }
    };
    switch (k) {
        case KvCode::F16: on_v.template operator()<KvCode::F16>(); break;
        case KvCode::Q8_0: on_v.template operator()<KvCode::Q8_0>(); break;
        case KvCode::Q4_0: on_v.template operator()<KvCode::Q4_0>(); break;
        case KvCode::FP8: on_v.template operator()<KvCode::FP8>(); break;
    }
}

#if defined(__CUDACC__) || defined(VXQ_SIMT)  // device code (and the SIMT emulator: tests/support/simt.h)
__device__ __forceinline__ uint16_t kv_half_bits(float x) { return __half_as_ushort(__float2half_rn(x)); }
__device__ __forceinline__ unsigned u16_at(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
__device__ __forceinline__ unsigned u32_at2(const uint8_t* p) { return u16_at(p) | (u16_at(p + 2) << 16); }  // 2-byte aligned
__device__ __forceinline__ float kv_half_at(const uint8_t* p) {  // 2-byte aligned
    return __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t*>(p)));
}

// x86's float -> int32 conversion then int8 saturation (kvfmt::q8_from_scaled).
__device__ __forceinline__ int kv_q8_from_scaled(float v) {
    if (!(fabsf(v) < 2147483648.0f)) return -128;
    return int(fminf(fmaxf(rintf(v), -128.0f), 127.0f));
}
// cvttss2si (INT32_MIN when out of range) keeping the low byte as int8 (ggml's q4_0 reference as GCC builds it).
__device__ __forceinline__ int kv_int8_trunc_x86(float v) {
    const int i = fabsf(v) < 2147483648.0f ? int(v) : INT32_MIN;
    return int(int8_t(uint8_t(unsigned(i) & 0xffu)));
}

// The per-value steps of a block's encoding, shared by the encoders below (a value per lane) and
// the warp-per-row store (attention.cu: four values per lane), so both write the same bytes.
// q8_0 from the block's amax: the code of v, and the scale's fp16 bits.
__device__ __forceinline__ float kv_q8_inv_scale(float amax) { return amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f; }
__device__ __forceinline__ uint8_t kv_q8_code(float v, float id) { return uint8_t(int8_t(kv_q8_from_scaled(__fmul_rn(v, id)))); }
__device__ __forceinline__ uint16_t kv_q8_scale_bits(float amax) { return kv_half_bits(__fdiv_rn(amax, 127.0f)); }
// q4_0: |v| as a candidate for the block's m (NaN and 0 never win: -1); from m (0 when none won)
// the scale d = m / -8 and its inverse; the code of v (0..15).
__device__ __forceinline__ float kv_q4_magnitude(float v) {
    const float a = fabsf(v);
    return a > 0.0f ? a : -1.0f;
}
struct KvQ4Scale {
    float d, id;
};
__device__ __forceinline__ KvQ4Scale kv_q4_scale(float m) {
    const float d = __fmul_rn(m, -0.125f);  // m / -8 bit for bit: the same real number, rounded once
    return KvQ4Scale{d, d != 0.0f ? __frcp_rn(d) : 0.0f};  // 1 / d correctly rounded: __fdiv_rn(1, d)'s bits
}
__device__ __forceinline__ int kv_q4_code(float v, float id) {
    const int c = kv_int8_trunc_x86(__fadd_rn(__fmul_rn(v, id), 8.5f));
    return c < 15 ? c : 15;
}

// fp8: the e4m3fn code of x / scale, kvfmt::e4m3_encode's steps on the IEEE quotient. The sign
// is x's (scale > 0): the host's division keeps a NaN's sign (x86 returns the NaN operand), the
// device's returns the canonical NaN.
// inv_pow2: kv_pow2_inverse(scale), so that a power-of-two scale (the default) takes a
// multiplication instead of the division, with the same bits.
__device__ __forceinline__ uint8_t kv_fp8_code(float x, float scale, float inv_pow2) {
    const float y = inv_pow2 != 0.0f ? __fmul_rn(x, inv_pow2) : __fdiv_rn(x, scale);
    const unsigned sign = (__float_as_uint(x) >> 24) & 0x80u;
    const float a = fabsf(y);
    if (isnan(a)) return uint8_t(sign | 0x7fu);
    if (a >= 448.0f) return uint8_t(sign | 0x7eu);  // saturate (infinities too)
    if (a < 0x1p-6f) return uint8_t(sign | unsigned(rintf(__fmul_rn(a, 512.0f))));  // subnormal: m * 2^-9
    const unsigned ua = __float_as_uint(a);
    unsigned r = ua >> 20;  // exponent and the top 3 mantissa bits; the other 20 rounded to even
    const unsigned rem = ua & 0xfffffu;
    if (rem > 0x80000u || (rem == 0x80000u && (r & 1u))) ++r;
    return uint8_t(sign | (r - ((127u - 7u) << 3)));
}
// The reciprocal of a scale that is a power of two with a normal reciprocal (2^-126 .. 2^125),
// else 0. x times it is x / scale bit for bit (both round the same real number x 2^-e once).
__device__ __forceinline__ float kv_pow2_inverse(float scale) {
    const unsigned u = __float_as_uint(scale), e = u >> 23;  // sign and exponent
    return (u & 0x7fffffu) == 0 && e >= 1 && e <= 252 ? __uint_as_float((254u - e) << 23) : 0.0f;
}
__device__ __forceinline__ uint8_t kv_fp8_code(float x, float scale) { return kv_fp8_code(x, scale, kv_pow2_inverse(scale)); }
// Two e4m3fn codes (the low byte first) as two fp16 numbers, exactly (sm_89+: one instruction).
__device__ __forceinline__ unsigned kv_fp8x2_to_half2(unsigned codes) {
#if defined(__CUDA_ARCH__)
    unsigned h;
    asm("{.reg .b16 c;\n cvt.u16.u32 c, %1;\n cvt.rn.f16x2.e4m3x2 %0, c;}" : "=r"(h) : "r"(codes));
    return h;
#elif defined(VXQ_SIMT)
    unsigned h = 0;
    for (int i = 0; i < 2; ++i) h |= unsigned(kv_half_bits(kvfmt::e4m3_value(uint8_t(codes >> (8 * i))))) << (16 * i);
    return h;
#else
    return codes;  // (host pass: not called)
#endif
}
// Eight e4m3fn codes (two words, the low byte first) as four fp16 pairs, exactly.
__device__ __forceinline__ uint4 kv_fp8x8_to_half8(unsigned lo, unsigned hi) {
    return make_uint4(kv_fp8x2_to_half2(lo), kv_fp8x2_to_half2(lo >> 16), kv_fp8x2_to_half2(hi), kv_fp8x2_to_half2(hi >> 16));
}
__device__ __forceinline__ float2 kv_fp8x2_to_float2(unsigned codes) {
    const unsigned h = kv_fp8x2_to_half2(codes);
    return make_float2(__half2float(__ushort_as_half(uint16_t(h))), __half2float(__ushort_as_half(uint16_t(h >> 16))));
}

// The butterfly over lanes xor kFirst, kFirst / 2, .., 1 (all 32 lanes call): the largest `best`,
// ties to the lowest `at` (a KIVI group's first minimum and maximum, kivi.cu).
template <int kFirst>
__device__ __forceinline__ void first_max_lanes(float& best, int& at) {
#pragma unroll
    for (int o = kFirst; o > 0; o >>= 1) {
        const float ob = __shfl_xor_sync(0xffffffffu, best, o);
        const int oa = __shfl_xor_sync(0xffffffffu, at, o);
        if (ob > best || (ob == best && oa < at)) {
            best = ob;
            at = oa;
        }
    }
}

// One 32-block of a row, value v of lane `lane` (all 32 lanes of the warp call), into blk.
__device__ __forceinline__ void kv_encode_q8_0(float v, uint8_t* blk, int lane) {
    const float amax = warp_max(fabsf(v));
    blk[2 + lane] = kv_q8_code(v, kv_q8_inv_scale(amax));
    if (lane == 0) *reinterpret_cast<uint16_t*>(blk) = kv_q8_scale_bits(amax);
}
__device__ __forceinline__ void kv_encode_q4_0(float v, uint8_t* blk, int lane) {
    // The first lane of largest |v| (NaN never wins; all zero or NaN: m = +0 as the reference's
    // start): the largest magnitude by a max butterfly, its first lane by a ballot, as the rows
    // store's kv_q4_block_scale (kv_store_kernels.cuh). The ballot is never empty: best is a lane's.
    const float mag = kv_q4_magnitude(v), best = warp_max(mag);
    const unsigned holders = __ballot_sync(0xffffffffu, mag == best);
    const float vm = __shfl_sync(0xffffffffu, v, __ffs(int(holders)) - 1);
    const KvQ4Scale sc = kv_q4_scale(best > 0.0f ? vm : 0.0f);
    const int q = kv_q4_code(v, sc.id);
    const int hi = __shfl_down_sync(0xffffffffu, q, 16);
    if (lane < 16) blk[2 + lane] = uint8_t((q & 0x0f) | ((hi & 0x0f) << 4));
    if (lane == 0) *reinterpret_cast<uint16_t*>(blk) = kv_half_bits(sc.d);
}

// Threads per block of a kernel that stores rows of head_dim with kv_store_row (a multiple of 32).
constexpr int kv_row_threads(int64_t head_dim) { return int(std::clamp<int64_t>((head_dim + 31) / 32 * 32, 32, 256)); }
// Row x[0, hd) into one token's bytes at dst, by all `nthreads` threads of a block (a multiple of
// 32; every thread calls). f16, fp8 (its stream's `scale`): any hd; q8_0 / q4_0: hd % 32 == 0, a
// warp per 32-block.
__device__ __forceinline__ void kv_store_row(KvCode c, const float* x, uint8_t* dst, int hd, int tid, int nthreads,
                                             float scale) {
    if (c == KvCode::F16) {
        for (int d = tid; d < hd; d += nthreads) reinterpret_cast<uint16_t*>(dst)[d] = kv_half_bits(x[d]);
        return;
    }
    if (c == KvCode::FP8) {
        for (int d = tid; d < hd; d += nthreads) dst[d] = kv_fp8_code(x[d], scale);
        return;
    }
    const int lane = tid & 31;
    for (int b = tid >> 5; b < hd / kQBlock; b += nthreads >> 5) {
        const float v = x[b * kQBlock + lane];
        if (c == KvCode::Q8_0) {
            kv_encode_q8_0(v, dst + b * kKvQ8BlockBytes, lane);
        } else {
            kv_encode_q4_0(v, dst + b * kKvQ4BlockBytes, lane);
        }
    }
}

// Value j's integer code in a q8_0 / q4_0 block (q4_0: nibble - 8), 0 <= j < 32.
__device__ __forceinline__ int kv_code_at(const uint8_t* blk, int j, KvCode c) {
    if (c == KvCode::Q8_0) return int8_t(blk[2 + j]);
    const int byte = blk[2 + (j & 15)];
    return (j < 16 ? byte & 15 : byte >> 4) - 8;
}
#endif

}  // namespace vxq::cuda

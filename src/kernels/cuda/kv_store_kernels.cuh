// The store of a batch of keys and values into the pages (store_kv, attention.cuh) for the
// token-wise formats (f16, q8_0, q4_0, fp8: kv_codes.cuh), a kernel instance per (key, value)
// format pair. Apart from kv_store.cu (which launches it) so that a test can run it on the CPU
// (tests/support/simt.h compiles this header as C++; the two hardware conversions below have a
// scalar form there, the per-value steps of kv_codes.cuh, which give the same bytes).
//
// A warp per kKvStorePairs (token, head) pairs, their keys and values (2 kKvStorePairs rows): the
// pairs' page addresses once (the head table read once a pair, not once a row and stretch), then
// for each 128-value stretch of head_dim every row's 16-byte load issued before any row is encoded;
// lane l takes values 4 l .. 4 l + 3 of the stretch. f16: one 8-byte store a lane; fp8: one 4-byte
// store (two e4m3x2 conversions); q8_0 / q4_0: 8 lanes a 32-block (its amax, or its first value
// of largest magnitude, by 3 shuffles and a ballot), codes stored 4 at a time. The general kernel
// before this one (the format a run-time switch inside the row loop, the head's table entry read
// for every row) executed 2.5 M (f16) to 6.8 M (fp8) warp instructions on a 2048-token write
// (Nsight Compute, docs/gpu.md), more than the transfer's time. Its form with two pairs a warp
// waited on memory latency more than it issued (q4_0 on the H100: no warp eligible in 47 % of
// cycles at 8 blocks an SM, 2026-12-06); one pair a warp holds 12 blocks an SM and is 5-15 %
// faster; a loop over items that loads the next one's rows first measured slower.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/kv_codes.cuh"
#include "kernels/cuda/launch.cuh"

namespace vxq::cuda {

// 4 warps of a (token, head) pair each: 40 registers, 12 blocks an SM. Two pairs a warp (its 4
// rows' loads in flight at once, 63 registers, 8 blocks an SM) measured slower on the H100 at
// every format and size: q4_0 at 2048 tokens 9.5 against 8.1 us, fp8 8.8 / 7.9, q8_0 9.3 / 8.8
// (docs/gpu.md, second session of 2026-12-06).
constexpr int kKvStoreWarps = 4, kKvStorePairs = 1;

__device__ __forceinline__ void kv_store_u32_at2(uint8_t* p, unsigned w) {  // 2-byte aligned
    reinterpret_cast<uint16_t*>(p)[0] = uint16_t(w);
    reinterpret_cast<uint16_t*>(p)[1] = uint16_t(w >> 16);
}

// Two hardware conversions the HwCvt kernels use (sm_89+), and in the emulator their PTX
// semantics in C++ (so that a test checks the steps around them; the instructions themselves are
// checked on a GPU: Cuda.TokenStoreBitExactOnEdgeValues).
// cvt.rni.sat.s8.f32: round to nearest even, saturate to [-128, 127], NaN -> 0.
__device__ __forceinline__ int kv_cvt_rni_sat_s8(float v) {
#if defined(__CUDA_ARCH__)
    int c;
    asm("cvt.rni.sat.s8.f32 %0, %1;" : "=r"(c) : "f"(v));
    return int(int8_t(c));
#else
    return v != v ? 0 : int(fminf(fmaxf(rintf(v), -128.0f), 127.0f));
#endif
}
// cvt.rn.satfinite.e4m3x2.f32 (hi into the high byte): round to nearest even, subnormals, +-448
// for everything beyond (infinities too), NaN -> 0x7f.
__device__ __forceinline__ unsigned kv_cvt_e4m3x2(float hi, float lo) {
#if defined(__CUDA_ARCH__)
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
#elif defined(VXQ_SIMT)
    const auto e = [](float v) { return unsigned(v != v ? 0x7fu : kvfmt::e4m3_encode(v)); };
    return e(lo) | (e(hi) << 8);
#else
    return 0;  // (host pass: not called)
#endif
}

// The q8_0 codes of v * id (kv_q8_code, the low byte first). HwCvt: cvt.rni.sat.s8 is rint and
// the int8 clamp in one instruction; NaN and |v * id| >= 2^31 (x86's INT32_MIN) give -128 as there.
template <bool HwCvt>
__device__ __forceinline__ unsigned kv_q8_codes4(const float4& v, float id) {
    unsigned q = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int c;
        if constexpr (HwCvt) {
            const float s = __fmul_rn(at4(v, i), id);
            c = fabsf(s) < 2147483648.0f ? kv_cvt_rni_sat_s8(s) : -128;
        } else {
            c = kv_q8_code(at4(v, i), id);
        }
        q |= (unsigned(c) & 0xffu) << (8 * i);
    }
    return q;
}

// The e4m3fn codes of v / scale (kv_fp8_code: inv = kv_pow2_inverse(scale)), the low byte first.
// HwCvt: cvt.rn.satfinite.e4m3x2 gives kv_fp8_code's code for every input but NaN; a NaN takes
// the scalar steps, which give it x's sign (the hardware's NaN is unsigned).
template <bool HwCvt>
__device__ __forceinline__ unsigned kv_fp8_codes4(const float4& v, float scale, float inv) {
    if constexpr (HwCvt) {
        float y[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) y[i] = inv != 0.0f ? __fmul_rn(at4(v, i), inv) : __fdiv_rn(at4(v, i), scale);
        if (!(isnan(y[0]) || isnan(y[1]) || isnan(y[2]) || isnan(y[3]))) {
            return kv_cvt_e4m3x2(y[1], y[0]) | (kv_cvt_e4m3x2(y[3], y[2]) << 16);
        }
    }
    unsigned q = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) q |= unsigned(kv_fp8_code(at4(v, i), scale, inv)) << (8 * i);
    return q;
}

// q4_0's m for a lane's four values v of a 32-block held by 8 lanes (li = lane % 8): the block's
// largest |x| by a max butterfly (fmaxf drops NaN, which never wins; all zero or NaN: m = +0), then
// its first place in the block's order (a ballot of the lanes holding it, each lane's first of
// four), as kv_encode_q4_0's first value of largest magnitude; the scale from it (kv_q4_scale).
// Every lane of the warp calls. (The pair (|x|, place) butterfly it replaces took 6 shuffles.)
__device__ __forceinline__ KvQ4Scale kv_q4_block_scale(const float4& v, int li) {
    float mx = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const bool has = fabsf(v.x) == mx || fabsf(v.y) == mx || fabsf(v.z) == mx || fabsf(v.w) == mx;
    const float first = fabsf(v.x) == mx ? v.x : fabsf(v.y) == mx ? v.y : fabsf(v.z) == mx ? v.z : v.w;
    const int base = int(threadIdx.x & 31) - li;  // the block's first lane
    const unsigned lanes = (__ballot_sync(0xffffffffu, has) >> base) & 0xffu;
    const float vm = __shfl_sync(0xffffffffu, first, base + (lanes != 0 ? __ffs(int(lanes)) - 1 : 0));
    return kv_q4_scale(mx > 0.0f ? vm : 0.0f);
}

// q4_0's codes of a lane's four values (kv_q4_code's, the low byte first) from the block's scale.
// Where the block's 1 / d is finite every x = v id + 8.5 is in [0.49, 16.51] or NaN (|v| <= m,
// and d = m / -8 is exact but for subnormals, rounded there by < 2^-21 where 1 / d does not
// overflow; an infinite v makes m infinite and id -0), so the code is trunc(min(max(x, 0), 15.5))
// (NaN -> 0 as x86's conversion gives): 2^23 + that, added toward zero, holds it in its low
// mantissa bits, and byte permutations pack the four. An infinite id (d below 2^-128: a block of
// tiny subnormals) takes the scalar steps.
constexpr float kQ4TruncBias = 8388608.0f;  // 2^23: 2^23 + y added toward zero is 0x4b000000 + trunc(y)
__device__ __forceinline__ unsigned kv_q4_codes4(const float4& v, const KvQ4Scale& sc) {
    if (fabsf(sc.id) < INFINITY) {
        unsigned b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float x = __fadd_rn(__fmul_rn(at4(v, i), sc.id), 8.5f);
            b[i] = __float_as_uint(__fadd_rz(fminf(fmaxf(x, 0.0f), 15.5f), kQ4TruncBias));  // 0x4b00000c: the code in byte 0
        }
        return __byte_perm(__byte_perm(b[0], b[1], 0x1140u), __byte_perm(b[2], b[3], 0x4011u), 0x7610u);
    }
    unsigned q = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) q |= unsigned(kv_q4_code(at4(v, i), sc.id) & 0x0f) << (8 * i);
    return q;
}

// Values c .. c + 3 (v) of one row into its token's bytes at dst (in: c < head_dim); every lane
// of the warp calls (the block formats' shuffles). scale / inv: fp8's stream scale and
// kv_pow2_inverse of it.
template <KvCode C, bool HwCvt>
__device__ __forceinline__ void kv_store_stretch(uint8_t* dst, int c, bool in, const float4& v, float scale, float inv) {
    const int li = int(threadIdx.x & 7);
    if constexpr (C == KvCode::F16) {
        if (in) {
            const uint2 hw{kv_half_bits(v.x) | (unsigned(kv_half_bits(v.y)) << 16),
                           kv_half_bits(v.z) | (unsigned(kv_half_bits(v.w)) << 16)};
            *reinterpret_cast<uint2*>(dst + 2 * c) = hw;
        }
    } else if constexpr (C == KvCode::FP8) {  // hd % 16 == 0 (kv_code_fits): 4-byte aligned
        if (in) *reinterpret_cast<unsigned*>(dst + c) = kv_fp8_codes4<HwCvt>(v, scale, inv);
    } else if constexpr (C == KvCode::Q8_0) {
        uint8_t* blk = dst + (c / kQBlock) * kKvQ8BlockBytes;
        float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
        for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const unsigned q = kv_q8_codes4<HwCvt>(v, kv_q8_inv_scale(amax));
        if (in) {
            kv_store_u32_at2(blk + 2 + 4 * li, q);
            if (li == 0) *reinterpret_cast<uint16_t*>(blk) = kv_q8_scale_bits(amax);
        }
    } else {
        uint8_t* blk = dst + (c / kQBlock) * kKvQ4BlockBytes;
        const KvQ4Scale sc = kv_q4_block_scale(v, li);
        const unsigned q = kv_q4_codes4(v, sc);  // this lane's four codes, a byte each
        const unsigned hi = __shfl_down_sync(0xffffffffu, q, 4);  // values 16 + 4 li .. of lanes 4-7
        if (in && li < 4) {
            kv_store_u32_at2(blk + 2 + 4 * li, q | (hi << 4));
            if (li == 0) *reinterpret_cast<uint16_t*>(blk) = kv_half_bits(sc.d);
        }
    }
}

// Pairs q = (token t, head g) = (q / n_head_kv, q % n_head_kv) of the batch, keys p.k[q] and values
// p.v[q] (rows of head_dim, 16-byte aligned, head_dim % 4 == 0), into slot n_tokens + t of head g.
// 32-bit indices (store_kv: pairs < 2^29) and one division a warp. HwCvt: q8_0 and fp8 codes by
// the conversion instructions above (the same bytes, fewer instructions: the default since their
// run on the H100, docs/gpu.md 2026-12-06; set_kv_store_hw_convert, attention.cuh).
template <KvCode KC, KvCode VC, bool HwCvt>
__global__ void __launch_bounds__(kKvStoreWarps * 32, 12) kv_store_rows_kernel(const KvStoreParams p) {
    pdl_wait();
    pdl_launch_dependents();  // the next kernel's blocks may take the SMs this grid leaves
    const int lane = int(threadIdx.x & 31);
    const int pairs = int(p.n * p.n_head_kv), nh = int(p.n_head_kv), hd = int(p.head_dim);
    const int q0 = (int(blockIdx.x) * kKvStoreWarps + int(threadIdx.x >> 5)) * kKvStorePairs;
    if (q0 >= pairs) return;  // whole warps: the shuffles see every lane
    const int n = pairs - q0 < kKvStorePairs ? pairs - q0 : kKvStorePairs;  // the warp's pairs (uniform)
    uint8_t* kdst[kKvStorePairs];
    uint8_t* vdst[kKvStorePairs];
    float ksc[kKvStorePairs], kinv[kKvStorePairs], vsc[kKvStorePairs], vinv[kKvStorePairs];
    {
        int t = int(unsigned(q0) / unsigned(nh)), g = q0 - t * nh;
#pragma unroll
        for (int i = 0; i < kKvStorePairs; ++i) {
            const KvHeadDev& h = p.heads[i < n ? g : 0];
            const int64_t slot = h.n_tokens + t;
            kdst[i] = reinterpret_cast<uint8_t*>(h.k) + slot * kv_token_bytes(KC, hd);
            vdst[i] = reinterpret_cast<uint8_t*>(h.v) + slot * kv_token_bytes(VC, hd);
            ksc[i] = KC == KvCode::FP8 ? h.k_scale : 1.0f;
            vsc[i] = VC == KvCode::FP8 ? h.v_scale : 1.0f;
            kinv[i] = kv_pow2_inverse(ksc[i]);
            vinv[i] = kv_pow2_inverse(vsc[i]);
            if (++g == nh) g = 0, ++t;
        }
    }
    for (int c0 = 0; c0 < hd; c0 += 128) {
        const int c = c0 + 4 * lane;
        const bool in = c < hd;  // a 32-block is all in or all out (hd % 32 == 0 for the block formats)
        float4 kx[kKvStorePairs], vx[kKvStorePairs];
#pragma unroll
        for (int i = 0; i < kKvStorePairs; ++i) {
            const int64_t row = int64_t(q0 + i) * hd + c;
            const bool ld = in && i < n;
            kx[i] = ld ? *reinterpret_cast<const float4*>(p.k + row) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            vx[i] = ld ? *reinterpret_cast<const float4*>(p.v + row) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int i = 0; i < kKvStorePairs; ++i) {
            if (i >= n) break;
            kv_store_stretch<KC, HwCvt>(kdst[i], c, in, kx[i], ksc[i], kinv[i]);
            kv_store_stretch<VC, HwCvt>(vdst[i], c, in, vx[i], vsc[i], vinv[i]);
        }
    }
}

}  // namespace vxq::cuda

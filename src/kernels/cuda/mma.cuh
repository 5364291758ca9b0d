// Warp-level tensor-core MMA (PTX mma.sync, sm_80+) and the fp16 operand helpers the attention
// kernels share. Fragments as the PTX ISA lays out m16n8k16 (gid = lane / 4, tig = lane % 4):
//   A (16 x 16, row): reg 0 (row gid, cols 2 tig, 2 tig + 1), reg 1 (row gid + 8, same cols),
//                     reg 2 (row gid, cols 2 tig + 8, + 9), reg 3 (row gid + 8, cols 2 tig + 8, + 9)
//   B (16 x 8, col):  reg 0 (rows 2 tig, 2 tig + 1; col gid), reg 1 (rows 2 tig + 8, + 9; col gid)
//   C (16 x 8, f32):  c0, c1 (row gid; cols 2 tig, 2 tig + 1), c2, c3 (row gid + 8; same cols)
// The lower-numbered element of a pair is the low half of its register.
//
// f32 through fp16 operands: x = hi + lo / kLoScale with hi = fp16(x) and lo = fp16((x - hi)
// kLoScale); x - hi is exact in f32 and the power-of-two scale keeps lo out of fp16's subnormals,
// so hi + lo / kLoScale is x within 2^-22 |x| (|x| < 65504). Products of fp16 numbers are exact in
// f32 and the tensor cores add them in f32, so an MMA on hi and one on lo give f32 numerics up to
// the summation order.
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_fp16.h>

namespace vxq::cuda {

constexpr float kLoScale = 2048.0f, kLoInv = 1.0f / 2048.0f;

#if defined(__CUDACC__) || defined(VXQ_SIMT)
#if defined(VXQ_SIMT)
// The SIMT emulator's MMAs (tests/support/simt.h): the warp's fragments gathered, each lane's four
// accumulators computed from the whole A and B as the layouts above place them. fp16 products are
// exact in f32; their sum is taken in double and rounded once (the device's adder keeps more than
// f32 between the products of one MMA, in an order it does not document). int8: exact.
namespace mma_simt {
struct Regs {
    unsigned a[4], b[2];
};
inline float half_of(unsigned reg, int hi) { return __half2float(__ushort_as_half(uint16_t(reg >> (16 * hi)))); }
inline int s8_of(unsigned reg, int byte) { return int(int8_t(uint8_t(reg >> (8 * byte)))); }
// An fp16x2 register of f(0) (low half) and f(1) (high half), each rounded once from double.
template <class F>
unsigned each_half(F f) {
    return unsigned(__half_as_ushort(__double2half(f(0)))) | (unsigned(__half_as_ushort(__double2half(f(1)))) << 16);
}
}  // namespace mma_simt
#endif

// c += A B, m16n8k16, fp16 operands, f32 accumulators.
__device__ __forceinline__ void mma_f16(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                        unsigned b1) {
#if defined(VXQ_SIMT)
    using namespace mma_simt;
    const Regs mine{{a0, a1, a2, a3}, {b0, b1}};
    Regs all[32];
    ::vxq::simt::warp_gather(&mine, sizeof mine, all);
    const int lane = int(threadIdx.x & 31u), gid = lane >> 2, tig = lane & 3;
    for (int i = 0; i < 4; ++i) {
        const int row = gid + 8 * (i >> 1), col = 2 * tig + (i & 1);
        double sum = c[i];
        for (int k = 0; k < 16; ++k) {
            const Regs& ra = all[(row % 8) * 4 + (k % 8) / 2];
            const Regs& rb = all[col * 4 + (k % 8) / 2];
            sum += double(half_of(ra.a[(row >= 8) + 2 * (k >= 8)], k % 2)) * double(half_of(rb.b[k >= 8], k % 2));
        }
        c[i] = float(sum);
    }
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}
// c += A B, m16n8k32, int8 operands (A as its four registers: a.x rows gid, cols 4 tig .. + 3;
// a.y rows gid + 8, same cols; a.z / a.w the same rows, cols 16 + 4 tig ..; B: b0 rows 4 tig .. + 3,
// b1 rows 16 + 4 tig .., col gid), int32 accumulators; A's bytes signed (mma_s8) or unsigned
// (mma_u8s8), B's signed.
template <bool kUnsignedA>
__device__ __forceinline__ void mma_i8(int (&c)[4], const uint4& a, unsigned b0, unsigned b1) {
#if defined(VXQ_SIMT)
    using namespace mma_simt;
    const Regs mine{{a.x, a.y, a.z, a.w}, {b0, b1}};
    Regs all[32];
    ::vxq::simt::warp_gather(&mine, sizeof mine, all);
    const int lane = int(threadIdx.x & 31u), gid = lane >> 2, tig = lane & 3;
    for (int i = 0; i < 4; ++i) {
        const int row = gid + 8 * (i >> 1), col = 2 * tig + (i & 1);
        for (int k = 0; k < 32; ++k) {
            const Regs& ra = all[(row % 8) * 4 + (k % 16) / 4];
            const Regs& rb = all[col * 4 + (k % 16) / 4];
            const unsigned areg = ra.a[(row >= 8) + 2 * (k >= 16)];
            const int av = kUnsignedA ? int((areg >> (8 * (k % 4))) & 0xffu) : s8_of(areg, k % 4);
            c[i] += av * s8_of(rb.b[k >= 16], k % 4);
        }
    }
#else
    if constexpr (kUnsignedA) {
        asm volatile(
            "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
            : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
            : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
    }
#endif
}
__device__ __forceinline__ void mma_s8(int (&c)[4], const uint4& a, unsigned b0, unsigned b1) { mma_i8<false>(c, a, b0, b1); }
__device__ __forceinline__ void mma_u8s8(int (&c)[4], const uint4& a, unsigned b0, unsigned b1) { mma_i8<true>(c, a, b0, b1); }
// d = A B (u8 x s8 as mma_u8s8, the accumulators' input zero: no registers to clear first).
__device__ __forceinline__ void mma_u8s8_first(int (&d)[4], const uint4& a, unsigned b0, unsigned b1) {
#if defined(VXQ_SIMT)
    d[0] = d[1] = d[2] = d[3] = 0;
    mma_i8<true>(d, a, b0, b1);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1), "r"(0));
#endif
}
__device__ __forceinline__ unsigned pack_half2(float lo_index, float hi_index) {
    return unsigned(__half_as_ushort(__float2half_rn(lo_index))) | (unsigned(__half_as_ushort(__float2half_rn(hi_index))) << 16);
}
// hi = fp16 pair of (x0, x1), lo = the rest times lo_scale (above; 1 where the caller has scaled x
// so that the rest stays a normal fp16 number).
__device__ __forceinline__ void split_pair(float x0, float x1, unsigned& hi, unsigned& lo, float lo_scale = kLoScale) {
    const __half h0 = __float2half_rn(x0), h1 = __float2half_rn(x1);
    hi = unsigned(__half_as_ushort(h0)) | (unsigned(__half_as_ushort(h1)) << 16);
    lo = pack_half2((x0 - __half2float(h0)) * lo_scale, (x1 - __half2float(h1)) * lo_scale);
}

// fp16x2 arithmetic on raw registers, rounded to nearest even once (mul.rn and fma.rn: never
// contracted or reassociated by the compiler). The emulator takes each half's product or fma in
// double (an fp16 product is exact there) and rounds it to fp16; an fma whose exact value needs
// more than double's 53 bits is rounded twice there, which can move a tie by one fp16 ulp.
__device__ __forceinline__ unsigned h2_mul(unsigned a, unsigned b) {
#if defined(VXQ_SIMT)
    using mma_simt::half_of;
    return mma_simt::each_half([&](int hi) { return double(half_of(a, hi)) * double(half_of(b, hi)); });
#else
    unsigned d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
#endif
}
__device__ __forceinline__ unsigned h2_fma(unsigned a, unsigned b, unsigned c) {
#if defined(VXQ_SIMT)
    using mma_simt::half_of;
    return mma_simt::each_half([&](int hi) { return std::fma(double(half_of(a, hi)), double(half_of(b, hi)), double(half_of(c, hi))); });
#else
    unsigned d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#endif
}
#endif

}  // namespace vxq::cuda

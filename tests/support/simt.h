// A SIMT emulator: runs CUDA kernel source on the CPU, so that a kernel's tests also run where
// there is no GPU (CI) and a kernel written without one is checked before it ever reaches one.
// Include this first, then the kernel header (it compiles as C++: CUDA's host headers give the
// vector types and fp16 conversions, this header the device built-ins). A launch runs the blocks
// one after another; a block's threads are fibers (ucontext) on one OS thread, switched at
// __syncthreads, __syncwarp and the shuffles, so shared memory (`__shared__` is `static`: one copy,
// blocks never overlap), barriers and warp exchanges behave as on the device for code without
// data races. A barrier that some live thread of the block (or warp) never reaches is reported
// (std::runtime_error naming the block) instead of hanging. What it does not model: timing,
// memory ordering between blocks, warp-synchronous code without __syncwarp, partial-warp masks
// (shuffles exchange among all 32 lanes), and f32 rounding differences of the device's
// intrinsics (`__fadd_rn` is `+` here; build the test with -ffp-contract=off). The arithmetic
// the kernels rely on (IEEE f32 / f64 ops, fmaf, fp16 conversion) is the host's, which is IEEE.
// Tensor-core MMAs (mma.cuh) run as their PTX fragment layouts say, each lane's accumulators
// from the warp's gathered fragments (warp_gather); fp16 products summed in double, int8 exactly.
#pragma once

#define VXQ_SIMT 1  // headers with device code compile it for the emulator too (kv_codes.cuh)
#define __shared__ static
#define __launch_bounds__(...)

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>

#include <math.h>  // isnan, fabsf, rintf in the global namespace, as device code has them

namespace vxq::simt {

struct Dims {
    uint3 thread, block;
    dim3 block_dim, grid_dim;
};
const Dims& dims();  // the running thread's
void sync_warp();
void sync_threads();
// Every lane of the running thread's warp calls: returns lane `src`'s `bits`.
uint64_t exchange(uint64_t bits, int src);
// Every lane of the running thread's warp calls with `bytes` (at most 64) of its own: `all` gets
// the 32 lanes' bytes in lane order (one exchange for a whole MMA's fragments).
void warp_gather(const void* mine, size_t bytes, void* all);
uint8_t* dynamic_smem();
// Runs body() as every thread of every block of the grid (1-D blocks of a multiple of 32
// threads), with `smem` bytes of dynamic shared memory (zeroed at each block).
void launch(dim3 grid, dim3 block, size_t smem, const std::function<void()>& body);

}  // namespace vxq::simt

// (blockDim and gridDim are not macros: CUDA's own launch structs have members of those names;
// a kernel reads them as ::vxq::simt::dims().block_dim / grid_dim under the emulator.)
#define threadIdx (::vxq::simt::dims().thread)
#define blockIdx (::vxq::simt::dims().block)
#define VXQ_DYNAMIC_SMEM(name) uint8_t* name = ::vxq::simt::dynamic_smem()

inline void __syncwarp(unsigned = 0xffffffffu) { ::vxq::simt::sync_warp(); }
inline void __syncthreads() { ::vxq::simt::sync_threads(); }

template <class T>
T __shfl_sync(unsigned, T v, int src) {
    static_assert(sizeof(T) <= 8);
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof(T));
    b = ::vxq::simt::exchange(b, src & 31);
    T r;
    std::memcpy(&r, &b, sizeof(T));
    return r;
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int o) {
    return __shfl_sync(mask, v, int(threadIdx.x & 31u) ^ o);
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned d) {
    const unsigned lane = threadIdx.x & 31u;
    return __shfl_sync(mask, v, int(lane + d < 32u ? lane + d : lane));
}

// The device's integer min / max (global, as CUDA declares them).
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline int __float2int_rn(float a) { return int(std::nearbyint(a)); }  // the default mode: to nearest, ties to even
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
// Rounded toward zero (add.rz.f32): the host's adder in that mode, volatile so that it runs here.
inline float __fadd_rz(float a, float b) {
    const int mode = std::fegetround();
    std::fesetround(FE_TOWARDZERO);
    volatile float s = a;
    s = s + b;
    std::fesetround(mode);
    return s;
}
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
    return unsigned(((uint64_t(hi) << 32) | lo) >> (shift & 31u));
}
// Fibers switch only at barriers and shuffles, so a read-modify-write is atomic.
inline unsigned atomicOr(unsigned* p, unsigned v) {
    const unsigned old = *p;
    *p = old | v;
    return old;
}
inline int atomicAdd(int* p, int v) {
    const int old = *p;
    *p = old + v;
    return old;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
    const unsigned old = *p;
    *p = old + v;
    return old;
}
// Blocks run one after another, so a block sees every earlier block's writes: the fences order
// nothing here, and loads through L2 are plain loads.
inline void __threadfence() {}
template <class T>
T __ldg(const T* p) {
    return *p;
}
template <class T>
T __ldcg(const T* p) {
    return *p;
}
inline int __reduce_add_sync(unsigned, int v) {
    int all[32];
    ::vxq::simt::warp_gather(&v, sizeof v, all);
    int sum = 0;
    for (const int a : all) sum += a;
    return sum;
}
inline bool __any_sync(unsigned, bool pred) {
    int all[32];
    const int mine = pred;
    ::vxq::simt::warp_gather(&mine, sizeof mine, all);
    for (const int a : all) {
        if (a) return true;
    }
    return false;
}
// Bit l: lane l's pred.
inline unsigned __ballot_sync(unsigned, bool pred) {
    int all[32];
    const int mine = pred;
    ::vxq::simt::warp_gather(&mine, sizeof mine, all);
    unsigned bits = 0;
    for (int l = 0; l < 32; ++l) bits |= all[l] ? 1u << l : 0u;
    return bits;
}
// 1 + the lowest set bit's place, 0 for none.
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(unsigned(x)) + 1; }
// Byte i of the result is byte (s >> 4 i) & 7 of y:x (x the low word), as the device's PRMT in its default mode.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t xy = (uint64_t(y) << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= unsigned((xy >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
}
// The dot of a's and b's four signed bytes, plus c.
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += int(int8_t(uint8_t(unsigned(a) >> (8 * i)))) * int(int8_t(uint8_t(unsigned(b) >> (8 * i))));
    return c;
}
// The device's fast exponential (ex2.approx of x log2 e) is within a few ulps of exp: the host's.
inline float __expf(float x) { return std::exp(x); }
// Per byte, a - b modulo 256.
inline unsigned __vsub4(unsigned a, unsigned b) {
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= ((((a >> (8 * i)) & 0xffu) - ((b >> (8 * i)) & 0xffu)) & 0xffu) << (8 * i);
    return r;
}

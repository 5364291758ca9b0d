// Asynchronous copies from global into shared memory. cp.async (sm_80+): 16 bytes, bypassing L1;
// a thread may read back what it copied itself after cp_async_wait<N>, bytes copied by other
// threads of the block need a barrier after their wait as well. Bulk copies (sm_90): below.
#pragma once

#include <cstdint>
#include <cstring>

#include <cuda_runtime.h>

namespace vxq::cuda {

#ifdef __CUDACC__
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem) : "memory");
}
// 8 bytes (8-byte aligned both sides), through L1 (cp.async takes 4, 8 or 16 bytes; .cg only 16).
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem) {
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// The TMA unit's bulk copy (sm_90): `bytes` (a multiple of 16, both addresses 16-byte aligned) from
// global into shared memory, counted on the mbarrier `bar` as they land. An mbarrier of count 1
// completes a phase when its one arrival (mbar_expect_tx, which also announces the bytes to come) and
// all the announced bytes are in; waiters name the phase by its parity (0, 1, 0, ...).
__device__ __forceinline__ unsigned smem_u32(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// After the inits, before the barriers are used by the async proxy (the bulk copies).
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
    asm volatile(
        "{\n\t.reg .pred done;\n"
        "WAIT:\n\tmbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "\t@!done bra WAIT;\n}" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
}
// Global memory written through the generic proxy (plain stores), then read by bulk copies: each
// writing thread fences before the barrier that precedes the copy.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }
// A hint that [ptr, ptr + bytes) will be read soon: one bulk request into L2 (sm_90; both
// multiples of 16). No registers, no shared memory, nothing to wait for.
__device__ __forceinline__ void prefetch_l2_bulk(const void* ptr, unsigned bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(ptr), "r"(bytes) : "memory");
}
#elif defined(VXQ_SIMT)
// The SIMT emulator (tests/support/simt.h): the copies land at once (a thread's own copies are
// complete at its wait; other threads' after the barrier that follows it, as on the device).
inline void cp_async16(void* smem, const void* gmem) { std::memcpy(smem, gmem, 16); }
inline void cp_async8(void* smem, const void* gmem) { std::memcpy(smem, gmem, 8); }
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}
#endif

// An L2 eviction policy for the cache-hint copies: evict-first where asked, else normal (both made,
// one selected: no branch per copy). cp_async16 with such a policy. Compiled everywhere: off the
// device (the SIMT emulator, host passes) the policy is 0 and the copy a memcpy.
__device__ __forceinline__ uint64_t l2_policy([[maybe_unused]] bool evict_first) {
#if defined(__CUDA_ARCH__)
    uint64_t first, normal;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(first));
    asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(normal));
    return evict_first ? first : normal;
#else
    return 0;
#endif
}
__device__ __forceinline__ void cp_async16_hint(void* smem, const void* gmem, [[maybe_unused]] uint64_t policy) {
#if defined(__CUDA_ARCH__)
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "l"(policy) : "memory");
#else
    std::memcpy(smem, gmem, 16);
#endif
}

}  // namespace vxq::cuda

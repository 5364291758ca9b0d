// cp.async (sm_80+): 16 bytes from global memory into shared memory, asynchronously; the copy
// bypasses L1. A thread may read back what it copied itself after cp_async_wait<N>; bytes copied
// by other threads of the block need a barrier after their wait as well.
#pragma once

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
#endif

}  // namespace vxq::cuda

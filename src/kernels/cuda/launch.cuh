// Kernel launches with programmatic dependent launch (PDL, sm_90): the next kernel of the stream
// may start while this one drains, do what does not depend on it (a GEMV loads its first
// weights, which no kernel writes), and wait for it at pdl_wait(). Inside a CUDA graph this
// hides most of the gap between two kernels of a decode step.
//
// The contract of a kernel launched with launch_pdl: every block calls pdl_wait() before it
// reads anything an earlier kernel wrote and before it writes anything (an earlier kernel may
// still read it). pdl_wait() waits for the previous kernel to complete and its writes to be
// visible; as each launch_pdl kernel waits for its predecessor, completion is ordered down the
// stream as without PDL. pdl_launch_dependents() lets the next kernel start launching (its
// blocks take free SM slots and run up to their own pdl_wait()). Both are no-ops in a kernel
// launched without the attribute. VXQ_CUDA_PDL=0 launches without it.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/check.cuh"

namespace vxq::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// False when VXQ_CUDA_PDL=0 (read once).
bool pdl_enabled();

// The multiprocessors of the current device (read once): what grids are sized for.
int sm_count();

template <class... Params, class... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, Args&&... args) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl_enabled() ? 1 : 0;
    VXQ_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...));
}

}  // namespace vxq::cuda

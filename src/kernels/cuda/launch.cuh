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

#include <cstdint>
#include <mutex>

#include "kernels/cuda/check.cuh"

// A kernel's dynamic shared memory, 16-byte aligned (the SIMT emulator, tests/support/simt.h,
// defines its own before this header).
#ifndef VXQ_DYNAMIC_SMEM
#define VXQ_DYNAMIC_SMEM(name) extern __shared__ __align__(16) uint8_t name[]
#endif

namespace vxq::cuda {

// The timeline of the GPU's passes (VXQ_CUDA_PROFILE=timeline), in builds configured with
// -DVXQ_CUDA_TRACE=ON only (it costs an atomic per kernel): the first thread of every kernel's
// first block stamps %globaltimer and the kernel's grid as its pdl_wait() returns, that is when
// the kernel before it has completed. The difference of two stamps is a kernel's time in the
// stream, graph and PDL overlap included, which no event can time (backend_cuda.cpp prints them).
struct PdlStamp {
    unsigned long long ns;
    unsigned grid[3], threads;
};
struct PdlTrace {
    PdlStamp* stamps;
    unsigned* count;  // stamps taken (may pass cap: those past it are dropped)
    unsigned cap;
};
// Every CUDA translation unit has its own copy of the trace's address (a __constant__ without
// relocatable device code); each registers a function that sets it, and pdl_trace_bind sets all.
void pdl_trace_register(void (*bind)(const PdlTrace&));
void pdl_trace_bind(const PdlTrace& t);
#if defined(VXQ_CUDA_TRACE) && defined(__CUDACC__)
namespace {
__constant__ PdlTrace c_pdl_trace;
[[maybe_unused]] const bool pdl_trace_registered = (pdl_trace_register([](const PdlTrace& t) {
                                                        VXQ_CUDA_CHECK(cudaMemcpyToSymbol(c_pdl_trace, &t, sizeof t));
                                                    }),
                                                    true);
}  // namespace
#endif

#if defined(VXQ_CUDA_TRACE) && defined(__CUDA_ARCH__)
// A stamp by the first thread of the first block (trace builds).
__device__ __forceinline__ void pdl_trace_stamp(unsigned g0, unsigned g1, unsigned g2, unsigned threads) {
    if ((threadIdx.x | threadIdx.y | blockIdx.x | blockIdx.y | blockIdx.z) == 0 && c_pdl_trace.stamps) {
        unsigned long long now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now) :: "memory");
        const unsigned i = atomicAdd(c_pdl_trace.count, 1u);
        if (i < c_pdl_trace.cap) c_pdl_trace.stamps[i] = PdlStamp{now, {g0, g1, g2}, threads};
    }
}
#endif

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#if defined(VXQ_CUDA_TRACE) && defined(__CUDA_ARCH__)
    pdl_trace_stamp(gridDim.x, gridDim.y, gridDim.z, blockDim.x);
#endif
}

// Trace builds: a stamp inside a kernel (the first block's first thread reaching it), `tag` > 0,
// which the timeline prints as "mark TAG": it splits the kernel's time into phases. No-op otherwise.
__device__ __forceinline__ void pdl_trace_mark([[maybe_unused]] unsigned tag) {
#if defined(VXQ_CUDA_TRACE) && defined(__CUDA_ARCH__)
    pdl_trace_stamp(tag, 0, 0, 0);
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
// The most dynamic shared memory a block may opt in to on the current device (read once per device).
int smem_optin();
// The dynamic shared memory each of two blocks on one SM may take on the current device: half the
// SM's, less the runtime's reserve per block (read once per device).
int smem_half_sm();

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

// A setting made per GPU, as a kernel's attributes are (cudaFuncSetAttribute acts on the calling
// thread's device): each GPU of a tensor-parallel group makes its own. A static per kernel or
// call site; thread-safe (the group's ranks launch from threads of their own).
constexpr int kMaxDevices = 64;
struct PerDevice {
    std::mutex mu;
    size_t value[kMaxDevices] = {};  // 0: not set on that device
};

// The calling thread's device (cudaGetDevice).
int current_device();

// Runs set() once per device for this call site.
template <class F>
void once_per_device(PerDevice& done, F&& set) {
    const int dev = current_device();
    std::lock_guard lock(done.mu);
    if (done.value[dev]) return;
    set();
    done.value[dev] = 1;
}

// Sets a kernel's dynamic shared memory limit where it needs more than the default 48 KB
// (`configured`: what was set on each device so far).
template <class Kernel>
void allow_smem(Kernel kernel, size_t smem, PerDevice& configured) {
    if (smem <= 48 * 1024) return;
    const int dev = current_device();
    std::lock_guard lock(configured.mu);
    if (smem > configured.value[dev]) {
        VXQ_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        configured.value[dev] = smem;
    }
}

}  // namespace vxq::cuda

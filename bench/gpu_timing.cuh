// What the GPU benchmarks share: kernel timing with CUDA events (median of kGpuRepeats runs of
// back-to-back calls) and the device-to-device copy bandwidth they report against.
#pragma once

#include <algorithm>
#include <vector>

#include <cuda_runtime.h>

#include "kernels/cuda/check.cuh"

namespace vxq::bench {

constexpr int kGpuRepeats = 7;  // timed repetitions; the median is reported

inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Milliseconds per call of f (enqueued on `st`), median over kGpuRepeats runs of `calls` calls.
template <class F>
double time_calls(cudaStream_t st, int calls, F&& f) {
    cudaEvent_t a, b;
    VXQ_CUDA_CHECK(cudaEventCreate(&a));
    VXQ_CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 5; ++i) f(i);  // warm-up (and lazy module loading)
    VXQ_CUDA_CHECK(cudaStreamSynchronize(st));
    std::vector<double> ms;
    for (int r = 0; r < kGpuRepeats; ++r) {
        VXQ_CUDA_CHECK(cudaEventRecord(a, st));
        for (int i = 0; i < calls; ++i) f(i);
        VXQ_CUDA_CHECK(cudaEventRecord(b, st));
        VXQ_CUDA_CHECK(cudaEventSynchronize(b));
        float t = 0;
        VXQ_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
        ms.push_back(double(t) / calls);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return median(ms);
}

// GB/s of a 2 GiB device-to-device copy (bytes read + bytes written per call).
inline double copy_bandwidth_gbs(cudaStream_t st) {
    const size_t bytes = size_t(2) << 30;
    void *src, *dst;
    VXQ_CUDA_CHECK(cudaMalloc(&src, bytes));
    VXQ_CUDA_CHECK(cudaMalloc(&dst, bytes));
    VXQ_CUDA_CHECK(cudaMemset(src, 0x5a, bytes));
    const double ms = time_calls(st, 20, [&](int) {
        VXQ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
    });
    VXQ_CUDA_CHECK(cudaFree(src));
    VXQ_CUDA_CHECK(cudaFree(dst));
    return 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
}

}  // namespace vxq::bench

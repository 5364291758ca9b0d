// What the GPU benchmarks share: kernel timing with CUDA events (median of kGpuRepeats runs of
// back-to-back calls) and the device-to-device copy bandwidth they report against.
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "kernels/cuda/check.cuh"

namespace vxq::bench {

constexpr int kGpuRepeats = 7;  // timed repetitions; the median is reported, with min and max

inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Milliseconds per call over kGpuRepeats repetitions.
struct Timing {
    double median, min, max;
};

// Interleaved arms (MEASURE.md): f(arm, i) enqueues call i of arm `arm` on `st`. Each of
// kGpuRepeats rounds times `calls` back-to-back calls of every arm in turn (A B C A B C ...), so
// drift and clock changes hit every arm alike. Returns each arm's timing per call.
template <class F>
std::vector<Timing> time_interleaved(cudaStream_t st, int calls, int arms, F&& f) {
    cudaEvent_t a, b;
    VXQ_CUDA_CHECK(cudaEventCreate(&a));
    VXQ_CUDA_CHECK(cudaEventCreate(&b));
    for (int arm = 0; arm < arms; ++arm) {
        for (int i = 0; i < 5; ++i) f(arm, i);  // warm-up (and lazy module loading)
    }
    VXQ_CUDA_CHECK(cudaStreamSynchronize(st));
    std::vector<std::vector<double>> ms(static_cast<size_t>(arms));
    for (int r = 0; r < kGpuRepeats; ++r) {
        for (int arm = 0; arm < arms; ++arm) {
            VXQ_CUDA_CHECK(cudaEventRecord(a, st));
            for (int i = 0; i < calls; ++i) f(arm, i);
            VXQ_CUDA_CHECK(cudaEventRecord(b, st));
            VXQ_CUDA_CHECK(cudaEventSynchronize(b));
            float t = 0;
            VXQ_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
            ms[size_t(arm)].push_back(double(t) / calls);
        }
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::vector<Timing> out;
    for (const auto& m : ms) out.push_back({median(m), *std::min_element(m.begin(), m.end()), *std::max_element(m.begin(), m.end())});
    return out;
}

// The same calls two ways, alternating per repetition: enqueued one by one (the host's launch
// cost and the GPU's gap between kernels included), and captured once into a CUDA graph that is
// replayed (as the engine runs a step's kernels: no host launch cost, PDL edges kept). f(i)
// enqueues call i on `st`. Returns milliseconds per call: {one by one, graph}.
template <class F>
std::pair<Timing, Timing> time_plain_and_graph(cudaStream_t st, int calls, F&& f) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    VXQ_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; ++i) f(i);
    VXQ_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
    VXQ_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    const std::vector<Timing> t = time_interleaved(st, 1, 2, [&](int arm, int) {
        if (arm == 1) {
            VXQ_CUDA_CHECK(cudaGraphLaunch(exec, st));
        } else {
            for (int i = 0; i < calls; ++i) f(i);
        }
    });
    VXQ_CUDA_CHECK(cudaGraphExecDestroy(exec));
    VXQ_CUDA_CHECK(cudaGraphDestroy(graph));
    const auto per_call = [&](const Timing& x) { return Timing{x.median / calls, x.min / calls, x.max / calls}; };
    return {per_call(t[0]), per_call(t[1])};
}

// Milliseconds per call of f (enqueued on `st`): the median of one arm.
template <class F>
double time_calls(cudaStream_t st, int calls, F&& f) {
    return time_interleaved(st, calls, 1, [&](int, int i) { f(i); })[0].median;
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

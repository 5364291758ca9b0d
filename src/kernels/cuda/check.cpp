#include "kernels/cuda/check.cuh"

#include "kernels/cuda/cublas_api.h"
#include "kernels/cuda/launch.cuh"

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace vxq::cuda {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
    // A failed runtime call also leaves its status as the thread's last error (unless the context
    // is lost): take it, so the next launch check reports its own status, not this one.
    (void)cudaGetLastError();
    fail("CUDA error at {}:{}: {} ({})", file, line, call, cudaGetErrorString(status));
}

void throw_cublas_error(int status, const char* call, const char* file, int line) {
    fail("cuBLAS error at {}:{}: {} ({})", file, line, call, cublas_api().status_string(static_cast<cublasStatus_t>(status)));
}

bool pdl_enabled() {
    static const bool on = [] {
        const char* v = std::getenv("VXQ_CUDA_PDL");
        return !(v && std::string_view(v) == "0");
    }();
    return on;
}

namespace {
std::vector<void (*)(const PdlTrace&)>& pdl_trace_binders() {
    static std::vector<void (*)(const PdlTrace&)> v;
    return v;
}
}  // namespace

void pdl_trace_register(void (*bind)(const PdlTrace&)) { pdl_trace_binders().push_back(bind); }

void pdl_trace_bind(const PdlTrace& t) {
    for (auto* bind : pdl_trace_binders()) bind(t);
}

int current_device() {
    int dev = 0;
    VXQ_CUDA_CHECK(cudaGetDevice(&dev));
    VXQ_ASSERT(dev >= 0 && dev < kMaxDevices);
    return dev;
}

namespace {
// An attribute of the calling thread's device, asked once per device (`seen`: the answers so far).
int device_attribute_once(PerDevice& seen, cudaDeviceAttr attr) {
    const int dev = current_device();
    std::lock_guard lock(seen.mu);
    if (!seen.value[dev]) {
        int n = 0;
        VXQ_CUDA_CHECK(cudaDeviceGetAttribute(&n, attr, dev));
        seen.value[dev] = size_t(n);
    }
    return int(seen.value[dev]);
}
}  // namespace

int sm_count() {
    static PerDevice count;
    return device_attribute_once(count, cudaDevAttrMultiProcessorCount);
}

int smem_optin() {
    static PerDevice bytes;
    return device_attribute_once(bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin);
}

int smem_half_sm() {
    static PerDevice sm, reserved;
    const int half = device_attribute_once(sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor) / 2 -
                     device_attribute_once(reserved, cudaDevAttrReservedSharedMemoryPerBlock);
    return std::min(half, smem_optin());
}

}  // namespace vxq::cuda

// make_backend's registry: the backends this build has. A new backend is one row here plus its
// folder beside kernels/cpu. The CUDA row exists in builds configured with VXQ_CUDA=ON.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backend/backend.h"
#include "core/error.h"
#include "kernels/cpu/backend_cpu.h"
#if VXQ_HAVE_CUDA
#include "kernels/cuda/backend_cuda.h"
#endif

namespace vxq {

namespace {

struct BackendEntry {
    const char* name;
    std::unique_ptr<Backend> (*make)(int n_threads);
};

constexpr BackendEntry kBackends[] = {
    {"cpu", cpu::make_backend},
#if VXQ_HAVE_CUDA
    {"cuda", cuda::make_backend},
#endif
};

const BackendEntry* find_backend(const std::string& name) {
    for (const BackendEntry& e : kBackends) {
        if (name == e.name) return &e;
    }
    return nullptr;
}

}  // namespace

std::vector<std::string> backend_names() {
    std::vector<std::string> names;
    for (const BackendEntry& e : kBackends) names.emplace_back(e.name);
    return names;
}

void check_backend_name(const std::string& name) {
    if (find_backend(name)) return;
    if (name == "cuda") fail("this build has no CUDA backend (configured with VXQ_CUDA=OFF or without nvcc)");
    fail("unknown device '{}' (this build has: {})", name, fmt::join(backend_names(), ", "));
}

std::unique_ptr<Backend> make_backend(const std::string& name, int n_threads) {
    check_backend_name(name);
    return find_backend(name)->make(n_threads);
}

}  // namespace vxq

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
    std::vector<std::unique_ptr<Backend>> (*make_group)(int n_threads, int size);  // tensor parallelism
};

constexpr BackendEntry kBackends[] = {
    {"cpu", cpu::make_backend, cpu::make_backend_group},
#if VXQ_HAVE_CUDA
    {"cuda", cuda::make_backend, cuda::make_backend_group},
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

std::vector<std::unique_ptr<Backend>> make_backend_group(const std::string& name, int n_threads, int size) {
    check_backend_name(name);
    if (size < 1) fail("--tp must be at least 1, got {}", size);
    if (size == 1) {
        std::vector<std::unique_ptr<Backend>> one;
        one.push_back(make_backend(name, n_threads));
        return one;
    }
    return find_backend(name)->make_group(n_threads, size);
}

}  // namespace vxq

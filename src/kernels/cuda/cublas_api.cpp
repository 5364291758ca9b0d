#include "kernels/cuda/cublas_api.h"

#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace vxq::cuda {

namespace {

template <class F>
void load(void* lib, const char* name, F& fn) {
    fn = reinterpret_cast<F>(dlsym(lib, name));
    if (!fn) fail("cuBLAS library has no {} ({})", name, dlerror());
}

CublasApi open_cublas() {
    const std::string tried[] = {"libcublas.so." + std::to_string(CUBLAS_VER_MAJOR),
                                 std::string(VXQ_CUDA_LIBRARY_DIR) + "/libcublas.so." + std::to_string(CUBLAS_VER_MAJOR)};
    void* lib = nullptr;
    std::string why;
    for (const std::string& path : tried) {
        lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (lib) break;
        why += (why.empty() ? "" : "; ") + std::string(dlerror());
    }
    if (!lib) fail("cannot load cuBLAS for the CUDA backend's GEMMs: {}", why);
    CublasApi api{};
    load(lib, "cublasCreate_v2", api.create);
    load(lib, "cublasDestroy_v2", api.destroy);
    load(lib, "cublasSetStream_v2", api.set_stream);
    load(lib, "cublasSetWorkspace_v2", api.set_workspace);
    load(lib, "cublasSetMathMode", api.set_math_mode);
    load(lib, "cublasGemmEx", api.gemm_ex);
    load(lib, "cublasGemmBatchedEx", api.gemm_batched_ex);
    load(lib, "cublasGetStatusString", api.status_string);
    return api;  // the library stays loaded for the process's life
}

}  // namespace

const CublasApi& cublas_api() {
    static const CublasApi api = open_cublas();
    return api;
}

}  // namespace vxq::cuda

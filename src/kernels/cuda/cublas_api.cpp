#include "kernels/cuda/cublas_api.h"

#include <string>

#include "kernels/cuda/dl_library.h"

namespace vxq::cuda {

namespace {

constexpr const char* kCublas = "cuBLAS";

CublasApi open_cublas() {
    void* lib = open_toolkit_library("libcublas.so." + std::to_string(CUBLAS_VER_MAJOR), "cuBLAS for the CUDA backend's GEMMs");
    CublasApi api{};
    load_symbol(lib, "cublasCreate_v2", api.create, kCublas);
    load_symbol(lib, "cublasDestroy_v2", api.destroy, kCublas);
    load_symbol(lib, "cublasSetStream_v2", api.set_stream, kCublas);
    load_symbol(lib, "cublasSetWorkspace_v2", api.set_workspace, kCublas);
    load_symbol(lib, "cublasSetMathMode", api.set_math_mode, kCublas);
    load_symbol(lib, "cublasGemmEx", api.gemm_ex, kCublas);
    load_symbol(lib, "cublasGemmBatchedEx", api.gemm_batched_ex, kCublas);
    load_symbol(lib, "cublasGetStatusString", api.status_string, kCublas);
    return api;  // the library stays loaded for the process's life
}

}  // namespace

const CublasApi& cublas_api() {
    static const CublasApi api = open_cublas();
    return api;
}

}  // namespace vxq::cuda

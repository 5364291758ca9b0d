// cuBLAS, loaded at run time (dlopen) the first time the CUDA backend needs a GEMM. Linking it
// would make every vxq process, CPU runs included, map libcublasLt (~0.1 s and ~200 MB of peak
// RSS at start-up, measured), so the binary names no cuBLAS library: the CUDA backend loads it
// (libcublas.so.13 on the library path, else the toolkit's folder of the build) and a missing one
// is a vxq::Error naming what was tried. Types and enums come from cublas_v2.h (header only).
#pragma once

#include <cublas_v2.h>

namespace vxq::cuda {

struct CublasApi {
    decltype(&cublasCreate) create;
    decltype(&cublasDestroy) destroy;
    decltype(&cublasSetStream) set_stream;
    decltype(&cublasSetWorkspace) set_workspace;
    decltype(&cublasSetMathMode) set_math_mode;
    // The C entry point (C++ also sees an inline overload taking the compute type as cudaDataType).
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                              const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                              cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
    // The same for cublasGemmBatchedEx (the attention's per-head GEMMs: arrays of device pointers).
    cublasStatus_t (*gemm_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                      const void* const[], cudaDataType, int, const void* const[], cudaDataType, int,
                                      const void*, void* const[], cudaDataType, int, int, cublasComputeType_t,
                                      cublasGemmAlgo_t);
    decltype(&cublasGetStatusString) status_string;
};

// The loaded library (loaded once, on first call; thread-safe); vxq::Error if it cannot be.
const CublasApi& cublas_api();

}  // namespace vxq::cuda

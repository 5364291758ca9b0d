// Every CUDA runtime call goes through VXQ_CUDA_CHECK: a failure is a vxq::Error naming the call,
// the file and line, and CUDA's own message (never an abort, never an ignored status).
#pragma once

#include <cuda_runtime.h>

namespace vxq::cuda {
// Throws the vxq::Error. Defined in check.cpp: nvcc's host pass cannot compile the fmt headers
// (core/error.h), so no .cu file includes them; .cu files report through this.
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);
// The same for a cuBLAS call (status: its cublasStatus_t), with cuBLAS's name for the status.
[[noreturn]] void throw_cublas_error(int status, const char* call, const char* file, int line);
}  // namespace vxq::cuda

#define VXQ_CUDA_CHECK(call)                                                                   \
    do {                                                                                       \
        const cudaError_t vxq_cuda_status_ = (call);                                           \
        if (vxq_cuda_status_ != cudaSuccess) {                                                 \
            ::vxq::cuda::throw_cuda_error(vxq_cuda_status_, #call, __FILE__, __LINE__);        \
        }                                                                                      \
    } while (0)

// After a kernel launch: a bad configuration shows up here, a fault inside the kernel at the
// next synchronizing call.
#define VXQ_CUDA_CHECK_LAUNCH() VXQ_CUDA_CHECK(cudaGetLastError())

// The same for a cuBLAS call (call: an expression of type cublasStatus_t). gemv.cu defines the
// same macro, token for token (a permitted redefinition).
#define VXQ_CUBLAS_CHECK(call)                                                                 \
    do {                                                                                       \
        const cublasStatus_t vxq_cublas_status_ = (call);                                      \
        if (vxq_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                     \
            ::vxq::cuda::throw_cublas_error(int(vxq_cublas_status_), #call, __FILE__, __LINE__); \
        }                                                                                      \
    } while (0)

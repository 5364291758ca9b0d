#include "kernels/cuda/check.cuh"

#include "core/error.h"

namespace vxq::cuda {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
    fail("CUDA error at {}:{}: {} ({})", file, line, call, cudaGetErrorString(status));
}

}  // namespace vxq::cuda

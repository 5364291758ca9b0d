// NCCL, loaded at run time (dlopen) by the first tensor-parallel CUDA group (--tp N, N > 1):
// libnccl is ~220 MB, and only such a run needs it, so the binary names no NCCL library, as it
// names no cuBLAS (cublas_api.h). Types come from nccl.h (header only); built where the header was
// found (VXQ_HAVE_NCCL, CMakeLists.txt says which at configure time).
#pragma once

#if VXQ_HAVE_NCCL
#include <nccl.h>

namespace vxq::cuda {

struct NcclApi {
    decltype(&ncclGetVersion) get_version;
    decltype(&ncclCommInitAll) comm_init_all;
    decltype(&ncclCommDestroy) comm_destroy;
    decltype(&ncclCommAbort) comm_abort;
    decltype(&ncclAllReduce) all_reduce;
    decltype(&ncclSend) send;
    decltype(&ncclRecv) recv;
    decltype(&ncclGroupStart) group_start;
    decltype(&ncclGroupEnd) group_end;
    decltype(&ncclGetErrorString) error_string;
};

// The loaded library (loaded once, on first call; thread-safe); vxq::Error naming what was tried.
const NcclApi& nccl_api();

// vxq::Error "NCCL: <what>: <NCCL's message>" unless r is ncclSuccess.
void nccl_check(ncclResult_t r, const char* what);

}  // namespace vxq::cuda
#endif

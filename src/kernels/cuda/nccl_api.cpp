#include "kernels/cuda/nccl_api.h"

#if VXQ_HAVE_NCCL
#include <string>

#include "core/error.h"
#include "kernels/cuda/dl_library.h"

namespace vxq::cuda {

namespace {

constexpr const char* kNccl = "NCCL";

NcclApi open_nccl() {
    void* lib = open_toolkit_library("libnccl.so." + std::to_string(NCCL_MAJOR), "NCCL for tensor parallelism");
    NcclApi api{};
    load_symbol(lib, "ncclGetVersion", api.get_version, kNccl);
    load_symbol(lib, "ncclCommInitAll", api.comm_init_all, kNccl);
    load_symbol(lib, "ncclCommDestroy", api.comm_destroy, kNccl);
    load_symbol(lib, "ncclCommAbort", api.comm_abort, kNccl);
    load_symbol(lib, "ncclAllReduce", api.all_reduce, kNccl);
    load_symbol(lib, "ncclSend", api.send, kNccl);
    load_symbol(lib, "ncclRecv", api.recv, kNccl);
    load_symbol(lib, "ncclGroupStart", api.group_start, kNccl);
    load_symbol(lib, "ncclGroupEnd", api.group_end, kNccl);
    load_symbol(lib, "ncclGetErrorString", api.error_string, kNccl);
    return api;  // the library stays loaded for the process's life
}

}  // namespace

const NcclApi& nccl_api() {
    static const NcclApi api = open_nccl();
    return api;
}

void nccl_check(ncclResult_t r, const char* what) {
    if (r != ncclSuccess) fail("NCCL: {}: {}", what, nccl_api().error_string(r));
}

}  // namespace vxq::cuda
#endif

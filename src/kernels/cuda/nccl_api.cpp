#include "kernels/cuda/nccl_api.h"

#if VXQ_HAVE_NCCL
#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace vxq::cuda {

namespace {

template <class F>
void load(void* lib, const char* name, F& fn) {
    fn = reinterpret_cast<F>(dlsym(lib, name));
    if (!fn) fail("NCCL library has no {} ({})", name, dlerror());
}

NcclApi open_nccl() {
    const std::string so = "libnccl.so." + std::to_string(NCCL_MAJOR);
    const std::string tried[] = {so, std::string(VXQ_CUDA_LIBRARY_DIR) + "/" + so};
    void* lib = nullptr;
    std::string why;
    for (const std::string& path : tried) {
        lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (lib) break;
        why += (why.empty() ? "" : "; ") + std::string(dlerror());
    }
    if (!lib) fail("cannot load NCCL for tensor parallelism: {}", why);
    NcclApi api{};
    load(lib, "ncclGetVersion", api.get_version);
    load(lib, "ncclCommInitAll", api.comm_init_all);
    load(lib, "ncclCommDestroy", api.comm_destroy);
    load(lib, "ncclCommAbort", api.comm_abort);
    load(lib, "ncclAllReduce", api.all_reduce);
    load(lib, "ncclSend", api.send);
    load(lib, "ncclRecv", api.recv);
    load(lib, "ncclGroupStart", api.group_start);
    load(lib, "ncclGroupEnd", api.group_end);
    load(lib, "ncclGetErrorString", api.error_string);
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

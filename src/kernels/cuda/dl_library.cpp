#include "kernels/cuda/dl_library.h"

namespace vxq::cuda {

void* open_toolkit_library(const std::string& soname, const char* what) {
    const std::string tried[] = {soname, std::string(VXQ_CUDA_LIBRARY_DIR) + "/" + soname};
    std::string why;
    for (const std::string& path : tried) {
        if (void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return lib;
        why += (why.empty() ? "" : "; ") + std::string(dlerror());
    }
    fail("cannot load {}: {}", what, why);
}

}  // namespace vxq::cuda

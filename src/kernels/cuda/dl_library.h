// A shared library of the CUDA toolkit opened at run time (dlopen): cuBLAS (cublas_api.h) and
// NCCL (nccl_api.h), which only some runs need and which would otherwise be mapped by every vxq
// process. The library stays loaded for the process's life.
#pragma once

#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace vxq::cuda {

// `soname` from the library path, else from the toolkit's library folder of the build;
// vxq::Error "cannot load <what>: <each attempt's error>".
void* open_toolkit_library(const std::string& soname, const char* what);

// fn = the library's symbol `name`; vxq::Error naming `what` and the symbol if it has none.
template <class F>
void load_symbol(void* lib, const char* name, F& fn, const char* what) {
    fn = reinterpret_cast<F>(dlsym(lib, name));
    if (!fn) fail("{} library has no {} ({})", what, name, dlerror());
}

}  // namespace vxq::cuda

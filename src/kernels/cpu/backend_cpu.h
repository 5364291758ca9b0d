// The CPU backend (backend_cpu.cpp); reached through make_backend("cpu", n) (kernels/backends.cpp).
#pragma once

#include <memory>

#include "backend/backend.h"

namespace vxq::cpu {

std::unique_ptr<Backend> make_backend(int n_threads);

}  // namespace vxq::cpu

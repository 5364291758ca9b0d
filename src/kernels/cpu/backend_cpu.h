// The CPU backend (backend_cpu.cpp); reached through make_backend("cpu", n) (kernels/backends.cpp).
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"

namespace vxq::cpu {

std::unique_ptr<Backend> make_backend(int n_threads);
// make_backend_group("cpu", ...): `size` ranks sharing n_threads, joined by a HostGroup.
std::vector<std::unique_ptr<Backend>> make_backend_group(int n_threads, int size);

}  // namespace vxq::cpu

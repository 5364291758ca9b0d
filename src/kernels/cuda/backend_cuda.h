// The CUDA backend (kernels/cuda): the Backend ops on one NVIDIA GPU. Plain C++ header, so
// kernels/backends.cpp can register it without a CUDA compiler seeing that file.
//
// Memory: activation buffers are device memory; weights (WeightView, from the mapped file) are
// uploaded on first use and kept, keyed by their host data pointer, so the host data must stay
// unchanged while the backend lives (true of a mapped model file). Norm weights and biases are
// uploaded the same way, re-uploaded if their host contents change. Any op argument that is not
// one of this backend's activation buffers is host memory and is copied in (and, for outputs,
// back) on the calling thread: that is how the caller's logits buffer and token ids travel.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"

namespace vxq::cuda {

// vxq::Error "no CUDA device ..." where the machine has no usable GPU; n_threads is unused.
std::unique_ptr<Backend> make_backend(int n_threads);
// make_backend_group("cuda", ...): GPUs 0 .. size-1, rank r on GPU r, joined by NCCL
// communicators (ncclCommInitAll: one process drives every GPU, a host thread each). A group of
// 1 (not what make_backend_group("cuda", n, 1) makes) still has a communicator: the tests run the
// NCCL path on one GPU with it.
std::vector<std::unique_ptr<Backend>> make_backend_group(int n_threads, int size);

}  // namespace vxq::cuda

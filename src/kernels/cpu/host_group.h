// The CPU backend's tensor-parallel group (make_backend_group("cpu", ...)): the ranks are host
// threads of one process sharing memory, and the collectives are a barrier and a sum in rank
// order. It is the reference the tests and CI run tensor parallelism with on machines without
// GPUs; the CUDA backend's group uses NCCL (backend_cuda.cpp).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

namespace vxq::cpu {

class HostGroup {
public:
    explicit HostGroup(int size);
    int size() const { return size_; }

    // Each rank's recv (n floats) becomes send_0 + send_1 + ... + send_{size-1}, summed in that
    // order, so every rank holds the same bits (send == recv: in place).
    void all_reduce_sum(int rank, const float* send, float* recv, int64_t n);
    // Backend::gather_columns: rank 0's out gets every rank's block x [n_rows, widths[r]].
    void gather_columns(int rank, const float* x, int64_t n_rows, std::span<const int64_t> widths, float* out);
    // A rank failed: every wait in progress or to come throws instead of waiting for it.
    void abort();

private:
    void wait_all();  // a barrier of all ranks; vxq::Error after abort()

    const int size_;
    std::mutex mu_;
    std::condition_variable cv_;
    int arrived_ = 0;
    uint64_t generation_ = 0;
    bool aborted_ = false;
    std::vector<const float*> in_;          // by rank, during a collective
    std::vector<std::vector<float>> sums_;  // by rank
};

}  // namespace vxq::cpu

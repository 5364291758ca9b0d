#include "kernels/cpu/host_group.h"

#include <cstring>

#include "core/error.h"

namespace vxq::cpu {

HostGroup::HostGroup(int size) : size_(size), in_(size_t(size)), sums_(size_t(size)) { VXQ_ASSERT(size >= 1); }

void HostGroup::wait_all() {
    std::unique_lock lock(mu_);
    if (aborted_) fail("tensor parallelism: another rank failed");
    const uint64_t gen = generation_;
    if (++arrived_ == size_) {
        arrived_ = 0;
        ++generation_;
        cv_.notify_all();
        return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
    if (generation_ == gen) fail("tensor parallelism: another rank failed");
}

void HostGroup::abort() {
    std::lock_guard lock(mu_);
    aborted_ = true;
    cv_.notify_all();
}

void HostGroup::all_reduce_sum(int rank, const float* send, float* recv, int64_t n) {
    in_[size_t(rank)] = send;
    wait_all();  // every rank's x is in
    std::vector<float>& s = sums_[size_t(rank)];
    s.assign(in_[0], in_[0] + n);
    for (int r = 1; r < size_; ++r) {
        const float* y = in_[size_t(r)];
        for (int64_t i = 0; i < n; ++i) s[size_t(i)] += y[i];
    }
    wait_all();  // nobody reads another rank's send any more
    std::memcpy(recv, s.data(), size_t(n) * sizeof(float));
}

void HostGroup::gather_columns(int rank, const float* x, int64_t n_rows, std::span<const int64_t> widths, float* out) {
    VXQ_ASSERT(int(widths.size()) == size_ && (rank == 0) == (out != nullptr));
    in_[size_t(rank)] = x;
    wait_all();
    if (rank == 0) {
        int64_t total = 0;
        for (const int64_t w : widths) total += w;
        int64_t col = 0;
        for (int r = 0; r < size_; ++r) {
            const int64_t w = widths[size_t(r)];
            for (int64_t i = 0; i < n_rows; ++i) {
                std::memcpy(out + i * total + col, in_[size_t(r)] + i * w, size_t(w) * sizeof(float));
            }
            col += w;
        }
    }
    wait_all();  // the other ranks' blocks stay until rank 0 has copied them
}

}  // namespace vxq::cpu

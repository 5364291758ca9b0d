#include "core/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#define VXQ_CPU_RELAX() _mm_pause()
#else
#define VXQ_CPU_RELAX() std::this_thread::yield()
#endif

namespace vxq {

namespace {
// Spin briefly (a decode step's jobs arrive microseconds apart), then yield the core (another
// process may need it: on an oversubscribed machine pure spinning starves the thread we wait
// for), then sleep.
constexpr int kSpinIterations = 1 << 11;
constexpr int kYieldIterations = 1 << 8;
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
    for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard lock(mu_);
        stop_.store(true);
        generation_.fetch_add(1);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
    uint64_t seen = 0;
    for (;;) {
        int spins = 0;
        while (generation_.load(std::memory_order_acquire) == seen) {
            if (++spins < kSpinIterations) {
                VXQ_CPU_RELAX();
                continue;
            }
            if (spins < kSpinIterations + kYieldIterations) {
                std::this_thread::yield();
                continue;
            }
            std::unique_lock lock(mu_);
            cv_.wait(lock, [&] { return generation_.load() != seen; });
        }
        seen = generation_.load(std::memory_order_acquire);
        if (stop_.load()) return;
        (*job_)(index, n_threads_);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
    if (n_threads_ == 1) {
        fn(0, 1);
        return;
    }
    job_ = &fn;
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    {
        std::lock_guard lock(mu_);  // pairs with the sleeping workers' predicate check
        generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    fn(0, n_threads_);
    for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
        if (spins < kSpinIterations) {
            VXQ_CPU_RELAX();
        } else {
            std::this_thread::yield();
        }
    }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    const int workers = int(std::min<int64_t>(n_threads_, n));
    run([&](int i, int) {
        if (i >= workers) return;
        const int64_t begin = n * i / workers;
        const int64_t end = n * (i + 1) / workers;
        if (begin < end) fn(begin, end);
    });
}

}  // namespace vxq

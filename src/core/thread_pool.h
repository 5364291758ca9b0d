// A fixed pool of worker threads for data-parallel loops. The calling thread takes part as
// worker 0, so ThreadPool(1) runs everything inline with no synchronization. Workers spin for a
// short while between jobs before sleeping: a decode step issues ~100 small jobs per token and a
// condition-variable wake-up per job would cost more than the work.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace vxq {

class ThreadPool {
public:
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }

    // Calls fn(thread_index, n_threads) once on every worker and waits for all of them.
    void run(const std::function<void(int, int)>& fn);

    // Splits [0, n) into contiguous chunks, one per worker; fn(begin, end) per non-empty chunk.
    void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

private:
    void worker_loop(int index);

    int n_threads_;
    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable cv_;
    const std::function<void(int, int)>* job_ = nullptr;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> pending_{0};
    std::atomic<bool> stop_{false};
};

}  // namespace vxq

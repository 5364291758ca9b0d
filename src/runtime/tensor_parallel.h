// Tensor parallelism at run time: one process drives a group of backends (make_backend_group),
// one host thread per rank, each rank with its slice of the model (model/tensor_parallel.h says
// who owns what). A TpRunner is a KV cache on every rank (each rank's cache holds its own KV
// heads in its backend's memory; every codec, its per-layer state and eviction act per KV head, so
// a rank's cache is the same cache with fewer heads) and runs Model::forward on every rank's
// thread at once; the ranks meet in the backend's collectives (NCCL on the CUDA backend) and rank
// 0 returns the logits. Several runners may share a group (a benchmark's KV methods side by side
// on one copy of the weights).
//
// Why one process: a decode step has two all-reduces per layer and one gather, so the ranks
// stay in lockstep anyway; one process keeps the CLI, the tokenizer, sampling and the memory
// check in one place, and NCCL's single-process setup (ncclCommInitAll) needs no rendezvous.
// Each rank's CUDA backend still records its own step and replays it as one CUDA graph with the
// collectives inside.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kv/kv_cache.h"
#include "model/model.h"
#include "runtime/runner.h"

namespace vxq {

class TpRunner;

class TpGroup {
public:
    // The backends (make_backend_group(device, n_threads, size)) and every rank's slice of the
    // model; vxq::Error naming what does not split.
    static std::unique_ptr<TpGroup> create(const std::string& model_path, const std::string& device, int n_threads, int size);
    ~TpGroup();  // runners made by it must be gone

    int ranks() const { return int(backends_.size()); }
    const Model& model() const { return *models_[0]; }  // rank 0's slice (the whole model's config())
    const Model& rank_model(int r) const { return *models_[size_t(r)]; }
    Backend& backend(int r) { return *backends_[size_t(r)]; }

    // A KV cache of n_ctx tokens on every rank and the runner over them (allocates nothing until
    // tokens arrive; check_fits before running).
    std::unique_ptr<TpRunner> make_runner(const KvSpec& spec, KvCacheOptions opts, int64_t n_ctx);
    // vxq::Error unless every rank's part of running these runners (alive at once) fits its
    // backend's memory; ranks that share one memory (the CPU group's host RAM) are added up.
    // `device` names the flag in the message. Returns the longest context the runners' caches
    // could hold on every rank (memory_check.h, longest_context; the smallest over the memories).
    int64_t check_fits(std::span<const TpRunner* const> runners, int64_t max_batch, int64_t logit_rows,
                       const std::string& device);

    // fn(rank) on every rank's thread; returns when all are done. A rank that throws makes every
    // backend abort its collectives (Backend::tp_abort), so the others fail instead of waiting;
    // the first error is rethrown here and the group refuses any later call.
    void run(const std::function<void(int)>& fn);

private:
    TpGroup() = default;
    void worker(int rank);

    std::vector<std::unique_ptr<Backend>> backends_;
    std::vector<std::unique_ptr<Model>> models_;

    std::vector<std::thread> threads_;
    std::mutex mu_;
    std::condition_variable cv_;
    const std::function<void(int)>* job_ = nullptr;
    uint64_t generation_ = 0;
    int running_ = 0;
    bool stop_ = false;
    bool broken_ = false;
    std::exception_ptr error_;
};

class TpRunner final : public Runner {
public:
    ~TpRunner() override;  // each rank's cache freed on its thread (a device backend's GPU)

    const KvCache& cache(int r) const { return *caches_[size_t(r)]; }
    TpGroup& group() { return g_; }

    const Model& model() const override { return g_.model(); }
    void forward(std::span<const TokenId> tokens, int64_t n_out, float* logits) override;
    void fill_kv(std::span<const TokenId> tokens) override;  // each rank its own heads' (no collective)
    void truncate(int64_t n) override;
    int64_t size() const override { return caches_[0]->size(); }
    int64_t n_ctx() const override { return caches_[0]->shape().n_ctx; }
    size_t kv_bytes() const override;
    float* output_buffer(size_t n) override;

private:
    friend class TpGroup;
    explicit TpRunner(TpGroup& g) : g_(g) {}

    TpGroup& g_;
    std::vector<std::unique_ptr<KvCache>> caches_;
};

}  // namespace vxq

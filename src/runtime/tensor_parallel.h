// Tensor parallelism at run time: one process drives a group of backends (make_backend_group),
// one host thread per rank, each rank with its slice of the model (model/tensor_parallel.h says
// who owns what) and a KV cache of its own KV heads in its backend's memory (every codec, its
// per-layer state and eviction act per KV head, so a rank's cache is the same cache with fewer
// heads). A forward pass runs Model::forward on every rank's thread at once; the ranks meet in
// the backend's collectives (NCCL on the CUDA backend) and rank 0 returns the logits.
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
#include <string>
#include <thread>
#include <vector>

#include "kv/kv_cache.h"
#include "model/model.h"
#include "runtime/runner.h"

namespace vxq {

struct TpGroupParams {
    std::string model_path;
    std::string device = "cpu";  // make_backend_group name
    int n_threads = 1;           // host threads, shared by the ranks (the CPU group's matmuls)
    int size = 2;                // ranks
    KvSpec spec;
    KvCacheOptions cache;        // memory: each rank's backend's, set by create()
    // The context from the model's config (e.g. -c or the model's training context).
    std::function<int64_t(const ModelConfig&)> context;
    int64_t max_batch = 1;       // the memory check's largest forward pass ...
    int64_t logit_rows = 1;      // ... and its logits rows
};

class TpGroup final : public Runner {
public:
    // Makes the group, loads every rank's slice and makes its cache, after checking that each
    // rank's part fits its backend's memory (ranks sharing one memory, the CPU group's host RAM,
    // are checked together). vxq::Error naming what does not split or does not fit.
    static std::unique_ptr<TpGroup> create(const TpGroupParams& p);
    ~TpGroup() override;

    int ranks() const { return int(backends_.size()); }
    const Model& rank_model(int r) const { return *models_[size_t(r)]; }
    Backend& backend(int r) { return *backends_[size_t(r)]; }
    const KvCache& cache(int r) const { return *caches_[size_t(r)]; }

    const Model& model() const override { return *models_[0]; }
    void forward(std::span<const TokenId> tokens, int64_t n_out, float* logits) override;
    void truncate(int64_t n) override;
    int64_t size() const override { return caches_[0]->size(); }
    int64_t n_ctx() const override { return caches_[0]->shape().n_ctx; }
    size_t kv_bytes() const override;
    float* output_buffer(size_t n) override { return backends_[0]->output_buffer(n); }

private:
    TpGroup() = default;
    // fn(rank) on every rank's thread; returns when all are done. A rank that throws makes every
    // backend abort its collectives (Backend::tp_abort), so the others fail instead of waiting;
    // the first error is rethrown here and the group refuses any later call.
    void run(const std::function<void(int)>& fn);
    void worker(int rank);

    std::vector<std::unique_ptr<Backend>> backends_;
    std::vector<std::unique_ptr<Model>> models_;
    std::vector<std::unique_ptr<KvCache>> caches_;

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

}  // namespace vxq

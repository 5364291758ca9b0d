#include "runtime/tensor_parallel.h"

#include <map>

#include "core/error.h"
#include "runtime/memory_check.h"

namespace vxq {

std::unique_ptr<TpGroup> TpGroup::create(const std::string& model_path, const std::string& device, int n_threads, int size) {
    std::unique_ptr<TpGroup> g(new TpGroup());
    g->backends_ = make_backend_group(device, n_threads, size);
    const int n = int(g->backends_.size());
    g->models_.resize(size_t(n));
    for (int r = 0; r < n; ++r) g->threads_.emplace_back([g = g.get(), r] { g->worker(r); });
    // Every rank maps the file and cuts its own slice (the row-parallel copies in parallel).
    g->run([&](int r) { g->models_[size_t(r)] = Model::load(model_path, device, TpRank{r, n}); });
    return g;
}

TpGroup::~TpGroup() {
    try {  // each backend on its own thread (a device backend's GPU)
        if (!broken_) run([&](int r) { backends_[size_t(r)].reset(); });
    } catch (...) {  // a destructor reports nothing
    }
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
}

std::unique_ptr<TpRunner> TpGroup::make_runner(const KvSpec& spec, KvCacheOptions opts, int64_t n_ctx) {
    std::unique_ptr<TpRunner> runner(new TpRunner(*this));
    runner->caches_.resize(backends_.size());
    run([&](int r) {
        const ModelConfig& c = models_[size_t(r)]->rank_config();
        KvCacheOptions o = opts;
        o.memory = backends_[size_t(r)]->kv_memory();  // where this rank's attention reads it
        runner->caches_[size_t(r)] = make_kv_cache(KvShape{c.n_layer, c.n_head, c.n_head_kv, c.head_dim, n_ctx}, spec, o);
    });
    return runner;
}

int64_t TpGroup::check_fits(std::span<const TpRunner* const> runners, int64_t max_batch, int64_t logit_rows,
                            const std::string& device) {
    struct Memory {
        MemoryNeed need;
        MemoryInfo info;
        std::vector<const KvCache*> caches;  // of every rank in this memory
    };
    std::map<std::string, Memory> by_memory;
    for (int r = 0; r < ranks(); ++r) {
        const Model* m[] = {models_[size_t(r)].get()};
        std::vector<const KvCache*> caches;
        int64_t n_ctx = 1;
        for (const TpRunner* run : runners) {
            caches.push_back(&run->cache(r));
            n_ctx = std::max(n_ctx, run->n_ctx());
        }
        const MemoryInfo info = backends_[size_t(r)]->memory_info();
        const MemoryNeed need = memory_need(*backends_[size_t(r)], m, caches, std::min(max_batch, n_ctx), std::min(logit_rows, n_ctx));
        auto [it, fresh] = by_memory.try_emplace(info.where, Memory{need, info, {}});
        Memory& mem = it->second;
        if (!fresh) {
            mem.need.weights += need.weights;
            mem.need.kv += need.kv;
            mem.need.activations += need.activations;
        }
        mem.caches.insert(mem.caches.end(), caches.begin(), caches.end());
    }
    int64_t longest = INT64_MAX;
    for (const auto& [where, mem] : by_memory) {
        vxq::check_fits(mem.need, mem.info, fmt::format("{} --tp {}", device, ranks()));
        longest = std::min(longest, longest_context(mem.need, mem.caches, mem.info.free));
    }
    return longest;
}

void TpGroup::worker(int rank) {
    uint64_t seen = 0;
    bool bound = false;
    for (;;) {
        const std::function<void(int)>* job = nullptr;
        {
            std::unique_lock lock(mu_);
            cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            job = job_;
        }
        try {
            if (!bound) {
                backends_[size_t(rank)]->bind_thread();
                bound = true;
            }
            (*job)(rank);
        } catch (...) {
            {
                std::lock_guard lock(mu_);
                if (!error_) error_ = std::current_exception();
                broken_ = true;
            }
            for (auto& be : backends_) {  // the others stop waiting for this rank in a collective
                if (be) be->tp_abort();
            }
        }
        std::lock_guard lock(mu_);
        if (--running_ == 0) cv_.notify_all();
    }
}

void TpGroup::run(const std::function<void(int)>& fn) {
    std::unique_lock lock(mu_);
    if (broken_) fail("tensor parallelism: an earlier failure left the group unusable");
    job_ = &fn;
    running_ = int(threads_.size());
    ++generation_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return running_ == 0; });
    if (error_) {
        std::exception_ptr e = error_;
        error_ = nullptr;
        std::rethrow_exception(e);
    }
}

TpRunner::~TpRunner() {
    try {
        g_.run([&](int r) { caches_[size_t(r)].reset(); });
    } catch (...) {  // a broken group: freed here instead
    }
}

void TpRunner::forward(std::span<const TokenId> tokens, int64_t n_out, float* logits) {
    g_.model().check_batch(tokens, size(), n_ctx());  // a refused batch leaves the group usable
    g_.run([&](int r) {
        g_.rank_model(r).forward(g_.backend(r), *caches_[size_t(r)], tokens, n_out, r == 0 ? logits : nullptr);
    });
}

void TpRunner::fill_kv(std::span<const TokenId> tokens) {
    g_.model().check_batch(tokens, size(), n_ctx());
    g_.run([&](int r) { g_.rank_model(r).fill_kv(g_.backend(r), *caches_[size_t(r)], tokens); });
}

void TpRunner::truncate(int64_t n) {
    g_.run([&](int r) { caches_[size_t(r)]->truncate(n); });
}

float* TpRunner::output_buffer(size_t n) {
    float* out = nullptr;  // made on rank 0's thread, where its backend's device is selected
    g_.run([&](int r) {
        if (r == 0) out = g_.backend(0).output_buffer(n);
    });
    return out;
}

size_t TpRunner::kv_bytes() const {
    size_t bytes = 0;
    for (const auto& c : caches_) bytes += c->resident_bytes();
    return bytes;
}

}  // namespace vxq

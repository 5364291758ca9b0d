#include "runtime/tensor_parallel.h"

#include <map>

#include "core/error.h"
#include "runtime/memory_check.h"

namespace vxq {

std::unique_ptr<TpGroup> TpGroup::create(const TpGroupParams& p) {
    std::unique_ptr<TpGroup> g(new TpGroup());
    g->backends_ = make_backend_group(p.device, p.n_threads, p.size);
    const int n = int(g->backends_.size());
    g->models_.resize(size_t(n));
    g->caches_.resize(size_t(n));
    for (int r = 0; r < n; ++r) g->threads_.emplace_back([g = g.get(), r] { g->worker(r); });
    // Every rank maps the file and cuts its own slice (the row-parallel copies in parallel).
    g->run([&](int r) { g->models_[size_t(r)] = Model::load(p.model_path, p.device, TpRank{r, n}); });
    const ModelConfig& full = g->models_[0]->config();
    const int64_t n_ctx = p.context(full);
    std::vector<KvShape> shapes;
    for (int r = 0; r < n; ++r) {
        const ModelConfig& c = g->models_[size_t(r)]->rank_config();
        shapes.push_back(KvShape{c.n_layer, c.n_head, c.n_head_kv, c.head_dim, n_ctx});
    }
    g->run([&](int r) {
        KvCacheOptions opts = p.cache;
        opts.memory = g->backends_[size_t(r)]->kv_memory();  // where this rank's attention reads it
        g->caches_[size_t(r)] = make_kv_cache(shapes[size_t(r)], p.spec, opts);  // allocates nothing until tokens arrive
    });
    // The memory check: ranks in one memory (the CPU group's host RAM) add up.
    std::map<std::string, std::pair<MemoryNeed, MemoryInfo>> by_memory;
    for (int r = 0; r < n; ++r) {
        const Model* m[] = {g->models_[size_t(r)].get()};
        const KvCache* c[] = {g->caches_[size_t(r)].get()};
        const MemoryInfo info = g->backends_[size_t(r)]->memory_info();
        const MemoryNeed need = memory_need(*g->backends_[size_t(r)], m, c, std::min(p.max_batch, n_ctx), std::min(p.logit_rows, n_ctx));
        auto [it, fresh] = by_memory.try_emplace(info.where, need, info);
        if (!fresh) {
            MemoryNeed& sum = it->second.first;
            sum.weights += need.weights;
            sum.kv += need.kv;
            sum.activations += need.activations;
        }
    }
    for (const auto& [where, need_info] : by_memory) {
        check_fits(need_info.first, need_info.second, fmt::format("{} --tp {}", p.device, n));
    }
    return g;
}

TpGroup::~TpGroup() {
    try {  // each rank's cache, then its backend, on its own thread (a device backend's GPU)
        if (!broken_) {
            run([&](int r) {
                caches_[size_t(r)].reset();
                backends_[size_t(r)].reset();
            });
        }
    } catch (...) {  // a destructor reports nothing
    }
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
    caches_.clear();
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

void TpGroup::forward(std::span<const TokenId> tokens, int64_t n_out, float* logits) {
    models_[0]->check_batch(tokens, size(), n_ctx());  // a refused batch leaves the group usable
    run([&](int r) { models_[size_t(r)]->forward(*backends_[size_t(r)], *caches_[size_t(r)], tokens, n_out, r == 0 ? logits : nullptr); });
}

void TpGroup::truncate(int64_t n) {
    run([&](int r) { caches_[size_t(r)]->truncate(n); });
}

size_t TpGroup::kv_bytes() const {
    size_t bytes = 0;
    for (const auto& c : caches_) bytes += c->resident_bytes();
    return bytes;
}

}  // namespace vxq

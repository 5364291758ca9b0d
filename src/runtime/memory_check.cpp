#include "runtime/memory_check.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "kv/kv_cache.h"
#include "model/model.h"

namespace vxq {

namespace {

double gib(size_t bytes) { return double(bytes) / double(size_t(1) << 30); }

}  // namespace

MemoryNeed memory_need(const Backend& be, std::span<const Model* const> models, std::span<const KvCache* const> caches,
                       int64_t max_batch, int64_t logit_rows) {
    MemoryNeed need;
    for (const Model* m : models) {
        if (be.copies_weights()) need.weights += m->weight_bytes(&be);
        const size_t logits = size_t(logit_rows * m->config().n_vocab) * sizeof(float);
        need.activations = std::max(need.activations, m->activation_bytes(max_batch) + logits);
    }
    for (const KvCache* c : caches) {
        need.kv += c->bytes_for_tokens(c->shape().n_ctx);
        need.kv_tokens = std::max(need.kv_tokens, c->shape().n_ctx);
    }
    return need;
}

int64_t longest_context(const MemoryNeed& need, std::span<const KvCache* const> caches, size_t free, int64_t cap) {
    const auto fits = [&](int64_t n) {
        size_t bytes = need.weights + need.activations;
        for (const KvCache* c : caches) bytes += c->bytes_for_tokens(n);
        return bytes <= free;
    };
    if (!fits(0)) return 0;
    if (fits(cap)) return cap;
    int64_t lo = 0, hi = cap;  // fits(lo), !fits(hi)
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
    }
    return lo;
}

BackendMemory BackendMemory::of(const Backend& be) {
    return {be.memory_info().where, be.weight_bytes(), be.activation_bytes()};
}

void check_fits(const MemoryNeed& need, const MemoryInfo& mem, std::string_view device) {
    if (need.total() <= mem.free) return;
    const std::string weights = need.weights > 0 ? fmt::format("weights {:.1f} GiB + ", gib(need.weights)) : "";
    fail("--device {}: this run needs {:.1f} GiB ({}KV cache {:.1f} GiB for {} tokens + activations {:.1f} GiB) but {} "
         "has {:.1f} GiB free",
         device, gib(need.total()), weights, gib(need.kv), need.kv_tokens, gib(need.activations), mem.where, gib(mem.free));
}

}  // namespace vxq

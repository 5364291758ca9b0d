// Attention fidelity of a KV cache, measured where the model uses it. AttentionProbe owns the
// cache under test and observes it (KvObserver); for measurement only it also keeps an exact
// f32 copy of the K/V the model wrote. While armed, each attention compares, per layer and query
// head, the cache's view with the exact one:
//   - score correlation: Pearson correlation over the visible tokens between <q, k_t> with the
//     exact keys and with the keys the cache gives back (dequantized);
//   - output error: ||o - o*|| / ||o*|| between the cache's attention output (what its kernel
//     computed) and exact attention over the exact K/V (double precision).
// The exact copy belongs to the probe: resident_bytes() is the inner cache's.
#pragma once

#include <memory>
#include <vector>

#include "kv/kv_cache.h"

namespace vxq {

struct AttentionSample {
    int64_t layer = 0, head = 0, len = 0;  // query head and visible tokens
    double score_corr = 1.0;               // NaN when undefined (one token, or constant scores)
    double out_rel_err = 0.0;
};

class AttentionProbe final : public KvObserver {
public:
    explicit AttentionProbe(std::unique_ptr<KvCache> inner);
    ~AttentionProbe() override { inner_->set_observer(nullptr); }

    void arm(bool on) { armed_ = on; }
    const std::vector<AttentionSample>& samples() const { return samples_; }
    void clear_samples() { samples_.clear(); }
    KvCache& cache() { return *inner_; }
    const KvCache& inner() const { return *inner_; }

    void on_write(int64_t layer, int64_t pos0, const float* k, const float* v, int64_t n) override;
    void on_attention(int64_t layer, const float* q, int64_t n_q, int64_t pos0, const float* out) override;

private:
    std::unique_ptr<KvCache> inner_;
    std::vector<std::vector<float>> exact_k_, exact_v_;  // [layer][pos, n_head_kv, head_dim]
    bool armed_ = false;
    std::vector<AttentionSample> samples_;
};

}  // namespace vxq

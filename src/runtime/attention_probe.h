// Attention fidelity of a KV cache, measured where the model uses it. AttentionProbe wraps the
// cache under test and forwards every call to it; for measurement only it also keeps an exact
// f32 copy of the K/V the model wrote. While armed, each attend() compares, per layer and query
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

class AttentionProbe final : public KvCache {
public:
    explicit AttentionProbe(std::unique_ptr<KvCache> inner);

    void arm(bool on) { armed_ = on; }
    const std::vector<AttentionSample>& samples() const { return samples_; }
    void clear_samples() { samples_.clear(); }
    const KvCache& inner() const { return *inner_; }

    const KvShape& shape() const override { return inner_->shape(); }
    int64_t size() const override { return inner_->size(); }
    void write(int64_t layer, int64_t pos0, const float* k, const float* v, int64_t n) override;
    void commit(int64_t n) override { inner_->commit(n); }
    void attend(int64_t layer, const float* q, int64_t n_q, int64_t pos0, float* out, ThreadPool& pool) const override;
    void truncate(int64_t n) override { inner_->truncate(n); }
    size_t resident_bytes() const override { return inner_->resident_bytes(); }
    std::string format() const override { return inner_->format(); }
    void dequantize(int64_t layer, int64_t head, int64_t n, std::vector<float>& k, std::vector<float>& v) const override {
        inner_->dequantize(layer, head, n, k, v);
    }

private:
    std::unique_ptr<KvCache> inner_;
    std::vector<std::vector<float>> exact_k_, exact_v_;  // [layer][pos, n_head_kv, head_dim]
    bool armed_ = false;
    mutable std::vector<AttentionSample> samples_;
};

}  // namespace vxq

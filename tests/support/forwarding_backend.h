// Backends for tests that wrap another: ForwardingBackend passes every op to the backend it
// holds, so a test overrides only the ops it watches or changes. LastBitNoiseBackend is the CPU
// backend whose matmul outputs move by up to one unit in the last place, at random: what another
// backend's summation order does to them. A model's logits under it, against the plain CPU
// backend's, are how far a KV codec's discrete choices carry such noise (the device tests'
// tolerance for codecs that carry it far).
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>

#include "backend/backend.h"

namespace vxq::test {

class ForwardingBackend : public Backend {
public:
    explicit ForwardingBackend(std::unique_ptr<Backend> inner) : in_(std::move(inner)) {}
    Backend& inner() { return *in_; }

    std::string describe() const override { return in_->describe(); }
    MemoryInfo memory_info() const override { return in_->memory_info(); }
    size_t weight_bytes() const override { return in_->weight_bytes(); }
    bool copies_weights() const override { return in_->copies_weights(); }
    size_t copied_weight_bytes(GgmlType type, size_t file_bytes) const override {
        return in_->copied_weight_bytes(type, file_bytes);
    }
    float* activation_buffer(int id, size_t n) override { return in_->activation_buffer(id, n); }
    size_t activation_bytes() const override { return in_->activation_bytes(); }
    float* output_buffer(size_t n) override { return in_->output_buffer(n); }
    const float* to_host(const float* x, size_t n, int slot) override { return in_->to_host(x, n, slot); }
    void sync() override { in_->sync(); }
    void matmul(const WeightView& w, const float* x, int64_t n, float* y) override { in_->matmul(w, x, n, y); }
    void embed(const WeightView& table, const int32_t* ids, int64_t n, float* out) override {
        in_->embed(table, ids, n, out);
    }
    void rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps, float* y) override {
        in_->rms_norm(x, weight, n_rows, dim, eps, y);
    }
    void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t pos0, const RopeParams& p) override {
        in_->rope(x, n_tokens, n_heads, head_dim, pos0, p);
    }
    void swiglu(float* gate, const float* up, int64_t n_rows, int64_t n_ff) override { in_->swiglu(gate, up, n_rows, n_ff); }
    void add(float* x, const float* y, int64_t n) override { in_->add(x, y, n); }
    void add_bias(float* x, const float* b, int64_t n_rows, int64_t dim) override { in_->add_bias(x, b, n_rows, dim); }
    KvMemory* kv_memory() override { return in_->kv_memory(); }
    void kv_write(KvCache& cache, int64_t layer, int64_t pos0, const float* k, const float* v, int64_t n) override {
        in_->kv_write(cache, layer, pos0, k, v, n);
    }
    void attention(const KvLayerView& view, const float* q, int64_t n_q, int64_t pos0, float* out,
                   float* const* token_mass) override {
        in_->attention(view, q, n_q, pos0, out, token_mass);
    }
    std::string attention_path(const KvLayerView& view) const override { return in_->attention_path(view); }

private:
    std::unique_ptr<Backend> in_;
};

// The CPU backend (host memory: the outputs are written in place) with every matmul output y
// replaced by y (1 + u 2^-24), u uniform in [-1, 1) from a seeded generator: about half the
// outputs move by one unit in the last place.
class LastBitNoiseBackend final : public ForwardingBackend {
public:
    LastBitNoiseBackend(int n_threads, uint32_t seed) : ForwardingBackend(make_backend("cpu", n_threads)), rng_(seed) {}
    void matmul(const WeightView& w, const float* x, int64_t n, float* y) override {
        inner().matmul(w, x, n, y);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (int64_t i = 0; i < n * w.rows; ++i) y[i] += y[i] * std::ldexp(u(rng_), -24);
    }

private:
    std::mt19937 rng_;
};

}  // namespace vxq::test

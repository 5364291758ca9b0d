// What generation and perplexity drive: one model's forward passes over its KV cache, on one
// backend (SingleRunner) or on a tensor-parallel group of backends (TpGroup,
// runtime/tensor_parallel.h), behind one interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "formats/tokenizer.h"

namespace vxq {

class Backend;
class KvCache;
class Model;

class Runner {
public:
    virtual ~Runner() = default;
    // The model: its tokenizer, and the whole model's config() (n_vocab: the logits' width).
    virtual const Model& model() const = 0;
    // Model::forward on every backend: n tokens at positions [size(), size() + n); logits
    // [n_out, n_vocab] for the last n_out tokens, in host memory.
    virtual void forward(std::span<const TokenId> tokens, int64_t n_out, float* logits) = 0;
    // Model::fill_kv on every backend: `tokens`' keys and values stored without running the model
    // (a benchmark's depth; vxq::Error for caches that read the attention).
    virtual void fill_kv(std::span<const TokenId> tokens) = 0;
    // Drops the cached tokens at positions >= n (KvCache::truncate) on every backend.
    virtual void truncate(int64_t n) = 0;
    virtual int64_t size() const = 0;    // tokens cached
    virtual int64_t n_ctx() const = 0;   // the cache's capacity in tokens
    virtual size_t kv_bytes() const = 0;  // resident KV bytes of every backend's cache
    // Backend::output_buffer of the backend whose logits reach the host (nullptr: pass your own).
    virtual float* output_buffer(size_t n) = 0;

    // The whole model's K and V elements for `tokens` tokens (every rank's KV heads); f16 holds
    // them in twice as many bytes.
    int64_t kv_elements(int64_t tokens) const;
    // kv_bytes() in bits per element of kv_elements(tokens) (0 for none): every rank's bytes over
    // every KV head (resident_bits_per_element of one cache alone).
    double kv_bits_per_element(int64_t tokens) const;
};

// One model on one backend over one cache (borrowed: they must outlive the runner).
class SingleRunner final : public Runner {
public:
    SingleRunner(const Model& m, Backend& be, KvCache& cache) : m_(m), be_(be), cache_(cache) {}
    const Model& model() const override { return m_; }
    void forward(std::span<const TokenId> tokens, int64_t n_out, float* logits) override;
    void fill_kv(std::span<const TokenId> tokens) override;
    void truncate(int64_t n) override;
    int64_t size() const override;
    int64_t n_ctx() const override;
    size_t kv_bytes() const override;
    float* output_buffer(size_t n) override;

private:
    const Model& m_;
    Backend& be_;
    KvCache& cache_;
};

}  // namespace vxq

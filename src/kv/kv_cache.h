// The KV cache interface the forward pass talks to. A cache stores each layer's post-RoPE keys
// and values and computes attention over what it stores, so a compressed cache can read its own
// packed format in place (later issues add codecs and eviction behind this interface).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace vxq {

class ThreadPool;

struct KvShape {
    int64_t n_layer = 0;
    int64_t n_head = 0;     // query heads
    int64_t n_head_kv = 0;  // KV heads (GQA: n_head / n_head_kv query heads share one)
    int64_t head_dim = 0;
    int64_t n_ctx = 0;      // capacity in tokens
};

class KvCache {
public:
    virtual ~KvCache() = default;

    virtual const KvShape& shape() const = 0;
    // Tokens held (positions [0, size())).
    virtual int64_t size() const = 0;

    // Stores K and V of n tokens at positions [pos0, pos0 + n) of one layer. pos0 <= size().
    //   k, v: [n, n_head_kv, head_dim] f32, k after RoPE
    virtual void write(int64_t layer, int64_t pos0, const float* k, const float* v, int64_t n) = 0;
    // Makes positions [0, n) the cache's content once every layer has been written.
    virtual void commit(int64_t n) = 0;

    // Causal attention of n_q query tokens at positions [pos0, pos0 + n_q) of one layer: query i
    // attends to cached positions [0, pos0 + i]. Scores are scaled by 1/sqrt(head_dim).
    //   q: [n_q, n_head, head_dim] f32 after RoPE; out: [n_q, n_head, head_dim] f32
    virtual void attend(int64_t layer, const float* q, int64_t n_q, int64_t pos0, float* out,
                        ThreadPool& pool) const = 0;

    // Drops positions >= n (rollback).
    virtual void truncate(int64_t n) = 0;

    // Bytes this cache holds in memory for K and V (allocator-side, not a formula).
    virtual size_t resident_bytes() const = 0;
    // Name of the storage format, e.g. "f16" or "K q8_0 / V q4_0".
    virtual std::string format() const = 0;

    // K and V of positions [0, n) of one layer and KV head as the cache gives them back
    // (dequantized), for tests and fidelity measurements. n may include the tokens a layer has
    // written but not yet committed (between write and commit: what its attend reads).
    //   k, v: [n, head_dim]
    virtual void dequantize(int64_t layer, int64_t head, int64_t n, std::vector<float>& k,
                            std::vector<float>& v) const = 0;
};

// The llama.cpp-parity cache: K and V as IEEE fp16 for the full context, attention in llama.cpp's
// (non flash-attention) numerics. What `--kv f16` gives.
std::unique_ptr<KvCache> make_f16_cache(const KvShape& shape);

struct CodecSpec;
// The compressed cache: packed codec blocks in pages allocated as tokens arrive, read in place by
// the fused attention kernel. K and V may use different codecs.
// prefill_exact: a batch written at position 0 (a prompt, a perplexity chunk) attends to its own
// exact K/V (KIVI's recipe); only later queries read the packed codes. The exact copy lives only
// between the layer's write and attend.
std::unique_ptr<KvCache> make_paged_cache(const KvShape& shape, const CodecSpec& k, const CodecSpec& v,
                                          bool prefill_exact = false);

// From CLI specs ("f16", "q4_0", "kivi:bits=2,group=32"): the parity cache when both are plain
// f16, else the paged cache. vxq::Error for an unknown method or option.
std::unique_ptr<KvCache> make_kv_cache(const KvShape& shape, const std::string& k_spec, const std::string& v_spec,
                                       bool prefill_exact = false);

// Bits per cached K/V element actually resident: 8 * resident_bytes / (2 * layers * kv_dim * tokens).
double resident_bits_per_element(const KvCache& c, int64_t tokens);

}  // namespace vxq

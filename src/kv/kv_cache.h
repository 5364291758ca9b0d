// The KV cache owns storage only: per (layer, KV head) a page table of packed codec blocks
// (pages allocated from an arena as tokens arrive and freed as they go) and the position of
// every stored token, plus per-layer codec state. Attention belongs to the backend: it reads a
// layer through `view()` (kv/kv_view.h). Every method, f16 included, stores this way; K and V may
// use different codecs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/evict.h"
#include "kv/spec.h"
#include "kv/kv_view.h"

namespace vxq {

class KvMemory;

struct KvShape {
    int64_t n_layer = 0;
    int64_t n_head = 0;     // query heads
    int64_t n_head_kv = 0;  // KV heads (GQA: n_head / n_head_kv query heads share one)
    int64_t head_dim = 0;
    int64_t n_ctx = 0;      // capacity in positions
};

struct KvCacheOptions {
    // A batch written at position 0 (a prompt, a perplexity chunk) attends to its own exact K/V
    // (KIVI's recipe); only later queries read the packed codes. The exact copy lives only
    // between the layer's write and the next write or commit.
    bool prefill_exact = false;
    // llama.cpp's -fa: an f16 cache is read by the fused kernel like every other codec. Without
    // it an f16/f16 cache keeps llama.cpp's non-flash-attention numerics (bit parity).
    bool flash_attn = false;
    // Where the pages live: nullptr is host RAM; a device backend's memory (Backend::kv_memory)
    // keeps them on the device, written by that backend's kernels (reserve_write).
    KvMemory* memory = nullptr;
    // Eviction (kv/evict.h): none by default. The cache applies it when a forward pass commits.
    EvictSpec evict{};
};

// Sees what the model writes and what attention returns, e.g. to measure fidelity
// (runtime/attention_probe.h). Never changes either.
class KvObserver {
public:
    virtual ~KvObserver() = default;
    //   k, v: [n, n_head_kv, head_dim]
    virtual void on_write(int64_t layer, int64_t pos0, const float* k, const float* v, int64_t n) = 0;
    //   q, out: [n_q, n_head, head_dim]
    virtual void on_attention(int64_t layer, const float* q, int64_t n_q, int64_t pos0, const float* out) = 0;
    // The score observer: when this is true for a layer, the forward pass asks the backend for the
    // attention probability each stored token received in that step (summed over the query tokens
    // and the group's query heads) and hands it over per KV head.   mass: [n_tokens of the head]
    virtual bool wants_attention_mass(int64_t layer) const { return false; }
    virtual void on_attention_mass(int64_t layer, int64_t head, const float* mass, int64_t n_tokens) {}
};

class KvCache {
public:
    KvCache(const KvShape& shape, const KvSpec& spec, const KvCacheOptions& opts = {});
    ~KvCache();
    KvCache(const KvCache&) = delete;
    KvCache& operator=(const KvCache&) = delete;

    const KvShape& shape() const { return shape_; }
    const KvCacheOptions& options() const { return opts_; }
    // Positions processed so far: the next token goes to position size().
    int64_t size() const { return size_; }

    // Stores K and V of n tokens at positions [pos0, pos0 + n) in every head of one layer,
    // after dropping the head's tokens at positions >= pos0.   k, v: [n, n_head_kv, head_dim], k after RoPE
    void write(int64_t layer, int64_t pos0, const float* k, const float* v, int64_t n);
    // The bookkeeping of write() without the encoding, for a cache in device memory: after it, the
    // last n stored tokens of every head of the layer (view()) are the tokens of positions
    // [pos0, pos0 + n), which the backend's kernels put in place as the returned plan says (the
    // same in every head: which tokens to encode into blocks, which wait in the fp16 window;
    // kv_view.h). Token-wise formats: every new token is encoded into its own block.
    KvWritePlan reserve_write(int64_t layer, int64_t pos0, int64_t n);
    // Whether a stream of the layer has not seen its first batch yet and its codec calibrates on
    // one of n tokens (fp8's scale, Codec::observe_first_batch); a device cache's backend then hands that batch
    // (host copies, [n, n_head_kv, head_dim]) to observe_first_batch before reserve_write, so the
    // scales are those a host cache fed the same batches computes.
    bool wants_first_batch(int64_t layer, int64_t n) const;
    void observe_first_batch(int64_t layer, const float* k, const float* v, int64_t n);
    // Makes positions [0, n) the cache's content once every layer has been written; then the
    // eviction policy, if any, evicts when due.
    void commit(int64_t n);
    // The layer as the backends read it; valid until the next write, retain or truncate.
    KvLayerView view(int64_t layer) const;

    // Rollback: drops every token at a position >= n, in every head. The pages stay committed
    // (and counted in resident_bytes) for the tokens that refill them: a rollback, a new
    // perplexity chunk or benchmark repetition costs no page mapping. shrink_to_fit() gives back
    // the pages beyond the stored tokens; eviction (retain) gives them back at once.
    void truncate(int64_t n);
    void shrink_to_fit();
    // Eviction: keeps the stored tokens t of one head with keep[t] != 0 (keep: [head_tokens]) at
    // their positions, compacts the head's pages and frees the ones left empty.
    void retain(int64_t layer, int64_t head, std::span<const uint8_t> keep);
    int64_t head_tokens(int64_t layer, int64_t head) const;
    std::vector<int32_t> head_positions(int64_t layer, int64_t head) const;

    // Bytes held for K and V: live pages, windows, position tables and layer states.
    size_t resident_bytes() const;
    // What `n` tokens in every head would hold (the memory check before a run).
    size_t bytes_for_tokens(int64_t n) const;
    // Name of the storage format, e.g. "f16" or "K q8_0 / V q4_0".
    std::string format() const;
    const KvSpec& spec() const { return spec_; }

    // K and V of the first n stored tokens of one layer and KV head as the cache gives them back
    // (dequantized), for tests and fidelity measurements. n may include tokens a layer has
    // written but not yet committed.   k, v: [n, head_dim]
    void dequantize(int64_t layer, int64_t head, int64_t n, std::vector<float>& k, std::vector<float>& v) const;

    void set_observer(KvObserver* o) { observer_ = o; }
    KvObserver* observer() const { return observer_; }
    // Called by the forward pass after each attention when observes_attention(): forwards the
    // queries and the output to the observer, the queries to the eviction policy (SnapKV).
    bool observes_attention() const;
    void observe_attention(int64_t layer, const float* q, int64_t n_q, int64_t pos0, const float* out) const;
    // Whether the forward pass should ask for the attention mass of this layer (the observer's or
    // the eviction policy's wish), and where it goes.   mass: [head_tokens(layer, head)]
    bool wants_attention_mass(int64_t layer) const;
    void on_attention_mass(int64_t layer, int64_t head, const float* mass, int64_t n_tokens);
    // The eviction policy (KvCacheOptions::evict), or nullptr.
    Evictor* evictor() const { return evictor_.get(); }

private:
    struct Impl;
    KvShape shape_;
    KvSpec spec_;
    KvCacheOptions opts_;
    std::unique_ptr<Impl> impl_;
    int64_t size_ = 0;
    KvObserver* observer_ = nullptr;
    std::unique_ptr<Evictor> evictor_;
};

// A cache for a K/V spec; vxq::Error for an unknown method, option or unsupported head size.
std::unique_ptr<KvCache> make_kv_cache(const KvShape& shape, const KvSpec& spec, const KvCacheOptions& opts = {});
// Same from method strings ("q4_0", "kivi:bits=2,group=32").
std::unique_ptr<KvCache> make_kv_cache(const KvShape& shape, const std::string& k_spec, const std::string& v_spec,
                                       const KvCacheOptions& opts = {});

// Bits per cached K/V element actually resident: 8 * resident_bytes / (2 * layers * kv_dim * tokens).
double resident_bits_per_element(const KvCache& c, int64_t tokens);

}  // namespace vxq

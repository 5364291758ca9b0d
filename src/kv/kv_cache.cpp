// Storage of the KV cache: per (layer, KV head) a key stream and a value stream, each a page table
// over its own reserved address range plus a small fp16 window, and the positions of the head's
// tokens. Nothing here computes attention: backends read `view()`.
#include "kv/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "kv/codec.h"
#include "kv/memory.h"

namespace vxq {

namespace {

constexpr int64_t kMinPageTokens = 64;  // tokens per page (and per attention chunk): <= 63 unused per stream

// Slots of a stream's fp16 window: flush_at() tokens, none for a codec that encodes on arrival.
int64_t window_slots(const Codec& c) { return c.flush_at() > 1 ? c.flush_at() : 0; }

// Head g's rows of x [n, H, d] (a batch as the model writes it) into out [n, d].
void gather_head(const float* x, int64_t g, int64_t n, int64_t H, int64_t d, float* out) {
    for (int64_t t = 0; t < n; ++t) std::memcpy(out + t * d, x + (t * H + g) * d, size_t(d) * sizeof(float));
}

// One (layer, KV head) stream of keys or values. Stored tokens [0, n_enc) are packed blocks in
// pages; [n_enc, n_enc + n_pending) wait in an fp16 ring of flush_at() tokens (absent when the
// codec encodes every token on arrival). In host memory the ring is the stream's own, allocated
// with its first token; in device memory it is a slot of the cache's window allocation
// (`device_ring`, window_slots() of head_dim fp16), written by the backend's kernels.
class Stream {
public:
    Stream(std::unique_ptr<Codec> codec, int64_t d, int64_t page_tokens, int64_t max_tokens, KvMemory& mem,
           f16_t* device_ring = nullptr)
        : codec_(std::move(codec)), d_(d), page_tokens_(page_tokens), bt_(codec_->block_tokens()),
          bb_(codec_->block_bytes(d)), mem_(&mem),
          pages_(mem.reserve(size_t(page_tokens / bt_) * bb_, (max_tokens + page_tokens - 1) / page_tokens)),
          ring_(device_ring) {
        window_ = window_slots(*codec_);
        VXQ_ASSERT(page_tokens_ % bt_ == 0 && codec_->flush_count() % bt_ == 0);
        VXQ_ASSERT(mem.host_accessible() == (device_ring == nullptr) || window_ == 0);
    }

    int64_t size() const { return n_enc_ + n_pending_; }
    const Codec& codec() const { return *codec_; }
    // Whether tokens are stored on arrival, one block each, with no window.
    bool token_wise() const { return window_ == 0 && bt_ == 1; }

    // The bookkeeping of append(n) without touching a byte: the caller (a device backend's
    // kernels) encodes and moves the tokens as the returned plan says (kv_view.h).
    KvWindowWrite reserve(int64_t n) {
        observed_ = true;  // the first batch has passed (observe() before this, where the codec wants it)
        KvWindowWrite w{n_enc_, n_pending_, head_, window_, n};
        if (window_ == 0) {
            VXQ_ASSERT(bt_ == 1);
        } else {
            const int64_t total = n_pending_ + n, at = codec_->flush_at(), count = codec_->flush_count();
            w.encoded = total >= at ? ((total - at) / count + 1) * count : 0;  // append()'s flushes
            n_pending_ = total - w.encoded;
            head_ = (head_ + w.encoded) % window_;
        }
        // A stream that encodes one token a step (KIVI's values) keeps the page of the next token
        // it will encode mapped too: a device backend encodes that token a step ahead
        // (kernels/cuda/kivi.cuh, pack_ahead).
        const int64_t ahead = window_ > 0 && codec_->flush_count() == 1 && n_pending_ > 0 ? 1 : 0;
        if (w.encoded + ahead > 0) pages_->grow_to((n_enc_ + w.encoded + ahead + page_tokens_ - 1) / page_tokens_);
        n_enc_ += w.encoded;
        return w;
    }

    // A device stream's first batch (before reserve()).  x: [n, d] f32
    bool wants_first_batch(int64_t n) const { return !observed_ && codec_->wants_first_batch(n); }
    void observe(const float* x, int64_t n) {
        codec_->observe_first_batch(x, n, d_);
        observed_ = true;
    }

    // Appends n tokens.  x: [n, d] f32
    void append(const float* x, int64_t n, std::vector<float>& scratch) {
        if (!observed_) {
            codec_->observe_first_batch(x, n, d_);
            observed_ = true;
        }
        if (window_ == 0) {
            for (int64_t t = 0; t < n; ++t) encode_block(x + t * d_);  // block_tokens == 1
            return;
        }
        if (ring_ == nullptr) {  // allocated with the first token
            host_ring_.resize(size_t(window_ * d_));
            ring_ = host_ring_.data();
        }
        for (int64_t t = 0; t < n; ++t) {
            f16_t* slot = ring_ + ((head_ + n_pending_) % window_) * d_;
            for (int64_t c = 0; c < d_; ++c) slot[c] = fp32_to_fp16(x[t * d_ + c]);
            if (++n_pending_ == codec_->flush_at()) flush(scratch);
        }
    }

    // Keeps stored tokens [0, n).
    void truncate(int64_t n) {
        if (n >= size()) return;
        if (n >= n_enc_) {
            n_pending_ = n - n_enc_;
            return;
        }
        // Dropping packed tokens: keep whole blocks below n; the kept tokens of a partial block
        // go back to the residual window (decoded: lossy only for tokens already lossy).
        const int64_t keep_blocks = n / bt_;
        const int64_t partial = n - keep_blocks * bt_;
        if (partial > 0) {
            std::vector<float> blk(size_t(bt_ * d_));
            decode_blocks(keep_blocks, 1, blk.data());
            std::vector<f16_t> slots(size_t(partial * d_));
            for (size_t i = 0; i < slots.size(); ++i) slots[i] = fp32_to_fp16(blk[i]);
            if (mem_->host_accessible()) {
                std::memcpy(ring_, slots.data(), slots.size() * sizeof(f16_t));
            } else {
                mem_->copy_from_host(ring_, slots.data(), slots.size() * sizeof(f16_t));
            }
        }
        n_enc_ = keep_blocks * bt_;
        head_ = 0;  // the pages stay committed (a rollback refills them): shrink_to_fit gives them back
        n_pending_ = partial;
    }

    // Keeps the stored tokens t >= first with keep[t] (tokens below `first` all stay). Token-wise
    // formats without a window move blocks (exact); the others decode the tail and append the
    // kept tokens again (a KIVI key group that loses a token is re-quantized without it).
    // A stream in device memory (token-wise formats only) is compacted through the host: its
    // blocks from `first` on are copied out, compacted, and the kept ones copied back.
    void retain(int64_t first, std::span<const uint8_t> keep, std::vector<float>& scratch) {
        const int64_t n = size();
        if (token_wise()) {
            const bool host = mem_->host_accessible();
            std::vector<uint8_t> staged;
            if (!host && n > first) {
                staged.resize(size_t(n - first) * bb_);
                mem_->copy_to_host(staged.data(), block_ptr(first), staged.size());
            }
            const auto at = [&](int64_t t) { return host ? block_ptr(t) : staged.data() + size_t(t - first) * bb_; };
            int64_t w = first;
            for (int64_t t = first; t < n; ++t) {
                if (!keep[size_t(t)]) continue;
                if (w != t) std::memcpy(at(w), at(t), bb_);
                ++w;
            }
            if (!host && w > first) mem_->copy_from_host(block_ptr(first), staged.data(), size_t(w - first) * bb_);
            n_enc_ = w;
            release_pages_from((n_enc_ + page_tokens_ - 1) / page_tokens_);
            return;
        }
        if (!mem_->host_accessible()) {  // the cache's constructor admits only token-wise formats there
            fail("evicting tokens from a KV cache in {} needs a token-wise format", mem_->name());
        }
        std::vector<float> all;
        decode_all(all);
        std::vector<float> kept;
        for (int64_t t = first; t < n; ++t) {
            if (keep[size_t(t)]) kept.insert(kept.end(), all.begin() + t * d_, all.begin() + (t + 1) * d_);
        }
        truncate(first);
        append(kept.data(), int64_t(kept.size()) / d_, scratch);
        shrink_to_fit();  // eviction gives the emptied pages back
    }

    // Segments in stored order: the packed pages as one run (they are contiguous), then the
    // ring's one or two runs. O(1) per stream, so a view costs the same at any context length.
    void view(std::vector<KvSegment>& out, KvStreamView& v) const {
        v.ring = window_ > 0 ? reinterpret_cast<const uint8_t*>(ring_) : nullptr;
        v.ring_head = head_;
        v.ring_slots = window_;
        v.n_packed = n_enc_;
        if (n_enc_ > 0) out.push_back({block_ptr(0), 0, n_enc_, false});
        if (n_pending_ > 0) {
            const int64_t run1 = std::min(n_pending_, window_ - head_);
            const auto* base = reinterpret_cast<const uint8_t*>(ring_);
            out.push_back({base + head_ * d_ * 2, n_enc_, run1, true});
            if (run1 < n_pending_) out.push_back({base, n_enc_ + run1, n_pending_ - run1, true});
        }
    }

    size_t window_bytes() const { return host_ring_.size() * sizeof(f16_t); }  // a device ring: the cache's
    size_t page_bytes() const { return pages_->resident_bytes(); }

    // Dequantized tokens [0, size()) for tests and references.  out: [size(), d]
    void decode_all(std::vector<float>& out) const {
        out.assign(size_t(size() * d_), 0.0f);
        decode_blocks(0, (n_enc_ + bt_ - 1) / bt_, out.data());
        std::vector<f16_t> staged;
        const f16_t* ring = ring_;
        if (n_pending_ > 0 && !mem_->host_accessible()) {
            staged.resize(size_t(window_ * d_));
            mem_->copy_to_host(staged.data(), ring_, staged.size() * sizeof(f16_t));
            ring = staged.data();
        }
        for (int64_t t = 0; t < n_pending_; ++t) {
            const f16_t* slot = ring + ((head_ + t) % window_) * d_;
            for (int64_t c = 0; c < d_; ++c) out[size_t((n_enc_ + t) * d_ + c)] = fp16_to_fp32(slot[c]);
        }
    }

private:
    // Blocks [b0, b0 + n) decoded into out: [n * block_tokens, d] (through the host for device pages).
    void decode_blocks(int64_t b0, int64_t n, float* out) const {
        std::vector<uint8_t> host;
        const uint8_t* blocks = block_ptr(b0);
        if (n > 0 && !mem_->host_accessible()) {
            host.resize(size_t(n) * bb_);
            mem_->copy_to_host(host.data(), blocks, host.size());
            blocks = host.data();
        }
        for (int64_t b = 0; b < n; ++b) codec_->decode(blocks + size_t(b) * bb_, d_, out + b * bt_ * d_);
    }

    // Block b of the stream (pages are adjacent: page b / per_page, slot b % per_page).
    uint8_t* block_ptr(int64_t b) const { return pages_->base() + size_t(b) * bb_; }

    void release_pages_from(int64_t keep_pages) { pages_->shrink_to(keep_pages); }

public:
    // Gives back the pages beyond the stored tokens.
    void shrink_to_fit() { release_pages_from((n_enc_ + page_tokens_ - 1) / page_tokens_); }

private:

    void encode_block(const float* x) {  // appends one block of bt_ tokens
        VXQ_ASSERT(mem_->host_accessible());
        const int64_t b = n_enc_ / bt_;
        pages_->grow_to(b / (page_tokens_ / bt_) + 1);
        codec_->encode(x, d_, block_ptr(b));
        n_enc_ += bt_;
    }

    // Encodes the oldest flush_count() pending tokens (whole blocks) from the fp16 window.
    void flush(std::vector<float>& scratch) {
        const int64_t n = codec_->flush_count();
        scratch.resize(size_t(bt_ * d_));
        for (int64_t b = 0; b < n / bt_; ++b) {
            for (int64_t t = 0; t < bt_; ++t) {
                const f16_t* slot = ring_ + ((head_ + b * bt_ + t) % window_) * d_;
                for (int64_t c = 0; c < d_; ++c) scratch[size_t(t * d_ + c)] = fp16_to_fp32(slot[c]);
            }
            encode_block(scratch.data());
        }
        head_ = (head_ + n) % window_;
        n_pending_ -= n;
    }

    std::unique_ptr<Codec> codec_;
    int64_t d_, page_tokens_, bt_ = 1;
    size_t bb_ = 0;
    int64_t window_ = 0;
    KvMemory* mem_;
    std::unique_ptr<KvPages> pages_;  // the page table: page p holds stored tokens [p * page_tokens, ...)
    f16_t* ring_ = nullptr;           // window_ slots of d fp16, in mem_ (or host_ring_)
    std::vector<f16_t> host_ring_;
    int64_t head_ = 0, n_enc_ = 0, n_pending_ = 0;
    bool observed_ = false;
};

// One (layer, KV head): its keys, its values and where its tokens sit.
struct Head {
    Stream k, v;
    std::vector<int32_t> pos;  // empty while token t is at position t (no eviction yet)

    int64_t size() const { return k.size(); }
    // Stored tokens at positions < p.
    int64_t below(int64_t p) const {
        if (pos.empty()) return std::min(size(), p);
        return std::lower_bound(pos.begin(), pos.end(), int32_t(p)) - pos.begin();
    }
    void materialize_positions() {
        if (!pos.empty() || size() == 0) return;
        pos.resize(size_t(size()));
        for (size_t t = 0; t < pos.size(); ++t) pos[t] = int32_t(t);
    }
    // Drops the tokens at positions >= pos0 and records the positions of n tokens about to be
    // appended at [pos0, pos0 + n).
    void place(int64_t pos0, int64_t n) {
        truncate(below(pos0));
        if (pos.empty() && size() != pos0) materialize_positions();
        if (!pos.empty() || (size() == 0 && pos0 > 0)) {
            for (int64_t t = 0; t < n; ++t) pos.push_back(int32_t(pos0 + t));
        }
    }
    void truncate(int64_t n_stored) {
        k.truncate(n_stored);
        v.truncate(n_stored);
        if (!pos.empty()) pos.resize(size_t(n_stored));
    }
};

std::string format_name(const std::string& k, const std::string& v) { return k == v ? k : "K " + k + " / V " + v; }

}  // namespace

struct KvCache::Impl {
    KvShape shape;
    KvMemory* mem = nullptr;  // where the pages are; not host-accessible: the owning backend writes them
    // In device memory, the fp16 windows of every stream that has one: one allocation (a window is
    // a few KiB, a stream's own pages would round it up to the memory's commit granularity).
    std::unique_ptr<KvPages> windows;
    int64_t page_tokens = kMinPageTokens;
    size_t k_page_bytes = 0, v_page_bytes = 0;
    std::vector<std::unique_ptr<KvLayerState>> states;  // [layer * 2 + role], nullptr when none
    std::vector<Head> heads;                             // [layer * n_head_kv + g]
    std::string k_name, v_name;
    KvFormatParams k_window{KvFormatKind::F16}, v_window{KvFormatKind::F16}, exact{KvFormatKind::F32};
    // --prefill-exact: the exact K/V of the batch of `exact_layer`   [n_head_kv, n, head_dim]
    int64_t exact_layer = -1, exact_n = 0;
    std::vector<float> exact_k, exact_v;
    std::vector<float> head_major, scratch;  // write()'s buffers, kept between calls
    // View storage per layer (rebuilt by view()).
    mutable std::vector<std::vector<KvSegment>> segs;
    mutable std::vector<std::vector<KvHeadView>> head_views;
    mutable std::vector<std::pair<size_t, size_t>> ranges;

    Head& head(int64_t layer, int64_t g) { return heads[size_t(layer * shape.n_head_kv + g)]; }
    const Head& head(int64_t layer, int64_t g) const { return heads[size_t(layer * shape.n_head_kv + g)]; }
};

KvCache::KvCache(const KvShape& s, const KvSpec& spec, const KvCacheOptions& opts)
    : shape_(s), spec_(spec), opts_(opts), impl_(std::make_unique<Impl>()) {
    if (s.n_layer <= 0 || s.n_head <= 0 || s.n_head_kv <= 0 || s.head_dim <= 0 || s.n_ctx <= 0 ||
        s.n_head % s.n_head_kv != 0) {
        fail("bad KV cache shape: {} layers, {} / {} heads, head_dim {}, context {}", s.n_layer, s.n_head, s.n_head_kv,
             s.head_dim, s.n_ctx);
    }
    if (s.n_ctx > INT32_MAX) fail("context of {} tokens is too large", s.n_ctx);
    Impl& m = *impl_;
    m.shape = s;
    KvMemory& mem = opts.memory ? *opts.memory : host_kv_memory();
    m.mem = &mem;
    const auto probe_k = make_codec(spec.k, KvRole::Key, s.head_dim);
    const auto probe_v = make_codec(spec.v, KvRole::Value, s.head_dim);
    m.k_name = probe_k->spec();
    m.v_name = probe_v->spec();
    const int64_t bt = std::max(probe_k->block_tokens(), probe_v->block_tokens());
    m.page_tokens = (std::max(kMinPageTokens, bt) + bt - 1) / bt * bt;
    VXQ_ASSERT(m.page_tokens % probe_k->block_tokens() == 0 && m.page_tokens % probe_v->block_tokens() == 0);
    m.k_page_bytes = size_t(m.page_tokens / probe_k->block_tokens()) * probe_k->block_bytes(s.head_dim);
    m.v_page_bytes = size_t(m.page_tokens / probe_v->block_tokens()) * probe_v->block_bytes(s.head_dim);
    m.k_window.block_bytes = m.v_window.block_bytes = size_t(s.head_dim) * 2;
    m.exact.block_bytes = size_t(s.head_dim) * 4;
    m.heads.reserve(size_t(s.n_layer * s.n_head_kv));
    // Device windows: a slot per (layer, head, role), as large as the larger ring.
    const int64_t k_slots = window_slots(*probe_k), v_slots = window_slots(*probe_v);
    const size_t slot_bytes = (size_t(std::max(k_slots, v_slots) * s.head_dim) * sizeof(f16_t) + 255) / 256 * 256;
    if (!mem.host_accessible() && slot_bytes > 0) {
        m.windows = mem.reserve(slot_bytes, 2 * s.n_layer * s.n_head_kv);
        m.windows->grow_to(2 * s.n_layer * s.n_head_kv);
    }
    const auto ring = [&](int64_t l, int64_t g, int role, int64_t slots) -> f16_t* {
        if (!m.windows || slots == 0) return nullptr;
        return reinterpret_cast<f16_t*>(m.windows->base() + size_t((l * s.n_head_kv + g) * 2 + role) * slot_bytes);
    };
    for (int64_t l = 0; l < s.n_layer; ++l) {
        m.states.push_back(make_layer_state(spec.k, KvRole::Key, s.head_dim, l));
        m.states.push_back(make_layer_state(spec.v, KvRole::Value, s.head_dim, l));
        const KvLayerState* ks = m.states[size_t(2 * l)].get();
        const KvLayerState* vs = m.states[size_t(2 * l + 1)].get();
        for (int64_t g = 0; g < s.n_head_kv; ++g) {
            m.heads.push_back(Head{Stream(make_codec(spec.k, KvRole::Key, s.head_dim, ks), s.head_dim, m.page_tokens,
                                          s.n_ctx, mem, ring(l, g, 0, k_slots)),
                                   Stream(make_codec(spec.v, KvRole::Value, s.head_dim, vs), s.head_dim, m.page_tokens,
                                          s.n_ctx, mem, ring(l, g, 1, v_slots)),
                                   {}});
        }
    }
    m.segs.resize(size_t(s.n_layer));
    m.head_views.resize(size_t(s.n_layer));
    if (opts.evict.active()) {
        evictor_ = std::make_unique<Evictor>(opts.evict, s);
    }
}

KvCache::~KvCache() = default;

void KvCache::write(int64_t layer, int64_t pos0, const float* k, const float* v, int64_t n) {
    VXQ_ASSERT(layer >= 0 && layer < shape_.n_layer && pos0 >= 0 && n >= 0 && pos0 + n <= shape_.n_ctx);
    Impl& m = *impl_;
    if (observer_) observer_->on_write(layer, pos0, k, v, n);
    const int64_t d = shape_.head_dim, H = shape_.n_head_kv;
    VXQ_ASSERT(m.mem->host_accessible());  // a device cache is written by its backend: reserve_write()
    m.exact_layer = -1;
    if (opts_.prefill_exact && pos0 == 0 && n > 1) {  // kept until the next write or commit
        m.exact_layer = layer;
        m.exact_n = n;
        m.exact_k.resize(size_t(H * n * d));
        m.exact_v.resize(size_t(H * n * d));
        for (int64_t g = 0; g < H; ++g) {
            gather_head(k, g, n, H, d, &m.exact_k[size_t(g * n * d)]);
            gather_head(v, g, n, H, d, &m.exact_v[size_t(g * n * d)]);
        }
    }
    std::vector<float>& head_major = m.head_major;  // reused: a decode step allocates nothing here
    std::vector<float>& scratch = m.scratch;
    head_major.resize(size_t(n * d));
    for (int64_t g = 0; g < H; ++g) {
        Head& h = m.head(layer, g);
        h.place(pos0, n);
        gather_head(k, g, n, H, d, head_major.data());
        h.k.append(head_major.data(), n, scratch);
        gather_head(v, g, n, H, d, head_major.data());
        h.v.append(head_major.data(), n, scratch);
    }
}

bool KvCache::wants_first_batch(int64_t layer, int64_t n) const {
    VXQ_ASSERT(layer >= 0 && layer < shape_.n_layer);
    for (int64_t g = 0; g < shape_.n_head_kv; ++g) {
        const Head& h = impl_->head(layer, g);
        if (h.k.wants_first_batch(n) || h.v.wants_first_batch(n)) return true;
    }
    return false;
}

void KvCache::observe_first_batch(int64_t layer, const float* k, const float* v, int64_t n) {
    VXQ_ASSERT(layer >= 0 && layer < shape_.n_layer && n >= 0);
    const int64_t H = shape_.n_head_kv, d = shape_.head_dim;
    std::vector<float>& head_major = impl_->head_major;
    head_major.resize(size_t(n * d));
    for (int64_t g = 0; g < H; ++g) {
        Head& h = impl_->head(layer, g);
        for (auto [s, x] : {std::pair<Stream*, const float*>{&h.k, k}, {&h.v, v}}) {
            if (!s->wants_first_batch(n)) continue;
            gather_head(x, g, n, H, d, head_major.data());
            s->observe(head_major.data(), n);
        }
    }
}

KvWritePlan KvCache::reserve_write(int64_t layer, int64_t pos0, int64_t n) {
    VXQ_ASSERT(layer >= 0 && layer < shape_.n_layer && pos0 >= 0 && n >= 0 && pos0 + n <= shape_.n_ctx);
    if (opts_.prefill_exact) fail("--prefill-exact keeps an exact host copy of the batch; not available in {}", impl_->mem->name());
    KvWritePlan plan;
    for (int64_t g = 0; g < shape_.n_head_kv; ++g) {
        Head& h = impl_->head(layer, g);
        h.place(pos0, n);
        const KvWindowWrite k = h.k.reserve(n), v = h.v.reserve(n);
        // Heads differ only after eviction, which a device cache allows for token-wise formats
        // alone (retain), whose plan is the same in every head but for `packed`.
        if (g > 0 && (k.slots > 0 || v.slots > 0)) VXQ_ASSERT(k == plan.k && v == plan.v);
        if (g == 0) plan = KvWritePlan{k, v};
    }
    return plan;
}

void KvCache::commit(int64_t n) {
    VXQ_ASSERT(n >= 0 && n <= shape_.n_ctx);
    impl_->exact_layer = -1;
    std::vector<float>().swap(impl_->exact_k);
    std::vector<float>().swap(impl_->exact_v);
    const int64_t added = n - size_;
    size_ = n;
    if (evictor_) evictor_->after_commit(*this, added);
}

KvLayerView KvCache::view(int64_t layer) const {
    VXQ_ASSERT(layer >= 0 && layer < shape_.n_layer);
    const Impl& m = *impl_;
    const int64_t H = shape_.n_head_kv, d = shape_.head_dim;
    auto& segs = m.segs[size_t(layer)];
    auto& hv = m.head_views[size_t(layer)];
    segs.clear();
    hv.assign(size_t(H), KvHeadView{});
    auto& ranges = m.ranges;  // [2 * g + role] -> (begin, end) in segs
    ranges.clear();
    const bool exact = m.exact_layer == layer;
    for (int64_t g = 0; g < H; ++g) {
        const Head& h = m.head(layer, g);
        for (int role = 0; role < 2; ++role) {
            const size_t b = segs.size();
            if (exact) {
                const auto& src = role == 0 ? m.exact_k : m.exact_v;
                segs.push_back({reinterpret_cast<const uint8_t*>(src.data() + g * m.exact_n * d), 0, m.exact_n, true});
            } else {
                (role == 0 ? h.k : h.v).view(segs, role == 0 ? hv[size_t(g)].k : hv[size_t(g)].v);
            }
            ranges.emplace_back(b, segs.size());
        }
    }
    for (int64_t g = 0; g < H; ++g) {
        const Head& h = m.head(layer, g);
        KvHeadView& v = hv[size_t(g)];
        v.k.fmt = h.k.codec().params(d);
        v.v.fmt = h.v.codec().params(d);
        v.k.window_fmt = exact ? m.exact : m.k_window;
        v.v.window_fmt = exact ? m.exact : m.v_window;
        const auto [kb, ke] = ranges[size_t(2 * g)];
        const auto [vb, ve] = ranges[size_t(2 * g + 1)];
        v.k.segs = segs.data() + kb;
        v.k.n_segs = int64_t(ke - kb);
        v.v.segs = segs.data() + vb;
        v.v.n_segs = int64_t(ve - vb);
        v.n_tokens = exact ? m.exact_n : h.size();
        v.pos = exact || h.pos.empty() ? nullptr : h.pos.data();
    }
    KvLayerView view;
    view.n_head = shape_.n_head;
    view.n_head_kv = H;
    view.head_dim = d;
    view.chunk = m.page_tokens;
    view.heads = hv.data();
    view.flash_attn = opts_.flash_attn;
    view.memory = opts_.memory;
    return view;
}

void KvCache::truncate(int64_t n) {
    VXQ_ASSERT(n >= 0);
    for (Head& h : impl_->heads) h.truncate(h.below(n));
    size_ = std::min(size_, n);
    if (evictor_) evictor_->after_truncate(*this);
}

void KvCache::shrink_to_fit() {
    for (Head& h : impl_->heads) {
        h.k.shrink_to_fit();
        h.v.shrink_to_fit();
    }
}

void KvCache::retain(int64_t layer, int64_t head, std::span<const uint8_t> keep) {
    Head& h = impl_->head(layer, head);
    const int64_t n = h.size();
    if (int64_t(keep.size()) != n) fail("retain: keep mask has {} entries for {} stored tokens", keep.size(), n);
    const int64_t first = std::find(keep.begin(), keep.end(), uint8_t(0)) - keep.begin();
    if (first == n) return;
    h.materialize_positions();
    std::vector<float> scratch;
    h.k.retain(first, keep, scratch);
    h.v.retain(first, keep, scratch);
    int64_t w = first;
    for (int64_t t = first; t < n; ++t) {
        if (keep[size_t(t)]) h.pos[size_t(w++)] = h.pos[size_t(t)];
    }
    h.pos.resize(size_t(w));
    h.pos.shrink_to_fit();
    VXQ_ASSERT(h.k.size() == w && h.v.size() == w);
}

int64_t KvCache::head_tokens(int64_t layer, int64_t head) const { return impl_->head(layer, head).size(); }

std::vector<int32_t> KvCache::head_positions(int64_t layer, int64_t head) const {
    const Head& h = impl_->head(layer, head);
    if (!h.pos.empty()) return h.pos;
    std::vector<int32_t> p(size_t(h.size()));
    for (size_t t = 0; t < p.size(); ++t) p[t] = int32_t(t);
    return p;
}

size_t KvCache::resident_bytes() const {
    const Impl& m = *impl_;
    size_t b = 0;
    for (const Head& h : m.heads) {
        b += h.k.page_bytes() + h.v.page_bytes() + h.k.window_bytes() + h.v.window_bytes() + h.pos.capacity() * sizeof(int32_t);
    }
    for (const auto& s : m.states) b += s ? s->bytes() : 0;
    return b + (m.windows ? m.windows->resident_bytes() : 0);
}

size_t KvCache::bytes_for_tokens(int64_t n) const {
    const Impl& m = *impl_;
    const size_t pages = size_t((n + m.page_tokens - 1) / m.page_tokens);
    // Each stream holds whole commits of its memory (2 MiB chunks on a GPU).
    const size_t g = std::max<size_t>(1, m.mem->commit_granularity());
    const auto held = [g](size_t bytes) { return (bytes + g - 1) / g * g; };
    size_t per_head = held(pages * m.k_page_bytes) + held(pages * m.v_page_bytes);
    const Head& h0 = m.heads.front();
    if (!m.windows) {  // host rings, allocated with a stream's first token
        for (const Codec* c : {&h0.k.codec(), &h0.v.codec()}) {
            per_head += size_t(window_slots(*c) * shape_.head_dim) * sizeof(f16_t);
        }
    }
    size_t b = per_head * m.heads.size() + (m.windows ? m.windows->resident_bytes() : 0);
    for (const auto& s : m.states) b += s ? s->bytes() : 0;
    return b;
}

std::string KvCache::format() const { return format_name(impl_->k_name, impl_->v_name); }

void KvCache::dequantize(int64_t layer, int64_t head, int64_t n, std::vector<float>& k, std::vector<float>& v) const {
    const Head& h = impl_->head(layer, head);
    VXQ_ASSERT(n >= 0 && n <= h.size());
    h.k.decode_all(k);
    h.v.decode_all(v);
    k.resize(size_t(n * shape_.head_dim));
    v.resize(size_t(n * shape_.head_dim));
}

bool KvCache::observes_attention() const { return observer_ || (evictor_ && evictor_->wants_queries()); }

void KvCache::observe_attention(int64_t layer, const float* q, int64_t n_q, int64_t pos0, const float* out) const {
    if (observer_) observer_->on_attention(layer, q, n_q, pos0, out);
    if (evictor_ && evictor_->wants_queries()) evictor_->on_queries(layer, q, n_q, pos0);
}

bool KvCache::wants_attention_mass(int64_t layer) const {
    return (observer_ && observer_->wants_attention_mass(layer)) || (evictor_ && evictor_->wants_attention_mass());
}

void KvCache::on_attention_mass(int64_t layer, int64_t head, const float* mass, int64_t n_tokens) {
    if (observer_ && observer_->wants_attention_mass(layer)) observer_->on_attention_mass(layer, head, mass, n_tokens);
    if (evictor_ && evictor_->wants_attention_mass()) evictor_->add_attention_mass(layer, head, mass, n_tokens);
}

std::unique_ptr<KvCache> make_kv_cache(const KvShape& shape, const KvSpec& spec, const KvCacheOptions& opts) {
    return std::make_unique<KvCache>(shape, spec, opts);
}

std::unique_ptr<KvCache> make_kv_cache(const KvShape& shape, const std::string& k_spec, const std::string& v_spec,
                                       const KvCacheOptions& opts) {
    return make_kv_cache(shape, KvSpec{CodecSpec::parse(k_spec), CodecSpec::parse(v_spec)}, opts);
}

double resident_bits_per_element(const KvCache& c, int64_t tokens) {
    const KvShape& s = c.shape();
    if (tokens <= 0) return 0.0;
    return 8.0 * double(c.resident_bytes()) / double(2 * s.n_layer * s.n_head_kv * s.head_dim * tokens);
}

}  // namespace vxq

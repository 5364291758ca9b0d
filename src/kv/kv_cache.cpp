// Storage of the KV cache: a page arena per role (K, V), per (layer, KV head) a key stream and a
// value stream over the arena's pages plus a small fp16 window, and the positions of the head's
// tokens. Nothing here computes attention: backends read `view()`.
#include "kv/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "kv/codec.h"

namespace vxq {

namespace {

constexpr int64_t kMinPageTokens = 64;  // tokens per page (and per attention chunk): <= 63 unused per stream

// Fixed-size pages, handed out by id. A freed page's memory goes back to the system at once,
// so resident bytes fall when tokens are evicted; ids are reused.
class PageArena {
public:
    explicit PageArena(size_t page_bytes) : page_bytes_(page_bytes) {}

    uint32_t alloc() {
        uint32_t id;
        if (!free_.empty()) {
            id = free_.back();
            free_.pop_back();
        } else {
            id = uint32_t(pages_.size());
            pages_.emplace_back();
        }
        pages_[id] = std::make_unique<uint8_t[]>(page_bytes_);
        ++live_;
        return id;
    }
    void release(uint32_t id) {
        VXQ_ASSERT(id < pages_.size() && pages_[id]);
        pages_[id].reset();
        free_.push_back(id);
        --live_;
    }
    uint8_t* data(uint32_t id) const { return pages_[id].get(); }
    size_t page_bytes() const { return page_bytes_; }
    size_t resident_bytes() const { return live_ * page_bytes_; }

private:
    size_t page_bytes_;
    std::vector<std::unique_ptr<uint8_t[]>> pages_;
    std::vector<uint32_t> free_;
    size_t live_ = 0;
};

// One (layer, KV head) stream of keys or values. Stored tokens [0, n_enc) are packed blocks in
// pages; [n_enc, n_enc + n_pending) wait in an fp16 ring of flush_at() tokens (absent when the
// codec encodes every token on arrival).
class Stream {
public:
    Stream(std::unique_ptr<Codec> codec, PageArena& arena, int64_t d, int64_t page_tokens)
        : codec_(std::move(codec)), arena_(&arena), d_(d), page_tokens_(page_tokens) {
        bt_ = codec_->block_tokens();
        bb_ = codec_->block_bytes(d);
        window_ = codec_->flush_at() > 1 ? codec_->flush_at() : 0;
        VXQ_ASSERT(page_tokens_ % bt_ == 0 && codec_->flush_count() % bt_ == 0);
    }
    Stream(Stream&&) = default;
    ~Stream() {
        if (arena_) for (uint32_t id : pages_) arena_->release(id);
    }

    int64_t size() const { return n_enc_ + n_pending_; }
    const Codec& codec() const { return *codec_; }

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
        if (ring_.empty()) ring_.resize(size_t(window_ * d_));  // allocated with the first token
        for (int64_t t = 0; t < n; ++t) {
            f16_t* slot = ring_.data() + ((head_ + n_pending_) % window_) * d_;
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
        std::vector<float> blk(size_t(bt_ * d_));
        if (partial > 0) codec_->decode(block_ptr(keep_blocks), d_, blk.data());
        n_enc_ = keep_blocks * bt_;
        n_pending_ = 0;
        head_ = 0;
        release_pages_from((n_enc_ + page_tokens_ - 1) / page_tokens_);
        for (int64_t t = 0; t < partial; ++t) {
            f16_t* slot = ring_.data() + t * d_;
            for (int64_t c = 0; c < d_; ++c) slot[c] = fp32_to_fp16(blk[size_t(t * d_ + c)]);
        }
        n_pending_ = partial;
    }

    // Keeps the stored tokens t >= first with keep[t] (tokens below `first` all stay). Token-wise
    // formats without a window move blocks (exact); the others decode the tail and append the
    // kept tokens again (a KIVI key group that loses a token is re-quantized without it).
    void retain(int64_t first, std::span<const uint8_t> keep, std::vector<float>& scratch) {
        const int64_t n = size();
        if (window_ == 0 && bt_ == 1) {
            int64_t w = first;
            for (int64_t t = first; t < n; ++t) {
                if (!keep[size_t(t)]) continue;
                if (w != t) std::memcpy(block_ptr(w), block_ptr(t), bb_);
                ++w;
            }
            n_enc_ = w;
            release_pages_from((n_enc_ + page_tokens_ - 1) / page_tokens_);
            return;
        }
        std::vector<float> all;
        decode_all(all);
        std::vector<float> kept;
        for (int64_t t = first; t < n; ++t) {
            if (keep[size_t(t)]) kept.insert(kept.end(), all.begin() + t * d_, all.begin() + (t + 1) * d_);
        }
        truncate(first);
        append(kept.data(), int64_t(kept.size()) / d_, scratch);
    }

    // Segments in stored order: one per page, then the ring's one or two runs.
    void view(std::vector<KvSegment>& out) const {
        for (int64_t p = 0; p * page_tokens_ < n_enc_; ++p) {
            const int64_t first = p * page_tokens_;
            out.push_back({arena_->data(pages_[size_t(p)]), first, std::min(page_tokens_, n_enc_ - first), false});
        }
        if (n_pending_ > 0) {
            const int64_t run1 = std::min(n_pending_, window_ - head_);
            const auto* base = reinterpret_cast<const uint8_t*>(ring_.data());
            out.push_back({base + head_ * d_ * 2, n_enc_, run1, true});
            if (run1 < n_pending_) out.push_back({base, n_enc_ + run1, n_pending_ - run1, true});
        }
    }

    size_t window_bytes() const { return ring_.size() * sizeof(f16_t); }
    size_t pages_held() const { return pages_.size(); }

    // Dequantized tokens [0, size()) for tests and references.  out: [size(), d]
    void decode_all(std::vector<float>& out) const {
        out.assign(size_t(size() * d_), 0.0f);
        for (int64_t b = 0; b * bt_ < n_enc_; ++b) codec_->decode(block_ptr(b), d_, out.data() + b * bt_ * d_);
        for (int64_t t = 0; t < n_pending_; ++t) {
            const f16_t* slot = ring_.data() + ((head_ + t) % window_) * d_;
            for (int64_t c = 0; c < d_; ++c) out[size_t((n_enc_ + t) * d_ + c)] = fp16_to_fp32(slot[c]);
        }
    }

private:
    uint8_t* block_ptr(int64_t b) const {
        const int64_t per_page = page_tokens_ / bt_;
        return arena_->data(pages_[size_t(b / per_page)]) + size_t(b % per_page) * bb_;
    }

    void release_pages_from(int64_t keep_pages) {
        while (int64_t(pages_.size()) > keep_pages) {
            arena_->release(pages_.back());
            pages_.pop_back();
        }
    }

    void encode_block(const float* x) {  // appends one block of bt_ tokens
        const int64_t b = n_enc_ / bt_;
        const int64_t per_page = page_tokens_ / bt_;
        if (b / per_page >= int64_t(pages_.size())) pages_.push_back(arena_->alloc());
        codec_->encode(x, d_, block_ptr(b));
        n_enc_ += bt_;
    }

    // Encodes the oldest flush_count() pending tokens (whole blocks) from the fp16 window.
    void flush(std::vector<float>& scratch) {
        const int64_t n = codec_->flush_count();
        scratch.resize(size_t(bt_ * d_));
        for (int64_t b = 0; b < n / bt_; ++b) {
            for (int64_t t = 0; t < bt_; ++t) {
                const f16_t* slot = ring_.data() + ((head_ + b * bt_ + t) % window_) * d_;
                for (int64_t c = 0; c < d_; ++c) scratch[size_t(t * d_ + c)] = fp16_to_fp32(slot[c]);
            }
            encode_block(scratch.data());
        }
        head_ = (head_ + n) % window_;
        n_pending_ -= n;
    }

    std::unique_ptr<Codec> codec_;
    PageArena* arena_;
    int64_t d_, page_tokens_, bt_ = 1, window_ = 0;
    size_t bb_ = 0;
    std::vector<uint32_t> pages_;  // the page table: page p holds stored tokens [p * page_tokens, ...)
    std::vector<f16_t> ring_;
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
    void truncate(int64_t n_stored) {
        k.truncate(n_stored);
        v.truncate(n_stored);
        if (!pos.empty()) pos.resize(size_t(n_stored));
    }
};

}  // namespace

struct KvCache::Impl {
    KvShape shape;
    int64_t page_tokens = kMinPageTokens;
    std::unique_ptr<PageArena> k_arena, v_arena;
    std::vector<std::unique_ptr<KvLayerState>> states;  // [layer * 2 + role], nullptr when none
    std::vector<Head> heads;                             // [layer * n_head_kv + g]
    std::string k_name, v_name;
    KvFormatParams k_window{KvFormatKind::F16}, v_window{KvFormatKind::F16}, exact{KvFormatKind::F32};
    // --prefill-exact: the exact K/V of the batch of `exact_layer`   [n_head_kv, n, head_dim]
    int64_t exact_layer = -1, exact_n = 0;
    std::vector<float> exact_k, exact_v;
    // View storage per layer (rebuilt by view()).
    mutable std::vector<std::vector<KvSegment>> segs;
    mutable std::vector<std::vector<KvHeadView>> head_views;

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
    const auto probe_k = make_codec(spec.k, KvRole::Key, s.head_dim);
    const auto probe_v = make_codec(spec.v, KvRole::Value, s.head_dim);
    m.k_name = probe_k->spec();
    m.v_name = probe_v->spec();
    const int64_t bt = std::max(probe_k->block_tokens(), probe_v->block_tokens());
    m.page_tokens = (std::max(kMinPageTokens, bt) + bt - 1) / bt * bt;
    VXQ_ASSERT(m.page_tokens % probe_k->block_tokens() == 0 && m.page_tokens % probe_v->block_tokens() == 0);
    m.k_arena = std::make_unique<PageArena>(size_t(m.page_tokens / probe_k->block_tokens()) * probe_k->block_bytes(s.head_dim));
    m.v_arena = std::make_unique<PageArena>(size_t(m.page_tokens / probe_v->block_tokens()) * probe_v->block_bytes(s.head_dim));
    m.k_window.block_bytes = m.v_window.block_bytes = size_t(s.head_dim) * 2;
    m.exact.block_bytes = size_t(s.head_dim) * 4;
    m.heads.reserve(size_t(s.n_layer * s.n_head_kv));
    for (int64_t l = 0; l < s.n_layer; ++l) {
        m.states.push_back(make_layer_state(spec.k, KvRole::Key, s.head_dim, l));
        m.states.push_back(make_layer_state(spec.v, KvRole::Value, s.head_dim, l));
        const KvLayerState* ks = m.states[size_t(2 * l)].get();
        const KvLayerState* vs = m.states[size_t(2 * l + 1)].get();
        for (int64_t g = 0; g < s.n_head_kv; ++g) {
            m.heads.push_back(Head{Stream(make_codec(spec.k, KvRole::Key, s.head_dim, ks), *m.k_arena, s.head_dim, m.page_tokens),
                                   Stream(make_codec(spec.v, KvRole::Value, s.head_dim, vs), *m.v_arena, s.head_dim, m.page_tokens),
                                   {}});
        }
    }
    m.segs.resize(size_t(s.n_layer));
    m.head_views.resize(size_t(s.n_layer));
}

KvCache::~KvCache() = default;

void KvCache::write(int64_t layer, int64_t pos0, const float* k, const float* v, int64_t n) {
    VXQ_ASSERT(layer >= 0 && layer < shape_.n_layer && pos0 >= 0 && n >= 0 && pos0 + n <= shape_.n_ctx);
    Impl& m = *impl_;
    if (observer_) observer_->on_write(layer, pos0, k, v, n);
    const int64_t d = shape_.head_dim, H = shape_.n_head_kv;
    m.exact_layer = -1;
    if (opts_.prefill_exact && pos0 == 0 && n > 1) {  // kept until the next write or commit
        m.exact_layer = layer;
        m.exact_n = n;
        m.exact_k.resize(size_t(H * n * d));
        m.exact_v.resize(size_t(H * n * d));
        for (int64_t g = 0; g < H; ++g)
            for (int64_t t = 0; t < n; ++t) {
                std::memcpy(&m.exact_k[size_t((g * n + t) * d)], k + (t * H + g) * d, size_t(d) * 4);
                std::memcpy(&m.exact_v[size_t((g * n + t) * d)], v + (t * H + g) * d, size_t(d) * 4);
            }
    }
    std::vector<float> head_major(size_t(n * d)), scratch;
    for (int64_t g = 0; g < H; ++g) {
        Head& h = m.head(layer, g);
        h.truncate(h.below(pos0));
        if (h.pos.empty() && h.size() != pos0) h.materialize_positions();
        if (!h.pos.empty() || (h.size() == 0 && pos0 > 0)) {
            for (int64_t t = 0; t < n; ++t) h.pos.push_back(int32_t(pos0 + t));
        }
        for (int64_t t = 0; t < n; ++t) std::memcpy(&head_major[size_t(t * d)], k + (t * H + g) * d, size_t(d) * 4);
        h.k.append(head_major.data(), n, scratch);
        for (int64_t t = 0; t < n; ++t) std::memcpy(&head_major[size_t(t * d)], v + (t * H + g) * d, size_t(d) * 4);
        h.v.append(head_major.data(), n, scratch);
    }
}

void KvCache::commit(int64_t n) {
    VXQ_ASSERT(n >= 0 && n <= shape_.n_ctx);
    impl_->exact_layer = -1;
    std::vector<float>().swap(impl_->exact_k);
    std::vector<float>().swap(impl_->exact_v);
    size_ = n;
}

KvLayerView KvCache::view(int64_t layer) const {
    VXQ_ASSERT(layer >= 0 && layer < shape_.n_layer);
    const Impl& m = *impl_;
    const int64_t H = shape_.n_head_kv, d = shape_.head_dim;
    auto& segs = m.segs[size_t(layer)];
    auto& hv = m.head_views[size_t(layer)];
    segs.clear();
    hv.assign(size_t(H), KvHeadView{});
    std::vector<std::pair<size_t, size_t>> ranges;  // [2 * g + role] -> (begin, end) in segs
    const bool exact = m.exact_layer == layer;
    for (int64_t g = 0; g < H; ++g) {
        const Head& h = m.head(layer, g);
        for (int role = 0; role < 2; ++role) {
            const size_t b = segs.size();
            if (exact) {
                const auto& src = role == 0 ? m.exact_k : m.exact_v;
                segs.push_back({reinterpret_cast<const uint8_t*>(src.data() + g * m.exact_n * d), 0, m.exact_n, true});
            } else {
                (role == 0 ? h.k : h.v).view(segs);
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
    return view;
}

void KvCache::truncate(int64_t n) {
    VXQ_ASSERT(n >= 0);
    for (Head& h : impl_->heads) h.truncate(h.below(n));
    size_ = std::min(size_, n);
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
    size_t b = m.k_arena->resident_bytes() + m.v_arena->resident_bytes();
    for (const Head& h : m.heads) b += h.k.window_bytes() + h.v.window_bytes() + h.pos.capacity() * sizeof(int32_t);
    for (const auto& s : m.states) b += s ? s->bytes() : 0;
    return b;
}

size_t KvCache::bytes_for_tokens(int64_t n) const {
    const Impl& m = *impl_;
    const size_t pages = size_t((n + m.page_tokens - 1) / m.page_tokens);
    size_t per_head = pages * (m.k_arena->page_bytes() + m.v_arena->page_bytes());
    const Head& h0 = m.heads.front();
    for (const Codec* c : {&h0.k.codec(), &h0.v.codec()}) {
        if (c->flush_at() > 1) per_head += size_t(c->flush_at() * shape_.head_dim) * sizeof(f16_t);
    }
    size_t b = per_head * m.heads.size();
    for (const auto& s : m.states) b += s ? s->bytes() : 0;
    return b;
}

std::string KvCache::format() const {
    const Impl& m = *impl_;
    return m.k_name == m.v_name ? m.k_name : "K " + m.k_name + " / V " + m.v_name;
}

void KvCache::dequantize(int64_t layer, int64_t head, int64_t n, std::vector<float>& k, std::vector<float>& v) const {
    const Head& h = impl_->head(layer, head);
    VXQ_ASSERT(n >= 0 && n <= h.size());
    h.k.decode_all(k);
    h.v.decode_all(v);
    k.resize(size_t(n * shape_.head_dim));
    v.resize(size_t(n * shape_.head_dim));
}

void KvCache::observe_attention(int64_t layer, const float* q, int64_t n_q, int64_t pos0, const float* out) const {
    if (observer_) observer_->on_attention(layer, q, n_q, pos0, out);
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

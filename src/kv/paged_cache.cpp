// The compressed cache: per (layer, KV head) a key stream and a value stream, each holding only
// packed codec blocks in fixed-size pages (allocated as tokens arrive, freed on truncate) plus a
// small fp16 residual window. Attention reads the pages in place (kernels/cpu/attention_fused).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "kernels/cpu/attention_fused.h"
#include "kv/codec.h"
#include "kv/kv_cache.h"

namespace vxq {

namespace {

constexpr int64_t kMinChunk = 64;  // tokens per attention chunk and per page (small pages: <= 63 tokens unused per stream)

// Tokens [0, n_enc) are packed blocks in pages; [n_enc, n_enc + n_pending) wait in an fp16
// ring of flush_at() tokens (absent when the codec encodes every token on arrival).
class Stream {
public:
    Stream(std::unique_ptr<Codec> codec, const Codec& residual_codec, int64_t d, int64_t page_tokens)
        : codec_(std::move(codec)), residual_reader_(&residual_codec.reader()), d_(d), page_tokens_(page_tokens) {
        bt_ = codec_->block_tokens();
        bb_ = codec_->block_bytes(d);
        window_ = codec_->flush_at() > 1 ? codec_->flush_at() : 0;
        ring_.resize(size_t(window_ * d));
        VXQ_ASSERT(page_tokens_ % bt_ == 0 && codec_->flush_count() % bt_ == 0);
    }

    int64_t size() const { return n_enc_ + n_pending_; }

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
        for (int64_t t = 0; t < n; ++t) {
            f16_t* slot = ring_.data() + ((head_ + n_pending_) % window_) * d_;
            for (int64_t c = 0; c < d_; ++c) slot[c] = fp32_to_fp16(x[t * d_ + c]);
            if (++n_pending_ == codec_->flush_at()) flush(scratch);
        }
    }

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
        pages_.resize(size_t((n_enc_ + page_tokens_ - 1) / page_tokens_));
        for (int64_t t = 0; t < partial; ++t) {
            f16_t* slot = ring_.data() + t * d_;
            for (int64_t c = 0; c < d_; ++c) slot[c] = fp32_to_fp16(blk[size_t(t * d_ + c)]);
        }
        n_pending_ = partial;
    }

    // Segments in token order: one per page, then the ring's one or two runs.
    const KvStreamView& view() const {
        view_.clear();
        for (int64_t p = 0; p * page_tokens_ < n_enc_; ++p) {
            const int64_t first = p * page_tokens_;
            view_.push_back({&codec_->reader(), pages_[size_t(p)].get(), first,
                             std::min(page_tokens_, n_enc_ - first), bt_, bb_});
        }
        if (n_pending_ > 0) {
            const int64_t run1 = std::min(n_pending_, window_ - head_);
            const auto* base = reinterpret_cast<const uint8_t*>(ring_.data());
            view_.push_back({residual_reader_, base + head_ * d_ * 2, n_enc_, run1, 1, size_t(d_ * 2)});
            if (run1 < n_pending_) {
                view_.push_back({residual_reader_, base, n_enc_ + run1, n_pending_ - run1, 1, size_t(d_ * 2)});
            }
        }
        return view_;
    }

    size_t resident_bytes() const {
        return pages_.size() * size_t(page_tokens_ / bt_) * bb_ + ring_.size() * sizeof(f16_t);
    }

    // Dequantized tokens [0, size()) for tests and references.  out: [size(), d]
    void decode_all(std::vector<float>& out) const {
        out.assign(size_t(size() * d_), 0.0f);
        for (int64_t b = 0; b * bt_ < n_enc_; ++b) codec_->decode(block_ptr(b), d_, out.data() + b * bt_ * d_);
        for (int64_t t = 0; t < n_pending_; ++t) {
            const f16_t* slot = ring_.data() + ((head_ + t) % window_) * d_;
            for (int64_t c = 0; c < d_; ++c) out[size_t((n_enc_ + t) * d_ + c)] = fp16_to_fp32(slot[c]);
        }
    }

    const Codec& codec() const { return *codec_; }

private:
    uint8_t* block_ptr(int64_t b) const {
        const int64_t per_page = page_tokens_ / bt_;
        return pages_[size_t(b / per_page)].get() + size_t(b % per_page) * bb_;
    }

    void encode_block(const float* x) {  // appends one block of bt_ tokens
        const int64_t b = n_enc_ / bt_;
        const int64_t per_page = page_tokens_ / bt_;
        if (b / per_page >= int64_t(pages_.size())) pages_.push_back(std::make_unique<uint8_t[]>(size_t(per_page) * bb_));
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
    const CodecReader* residual_reader_;
    int64_t d_, page_tokens_, bt_ = 1, window_ = 0;
    size_t bb_ = 0;
    std::vector<std::unique_ptr<uint8_t[]>> pages_;
    std::vector<f16_t> ring_;
    int64_t head_ = 0, n_enc_ = 0, n_pending_ = 0;
    bool observed_ = false;
    mutable KvStreamView view_;
};

class PagedCache final : public KvCache {
public:
    PagedCache(const KvShape& s, const CodecSpec& k_spec, const CodecSpec& v_spec, bool prefill_exact)
        : shape_(s), prefill_exact_(prefill_exact) {
        residual_k_ = make_codec(CodecSpec{"f16", {}}, KvRole::Key, s.head_dim);
        residual_v_ = make_codec(CodecSpec{"f16", {}}, KvRole::Value, s.head_dim);
        exact_ = make_codec(CodecSpec{"f32", {}}, KvRole::Key, s.head_dim);
        auto probe_k = make_codec(k_spec, KvRole::Key, s.head_dim);
        auto probe_v = make_codec(v_spec, KvRole::Value, s.head_dim);
        k_spec_ = probe_k->spec();
        v_spec_ = probe_v->spec();
        const int64_t bt = std::max(probe_k->block_tokens(), probe_v->block_tokens());
        chunk_ = std::max(kMinChunk, bt);
        chunk_ = (chunk_ + bt - 1) / bt * bt;
        const int64_t page = chunk_;
        for (int64_t l = 0; l < s.n_layer; ++l) {
            for (int64_t g = 0; g < s.n_head_kv; ++g) {
                k_.emplace_back(make_codec(k_spec, KvRole::Key, s.head_dim), *residual_k_, s.head_dim, page);
                v_.emplace_back(make_codec(v_spec, KvRole::Value, s.head_dim), *residual_v_, s.head_dim, page);
            }
        }
    }

    const KvShape& shape() const override { return shape_; }
    int64_t size() const override { return size_; }

    void write(int64_t layer, int64_t pos0, const float* k, const float* v, int64_t n) override {
        VXQ_ASSERT(layer >= 0 && layer < shape_.n_layer && pos0 >= 0 && pos0 + n <= shape_.n_ctx);
        const int64_t d = shape_.head_dim, H = shape_.n_head_kv;
        std::vector<float> head_major(size_t(n * d)), scratch;
        if (prefill_exact_ && pos0 == 0 && n > 1) {  // kept until this layer's attend
            exact_layer_ = layer;
            exact_k_.assign(size_t(H * n * d), 0.0f);
            exact_v_.assign(size_t(H * n * d), 0.0f);
            for (int64_t g = 0; g < H; ++g)
                for (int64_t t = 0; t < n; ++t) {
                    std::memcpy(&exact_k_[size_t((g * n + t) * d)], k + (t * H + g) * d, size_t(d) * 4);
                    std::memcpy(&exact_v_[size_t((g * n + t) * d)], v + (t * H + g) * d, size_t(d) * 4);
                }
        }
        for (int64_t g = 0; g < H; ++g) {
            Stream& ks = k_[size_t(layer * H + g)];
            Stream& vs = v_[size_t(layer * H + g)];
            ks.truncate(pos0);
            vs.truncate(pos0);
            for (int64_t t = 0; t < n; ++t) std::memcpy(&head_major[size_t(t * d)], k + (t * H + g) * d, size_t(d) * 4);
            ks.append(head_major.data(), n, scratch);
            for (int64_t t = 0; t < n; ++t) std::memcpy(&head_major[size_t(t * d)], v + (t * H + g) * d, size_t(d) * 4);
            vs.append(head_major.data(), n, scratch);
        }
    }

    void commit(int64_t n) override { size_ = n; }

    void attend(int64_t layer, const float* q, int64_t n_q, int64_t pos0, float* out, ThreadPool& pool) const override {
        const int64_t H = shape_.n_head_kv;
        std::vector<const KvStreamView*> kv(size_t(2 * H));
        std::vector<KvStreamView> exact(size_t(2 * H));
        const bool use_exact = exact_layer_ == layer && pos0 == 0;
        for (int64_t g = 0; g < H; ++g) {
            if (use_exact) {  // the batch's own f32 K/V, read through the f32 codec's reader
                const int64_t n = int64_t(exact_k_.size()) / (H * shape_.head_dim);
                const size_t row = size_t(shape_.head_dim) * 4;
                exact[size_t(g)] = {{&exact_->reader(), reinterpret_cast<const uint8_t*>(&exact_k_[size_t(g * n) * row / 4]), 0, n, 1, row}};
                exact[size_t(H + g)] = {{&exact_->reader(), reinterpret_cast<const uint8_t*>(&exact_v_[size_t(g * n) * row / 4]), 0, n, 1, row}};
                kv[size_t(g)] = &exact[size_t(g)];
                kv[size_t(H + g)] = &exact[size_t(H + g)];
            } else {
                kv[size_t(g)] = &k_[size_t(layer * H + g)].view();
                kv[size_t(H + g)] = &v_[size_t(layer * H + g)].view();
            }
        }
        cpu::FusedAttentionArgs a;
        a.q = q;
        a.out = out;
        a.n_q = n_q;
        a.pos0 = pos0;
        a.n_head = shape_.n_head;
        a.n_head_kv = H;
        a.head_dim = shape_.head_dim;
        a.scale = 1.0f / std::sqrt(float(shape_.head_dim));
        a.chunk = chunk_;
        a.keys = [&](int64_t g) -> const KvStreamView& { return *kv[size_t(g)]; };
        a.values = [&](int64_t g) -> const KvStreamView& { return *kv[size_t(H + g)]; };
        cpu::attention_fused(a, pool);
        if (use_exact) {
            exact_layer_ = -1;
            std::vector<float>().swap(exact_k_);
            std::vector<float>().swap(exact_v_);
        }
    }

    void truncate(int64_t n) override {
        VXQ_ASSERT(n >= 0);
        for (auto& s : k_) s.truncate(n);
        for (auto& s : v_) s.truncate(n);
        size_ = std::min(size_, n);
    }

    size_t resident_bytes() const override {
        size_t b = 0;
        for (const auto& s : k_) b += s.resident_bytes();
        for (const auto& s : v_) b += s.resident_bytes();
        return b;
    }

    std::string format() const override { return k_spec_ == v_spec_ ? k_spec_ : "K " + k_spec_ + " / V " + v_spec_; }
    void dequantize(int64_t layer, int64_t head, int64_t n, std::vector<float>& k, std::vector<float>& v) const override {
        const Stream& ks = k_[size_t(layer * shape_.n_head_kv + head)];
        const Stream& vs = v_[size_t(layer * shape_.n_head_kv + head)];
        VXQ_ASSERT(n >= 0 && n <= ks.size() && n <= vs.size());
        ks.decode_all(k);
        vs.decode_all(v);
        k.resize(size_t(n * shape_.head_dim));
        v.resize(size_t(n * shape_.head_dim));
    }

private:
    KvShape shape_;
    std::unique_ptr<Codec> residual_k_, residual_v_, exact_;
    bool prefill_exact_ = false;
    mutable int64_t exact_layer_ = -1;             // layer whose batch K/V are held exactly (prefill_exact)
    mutable std::vector<float> exact_k_, exact_v_;  // [n_head_kv, n, head_dim]
    std::vector<Stream> k_, v_;  // [layer * n_head_kv + g]
    std::string k_spec_, v_spec_;
    int64_t chunk_ = kMinChunk;
    int64_t size_ = 0;
};

}  // namespace

std::unique_ptr<KvCache> make_paged_cache(const KvShape& shape, const CodecSpec& k, const CodecSpec& v,
                                          bool prefill_exact) {
    return std::make_unique<PagedCache>(shape, k, v, prefill_exact);
}

}  // namespace vxq

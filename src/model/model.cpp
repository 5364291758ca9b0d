#include "model/model.h"

#include <array>
#include <numeric>

#include "core/error.h"
#include "kv/kv_cache.h"

namespace vxq {

namespace {

// The forward pass's activation buffers (Backend::activation_buffer ids).
enum ActivationId : int { kResidual, kNormed, kQ, kK, kV, kAttn, kGate, kUp, kLogits, kActivations };

// Floats per token of each activation buffer, by ActivationId (c: the rank's config; kLogits, a
// tensor-parallel rank's slice of the vocabulary, is sized apart).
std::array<int64_t, kActivations - 1> activation_widths(const ModelConfig& c) {
    return {c.n_embd, c.n_embd, c.q_dim(), c.kv_dim(), c.kv_dim(), c.q_dim(), c.n_ff, c.n_ff};
}

// The vocabulary rows of each rank (tensor parallelism: the output matrix split by rows).
std::vector<int64_t> vocab_split(int64_t n_vocab, int size) {
    std::vector<int64_t> w;
    for (int r = 0; r < size; ++r) w.push_back(tp_begin(n_vocab, r + 1, size) - tp_begin(n_vocab, r, size));
    return w;
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& path, std::string_view backend, TpRank tp) {
    VXQ_ASSERT(tp.rank >= 0 && tp.rank < tp.size);
    std::unique_ptr<Model> m(new Model(GgufFile::open(path)));
    m->cfg_ = ModelConfig::from_gguf(m->file_);
    m->w_ = ModelWeights::from_gguf(m->file_, m->cfg_, backend);
    m->tok_ = Tokenizer::create(Vocab::from_gguf(m->file_));
    if (m->tok_->n_vocab() != m->cfg_.n_vocab) {
        fail("{}: tokenizer has {} tokens but token_embd.weight has {} rows", path, m->tok_->n_vocab(), m->cfg_.n_vocab);
    }
    check_tp_split(m->cfg_, m->w_, tp.size, path);
    m->tp_ = tp;
    m->local_ = shard_config(m->cfg_, tp);
    m->w_ = shard_weights(m->w_, m->cfg_, tp, m->owned_);
    return m;
}

void Model::fill_kv(Backend& be, KvCache& cache, std::span<const TokenId> tokens) const {
    const ModelConfig& c = local_;
    const int64_t n = int64_t(tokens.size());
    const int64_t pos0 = cache.size();
    VXQ_ASSERT(n > 0 && cache.shape().n_head_kv == c.n_head_kv);
    check_batch(tokens, pos0, cache.shape().n_ctx);
    if (cache.observes_attention()) {
        fail("--depth-fill kv: this cache's observer or eviction policy reads the queries or the attention, which the fill does not run");
    }
    const auto width = activation_widths(c);
    const auto buffer = [&](ActivationId id) { return be.activation_buffer(id, size_t(n * width[id])); };
    float* x = buffer(kResidual);
    float* cur = buffer(kNormed);
    float* k = buffer(kK);
    float* v = buffer(kV);
    const RopeParams rope{c.n_rot, c.rope_freq_base, c.rope_style == RopeStyle::NeoX};
    be.embed(w_.token_embd, tokens.data(), n, x);
    for (int64_t il = 0; il < c.n_layer; ++il) {
        if (cache.wants_attention_mass(il)) {
            fail("--depth-fill kv: this cache's eviction scores tokens by the attention, which the fill does not run");
        }
        const LayerWeights& L = w_.layers[size_t(il)];
        be.rms_norm(x, L.attn_norm, n, c.n_embd, c.rms_eps, cur);
        be.matmul(L.wk, cur, n, k);
        be.matmul(L.wv, cur, n, v);
        if (c.attn_qkv_bias) {
            be.add_bias(k, L.bk, n, c.kv_dim());
            be.add_bias(v, L.bv, n, c.kv_dim());
        }
        if (c.attn_qk_norm) be.rms_norm(k, L.k_norm, n * c.n_head_kv, c.head_dim, c.rms_eps, k);
        be.rope(k, n, c.n_head_kv, c.head_dim, pos0, rope);
        be.kv_write(cache, il, pos0, k, v, n);
    }
    cache.commit(pos0 + n);
    be.sync();  // the fill's work done before the caller times anything (nothing is read back)
}

void Model::forward(Backend& be, KvCache& cache, std::span<const TokenId> tokens, int64_t n_out,
                    float* logits) const {
    const ModelConfig& c = local_;  // this rank's heads and FFN width (the whole model's outside a group)
    const int64_t n = int64_t(tokens.size());
    const int64_t pos0 = cache.size();
    VXQ_ASSERT(n > 0 && n_out >= 1 && n_out <= n && (logits || tp_.rank > 0));
    VXQ_ASSERT(cache.shape().n_head_kv == c.n_head_kv && be.tp_size() == tp_.size && be.tp_rank() == tp_.rank);
    check_batch(tokens, pos0, cache.shape().n_ctx);

    // Activations for the whole batch, in the backend's memory: kept by the backend between
    // calls, so a forward pass allocates nothing once the context's largest batch has run.
    const auto width = activation_widths(c);
    const auto buffer = [&](ActivationId id) { return be.activation_buffer(id, size_t(n * width[id])); };
    float* x = buffer(kResidual);  // residual stream [n, n_embd]
    float* cur = buffer(kNormed);  // normed input    [n, n_embd]
    float* q = buffer(kQ);         // [n, n_head, head_dim]
    float* k = buffer(kK);         // [n, n_head_kv, head_dim]
    float* v = buffer(kV);         // [n, n_head_kv, head_dim]
    float* attn = buffer(kAttn);   // [n, n_head, head_dim]
    float* gate = buffer(kGate);   // [n, n_ff]
    float* up = buffer(kUp);       // [n, n_ff]
    const RopeParams rope{c.n_rot, c.rope_freq_base, c.rope_style == RopeStyle::NeoX};

    be.embed(w_.token_embd, tokens.data(), n, x);
    for (int64_t il = 0; il < c.n_layer; ++il) {
        const LayerWeights& L = w_.layers[size_t(il)];
        be.rms_norm(x, L.attn_norm, n, c.n_embd, c.rms_eps, cur);
        be.matmul(L.wq, cur, n, q);
        be.matmul(L.wk, cur, n, k);
        be.matmul(L.wv, cur, n, v);
        if (c.attn_qkv_bias) {
            be.add_bias(q, L.bq, n, c.q_dim());
            be.add_bias(k, L.bk, n, c.kv_dim());
            be.add_bias(v, L.bv, n, c.kv_dim());
        }
        if (c.attn_qk_norm) {
            be.rms_norm(q, L.q_norm, n * c.n_head, c.head_dim, c.rms_eps, q);
            be.rms_norm(k, L.k_norm, n * c.n_head_kv, c.head_dim, c.rms_eps, k);
        }
        be.rope(q, n, c.n_head, c.head_dim, pos0, rope);
        be.rope(k, n, c.n_head_kv, c.head_dim, pos0, rope);
        be.kv_write(cache, il, pos0, k, v, n);
        if (cache.wants_attention_mass(il)) {  // the score observer or the eviction policy (H2O, SnapKV): per stored token
            std::vector<std::vector<float>> mass(size_t(c.n_head_kv));
            std::vector<float*> heads;
            for (int64_t g = 0; g < c.n_head_kv; ++g) {
                mass[size_t(g)].assign(size_t(cache.head_tokens(il, g)), 0.0f);
                heads.push_back(mass[size_t(g)].data());
            }
            be.attention(cache.view(il), q, n, pos0, attn, heads.data());
            for (int64_t g = 0; g < c.n_head_kv; ++g) cache.on_attention_mass(il, g, heads[size_t(g)], int64_t(mass[size_t(g)].size()));
        } else {
            be.attention(cache.view(il), q, n, pos0, attn);
        }
        if (cache.observes_attention()) {
            cache.observe_attention(il, be.to_host(q, size_t(n * c.q_dim()), 0), n, pos0,
                                    be.to_host(attn, size_t(n * c.q_dim()), 1));
        }
        be.matmul(L.wo, attn, n, cur);
        add_partial_sums(be, x, cur, n * c.n_embd);

        // After the last attention only the rows whose logits are wanted matter; llama.cpp
        // drops the others there too, so its last FFN runs (and orders its sums) on n_out rows.
        const int64_t m = il + 1 == c.n_layer ? n_out : n;
        float* xs = x + (n - m) * c.n_embd;
        be.rms_norm(xs, L.ffn_norm, m, c.n_embd, c.rms_eps, cur);
        be.matmul(L.w_gate, cur, m, gate);
        be.matmul(L.w_up, cur, m, up);
        be.swiglu(gate, up, m, c.n_ff);
        be.matmul(L.w_down, gate, m, cur);
        add_partial_sums(be, xs, cur, m * c.n_embd);
    }
    cache.commit(pos0 + n);

    const float* last = x + (n - n_out) * c.n_embd;
    be.rms_norm(last, w_.output_norm, n_out, c.n_embd, c.rms_eps, cur);
    if (tp_.size == 1) {
        be.matmul(w_.output, cur, n_out, logits);
        return;
    }
    // The output matrix split by vocabulary rows: each rank's logits columns, gathered on rank 0.
    float* part = be.activation_buffer(kLogits, size_t(n_out * w_.output.rows));
    be.matmul(w_.output, cur, n_out, part);
    be.gather_columns(part, n_out, vocab_split(c.n_vocab, tp_.size), tp_.rank == 0 ? logits : nullptr);
}

void Model::check_batch(std::span<const TokenId> tokens, int64_t cached, int64_t n_ctx) const {
    const int64_t n = int64_t(tokens.size());
    if (cached + n > n_ctx) fail("context is full: {} cached + {} new tokens exceed the context size {}", cached, n, n_ctx);
    for (const TokenId t : tokens) {
        if (t < 0 || t >= cfg_.n_vocab) fail("token id {} is outside the vocabulary [0, {})", t, cfg_.n_vocab);
    }
}

void Model::add_partial_sums(Backend& be, float* x, float* part, int64_t n) const {
    // One rank: x += its product (a device backend fuses the add into the matmul's store).
    // Row-parallel: x += the sum of every rank's partial product. Rank 0 adds its own to x alike,
    // so x is its share; the others send their products; every rank's x receives the sum, and no
    // rank runs an add kernel of its own.
    if (tp_.rank == 0) be.add(x, part, n);
    if (tp_.size > 1) be.all_reduce_sum(tp_.rank == 0 ? x : part, x, n);
}

size_t Model::weight_bytes(const Backend* copier) const {
    const auto held = [copier](GgmlType type, size_t bytes) { return copier ? copier->copied_weight_bytes(type, bytes) : bytes; };
    size_t bytes = 0;
    if (tp_.size == 1) {
        for (const GgufTensorInfo& t : file_.tensors()) bytes += held(t.type, t.n_bytes);
        return bytes;
    }
    const auto matrix = [&held](const WeightView& w) { return held(w.type, size_t(w.rows) * w.row_bytes); };
    const auto norm = [&](const float* p, int64_t n) { return p ? size_t(n) * sizeof(float) : 0; };
    bytes += matrix(w_.token_embd) + norm(w_.output_norm, cfg_.n_embd) + (w_.tied_output ? 0 : matrix(w_.output));
    for (const LayerWeights& L : w_.layers) {
        for (const WeightView* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) bytes += matrix(*m);
        bytes += norm(L.attn_norm, cfg_.n_embd) + norm(L.ffn_norm, cfg_.n_embd) + norm(L.bq, local_.q_dim()) +
                 2 * norm(L.bk, local_.kv_dim()) + 2 * norm(L.q_norm, cfg_.head_dim);
    }
    return bytes;
}

size_t Model::activation_bytes(int64_t n_tokens) const {
    const auto width = activation_widths(local_);
    const int64_t logits = tp_.size > 1 ? w_.output.rows : 0;  // a rank's slice of the logits (forward)
    return size_t(n_tokens * (std::accumulate(width.begin(), width.end(), int64_t(0)) + logits)) * sizeof(float);
}

}  // namespace vxq

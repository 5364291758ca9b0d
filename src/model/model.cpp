#include "model/model.h"

#include <array>
#include <numeric>

#include "core/error.h"
#include "kv/kv_cache.h"

namespace vxq {

namespace {

// The forward pass's activation buffers (Backend::activation_buffer ids).
enum ActivationId : int { kResidual, kNormed, kQ, kK, kV, kAttn, kGate, kUp, kActivations };

// Floats per token of each activation buffer, by ActivationId.
std::array<int64_t, kActivations> activation_widths(const ModelConfig& c) {
    return {c.n_embd, c.n_embd, c.q_dim(), c.kv_dim(), c.kv_dim(), c.q_dim(), c.n_ff, c.n_ff};
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& path, std::string_view backend) {
    std::unique_ptr<Model> m(new Model(GgufFile::open(path)));
    m->cfg_ = ModelConfig::from_gguf(m->file_);
    m->w_ = ModelWeights::from_gguf(m->file_, m->cfg_, backend);
    m->tok_ = Tokenizer::create(Vocab::from_gguf(m->file_));
    if (m->tok_->n_vocab() != m->cfg_.n_vocab) {
        fail("{}: tokenizer has {} tokens but token_embd.weight has {} rows", path, m->tok_->n_vocab(), m->cfg_.n_vocab);
    }
    return m;
}

void Model::forward(Backend& be, KvCache& cache, std::span<const TokenId> tokens, int64_t n_out,
                    float* logits) const {
    const ModelConfig& c = cfg_;
    const int64_t n = int64_t(tokens.size());
    const int64_t pos0 = cache.size();
    VXQ_ASSERT(n > 0 && n_out >= 1 && n_out <= n);
    if (pos0 + n > cache.shape().n_ctx) {
        fail("context is full: {} cached + {} new tokens exceed the context size {}", pos0, n, cache.shape().n_ctx);
    }
    for (const TokenId t : tokens) {
        if (t < 0 || t >= c.n_vocab) fail("token id {} is outside the vocabulary [0, {})", t, c.n_vocab);
    }

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
        be.add(x, cur, n * c.n_embd);

        // After the last attention only the rows whose logits are wanted matter; llama.cpp
        // drops the others there too, so its last FFN runs (and orders its sums) on n_out rows.
        const int64_t m = il + 1 == c.n_layer ? n_out : n;
        float* xs = x + (n - m) * c.n_embd;
        be.rms_norm(xs, L.ffn_norm, m, c.n_embd, c.rms_eps, cur);
        be.matmul(L.w_gate, cur, m, gate);
        be.matmul(L.w_up, cur, m, up);
        be.swiglu(gate, up, m, c.n_ff);
        be.matmul(L.w_down, gate, m, cur);
        be.add(xs, cur, m * c.n_embd);
    }
    cache.commit(pos0 + n);

    const float* last = x + (n - n_out) * c.n_embd;
    be.rms_norm(last, w_.output_norm, n_out, c.n_embd, c.rms_eps, cur);
    be.matmul(w_.output, cur, n_out, logits);
}

size_t Model::activation_bytes(int64_t n_tokens) const {
    const auto width = activation_widths(cfg_);
    return size_t(n_tokens * std::accumulate(width.begin(), width.end(), int64_t(0))) * sizeof(float);
}

}  // namespace vxq

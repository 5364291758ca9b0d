#include "model/model.h"

#include <vector>

#include "core/error.h"
#include "kv/kv_cache.h"

namespace vxq {

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

    // Activations for the whole batch.
    std::vector<float> x(size_t(n * c.n_embd));       // residual stream [n, n_embd]
    std::vector<float> cur(size_t(n * c.n_embd));     // normed input    [n, n_embd]
    std::vector<float> q(size_t(n * c.q_dim()));      // [n, n_head, head_dim]
    std::vector<float> k(size_t(n * c.kv_dim()));     // [n, n_head_kv, head_dim]
    std::vector<float> v(size_t(n * c.kv_dim()));     // [n, n_head_kv, head_dim]
    std::vector<float> attn(size_t(n * c.q_dim()));   // [n, n_head, head_dim]
    std::vector<float> gate(size_t(n * c.n_ff));      // [n, n_ff]
    std::vector<float> up(size_t(n * c.n_ff));        // [n, n_ff]
    const RopeParams rope{c.n_rot, c.rope_freq_base, c.rope_style == RopeStyle::NeoX};

    be.embed(w_.token_embd, tokens.data(), n, x.data());
    for (int64_t il = 0; il < c.n_layer; ++il) {
        const LayerWeights& L = w_.layers[size_t(il)];
        be.rms_norm(x.data(), L.attn_norm, n, c.n_embd, c.rms_eps, cur.data());
        be.matmul(L.wq, cur.data(), n, q.data());
        be.matmul(L.wk, cur.data(), n, k.data());
        be.matmul(L.wv, cur.data(), n, v.data());
        if (c.attn_qkv_bias) {
            be.add_bias(q.data(), L.bq, n, c.q_dim());
            be.add_bias(k.data(), L.bk, n, c.kv_dim());
            be.add_bias(v.data(), L.bv, n, c.kv_dim());
        }
        if (c.attn_qk_norm) {
            be.rms_norm(q.data(), L.q_norm, n * c.n_head, c.head_dim, c.rms_eps, q.data());
            be.rms_norm(k.data(), L.k_norm, n * c.n_head_kv, c.head_dim, c.rms_eps, k.data());
        }
        be.rope(q.data(), n, c.n_head, c.head_dim, pos0, rope);
        be.rope(k.data(), n, c.n_head_kv, c.head_dim, pos0, rope);
        be.attention(cache, il, q.data(), k.data(), v.data(), n, pos0, attn.data());
        be.matmul(L.wo, attn.data(), n, cur.data());
        be.add(x.data(), cur.data(), n * c.n_embd);

        // After the last attention only the rows whose logits are wanted matter; llama.cpp
        // drops the others there too, so its last FFN runs (and orders its sums) on n_out rows.
        const int64_t m = il + 1 == c.n_layer ? n_out : n;
        float* xs = x.data() + (n - m) * c.n_embd;
        be.rms_norm(xs, L.ffn_norm, m, c.n_embd, c.rms_eps, cur.data());
        be.matmul(L.w_gate, cur.data(), m, gate.data());
        be.matmul(L.w_up, cur.data(), m, up.data());
        be.swiglu(gate.data(), up.data(), m, c.n_ff);
        be.matmul(L.w_down, gate.data(), m, cur.data());
        be.add(xs, cur.data(), m * c.n_embd);
    }
    cache.commit(pos0 + n);

    const float* last = x.data() + (n - n_out) * c.n_embd;
    be.rms_norm(last, w_.output_norm, n_out, c.n_embd, c.rms_eps, cur.data());
    be.matmul(w_.output, cur.data(), n_out, logits);
}

}  // namespace vxq

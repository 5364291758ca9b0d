#include "model/weights.h"

#include "backend/weight_formats.h"
#include "core/error.h"
#include "formats/gguf.h"

namespace vxq {

namespace {

std::string dims_str(const std::vector<int64_t>& ne) {
    std::string s = "[";
    for (size_t i = 0; i < ne.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", ne[i]);
    return s + "]";
}

const GgufTensorInfo& find_checked(const GgufFile& f, const std::string& name, std::vector<int64_t> ne) {
    const GgufTensorInfo* t = f.find_tensor(name);
    if (!t) fail("{}: missing tensor '{}'", f.path(), name);
    if (t->ne != ne) {
        fail("{}: tensor '{}' has shape {}, expected {}", f.path(), name, dims_str(t->ne), dims_str(ne));
    }
    return *t;
}

bool has(const GgufFile& f, const std::string& name) { return f.find_tensor(name) != nullptr; }

// A matrix used by matmul: ne = [cols, rows], of a type the backend has kernels for
// (backend/weight_formats.h). The GGUF reader accepts every ggml type; this is where a model
// using another one is refused, before anything large is allocated.
WeightView matrix(const GgufFile& f, const std::string& name, int64_t rows, int64_t cols, std::string_view backend) {
    const GgufTensorInfo& t = find_checked(f, name, {cols, rows});
    check_weight_computable(t.type, backend, fmt::format("{}: tensor '{}'", f.path(), name));
    return WeightView{t.type, f.tensor_data(t), rows, cols, ggml_row_bytes(t.type, cols)};
}

// A vector used elementwise (norm weights, biases): must be f32, as llama.cpp writes them.
const float* vec_f32(const GgufFile& f, const std::string& name, int64_t n) {
    const GgufTensorInfo& t = find_checked(f, name, {n});
    if (t.type != GgmlType::F32) {
        fail("{}: tensor '{}' has type {}, expected f32", f.path(), name, ggml_type_name(t.type));
    }
    return reinterpret_cast<const float*>(f.tensor_data(t));
}

}  // namespace

ModelWeights ModelWeights::from_gguf(const GgufFile& f, ModelConfig& cfg, std::string_view backend) {
    ModelWeights w;
    const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
    if (!emb) fail("{}: missing tensor 'token_embd.weight'", f.path());
    if (emb->ne.size() != 2 || emb->ne[0] != cfg.n_embd) {
        fail("{}: tensor 'token_embd.weight' has shape {}, expected [{}, n_vocab]", f.path(), dims_str(emb->ne), cfg.n_embd);
    }
    cfg.n_vocab = emb->ne[1];
    w.token_embd = matrix(f, "token_embd.weight", cfg.n_vocab, cfg.n_embd, backend);
    w.output_norm = vec_f32(f, "output_norm.weight", cfg.n_embd);
    w.tied_output = !has(f, "output.weight");
    w.output = w.tied_output ? w.token_embd : matrix(f, "output.weight", cfg.n_vocab, cfg.n_embd, backend);

    for (int64_t il = 0; il < cfg.n_layer; ++il) {
        const std::string p = fmt::format("blk.{}.", il);
        LayerWeights L;
        L.attn_norm = vec_f32(f, p + "attn_norm.weight", cfg.n_embd);
        L.wq = matrix(f, p + "attn_q.weight", cfg.q_dim(), cfg.n_embd, backend);
        L.wk = matrix(f, p + "attn_k.weight", cfg.kv_dim(), cfg.n_embd, backend);
        L.wv = matrix(f, p + "attn_v.weight", cfg.kv_dim(), cfg.n_embd, backend);
        L.wo = matrix(f, p + "attn_output.weight", cfg.n_embd, cfg.q_dim(), backend);
        if (cfg.attn_qkv_bias) {
            L.bq = vec_f32(f, p + "attn_q.bias", cfg.q_dim());
            L.bk = vec_f32(f, p + "attn_k.bias", cfg.kv_dim());
            L.bv = vec_f32(f, p + "attn_v.bias", cfg.kv_dim());
        }
        if (cfg.attn_qk_norm) {
            L.q_norm = vec_f32(f, p + "attn_q_norm.weight", cfg.head_dim);
            L.k_norm = vec_f32(f, p + "attn_k_norm.weight", cfg.head_dim);
        }
        L.ffn_norm = vec_f32(f, p + "ffn_norm.weight", cfg.n_embd);
        L.w_gate = matrix(f, p + "ffn_gate.weight", cfg.n_ff, cfg.n_embd, backend);
        L.w_up = matrix(f, p + "ffn_up.weight", cfg.n_ff, cfg.n_embd, backend);
        L.w_down = matrix(f, p + "ffn_down.weight", cfg.n_embd, cfg.n_ff, backend);
        w.layers.push_back(L);
    }
    return w;
}

}  // namespace vxq

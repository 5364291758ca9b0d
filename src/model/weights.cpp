#include "model/weights.h"

#include <unordered_set>

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

// The file's tensors as the loader takes them: each lookup is recorded, so that a tensor nobody
// took (an extra one, or a layer beyond block_count) is found at the end instead of ignored.
class TensorTable {
public:
    explicit TensorTable(const GgufFile& f) : f_(f) {}
    const GgufFile& file() const { return f_; }
    const std::string& path() const { return f_.path(); }

    const GgufTensorInfo* find(const std::string& name) {
        const GgufTensorInfo* t = f_.find_tensor(name);
        if (t) used_.insert(name);
        return t;
    }

    // vxq::Error naming the first tensor of the file that no lookup took.
    void check_all_used(const ModelConfig& cfg) const {
        for (const GgufTensorInfo& t : f_.tensors()) {
            if (!used_.count(t.name)) {
                fail("{}: tensor '{}' is not used by a {} model with block_count {}: the file's tensors do not match "
                     "its metadata", f_.path(), t.name, cfg.arch, cfg.n_layer);
            }
        }
    }

private:
    const GgufFile& f_;
    std::unordered_set<std::string> used_;
};

const GgufTensorInfo& find_checked(TensorTable& f, const std::string& name, std::vector<int64_t> ne) {
    const GgufTensorInfo* t = f.find(name);
    if (!t) fail("{}: missing tensor '{}'", f.path(), name);
    if (t->ne != ne) {
        fail("{}: tensor '{}' has shape {}, expected {}", f.path(), name, dims_str(t->ne), dims_str(ne));
    }
    return *t;
}

// A matrix used by matmul: ne = [cols, rows], of a type the backend has kernels for
// (backend/weight_formats.h). The GGUF reader accepts every ggml type; this is where a model
// using another one is refused, before anything large is allocated.
WeightView matrix(TensorTable& f, const std::string& name, int64_t rows, int64_t cols, std::string_view backend) {
    const GgufTensorInfo& t = find_checked(f, name, {cols, rows});
    check_weight_computable(t.type, backend, fmt::format("{}: tensor '{}'", f.path(), name));
    // The activations are quantized in blocks of the dot type, so rows are whole blocks of it too
    // (the GGUF reader checked the weight's own blocks; TQ2_G128's 128 are half a q8_K block).
    const WeightFormat& wf = *find_weight_format(t.type);
    const int64_t dot_block = ggml_type_traits(uint32_t(wf.dot_type))->block_size;
    if (cols % dot_block != 0) {
        fail("{}: tensor '{}' is {} with rows of {} values, not whole {}-value blocks of its activations' type {}",
             f.path(), name, ggml_type_display_name(t.type), cols, dot_block, ggml_type_display_name(wf.dot_type));
    }
    return WeightView{t.type, f.file().tensor_data(t), rows, cols, ggml_row_bytes(t.type, cols)};
}

// A vector used elementwise (norm weights, biases): must be f32, as llama.cpp writes them.
const float* vec_f32(TensorTable& f, const std::string& name, int64_t n) {
    const GgufTensorInfo& t = find_checked(f, name, {n});
    if (t.type != GgmlType::F32) {
        fail("{}: tensor '{}' has type {}, expected f32", f.path(), name, ggml_type_name(t.type));
    }
    return reinterpret_cast<const float*>(f.file().tensor_data(t));
}

}  // namespace

ModelWeights ModelWeights::from_gguf(const GgufFile& file, ModelConfig& cfg, std::string_view backend) {
    ModelWeights w;
    TensorTable f(file);
    const GgufTensorInfo* emb = f.find("token_embd.weight");
    if (!emb) fail("{}: missing tensor 'token_embd.weight'", f.path());
    if (emb->ne.size() != 2 || emb->ne[0] != cfg.n_embd) {
        fail("{}: tensor 'token_embd.weight' has shape {}, expected [{}, n_vocab]", f.path(), dims_str(emb->ne), cfg.n_embd);
    }
    cfg.n_vocab = emb->ne[1];
    w.token_embd = matrix(f, "token_embd.weight", cfg.n_vocab, cfg.n_embd, backend);
    w.output_norm = vec_f32(f, "output_norm.weight", cfg.n_embd);
    w.tied_output = file.find_tensor("output.weight") == nullptr;
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
    f.check_all_used(cfg);
    return w;
}

}  // namespace vxq

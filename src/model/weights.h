// The tensors of a Llama-family model, as views into the mapped GGUF file (no copies).
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "backend/types.h"
#include "model/config.h"

namespace vxq {

class GgufFile;

struct LayerWeights {
    const float* attn_norm;            // [n_embd]
    WeightView wq, wk, wv, wo;         // [q_dim, n_embd], [kv_dim, n_embd] x2, [n_embd, q_dim]
    const float* bq = nullptr;         // [q_dim]   qwen2
    const float* bk = nullptr;         // [kv_dim]  qwen2
    const float* bv = nullptr;         // [kv_dim]  qwen2
    const float* q_norm = nullptr;     // [head_dim] qwen3
    const float* k_norm = nullptr;     // [head_dim] qwen3
    const float* ffn_norm;             // [n_embd]
    WeightView w_gate, w_up, w_down;   // [n_ff, n_embd] x2, [n_embd, n_ff]
};

struct ModelWeights {
    WeightView token_embd;             // [n_vocab, n_embd]
    const float* output_norm;          // [n_embd]
    WeightView output;                 // [n_vocab, n_embd]; token_embd when tied
    bool tied_output = false;
    std::vector<LayerWeights> layers;

    // Finds and checks every tensor (presence, shape, and a type `backend` computes);
    // vxq::Error names the tensor. Fills cfg.n_vocab from token_embd.
    static ModelWeights from_gguf(const GgufFile& f, ModelConfig& cfg, std::string_view backend);
};

}  // namespace vxq

// Hyper-parameters of a Llama-family model, read from GGUF metadata.
#pragma once

#include <cstdint>
#include <string>

namespace vxq {

class GgufFile;

enum class RopeStyle {
    Normal,  // rotate adjacent pairs (x[2i], x[2i+1]): llama
    NeoX,    // rotate halves (x[i], x[i + n_rot/2]): qwen2, qwen3
};

struct ModelConfig {
    std::string arch;          // general.architecture: llama, qwen2, qwen3
    std::string name;          // general.name
    int64_t n_vocab = 0;
    int64_t n_embd = 0;
    int64_t n_layer = 0;
    int64_t n_head = 0;
    int64_t n_head_kv = 0;
    int64_t head_dim = 0;      // key_length (== value_length)
    int64_t n_ff = 0;
    int64_t n_ctx_train = 0;
    int64_t n_rot = 0;         // rope.dimension_count
    float rms_eps = 1e-5f;
    float rope_freq_base = 10000.0f;
    RopeStyle rope_style = RopeStyle::Normal;
    bool attn_qkv_bias = false;  // qwen2
    bool attn_qk_norm = false;   // qwen3: per-head RMSNorm of q and k before RoPE

    int64_t n_gqa() const { return n_head / n_head_kv; }
    int64_t q_dim() const { return n_head * head_dim; }
    int64_t kv_dim() const { return n_head_kv * head_dim; }

    // Reads and validates; vxq::Error naming the key for anything missing or inconsistent,
    // and for an architecture this engine does not run.
    static ModelConfig from_gguf(const GgufFile& f);
};

}  // namespace vxq

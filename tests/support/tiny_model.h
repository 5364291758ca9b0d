// Tiny random Llama-family models (llama / qwen2 / qwen3) written as GGUF files, for tests that
// check the engine's forward pass against an independent reference.
//
//   vxq::test::TinyModelSpec spec;
//   spec.arch = "qwen3"; spec.head_dim = 32; spec.weight_type = GgmlType::F16;
//   vxq::test::TinyModel m = vxq::test::build_tiny_model(spec);   // file removed with m
//   auto model = vxq::Model::load(m.path);
//   ... m.token_embd, m.layers[0].wq ... are the weights exactly as stored in the file
//
// Weights are seeded random values (splitmix64, no std:: distributions, so the same on every
// platform) scaled so activations stay O(1) through the layers and logits are O(a few).
// The spec also has knobs that deliberately break the file (drop, reshape or add a tensor, write
// another architecture name or a lower block_count) for the loader's negative tests.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "formats/ggml_types.h"

namespace vxq::test {

struct TinyModelSpec {
    std::string arch = "llama";  // llama, qwen2, qwen3: decides the tensors that are written
    int64_t n_vocab = 300;       // >= 260 (the tokenizer needs its byte tokens)
    int64_t n_embd = 64;
    int64_t n_layer = 2;
    int64_t n_head = 4;
    int64_t n_head_kv = 2;
    int64_t head_dim = 0;        // 0: n_embd / n_head
    int64_t n_rot = 0;           // 0: head_dim
    int64_t n_ff = 96;
    int64_t n_ctx_train = 256;
    float rope_base = 10000.0f;
    float rms_eps = 1e-6f;
    GgmlType weight_type = GgmlType::F32;  // matrices (token_embd and output included): F32 or F16
    bool tied_output = false;              // no output.weight: the head reuses token_embd
    uint64_t seed = 1;
    // Writes {arch}.attention.key_length even when head_dim is the default n_embd / n_head
    // (qwen3 files always carry it). A head_dim other than the default is always written.
    bool write_key_length = false;

    // ---- deliberate breakage ----
    std::string meta_arch;                                 // general.architecture and key prefix; "" = arch
    std::optional<bool> qkv_bias;                          // write attn_{q,k,v}.bias; default: arch == qwen2
    std::optional<bool> qk_norm;                           // write attn_{q,k}_norm; default: arch == qwen3
    std::set<std::string> drop_tensors;                    // tensors left out of the file
    std::map<std::string, std::vector<int64_t>> reshape;   // tensors written with these dims instead
    std::optional<int64_t> meta_n_layer;                   // block_count written; default: n_layer
    std::set<std::string> extra_tensors;                   // [n_embd] f32 tensors no architecture uses
};

// One block's weights, row-major as stored: a matrix of `rows` outputs x `cols` inputs holds
// W[r][c] at [r * cols + c] (GGUF ne = [cols, rows]). Empty vectors for tensors the arch lacks.
struct TinyLayer {
    std::vector<float> attn_norm;             // [n_embd]
    std::vector<float> wq, wk, wv, wo;        // [q_dim x n_embd], [kv_dim x n_embd] x2, [n_embd x q_dim]
    std::vector<float> bq, bk, bv;            // [q_dim], [kv_dim] x2            (qwen2)
    std::vector<float> q_norm, k_norm;        // [head_dim] x2                   (qwen3)
    std::vector<float> ffn_norm;              // [n_embd]
    std::vector<float> w_gate, w_up, w_down;  // [n_ff x n_embd] x2, [n_embd x n_ff]
};

// The written file (removed by the destructor) and its weights as float. For F16 files the
// matrices here are the values after rounding to fp16, i.e. exactly what the file holds.
struct TinyModel {
    std::string path;
    TinyModelSpec spec;  // with head_dim / n_rot / meta_arch resolved
    std::vector<float> token_embd;  // [n_vocab x n_embd]
    std::vector<float> output;      // [n_vocab x n_embd]; equals token_embd when tied
    std::vector<float> output_norm; // [n_embd]
    std::vector<TinyLayer> layers;

    int64_t q_dim() const { return spec.n_head * spec.head_dim; }
    int64_t kv_dim() const { return spec.n_head_kv * spec.head_dim; }

    TinyModel() = default;
    TinyModel(TinyModel&& o) noexcept;
    TinyModel& operator=(TinyModel&& o) noexcept;
    TinyModel(const TinyModel&) = delete;
    TinyModel& operator=(const TinyModel&) = delete;
    ~TinyModel();
};

// Generates the weights and writes the GGUF file to `path`, or, when empty, to a fresh file in
// the temp directory (unique per process and call).
TinyModel build_tiny_model(const TinyModelSpec& spec, const std::string& path = "");

}  // namespace vxq::test

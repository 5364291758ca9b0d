// Random-weight models of real shapes ("synth"): a GGUF file with the tensors, metadata and a
// byte-level tokenizer of a named published model, so that speed work runs at real scale without
// downloading weights. llama.cpp loads the same files.
//
// Weights are seeded random values, never zero, scaled so activations stay O(1) through any
// number of layers and logits are O(1) and varied: matrices N(0, 1/fan_in), token_embd N(0, 1)
// (N(0, 1/n_embd) when it is also the output matrix), norms 1, qwen2's biases N(0, 0.1^2).
// Matrices (token_embd and output included) have the chosen type, quantized with ggml's reference
// quantizers as llama-quantize does; norms and biases are f32, as llama.cpp writes them.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/ggml_types.h"
#include "formats/gguf_writer.h"
#include "model/config.h"

namespace vxq {

// The hyper-parameters of a published model that decide its tensors and metadata.
struct ModelShape {
    std::string_view name;     // --shape
    std::string_view arch;     // general.architecture: llama or qwen2
    int64_t n_embd;
    int64_t n_layer;
    int64_t n_head;
    int64_t n_head_kv;
    int64_t n_ff;
    int64_t n_vocab;
    int64_t n_ctx;             // context_length
    float rope_theta;
    float rms_eps;
    bool tied_embeddings;      // no output.weight: the head reuses token_embd
    bool qkv_bias;             // attn_{q,k,v}.bias
    std::string_view pre;      // tokenizer.ggml.pre
    int32_t bos, eos;          // published ids; moved to the end of a --vocab-reduced vocabulary
    std::string_view bos_text, eos_text;
    bool add_bos;
};

std::span<const ModelShape> model_shapes();
const ModelShape* find_model_shape(std::string_view name);  // nullptr when unknown

// The weight types synth writes, by their ggml names: f16, q8_0, q4_0; nullopt otherwise.
std::optional<GgmlType> synth_weight_type(std::string_view name);

struct SynthOptions {
    std::string shape;
    GgmlType type = GgmlType::F16;  // matrices; norms and biases are f32
    uint64_t seed = 1;
    int64_t n_layer = 0;            // 0: the shape's
    int64_t n_vocab = 0;            // 0: the shape's (a smaller one keeps test files small)
    int threads = 0;                // 0: all hardware threads
};

// The smallest vocabulary synth writes: 256 byte tokens, the merged tokens and the specials.
constexpr int64_t kSynthMinVocab = 320;

class SynthModel {
public:
    // Validates the options (vxq::Error naming the bad one) and lays out the file.
    explicit SynthModel(const SynthOptions& o);

    const ModelShape& shape() const { return shape_; }  // with the --layers / --vocab overrides
    // The dimensions ModelConfig::from_gguf reads back from the file (vocabulary, widths, layers,
    // heads, head_dim, FFN): what the matrices' shapes follow from (not the RoPE style or norms).
    const ModelConfig& dims() const { return dims_; }
    const GgufStreamWriter& file() const { return file_; }

    // Generates the weights and writes the file atomically (formats/gguf_writer.h).
    void write(const std::string& path, const GgufStreamWriter::Progress& progress = {}) const;

private:
    struct Init {
        float stddev;  // N(0, stddev^2); 0 means every value is 1 (norm weights)
    };
    ModelShape shape_;
    ModelConfig dims_;
    SynthOptions opts_;
    GgufStreamWriter file_;
    std::vector<Init> init_;  // per tensor, in file order
};

}  // namespace vxq

// A loaded Llama-family model: the mapped GGUF file, its config, weights and tokenizer, and the
// forward pass written once against the Backend ops.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "formats/gguf.h"
#include "formats/tokenizer.h"
#include "model/config.h"
#include "model/weights.h"

namespace vxq {

class KvCache;

class Model {
public:
    // Opens, validates and maps a GGUF model whose weights `backend` (a make_backend name) can
    // compute; vxq::Error naming what is wrong.
    static std::unique_ptr<Model> load(const std::string& path, std::string_view backend = "cpu");

    const ModelConfig& config() const { return cfg_; }
    const ModelWeights& weights() const { return w_; }
    const Tokenizer& tokenizer() const { return *tok_; }
    const GgufFile& file() const { return file_; }

    // Runs n tokens at positions [cache.size(), cache.size() + n) through the model, appends
    // their K/V to the cache and commits them. Writes logits for the last token only
    // (all_logits = false) or for every token. The activations live in be's buffers
    // (Backend::activation_buffer), so one forward pass at a time runs on a backend.
    //   tokens: [n]; logits: [all_logits ? n : 1, n_vocab]
    void forward(Backend& be, KvCache& cache, std::span<const TokenId> tokens, bool all_logits,
                 float* logits) const {
        forward(be, cache, tokens, all_logits ? int64_t(tokens.size()) : 1, logits);
    }
    // Same, with logits for the last n_out tokens (llama.cpp computes the output head only for
    // the rows whose logits are requested; its matmul order depends on that row count).
    //   logits: [n_out, n_vocab]
    void forward(Backend& be, KvCache& cache, std::span<const TokenId> tokens, int64_t n_out, float* logits) const;

    // Bytes of the activation buffers forward() asks the backend for with a batch of n tokens
    // (Backend::activation_buffer), for the memory check before a run.
    size_t activation_bytes(int64_t n_tokens) const;

private:
    Model(GgufFile f) : file_(std::move(f)) {}

    GgufFile file_;
    ModelConfig cfg_;
    ModelWeights w_;
    std::unique_ptr<Tokenizer> tok_;
};

}  // namespace vxq

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
#include "model/tensor_parallel.h"
#include "model/weights.h"

namespace vxq {

class KvCache;

class Model {
public:
    // Opens, validates and maps a GGUF model whose weights `backend` (a make_backend name) can
    // compute; vxq::Error naming what is wrong. With tp.size > 1, the slice of the model that
    // rank tp.rank of a tensor-parallel group runs (model/tensor_parallel.h); vxq::Error when the
    // model does not split that way.
    static std::unique_ptr<Model> load(const std::string& path, std::string_view backend = "cpu", TpRank tp = {});

    // The whole model's hyper-parameters (n_vocab: the logits forward() writes).
    const ModelConfig& config() const { return cfg_; }
    // What this rank runs: config() outside a tensor-parallel group, else its heads and FFN width.
    const ModelConfig& rank_config() const { return local_; }
    TpRank tp() const { return tp_; }
    // This rank's weights (the whole model's outside a group).
    const ModelWeights& weights() const { return w_; }
    const Tokenizer& tokenizer() const { return *tok_; }
    const GgufFile& file() const { return file_; }

    // Runs n tokens at positions [cache.size(), cache.size() + n) through the model, appends
    // their K/V to the cache and commits them. In a tensor-parallel group every rank calls it at
    // once on its own thread, with its backend (make_backend_group) and a cache of its KV heads
    // (rank_config()); rank 0 gets the logits, the others pass nullptr. Writes logits for the last token only
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

    // A cache of `tokens` for a decode benchmark's depth at the cost of two matmuls a layer (vxq
    // bench --depth-fill kv): every layer stores the keys and values of the tokens at positions
    // [cache.size(), + n) as if its input were the tokens' embeddings (the norm, the K / V
    // projections, biases, k-norm, RoPE and kv_write of forward; no attention, no FFN), then the
    // cache commits them. Layer 0's bytes are forward's; later layers' are of the same shape and
    // scale, not the model's. vxq::Error for a cache whose eviction or observer reads attention.
    void fill_kv(Backend& be, KvCache& cache, std::span<const TokenId> tokens) const;

    // vxq::Error unless forward() can take `tokens` after `cached` tokens in a cache of n_ctx: the
    // context has room and every id is in the vocabulary (what forward checks first; a
    // tensor-parallel group checks it once before its ranks start).
    void check_batch(std::span<const TokenId> tokens, int64_t cached, int64_t n_ctx) const;

    // Bytes of the tensors this model (this rank's slice, in a group) computes with, as the file
    // stores them, or as `copier` will hold them (Backend::copies_weights, copied_weight_bytes).
    size_t weight_bytes(const Backend* copier = nullptr) const;

    // Bytes of the activation buffers forward() asks the backend for with a batch of n tokens
    // (Backend::activation_buffer), for the memory check before a run.
    size_t activation_bytes(int64_t n_tokens) const;

private:
    Model(GgufFile f) : file_(std::move(f)) {}
    // x += part (this rank's product), then in a tensor-parallel group x += every other rank's.
    void add_partial_sums(Backend& be, float* x, float* part, int64_t n) const;

    GgufFile file_;
    ModelConfig cfg_, local_;
    TpRank tp_;
    ModelWeights w_;
    std::vector<std::unique_ptr<std::byte[]>> owned_;  // row-parallel slices (shard_weights)
    std::unique_ptr<Tokenizer> tok_;
};

}  // namespace vxq

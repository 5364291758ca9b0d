// Perplexity with llama-perplexity's semantics: the text is tokenized whole (BOS as the vocab
// says), cut into chunks of n_ctx tokens; each chunk starts with BOS (when the model adds BOS),
// runs as one batch from an empty cache, and the second half of the chunk is scored.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "formats/tokenizer.h"

namespace vxq {

class Model;
class Backend;
class KvCache;
class Runner;

enum class PplMode {
    Prefill,  // each chunk is one batch, its K/V written to the cache and read back through it
    Stream,   // tokens fed one at a time through the decode path, as generation uses the cache
};

struct PerplexityParams {
    int64_t n_ctx = 512;
    int64_t n_chunks = -1;  // < 0: all
    PplMode mode = PplMode::Prefill;
};

struct PerplexityResult {
    double ppl = 0.0;
    double ppl_err = 0.0;       // standard error, as llama-perplexity prints after "+/-"
    int64_t n_chunks = 0;
    int64_t n_scored = 0;       // tokens scored
    int64_t n_text_tokens = 0;
    std::vector<double> chunk_ppl;  // running estimate after each chunk
    double seconds = 0.0;
    size_t kv_bytes_max = 0;        // largest resident KV bytes seen (end of a chunk)
    int64_t kv_tokens_max = 0;
};

// The chunks llama-perplexity scores: the whole text tokenized, cut into n_chunks chunks of n_ctx
// tokens, each starting with BOS (when the model adds BOS); positions [first, n_ctx - 1) of a
// chunk are scored, position j predicting the text's token after it.
struct PplChunks {
    std::vector<TokenId> tokens;
    int64_t n_ctx = 0, n_chunks = 0, first = 0;
    bool add_bos = false;
    TokenId bos = 0;

    std::vector<TokenId> chunk(int64_t i) const;
    // The token that position j of chunk i predicts.
    TokenId next(int64_t i, int64_t j) const { return tokens[size_t(i * n_ctx + j + 1)]; }
};
// vxq::Error for a context or chunk count that does not fit the text or the cache capacity.
PplChunks plan_chunks(const Model& model, std::string_view text, int64_t n_ctx, int64_t n_chunks, int64_t capacity);

// Runs one chunk from an empty cache in the given mode and calls row(j, logits) for each scored
// position j in [first, n_ctx - 1). In stream mode before_token(j), when set, runs before
// position j is fed (eval arms its attention probe there).
void run_chunk(const Model& model, Backend& be, KvCache& cache, const std::vector<TokenId>& chunk, PplMode mode,
               int64_t first, const std::function<void(int64_t, const float*)>& row,
               const std::function<void(int64_t)>& before_token = {});
// The same through a Runner (one backend, or a tensor-parallel group).
void run_chunk(Runner& run, const std::vector<TokenId>& chunk, PplMode mode, int64_t first,
               const std::function<void(int64_t, const float*)>& row, const std::function<void(int64_t)>& before_token = {});

// -log p(token) from one row of logits, as llama-perplexity: max-shifted, exp sum in double.
double nll_of(const float* logits, int64_t n_vocab, int32_t token);

// progress(chunk_index, n_chunks, running_ppl) after each chunk.
PerplexityResult perplexity(const Model& model, Backend& be, KvCache& cache, std::string_view text,
                            const PerplexityParams& p,
                            const std::function<void(int64_t, int64_t, double)>& progress = {});
PerplexityResult perplexity(Runner& run, std::string_view text, const PerplexityParams& p,
                            const std::function<void(int64_t, int64_t, double)>& progress = {});

}  // namespace vxq

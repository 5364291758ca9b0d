// Perplexity with llama-perplexity's semantics: the text is tokenized whole (BOS as the vocab
// says), cut into chunks of n_ctx tokens; each chunk starts with BOS (when the model adds BOS),
// runs as one batch from an empty cache, and the second half of the chunk is scored.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

namespace vxq {

class Model;
class Backend;
class KvCache;

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

// progress(chunk_index, n_chunks, running_ppl) after each chunk.
PerplexityResult perplexity(const Model& model, Backend& be, KvCache& cache, std::string_view text,
                            const PerplexityParams& p,
                            const std::function<void(int64_t, int64_t, double)>& progress = {});

}  // namespace vxq

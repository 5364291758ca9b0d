#include "runtime/perplexity.h"

#include <chrono>
#include <cmath>

#include "core/error.h"
#include "kv/kv_cache.h"
#include "model/model.h"

namespace vxq {

namespace {

// -log p(token) from one row of logits, as llama-perplexity: max-shifted, exp sum in double.
double nll_of(const float* logits, int64_t n_vocab, int32_t token) {
    float mx = logits[0];
    for (int64_t i = 1; i < n_vocab; ++i) mx = std::max(mx, logits[i]);
    double sum_exp = 0.0;
    for (int64_t i = 0; i < n_vocab; ++i) sum_exp += std::exp(logits[i] - mx);
    return -(double(logits[token] - mx) - std::log(sum_exp));
}

}  // namespace

PerplexityResult perplexity(const Model& model, Backend& be, KvCache& cache, std::string_view text,
                            const PerplexityParams& p,
                            const std::function<void(int64_t, int64_t, double)>& progress) {
    const auto t_start = std::chrono::steady_clock::now();
    const int64_t n_ctx = p.n_ctx;
    if (p.n_chunks == 0 || p.n_chunks < -1) fail("the number of chunks must be positive (or -1 for all), got {}", p.n_chunks);
    if (n_ctx < 4) fail("perplexity needs a context of at least 4 tokens, got {}", n_ctx);
    if (n_ctx > cache.shape().n_ctx) fail("context {} exceeds the cache capacity {}", n_ctx, cache.shape().n_ctx);
    std::vector<TokenId> tokens = model.tokenizer().encode(text, /*add_special=*/true);
    PerplexityResult r;
    r.n_text_tokens = int64_t(tokens.size());
    if (int64_t(tokens.size()) < 2 * n_ctx) {
        fail("the text has {} tokens; perplexity with a context of {} needs at least {}", tokens.size(), n_ctx, 2 * n_ctx);
    }
    const int64_t n_chunk_max = int64_t(tokens.size()) / n_ctx;
    const int64_t n_chunk = p.n_chunks < 0 ? n_chunk_max : std::min(p.n_chunks, n_chunk_max);
    const int64_t first = n_ctx / 2;
    const int64_t n_vocab = model.config().n_vocab;
    const bool add_bos = model.tokenizer().vocab().add_bos;
    const int64_t n_scored_rows = n_ctx - first;  // logits rows llama-perplexity requests
    std::vector<float> logits(size_t((p.mode == PplMode::Prefill ? n_scored_rows : 1) * n_vocab));
    double nll = 0.0, nll2 = 0.0;
    int64_t count = 0;
    auto score = [&](const float* row, TokenId next) {
        const double v = nll_of(row, n_vocab, next);
        nll += v;
        nll2 += v * v;
    };
    for (int64_t i = 0; i < n_chunk; ++i) {
        std::vector<TokenId> chunk(tokens.begin() + i * n_ctx, tokens.begin() + (i + 1) * n_ctx);
        if (add_bos) chunk[0] = model.tokenizer().vocab().bos;
        const TokenId* next = tokens.data() + i * n_ctx + 1;  // position j predicts the original token j + 1
        cache.truncate(0);
        if (p.mode == PplMode::Prefill) {
            model.forward(be, cache, chunk, n_scored_rows, logits.data());
            for (int64_t j = first; j < n_ctx - 1; ++j) score(logits.data() + (j - first) * n_vocab, next[j]);
        } else {
            for (int64_t j = 0; j < n_ctx - 1; ++j) {
                model.forward(be, cache, std::span(chunk).subspan(size_t(j), 1), int64_t(1), logits.data());
                if (j >= first) score(logits.data(), next[j]);
            }
        }
        count += n_ctx - 1 - first;
        r.kv_bytes_max = std::max(r.kv_bytes_max, cache.resident_bytes());
        r.kv_tokens_max = std::max(r.kv_tokens_max, cache.size());
        r.chunk_ppl.push_back(std::exp(nll / double(count)));
        if (progress) progress(i, n_chunk, r.chunk_ppl.back());
    }
    r.n_chunks = n_chunk;
    r.n_scored = count;
    const double mean = nll / double(count);
    const double var = nll2 / double(count) - mean * mean;
    r.ppl = std::exp(mean);
    r.ppl_err = var > 0.0 ? std::sqrt(var / double(count - 1)) * r.ppl : 0.0;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    return r;
}

}  // namespace vxq

#include "runtime/perplexity.h"

#include <chrono>
#include <cmath>

#include "core/error.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "runtime/runner.h"

namespace vxq {

double nll_of(const float* logits, int64_t n_vocab, int32_t token) {
    float mx = logits[0];
    for (int64_t i = 1; i < n_vocab; ++i) mx = std::max(mx, logits[i]);
    double sum_exp = 0.0;
    for (int64_t i = 0; i < n_vocab; ++i) sum_exp += std::exp(logits[i] - mx);
    return -(double(logits[token] - mx) - std::log(sum_exp));
}

std::vector<TokenId> PplChunks::chunk(int64_t i) const {
    std::vector<TokenId> c(tokens.begin() + i * n_ctx, tokens.begin() + (i + 1) * n_ctx);
    if (add_bos) c[0] = bos;
    return c;
}

PplChunks plan_chunks(const Model& model, std::string_view text, int64_t n_ctx, int64_t n_chunks, int64_t capacity) {
    if (n_chunks == 0 || n_chunks < -1) fail("the number of chunks must be positive (or -1 for all), got {}", n_chunks);
    if (n_ctx < 4) fail("perplexity needs a context of at least 4 tokens, got {}", n_ctx);
    if (n_ctx > capacity) fail("context {} exceeds the cache capacity {}", n_ctx, capacity);
    PplChunks c;
    c.tokens = model.tokenizer().encode(text, /*add_special=*/true);
    if (int64_t(c.tokens.size()) < 2 * n_ctx) {
        fail("the text has {} tokens; perplexity with a context of {} needs at least {}", c.tokens.size(), n_ctx, 2 * n_ctx);
    }
    const int64_t n_chunk_max = int64_t(c.tokens.size()) / n_ctx;
    c.n_ctx = n_ctx;
    c.n_chunks = n_chunks < 0 ? n_chunk_max : std::min(n_chunks, n_chunk_max);
    c.first = n_ctx / 2;
    c.add_bos = model.tokenizer().vocab().add_bos;
    c.bos = model.tokenizer().vocab().bos;
    return c;
}

void run_chunk(const Model& model, Backend& be, KvCache& cache, const std::vector<TokenId>& chunk, PplMode mode,
               int64_t first, const std::function<void(int64_t, const float*)>& row,
               const std::function<void(int64_t)>& before_token) {
    SingleRunner run(model, be, cache);
    run_chunk(run, chunk, mode, first, row, before_token);
}

void run_chunk(Runner& run, const std::vector<TokenId>& chunk, PplMode mode, int64_t first,
               const std::function<void(int64_t, const float*)>& row, const std::function<void(int64_t)>& before_token) {
    const int64_t n_ctx = int64_t(chunk.size());
    const int64_t n_vocab = run.model().config().n_vocab;
    run.truncate(0);
    if (mode == PplMode::Prefill) {
        const int64_t n_rows = n_ctx - first;  // logits rows llama-perplexity requests
        std::vector<float> logits(size_t(n_rows * n_vocab));
        run.forward(chunk, n_rows, logits.data());
        for (int64_t j = first; j < n_ctx - 1; ++j) row(j, logits.data() + (j - first) * n_vocab);
    } else {
        std::vector<float> logits(static_cast<size_t>(n_vocab));
        for (int64_t j = 0; j < n_ctx - 1; ++j) {
            if (before_token) before_token(j);
            run.forward(std::span(chunk).subspan(size_t(j), 1), 1, logits.data());
            if (j >= first) row(j, logits.data());
        }
    }
}

PerplexityResult perplexity(const Model& model, Backend& be, KvCache& cache, std::string_view text,
                            const PerplexityParams& p,
                            const std::function<void(int64_t, int64_t, double)>& progress) {
    SingleRunner run(model, be, cache);
    return perplexity(run, text, p, progress);
}

PerplexityResult perplexity(Runner& run, std::string_view text, const PerplexityParams& p,
                            const std::function<void(int64_t, int64_t, double)>& progress) {
    const Model& model = run.model();
    const auto t_start = std::chrono::steady_clock::now();
    const PplChunks plan = plan_chunks(model, text, p.n_ctx, p.n_chunks, run.n_ctx());
    const int64_t n_vocab = model.config().n_vocab;
    PerplexityResult r;
    r.n_text_tokens = int64_t(plan.tokens.size());
    double nll = 0.0, nll2 = 0.0;
    int64_t count = 0;
    for (int64_t i = 0; i < plan.n_chunks; ++i) {
        run_chunk(run, plan.chunk(i), p.mode, plan.first, [&](int64_t j, const float* row) {
            const double v = nll_of(row, n_vocab, plan.next(i, j));
            nll += v;
            nll2 += v * v;
            ++count;
        });
        r.kv_bytes_max = std::max(r.kv_bytes_max, run.kv_bytes());
        r.kv_tokens_max = std::max(r.kv_tokens_max, run.size());
        r.chunk_ppl.push_back(std::exp(nll / double(count)));
        if (progress) progress(i, plan.n_chunks, r.chunk_ppl.back());
    }
    r.n_chunks = plan.n_chunks;
    r.n_scored = count;
    const double mean = nll / double(count);
    const double var = nll2 / double(count) - mean * mean;
    r.ppl = std::exp(mean);
    r.ppl_err = var > 0.0 ? std::sqrt(var / double(count - 1)) * r.ppl : 0.0;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    return r;
}

}  // namespace vxq

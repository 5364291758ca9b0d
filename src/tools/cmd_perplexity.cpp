// vxq perplexity: llama-perplexity semantics; progress on a terminal, final line
// "Final estimate: PPL = X +/- Y".
#include <sys/resource.h>

#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "runtime/perplexity.h"
#include "tools/commands.h"
#include "core/error.h"
#include "tools/common.h"

namespace vxq::tools {

namespace {
struct PerplexityOptions {
    RuntimeOptions rt;
    std::string file;
    int64_t chunks = -1;
    std::string mode = "prefill";
};

void run_perplexity(PerplexityOptions o) {
    const PplMode mode = o.mode == "stream" ? PplMode::Stream : PplMode::Prefill;
    if (o.rt.prefill_exact) check_prefill_exact(mode == PplMode::Prefill, !is_f16_cache(o.rt.kv_spec()));
    if (mode == PplMode::Prefill && o.rt.cache_options().evict.active()) {
        fail("--evict acts between forward passes and a prefill chunk is one pass, so it would change nothing: "
             "use --mode stream");
    }
    const std::string text = read_file(o.file);
    if (o.rt.n_ctx < 0) o.rt.n_ctx = 512;  // llama-perplexity's default (-c 0: the model's)
    // A prefill chunk is one batch of the whole context (logits for its second half, counted as
    // the whole context's: an upper bound); stream mode runs one token at a time.
    Engine e = mode == PplMode::Prefill ? make_engine(o.rt, INT64_MAX, INT64_MAX) : make_engine(o.rt, 1, 1);
    const bool tty = stderr_is_tty();
    const auto r = perplexity(*e.runner, text, PerplexityParams{e.n_ctx, o.chunks, mode},
                              [&](int64_t i, int64_t n, double ppl) {
                                  if (tty) fmt::print(stderr, "\r[{}/{}] PPL {:.4f}   ", i + 1, n, ppl);
                              });
    if (tty) fmt::print(stderr, "\n");
    // What ran is printed with the results, not before: a refused input prints only its error.
    const KvCache& cache = *e.ranks()[0].second;
    fmt::print("perplexity: {} | ctx {} | kv {}{} | {}\n", o.rt.model, e.n_ctx, cache.format(),
               cache.evictor() ? " | evict " + cache.evictor()->spec().str() : "", e.describe());
    fmt::print("chunks: {} x {} tokens, {} scored, {:.1f} s ({:.0f} tokens/s)\n", r.n_chunks, e.n_ctx, r.n_scored,
               r.seconds, double(r.n_chunks * e.n_ctx) / r.seconds);
    fmt::print("mode: {} ({})\n", o.mode,
               mode == PplMode::Prefill ? "each chunk one batch, K/V written to the cache and read back through it"
                                        : "token by token through the decode path");
    fmt::print("{}\n", kv_summary(e, r.kv_tokens_max));
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    fmt::print("peak RSS: {} KiB\n", ru.ru_maxrss);
    fmt::print("{}\n", memory_summary(e));  // each rank's with --tp
    fmt::print("Final estimate: PPL = {:.4f} +/- {:.5f}\n", r.ppl, r.ppl_err);
}
}  // namespace

void add_perplexity(CLI::App& app, int& rc) {
    auto* sub = app.add_subcommand("perplexity", "Perplexity of a model on a text file (llama-perplexity semantics)");
    auto o = std::make_shared<PerplexityOptions>();
    o->rt.add_to(sub);
    add_tp_option(sub, o->rt.tp);
    sub->add_option("-f,--file", o->file, "text file")->required();
    sub->add_option("--chunks", o->chunks, "number of chunks (default: all)");
    sub->add_option("--mode", o->mode, "prefill (llama-perplexity: one batch per chunk) or stream (token by token)")
        ->check(CLI::IsMember({"prefill", "stream"}));
    sub->callback([o, &rc] {
        run_perplexity(*o);
        rc = 0;
    });
}

}  // namespace vxq::tools

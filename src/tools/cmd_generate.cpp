// vxq generate: prompt in, continuation streamed to stdout (or one JSON object with --json).
#include <cstdio>
#include <limits>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/generate.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace vxq::tools {

namespace {
struct GenerateOptions {
    RuntimeOptions rt;
    std::string prompt;
    std::string prompt_file;
    GenerateParams gen;
    bool json = false;
};

void run_generate(const GenerateOptions& o) {
    // The prompt is one batch at position 0: --prefill-exact applies whenever the cache is compressed.
    if (o.rt.prefill_exact) check_prefill_exact(true, !is_f16_cache(o.rt.kv_spec()));
    const std::string prompt = o.prompt_file.empty() ? o.prompt : read_file(o.prompt_file);
    // The prompt is the largest batch: at most one token per byte (byte fallback) plus BOS and EOS.
    Engine e = make_engine(o.rt, int64_t(prompt.size()) + 2, 1);
    // The prompt is echoed with the first generated text, not before: generate() refuses a bad
    // prompt (invalid UTF-8, too long) before it streams anything, and a refusal prints nothing.
    bool echoed = false;
    const auto echo_prompt = [&] {
        if (!echoed) fmt::print("{}", prompt);
        echoed = true;
    };
    std::function<void(std::string_view)> stream;
    if (!o.json) {
        stream = [&](std::string_view s) {
            echo_prompt();
            fmt::print("{}", s);
            std::fflush(stdout);
        };
    }
    const GenerateResult r = generate(*e.runner, prompt, o.gen, stream);
    const size_t kv_bytes = e.runner->kv_bytes();
    const double pp_tps = r.prompt_ids.size() / (r.prompt_ms / 1e3);
    const double tg_tps = r.ids.empty() ? 0.0 : r.ids.size() / (r.decode_ms / 1e3);
    if (o.json) {
        nlohmann::json j;
        j["prompt_ids"] = r.prompt_ids;
        j["ids"] = r.ids;
        j["text"] = r.text;
        // Sampling may pick byte tokens that are no UTF-8 text; dump_json then writes U+FFFD.
        j["text_valid_utf8"] = find_invalid_utf8(r.text) < 0;
        j["stop_reason"] = r.stop_reason;
        j["timings"] = {{"prompt_n", r.prompt_ids.size()}, {"prompt_ms", r.prompt_ms}, {"prompt_per_second", pp_tps},
                        {"predicted_n", r.ids.size()},     {"predicted_ms", r.decode_ms}, {"predicted_per_second", tg_tps}};
        const int64_t tokens = e.runner->size();
        const int64_t f16_bytes = 2 * e.runner->kv_elements(tokens);  // every rank's KV heads
        j["kv_cache"] = {{"format", e.ranks()[0].second->format()}, {"resident_bytes", kv_bytes}, {"n_ctx", e.n_ctx},
                         {"tokens", tokens}, {"bits_per_element", e.runner->kv_bits_per_element(tokens)},
                         {"f16_bytes", f16_bytes}, {"longest_context", e.longest_context}};
        j["backend"] = e.describe();
        j["backend_memory"] = memory_json(BackendMemory::of(*e.ranks()[0].first));
        if (e.group) j["tp"] = tp_json(e);
        fmt::print("{}\n", dump_json(std::move(j)));
    } else {
        echo_prompt();
        fmt::print("\n");
        fmt::print(stderr, "\nprompt: {} tokens in {:.1f} ms ({:.1f} t/s) | generated: {} tokens in {:.1f} ms ({:.1f} t/s) | "
                   "stop: {}\n{} | longest context in the free memory {} tokens | backend: {} | {}\n",
                   r.prompt_ids.size(), r.prompt_ms, pp_tps, r.ids.size(), r.decode_ms, tg_tps, r.stop_reason,
                   kv_summary(e, e.runner->size()),
                   e.longest_context >= RuntimeOptions::kMaxCtx ? fmt::format("at least {} (-c's limit)", RuntimeOptions::kMaxCtx) : std::to_string(e.longest_context),
                   e.describe(), memory_summary(e));
    }
}
}  // namespace

void add_generate(CLI::App& app, int& rc) {
    auto* sub = app.add_subcommand("generate", "Generate a continuation of a prompt");
    auto o = std::make_shared<GenerateOptions>();
    o->rt.add_to(sub);
    add_tp_option(sub, o->rt.tp);
    auto* p = sub->add_option("-p,--prompt", o->prompt, "prompt text");
    auto* f = sub->add_option("-f,--file", o->prompt_file, "read the prompt from a file");
    p->excludes(f);
    sub->add_option("-n,--n-predict", o->gen.n_predict, "tokens to generate (default 128)");
    sub->add_option("--temp", o->gen.sampler.temperature, "temperature; 0 = greedy (default 0.8)")
        ->check(finite_in(0.0, std::numeric_limits<double>::infinity()));
    sub->add_option("--top-k", o->gen.sampler.top_k, "top-k, 0 = off (default 40)")
        ->check(finite_in(0.0, std::numeric_limits<int32_t>::max()));
    sub->add_option("--top-p", o->gen.sampler.top_p, "top-p, 1 = off (default 0.95)")->check(finite_in(0.0, 1.0));
    sub->add_option("--min-p", o->gen.sampler.min_p, "min-p, 0 = off (default 0.05)")->check(finite_in(0.0, 1.0));
    sub->add_option("-s,--seed", o->gen.sampler.seed, "RNG seed (default: random)");
    sub->add_flag("--json", o->json, "print one JSON object: prompt_ids, ids, text, timings");
    sub->callback([o, &rc, p, f] {
        if (p->count() == 0 && f->count() == 0) throw CLI::RequiredError("--prompt or --file");
        run_generate(*o);
        rc = 0;
    });
}

}  // namespace vxq::tools

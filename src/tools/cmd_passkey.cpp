// vxq passkey: pass-key retrieval accuracy of a model with a KV method (runtime/passkey.h).
#include <algorithm>
#include <map>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "runtime/passkey.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace vxq::tools {

namespace {
struct PasskeyOptions {
    RuntimeOptions rt;
    std::string file;
    std::vector<int64_t> lengths;  // empty: every length class
    bool json = false;
};

void run_passkey_cmd(const PasskeyOptions& o) {
    if (o.rt.prefill_exact) check_prefill_exact(true, !is_f16_cache(o.rt.kv_spec()));
    const PasskeySet set = parse_passkey_set(read_file(o.file), o.file);
    const std::vector<const PasskeyCase*> cases = select_passkey_cases(set, o.lengths, o.file);
    int64_t longest = 0;
    for (const PasskeyCase* c : cases) longest = std::max(longest, c->prompt_tokens);
    Engine e = make_engine(o.rt, longest, 1);
    if (longest + kPasskeyNewTokens > e.n_ctx) {
        fail("the longest prompt is {} tokens: with {} new tokens it needs a context of {}, and the context is {} (raise -c)",
             longest, kPasskeyNewTokens, longest + kPasskeyNewTokens, e.n_ctx);
    }
    const bool tty = stderr_is_tty();
    const auto outcomes = run_passkey(*e.model, *e.backend, *e.cache, cases, [&](size_t done, size_t total) {
        if (tty) fmt::print(stderr, "\r[{}/{}] cases   ", done, total);
    });
    if (tty) fmt::print(stderr, "\n");
    const PasskeyTally t = tally_passkey(outcomes);
    const std::string method = e.cache->format();
    if (o.json) {
        nlohmann::json j;
        j["set"] = set.name;
        j["model"] = o.rt.model;
        j["kv"] = method;
        j["backend"] = e.backend->describe();
        j["correct"] = t.correct;
        j["total"] = t.total;
        for (const auto& [len, ct] : t.by_length) j["by_length"][std::to_string(len)] = {{"correct", ct.first}, {"total", ct.second}};
        for (const PasskeyOutcome& r : outcomes) {
            j["cases"].push_back({{"id", r.c->id}, {"target_tokens", r.c->target_tokens}, {"prompt_tokens", r.prompt_tokens},
                                  {"depth", r.c->depth}, {"answer", r.c->answer}, {"text", r.text}, {"correct", r.correct},
                                  {"seconds", r.seconds}});
        }
        fmt::print("{}\n", dump_json(std::move(j)));
        return;
    }
    fmt::print("passkey: {} | {} | kv {} | {}\n\n", set.name, o.rt.model, method, e.backend->describe());
    fmt::print("| prompt tokens | correct |\n| ---: | ---: |\n");
    for (const auto& [len, ct] : t.by_length) fmt::print("| {} | {}/{} |\n", len, ct.first, ct.second);
    fmt::print("| all | {}/{} |\n", t.correct, t.total);
    for (const PasskeyOutcome& r : outcomes) {
        if (!r.correct) fmt::print("miss {}: depth {:.2f}, answer {}, got \"{}\"\n", r.c->id, r.c->depth, r.c->answer, r.text);
    }
}
}  // namespace

void add_passkey(CLI::App& app, int& rc) {
    auto* sub = app.add_subcommand("passkey", "Pass-key retrieval accuracy with a KV method (greedy, 8 new tokens per case)");
    auto o = std::make_shared<PasskeyOptions>();
    o->rt.add_to(sub);
    sub->add_option("-f,--file", o->file, "the pass-key set (e.g. ../shared/assets/passkey/passkey_wikitext.json)")->required();
    sub->add_option("--lengths", o->lengths, "only the cases of these prompt lengths (e.g. 4000)")->delimiter(',');
    sub->add_flag("--json", o->json, "print one JSON object: per length and per case");
    sub->callback([o, &rc] {
        run_passkey_cmd(*o);
        rc = 0;
    });
}

}  // namespace vxq::tools

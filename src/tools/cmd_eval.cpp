// vxq eval: quality of a list of KV methods against the f16 cache on one model and text —
// perplexity (prefill and stream), KL divergence and top-1 agreement of the next-token
// distribution, attention fidelity, bits/element — as markdown, JSON and a KL-vs-bits SVG; with
// --gate, the limits of a quality-gate file are checked (exit 1 on a violation). With --passkey,
// the same methods (and the reference) also answer a pass-key set (runtime/passkey.h) on
// --passkey-model: right answers per method in the same table and JSON.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kv/calibration.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "runtime/eval.h"
#include "runtime/memory_check.h"
#include "runtime/passkey.h"
#include "runtime/quality_gate.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/json_charts.h"
#include "tools/svg_plot.h"

namespace vxq::tools {

namespace {

struct EvalOptions {
    std::string model, file, ref = "f16", json_out, plot_out, speed_plot_out, gate, device = "cpu";
    std::string passkey, passkey_model;  // the set; the model that answers it (default: model)
    std::vector<int64_t> passkey_lengths;
    std::vector<std::string> kv, bench_json;
    std::vector<std::string> modes{"prefill", "stream"};
    int threads = 0;
    int64_t n_ctx = 0, chunks = -1, attn_every = 64;
    bool prefill_exact = false;
    bool flash_attn = false;
    bool modes_given = false;
    bool attn_every_given = false;
};

nlohmann::json dist_json(const Distribution& d) {
    return {{"n", d.n}, {"mean", d.mean}, {"median", d.median}, {"p99", d.p99}, {"max", d.max}, {"min", d.min}};
}

nlohmann::json to_json(const EvalResult& r, const EvalOptions& o) {
    nlohmann::json j;
    j["model"] = o.model;
    j["text"] = o.file;
    j["reference"] = r.reference_format;
    j["ctx"] = r.n_ctx;
    j["chunks"] = r.n_chunks;
    j["attn_every"] = o.attn_every;
    j["seconds"] = r.seconds;
    j["methods"] = nlohmann::json::array();
    for (const MethodEval& m : r.methods) {
        nlohmann::json jm{{"method", m.method.label}, {"k", m.method.k}, {"v", m.method.v}, {"format", m.format}};
        for (const ModeEval& e : m.modes) {
            jm["modes"][mode_name(e.mode)] = {
                {"ppl", e.ppl}, {"ppl_err", e.ppl_err}, {"ppl_ref", e.ppl_ref}, {"ppl_delta", e.ppl / e.ppl_ref - 1.0},
                {"kl", dist_json(e.kl)}, {"top1", e.top1}, {"n_scored", e.n_scored}, {"kv_bytes", e.kv_bytes},
                {"kv_tokens", e.kv_tokens}, {"bits_per_element", e.bits_per_element},
                {"attn_score_corr", dist_json(e.score_corr)}, {"attn_out_rel_err", dist_json(e.out_rel_err)}};
        }
        j["methods"].push_back(jm);
    }
    return j;
}

// One method's pass-key run (the reference first).
struct PasskeyEval {
    std::string label, format;
    bool reference = false;
    PasskeyTally tally;
    double seconds = 0;
};

struct PasskeyRun {
    PasskeySet set;
    std::vector<const PasskeyCase*> cases;
    std::string model;
    std::vector<PasskeyEval> methods;
};

// Every method of p (the reference first) with a fresh cache on the pass-key model.
void run_passkey_methods(PasskeyRun& run, const EvalParams& p, int threads) {
    int64_t longest = 0;
    for (const PasskeyCase* c : run.cases) longest = std::max(longest, c->prompt_tokens);
    const auto model = Model::load(run.model, p.device);
    const ModelConfig& c = model->config();
    const int64_t n_ctx = longest + kPasskeyNewTokens;
    if (n_ctx > c.n_ctx_train) {
        fail("--passkey: the longest prompt is {} tokens, with {} new tokens {}, above the training context {} of {} "
             "(choose --passkey-lengths)",
             longest, kPasskeyNewTokens, n_ctx, c.n_ctx_train, run.model);
    }
    std::vector<const EvalMethod*> methods{&p.reference};
    for (const EvalMethod& m : p.methods) methods.push_back(&m);
    for (const EvalMethod* m : methods) {
        check_calibration_model(m->spec, run.model);
        check_calibration_model(m->evict, run.model);
    }
    const auto be = make_backend(p.device, threads);
    const KvShape shape{c.n_layer, c.n_head, c.n_head_kv, c.head_dim, n_ctx};
    const bool tty = stderr_is_tty();
    for (const EvalMethod* m : methods) {
        KvCacheOptions opts{p.prefill_exact, p.flash_attn};
        opts.memory = be->kv_memory();
        opts.evict = m->evict;
        const auto cache = make_kv_cache(shape, m->spec, opts);
        const Model* models[] = {model.get()};
        const KvCache* caches[] = {cache.get()};
        check_fits(memory_need(*be, models, caches, longest, 1), be->memory_info(), p.device);
        const auto t0 = std::chrono::steady_clock::now();
        const auto outcomes = run_passkey(*model, *be, *cache, run.cases, [&](size_t done, size_t total) {
            if (tty) fmt::print(stderr, "\r[{}/{}] pass-key cases, {}   ", done, total, m->label);
        });
        if (tty) fmt::print(stderr, "\n");
        PasskeyEval e;
        e.label = m->label;
        e.format = cache->format();
        e.reference = m == &p.reference;
        e.tally = tally_passkey(outcomes);
        e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        run.methods.push_back(std::move(e));
    }
}

nlohmann::json to_json(const PasskeyRun& run) {
    nlohmann::json j{{"set", run.set.name}, {"model", run.model}, {"cases", run.cases.size()}};
    j["methods"] = nlohmann::json::array();
    for (const PasskeyEval& e : run.methods) {
        nlohmann::json m{{"method", e.label}, {"format", e.format}, {"reference", e.reference},
                         {"correct", e.tally.correct}, {"total", e.tally.total}, {"seconds", e.seconds}};
        for (const auto& [len, ct] : e.tally.by_length) {
            m["by_length"][std::to_string(len)] = {{"correct", ct.first}, {"total", ct.second}};
        }
        j["methods"].push_back(m);
    }
    return j;
}

std::string to_markdown(const PasskeyRun& run) {
    std::string s = fmt::format("pass key: {} | {} | {} cases, greedy, {} new tokens\n\n", run.set.name, run.model,
                                run.cases.size(), kPasskeyNewTokens);
    s += "| method | correct | by prompt length |\n| --- | ---: | --- |\n";
    for (const PasskeyEval& e : run.methods) {
        std::vector<std::string> parts;
        for (const auto& [len, ct] : e.tally.by_length) parts.push_back(fmt::format("{}: {}/{}", len, ct.first, ct.second));
        s += fmt::format("| {}{} | {}/{} | {} |\n", e.label, e.reference ? " (reference)" : "", e.tally.correct, e.tally.total,
                         fmt::join(parts, ", "));
    }
    return s;
}

std::string to_markdown(const EvalResult& r) {
    std::string s = fmt::format(
        "reference: {} | ctx {} | {} chunks | KL(reference || method) in nats over every scored token\n\n", r.reference_format,
        r.n_ctx, r.n_chunks);
    s += "| method | mode | bits/el | KV bytes | PPL | ΔPPL | KL mean | KL median | KL p99 | KL max | top-1 | attn score corr (mean / min) | attn out rel err (mean / p99) |\n";
    s += "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
    for (const MethodEval& m : r.methods) {
        for (const ModeEval& e : m.modes) {
            const std::string attn = e.score_corr.n > 0 ? fmt::format("{:.5f} / {:.4f}", e.score_corr.mean, e.score_corr.min) : "—";
            const std::string err = e.out_rel_err.n > 0 ? fmt::format("{:.2e} / {:.2e}", e.out_rel_err.mean, e.out_rel_err.p99) : "—";
            s += fmt::format("| {} | {} | {:.3f} | {} | {:.4f} | {:+.3f} % | {:.3e} | {:.3e} | {:.3e} | {:.3e} | {:.2f} % | {} | {} |\n",
                             m.method.label, mode_name(e.mode), e.bits_per_element, e.kv_bytes, e.ppl,
                             100.0 * (e.ppl / e.ppl_ref - 1.0), e.kl.mean, e.kl.median, e.kl.p99, e.kl.max, 100.0 * e.top1,
                             attn, err);
        }
    }
    return s;
}

void run_eval_cmd(EvalOptions o) {
    if (!o.bench_json.empty() && o.speed_plot_out.empty()) fail("--bench is read only for --speed-plot");
    if (o.file.empty() && o.passkey.empty()) fail("eval: give a text (-f) for perplexity and KL, a pass-key set (--passkey), or both");
    if (o.file.empty() && !o.gate.empty()) fail("--gate checks perplexity and KL: it needs a text (-f)");
    if (o.file.empty() && !o.plot_out.empty()) fail("--plot draws KL against bits: it needs a text (-f)");
    if (o.passkey.empty() && (!o.passkey_model.empty() || !o.passkey_lengths.empty())) {
        fail("--passkey-model and --passkey-lengths go with --passkey");
    }
    // Every input is read and every output path checked before the long run, so a typo costs nothing.
    for (const auto& path : o.bench_json) read_file(path);
    for (const std::string* out : {&o.json_out, &o.plot_out, &o.speed_plot_out}) {
        if (!out->empty()) check_writable(*out);
    }
    std::optional<QualityGate> gate;
    if (!o.gate.empty()) {
        gate = QualityGate::parse(read_file(o.gate), o.gate);
        const std::string base = std::filesystem::path(o.model).filename().string();
        if (base != gate->model) fail("the gate '{}' is for model '{}', not '{}'", o.gate, gate->model, base);
    }
    std::optional<PasskeyRun> pk;
    if (!o.passkey.empty()) {
        pk.emplace();
        pk->set = parse_passkey_set(read_file(o.passkey), o.passkey);
        pk->cases = select_passkey_cases(pk->set, o.passkey_lengths, o.passkey);
        pk->model = o.passkey_model.empty() ? o.model : o.passkey_model;
        if (!std::filesystem::is_regular_file(pk->model)) fail("--passkey-model: no such file: {}", pk->model);
    }
    const std::string text = o.file.empty() ? std::string() : read_file(o.file);
    if (!o.file.empty() && text.empty()) fail("eval: {} is empty: no text for perplexity and KL", o.file);
    EvalParams p;
    if (gate) {
        if (!o.kv.empty() || o.n_ctx > 0 || o.chunks != -1 || o.modes_given) {
            fail("--gate '{}' sets the methods, context, chunks and mode: drop --kv, -c, --chunks and --mode", o.gate);
        }
        p = gate->eval_params();
    } else {
        for (const std::string& m : split_methods(o.kv)) p.methods.push_back(EvalMethod::parse(m));
        if (p.methods.empty()) fail("eval: give the KV methods with --kv (e.g. --kv q8_0,q4_0,kivi:bits=2)");
        p.modes.clear();
        for (const std::string& m : o.modes) p.modes.push_back(m == "stream" ? PplMode::Stream : PplMode::Prefill);
        p.n_ctx = o.n_ctx > 0 ? o.n_ctx : 512;
        p.n_chunks = o.chunks;
        p.attn_every = o.attn_every;
    }
    p.reference = EvalMethod::parse(o.ref);
    p.prefill_exact = o.prefill_exact;
    p.flash_attn = o.flash_attn;
    p.device = o.device;
    const auto has_mode = [&](PplMode m) { return std::count(p.modes.begin(), p.modes.end(), m) > 0; };
    if (o.attn_every_given && !has_mode(PplMode::Stream)) fail("--attn-every probes stream mode only: add --mode stream or drop it");
    if (p.prefill_exact) {
        check_prefill_exact(has_mode(PplMode::Prefill), std::any_of(p.methods.begin(), p.methods.end(), [](const EvalMethod& m) {
                                return !is_f16_cache(m.spec);
                            }));
    }
    std::vector<KvSpec> specs{p.reference.spec};
    for (const EvalMethod& m : p.methods) specs.push_back(m.spec);
    check_device(o.device, specs, p.prefill_exact);
    const int threads = resolve_threads(o.threads);
    std::optional<EvalResult> r;
    std::string backend;
    if (!text.empty()) {
        const auto model = Model::load(o.model, o.device);
        for (const KvSpec& s : specs) check_calibration_model(s, o.model);
        for (const EvalMethod& m : p.methods) check_calibration_model(m.evict, o.model);
        const auto be = make_backend(o.device, threads);
        backend = be->describe();
        const bool tty = stderr_is_tty();
        r = run_eval(*model, *be, text, p, [&](int64_t done, int64_t total) {
            if (tty) fmt::print(stderr, "\r[{}/{}] runs   ", done, total);
        });
        if (tty) fmt::print(stderr, "\n");
    }
    if (pk) run_passkey_methods(*pk, p, threads);
    // Files first: a failed write then leaves stdout empty, as every failure does.
    if (!o.json_out.empty()) {
        nlohmann::json j = r ? to_json(*r, o) : nlohmann::json{{"model", o.model}, {"reference", o.ref}};
        if (pk) j["passkey"] = to_json(*pk);
        write_file_atomically(o.json_out, dump_json(std::move(j), 1) + "\n");
    }
    if (!o.plot_out.empty()) {
        const Chart c = kl_vs_bits_chart(to_json(*r, o));
        write_file_atomically(o.plot_out, render_svg(c.spec, c.points));
    }
    if (!o.speed_plot_out.empty()) {
        const Chart c = speed_vs_depth_chart(o.bench_json);
        write_file_atomically(o.speed_plot_out, render_svg(c.spec, c.points));
    }
    if (r) {
        fmt::print("eval: {} | {} methods | reference {} | {}\n", o.model, p.methods.size(), o.ref, backend);
        fmt::print("{}", to_markdown(*r));
        fmt::print("\n{:.1f} s\n", r->seconds);
    }
    if (pk) fmt::print("{}{}", r ? "\n" : "", to_markdown(*pk));
    if (gate) {
        const auto violations = check_gate(*gate, *r);
        for (const auto& v : violations) fmt::print("gate: FAIL {}\n", v);
        if (!violations.empty()) fail("quality gate '{}': {} limit(s) violated", o.gate, violations.size());
        fmt::print("gate: PASS ({} methods within the limits of {})\n", gate->limits.size(), o.gate);
    }
}

}  // namespace

void add_eval(CLI::App& app, int& rc) {
    auto* sub = app.add_subcommand("eval", "Quality of KV methods vs the f16 cache: PPL, KL divergence, top-1, attention fidelity");
    auto o = std::make_shared<EvalOptions>();
    sub->add_option("-m,--model", o->model, "GGUF model file")->required();
    sub->add_option("-f,--file", o->file, "text file (perplexity, KL; optional with --passkey)");
    sub->add_option("--kv", o->kv, "KV methods, comma-separated; K/V pairs as KSPEC/VSPEC (q4_0/f16); an eviction policy after @ "
                                        "(f16@knorm:budget=128; stream mode only)");
    sub->add_option("--ref", o->ref, "reference method (default f16, the llama.cpp-parity cache)");
    sub->add_option("-c,--ctx-size", o->n_ctx, "context (chunk) size in tokens (default 512)")
        ->check(CLI::Range(int64_t(4), int64_t(1) << 20));
    sub->add_option("--chunks", o->chunks, "number of chunks (default: all)");
    sub->add_option("--mode", o->modes, "prefill and/or stream (default both)")
        ->delimiter(',')
        ->check(CLI::IsMember({"prefill", "stream"}));
    sub->add_option("--attn-every", o->attn_every, "stream mode: probe attention fidelity every N scored steps (0: off)")
        ->check(CLI::Range(int64_t(0), int64_t(1) << 20));
    add_device_option(sub, o->device);
    sub->add_option("-t,--threads", o->threads, "CPU threads (default: all cores)")->check(CLI::Range(0, 1024));
    sub->add_flag("--prefill-exact", o->prefill_exact, "a batch at position 0 attends to its exact K/V (KIVI's recipe)");
    sub->add_flag("--flash-attn", o->flash_attn, "-fa: f16 caches (the reference too) through the fused kernel");
    sub->add_option("--json", o->json_out, "write the results as JSON to this file");
    sub->add_option("--plot", o->plot_out, "write the KL-vs-bits SVG to this file");
    sub->add_option("--bench", o->bench_json, "vxq bench --json file(s) for --speed-plot");
    sub->add_option("--speed-plot", o->speed_plot_out, "write decode tokens/s vs context depth (from --bench) to this SVG")
        ->needs("--bench");
    sub->add_option("--gate", o->gate, "check a quality-gate file (tests/data/gate/*.json); exit 1 on a violation");
    sub->add_option("--passkey", o->passkey, "also answer this pass-key set (../shared/assets/passkey/*.json) with every method");
    sub->add_option("--passkey-model", o->passkey_model, "the model that answers the pass-key set (default: -m)");
    sub->add_option("--passkey-lengths", o->passkey_lengths, "only the pass-key cases of these prompt lengths (e.g. 4000)")
        ->delimiter(',');
    sub->callback([o, sub, &rc] {
        o->modes_given = sub->count("--mode") > 0;
        o->attn_every_given = sub->count("--attn-every") > 0;
        run_eval_cmd(*o);
        rc = 0;
    });
}

}  // namespace vxq::tools

// vxq bench: llama-bench-style throughput table, measured with the MEASURE.md protocol
// (interleaved configurations, rotating prompts, A/A noise floor, median/min/max).
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kv/calibration.h"
#include "model/model.h"
#include "runtime/bench.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace vxq::tools {

namespace {

struct BenchOptions {
    std::vector<std::string> models;
    std::vector<std::string> kv{"f16"};
    std::string ctk, ctv;  // override the K / V half of every --kv entry
    bool flash_attn = false;
    std::vector<std::string> depths;  // -d values as given: "0,1024,2048", possibly repeated
    BenchParams p;
    bool csv = false;
    bool json = false;
    bool verbose = false;
    bool no_aa = false;
    std::string depth_fill = "prefill";
    int tp = 1;
};

// Paired per-repetition ratios against the baseline (first configuration) of the same test.
BenchStats paired_ratio(const BenchRow& row, const BenchRow& base) {
    std::vector<double> r;
    for (size_t i = 0; i < row.tps.samples.size(); ++i) r.push_back(row.tps.samples[i] / base.tps.samples[i]);
    return summarize(r);
}

// "0,1024,2048" (and further -d values) -> {0, 1024, 2048}, as llama-bench's -d; every item a
// whole number of tokens in [0, 2^20].
std::vector<int64_t> parse_depths(const std::vector<std::string>& args) {
    constexpr int64_t kMaxDepth = int64_t(1) << 20;
    std::vector<int64_t> out;
    for (const auto& a : args) {
        size_t pos = 0;
        while (pos <= a.size()) {
            const size_t comma = std::min(a.find(',', pos), a.size());
            const std::string item = a.substr(pos, comma - pos);
            if (item.empty()) fail("bench: -d/--depth '{}': empty depth (expected a comma-separated list such as 0,1024,2048)", a);
            int64_t d = 0;
            const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), d);
            const bool whole = end == item.data() + item.size();
            if (!whole || (ec != std::errc{} && ec != std::errc::result_out_of_range)) {
                fail("bench: -d/--depth '{}': '{}' is not a number of tokens (expected a comma-separated list such as 0,1024,2048)", a, item);
            }
            if (d < 0 || (ec == std::errc::result_out_of_range && item[0] == '-')) fail("bench: -d/--depth: depth must be >= 0, got {}", item);
            if (ec == std::errc::result_out_of_range || d > kMaxDepth) fail("bench: -d/--depth: depth {} is larger than {}", item, kMaxDepth);
            out.push_back(d);
            pos = comma + 1;
        }
    }
    return out;
}

// A quoted CSV field (RFC 4180): a label holds the model's file name, which may hold quotes.
std::string csv_field(const std::string& s) {
    std::string out = "\"";
    for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
    return out + "\"";
}

void run_bench_cmd(BenchOptions o) {
    o.p.threads = resolve_threads(o.p.threads);
    o.kv = split_methods(o.kv);
    if (!o.depths.empty()) o.p.depths = parse_depths(o.depths);
    std::vector<KvSpec> specs;  // validated, with the device, before a model loads
    for (const auto& kv : o.kv) specs.push_back(KvSpec::from_flags(kv, o.ctk, o.ctv));
    check_device(o.p.device, specs, false);
    std::vector<std::unique_ptr<Model>> models;
    std::unique_ptr<TpGroup> group;  // --tp N > 1: every configuration on its ranks
    if (o.tp > 1 && o.models.size() != 1) fail("bench: --tp {} runs one model (-m given {} times)", o.tp, o.models.size());
    std::vector<BenchConfig> configs;
    for (const auto& path : o.models) {
        for (const KvSpec& kv : specs) check_calibration_model(kv, path);
        if (o.tp > 1) {
            group = TpGroup::create(path, o.p.device, o.p.threads, o.tp);
            o.p.group = group.get();
        } else {
            models.push_back(Model::load(path, o.p.device));
        }
        const Model* model = group ? &group->model() : models.back().get();
        const std::string stem = std::filesystem::path(path).stem().string();
        for (const KvSpec& kv : specs) {
            const std::string spec = kv.str();
            configs.push_back({fmt::format("{} kv={}{}{}", stem, spec, o.flash_attn ? " fa" : "",
                                           o.tp > 1 ? fmt::format(" tp{}", o.tp) : ""),
                               model, spec, o.flash_attn});
        }
    }
    o.p.add_aa = !o.no_aa;
    o.p.fill_kv = o.depth_fill == "kv";
    const bool tty = stderr_is_tty();
    const BenchReport rep = run_bench(
        configs, o.p, o.verbose ? std::function<void(const std::string&)>([](const std::string& s) { fmt::print(stderr, "{}\n", s); }) : nullptr,
        [&](int done, int total) {
            if (tty && !o.verbose) fmt::print(stderr, "\rbench: run {}/{}   ", done, total);
        });
    if (tty && !o.verbose) fmt::print(stderr, "\n");

    // The baseline of each test is its first row; the A/A row gives the noise floor.
    std::map<std::string, const BenchRow*> base;
    for (const auto& r : rep.rows) {
        if (!base.count(r.test)) base[r.test] = &r;
    }
    if (o.json) {
        nlohmann::json j;
        j["machine"] = rep.machine;
        j["backend"] = rep.backend;
        j["backend_memory"] = memory_json(rep.memory);
        if (!rep.rank_memory.empty()) {
            for (const BackendMemory& m : rep.rank_memory) j["tp"]["rank_memory"].push_back(memory_json(m));
            j["tp"]["size"] = rep.rank_memory.size();
        }
        j["loadavg_1m_at_start"] = rep.loadavg_1m;
        j["threads"] = o.p.threads;
        j["repetitions"] = o.p.reps;
        j["prompt_pool"] = o.p.pool;
        j["depth_fill"] = o.depth_fill;
        for (const auto& r : rep.rows) {
            const BenchStats ratio = paired_ratio(r, *base[r.test]);
            j["rows"].push_back({{"config", r.label}, {"test", r.test}, {"depth", r.depth}, {"n_prompt", r.n_prompt},
                                 {"n_gen", r.n_gen}, {"code_path", r.code_path}, {"kv_format", r.kv_format},
                                 {"kv_bytes", r.kv_bytes}, {"kv_bits_per_element", r.kv_bits_per_element}, {"aa", r.is_aa},
                                 {"tps_median", r.tps.median}, {"tps_min", r.tps.min}, {"tps_max", r.tps.max},
                                 {"tps_mean", r.tps.mean}, {"tps_sd", r.tps.sd}, {"tps_samples", r.tps.samples},
                                 {"ratio_median", ratio.median}, {"ratio_min", ratio.min}, {"ratio_max", ratio.max}});
        }
        fmt::print("{}\n", dump_json(std::move(j), 1));
        return;
    }
    if (o.csv) {
        fmt::print("config,test,code_path,kv_format,kv_bytes,kv_bits_per_element,reps,tps_median,tps_min,tps_max,tps_mean,tps_sd,ratio_median,ratio_min,ratio_max\n");
        for (const auto& r : rep.rows) {
            const BenchStats ratio = paired_ratio(r, *base[r.test]);
            fmt::print("{},{},{},{},{},{:.3f},{},{:.2f},{:.2f},{:.2f},{:.2f},{:.2f},{:.4f},{:.4f},{:.4f}\n", csv_field(r.label), r.test, csv_field(r.code_path),
                       r.kv_format, r.kv_bytes, r.kv_bits_per_element, r.tps.samples.size(), r.tps.median, r.tps.min, r.tps.max,
                       r.tps.mean, r.tps.sd, ratio.median, ratio.min, ratio.max);
        }
        return;
    }
    fmt::print("machine: {} | threads: {} | load average at start: {:.2f} | {} reps interleaved, {} rotating prompts{}\n",
               rep.machine, o.p.threads, rep.loadavg_1m, o.p.reps, o.p.pool,
               o.p.fill_kv ? " | depth: keys and values stored without the model (--depth-fill kv)" : "");
    fmt::print("backend: {} | {} (KV bytes per row)\n", rep.backend, memory_summary(rep.memory));
    for (size_t r = 0; r < rep.rank_memory.size(); ++r) fmt::print("  rank {}: {}\n", r, memory_summary(rep.rank_memory[r]));
    fmt::print("\n");
    fmt::print("| config | test | code path | KV bytes | KV bits/el | t/s median | min | max | mean ± sd | ratio (min–max) |\n");
    fmt::print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (const auto& r : rep.rows) {
        const BenchStats ratio = paired_ratio(r, *base[r.test]);
        fmt::print("| {} | {} | {} | {} | {:.2f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} ± {:.1f} | {:.3f} ({:.3f}–{:.3f}) |\n", r.label,
                   r.test, r.code_path, r.kv_bytes, r.kv_bits_per_element, r.tps.median, r.tps.min, r.tps.max, r.tps.mean,
                   r.tps.sd, ratio.median, ratio.min, ratio.max);
    }
    for (const auto& r : rep.rows) {
        if (!r.is_aa) continue;
        const BenchStats ratio = paired_ratio(r, *base[r.test]);
        fmt::print("\nnoise floor ({}): A/A ratio {:.3f} ({:.3f}–{:.3f}); differences inside ±{:.1f}% are not measurable\n", r.test,
                   ratio.median, ratio.min, ratio.max, 100.0 * std::max(std::abs(ratio.max - 1.0), std::abs(1.0 - ratio.min)));
    }
}

}  // namespace

void add_bench(CLI::App& app, int& rc) {
    auto* sub = app.add_subcommand("bench", "Prefill/decode throughput (llama-bench style, MEASURE.md protocol)");
    auto o = std::make_shared<BenchOptions>();
    sub->add_option("-m,--model", o->models, "GGUF model file(s)")->required();
    sub->add_option("-p,--n-prompt", o->p.n_prompt, "prompt tokens per prefill test (0: skip)")->check(CLI::Range(int64_t(0), int64_t(1) << 20));
    sub->add_option("-n,--n-gen", o->p.n_gen, "generated tokens per decode test (0: skip)")->check(CLI::Range(int64_t(0), int64_t(1) << 20));
    sub->add_option("-d,--depth", o->depths, "tokens in the cache before each test, comma-separated: one test per depth (0,1024,2048)")
        ->type_name("N[,N...]");
    add_device_option(sub, o->p.device);
    add_tp_option(sub, o->tp);
    sub->add_option("-t,--threads", o->p.threads, "CPU threads")->check(CLI::Range(1, 1024));
    sub->add_option("-r,--repetitions", o->p.reps, "timed repetitions per configuration")->check(CLI::Range(1, 10000));
    sub->add_option("--kv", o->kv, "KV cache methods, comma-separated (options stay with their method: f16,kivi:bits=2,group=32,q4_0)");
    sub->add_option("--cache-type-k", o->ctk, "KV method for keys of every configuration (-ctk)");
    sub->add_option("--cache-type-v", o->ctv, "KV method for values of every configuration (-ctv)");
    sub->add_flag("--flash-attn", o->flash_attn, "-fa: f16 caches through the fused kernel");
    sub->add_option("--pool", o->p.pool, "distinct prompts in the rotation")->check(CLI::Range(2, 1000));
    sub->add_flag("--no-aa", o->no_aa, "do not add the A/A copy of the baseline");
    sub->add_option("--depth-fill", o->depth_fill,
                    "how the depth enters the cache: prefill (the model, as llama-bench -d) or kv (each layer's keys and "
                    "values of the tokens' embeddings, no attention: for caches whose prefill is slow)")
        ->check(CLI::IsMember({"prefill", "kv"}));
    auto* csv = sub->add_flag("--csv", o->csv, "CSV output");
    sub->add_flag("--json", o->json, "JSON output")->excludes(csv);
    sub->add_flag("-v,--verbose", o->verbose, "trace every timed run: order, configuration, prompt");
    sub->callback([o, &rc] {
        run_bench_cmd(*o);
        rc = 0;
    });
}

}  // namespace vxq::tools

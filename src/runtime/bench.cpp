#include "runtime/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

#include <fmt/format.h>

#include "backend/backend.h"
#include "core/error.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "runtime/runner.h"
#include "runtime/tensor_parallel.h"

namespace vxq {

namespace {

constexpr size_t kDepthBatch = 512;  // tokens per forward pass of a test's depth prefix (untimed)

double loadavg() {
    std::ifstream in("/proc/loadavg");
    double v = -1;
    in >> v;
    return v;
}

std::string cpu_model() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
    }
    return "unknown cpu";
}

// One configuration's KV cache and what runs over it: a cache on the bench's backend, or a cache
// on every rank of a tensor-parallel group.
struct Arm {
    std::unique_ptr<KvCache> cache;
    std::unique_ptr<SingleRunner> single;
    std::unique_ptr<TpRunner> tp;

    Runner& run() { return single ? static_cast<Runner&>(*single) : *tp; }
    const KvCache& first_cache() const { return single ? *cache : tp->cache(0); }  // rank 0's in a group
};

Arm make_arm(const BenchConfig& c, int64_t n_ctx, Backend* be, TpGroup* group) {
    KvCacheOptions opts{false, c.flash_attn};
    Arm a;
    if (group) {
        a.tp = group->make_runner(KvSpec::parse(c.kv), opts, n_ctx);
        return a;
    }
    const ModelConfig& m = c.model->config();
    opts.memory = be->kv_memory();  // where the backend's attention reads it
    a.cache = make_kv_cache(KvShape{m.n_layer, m.n_head, m.n_head_kv, m.head_dim, n_ctx}, KvSpec::parse(c.kv), opts);
    a.single = std::make_unique<SingleRunner>(*c.model, *be, *a.cache);
    return a;
}

// Random token ids, avoiding control tokens, as llama-bench's prompts.
std::vector<TokenId> random_tokens(const Model& m, int64_t n, std::mt19937_64& rng) {
    std::uniform_int_distribution<TokenId> dist(3, TokenId(m.config().n_vocab - 1));
    std::vector<TokenId> t(static_cast<size_t>(n));
    for (auto& x : t) x = dist(rng);
    t[0] = m.tokenizer().vocab().bos >= 0 ? m.tokenizer().vocab().bos : t[0];
    return t;
}

}  // namespace

BenchStats summarize(std::vector<double> s) {
    BenchStats st;
    if (s.empty()) return st;
    st.samples = s;
    std::sort(s.begin(), s.end());
    const size_t n = s.size();
    st.median = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    st.min = s.front();
    st.max = s.back();
    double sum = 0;
    for (double x : s) sum += x;
    st.mean = sum / double(n);
    double var = 0;
    for (double x : s) var += (x - st.mean) * (x - st.mean);
    st.sd = n > 1 ? std::sqrt(var / double(n - 1)) : 0.0;
    return st;
}

BenchReport run_bench(const std::vector<BenchConfig>& configs_in, const BenchParams& p,
                      const std::function<void(const std::string&)>& trace,
                      const std::function<void(int, int)>& progress) {
    if (configs_in.empty()) fail("bench: no configuration to run");
    if (p.reps < 1) fail("bench: repetitions must be >= 1, got {}", p.reps);
    if (p.n_prompt < 0 || p.n_gen < 0) fail("bench: -p and -n must be >= 0");
    if (p.n_prompt == 0 && p.n_gen == 0) fail("bench: nothing to measure (-p 0 and -n 0)");
    if (p.depths.empty()) fail("bench: no depth to measure (-d needs at least one value)");
    for (size_t i = 0; i < p.depths.size(); ++i) {
        if (p.depths[i] < 0) fail("bench: depth must be >= 0, got {}", p.depths[i]);
        for (size_t j = 0; j < i; ++j) {
            if (p.depths[j] == p.depths[i]) fail("bench: depth {} is given twice", p.depths[i]);
        }
    }
    if (p.pool < 1) fail("bench: the prompt pool needs at least one prompt");

    std::vector<BenchConfig> configs = configs_in;
    if (p.add_aa) {
        BenchConfig aa = configs.front();
        aa.label += " (A/A)";
        configs.insert(configs.begin() + 1, aa);
    }
    BenchReport rep;
    rep.loadavg_1m = loadavg();
    rep.machine = cpu_model();

    struct Test {
        std::string name;
        bool prefill;
        int64_t n;
        int64_t depth;
    };
    std::vector<Test> tests;
    for (const int64_t d : p.depths) {
        const std::string at = d > 0 ? fmt::format("@d{}", d) : "";
        if (p.n_prompt > 0) tests.push_back({fmt::format("pp{}{}", p.n_prompt, at), true, p.n_prompt, d});
        if (p.n_gen > 0) tests.push_back({fmt::format("tg{}{}", p.n_gen, at), false, p.n_gen, d});
    }

    if (p.group) {
        for (const auto& c : configs) {
            if (c.model != &p.group->model()) fail("bench: with --tp every configuration runs the group's model");
        }
    }
    const std::unique_ptr<Backend> own = p.group ? nullptr : make_backend(p.device, p.threads);
    Backend& lead = p.group ? p.group->backend(0) : *own;  // rank 0's in a group
    const int64_t max_depth = *std::max_element(p.depths.begin(), p.depths.end());
    const int64_t n_ctx = max_depth + std::max(p.n_prompt, p.n_gen) + 1;
    std::vector<Arm> arms;
    for (const auto& c : configs) arms.push_back(make_arm(c, n_ctx, own.get(), p.group));
    const int64_t largest_batch = std::max(std::min<int64_t>(max_depth, kDepthBatch), p.n_prompt);
    if (p.group) {
        std::vector<const TpRunner*> all;
        for (const Arm& a : arms) all.push_back(a.tp.get());
        p.group->check_fits(all, largest_batch, 1, p.device);
    } else {
        // Every configuration keeps its cache for the whole run; the largest batch is a depth
        // prefix or a pp test, each with one row of logits.
        std::vector<const Model*> models;
        for (const auto& c : configs) {
            if (std::find(models.begin(), models.end(), c.model) == models.end()) models.push_back(c.model);
        }
        std::vector<const KvCache*> all;
        for (const Arm& a : arms) all.push_back(a.cache.get());
        check_fits(memory_need(*own, models, all, largest_batch, 1), own->memory_info(), p.device);
    }

    // One prompt pool per model (configs of the same model share it, so each repetition hands
    // every arm the same input): depth prefix + test tokens. A test at depth d reads the first d
    // tokens as its cached context and the tokens after them as its timed input.
    std::mt19937_64 rng(p.seed);
    std::vector<std::vector<std::vector<TokenId>>> pools(configs.size());
    for (size_t ci = 0; ci < configs.size(); ++ci) {
        for (size_t cj = 0; cj < ci; ++cj) {
            if (configs[cj].model == configs[ci].model) pools[ci] = pools[cj];
        }
        if (pools[ci].empty()) {
            for (int i = 0; i < p.pool; ++i) pools[ci].push_back(random_tokens(*configs[ci].model, n_ctx - 1, rng));
        }
    }

    std::vector<float> logits;
    // Runs test t of config ci on `run` (depth prefix untimed); returns tokens/s of the timed part.
    auto run_on = [&](size_t ci, Runner& run, const Test& t, const std::vector<TokenId>& prompt) {
        const Model& m = *configs[ci].model;
        logits.resize(size_t(m.config().n_vocab));
        // The backend's own output memory where it has one (as llama.cpp's pinned output buffer).
        float* out = run.output_buffer(logits.size());
        if (!out) out = logits.data();
        run.truncate(0);
        const auto depth = static_cast<size_t>(t.depth);
        // The depth prefix in batches of kDepthBatch tokens, as llama.cpp's ubatch: a device's
        // prefill attention holds a score row per (query, token) of a batch.
        for (size_t d0 = 0; d0 < depth; d0 += kDepthBatch) {
            const auto part = std::span(prompt).subspan(d0, std::min(kDepthBatch, depth - d0));
            if (p.fill_kv) {
                run.fill_kv(part);
            } else {
                run.forward(part, 1, out);
            }
        }
        const auto body = std::span(prompt).subspan(depth);
        const auto t0 = std::chrono::steady_clock::now();
        if (t.prefill) {
            run.forward(body.first(size_t(t.n)), 1, out);
        } else {
            for (int64_t i = 0; i < t.n; ++i) run.forward(body.subspan(size_t(i), 1), 1, out);
        }
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return double(t.n) / s;
    };
    auto run_one = [&](size_t ci, const Test& t, const std::vector<TokenId>& prompt) {
        return run_on(ci, arms[ci].run(), t, prompt);
    };

    // Resident KV per (config, test): what a cache holds after one run of the test alone. A cache
    // keeps the pages of the most tokens it has held, so the shared cache shows it right after a
    // test's warm-up run when no earlier run held more tokens (the tests of one depth in order of
    // their token counts, and every test of a single-depth run: no fill of its own); the others are
    // measured on a fresh cache below.
    struct KvFigure {
        size_t bytes = 0;
        double bits_per_element = 0;
        bool measured = false;
    };
    std::vector<std::vector<KvFigure>> kv_of(configs.size(), std::vector<KvFigure>(tests.size()));
    // Every rank's bytes, per element of the whole model's K/V.
    const auto figure = [](Arm& a) {
        return KvFigure{a.run().kv_bytes(), a.run().kv_bits_per_element(a.run().size()), true};
    };
    const auto held = [](const Test& t) { return t.depth + t.n; };

    // Warm-up: every config once on every test, untimed (first-touch faults, caches, pool spin-up).
    for (size_t ci = 0; ci < configs.size(); ++ci) {
        int64_t most = 0;  // tokens the cache has held
        for (size_t ti = 0; ti < tests.size(); ++ti) {
            run_one(ci, tests[ti], pools[ci][0]);
            if (held(tests[ti]) >= most) {
                kv_of[ci][ti] = figure(arms[ci]);
            }
            most = std::max(most, held(tests[ti]));
        }
    }

    // The (test, config) pairs of one repetition round, configurations alternating within each
    // test (A B C A B C ...), every depth in the same round. Round r starts r pairs further along
    // the cycle, so the pair that opens a round, and the one that closes it, changes every round.
    struct Pair {
        size_t ti, ci;
    };
    std::vector<Pair> cycle;
    for (size_t ti = 0; ti < tests.size(); ++ti)
        for (size_t ci = 0; ci < configs.size(); ++ci) cycle.push_back({ti, ci});

    std::vector<std::vector<std::vector<double>>> samples(configs.size(), std::vector<std::vector<double>>(tests.size()));
    const int total = p.reps * int(cycle.size());
    int done = 0;
    for (int r = 0; r < p.reps; ++r) {
        const int prompt_idx = (r + 1) % p.pool;  // index 0 was the warm-up's
        for (size_t k = 0; k < cycle.size(); ++k) {
            const auto [ti, ci] = cycle[(size_t(r) + k) % cycle.size()];
            const double tps = run_one(ci, tests[ti], pools[ci][size_t(prompt_idx)]);
            samples[ci][ti].push_back(tps);
            if (trace) {
                trace(fmt::format("run {:>3}: rep {} {:<12} {:<40} prompt #{} -> {:.1f} t/s", done + 1, r + 1,
                                  tests[ti].name, configs[ci].label, prompt_idx, tps));
            }
            if (progress) progress(++done, total);
        }
    }

    // The other tests' resident KV: on a fresh cache after one untimed run of the test (the shared
    // cache still holds the pages of a larger depth).
    for (size_t ci = 0; ci < configs.size(); ++ci) {
        for (size_t ti = 0; ti < tests.size(); ++ti) {
            if (kv_of[ci][ti].measured) continue;
            Arm fresh = make_arm(configs[ci], n_ctx, own.get(), p.group);
            run_on(ci, fresh.run(), tests[ti], pools[ci][0]);
            kv_of[ci][ti] = figure(fresh);
        }
    }

    for (size_t ti = 0; ti < tests.size(); ++ti) {
        for (size_t ci = 0; ci < configs.size(); ++ci) {
            BenchRow row;
            row.label = configs[ci].label;
            row.test = tests[ti].name;
            row.depth = tests[ti].depth;
            row.n_prompt = tests[ti].prefill ? tests[ti].n : 0;
            row.n_gen = tests[ti].prefill ? 0 : tests[ti].n;
            row.code_path = lead.describe() + ", attention " + lead.attention_path(arms[ci].first_cache().view(0));
            row.kv_format = arms[ci].first_cache().format();
            row.kv_bytes = kv_of[ci][ti].bytes;
            row.kv_bits_per_element = kv_of[ci][ti].bits_per_element;
            row.is_aa = p.add_aa && ci == 1;
            row.tps = summarize(samples[ci][ti]);
            rep.rows.push_back(std::move(row));
        }
    }
    rep.backend = lead.describe();
    rep.memory = BackendMemory::of(lead);
    if (p.group) {
        for (int r = 0; r < p.group->ranks(); ++r) rep.rank_memory.push_back(BackendMemory::of(p.group->backend(r)));
    }
    return rep;
}

}  // namespace vxq

#include "runtime/eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "core/error.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "runtime/attention_probe.h"
#include "runtime/memory_check.h"

namespace vxq {

EvalMethod EvalMethod::parse(const std::string& text) {
    EvalMethod m;
    m.label = text;
    const size_t at = text.find('@');
    m.spec = KvSpec::parse(text.substr(0, at));
    if (at != std::string::npos) {
        m.evict = EvictSpec::parse(text.substr(at + 1));
        if (!m.evict.active()) fail("eval method '{}': no eviction policy after '@'", text);
    }
    m.k = m.spec.k.str();
    m.v = m.spec.v.str();
    return m;
}

Distribution Distribution::of(std::vector<double> v) {
    std::erase_if(v, [](double x) { return std::isnan(x); });
    Distribution d;
    d.n = int64_t(v.size());
    if (v.empty()) return d;
    std::sort(v.begin(), v.end());
    double sum = 0;
    for (const double x : v) sum += x;
    d.mean = sum / double(v.size());
    const auto at = [&](double q) { return v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))]; };
    d.median = at(0.5);
    d.p99 = at(0.99);
    d.max = v.back();
    d.min = v.front();
    return d;
}

const char* mode_name(PplMode m) { return m == PplMode::Prefill ? "prefill" : "stream"; }

namespace {

// Log-softmax of one logits row, in double.
void log_softmax(const float* x, int64_t n, std::vector<double>& out) {
    out.resize(size_t(n));
    float mx = x[0];
    for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(double(x[i] - mx));
    const double lse = std::log(sum);
    for (int64_t i = 0; i < n; ++i) out[size_t(i)] = double(x[i] - mx) - lse;
}

int64_t argmax(const float* x, int64_t n) { return int64_t(std::max_element(x, x + n) - x); }

struct Accum {
    double nll = 0, nll2 = 0;
    int64_t count = 0, same_top1 = 0;
    std::vector<double> kl;
    size_t kv_bytes = 0;
    int64_t kv_tokens = 0;

    void add_nll(double v) {
        nll += v;
        nll2 += v * v;
        ++count;
    }
    double ppl() const { return std::exp(nll / double(count)); }
    double ppl_err() const {
        const double mean = nll / double(count), var = nll2 / double(count) - mean * mean;
        return var > 0.0 ? std::sqrt(var / double(count - 1)) * ppl() : 0.0;
    }
};

}  // namespace

EvalResult run_eval(const Model& model, Backend& be, std::string_view text, const EvalParams& p,
                    const std::function<void(int64_t, int64_t)>& progress) {
    const auto t0 = std::chrono::steady_clock::now();
    if (p.methods.empty()) fail("eval: no KV methods given");
    if (p.modes.empty()) fail("eval: no perplexity mode given");
    if (p.attn_every < 0) fail("eval: the attention sampling interval must be >= 0, got {}", p.attn_every);
    for (const EvalMethod& m : p.methods) {
        if (m.evict.active() && std::count(p.modes.begin(), p.modes.end(), PplMode::Prefill) > 0) {
            fail("eval method '{}': eviction acts between forward passes, so a prefill chunk (one pass) never sees it; "
                 "use --mode stream",
                 m.label);
        }
    }
    const ModelConfig& c = model.config();
    const KvShape shape{c.n_layer, c.n_head, c.n_head_kv, c.head_dim, p.n_ctx};
    const PplChunks plan = plan_chunks(model, text, p.n_ctx, p.n_chunks, shape.n_ctx);
    const int64_t n_vocab = c.n_vocab;

    // Fresh caches per mode, as a perplexity run has: a codec may calibrate on the first batch
    // it sees (fp8's scale), which differs between the modes.
    auto make_caches = [&](std::unique_ptr<KvCache>& ref, std::vector<std::unique_ptr<AttentionProbe>>& caches) {
        KvCacheOptions opts{p.prefill_exact, p.flash_attn};
        opts.memory = be.kv_memory();  // where the backend's attention reads it
        ref = make_kv_cache(shape, p.reference.spec, opts);
        caches.clear();
        for (const EvalMethod& m : p.methods) {
            KvCacheOptions mo = opts;
            mo.evict = m.evict;
            caches.push_back(std::make_unique<AttentionProbe>(make_kv_cache(shape, m.spec, mo)));
        }
    };
    std::unique_ptr<KvCache> ref;
    std::vector<std::unique_ptr<AttentionProbe>> caches;
    make_caches(ref, caches);  // validates every method before the first run
    {
        // Every cache of a mode is alive at once; a prefill chunk is one batch with logits for its
        // second half. The probes' exact f32 copies are measurement only and are not counted.
        std::vector<const KvCache*> all{ref.get()};
        for (const auto& probe : caches) all.push_back(&probe->inner());
        const Model* models[] = {&model};
        const bool prefill = std::count(p.modes.begin(), p.modes.end(), PplMode::Prefill) > 0;
        check_fits(memory_need(be, models, all, prefill ? p.n_ctx : 1, prefill ? p.n_ctx - plan.first : 1), be.memory_info(),
                   p.device);
    }
    EvalResult r;
    r.reference_format = ref->format();
    r.n_ctx = p.n_ctx;
    r.n_chunks = plan.n_chunks;
    r.n_text_tokens = int64_t(plan.tokens.size());
    for (size_t mi = 0; mi < p.methods.size(); ++mi) r.methods.push_back({p.methods[mi], caches[mi]->inner().format(), {}});

    const int64_t n_rows = p.n_ctx - 1 - plan.first;
    std::vector<float> ref_logits(size_t(n_rows * n_vocab));
    std::vector<double> lp_ref, lp_m;
    const int64_t total = int64_t(p.modes.size()) * plan.n_chunks * int64_t(p.methods.size() + 1);
    int64_t done = 0;
    auto tick = [&] {
        if (progress) progress(++done, total);
    };
    for (size_t mode_i = 0; mode_i < p.modes.size(); ++mode_i) {
        const PplMode mode = p.modes[mode_i];
        if (mode_i > 0) make_caches(ref, caches);
        Accum ref_acc;
        std::vector<Accum> acc(p.methods.size());
        for (int64_t ci = 0; ci < plan.n_chunks; ++ci) {
            const std::vector<TokenId> chunk = plan.chunk(ci);
            run_chunk(model, be, *ref, chunk, mode, plan.first, [&](int64_t j, const float* row) {
                std::copy_n(row, n_vocab, ref_logits.data() + (j - plan.first) * n_vocab);
                ref_acc.add_nll(nll_of(row, n_vocab, plan.next(ci, j)));
            });
            tick();
            for (size_t mi = 0; mi < p.methods.size(); ++mi) {
                AttentionProbe& probe_m = *caches[mi];
                KvCache& cache = probe_m.cache();
                Accum& a = acc[mi];
                const bool probe = mode == PplMode::Stream && p.attn_every > 0;
                run_chunk(
                    model, be, cache, chunk, mode, plan.first,
                    [&](int64_t j, const float* row) {
                        const float* rr = ref_logits.data() + (j - plan.first) * n_vocab;
                        a.add_nll(nll_of(row, n_vocab, plan.next(ci, j)));
                        log_softmax(rr, n_vocab, lp_ref);
                        log_softmax(row, n_vocab, lp_m);
                        double kl = 0;
                        for (int64_t t = 0; t < n_vocab; ++t) {
                            kl += std::exp(lp_ref[size_t(t)]) * (lp_ref[size_t(t)] - lp_m[size_t(t)]);
                        }
                        // NaN logits diverge infinitely: never a silent 0 (or a dropped sample)
                        a.kl.push_back(std::isnan(kl) ? INFINITY : std::max(0.0, kl));
                        a.same_top1 += argmax(rr, n_vocab) == argmax(row, n_vocab);
                    },
                    [&](int64_t j) { probe_m.arm(probe && j >= plan.first && (j - plan.first) % p.attn_every == 0); });
                probe_m.arm(false);
                a.kv_bytes = std::max(a.kv_bytes, cache.resident_bytes());
                a.kv_tokens = std::max(a.kv_tokens, cache.size());
                tick();
            }
        }
        for (size_t mi = 0; mi < p.methods.size(); ++mi) {
            const Accum& a = acc[mi];
            ModeEval e;
            e.mode = mode;
            e.ppl = a.ppl();
            e.ppl_err = a.ppl_err();
            e.ppl_ref = ref_acc.ppl();
            e.kl = Distribution::of(a.kl);
            e.top1 = double(a.same_top1) / double(a.count);
            e.n_scored = a.count;
            e.kv_bytes = a.kv_bytes;
            e.kv_tokens = a.kv_tokens;
            e.bits_per_element = resident_bits_per_element(caches[mi]->inner(), a.kv_tokens);
            std::vector<double> corr, err;
            for (const AttentionSample& s : caches[mi]->samples()) {
                corr.push_back(s.score_corr);
                err.push_back(s.out_rel_err);
            }
            e.score_corr = Distribution::of(std::move(corr));
            e.out_rel_err = Distribution::of(std::move(err));
            caches[mi]->clear_samples();
            r.methods[mi].modes.push_back(e);
        }
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
}

}  // namespace vxq

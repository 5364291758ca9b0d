// vxq eval and the quality gate (runtime/eval.h, runtime/attention_probe.h,
// runtime/quality_gate.h): the metrics are right where the answer is known (a method equal to
// the reference has KL 0 and top-1 1, eval's perplexity equals `perplexity`'s, an exact cache
// has exact attention), the KL ordering q8_0 < q4_0 < kivi-2 holds on a real model, the gate
// files in tests/data/gate pass through the real CLI, and a deliberately biased codec fails them.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/backend.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kv/codec.h"
#include "model/model.h"
#include "runtime/attention_probe.h"
#include "support/attend.h"
#include "runtime/eval.h"
#include "runtime/quality_gate.h"
#include "support/assets.h"
#include "support/run_cli.h"
#include "support/text.h"

namespace vxq {
namespace {

using test::read_file;

const char* const kStories = "assets/models/stories260K.gguf";
const char* const kStoriesText = "assets/text/tinystories_valid_head.txt";
const char* const kH64 = "assets/models/vxq-llama-h64-f16.gguf";
const char* const kWiki = "assets/text/wikitext2_test.raw.crlf.txt";

std::vector<EvalMethod> methods(std::initializer_list<const char*> names) {
    std::vector<EvalMethod> out;
    for (const char* n : names) out.push_back(EvalMethod::parse(n));
    return out;
}

const ModeEval& mode_of(const MethodEval& m, PplMode mode) {
    for (const auto& e : m.modes) {
        if (e.mode == mode) return e;
    }
    throw std::runtime_error("mode missing");
}

TEST(Eval, MethodParseAndDistribution) {
    EXPECT_EQ(EvalMethod::parse("q4_0").v, "q4_0");
    const auto kv = EvalMethod::parse("q4_0/f16");
    EXPECT_EQ(kv.k, "q4_0");
    EXPECT_EQ(kv.v, "f16");
    EXPECT_THROW(EvalMethod::parse("/f16"), Error);
    EXPECT_THROW(EvalMethod::parse("q4_0/"), Error);
    std::vector<double> v;
    for (int i = 1; i <= 100; ++i) v.push_back(double(i));
    v.push_back(NAN);
    const Distribution d = Distribution::of(v);
    EXPECT_EQ(d.n, 100);
    EXPECT_DOUBLE_EQ(d.mean, 50.5);
    EXPECT_DOUBLE_EQ(d.max, 100.0);
    EXPECT_DOUBLE_EQ(d.min, 1.0);
    EXPECT_DOUBLE_EQ(d.p99, 99.0);
    EXPECT_EQ(Distribution::of({}).n, 0);
}

// The probe on a cache with known content: an exact (f32) cache gives exact attention; a 4-bit
// cache gives a visible but bounded error; unarmed, nothing is sampled.
TEST(Eval, AttentionProbeOnRandomCaches) {
    const uint32_t seed = std::random_device{}();
    SCOPED_TRACE("seed=" + std::to_string(seed));
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    ThreadPool pool(2);
    const KvShape shape{2, 6, 2, 64, 300};
    const int64_t n = 257, kv = shape.n_head_kv * shape.head_dim;
    std::vector<float> k(size_t(n * kv)), v(size_t(n * kv)), q(size_t(shape.n_head * shape.head_dim)),
        out(q.size());
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    for (auto& x : q) x = nd(rng);
    for (const char* spec : {"f32", "q4_0"}) {
        AttentionProbe probe(make_kv_cache(shape, spec, spec));
        KvCache& cache = probe.cache();
        for (int64_t l = 0; l < shape.n_layer; ++l) cache.write(l, 0, k.data(), v.data(), n - 1);
        cache.commit(n - 1);
        for (int64_t l = 0; l < shape.n_layer; ++l) cache.write(l, n - 1, k.data() + (n - 1) * kv, v.data() + (n - 1) * kv, 1);
        auto attend_observed = [&](int64_t layer) {
            test::attend(cache, layer, q.data(), 1, n - 1, out.data(), pool);
            cache.observe_attention(layer, q.data(), 1, n - 1, out.data());
        };
        attend_observed(0);
        EXPECT_TRUE(probe.samples().empty());
        probe.arm(true);
        attend_observed(1);
        ASSERT_EQ(probe.samples().size(), size_t(shape.n_head)) << spec;
        for (const AttentionSample& s : probe.samples()) {
            EXPECT_EQ(s.layer, 1);
            EXPECT_EQ(s.len, n);
            if (std::string(spec) == "f32") {
                EXPECT_GT(s.score_corr, 1.0 - 1e-9);
                EXPECT_LT(s.out_rel_err, 1e-5);  // f32 kernel vs double reference
            } else {
                EXPECT_GT(s.score_corr, 0.95);
                EXPECT_LT(s.score_corr, 1.0 - 1e-6);
                EXPECT_GT(s.out_rel_err, 1e-4);
                EXPECT_LT(s.out_rel_err, 0.3);
            }
        }
    }
}

// On stories260K: f16 against f16 is KL 0 and top-1 1 exactly; eval's perplexity equals the
// perplexity command's for the same cache in both modes; fidelity is sampled in stream mode only.
TEST(Eval, KnownAnswersOnStories260K) {
    VXQ_REQUIRE_ASSET(kStories);
    VXQ_REQUIRE_ASSET(kStoriesText);
    const auto model = Model::load(test::shared_path(kStories));
    const auto be = make_backend("cpu", 2);
    const std::string text = read_file(test::shared_path(kStoriesText));
    EvalParams p;
    p.n_ctx = 64;
    p.n_chunks = 3;
    p.methods = methods({"f16", "bf16", "fp8"});
    p.attn_every = 8;
    const EvalResult r = run_eval(*model, *be, text, p);
    ASSERT_EQ(r.methods.size(), 3u);
    for (const PplMode mode : {PplMode::Prefill, PplMode::Stream}) {
        const ModeEval& same = mode_of(r.methods[0], mode);
        EXPECT_EQ(same.kl.max, 0.0) << mode_name(mode);
        EXPECT_EQ(same.top1, 1.0);
        EXPECT_EQ(same.ppl, same.ppl_ref);
        EXPECT_EQ(same.n_scored, 3 * (64 - 1 - 32));
        for (size_t mi = 1; mi < 3; ++mi) {
            const ModeEval& e = mode_of(r.methods[mi], mode);
            auto cache = make_kv_cache({model->config().n_layer, model->config().n_head, model->config().n_head_kv,
                                        model->config().head_dim, 64},
                                       r.methods[mi].method.k, r.methods[mi].method.v);
            const auto ppl = perplexity(*model, *be, *cache, text, PerplexityParams{64, 3, mode});
            EXPECT_DOUBLE_EQ(e.ppl, ppl.ppl) << r.methods[mi].method.label;
            EXPECT_GT(e.kl.mean, 0.0);
            EXPECT_LT(e.kl.mean, 0.05);
            EXPECT_LE(e.kl.median, e.kl.p99);
            EXPECT_LE(e.kl.p99, e.kl.max);
            EXPECT_GT(e.top1, 0.8);
        }
        const ModeEval& bf = mode_of(r.methods[1], mode);
        if (mode == PplMode::Stream) {
            EXPECT_EQ(bf.score_corr.n, 3 * 4 * model->config().n_layer * model->config().n_head);
            EXPECT_GT(bf.score_corr.min, 0.999);
            // bf16 keeps 8 mantissa bits (0.4 % per element); at head_dim 8 the output error
            // is a few times that on average, more where the output nearly cancels.
            EXPECT_LT(bf.out_rel_err.mean, 0.03);
            EXPECT_LT(bf.out_rel_err.p99, 0.15);
            EXPECT_GT(bf.out_rel_err.mean, 0.0);
        } else {
            EXPECT_EQ(bf.score_corr.n, 0);
        }
    }
}

TEST(Eval, BadParameters) {
    VXQ_REQUIRE_ASSET(kStories);
    const auto model = Model::load(test::shared_path(kStories));
    const auto be = make_backend("cpu", 1);
    EvalParams p;
    p.n_ctx = 64;
    EXPECT_THROW(run_eval(*model, *be, "short text", p), Error);  // no methods
    p.methods = methods({"nosuch"});
    EXPECT_THROW(run_eval(*model, *be, std::string(20000, 'a'), p), Error);
    p.methods = methods({"f16"});
    EXPECT_THROW(run_eval(*model, *be, "too short", p), Error);
}

TEST(QualityGate, ParseErrorsNameTheProblem) {
    const std::string ok = R"({"model":"m.gguf","text":"t.txt","ctx":64,"chunks":2,"mode":"stream","limits":{"q8_0":{"kl_mean":0.01}}})";
    EXPECT_NO_THROW(QualityGate::parse(ok, "ok.json"));
    const char* bad[] = {
        "{", "[]", R"({"model":"m.gguf"})",
        R"({"model":"m.gguf","text":"t.txt","ctx":64,"chunks":2,"limits":{"q8_0":{"kl_mean":-1}}})",
        R"({"model":"m.gguf","text":"t.txt","ctx":64,"chunks":2,"limits":{"q8_0":{"kl_avg":0.1}}})",
        R"({"model":"m.gguf","text":"t.txt","ctx":0,"chunks":2,"limits":{"q8_0":{"kl_mean":0.1}}})",
        R"({"model":"m.gguf","text":"t.txt","ctx":64,"chunks":2,"mode":"fast","limits":{"q8_0":{}}})",
        R"({"model":"m.gguf","text":"t.txt","ctx":64,"chunks":2,"extra":1,"limits":{"q8_0":{}}})",
    };
    for (const char* b : bad) {
        try {
            QualityGate::parse(b, "bad.json");
            ADD_FAILURE() << "accepted: " << b;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
        }
    }
}

TEST(QualityGate, CheckReportsEachViolatedLimit) {
    QualityGate g = QualityGate::parse(
        R"({"model":"m","text":"t","ctx":64,"chunks":1,"mode":"stream","limits":{"a":{"kl_mean":0.01,"kl_p99":0.1,"kl_max":1,"ppl_delta":0.02,"top1_min":0.9},"b":{"kl_mean":0.01}}})",
        "g.json");
    EvalResult r;
    ModeEval e;
    e.mode = PplMode::Stream;
    e.kl.mean = 0.005;
    e.kl.p99 = 0.05;
    e.kl.max = 0.5;
    e.ppl = 10.1;
    e.ppl_ref = 10.0;
    e.top1 = 0.95;
    r.methods.push_back({EvalMethod::parse("a"), "a", {e}});
    EXPECT_EQ(check_gate(g, r).size(), 1u);  // b missing
    r.methods.push_back({EvalMethod::parse("b"), "b", {e}});
    EXPECT_TRUE(check_gate(g, r).empty());
    r.methods[0].modes[0].kl.mean = 0.02;
    r.methods[0].modes[0].ppl = 10.5;
    r.methods[0].modes[0].top1 = 0.5;
    r.methods[0].modes[0].kl.max = NAN;  // a NaN never passes
    EXPECT_EQ(check_gate(g, r).size(), 4u);
}

// The gate files of the repo, through the real CLI: what CI runs.
class GateFiles : public ::testing::TestWithParam<const char*> {};

TEST_P(GateFiles, PassOnMain) {
    const std::string file = std::string(VXQ_TEST_DATA_DIR) + "/gate/" + GetParam();
    const QualityGate g = QualityGate::parse(read_file(file), file);
    const std::string model = "assets/models/" + g.model, text = "assets/text/" + g.text;
    VXQ_REQUIRE_ASSET(model);
    VXQ_REQUIRE_ASSET(text);
    const auto r = test::run_cli({"eval", "-m", test::shared_path(model), "-f", test::shared_path(text), "--gate", file, "-t", "2"});
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("gate: PASS"), std::string::npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Repo, GateFiles, ::testing::Values("stories260K.json", "vxq-llama-h64.json"));

// A codec that is q8_0 with a bias added to every value before encoding: the broken change the
// gate exists to catch.
class Biased final : public Codec {
public:
    Biased(std::unique_ptr<Codec> inner, float bias) : inner_(std::move(inner)), bias_(bias) {}
    std::string spec() const override { return "biased_q8_0"; }
    int64_t block_tokens() const override { return inner_->block_tokens(); }
    size_t block_bytes(int64_t d) const override { return inner_->block_bytes(d); }
    int64_t flush_at() const override { return inner_->flush_at(); }
    int64_t flush_count() const override { return inner_->flush_count(); }
    void encode(const float* x, int64_t d, uint8_t* block) const override {
        std::vector<float> y(x, x + block_tokens() * d);
        for (auto& v : y) v += bias_;
        inner_->encode(y.data(), d, block);
    }
    void decode(const uint8_t* block, int64_t d, float* x) const override { inner_->decode(block, d, x); }
    KvFormatParams params(int64_t d) const override { return inner_->params(d); }

private:
    std::unique_ptr<Codec> inner_;
    float bias_;
};

TEST(QualityGate, FailsOnAnInjectedBias) {
    const std::string file = std::string(VXQ_TEST_DATA_DIR) + "/gate/vxq-llama-h64.json";
    QualityGate g = QualityGate::parse(read_file(file), file);
    VXQ_REQUIRE_ASSET("assets/models/" + g.model);
    VXQ_REQUIRE_ASSET("assets/text/" + g.text);
    static const bool registered = [] {
        register_codec({"biased_q8_0", "", "q8_0 with +0.05 added to every value (a test's broken codec)", "8.5"},
                       [](const CodecSpec&, KvRole role, int64_t d, const KvLayerState*) -> std::unique_ptr<Codec> {
                           return std::make_unique<Biased>(make_codec(CodecSpec::parse("q8_0"), role, d), 0.05f);
                       });
        return true;
    }();
    ASSERT_TRUE(registered);
    // The broken codec must meet q8_0's limits.
    GateLimit q8;
    for (const auto& l : g.limits) {
        if (l.method == "q8_0") q8 = l;
    }
    ASSERT_EQ(q8.method, "q8_0") << "the h64 gate must limit q8_0";
    GateLimit broken = q8;
    broken.method = "biased_q8_0";
    g.limits = {q8, broken};
    const auto model = Model::load(test::shared_path("assets/models/" + g.model));
    const auto be = make_backend("cpu", 2);
    const EvalResult r = run_eval(*model, *be, read_file(test::shared_path("assets/text/" + g.text)), g.eval_params());
    const auto violations = check_gate(g, r);
    ASSERT_FALSE(violations.empty()) << "the gate let a biased codec through";
    for (const auto& v : violations) {
        EXPECT_EQ(v.rfind("biased_q8_0:", 0), 0u) << "q8_0 itself failed: " << v;
    }
}

// A codec whose values are NaN: KL must come out infinite (never a silent 0 or a dropped
// sample) and the gate must fail on it.
TEST(QualityGate, NanLogitsFailTheGate) {
    VXQ_REQUIRE_ASSET(kStories);
    VXQ_REQUIRE_ASSET(kStoriesText);
    static const bool registered = [] {
        register_codec({"nan_f32", "", "f32 with NaN added to every value (a test's broken codec)", "32"},
                       [](const CodecSpec&, KvRole role, int64_t d, const KvLayerState*) -> std::unique_ptr<Codec> {
                           return std::make_unique<Biased>(make_codec(CodecSpec::parse("f32"), role, d), NAN);
                       });
        return true;
    }();
    ASSERT_TRUE(registered);
    const auto model = Model::load(test::shared_path(kStories));
    const auto be = make_backend("cpu", 2);
    QualityGate g = QualityGate::parse(
        R"({"model":"stories260K.gguf","text":"t","ctx":64,"chunks":1,"mode":"stream","limits":{"nan_f32":{"kl_mean":1e9}}})", "nan.json");
    const EvalResult r = run_eval(*model, *be, read_file(test::shared_path(kStoriesText)), g.eval_params());
    EXPECT_TRUE(std::isinf(r.methods[0].modes[0].kl.mean));
    EXPECT_EQ(r.methods[0].modes[0].kl.n, 64 - 1 - 32);
    EXPECT_FALSE(check_gate(g, r).empty());
}

// KL(q8_0) < KL(q4_0) < KL(kivi-2) on vxq-llama-h64 where every key is read through its codes
// (prefill mode). In stream mode KIVI-2 comes out below q4_0, for the reason this test pins down
// too: q4_0's cost is in its keys (K q4_0 alone is above KIVI-2 K+V), which KIVI quantizes per
// channel and keeps in fp16 for the newest 128 tokens (docs/benchmarks.md).
TEST(Eval, KlOrderOnH64) {
    VXQ_REQUIRE_ASSET(kH64);
    VXQ_REQUIRE_ASSET(kWiki);
    const auto model = Model::load(test::shared_path(kH64));
    const auto be = make_backend("cpu", 2);
    EvalParams p;
    p.n_ctx = 256;
    p.n_chunks = 2;
    p.methods = methods({"q8_0", "q4_0", "kivi:bits=2", "q4_0/f16"});
    p.attn_every = 0;
    const EvalResult r = run_eval(*model, *be, read_file(test::shared_path(kWiki)), p);
    auto kl = [&](size_t i, PplMode m) { return mode_of(r.methods[i], m).kl.mean; };
    EXPECT_LT(kl(0, PplMode::Prefill), kl(1, PplMode::Prefill));
    EXPECT_LT(kl(1, PplMode::Prefill), kl(2, PplMode::Prefill));
    EXPECT_LT(kl(0, PplMode::Stream), kl(2, PplMode::Stream));
    EXPECT_LT(kl(2, PplMode::Stream), kl(3, PplMode::Stream));  // K q4_0 alone costs more than KIVI-2
}

}  // namespace
}  // namespace vxq

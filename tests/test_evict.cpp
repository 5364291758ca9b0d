// Eviction (kv/evict.h): the --evict spec, the keep mask, each policy on a cache, resident bytes,
// H2O's sums following their tokens, and Q-Filters' sign on a real model.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "core/error.h"
#include "kv/calibration.h"
#include "kv/evict.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "runtime/calibrate.h"
#include "support/assets.h"
#include "support/text.h"

namespace vxq {
namespace {

using test::error_of;

TEST(EvictSpec, ParsesPoliciesAndOptions) {
    EXPECT_FALSE(EvictSpec::parse("").active());
    const EvictSpec a = EvictSpec::parse("knorm:budget=256");
    EXPECT_EQ(a.policy, EvictPolicy::KNorm);
    EXPECT_EQ(a.budget, 256);
    EXPECT_EQ(a.sink, 4);
    EXPECT_EQ(a.window, 64);
    EXPECT_EQ(a.every, 1);
    EXPECT_EQ(a.str(), "knorm:budget=256");
    const EvictSpec b = EvictSpec::parse("h2o:ratio=0.25,sink=2,window=16,every=8");
    EXPECT_EQ(b.policy, EvictPolicy::H2O);
    EXPECT_DOUBLE_EQ(b.ratio, 0.25);
    EXPECT_EQ(b.budget_for(1000), 250);
    EXPECT_EQ(b.budget_for(3), 4);  // at least sink + 2
    EXPECT_EQ(EvictSpec::parse(b.str()).str(), b.str());
    EXPECT_EQ(EvictSpec::parse("qfilters:budget=64,calib=f.gguf").calib, "f.gguf");
    const EvictSpec sk = EvictSpec::parse("snapkv:budget=128,obs=32");
    EXPECT_EQ(sk.policy, EvictPolicy::SnapKV);
    EXPECT_EQ(sk.obs, 32);
    EXPECT_EQ(sk.str(), "snapkv:budget=128,obs=32");
    // The window leaves half of the non-sink budget to the scores; streaming's window is all of it.
    EXPECT_EQ(a.window_for(256), 64);
    EXPECT_EQ(a.window_for(64), 30);
    EXPECT_EQ(EvictSpec::parse("streaming:budget=64").window_for(64), 60);
    EXPECT_EQ(EvictSpec::parse("knorm:budget=64,window=48").window_for(64), 48);  // as given
    EXPECT_EQ(EvictSpec::parse("knorm:budget=64,window=100").window_for(64), 60);
}

TEST(EvictSpec, RefusesBadSpecsByName) {
    EXPECT_NE(error_of([] { EvictSpec::parse("knorm:budget=64,obs=8"); }).find("snapkv only"), std::string::npos);
    EXPECT_NE(error_of([] { EvictSpec::parse("lru:budget=64"); }).find("unknown policy"), std::string::npos);
    EXPECT_NE(error_of([] { EvictSpec::parse("knorm"); }).find("exactly one of budget"), std::string::npos);
    EXPECT_NE(error_of([] { EvictSpec::parse("knorm:budget=64,ratio=0.5"); }).find("exactly one"), std::string::npos);
    EXPECT_NE(error_of([] { EvictSpec::parse("knorm:ratio=1.5"); }).find("ratio=1.5"), std::string::npos);
    EXPECT_NE(error_of([] { EvictSpec::parse("knorm:ratio=abc"); }).find("ratio=abc"), std::string::npos);
    EXPECT_NE(error_of([] { EvictSpec::parse("knorm:budget=5"); }), "");  // below sink + 2
    EXPECT_NE(error_of([] { EvictSpec::parse("knorm:budget=64,color=red"); }).find("color"), std::string::npos);
    EXPECT_NE(error_of([] { EvictSpec::parse("knorm:budget=64,calib=x"); }).find("qfilters only"), std::string::npos);
    EXPECT_NE(error_of([] { EvictSpec::parse("qfilters:budget=64"); }).find("calib=FILE"), std::string::npos);
}

TEST(EvictKeepMask, KeepsSinksWindowAndTheBestScores) {
    // 12 tokens, budget 7: sinks 0-1, window 10-11, and the 3 best of 2..9.
    const std::vector<float> s = {0, 0, 5, 1, 9, 2, 7, NAN, 3, 3, -100, -100};
    const std::vector<uint8_t> keep = evict_keep_mask(s, 7, 2, 2);
    const std::vector<uint8_t> want = {1, 1, 1, 0, 1, 0, 1, 0, 0, 0, 1, 1};
    EXPECT_EQ(keep, want);
    // Ties go to the more recent token; NaN is the lowest score.
    const std::vector<float> t = {0, 3, 3, 3, NAN, 0};
    EXPECT_EQ(evict_keep_mask(t, 4, 1, 1), (std::vector<uint8_t>{1, 0, 1, 1, 0, 1}));
    // Within budget: everything stays.
    EXPECT_EQ(evict_keep_mask(t, 6, 1, 1), std::vector<uint8_t>(6, 1));
    EXPECT_EQ(std::accumulate(keep.begin(), keep.end(), 0), 7);
}

// A small f16 cache with keys of known norms: token t of every head has |k| = norms[t].
struct Filled {
    std::unique_ptr<KvCache> cache;
    std::vector<float> norms;
};
Filled filled_cache(const std::string& evict, int64_t n, int64_t batch) {
    const KvShape shape{2, 4, 2, 16, 512};
    KvCacheOptions o;
    o.evict = EvictSpec::parse(evict);
    Filled f{make_kv_cache(shape, KvSpec::parse("f16"), o), {}};
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(0.5f, 4.0f);
    std::vector<float> k(size_t(batch * shape.n_head_kv * shape.head_dim)), v(k.size());
    for (int64_t t0 = 0; t0 < n; t0 += batch) {
        const int64_t m = std::min(batch, n - t0);
        for (int64_t t = 0; t < m; ++t) {
            const float norm = u(rng);
            f.norms.push_back(norm);
            for (int64_t i = 0; i < shape.n_head_kv * shape.head_dim; ++i) {  // norm / 4 per channel: |k| = norm
                k[size_t(t * shape.n_head_kv * shape.head_dim + i)] = norm / 4.0f;
                v[size_t(t * shape.n_head_kv * shape.head_dim + i)] = float(t0 + t);
            }
        }
        for (int64_t l = 0; l < shape.n_layer; ++l) f.cache->write(l, t0, k.data(), v.data(), m);
        f.cache->commit(t0 + m);
    }
    return f;
}

TEST(Evictor, KNormKeepsTheSmallestKeysAndFreesTheirBytes) {
    const int64_t n = 300;
    Filled whole = filled_cache("", n, 1);
    Filled f = filled_cache("knorm:budget=40,sink=4,window=8", n, 1);
    for (int64_t l = 0; l < 2; ++l) {
        for (int64_t g = 0; g < 2; ++g) ASSERT_EQ(f.cache->head_tokens(l, g), 40);
    }
    EXPECT_EQ(whole.cache->head_tokens(0, 0), n);
    EXPECT_LT(f.cache->resident_bytes(), whole.cache->resident_bytes() / 3);
    // The last eviction (after token 299) kept sinks 0-3, the 8 latest and the 28 smallest norms of
    // the rest as they stood then; every kept middle token is no larger than every token it
    // evicted at that step: check the final state's middle against the window's neighbours.
    const std::vector<int32_t> pos = f.cache->head_positions(1, 1);
    ASSERT_EQ(pos.size(), 40u);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(pos[size_t(i)], i);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(pos[size_t(32 + i)], n - 8 + i);
    float kept_max = 0.0f;
    for (int i = 4; i < 32; ++i) kept_max = std::max(kept_max, f.norms[size_t(pos[size_t(i)])]);
    // Tokens that were in the middle at the last step and are gone: none smaller than kept_max's
    // 28 peers would be... so the kept middle norms are the 28 smallest of everything seen there.
    std::vector<float> middle(f.norms.begin() + 4, f.norms.end() - 8);
    std::sort(middle.begin(), middle.end());
    EXPECT_LE(kept_max, middle[27] + 1e-2f);  // norms stored as fp16
    // Values travel with their keys: token at position p has value p.
    std::vector<float> k, v;
    f.cache->dequantize(1, 1, 40, k, v);
    for (int i = 0; i < 40; ++i) EXPECT_EQ(v[size_t(i * 16)], float(pos[size_t(i)]));
}

TEST(Evictor, StreamingKeepsSinksAndTheLatestTokens) {
    Filled f = filled_cache("streaming:budget=20,sink=4", 100, 1);
    const std::vector<int32_t> pos = f.cache->head_positions(0, 1);
    std::vector<int32_t> want = {0, 1, 2, 3};
    for (int p = 84; p < 100; ++p) want.push_back(p);
    EXPECT_EQ(pos, want);
}

TEST(Evictor, EvictsAfterAPromptAndEveryKSteps) {
    // A 64-token prompt in one batch is cut to the budget at once; then single steps every 4.
    Filled f = filled_cache("streaming:budget=20,every=4", 64, 64);
    EXPECT_EQ(f.cache->head_tokens(0, 0), 20);
    const KvShape& s = f.cache->shape();
    std::vector<float> k(size_t(s.n_head_kv * s.head_dim), 1.0f), v = k;
    for (int64_t step = 1; step <= 4; ++step) {
        for (int64_t l = 0; l < s.n_layer; ++l) f.cache->write(l, f.cache->size(), k.data(), v.data(), 1);
        f.cache->commit(f.cache->size() + 1);
        EXPECT_EQ(f.cache->head_tokens(0, 0), step < 4 ? 20 + step : 20) << "step " << step;
    }
}

TEST(Evictor, H2OSumsFollowTheirTokens) {
    Filled f = filled_cache("h2o:budget=8,sink=1,window=2", 8, 8);
    Evictor* e = f.cache->evictor();
    ASSERT_NE(e, nullptr);
    EXPECT_TRUE(f.cache->wants_attention_mass(0));
    // Token t gets mass t % 3 in layer 0 head 0: 0 1 2 0 1 2 0 1, then two more tokens arrive.
    std::vector<float> mass = {0, 1, 2, 0, 1, 2, 0, 1};
    f.cache->on_attention_mass(0, 0, mass.data(), 8);
    const KvShape& s = f.cache->shape();
    std::vector<float> k(size_t(2 * s.n_head_kv * s.head_dim), 1.0f), v = k;
    for (int64_t l = 0; l < s.n_layer; ++l) f.cache->write(l, 8, k.data(), v.data(), 2);
    f.cache->commit(10);  // 10 tokens, budget 8: sink 0, window 8-9, the best 5 of 1..7 by mass
    const std::vector<int32_t> pos = f.cache->head_positions(0, 0);
    EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 2, 4, 5, 7, 8, 9}));  // masses 1 2 1 2 1: ties to the recent
    const std::vector<float> sc = e->scores(*f.cache, 0, 0);
    EXPECT_EQ(sc, (std::vector<float>{0, 1, 2, 1, 2, 1, 0, 0}));
    f.cache->truncate(3);
    EXPECT_EQ(e->scores(*f.cache, 0, 0), (std::vector<float>{0, 1, 2}));
}

// SnapKV after a prompt: the prompt's last queries point at tokens 40 and 70, which stay (with
// their pooled neighbours) while the other scored tokens go.
TEST(Evictor, SnapKVKeepsWhatThePromptsLastQueriesAttendTo) {
    const KvShape shape{1, 2, 1, 16, 256};
    KvCacheOptions o;
    o.evict = EvictSpec::parse("snapkv:budget=20,sink=4,window=8,obs=8");
    auto cache = make_kv_cache(shape, KvSpec::parse("f16"), o);
    const int64_t n = 100, d = 16;
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 0.1f);
    std::vector<float> k(size_t(n * d)), v(size_t(n * d), 0.0f), q(size_t(n * 2 * d), 0.0f);
    for (float& x : k) x = nd(rng);
    k[size_t(40 * d)] = k[size_t(70 * d)] = 10.0f;
    for (int64_t t = n - 8; t < n; ++t) q[size_t(t * 2 * d)] = q[size_t((t * 2 + 1) * d)] = 10.0f;  // both query heads
    cache->write(0, 0, k.data(), v.data(), n);
    cache->observe_attention(0, q.data(), n, 0, q.data());  // as the forward pass does (out unused)
    cache->commit(n);
    const std::vector<int32_t> pos = cache->head_positions(0, 0);
    ASSERT_EQ(pos.size(), 20u);
    EXPECT_NE(std::find(pos.begin(), pos.end(), 40), pos.end());
    EXPECT_NE(std::find(pos.begin(), pos.end(), 70), pos.end());
    for (int32_t p : pos) EXPECT_TRUE(p < 4 || p >= n - 8 || std::abs(p - 40) <= 2 || std::abs(p - 70) <= 2) << p;
}

// SnapKV over single-token steps: the votes are the last obs steps' attention mass.
TEST(Evictor, SnapKVVotesWithTheLastObsSteps) {
    const KvShape shape{1, 2, 1, 4, 64};
    KvCacheOptions o;
    o.evict = EvictSpec::parse("snapkv:budget=60,obs=2");
    auto cache = make_kv_cache(shape, KvSpec::parse("f16"), o);
    std::vector<float> kv(4, 1.0f), q(8, 0.0f);
    for (int64_t t = 0; t < 12; ++t) {
        cache->write(0, t, kv.data(), kv.data(), 1);
        std::vector<float> mass(size_t(t + 1), 0.0f);
        mass[size_t(t / 2)] = 1.0f;  // step t looks at token t / 2
        cache->on_attention_mass(0, 0, mass.data(), t + 1);
        cache->observe_attention(0, q.data(), 1, t, q.data());
        cache->commit(t + 1);
    }
    // The last two steps (10, 11) both voted for token 5; pooled over 5 neighbours: 2 / 5 at 3..7.
    const std::vector<float> s = cache->evictor()->scores(*cache, 0, 0);
    ASSERT_EQ(s.size(), 12u);
    for (int64_t t = 0; t < 12; ++t) EXPECT_FLOAT_EQ(s[size_t(t)], t >= 3 && t <= 7 ? 0.4f : 0.0f) << t;
}

// Spearman's rank correlation (average ranks for ties).
double spearman(const std::vector<double>& a, const std::vector<double>& b) {
    const auto ranks = [](const std::vector<double>& x) {
        std::vector<size_t> i(x.size());
        std::iota(i.begin(), i.end(), 0);
        std::sort(i.begin(), i.end(), [&](size_t p, size_t q) { return x[p] < x[q]; });
        std::vector<double> r(x.size());
        for (size_t s = 0; s < i.size();) {
            size_t e = s;
            while (e + 1 < i.size() && x[i[e + 1]] == x[i[s]]) ++e;
            for (size_t t = s; t <= e; ++t) r[i[t]] = 0.5 * double(s + e);
            s = e + 1;
        }
        return r;
    };
    const std::vector<double> ra = ranks(a), rb = ranks(b);
    const double ma = std::accumulate(ra.begin(), ra.end(), 0.0) / double(ra.size());
    const double mb = std::accumulate(rb.begin(), rb.end(), 0.0) / double(rb.size());
    double sab = 0, saa = 0, sbb = 0;
    for (size_t i = 0; i < ra.size(); ++i) {
        sab += (ra[i] - ma) * (rb[i] - mb);
        saa += (ra[i] - ma) * (ra[i] - ma);
        sbb += (rb[i] - mb) * (rb[i] - mb);
    }
    return sab / std::sqrt(saa * sbb);
}

// Records the attention mass every stored token receives (summed over queries and the group's
// heads), per layer and KV head.
class MassRecorder final : public KvObserver {
public:
    explicit MassRecorder(int64_t n_layer, int64_t n_head_kv) : H(n_head_kv), mass(size_t(n_layer * n_head_kv)) {}
    void on_write(int64_t, int64_t, const float*, const float*, int64_t) override {}
    void on_attention(int64_t, const float*, int64_t, int64_t, const float*) override {}
    bool wants_attention_mass(int64_t) const override { return true; }
    void on_attention_mass(int64_t layer, int64_t head, const float* m, int64_t n) override {
        mass[size_t(layer * H + head)].assign(m, m + n);
    }
    int64_t H;
    std::vector<std::vector<float>> mass;
};

// The sign that broke the seed library: on vxq-llama-h64 and WikiText-2, the Q-Filters score of
// each cached key ranks with the mean attention it later receives, positively in every layer;
// with the filter negated (the seed's bug) the correlation is negative.
TEST(QFilters, ScoreRanksWithTheAttentionKeysReceive) {
    const std::string model_path = test::shared_path("assets/models/vxq-llama-h64-f16.gguf");
    const std::string calib_text = test::shared_path("assets/text/tinystories_valid_head.txt");
    const std::string eval_text = test::shared_path("assets/text/wikitext2_test.raw.crlf.txt");
    VXQ_REQUIRE_PATH(model_path);
    VXQ_REQUIRE_PATH(calib_text);
    VXQ_REQUIRE_PATH(eval_text);
    const auto model = Model::load(model_path);
    const auto be = make_backend("cpu", 2);
    QFiltersCalibrateParams p;
    p.max_tokens = 2048;
    QFiltersCalibrateStats stats;
    const QFiltersCalibration c = calibrate_qfilters(*model, *be, test::read_file(calib_text), p, &stats);
    for (double m : stats.mean_proj) EXPECT_GE(m, 0.0);  // the sign fix
    const std::string file = (std::filesystem::temp_directory_path() / "vxq_test_qfilters.gguf").string();
    save_qfilters_calibration(file, c);
    EXPECT_EQ(error_of([&] { check_calibration_model(EvictSpec::parse("qfilters:budget=64,calib=" + file), model_path); }), "");

    const ModelConfig& cfg = model->config();
    const int64_t n = 512;
    auto cache = make_kv_cache(KvShape{cfg.n_layer, cfg.n_head, cfg.n_head_kv, cfg.head_dim, n}, "f16", "f16");
    MassRecorder rec(cfg.n_layer, cfg.n_head_kv);
    cache->set_observer(&rec);
    std::vector<TokenId> tokens = model->tokenizer().encode(test::read_file(eval_text).substr(20000, 20000), true);
    ASSERT_GE(int64_t(tokens.size()), n);
    tokens.resize(size_t(n));
    std::vector<float> logits(size_t(cfg.n_vocab));
    model->forward(*be, *cache, tokens, int64_t(1), logits.data());  // one prompt: every query sees its past
    const Evictor qf(EvictSpec::parse("qfilters:budget=64,calib=" + file), cache->shape());
    for (int64_t l = 0; l < cfg.n_layer; ++l) {
        std::vector<double> score, attn, flipped;
        for (int64_t g = 0; g < cfg.n_head_kv; ++g) {
            const std::vector<float> s = qf.scores(*cache, l, g);
            const std::vector<float>& m = rec.mass[size_t(l * cfg.n_head_kv + g)];
            ASSERT_EQ(int64_t(m.size()), n);
            for (int64_t t = 4; t < n - 64; ++t) {  // the sinks and the last window are kept anyway
                score.push_back(s[size_t(t)]);
                flipped.push_back(-s[size_t(t)]);
                attn.push_back(double(m[size_t(t)]) / double(n - t));  // mean over the queries that see it
            }
        }
        const double rho = spearman(score, attn);
        std::printf("layer %lld: Spearman(Q-Filters score, mean attention received) = %+.3f\n", (long long)l, rho);
        EXPECT_GT(rho, 0.0) << "layer " << l;
        EXPECT_LT(spearman(flipped, attn), 0.0) << "layer " << l;
    }
    std::filesystem::remove(file);
}

TEST(QFilters, RefusesAnotherModelsOrACorruptFile) {
    QFiltersCalibration c;
    c.model_sha256 = std::string(64, 'a');
    c.model_file = "other.gguf";
    c.tokens = 10;
    c.n_layer = 1;
    c.n_head_kv = 1;
    c.head_dim = 4;
    c.filters = {1, 0, 0, 0};
    const std::string file = (std::filesystem::temp_directory_path() / "vxq_test_qfilters_other.gguf").string();
    save_qfilters_calibration(file, c);
    const QFiltersCalibration back = load_qfilters_calibration(file);
    EXPECT_EQ(back.filters, c.filters);
    const std::string model_path = test::shared_path("assets/models/vxq-llama-h64-f16.gguf");
    if (std::filesystem::exists(model_path)) {
        EXPECT_NE(error_of([&] { check_calibration_model(EvictSpec::parse("qfilters:budget=64,calib=" + file), model_path); })
                      .find("calibration of another model"),
                  std::string::npos);
    }
    // A cache of another shape refuses it by name.
    KvCacheOptions o;
    o.evict = EvictSpec::parse("qfilters:budget=64,calib=" + file);
    EXPECT_NE(error_of([&] { make_kv_cache(KvShape{2, 2, 1, 4, 64}, KvSpec::parse("f16"), o); }).find("Q-Filters for 1 layers"),
              std::string::npos);
    // Truncated files are errors, never crashes.
    const std::string bytes = test::read_file(file);
    for (size_t cut : {size_t(0), size_t(10), bytes.size() / 2, bytes.size() * 3 / 4}) {  // (not the end: alignment padding)
        const std::string part = file + ".part";
        std::ofstream(part, std::ios::binary).write(bytes.data(), std::streamsize(cut));
        EXPECT_NE(error_of([&] { load_qfilters_calibration(part); }), "") << cut;
        std::filesystem::remove(part);
    }
    EXPECT_NE(error_of([&] { load_vecinfer_calibration(file); }).find("not for vecinfer"), std::string::npos);
    std::filesystem::remove(file);
}

}  // namespace
}  // namespace vxq

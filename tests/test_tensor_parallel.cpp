// Tensor parallelism (model/tensor_parallel.h, runtime/tensor_parallel.h) on the CPU backend's
// reference group: the host collectives' arithmetic, the slices being the model's bytes, the
// refusals, a one-layer model whose ranks hold exactly the one-rank cache's heads for every KV
// codec and eviction policy, and vxq-llama-h64 split over 2 ranks computing what it computes on one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include <unistd.h>

#include "backend/backend.h"
#include "backend/weight_formats.h"
#include "core/error.h"
#include "kernels/cpu/host_group.h"
#include "kv/codec.h"
#include "model/model.h"
#include "model/synth.h"
#include "runtime/generate.h"
#include "runtime/perplexity.h"
#include "runtime/tensor_parallel.h"
#include "support/assets.h"
#include "support/text.h"
#include "support/tiny_model.h"

namespace vxq {
namespace {

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// A CPU group of `size` ranks with one runner (its KV caches): the group outlives the runner.
struct Split {
    std::unique_ptr<TpGroup> group;
    std::unique_ptr<TpRunner> run;
    Split(const std::string& path, int size, const std::string& kv, int64_t n_ctx, const KvCacheOptions& opts = {})
        : group(TpGroup::create(path, "cpu", size, size)), run(group->make_runner(KvSpec::parse(kv), opts, n_ctx)) {
        const TpRunner* runners[] = {run.get()};
        group->check_fits(runners, n_ctx, n_ctx, "cpu");
    }
};

// One model on one CPU backend, as the reference of a group.
struct OneRank {
    std::unique_ptr<Model> model;
    std::unique_ptr<Backend> be = make_backend("cpu", 2);
    std::unique_ptr<KvCache> cache;
    std::unique_ptr<SingleRunner> run;
    OneRank(const std::string& path, const std::string& kv, int64_t n_ctx, const KvCacheOptions& opts = {})
        : model(Model::load(path)) {
        const ModelConfig& c = model->config();
        cache = make_kv_cache(KvShape{c.n_layer, c.n_head, c.n_head_kv, c.head_dim, n_ctx}, KvSpec::parse(kv), opts);
        run = std::make_unique<SingleRunner>(*model, *be, *cache);
    }
};

// Logits of a prefill of the first `prefill` tokens (every row), then of one decode step per
// following token.
std::vector<float> run_logits(Runner& run, const std::vector<TokenId>& tokens, int64_t prefill) {
    const int64_t n_vocab = run.model().config().n_vocab;
    const int64_t n = int64_t(tokens.size());
    std::vector<float> all(size_t(n * n_vocab));
    run.truncate(0);
    run.forward(std::span(tokens).first(size_t(prefill)), prefill, all.data());
    for (int64_t i = prefill; i < n; ++i) run.forward(std::span(tokens).subspan(size_t(i), 1), 1, all.data() + i * n_vocab);
    return all;
}

// Mean KL divergence (nats) of the rows of q from those of p, [rows, n] logits each.
double mean_kl(const std::vector<float>& p, const std::vector<float>& q, int64_t n) {
    const int64_t rows = int64_t(p.size()) / n;
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r) {
        const float* a = p.data() + r * n;
        const float* b = q.data() + r * n;
        double ma = a[0], mb = b[0];
        for (int64_t i = 1; i < n; ++i) ma = std::max(ma, double(a[i])), mb = std::max(mb, double(b[i]));
        double sa = 0, sb = 0;
        for (int64_t i = 0; i < n; ++i) sa += std::exp(a[i] - ma), sb += std::exp(b[i] - mb);
        for (int64_t i = 0; i < n; ++i) {
            const double la = a[i] - ma - std::log(sa), lb = b[i] - mb - std::log(sb);
            sum += std::exp(la) * (la - lb);
        }
    }
    return sum / double(rows);
}

// The bytes of one stream of a layer view (its packed blocks and window blocks, in order).
std::vector<uint8_t> stream_bytes(const KvStreamView& s) {
    std::vector<uint8_t> out;
    for (int64_t i = 0; i < s.n_segs; ++i) {
        const KvSegment& seg = s.segs[i];
        const KvFormatParams& f = seg.window ? s.window_fmt : s.fmt;
        const size_t bytes = size_t(seg.n_tokens / f.block_tokens) * f.block_bytes;
        out.insert(out.end(), seg.data, seg.data + bytes);
    }
    return out;
}

TEST(TensorParallel, HostGroupSumsInRankOrderAndGathersColumns) {
    constexpr int kRanks = 3;
    cpu::HostGroup g(kRanks);
    std::vector<std::vector<float>> x(kRanks);
    for (int r = 0; r < kRanks; ++r) x[size_t(r)] = {1e8f * float(r == 0), 1.0f, -1e8f * float(r == 2), float(r)};
    const std::vector<int64_t> widths{2, 3, 1};
    std::vector<std::vector<float>> blocks{{1, 2, 3, 4}, {5, 6, 7, 8, 9, 10}, {11, 12}};  // [2 rows, widths[r]]
    std::vector<float> gathered(12, -1.0f);
    std::vector<std::thread> t;
    for (int r = 0; r < kRanks; ++r) {
        t.emplace_back([&, r] {
            g.all_reduce_sum(r, x[size_t(r)].data(), x[size_t(r)].data(), 4);
            g.gather_columns(r, blocks[size_t(r)].data(), 2, widths, r == 0 ? gathered.data() : nullptr);
        });
    }
    for (auto& th : t) th.join();
    // (1e8 + 1) + 1 rounds to 1e8 twice, then -1e8 leaves 0: the sum runs in rank order, the same bits on every rank.
    const float first = ((1e8f + 0.0f) + 0.0f) + 0.0f;
    const float second = ((1.0f + 1.0f) + 1.0f);
    const float third = ((0.0f + 0.0f) + -1e8f);
    for (int r = 0; r < kRanks; ++r) {
        EXPECT_EQ(x[size_t(r)], (std::vector<float>{first, second, third, 3.0f})) << "rank " << r;
    }
    EXPECT_EQ(gathered, (std::vector<float>{1, 2, 5, 6, 7, 11, 3, 4, 8, 9, 10, 12}));

    // Out of place on some ranks (the forward pass: rank 0 sends its x, the others a product).
    std::vector<std::vector<float>> part{{}, {2.0f, 3.0f}, {4.0f, 5.0f}}, into(kRanks, std::vector<float>{-9.0f, -9.0f});
    into[0] = {1.0f, 1.0f};
    t.clear();
    for (int r = 0; r < kRanks; ++r) {
        t.emplace_back([&, r] { g.all_reduce_sum(r, r == 0 ? into[0].data() : part[size_t(r)].data(), into[size_t(r)].data(), 2); });
    }
    for (auto& th : t) th.join();
    for (int r = 0; r < kRanks; ++r) EXPECT_EQ(into[size_t(r)], (std::vector<float>{7.0f, 9.0f})) << "rank " << r;
}

TEST(TensorParallel, HostGroupAbortWakesAWaitingRank) {
    cpu::HostGroup g(2);
    std::string error;
    std::thread waiting([&] {
        float x[1] = {1};
        error = error_of([&] { g.all_reduce_sum(0, x, x, 1); });
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    g.abort();
    waiting.join();
    EXPECT_NE(error.find("another rank failed"), std::string::npos) << error;
    float y[1] = {1};
    EXPECT_NE(error_of([&] { g.all_reduce_sum(1, y, y, 1); }), "");  // and every later collective
}

// Rank r's matrices are the whole model's rows (Q, K, V, gate, up, output) or whole blocks of its
// columns (attention output, down), byte for byte; config and weight bytes follow.
TEST(TensorParallel, SlicesAreTheModelsBytes) {
    const std::string path = test::shared_path("assets/models/vxq-llama-h64-q8_0.gguf");
    VXQ_REQUIRE_PATH(path);
    const auto one = Model::load(path);
    const ModelConfig& c = one->config();
    size_t bytes = 0;
    for (int r = 0; r < 2; ++r) {
        const auto m = Model::load(path, "cpu", TpRank{r, 2});
        const ModelConfig& rc = m->rank_config();
        EXPECT_EQ(rc.n_head, c.n_head / 2);
        EXPECT_EQ(rc.n_head_kv, c.n_head_kv / 2);
        EXPECT_EQ(rc.n_ff, c.n_ff / 2);
        EXPECT_EQ(m->config().n_head, c.n_head);
        const LayerWeights& L = m->weights().layers[3];
        const LayerWeights& F = one->weights().layers[3];
        const auto rows_equal = [](const WeightView& part, const WeightView& whole, int64_t row0) {
            return part.cols == whole.cols && part.row_bytes == whole.row_bytes &&
                   std::memcmp(part.data, static_cast<const uint8_t*>(whole.data) + row0 * whole.row_bytes,
                               size_t(part.rows) * part.row_bytes) == 0;
        };
        EXPECT_TRUE(rows_equal(L.wq, F.wq, r * rc.q_dim()));
        EXPECT_TRUE(rows_equal(L.wk, F.wk, r * rc.kv_dim()));
        EXPECT_TRUE(rows_equal(L.w_up, F.w_up, r * rc.n_ff));
        EXPECT_EQ(m->weights().output.rows, tp_begin(c.n_vocab, r + 1, 2) - tp_begin(c.n_vocab, r, 2));
        EXPECT_TRUE(rows_equal(m->weights().output, one->weights().output, tp_begin(c.n_vocab, r, 2)));
        ASSERT_EQ(L.w_down.rows, F.w_down.rows);
        ASSERT_EQ(L.w_down.cols, rc.n_ff);
        for (int64_t row = 0; row < L.w_down.rows; row += 97) {
            const size_t skip = ggml_row_bytes(F.w_down.type, r * rc.n_ff);
            EXPECT_EQ(std::memcmp(static_cast<const uint8_t*>(L.w_down.data) + row * L.w_down.row_bytes,
                                  static_cast<const uint8_t*>(F.w_down.data) + row * F.w_down.row_bytes + skip, L.w_down.row_bytes),
                      0) << "row " << row;
        }
        bytes += m->weight_bytes();
    }
    // Both ranks hold token_embd and the norms; every other tensor is split.
    const size_t embd = size_t(one->weights().token_embd.rows) * one->weights().token_embd.row_bytes;
    EXPECT_NEAR(double(bytes), double(one->weight_bytes() + embd), 0.01 * double(one->weight_bytes()));
}

TEST(TensorParallel, RefusesWhatDoesNotSplit) {
    const std::string path = test::shared_path("assets/models/vxq-llama-h64-f16.gguf");
    VXQ_REQUIRE_PATH(path);
    EXPECT_NE(error_of([&] { Model::load(path, "cpu", TpRank{0, 3}); }).find("does not divide the 2 KV heads"),
              std::string::npos);
    // Row-parallel slices must be whole blocks: 96 Q8_0 columns over 2 ranks are 48 each.
    ModelConfig c;
    c.n_head = c.n_head_kv = 2;
    c.n_ff = 96;
    c.n_vocab = 300;
    const WeightView q8{GgmlType::Q8_0, nullptr, 64, 96, ggml_row_bytes(GgmlType::Q8_0, 96)};
    ModelWeights w;
    w.layers.push_back(LayerWeights{});
    w.layers[0].wo = WeightView{GgmlType::Q8_0, nullptr, 64, 64, ggml_row_bytes(GgmlType::Q8_0, 64)};
    w.layers[0].w_down = q8;
    EXPECT_EQ(error_of([&] { check_tp_split(c, w, 2, "m.gguf"); }),
              "m.gguf: --tp 2 cuts the feed-forward down matrix (Q8_0, 96 columns) into 48 columns per rank, not whole "
              "32-value blocks");
    EXPECT_EQ(error_of([&] { check_tp_split(c, w, 1, "m.gguf"); }), "");
    EXPECT_NE(error_of([&] { make_backend_group("cpu", 1, 0); }), "");
#if !VXQ_HAVE_CUDA
    EXPECT_NE(error_of([&] { make_backend_group("cuda", 1, 2); }).find("no CUDA backend"), std::string::npos);
#endif
}

// With one layer nothing before the KV store depends on the split (Q, K, V are whole rows of
// the same matrices, computed alike), so each rank's cache must hold exactly the one-rank cache's
// KV heads, byte for byte, for every codec variant in the registry and every eviction policy;
// only the two row-parallel sums (attention output, down) and the output head differ in order.
TEST(TensorParallel, OneLayerRanksHoldTheOneRankCachesHeads) {
    test::TinyModelSpec spec;
    spec.n_layer = 1;
    spec.n_embd = 256;
    spec.n_head = 4;
    spec.n_head_kv = 2;
    spec.head_dim = 64;
    spec.n_ff = 128;
    spec.n_ctx_train = 512;
    const test::TinyModel tiny = test::build_tiny_model(spec);
    std::vector<TokenId> tokens;
    for (int i = 0; i < 100; ++i) tokens.push_back(TokenId((i * 37 + 11) % 300));

    std::vector<std::pair<std::string, std::string>> runs;  // (kv, evict)
    for (const CodecInfo& info : list_codecs()) {
        if (!codec_has_reader(info.name, "cpu")) continue;
        for (const std::string& v : info.variants) runs.emplace_back(v, "");
    }
    for (const char* evict : {"streaming:budget=48", "knorm:budget=48", "h2o:budget=48", "snapkv:budget=48,obs=8"}) {
        runs.emplace_back("q4_0", evict);
        runs.emplace_back("kivi:bits=2", evict);
    }
    for (const auto& [kv, evict] : runs) {
        SCOPED_TRACE(kv + " " + evict);
        KvCacheOptions opts;
        opts.evict = EvictSpec::parse(evict);
        OneRank one(tiny.path, kv, 128, opts);
        Split split(tiny.path, 2, kv, 128, opts);
        TpRunner* g = split.run.get();
        const int64_t prefill = evict.empty() ? 70 : 1;  // eviction acts between passes: stream the rest
        const size_t state_bytes = one.cache->resident_bytes();  // an empty cache holds its layer states only
        const auto a = run_logits(*one.run, tokens, prefill);
        const auto b = run_logits(*g, tokens, prefill);
        ASSERT_EQ(one.cache->size(), g->size());
        const KvLayerView whole = one.cache->view(0);
        for (int r = 0; r < 2; ++r) {
            const KvLayerView part = g->cache(r).view(0);
            ASSERT_EQ(part.n_head_kv, 1);
            const KvHeadView& h = part.heads[0];
            const KvHeadView& w = whole.heads[r];
            ASSERT_EQ(h.n_tokens, w.n_tokens) << "rank " << r;
            EXPECT_EQ(stream_bytes(h.k), stream_bytes(w.k)) << "keys of KV head " << r;
            EXPECT_EQ(stream_bytes(h.v), stream_bytes(w.v)) << "values of KV head " << r;
            ASSERT_EQ(h.pos == nullptr, w.pos == nullptr) << "positions of KV head " << r;
            if (w.pos) {
                EXPECT_TRUE(std::equal(h.pos, h.pos + h.n_tokens, w.pos)) << "positions of KV head " << r;
            }
        }
        // Every rank keeps its own copy of the per-layer codec state (rotations, codebooks).
        EXPECT_EQ(g->kv_bytes(), one.cache->resident_bytes() + state_bytes);
        float peak = 0, diff = 0;
        for (size_t i = 0; i < a.size(); ++i) peak = std::max(peak, std::abs(a[i])), diff = std::max(diff, std::abs(a[i] - b[i]));
        EXPECT_LT(diff, 1e-5f * peak) << "logits (two sums in another order)";
    }
}

// vxq-llama-h64 over 2 ranks against 1: with the f16 cache the logits differ only by the order of
// the row-parallel sums (KL 5e-7 measured, greedy text equal). A compressed cache's codes follow
// its inputs, and an input that moves by an ulp of that order flips the odd code of 4 or 2 bits
// in later layers, so their figure is a share of the codec's own KL (measured 1-8 %), not zero:
// the test bounds it at a quarter, which a rank reading another rank's heads would not meet.
TEST(TensorParallel, H64OverTwoRanksComputesWhatOneRankComputes) {
    const std::string path = test::shared_path("assets/models/vxq-llama-h64-f16.gguf");
    const std::string text_path = test::shared_path("assets/text/wikitext2_test.raw.crlf.txt");
    VXQ_REQUIRE_PATH(path);
    VXQ_REQUIRE_PATH(text_path);
    OneRank ref(path, "f16", 256);
    auto tokens = ref.model->tokenizer().encode(test::read_file(text_path).substr(0, 20000), true);
    tokens.resize(220);
    const auto exact = run_logits(*ref.run, tokens, 200);
    const int64_t n_vocab = ref.model->config().n_vocab;
    for (const char* kv : {"f16", "q8_0", "q4_0", "fp8", "kivi:bits=2", "turbo:bits=3"}) {
        SCOPED_TRACE(kv);
        OneRank one(path, kv, 256);
        Split split(path, 2, kv, 256);
        TpRunner* g = split.run.get();
        const auto a = run_logits(*one.run, tokens, 200);
        const auto b = run_logits(*g, tokens, 200);
        const double kl_split = mean_kl(a, b, n_vocab);
        if (std::string(kv) == "f16") {
            EXPECT_LT(kl_split, 1e-5);
            continue;
        }
        const double kl_codec = mean_kl(exact, a, n_vocab);
        EXPECT_LT(kl_split, 0.25 * kl_codec) << "KL over the split " << kl_split << ", the codec's " << kl_codec;
    }
    // Perplexity (f16 cache, prefill and stream): the same within 5e-4 relative. Measured 1.8e-4
    // (prefill) and 4.6e-5 (stream) here: the row-parallel sums' order moves the residual stream
    // by ulps, and the f16 cache's llama.cpp numerics round each query to fp16 before its dot
    // products, which turns some of those ulps into an fp16 step.
    const std::string text = test::read_file(text_path).substr(0, 40000);
    for (const PplMode mode : {PplMode::Prefill, PplMode::Stream}) {
        Split split(path, 2, "f16", 256);
        const double one = perplexity(*ref.run, text, PerplexityParams{128, 2, mode}).ppl;
        const double two = perplexity(*split.run, text, PerplexityParams{128, 2, mode}).ppl;
        EXPECT_NEAR(two / one, 1.0, 5e-4) << (mode == PplMode::Prefill ? "prefill" : "stream");
    }
    // Greedy text: the same 32 tokens.
    GenerateParams p;
    p.n_predict = 32;
    p.sampler.temperature = 0;
    Split g(path, 2, "f16", 256);
    const GenerateResult r1 = generate(*ref.run, "Once upon a time", p);
    const GenerateResult r2 = generate(*g.run, "Once upon a time", p);
    EXPECT_EQ(r1.ids, r2.ids);
}

// The synthetic Llama-3-8B shape (one layer at full width: dim 4096, ff 14336, 32 / 8 heads;
// a 512-token vocabulary keeps the file at ~125 MB; Q4_0 weights, so the row-parallel slices
// are whole Q4_0 blocks) over 2 and 8 ranks against one, with an f16, a q4_0 and a kivi-2 cache:
// with one layer the caches hold the same bytes, so the logits differ by the order of the two
// row-parallel sums and the output head's split only (KL < 1e-6).
TEST(TensorParallel, Llama3_8bShapeOverTwoAndEightRanks) {
    const SynthModel m(SynthOptions{"llama3-8b", GgmlType::Q4_0, 1, 1, 512});
    const std::string path =
        (std::filesystem::temp_directory_path() / ("vxq_tp_l8b_" + std::to_string(::getpid()) + ".gguf")).string();
    m.write(path);
    struct Remove {
        std::string p;
        ~Remove() { std::filesystem::remove(p); }
    } remove{path};
    std::mt19937 rng(7);
    std::uniform_int_distribution<TokenId> id(3, 511);
    std::vector<TokenId> tokens{TokenId(m.shape().bos)};
    for (int i = 1; i < 40; ++i) tokens.push_back(id(rng));
    for (const char* kv : {"f16", "q4_0", "kivi:bits=2"}) {
        OneRank one(path, kv, 64);
        const auto a = run_logits(*one.run, tokens, 32);
        for (const int tp : {2, 8}) {
            SCOPED_TRACE(std::string(kv) + " --tp " + std::to_string(tp));
            Split split(path, tp, kv, 64);
            const auto b = run_logits(*split.run, tokens, 32);
            EXPECT_LT(mean_kl(a, b, 512), 1e-6);
            // The same argmax, or a near-tie. Q4_0 weights quantize their activations to q8_0, so an
            // ulp of the sums' order can move a residual element by a q8_0 step before the next
            // matmul: logits move by up to 0.018 here (peak 4; KL 7e-7 at --tp 8), and random
            // weights give rows whose two largest logits are closer than that.
            for (size_t r = 0; r < tokens.size(); ++r) {
                const auto row = [&](const std::vector<float>& l) { return l.begin() + std::ptrdiff_t(r * 512); };
                const auto ia = std::max_element(row(a), row(a) + 512) - row(a);
                const auto ib = std::max_element(row(b), row(b) + 512) - row(b);
                if (ia != ib) {
                    EXPECT_LT(row(a)[ia] - row(a)[ib], 0.03f) << "row " << r;
                }
            }
        }
    }
}

// A refused batch (context full) leaves the group usable; the ranks agree on the tokens cached.
TEST(TensorParallel, RefusedBatchLeavesTheGroupUsable) {
    const std::string path = test::shared_path("assets/models/vxq-llama-h64-f16.gguf");
    VXQ_REQUIRE_PATH(path);
    Split split(path, 2, "q4_0", 16);
    TpRunner* g = split.run.get();
    std::vector<TokenId> many(17, 5);
    std::vector<float> logits(size_t(g->model().config().n_vocab));
    EXPECT_NE(error_of([&] { g->forward(many, 1, logits.data()); }).find("context is full"), std::string::npos);
    EXPECT_EQ(error_of([&] { g->forward(std::span(many).first(8), 1, logits.data()); }), "");
    EXPECT_EQ(g->size(), 8);
    EXPECT_EQ(g->cache(1).size(), 8);
}

}  // namespace
}  // namespace vxq

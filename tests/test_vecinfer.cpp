// VecInfer (METHODS.md "VecInfer"): the fused argmin and k-means against brute-force references,
// the block's scalar reference, fused attention through the reader against dequantize-then-attend
// on odd shapes with a non-trivial calibration (smoothing factors != 1), the query lookup table
// built per query and never per cached token, resident bytes, the calibration file (round trip,
// every refusal, truncation at every few bytes) and calibration from a real model.
// (The registry's calib=random variants also run the generic KV tests in test_kv_cache.cpp.)
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "core/error.h"
#include "core/sha256.h"
#include "core/thread_pool.h"
#include "kernels/cpu/attention_fused.h"
#include "kernels/cpu/kv_read_vecinfer.h"
#include "kv/calibration.h"
#include "kv/codec.h"
#include "kv/formats/vecinfer.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "runtime/calibrate.h"
#include "support/assets.h"
#include "support/attend.h"
#include "support/text.h"

namespace vxq {
namespace {

using test::error_of;

namespace vi = codecs::vecinfer;

std::string tmp_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() / ("vxq_vecinfer_" + name)).string();
}

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, sigma);
    std::vector<float> v(n);
    for (float& x : v) x = nd(rng);
    return v;
}

// ---- argmin and k-means ------------------------------------------------------------------------

// The brute-force reference: the whole N x k distance matrix in double, argmin per row.
std::vector<int> brute_assign(const std::vector<float>& x, const std::vector<float>& c, int64_t N, int n, int64_t k) {
    std::vector<double> dist(size_t(N * k));
    for (int64_t t = 0; t < N; ++t)
        for (int64_t i = 0; i < k; ++i) {
            double s = 0;
            for (int e = 0; e < n; ++e) s += std::pow(double(x[size_t(t * n + e)]) - c[size_t(i * n + e)], 2);
            dist[size_t(t * k + i)] = s;
        }
    std::vector<int> a(static_cast<size_t>(N));
    for (int64_t t = 0; t < N; ++t) {
        const auto* row = &dist[size_t(t * k)];
        a[size_t(t)] = int(std::min_element(row, row + k) - row);
    }
    return a;
}

double mse_of(const std::vector<float>& x, const std::vector<float>& c, const std::vector<int>& a, int n) {
    double s = 0;
    for (size_t t = 0; t < a.size(); ++t)
        for (int e = 0; e < n; ++e) s += std::pow(double(x[t * size_t(n) + size_t(e)]) - c[size_t(a[t] * n + e)], 2);
    return s / double(x.size());
}

// The fused argmin finds a centroid as near as the distance matrix's argmin (ties may differ:
// compare the reconstruction MSE, within 1 % as METHODS.md asks; in practice equal).
TEST(VecinferKmeans, FusedArgminMatchesBruteForce) {
    for (int n : {1, 2, 4, 8}) {
        const int64_t N = 3001, k = 256;
        const std::vector<float> x = gaussian(size_t(N * n), 11u + uint32_t(n)), c = gaussian(size_t(k * n), 99u + uint32_t(n));
        std::vector<int> fused(static_cast<size_t>(N));
        for (int64_t t = 0; t < N; ++t) fused[size_t(t)] = vi::nearest(c.data(), k, n, &x[size_t(t * n)]);
        const double ref = mse_of(x, c, brute_assign(x, c, N, n, k), n);
        EXPECT_NEAR(mse_of(x, c, fused, n) / ref, 1.0, 0.01) << "n=" << n;
    }
}

// k-means against a brute-force Lloyd written from the definition (distance matrix, double sums)
// from the same initialisation (the first iteration's centroids are the same seeded points):
// final MSE within 1 %; more iterations never raise the MSE; the same seed gives the same bits.
TEST(VecinferKmeans, MatchesBruteForceLloyd) {
    const int n = 4;
    const int64_t N = 2000, k = 64;
    std::vector<float> x = gaussian(size_t(N * n), 5);
    for (size_t i = 0; i < x.size(); i += 2) x[i] *= 3.0f;  // anisotropic
    const std::vector<float> init = vi::kmeans(x.data(), N, n, k, 0, 42);  // 0 rounds: the initialisation
    std::vector<float> ref = init;
    for (int it = 0; it < 30; ++it) {
        const std::vector<int> a = brute_assign(x, ref, N, n, k);
        std::vector<double> sum(size_t(k * n), 0.0);
        std::vector<int64_t> cnt(static_cast<size_t>(k), 0);
        for (int64_t t = 0; t < N; ++t) {
            ++cnt[size_t(a[size_t(t)])];
            for (int e = 0; e < n; ++e) sum[size_t(a[size_t(t)] * n + e)] += x[size_t(t * n + e)];
        }
        for (int64_t i = 0; i < k; ++i)
            if (cnt[size_t(i)] > 0)
                for (int e = 0; e < n; ++e) ref[size_t(i * n + e)] = float(sum[size_t(i * n + e)] / double(cnt[size_t(i)]));
    }
    const std::vector<float> got = vi::kmeans(x.data(), N, n, k, 30, 42);
    const double mse_ref = mse_of(x, ref, brute_assign(x, ref, N, n, k), n);
    const double mse_got = mse_of(x, got, brute_assign(x, got, N, n, k), n);
    EXPECT_NEAR(mse_got / mse_ref, 1.0, 0.01);
    const double mse_init = mse_of(x, init, brute_assign(x, init, N, n, k), n);
    const std::vector<float> few = vi::kmeans(x.data(), N, n, k, 3, 42);
    const double mse_few = mse_of(x, few, brute_assign(x, few, N, n, k), n);
    EXPECT_LT(mse_few, mse_init);
    EXPECT_LE(mse_got, mse_few * (1 + 1e-6));
    EXPECT_EQ(vi::kmeans(x.data(), N, n, k, 30, 42), got);
    // Fewer points than centroids: every point is a centroid, the error is zero.
    const std::vector<float> tiny = vi::kmeans(x.data(), 10, n, 16, 30, 1);
    EXPECT_EQ(mse_of(std::vector<float>(x.begin(), x.begin() + 40), tiny,
                     brute_assign(std::vector<float>(x.begin(), x.begin() + 40), tiny, 10, n, 16), n), 0.0);
}

// ---- a calibration for tests: codebooks trained on Gaussian data, lambda far from 1 -----------

VecinferCalibration synthetic_calibration(int64_t n_layer, int64_t n_head_kv, int64_t d, int n, int m,
                                          const std::string& sha, uint32_t seed) {
    VecinferCalibration c;
    c.model_sha256 = sha;
    c.model_file = "synthetic.gguf";
    c.tokens = 1000;
    c.n = n, c.m = m, c.n_layer = n_layer, c.n_head_kv = n_head_kv, c.head_dim = d, c.iterations = 5, c.seed = seed;
    const vi::Layout l{d, n, m};
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> ud(0.5f, 2.0f);
    for (int64_t layer = 0; layer < n_layer; ++layer) {
        VecinferCalibration::Layer L;
        for (int64_t i = 0; i < d; ++i) L.key_lambda.push_back(ud(rng));
        const std::vector<float> y = gaussian(size_t(600 * d), seed + uint32_t(layer), 1.3f);
        L.key_codebook = vi::train_codebooks(l, y.data(), 600, 5, seed + 1);
        L.value_codebook = vi::train_codebooks(l, y.data(), 600, 5, seed + 2);
        c.layers.push_back(std::move(L));
    }
    return c;
}

const std::string kZeroSha(64, '0');

// ---- the block ---------------------------------------------------------------------------------

// decode(encode(x)) is lambda * H c / sqrt(d) with c the nearest centroids of the coded vector:
// the error in the smoothed domain equals the coding error in the coded domain (orthonormal
// transform), and every sub-vector's index is the fused argmin's.
TEST(VecinferFormat, EncodeDecodeIsTheNearestCodeword) {
    for (auto [d, n, m] : {std::tuple{64, 4, 8}, std::tuple{128, 2, 5}, std::tuple{64, 8, 6}}) {
        SCOPED_TRACE(testing::Message() << "d=" << d << " n=" << n << " m=" << m);
        const VecinferCalibration c = synthetic_calibration(1, 1, d, n, m, kZeroSha, 3);
        vi::State s;
        s.layout = {d, n, m};
        s.lambda = c.layers[0].key_lambda;
        s.codebook = c.layers[0].key_codebook;
        std::vector<uint8_t> blk(s.layout.block_bytes());
        const std::vector<float> x = gaussian(size_t(d) * 50, 8, 1.5f);
        for (int t = 0; t < 50; ++t) {
            const float* xt = &x[size_t(t * d)];
            vi::encode(s, xt, blk.data());
            std::vector<float> y(static_cast<size_t>(d)), xr(y.size()), yc(y.size());
            vi::forward_transform(s, xt, y.data());
            vi::coded_vector(s, blk.data(), yc.data());
            vi::decode(s, blk.data(), xr.data());
            double e_coded = 0, e_smoothed = 0;
            for (int64_t j = 0; j < d / n; ++j) {
                ASSERT_EQ(vi::index_at(blk.data(), j, m), vi::nearest(s.centroids(j), int64_t(1) << m, n, &y[size_t(j * n)]));
            }
            for (int64_t i = 0; i < d; ++i) {
                e_coded += std::pow(double(y[size_t(i)]) - yc[size_t(i)], 2);
                e_smoothed += std::pow((double(xt[i]) - xr[size_t(i)]) / s.lambda[size_t(i)], 2);
            }
            EXPECT_NEAR(e_smoothed, e_coded, 1e-4 * (1 + e_coded));
        }
    }
}

// ---- attention ---------------------------------------------------------------------------------

struct AttnCase {
    int64_t d, n_head, n_head_kv, len;
    int n, m;
};

std::unique_ptr<KvCache> filled_cache(const AttnCase& c, const std::string& spec, uint32_t seed) {
    const KvShape shape{1, c.n_head, c.n_head_kv, c.d, c.len + 8};
    auto cache = make_kv_cache(shape, spec, spec);
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    int64_t pos = 0;
    for (int64_t b : {int64_t(1), int64_t(7), int64_t(300), int64_t(1) << 40}) {  // uneven batches
        const int64_t cnt = std::min(b, c.len - pos);
        if (cnt <= 0) break;
        std::vector<float> k(size_t(cnt * c.n_head_kv * c.d)), v(k.size());
        for (float& x : k) x = nd(rng) * 1.5f + 0.3f;
        for (float& x : v) x = nd(rng);
        cache->write(0, pos, k.data(), v.data(), cnt);
        pos += cnt;
        cache->commit(pos);
    }
    return cache;
}

class VecinferAttention : public ::testing::TestWithParam<AttnCase> {};

// The reader (LUT scores, values summed in the coded domain and mapped back once) equals plain
// attention over the dequantized cache in double: 1e-5 relative (f32 sums in another order).
TEST_P(VecinferAttention, FusedEqualsDequantizeThenAttend) {
    const AttnCase& c = GetParam();
    const std::string file = tmp_path("attn_" + std::to_string(c.d) + "_" + std::to_string(c.n) + "_" + std::to_string(c.m) + ".gguf");
    save_vecinfer_calibration(file, synthetic_calibration(1, c.n_head_kv, c.d, c.n, c.m, kZeroSha, 17));
    const std::string spec = "vecinfer:n=" + std::to_string(c.n) + ",m=" + std::to_string(c.m) + ",calib=" + file;
    auto cache = filled_cache(c, spec, uint32_t(c.len * 7 + c.n_head));
    const int64_t d = c.d;
    ThreadPool pool(2);
    for (int64_t n_q : {int64_t(1), std::min<int64_t>(c.len, 5)}) {
        const int64_t pos0 = c.len - n_q;
        const std::vector<float> q = gaussian(size_t(n_q * c.n_head * d), 23);
        EXPECT_LT(test::fused_vs_dequant_error(*cache, q.data(), n_q, pos0, pool), 1e-5) << "n_q=" << n_q;
    }
}

INSTANTIATE_TEST_SUITE_P(OddShapes, VecinferAttention,
                         ::testing::Values(AttnCase{64, 2, 2, 1, 4, 8}, AttnCase{64, 6, 2, 31, 4, 8},
                                           AttnCase{64, 8, 2, 97, 2, 5}, AttnCase{128, 3, 1, 1000, 4, 8},
                                           AttnCase{128, 4, 1, 299, 8, 8}, AttnCase{64, 2, 2, 4099, 4, 8}),
                         [](const auto& info) {
                             const AttnCase& c = info.param;
                             return "d" + std::to_string(c.d) + "_h" + std::to_string(c.n_head) + "x" +
                                    std::to_string(c.n_head_kv) + "_len" + std::to_string(c.len) + "_n" +
                                    std::to_string(c.n) + "_m" + std::to_string(c.m);
                         });

// The lookup table is built in prepare_query, once per query head and split of the KV range, and
// never per cached token: over 4099 tokens the count is a small multiple of the query heads, and
// the same for 4099 tokens as for 1100 when the split is the same. The Walsh-Hadamard transform
// runs once per LUT and once per value sum, never per token either.
TEST(VecinferAttentionCost, LutBuiltPerQueryNeverPerToken) {
    ThreadPool pool(2);
    auto count = [&](int64_t len, uint64_t* transforms) {
        const AttnCase c{64, 8, 2, len, 4, 8};
        auto cache = filled_cache(c, "vecinfer:n=4,m=8,calib=random", 3);
        const std::vector<float> q = gaussian(size_t(c.n_head * c.d), 4);
        std::vector<float> out(q.size());
        const uint64_t b0 = cpu::vecinfer_lut_builds(), t0 = vi::transform_calls();
        test::attend(*cache, 0, q.data(), 1, len - 1, out.data(), pool);
        *transforms = vi::transform_calls() - t0;
        return cpu::vecinfer_lut_builds() - b0;
    };
    uint64_t tr_long = 0, tr_short = 0;
    const uint64_t long_builds = count(4099, &tr_long), short_builds = count(1100, &tr_short);
    EXPECT_GE(long_builds, 8u);                 // at least once per query head
    EXPECT_EQ(long_builds % 8, 0u);             // whole query-head groups
    EXPECT_LE(long_builds, 8u * 64);            // at most one per head and split, never per token
    EXPECT_LE(tr_long, 2 * long_builds);        // a transform per LUT and per value sum
    EXPECT_LE(short_builds, long_builds);
}

// Resident bytes: m/n bits per element for the pages plus the per-layer state (codebooks d*2^m
// fp32 per role, keys' lambda d fp32), within 1 %.
TEST(VecinferCache, ResidentBytesMatchFormula) {
    const KvShape shape{2, 4, 2, 64, 4096};
    for (auto [n, m] : {std::pair{4, 8}, std::pair{2, 5}}) {
        const std::string spec = "vecinfer:n=" + std::to_string(n) + ",m=" + std::to_string(m) + ",calib=random";
        auto cache = make_kv_cache(shape, spec, spec);
        const int64_t tokens = 4096;
        const std::vector<float> k = gaussian(size_t(tokens * 2 * 64), 1), v = gaussian(k.size(), 2);
        for (int64_t l = 0; l < 2; ++l) cache->write(l, 0, k.data(), v.data(), tokens);
        cache->commit(tokens);
        const double pages = 2.0 /*layers*/ * 2 /*heads*/ * 2 /*K, V*/ * double(tokens) * 64 * double(m) / n / 8;
        const double state = 2.0 /*layers*/ * (2.0 * 64 * double(1 << m) + 64) * 4;
        EXPECT_NEAR(double(cache->resident_bytes()) / (pages + state), 1.0, 0.01) << spec;
    }
}

// ---- specs and refusals ----------------------------------------------------------------------

TEST(VecinferSpec, CalibrationPathMayHoldSlashes) {
    const KvSpec both = KvSpec::parse("vecinfer:calib=/tmp/a/b.gguf,n=4");
    EXPECT_EQ(both.k.options.at("calib"), "/tmp/a/b.gguf");
    EXPECT_EQ(both.v.name, "vecinfer");
    const KvSpec pair = KvSpec::parse("vecinfer:calib=/x/y.gguf,m=8/f16");
    EXPECT_EQ(pair.k.options.at("calib"), "/x/y.gguf");
    EXPECT_EQ(pair.v.str(), "f16");
    EXPECT_EQ(KvSpec::parse("q4_0/f16").k.name, "q4_0");
    // The path runs to the next ',': a slash after it inside the same value is part of it.
    EXPECT_EQ(KvSpec::parse("vecinfer:calib=a/f16").k.options.at("calib"), "a/f16");
}

TEST(VecinferSpec, RefusesBadOptionsAndAMissingCalibration) {
    const KvShape shape{1, 2, 2, 64, 64};
    EXPECT_NE(error_of([&] { make_kv_cache(shape, "vecinfer", "vecinfer"); }).find("calib=FILE"), std::string::npos);
    EXPECT_NE(error_of([&] { make_kv_cache(shape, "vecinfer:n=3,calib=random", "f16"); }).find("power of two"), std::string::npos);
    EXPECT_NE(error_of([&] { make_kv_cache(shape, "vecinfer:m=9,calib=random", "f16"); }).find("out of range"), std::string::npos);
    EXPECT_NE(error_of([&] { make_kv_cache(KvShape{1, 2, 2, 32, 64}, "vecinfer:n=64,calib=random", "f16"); }).find("does not divide"), std::string::npos);
    EXPECT_NE(error_of([&] { make_kv_cache(KvShape{1, 2, 2, 96, 64}, "vecinfer:calib=random", "f16"); }).find("power of two"),
              std::string::npos);
    EXPECT_NE(error_of([&] { make_kv_cache(shape, "vecinfer:calib=/nonexistent/c.gguf", "f16"); }).find("/nonexistent/c.gguf"),
              std::string::npos);
    EXPECT_NE(error_of([&] { make_kv_cache(shape, "vecinfer:bits=2,calib=random", "f16"); }).find("no option 'bits'"), std::string::npos);
}

// ---- the calibration file ------------------------------------------------------------------------

TEST(VecinferCalibrationFile, RoundTrip) {
    const std::string file = tmp_path("roundtrip.gguf");
    const VecinferCalibration c = synthetic_calibration(3, 2, 64, 4, 6, sha256_hex({}), 9);
    save_vecinfer_calibration(file, c);
    const VecinferCalibration r = load_vecinfer_calibration(file);
    EXPECT_EQ(r.model_sha256, c.model_sha256);
    EXPECT_EQ(r.model_file, c.model_file);
    EXPECT_EQ(r.tokens, c.tokens);
    EXPECT_EQ(std::tuple(r.n, r.m, r.n_layer, r.n_head_kv, r.head_dim, r.iterations, r.seed),
              std::tuple(c.n, c.m, c.n_layer, c.n_head_kv, c.head_dim, c.iterations, c.seed));
    for (size_t l = 0; l < c.layers.size(); ++l) {
        EXPECT_EQ(r.layers[l].key_lambda, c.layers[l].key_lambda);
        EXPECT_EQ(r.layers[l].key_codebook, c.layers[l].key_codebook);
        EXPECT_EQ(r.layers[l].value_codebook, c.layers[l].value_codebook);
    }
    // A cache built from it holds those codebooks (layer 2's keys decode to lambda * H c).
    auto cache = make_kv_cache(KvShape{3, 2, 2, 64, 16}, "vecinfer:n=4,m=6,calib=" + file, "vecinfer:n=4,m=6,calib=" + file);
    EXPECT_EQ(cache->format(), "vecinfer:n=4,m=6,calib=" + file);
}

TEST(VecinferCalibrationFile, Sha256KnownAnswers) {
    EXPECT_EQ(sha256_hex({}), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const std::string abc = "abc";
    EXPECT_EQ(sha256_hex({reinterpret_cast<const uint8_t*>(abc.data()), abc.size()}),
              "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const std::string two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    EXPECT_EQ(sha256_hex({reinterpret_cast<const uint8_t*>(two.data()), two.size()}),
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const std::string million(1000000, 'a');
    EXPECT_EQ(sha256_hex({reinterpret_cast<const uint8_t*>(million.data()), million.size()}),
              "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const std::string& path, const std::string& b) { std::ofstream(path, std::ios::binary) << b; }

// Every refusal names the file and says what is wrong; none crashes.
TEST(VecinferCalibrationFile, RefusesBadFiles) {
    const std::string good = tmp_path("good.gguf");
    const VecinferCalibration c = synthetic_calibration(2, 2, 64, 4, 6, kZeroSha, 4);
    save_vecinfer_calibration(good, c);
    const KvShape shape{2, 2, 2, 64, 16};
    auto refusal = [&](const VecinferCalibration& bad, const std::string& name) {
        const std::string f = tmp_path(name + ".gguf");
        save_vecinfer_calibration(f, bad);
        return error_of([&] { make_kv_cache(shape, "vecinfer:n=4,m=6,calib=" + f, "f16"); });
    };
    {
        VecinferCalibration b = c;
        b.layers[1].key_lambda[3] = -1.0f;
        EXPECT_NE(refusal(b, "neg_lambda").find("factor <= 0"), std::string::npos);
    }
    {
        VecinferCalibration b = c;
        b.layers[0].value_codebook[7] = std::numeric_limits<float>::quiet_NaN();
        EXPECT_NE(refusal(b, "nan").find("non-finite"), std::string::npos);
    }
    {
        VecinferCalibration b = c;
        b.n_layer = 1;
        b.layers.resize(1);
        EXPECT_NE(refusal(b, "one_layer").find("calibrated for 1 layers"), std::string::npos);
    }
    EXPECT_NE(error_of([&] { make_kv_cache(shape, "vecinfer:n=4,m=8,calib=" + good, "f16"); }).find("not n=4,m=8"),
              std::string::npos);
    EXPECT_NE(error_of([&] { make_kv_cache(KvShape{2, 2, 2, 128, 16}, "vecinfer:n=4,m=6,calib=" + good, "f16"); })
                  .find("head_dim 64, not 128"),
              std::string::npos);
    const std::string junk = tmp_path("junk.gguf");
    write_bytes(junk, "definitely not a calibration");
    EXPECT_NE(error_of([&] { load_vecinfer_calibration(junk); }).find(junk), std::string::npos);
    // A GGUF that is a model, not a calibration.
    const std::string model = test::shared_path("assets/models/vxq-llama-h64-f16.gguf");
    if (std::filesystem::exists(model)) {
        EXPECT_NE(error_of([&] { load_vecinfer_calibration(model); }).find("vxq.calibration.method"), std::string::npos);
    }
    // Another model: the sha256 of the model file differs.
    const std::string other = tmp_path("other_model.bin");
    write_bytes(other, "some other model");
    const std::string e = error_of([&] { check_calibration_model(KvSpec::parse("vecinfer:n=4,m=6,calib=" + good), other); });
    EXPECT_NE(e.find("calibration of another model"), std::string::npos) << e;
    EXPECT_NE(e.find(good), std::string::npos) << e;
    // The right model passes; calib=random and other methods read nothing.
    VecinferCalibration mine = c;
    mine.model_sha256 = sha256_file(other);
    const std::string mine_file = tmp_path("mine.gguf");
    save_vecinfer_calibration(mine_file, mine);
    EXPECT_EQ(error_of([&] { check_calibration_model(KvSpec::parse("vecinfer:n=4,m=6,calib=" + mine_file), other); }), "");
    EXPECT_EQ(error_of([&] { check_calibration_model(KvSpec::parse("vecinfer:calib=random,n=4/q8_0"), "/nonexistent"); }), "");
}

// Truncated at every 7th byte (and the last few bytes one by one): each prefix is refused with a
// vxq::Error or, cut only in the zero padding after the last tensor, loads to the same content.
TEST(VecinferCalibrationFile, TruncationIsAnErrorNeverACrash) {
    const std::string good = tmp_path("trunc_src.gguf");
    const VecinferCalibration c = synthetic_calibration(2, 1, 32, 4, 4, kZeroSha, 6);
    save_vecinfer_calibration(good, c);
    const std::string bytes = read_bytes(good);
    const std::string cut = tmp_path("trunc.gguf");
    int refused = 0, loaded = 0;
    for (size_t n = 0; n < bytes.size(); n += (n + 40 >= bytes.size() ? 1 : 7)) {
        write_bytes(cut, bytes.substr(0, n));
        try {
            const VecinferCalibration r = load_vecinfer_calibration(cut);
            ++loaded;
            ASSERT_EQ(r.layers[1].value_codebook, c.layers[1].value_codebook) << "cut at " << n;
        } catch (const Error& e) {
            ++refused;
            EXPECT_NE(std::string(e.what()).find(cut), std::string::npos) << e.what();
        }
    }
    EXPECT_GT(refused, 100);
    EXPECT_LT(loaded, 32);  // only cuts inside the final alignment padding
}

// ---- calibration from a real model -------------------------------------------------------------

// vxq-llama-h64 (6 layers, 2 KV heads, head_dim 64) over the start of a text: the file names the
// model's sha256; lambda is sqrt(max |K|) per channel (checked against the model's own keys);
// k-means lowers the coding error below the initialisation's; a cache from it reads back what it
// stores (fused = dequantized attention is covered above).
TEST(VecinferCalibrate, FromARealModel) {
    const std::string model_path = test::shared_path("assets/models/vxq-llama-h64-f16.gguf");
    const std::string text_path = test::shared_path("assets/text/tinystories_valid_head.txt");
    VXQ_REQUIRE_PATH(model_path);
    VXQ_REQUIRE_PATH(text_path);
    const auto model = Model::load(model_path);
    const auto be = make_backend("cpu", 2);
    VecinferCalibrateParams p;
    p.n = 4, p.m = 6, p.max_tokens = 200, p.n_ctx = 128, p.iterations = 10, p.threads = 2;
    VecinferCalibrateStats stats;
    const std::string text = read_bytes(text_path);
    const VecinferCalibration c = calibrate_vecinfer(*model, *be, text, p, &stats);
    EXPECT_EQ(c.model_sha256, sha256_file(model_path));
    EXPECT_EQ(c.tokens, 200);
    const ModelConfig& cfg = model->config();
    ASSERT_EQ(c.n_layer, cfg.n_layer);
    EXPECT_EQ(c.head_dim, cfg.head_dim);
    for (int64_t l = 0; l < c.n_layer; ++l) {
        EXPECT_GT(stats.key_rel_mse[size_t(l)], 0.0);
        EXPECT_LT(stats.key_rel_mse[size_t(l)], 0.5) << "layer " << l;
        EXPECT_LT(stats.value_rel_mse[size_t(l)], 0.5) << "layer " << l;
    }
    // Deterministic for a seed.
    const VecinferCalibration again = calibrate_vecinfer(*model, *be, text, p);
    EXPECT_EQ(again.layers[3].key_codebook, c.layers[3].key_codebook);
    // lambda from the keys of the same run's first chunk, collected apart through an f16 cache as
    // calibrate's (dequantize gives them back rounded to fp16: 1e-3 relative covers that).
    auto cache = make_kv_cache(KvShape{cfg.n_layer, cfg.n_head, cfg.n_head_kv, cfg.head_dim, 128}, "f16", "f16");
    std::vector<TokenId> tokens = model->tokenizer().encode(text, true);
    tokens.resize(128);
    std::vector<float> logits(size_t(cfg.n_vocab));
    model->forward(*be, *cache, tokens, int64_t(1), logits.data());
    std::vector<float> kmax(size_t(cfg.head_dim), 0.0f), k, v;
    for (int64_t g = 0; g < cfg.n_head_kv; ++g) {
        cache->dequantize(2, g, 128, k, v);
        for (size_t i = 0; i < k.size(); ++i) kmax[i % size_t(cfg.head_dim)] = std::max(kmax[i % size_t(cfg.head_dim)], std::abs(k[i]));
    }
    for (int64_t i = 0; i < cfg.head_dim; ++i) {  // the first 128 tokens are part of the 200: a lower bound
        EXPECT_GE(c.layers[2].key_lambda[size_t(i)] * c.layers[2].key_lambda[size_t(i)], kmax[size_t(i)] * (1 - 1e-3f));
    }
    const std::string file = tmp_path("real.gguf");
    save_vecinfer_calibration(file, c);
    EXPECT_EQ(error_of([&] { check_calibration_model(KvSpec::parse("vecinfer:n=4,m=6,calib=" + file), model_path); }), "");
}

}  // namespace
}  // namespace vxq

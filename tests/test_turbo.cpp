// TurboQuant codecs (kv/formats/turbo.h, kv/codecs/turbo.cpp, kernels/cpu/kv_read_turbo.cpp)
// against METHODS.md "TurboQuant": the Lloyd-Max solver against the table, the rotations, the
// distortion of TurboQuant_mse on random unit vectors, TurboQuant_prod's unbiasedness and variance
// bound, the rotation never running per cached token, resident bytes against the formula, and the
// AVX2 reader (kernels/cpu/kv_read_turbo_avx2.cpp) against the scalar one.
// (Fused attention vs dequantize-then-attend: tests/test_kv_cache.cpp, over the registry's variants.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/kv_reader.h"
#include "kv/calibration.h"
#include "kv/codec.h"
#include "kv/formats/turbo.h"
#include "kv/kv_cache.h"
#include "support/attend.h"
#include "support/bound_codec.h"
#include "support/isa.h"
#include "support/run_cli.h"
#include "support/text.h"

namespace vxq {
namespace {

namespace turbo = codecs::turbo;

using Bound = test::BoundCodec;
using test::error_of;

// A calibration's header for the tests: a made-up model, n_layer layers of head_dim d (layers empty).
TurboCalibration calibration_header(int64_t n_layer, int64_t d) {
    TurboCalibration c;
    c.model_sha256 = std::string(64, '0');
    c.model_file = "model.gguf";
    c.tokens = 100;
    c.n_layer = n_layer;
    c.head_dim = d;
    return c;
}

std::vector<float> random_unit(std::mt19937& rng, int64_t d) {
    std::normal_distribution<float> nd;
    std::vector<float> x(static_cast<size_t>(d));
    double nn = 0;
    for (auto& v : x) {
        v = nd(rng);
        nn += double(v) * v;
    }
    for (auto& v : x) v = float(v / std::sqrt(nn));
    return x;
}

// METHODS.md's table (N(0, 1) units, positive half; rounded to 4 decimals, hence 1e-4 + the
// half-unit of the last digit).
TEST(TurboLloydMax, GaussianCodebooksMatchTheTable) {
    const std::vector<std::vector<double>> table = {
        {0.7979},
        {0.4528, 1.5104},
        {0.2451, 0.7560, 1.3439, 2.1519},
        {0.1284, 0.3880, 0.6568, 0.9423, 1.2562, 1.6180, 2.0690, 2.7326},
    };
    for (int b = 1; b <= 4; ++b) {
        const std::vector<double> c = turbo::lloyd_max_gaussian(b);
        ASSERT_EQ(c.size(), size_t(1) << b);
        const size_t half = c.size() / 2;
        for (size_t k = 0; k < half; ++k) {
            EXPECT_NEAR(c[half + k], table[size_t(b - 1)][k], 1.5e-4) << "b=" << b << " k=" << k;
            EXPECT_NEAR(c[half - 1 - k], -c[half + k], 1e-9) << "symmetric";
        }
    }
}

// The second-stage codebook is fitted to the first stage's residual r = y - c1[Q1(y)], y ~ N(0, 1):
// symmetric, each centroid the mean of the residuals in its cell (Lloyd's fixed point, checked on
// 10^6 samples to 3 standard errors), and a lower MSE on those residuals than the Gaussian
// codebook scaled to the residual's standard deviation (the naive second stage).
TEST(TurboLloydMax, ResidualCodebookIsFittedToTheResidual) {
    for (int b = 1; b <= 4; ++b) {
        const turbo::Codebook q1 = [&] {
            turbo::Codebook cb;
            for (double x : turbo::lloyd_max_gaussian(b)) cb.centroids.push_back(float(x));
            for (size_t k = 0; k + 1 < cb.centroids.size(); ++k)
                cb.thresholds.push_back(0.5f * (cb.centroids[k] + cb.centroids[k + 1]));
            return cb;
        }();
        const std::vector<double> c2 = turbo::lloyd_max_residual(b, b);
        ASSERT_EQ(c2.size(), size_t(1) << b);
        for (size_t k = 0; k < c2.size(); ++k) EXPECT_NEAR(c2[k], -c2[c2.size() - 1 - k], 1e-6);
        std::mt19937 rng{uint32_t(b)};
        std::normal_distribution<double> nd;
        std::vector<double> r(1000000);
        double var = 0;
        for (auto& x : r) {
            const double y = nd(rng);
            x = y - q1.centroids[size_t(q1.index(float(y)))];
            var += x * x;
        }
        const double sd = std::sqrt(var / double(r.size()));
        const std::vector<double> naive_c = turbo::lloyd_max_gaussian(b);
        auto mse = [&](const std::vector<double>& c, double unit) {
            double e = 0;
            for (double x : r) {
                double best = 1e300;
                for (double v : c) best = std::min(best, (x - v * unit) * (x - v * unit));
                e += best;
            }
            return e / double(r.size());
        };
        EXPECT_LT(mse(c2, 1.0), mse(naive_c, sd)) << "b=" << b;
        std::vector<double> sum(c2.size()), sum2(c2.size());
        std::vector<int64_t> cnt(c2.size());
        for (double x : r) {
            size_t k = 0;
            while (k + 1 < c2.size() && x >= 0.5 * (c2[k] + c2[k + 1])) ++k;
            sum[k] += x;
            sum2[k] += x * x;
            ++cnt[k];
        }
        for (size_t k = 0; k < c2.size(); ++k) {
            if (cnt[k] < 100) continue;
            const double mean = sum[k] / double(cnt[k]);
            const double se = std::sqrt((sum2[k] / double(cnt[k]) - mean * mean) / double(cnt[k]));
            EXPECT_NEAR(mean, c2[k], 3 * se + 1e-4) << "b=" << b << " cell " << k;
        }
    }
}

TEST(TurboRotation, FastHadamardIsTheSylvesterMatrix) {
    for (int64_t d : {1, 2, 8, 64}) {
        std::mt19937 rng{uint32_t(d)};
        std::normal_distribution<float> nd;
        std::vector<float> x(static_cast<size_t>(d)), y;
        for (auto& v : x) v = nd(rng);
        y = x;
        turbo::fwht(y.data(), d);
        for (int64_t i = 0; i < d; ++i) {
            double want = 0;  // H[i][j] = (-1)^popcount(i & j)
            for (int64_t j = 0; j < d; ++j) want += (__builtin_popcountll(uint64_t(i & j)) & 1 ? -1.0 : 1.0) * x[size_t(j)];
            EXPECT_NEAR(y[size_t(i)], want, 1e-4) << "d=" << d << " i=" << i;
        }
    }
}

// Both rotations are orthogonal: norms kept, apply_t inverts apply; any d for Haar.
TEST(TurboRotation, OrthogonalAndInvertible) {
    for (const auto& [d, haar] : std::vector<std::pair<int64_t, bool>>{{64, false}, {128, false}, {128, true}, {96, true}, {7, true}}) {
        const turbo::Rotation rot(d, haar, 42);
        std::mt19937 rng(7);
        for (int rep = 0; rep < 20; ++rep) {
            std::vector<float> x = random_unit(rng, d), y = x;
            rot.apply(y.data());
            double nn = 0, moved = 0;
            for (int64_t c = 0; c < d; ++c) {
                nn += double(y[size_t(c)]) * y[size_t(c)];
                moved += std::abs(double(y[size_t(c)]) - x[size_t(c)]);
            }
            EXPECT_NEAR(nn, 1.0, 1e-5) << "d=" << d << " haar=" << haar;
            EXPECT_GT(moved, 0.1) << "not the identity";
            rot.apply_t(y.data());
            for (int64_t c = 0; c < d; ++c) EXPECT_NEAR(y[size_t(c)], x[size_t(c)], 1e-5);
        }
    }
}

TEST(TurboSpec, OptionsAndHeadDims) {
    const auto c96 = make_codec(CodecSpec::parse("turbo:bits=2"), KvRole::Key, 96);  // not 2^k: Haar
    EXPECT_EQ(c96->spec(), "turbo:bits=2,rot=haar");  // the choice is part of the canonical spec
    EXPECT_EQ(static_cast<const turbo::State*>(c96->params(96).layer_state)->rot.haar(), true);
    EXPECT_THROW(make_codec(CodecSpec::parse("turbo:rot=hadamard"), KvRole::Key, 96), Error);
    EXPECT_THROW(make_codec(CodecSpec::parse("turbo:bits=5"), KvRole::Key, 64), Error);
    EXPECT_THROW(make_codec(CodecSpec::parse("turbo:bits=0"), KvRole::Key, 64), Error);
    EXPECT_THROW(make_codec(CodecSpec::parse("turbo:rot=dct"), KvRole::Key, 64), Error);
    EXPECT_THROW(make_codec(CodecSpec::parse("turbo:group=32"), KvRole::Key, 64), Error);
    EXPECT_EQ(make_codec(CodecSpec::parse("turbo:bits=4,rot=haar,seed=3"), KvRole::Key, 64)->spec(),
              "turbo:bits=4,rot=haar,seed=3");
    // bits/element: b + 16/d (one fp16 norm per vector).
    for (int b = 1; b <= 4; ++b) {
        const auto c = make_codec(CodecSpec::parse(fmt::format("turbo:bits={}", b)), KvRole::Value, 128);
        EXPECT_DOUBLE_EQ(c->bits_per_element(128), b + 16.0 / 128);
    }
}

// E||x - x^||^2 over random unit vectors at d = 128 within 3 % of METHODS.md's figures (20000
// vectors: the sample mean's relative standard error is ~0.3 %).
double distortion(const std::string& spec, int64_t d, int n, uint32_t seed) {
    const Bound b(spec, KvRole::Key, d);
    std::vector<uint8_t> blk(b.codec->block_bytes(d));
    std::vector<float> xh(static_cast<size_t>(d));
    std::mt19937 rng(seed);
    double sum = 0;
    for (int i = 0; i < n; ++i) {
        const std::vector<float> x = random_unit(rng, d);
        b.codec->encode(x.data(), d, blk.data());
        b.codec->decode(blk.data(), d, xh.data());
        for (int64_t c = 0; c < d; ++c) sum += (double(x[size_t(c)]) - xh[size_t(c)]) * (double(x[size_t(c)]) - xh[size_t(c)]);
    }
    return sum / n;
}

TEST(TurboMse, DistortionOnUnitVectorsMatchesThePaper) {
    const double want[] = {0.363, 0.117, 0.0345, 0.0095};
    for (int b = 1; b <= 4; ++b) {
        for (const char* rot : {"hadamard", "haar"}) {
            const double D = distortion(fmt::format("turbo:bits={},rot={}", b, rot), 128, 20000, uint32_t(b));
            EXPECT_NEAR(D / want[b - 1], 1.0, 0.03) << "b=" << b << " rot=" << rot << " D=" << D;
        }
    }
}

// TurboQuant_prod: the fused reader's score minus the true <q, k> over 10^5 pairs. Pairs are
// correlated (q = k + noise, where the MSE stage alone is biased by ~ -D<q, k>) and spread over
// 1000 seeds of the sketch (the estimator is unbiased over S; a single S leaves a bias of order
// 1/d). Mean error within 3 standard errors of 0; mean of err^2 / (n^2 gamma^2 |q|^2) at most
// pi / (2d) (METHODS.md's bound, with gamma and n the stored ones).
TEST(TurboProd, InnerProductsUnbiasedWithVarianceUnderTheBound) {
    const int64_t d = 128;
    const int seeds = 1000, per_seed = 100;
    for (int b = 2; b <= 4; ++b) {
        std::mt19937 rng(uint32_t(100 + b));
        std::normal_distribution<float> nd;
        double sum = 0, sum2 = 0, norm_var = 0, mse_bias = 0;
        int64_t count = 0;
        for (int s = 0; s < seeds; ++s) {
            const Bound key(fmt::format("turbo-prod:bits={},seed={}", b, s), KvRole::Key, d);
            const KvFormatParams f = key.codec->params(d);
            const auto* st = static_cast<const turbo::State*>(f.layer_state);
            const cpu::KvReader& reader = cpu::kv_reader(f.kind);
            std::vector<uint8_t> blk(f.block_bytes);
            std::vector<float> y(static_cast<size_t>(d));
            for (int i = 0; i < per_seed; ++i) {
                std::vector<float> k = random_unit(rng, d), q(static_cast<size_t>(d));
                const float scale = 0.5f + float(rng() % 1000) / 500.0f;  // norms in [0.5, 2.5)
                for (auto& v : k) v *= scale;
                double truth = 0, qq = 0;
                for (int64_t c = 0; c < d; ++c) {
                    q[size_t(c)] = k[size_t(c)] / scale + 0.5f * nd(rng) / std::sqrt(float(d));
                    truth += double(q[size_t(c)]) * k[size_t(c)];
                    qq += double(q[size_t(c)]) * q[size_t(c)];
                }
                key.codec->encode(k.data(), d, blk.data());
                float est = 0;
                reader.scores_of(f, q.data(), 1, blk.data(), 1, d, &est);
                const double e = double(est) - truth;
                const double n = load_fp16(blk.data()), g = load_fp16(blk.data() + 2);
                sum += e;
                sum2 += e * e;
                norm_var += e * e / (n * n * g * g * qq);
                // The MSE stage alone: n <Pi q, c[idx]>.
                turbo::rotated_codes(*st, blk.data(), y.data());
                std::vector<float> qr = q;
                st->rot.apply(qr.data());
                double m = 0;
                for (int64_t c = 0; c < d; ++c) m += double(qr[size_t(c)]) * y[size_t(c)];
                mse_bias += n * m - truth;
                ++count;
            }
        }
        const double mean = sum / double(count);
        const double se = std::sqrt((sum2 / double(count) - mean * mean) / double(count));
        EXPECT_LT(std::abs(mean), 3 * se) << "b=" << b << " mean error " << mean << " se " << se;
        EXPECT_GT(std::abs(mse_bias / double(count)), 10 * se) << "b=" << b << ": the MSE stage alone should be visibly biased";
        EXPECT_LE(norm_var / double(count), std::numbers::pi / (2 * double(d))) << "b=" << b;
    }
}

// turbo-rvq:bits=b is a 2^(2b)-level scalar quantizer of each coordinate: never better than the
// 2b-bit Lloyd-Max one (measured: 0.128 vs 0.116 at b = 1, 0.0185 vs 0.0093 at b = 2), and at
// least halves the b-bit one's distortion.
TEST(TurboRvq, DistortionBetweenTheOneStageQuantizers) {
    for (int b = 1; b <= 2; ++b) {
        const double rvq = distortion(fmt::format("turbo-rvq:bits={}", b), 128, 5000, 9);
        const double one = distortion(fmt::format("turbo:bits={}", b), 128, 5000, 9);
        const double two = distortion(fmt::format("turbo:bits={}", 2 * b), 128, 5000, 9);
        EXPECT_GT(rvq, two * 0.97) << "b=" << b;
        EXPECT_LT(rvq, one / 2) << "b=" << b;
    }
}

// Attention rotates the query once per (query, KV head group, split) and the values' sum once
// after it; never a cached token: the count of rotations during one decode step over 3000 tokens
// is bounded by 2 x heads x the most splits the kernel makes (32), independent of the length.
TEST(TurboAttention, RotationNeverRunsPerCachedToken) {
    const KvShape shape{1, 4, 2, 64, 4096};
    ThreadPool pool(2);
    for (const char* m : {"turbo:bits=3", "turbo-prod:bits=3", "turbo-rvq:bits=2"}) {
        const uint64_t calls = test::count_in_one_decode_step(m, shape, 3000, turbo::rotation_calls, 3, pool);
        EXPECT_GT(calls, 0u) << m;
        EXPECT_LE(calls, uint64_t(2 * shape.n_head * 32)) << m;
    }
}

// --prefill-exact: the first batch's window tokens (exact f32, the model's domain) are summed
// apart from the rotated-domain codes and never un-rotated: the batch equals the f32 cache's
// attention bit for bit, and a later decode step reads the codes.
TEST(TurboAttention, ExactPrefillWindowStaysInTheModelDomain) {
    const KvShape shape{1, 4, 2, 64, 512};
    const int64_t n = 200, d = 64, H = 2;
    const auto [k, v, q] = test::random_kvq(n, H, 4, d, 21);
    ThreadPool pool(2);
    auto exact = make_kv_cache(shape, "f32", "f32");
    auto tq = make_kv_cache(shape, "turbo:bits=2", "turbo:bits=2", KvCacheOptions{/*prefill_exact=*/true});
    std::vector<float> want(q.size()), got(q.size());
    for (auto* c : {exact.get(), tq.get()}) c->write(0, 0, k.data(), v.data(), n);
    test::attend(*exact, 0, q.data(), n, 0, want.data(), pool);
    test::attend(*tq, 0, q.data(), n, 0, got.data(), pool);
    EXPECT_EQ(want, got);
    for (auto* c : {exact.get(), tq.get()}) c->commit(n);
    std::vector<float> o_exact(size_t(4 * d)), o_tq(o_exact.size());
    test::attend(*exact, 0, q.data(), 1, n - 1, o_exact.data(), pool);
    test::attend(*tq, 0, q.data(), 1, n - 1, o_tq.data(), pool);
    EXPECT_NE(o_exact, o_tq);
}

// `vxq methods` lists each TurboQuant method with its true bits/element at d = 64 and 128: the
// defaults (b = 3) plus the fp16 norm, and for turbo-prod the mean of its keys (b + 32/d) and
// values (b + 16/d); and the backends that read it: the CUDA backend too, in builds that have it.
TEST(TurboCli, MethodsShowTheTrueBitsPerElement) {
    const test::CliResult r = test::run_cli({"methods"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const char* row : {"| turbo | ", "| turbo-prod | ", "| turbo-rvq | "}) {
        const size_t at = r.out.find(row);
        ASSERT_NE(at, std::string::npos) << row;
        const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
        const std::string want = std::string(row) == "| turbo | "        ? "| 3.250 | 3.125 |"
                                 : std::string(row) == "| turbo-prod | " ? "| 3.375 | 3.188 |"
                                                                         : "| 6.250 | 6.125 |";
        EXPECT_NE(line.find(want), std::string::npos) << line;
        EXPECT_NE(line.find(VXQ_HAVE_CUDA ? "| cpu, cuda |" : "| cpu |"), std::string::npos) << line;
    }
}

// Resident bytes: an empty cache holds exactly the per-layer states (rotation signs d fp32,
// codebooks 2^b centroids + 2^b - 1 thresholds fp32, turbo-prod keys' sketch d^2 fp32); with n
// tokens add n x (block bytes) per stream, block = 2 + d*b/8 (+ 2 + d/8 for turbo-prod keys'
// gamma and signs, + d*b/8 for rvq's second stage). Within 1 %.
TEST(TurboCache, ResidentBytesMatchTheFormula) {
    const int64_t L = 2, H = 2, d = 64, n = 4096;
    const KvShape shape{L, 4, H, d, n};
    auto book = [](int b) { return double((1 << b) + (1 << b) - 1) * 4; };
    struct Row {
        std::string spec;
        double k_block, v_block, k_state, v_state;
    };
    const std::vector<Row> rows = {
        {"turbo:bits=3", 2 + 24, 2 + 24, 4.0 * d + book(3), 4.0 * d + book(3)},
        {"turbo:bits=2,rot=haar", 2 + 16, 2 + 16, 4.0 * d * d + book(2), 4.0 * d * d + book(2)},
        {"turbo-prod:bits=3", 4 + 16 + 8, 2 + 24, 4.0 * d + book(2) + 4.0 * d * d, 4.0 * d + book(3)},
        {"turbo-rvq:bits=2", 2 + 16 + 16, 2 + 16 + 16, 4.0 * d + 2 * book(2), 4.0 * d + 2 * book(2)},
    };
    for (const Row& r : rows) {
        auto cache = make_kv_cache(shape, r.spec, r.spec);
        const double states = double(L) * (r.k_state + r.v_state);
        EXPECT_EQ(double(cache->resident_bytes()), states) << r.spec;
        std::vector<float> k(size_t(n * H * d), 0.25f), v(k.size(), -0.5f);
        for (int64_t l = 0; l < L; ++l) cache->write(l, 0, k.data(), v.data(), n);
        cache->commit(n);
        const double formula = states + double(L * H * n) * (r.k_block + r.v_block);
        EXPECT_NEAR(double(cache->resident_bytes()) / formula, 1.0, 0.01) << r.spec;
    }
}

// turbo:rot=calib on its own spectrum (calib=random: a seeded basis, variances 0.85^i): b x d
// bits given out by variance, more to the larger ones, and on vectors drawn from that spectrum
// (y_i ~ N(0, lambda_i) in the basis) a distortion near the predicted sum lambda_i c(b_i) and
// below the random rotation's c(b).
TEST(TurboCalib, BitsFollowTheSpectrumAndTheDistortionItsPrediction) {
    const int64_t d = 64;
    for (int b = 2; b <= 4; ++b) {
        const CodecSpec spec = CodecSpec::parse(fmt::format("turbo:bits={},rot=calib,calib=random", b));
        const auto state = make_layer_state(spec, KvRole::Key, d, 1);
        const auto& st = dynamic_cast<const turbo::State&>(*state);
        // Coordinate c's variance: the square of its codebook's scale.
        const auto variance = [&](int64_t c) { return double(st.coord_scale[size_t(c)]) * st.coord_scale[size_t(c)]; };
        int total = 0;
        double predicted = 0.0;
        for (int64_t c = 0; c < d; ++c) {
            total += st.coord_bits[size_t(c)];
            if (c > 0) {
                EXPECT_LE(st.coord_bits[size_t(c)], st.coord_bits[size_t(c - 1)]) << "coordinate " << c;
            }
            predicted += variance(c) * turbo::lloyd_max_mse(st.coord_bits[size_t(c)]);
        }
        EXPECT_EQ(total, b * d);
        const auto codec = make_codec(spec, KvRole::Key, d, state.get());
        std::mt19937 rng(uint32_t(7 + b));
        std::normal_distribution<float> nd;
        std::vector<float> x(static_cast<size_t>(d)), back(static_cast<size_t>(d));
        std::vector<uint8_t> block(codec->block_bytes(d));
        double err = 0.0, energy = 0.0;
        for (int n = 0; n < 4000; ++n) {
            for (int64_t c = 0; c < d; ++c) x[size_t(c)] = st.coord_scale[size_t(c)] * nd(rng);
            st.rot.apply_t(x.data());  // into the model's domain
            codec->encode(x.data(), d, block.data());
            codec->decode(block.data(), d, back.data());
            for (int64_t c = 0; c < d; ++c) {
                err += double(back[size_t(c)] - x[size_t(c)]) * (back[size_t(c)] - x[size_t(c)]);
                energy += double(x[size_t(c)]) * x[size_t(c)];
            }
        }
        // The norm is coded apart and the unit vector's coordinates are not exactly Gaussian: 15 %.
        EXPECT_NEAR(err / energy / predicted, 1.0, 0.15) << "b=" << b;
        EXPECT_LT(err / energy, 0.6 * turbo::lloyd_max_mse(b)) << "b=" << b;
    }
    EXPECT_NE(error_of([] { make_layer_state(CodecSpec::parse("turbo:rot=calib"), KvRole::Key, 64, 0); }).find("calib=FILE"),
              std::string::npos);
    EXPECT_NE(error_of([] { make_layer_state(CodecSpec::parse("turbo:calib=random"), KvRole::Key, 64, 0); })
                  .find("goes with rot=calib"),
              std::string::npos);
    EXPECT_NE(error_of([] { make_layer_state(CodecSpec::parse("turbo-rvq:rot=calib,calib=random"), KvRole::Key, 64, 0); })
                  .find("rot=calib"),
              std::string::npos);
}

// The code path a run reports (kv_reader_isa) names the blocks an AVX2 reader leaves to its scalar
// code: TurboQuant_prod keys; plain turbo and turbo:rot=calib (keys and values) run AVX2.
TEST(TurboReader, ReportedIsaNamesTheScalarBlocks) {
    VXQ_REQUIRE_AVX2(cpu::kv_avx2_available());
    const int64_t d = 64;
    const auto isa_of = [&](const std::string& spec, KvRole role) {
        const CodecSpec cs = CodecSpec::parse(spec);
        const auto state = make_layer_state(cs, role, d, 0);
        const auto codec = make_codec(cs, role, d, state.get());
        return cpu::kv_reader_isa(codec->params(d), role == KvRole::Key);
    };
    EXPECT_EQ(isa_of("turbo:bits=3", KvRole::Key), cpu::KvIsa::Avx2);
    EXPECT_EQ(isa_of("turbo:bits=3", KvRole::Value), cpu::KvIsa::Avx2);
    EXPECT_EQ(isa_of("turbo-prod:bits=3", KvRole::Key), cpu::KvIsa::Scalar);
    EXPECT_EQ(isa_of("turbo-prod:bits=3", KvRole::Value), cpu::KvIsa::Avx2);
    EXPECT_EQ(isa_of("turbo:bits=3,rot=calib,calib=random", KvRole::Key), cpu::KvIsa::Avx2);
    EXPECT_EQ(isa_of("turbo:bits=3,rot=calib,calib=random", KvRole::Value), cpu::KvIsa::Avx2);
}

// The calibration file (kv/calibration.h): what is saved loads back, and a file for another head
// size or fewer layers, with a row that is not a unit vector, a negative variance, truncated, or
// made for another model is refused by name.
TEST(TurboCalibrationFile, RoundTripAndRefusals) {
    const auto path = [](const std::string& name) {
        return (std::filesystem::temp_directory_path() / ("vxq_turbo_" + name)).string();
    };
    const int64_t d = 32;
    TurboCalibration c = calibration_header(2, d);
    for (int64_t l = 0; l < 2; ++l) {
        TurboCalibration::Layer L;
        for (auto* basis : {&L.key_basis, &L.value_basis}) {
            basis->assign(size_t(d * d), 0.0f);
            for (int64_t i = 0; i < d; ++i) (*basis)[size_t(i * d + (i + l) % d)] = 1.0f;  // a permutation
        }
        for (auto* var : {&L.key_variance, &L.value_variance}) {
            for (int64_t i = 0; i < d; ++i) var->push_back(float(d - i) / float(d * (d + 1) / 2));
        }
        for (int64_t i = 0; i < d; ++i) L.key_weight.push_back(1.0f + 0.1f * float(i % 3));
        c.layers.push_back(L);
    }
    const std::string good = path("good.gguf");
    save_turbo_calibration(good, c);
    const TurboCalibration back = load_turbo_calibration(good);
    EXPECT_EQ(back.layers[1].key_basis, c.layers[1].key_basis);
    EXPECT_EQ(back.layers[0].value_variance, c.layers[0].value_variance);
    const KvShape shape{2, 2, 2, d, 16};
    EXPECT_EQ(error_of([&] { make_kv_cache(shape, "turbo:rot=calib,calib=" + good, "turbo:bits=2,rot=calib,calib=" + good); }), "");
    EXPECT_NE(error_of([&] { make_kv_cache(KvShape{2, 2, 2, 64, 16}, "turbo:rot=calib,calib=" + good, "f16"); })
                  .find("head_dim 32, not 64"),
              std::string::npos);
    EXPECT_NE(error_of([&] { make_kv_cache(KvShape{3, 2, 2, d, 16}, "turbo:rot=calib,calib=" + good, "f16"); })
                  .find("calibrated for 2 layers"),
              std::string::npos);
    auto refusal = [&](TurboCalibration bad, const std::string& name) {
        const std::string f = path(name + ".gguf");
        save_turbo_calibration(f, bad);
        return error_of([&] { load_turbo_calibration(f); });
    };
    TurboCalibration bad = c;
    bad.layers[1].value_basis[5] = 2.0f;
    EXPECT_NE(refusal(bad, "not_unit").find("not a unit vector"), std::string::npos);
    bad = c;
    bad.layers[0].key_variance[3] = -0.5f;
    EXPECT_NE(refusal(bad, "negative").find("negative variance"), std::string::npos);
    bad = c;
    bad.layers[1].key_weight[0] = 0.0f;
    EXPECT_NE(refusal(bad, "weight").find("weight <= 0"), std::string::npos);
    EXPECT_EQ(back.layers[1].key_weight, c.layers[1].key_weight);
    std::ifstream in(good, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string cut = path("cut.gguf");
    std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    EXPECT_NE(error_of([&] { load_turbo_calibration(cut); }).find(cut), std::string::npos);
    const std::string other = path("other_model.bin");
    std::ofstream(other, std::ios::binary) << "some other model";
    EXPECT_NE(error_of([&] { check_calibration_model(KvSpec::parse("turbo:rot=calib,calib=" + good), other); })
                  .find("calibration of another model"),
              std::string::npos);
}

}  // namespace
}  // namespace vxq

namespace vxq {
namespace {

// The AVX2 reader of `spec` against the scalar reference on fresh random blocks (norms spread
// over 0.1..4), odd token counts and GQA 1, 3, 4 and 5.
//   scores: the AVX2 reader sums q'_c y_c in 8 lanes with FMA, then across lanes; the scalar one
//     channel by channel. Both are within gamma_{d+3} * sum_c |q'_c y_c| of the exact dot
//     (Higham, recursive and pairwise summation; u = 2^-24), so they differ by at most
//     2 (d + 4) u n ||q|| ||y|| (Cauchy-Schwarz, ||q'|| = ||q||), plus the final product n * dot
//     (one rounding each, covered by the + 4). y is the same in both (the same codebook value, or
//     for rot=calib the same product scale * centroid), so this is the whole difference.
//   values: the same operations in the same order per channel (fl(p n) * y added token after
//     token), so bit for bit.
void expect_avx2_matches_scalar(const std::string& spec, KvRole role, int64_t d, std::mt19937& rng, uint32_t seed) {
    std::normal_distribution<float> nd;
    std::uniform_real_distribution<float> ud(0.1f, 4.0f);
    const double u = std::ldexp(1.0, -24);
    const Bound bd(spec, role, d);
    const KvFormatParams f = bd.codec->params(d);
    const auto& st = *static_cast<const turbo::State*>(f.layer_state);
    const cpu::KvReader* scalar = cpu::kv_reader(f.kind, cpu::KvIsa::Scalar);
    const cpu::KvReader* avx2 = cpu::kv_reader(f.kind, cpu::KvIsa::Avx2);
    ASSERT_TRUE(scalar && avx2 && scalar != avx2) << spec;
    ASSERT_FALSE(avx2->scalar_blocks(f, role == KvRole::Key)) << spec << ": the AVX2 code must run";
    for (const int64_t n : {1, 7, 33, 130})
        for (const int64_t n_q : {1, 3, 4, 5}) {
            const std::string at =
                fmt::format("{} role={} d={} n={} n_q={} seed={}", spec, role == KvRole::Key ? "key" : "value", d, n, n_q, seed);
            std::vector<uint8_t> blk(size_t(n) * f.block_bytes);
            std::vector<float> x(static_cast<size_t>(d));
            for (int64_t t = 0; t < n; ++t) {
                const float scale = ud(rng);
                for (auto& v : x) v = scale * nd(rng);
                bd.codec->encode(x.data(), d, blk.data() + size_t(t) * f.block_bytes);
            }
            if (role == KvRole::Key) {
                std::vector<float> q(size_t(n_q * d)), s0(size_t(n_q * n)), s1(s0.size()), y(static_cast<size_t>(d));
                for (auto& v : q) v = nd(rng);
                scalar->scores_of(f, q.data(), n_q, blk.data(), n, d, s0.data());
                avx2->scores_of(f, q.data(), n_q, blk.data(), n, d, s1.data());
                for (int64_t t = 0; t < n; ++t) {
                    const uint8_t* B = blk.data() + size_t(t) * f.block_bytes;
                    turbo::rotated_codes(st, B, y.data());
                    double yy = 0;
                    for (float v : y) yy += double(v) * v;
                    for (int64_t h = 0; h < n_q; ++h) {
                        double qq = 0;
                        for (int64_t c = 0; c < d; ++c) qq += double(q[size_t(h * d + c)]) * q[size_t(h * d + c)];
                        const double tol = 2.0 * double(d + 4) * u * load_fp16(B) * std::sqrt(qq * yy);
                        ASSERT_NEAR(s1[size_t(h * n + t)], s0[size_t(h * n + t)], tol) << at << " t=" << t << " h=" << h;
                    }
                }
            } else {
                std::vector<float> p(size_t(n_q * n)), a0(size_t(n_q * d)), a1;
                for (auto& v : p) v = std::abs(nd(rng));
                for (auto& v : a0) v = nd(rng);
                a1 = a0;
                scalar->accumulate(f, p.data(), n_q, blk.data(), n, d, a0.data());
                avx2->accumulate(f, p.data(), n_q, blk.data(), n, d, a1.data());
                ASSERT_EQ(a0, a1) << at;
            }
        }
}

// turbo and turbo-rvq (both roles), turbo-prod's values, bits 1..4, d = 64 and 128 (Hadamard)
// and d = 100 (Haar: the d % 8 tail).
TEST(TurboReader, Avx2MatchesTheScalarReference) {
    VXQ_REQUIRE_KV_AVX2();
    const uint32_t seed = std::random_device{}();
    std::mt19937 rng(seed);
    struct Case {
        const char* family;
        KvRole role;
    };
    const Case cases[] = {{"turbo", KvRole::Key}, {"turbo", KvRole::Value}, {"turbo-rvq", KvRole::Key},
                          {"turbo-rvq", KvRole::Value}, {"turbo-prod", KvRole::Value}};
    for (const Case& cs : cases)
        for (int b = 1; b <= 4; ++b)
            for (const int64_t d : {64, 128, 100})
                ASSERT_NO_FATAL_FAILURE(expect_avx2_matches_scalar(
                    fmt::format("{}:bits={}{}", cs.family, b, d == 100 ? ",rot=haar" : ""), cs.role, d, rng, seed));
}

// turbo:rot=calib (per coordinate its own bit count and scaled codebook, kv_read_turbo_avx2.cpp's
// CalibView), both roles, budgets b = 1..4 (b = 1 at d = 64: an index area under 16 bytes, read
// through the padded copy), d = 64, 128 and 100 (the d % 8 tail), on two spectra: calib=random
// (0.85^i, widths falling with the index) and a file whose variances 0.6^i sit at shuffled
// coordinates with uneven key weights, so that neighbouring coordinates get widths from 0 to 8 and
// a group of 8 starts at any bit. Tolerances: expect_avx2_matches_scalar's.
TEST(TurboReader, Avx2MatchesTheScalarReferenceOnCalibratedBlocks) {
    VXQ_REQUIRE_KV_AVX2();
    const uint32_t seed = std::random_device{}();
    std::mt19937 rng(seed);
    int widest = 0, zeros = 0;
    for (const int64_t d : {64, 128, 100}) {
        TurboCalibration c = calibration_header(1, d);
        TurboCalibration::Layer L;
        std::vector<int64_t> perm(static_cast<size_t>(d));
        for (int64_t i = 0; i < d; ++i) perm[size_t(i)] = i;
        std::shuffle(perm.begin(), perm.end(), std::mt19937(uint32_t(d)));
        for (auto* basis : {&L.key_basis, &L.value_basis}) {
            basis->assign(size_t(d * d), 0.0f);
            for (int64_t i = 0; i < d; ++i) (*basis)[size_t(i * d + perm[size_t(i)])] = 1.0f;
        }
        std::vector<float> var(static_cast<size_t>(d));
        double sum = 0;
        for (int64_t i = 0; i < d; ++i) sum += std::pow(0.6, double(i));
        for (int64_t i = 0; i < d; ++i) var[size_t(perm[size_t(i)])] = float(std::pow(0.6, double(i)) / sum);
        L.key_variance = L.value_variance = var;
        for (int64_t i = 0; i < d; ++i) L.key_weight.push_back(1.0f + 0.5f * float(i % 3));
        c.layers.push_back(L);
        const std::string file =
            (std::filesystem::temp_directory_path() / fmt::format("vxq_turbo_avx2_calib_{}_{}.gguf", d, seed)).string();
        save_turbo_calibration(file, c);
        for (const std::string& calib : {std::string("random"), file})
            for (int b = 1; b <= 4; ++b)
                for (const KvRole role : {KvRole::Key, KvRole::Value}) {
                    const std::string spec = fmt::format("turbo:bits={},rot=calib,calib={}", b, calib);
                    const Bound bd(spec, role, d);
                    const auto& st = *static_cast<const turbo::State*>(bd.state.get());
                    for (const uint8_t w : st.coord_bits) {
                        widest = std::max(widest, int(w));
                        zeros += w == 0;
                    }
                    ASSERT_NO_FATAL_FAILURE(expect_avx2_matches_scalar(spec, role, d, rng, seed));
                }
        std::filesystem::remove(file);
    }
    EXPECT_EQ(widest, 8) << "some coordinate has the most bits a field can have";
    EXPECT_GT(zeros, 0) << "and some none";
}

}  // namespace
}  // namespace vxq

// QJL codec (kv/formats/qjl.h, kv/codecs/qjl.cpp, kernels/cpu/kv_read_qjl.cpp) against
// METHODS.md "QJL": unbiased scores with the variance of the 1-bit JL estimator (and under the
// bound (pi/(2m)) ||q||^2 ||k||^2), the reader's scores equal to the inner product with decode()'s
// vectors, the query projected once per step (never per cached token), the outlier channels,
// `vxq methods`' bits/element, and resident bytes against the formula.
// (Fused attention vs dequantize-then-attend and eviction: tests/test_kv_cache.cpp, over the
// registry's variants, which include qjl's.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "kernels/cpu/kv_reader.h"
#include "kv/codec.h"
#include "kv/formats/qjl.h"
#include "kv/kv_cache.h"
#include "support/attend.h"
#include "support/bound_codec.h"
#include "support/run_cli.h"

namespace vxq {
namespace {

namespace qjl = codecs::qjl;

// A key codec of `spec` with its layer state, as a cache builds them.
struct BoundKeys : test::BoundCodec {
    BoundKeys(const std::string& spec, int64_t d, int64_t layer = 0) : BoundCodec(spec, KvRole::Key, d, layer) {}
    const qjl::State& st() const { return *static_cast<const qjl::State*>(state.get()); }
};

struct Moments {
    double sum = 0, sum2 = 0, bound = 0, predicted = 0;
    int64_t n = 0;
    double mean() const { return sum / double(n); }
    double se() const { return std::sqrt((sum2 / double(n) - mean() * mean()) / double(n)); }
    double mse() const { return sum2 / double(n); }
};

// Scores of 10^5 (q, k) pairs through the reader, each pair its own query and key, spread over
// 3125 seeds of the sketches (the estimator is unbiased over S; one fixed S leaves a bias of order
// 1/m). Keys have 8 loud channels (x8, so the blocks' outliers are them) on N(0, 1); queries are
// correlated with their key (q = k / |k| * 3 + N(0, 1)), so a missing sqrt(pi/2) or a wrong norm
// split would show as a bias. Per pair the error e = score - <q, k> (double), with
//   bound:     (pi / (2m)) ||q||^2 ||k||^2                                            (METHODS.md)
//   predicted: ((pi/2) ||q_in||^2 ||k_in||^2 - <q_in, k_in>^2) / m + (same, out) / m_o
// (the exact variance of the two independent sign estimators given the stored outlier split).
Moments run_pairs(const std::string& opts, int64_t d, int seeds, uint32_t rng_seed) {
    const int64_t B = qjl::kBlockTokens;
    std::mt19937 rng(rng_seed);
    std::normal_distribution<float> nd;
    std::vector<int> loud(8);
    for (int j = 0; j < 8; ++j) loud[size_t(j)] = int((j * 37 + 5) % d);
    Moments mo;
    for (int s = 0; s < seeds; ++s) {
        const BoundKeys key(fmt::format("qjl:seed={}{}", s, opts), d);
        const KvFormatParams f = key.codec->params(d);
        const qjl::Layout& l = key.st().layout;
        const cpu::KvReader& reader = cpu::kv_reader(f.kind);
        std::vector<float> k(size_t(B * d)), q(size_t(B * d)), sc(size_t(B * B));
        for (auto& v : k) v = nd(rng);
        for (int64_t t = 0; t < B; ++t)
            for (int c : loud) k[size_t(t * d + c)] *= 8.0f;
        for (int64_t t = 0; t < B; ++t) {
            double kk = 0;
            for (int64_t c = 0; c < d; ++c) kk += double(k[size_t(t * d + c)]) * k[size_t(t * d + c)];
            for (int64_t c = 0; c < d; ++c) q[size_t(t * d + c)] = float(k[size_t(t * d + c)] / std::sqrt(kk) * 3) + nd(rng);
        }
        std::vector<uint8_t> blk(f.block_bytes);
        key.codec->encode(k.data(), d, blk.data());
        reader.scores_of(f, q.data(), B, blk.data(), B, d, sc.data());
        std::vector<uint8_t> out(size_t(d), 0);
        for (int j = 0; j < l.outliers; ++j) out[blk[size_t(j)]] = 1;
        for (int64_t t = 0; t < B; ++t) {
            double dot[2] = {0, 0}, qq[2] = {0, 0}, kk[2] = {0, 0};
            for (int64_t c = 0; c < d; ++c) {
                const double qc = q[size_t(t * d + c)], kc = k[size_t(t * d + c)];
                const int part = out[size_t(c)];
                dot[part] += qc * kc;
                qq[part] += qc * qc;
                kk[part] += kc * kc;
            }
            const double e = double(sc[size_t(t * B + t)]) - (dot[0] + dot[1]);
            mo.sum += e;
            mo.sum2 += e * e;
            mo.bound += std::numbers::pi / (2.0 * double(l.m)) * (qq[0] + qq[1]) * (kk[0] + kk[1]);
            const double half_pi = std::numbers::pi / 2;
            mo.predicted += (half_pi * qq[0] * kk[0] - dot[0] * dot[0]) / double(l.m);
            if (l.outliers > 0) mo.predicted += (half_pi * qq[1] * kk[1] - dot[1] * dot[1]) / double(l.mo);
            ++mo.n;
        }
    }
    mo.bound /= double(mo.n);
    mo.predicted /= double(mo.n);
    return mo;
}

// Defaults at d = 128 (m = 256, m_o = 128, 8 outliers) and plain QJL (no outliers): mean error
// within 3 standard errors of 0; mean squared error at most the mean of METHODS.md's bound, and
// within 5 % of the exact variance of the estimator (the relative standard error of a mean of
// 10^5 squared errors is about sqrt(2 / 10^5) = 0.45 %; fp16 norms add ~1e-3 relative).
TEST(QjlEstimator, UnbiasedWithVarianceUnderTheBound) {
    for (const char* opts : {"", ",outliers=0"}) {
        const Moments mo = run_pairs(opts, 128, 3125, 17);
        ASSERT_EQ(mo.n, 100000);
        std::printf("[ qjl%s d=128 ] pairs %lld  mean error %.3e  se %.3e  mse %.4f  predicted %.4f  bound %.4f\n", opts,
                    (long long)mo.n, mo.mean(), mo.se(), mo.mse(), mo.predicted, mo.bound);
        EXPECT_LT(std::abs(mo.mean()), 3 * mo.se()) << opts;
        EXPECT_LE(mo.mse(), mo.bound) << opts;
        EXPECT_NEAR(mo.mse() / mo.predicted, 1.0, 0.05) << opts;
    }
}

// The loud channels become the block's outliers (ascending), and their norms split as stored.
TEST(QjlFormat, OutliersAreTheLoudestChannelsOfTheBlock) {
    const int64_t d = 64, B = qjl::kBlockTokens;
    const BoundKeys key("qjl", d);
    std::mt19937 rng(4);
    std::normal_distribution<float> nd;
    std::vector<float> k(size_t(B * d));
    for (auto& v : k) v = nd(rng);
    const std::vector<int> loud = {60, 2, 33, 17, 9, 41, 50, 25};
    for (int64_t t = 0; t < B; ++t)
        for (int c : loud) k[size_t(t * d + c)] *= 5.0f;
    std::vector<uint8_t> blk(key.codec->block_bytes(d));
    key.codec->encode(k.data(), d, blk.data());
    std::vector<int> want = loud;
    std::sort(want.begin(), want.end());
    const qjl::Layout& l = key.st().layout;
    for (int j = 0; j < 8; ++j) EXPECT_EQ(blk[size_t(j)], want[size_t(j)]);
    for (int64_t t = 0; t < B; ++t) {
        double in = 0, out = 0;
        for (int64_t c = 0; c < d; ++c) {
            const double v = k[size_t(t * d + c)];
            (std::find(loud.begin(), loud.end(), int(c)) != loud.end() ? out : in) += v * v;
        }
        EXPECT_NEAR(load_fp16(blk.data() + l.norm_in_offset() + 2 * size_t(t)), std::sqrt(in), std::sqrt(in) * 1e-3);
        EXPECT_NEAR(load_fp16(blk.data() + l.norm_out_offset() + 2 * size_t(t)), std::sqrt(out), std::sqrt(out) * 1e-3);
    }
}

// The reader's scores equal <q, decode(block)> (in double) within 1e-5 relative (max error over
// max |reference| per block and query head: float sums of m + m_o signed terms against double),
// on odd shapes: d not a power of two (100: the default m_o rounded up to 104), m and m_o not
// multiples of 32, 0 / 3 / 5 / 8 outliers, GQA 1, 3, 4 and runs of 1 and 3 blocks; for the scalar
// reader and the AVX2 one (which sums the signs in 8 lanes; skipped on a CPU without AVX2).
TEST(QjlReader, ScoresEqualTheDotWithDecodedVectors) {
    const uint32_t seed = std::random_device{}();
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    const int64_t B = qjl::kBlockTokens;
    double worst = 0;
    for (const char* opts : {"qjl", "qjl:outliers=0", "qjl:m=72,mo=24,outliers=3,seed=7", "qjl:m=136,mo=40,outliers=5"})
        for (const int64_t d : {64, 128, 100, 40}) {
            const BoundKeys key(opts, d);
            const KvFormatParams f = key.codec->params(d);
            for (const cpu::KvIsa isa : {cpu::KvIsa::Scalar, cpu::KvIsa::Avx2})
            for (const int64_t blocks : {1, 3})
                for (const int64_t n_q : {1, 3, 4}) {
                    const int64_t n = blocks * B;
                    std::vector<float> k(size_t(n * d)), x(size_t(n * d)), q(size_t(n_q * d)), s(size_t(n_q * n));
                    std::vector<uint8_t> blk(size_t(blocks) * f.block_bytes);
                    for (auto& v : k) v = nd(rng) * 2.0f + 0.5f;
                    for (int64_t c = 0; c < d; c += 7)
                        for (int64_t t = 0; t < n; ++t) k[size_t(t * d + c)] *= 6.0f;
                    for (auto& v : q) v = nd(rng);
                    for (int64_t b = 0; b < blocks; ++b) {
                        key.codec->encode(k.data() + b * B * d, d, blk.data() + size_t(b) * f.block_bytes);
                        key.codec->decode(blk.data() + size_t(b) * f.block_bytes, d, x.data() + b * B * d);
                    }
                    const cpu::KvReader* reader = cpu::kv_reader(f.kind, isa);
                    if (!reader) {  // no AVX2 + FMA + F16C on this CPU
                        ASSERT_EQ(isa, cpu::KvIsa::Avx2);
                        ASSERT_FALSE(cpu::kv_avx2_available());
                        continue;
                    }
                    reader->scores_of(f, q.data(), n_q, blk.data(), n, d, s.data());
                    for (int64_t h = 0; h < n_q; ++h)
                        for (int64_t b = 0; b < blocks; ++b) {
                            double max_ref = 0, max_err = 0;
                            for (int64_t t = b * B; t < (b + 1) * B; ++t) {
                                double ref = 0;
                                for (int64_t c = 0; c < d; ++c) ref += double(q[size_t(h * d + c)]) * x[size_t(t * d + c)];
                                max_ref = std::max(max_ref, std::abs(ref));
                                max_err = std::max(max_err, std::abs(double(s[size_t(h * n + t)]) - ref));
                            }
                            worst = std::max(worst, max_err / max_ref);
                            ASSERT_LT(max_err / max_ref, 1e-5)
                                << opts << " d=" << d << " blocks=" << blocks << " n_q=" << n_q << " seed=" << seed
                                << (isa == cpu::KvIsa::Avx2 ? " avx2" : " scalar");
                        }
                }
        }
    std::printf("[ qjl reader vs decode ] worst max|err| / max|ref| = %.2e\n", worst);
}

// Attention projects each query head once per (query, KV head group, split) and nowhere else:
// over 3000 and 4000 cached tokens (the same split count, 16 per unit) one decode step runs the
// same number of projections, at most heads x the kernel's most splits (32). Scoring a block
// only reads its O outlier columns of S and S_o; no code path projects per cached token.
TEST(QjlAttention, QueryProjectedOncePerStepNotPerToken) {
    const KvShape shape{1, 4, 2, 64, 4096};
    ThreadPool pool(2);
    uint64_t calls_at[2] = {0, 0};
    int i = 0;
    for (const int64_t n : {3000, 4000}) {
        calls_at[i++] = test::count_in_one_decode_step("qjl", shape, n, qjl::projection_calls, 3, pool);
    }
    EXPECT_GT(calls_at[0], 0u);
    EXPECT_LE(calls_at[0], uint64_t(shape.n_head * 32));
    EXPECT_EQ(calls_at[0], calls_at[1]) << "projections grew with the number of cached tokens";
}

// `vxq methods`: keys (m + m_o + 32 + O/4)/d = 3 + 34/d, values KIVI-2 at G = 32 = 3.0, so the
// K/V mean is 3.266 at d = 64 and 3.133 at d = 128; the fp16 window is K 31 / V 32 tokens.
TEST(QjlCli, MethodsShowTheTrueBitsPerElement) {
    const test::CliResult r = test::run_cli({"methods"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const size_t at = r.out.find("| qjl | ");
    ASSERT_NE(at, std::string::npos);
    const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
    EXPECT_NE(line.find("| 3.266 | 3.133 | fp16, K 31 / V 32 tokens |"), std::string::npos) << line;
    EXPECT_NE(line.find(VXQ_HAVE_CUDA ? "| cpu, cuda |" : "| cpu |"), std::string::npos) << line;
}

// Resident bytes: an empty cache holds exactly the per-layer sketches ((m + m_o) d fp32 for keys,
// nothing for values); with n tokens add per stream the key blocks (O + 32 (4 + (m + m_o)/8)
// bytes per 32 tokens, pages of 64 tokens), the keys' fp16 ring of R tokens, the values' KIVI-2
// blocks (d/32 x (4 + 8) bytes per token) for all but the R newest and their ring of R + 1. Within 1 %.
TEST(QjlCache, ResidentBytesMatchTheFormula) {
    const int64_t L = 2, H = 2, d = 64;
    struct Row {
        std::string spec;
        int64_t m, mo, O, R;
    };
    const std::vector<Row> rows = {{"qjl", 128, 64, 8, 32}, {"qjl:m=256,mo=128,residual=64", 256, 128, 8, 64},
                                   {"qjl:outliers=0", 128, 0, 0, 32}};
    for (const Row& r : rows)
        for (const int64_t n : {4096, 4010}) {
            const KvShape shape{L, 4, H, d, 4096};
            auto cache = make_kv_cache(shape, r.spec, r.spec);
            const double states = double(L) * double((r.m + r.mo) * d) * 4;
            EXPECT_EQ(double(cache->resident_bytes()), states) << r.spec;
            std::mt19937 rng(1);
            std::normal_distribution<float> nd;
            std::vector<float> k(size_t(n * H * d)), v(k.size());
            for (auto& x : k) x = nd(rng);
            for (auto& x : v) x = nd(rng);
            for (int64_t l = 0; l < L; ++l) cache->write(l, 0, k.data(), v.data(), n);
            cache->commit(n);
            const int64_t k_blocks = (n - n % r.R) / 32;
            const double k_block = double(r.O + 32 * ((r.O > 0 ? 4 : 2) + (r.m + r.mo) / 8));
            const double k_bytes = double(k_blocks) * k_block + double(r.R * d * 2);
            const double v_bytes = double(n - r.R) * (d / 32) * 12 + double((r.R + 1) * d * 2);
            const double formula = states + double(L * H) * (k_bytes + v_bytes);
            EXPECT_NEAR(double(cache->resident_bytes()) / formula, 1.0, 0.01) << r.spec << " n=" << n;
        }
}

TEST(QjlSpec, BadOptionsAreErrors) {
    const KvShape shape{1, 2, 1, 64, 64};
    EXPECT_THROW(make_kv_cache(shape, "qjl:m=100", "f16"), Error);         // not a multiple of 8
    EXPECT_THROW(make_kv_cache(shape, "qjl:residual=48", "f16"), Error);   // not whole blocks
    EXPECT_THROW(make_kv_cache(shape, "qjl:outliers=65", "f16"), Error);
    EXPECT_THROW(make_kv_cache(shape, "qjl:bits=2", "f16"), Error);
    EXPECT_THROW(make_kv_cache(KvShape{1, 2, 1, 512, 64}, "qjl", "qjl"), Error);  // outlier indices are bytes
    EXPECT_NO_THROW(make_kv_cache(shape, "qjl:m=8,mo=8,outliers=64", "qjl"));
}

}  // namespace
}  // namespace vxq

// Element-wise CPU ops in llama.cpp b4748's numerics (kernels/cpu/ops.cpp): the AVX2 kernels equal
// their scalar references bit for bit on fresh random inputs, the references compute the formulas
// of ggml's CPU backend, and the approximations stay within their documented error against double
// precision.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/ops.h"
#include "support/isa.h"
#include "support/seed.h"
#include "kernels/cpu/ops_impl.h"

#pragma GCC optimize("fp-contract=off")  // the expected values below round every operation

namespace vxq::cpu {
namespace {

using test::fresh_seed;

constexpr int64_t kSizes[] = {1, 7, 8, 9, 31, 97, 1000, 4099};

// Distance in units in the last place of `want` (a float), measured in double.
double ulps(float got, double want) {
    const double w = std::fabs(want);
    const int e = w == 0.0 ? -149 : std::max(std::ilogb(w) - 23, -149);  // ulp of float at |want|
    return std::fabs(double(got) - want) / std::ldexp(1.0, e);
}

::testing::AssertionResult same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes differ";
    for (size_t i = 0; i < a.size(); ++i) {
        if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) {
            return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
        }
    }
    return ::testing::AssertionSuccess();
}

// ---- ggml_v_expf ----

TEST(OpsExpf, Avx2EqualsReferenceBitForBit) {
    VXQ_REQUIRE_AVX2(detail::cpu_has_avx2());
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> wide(-120.0f, 100.0f), narrow(-10.0f, 10.0f);
    const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 88.3f, 88.38f, 88.5f, 88.8f, 89.0f, -87.3f, -87.4f,
                             -100.0f, -103.9f, -104.0f, -150.0f, 200.0f, -200.0f, 1e30f, -1e30f,
                             std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
    for (const int64_t n : kSizes) {
        std::vector<float> x(static_cast<size_t>(n)), a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) x[size_t(i)] = (i % 3 == 0) ? wide(rng) : narrow(rng);
        for (size_t i = 0; i < std::size(special) && i < x.size(); ++i) x[(i * 7) % x.size()] = special[i];
        vec_expf(x.data(), a.data(), n);
        vec_expf_ref(x.data(), b.data(), n);
        ASSERT_TRUE(same_bits(a, b)) << "n=" << n << " seed=" << seed;
    }
}

// ggml documents its approximation as "maximum error 1.45358 plus 0.5 ulps" (1.95 ulp) on the
// range where the result is a normal float; we assert < 2 ulp against exp in double precision.
TEST(OpsExpf, WithinTwoUlpOfExactOnNormalRange) {
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> ud(-87.3f, 88.3f);
    double worst = 0.0;
    float worst_x = 0.0f;
    std::vector<float> x(200000), y(x.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = i < 2001 ? -1.0f + float(i) * 1e-3f : ud(rng);
    vec_expf(x.data(), y.data(), int64_t(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
        const double u = ulps(y[i], std::exp(double(x[i])));
        if (u > worst) worst = u, worst_x = x[i];
    }
    EXPECT_LT(worst, 2.0) << "at x=" << worst_x << " seed=" << seed;
    EXPECT_GT(worst, 0.5) << "an approximation, not libm: some results are not correctly rounded";
    EXPECT_EQ(detail::ggml_expf(0.0f), 1.0f);
}

// Above 126 ln 2 the power of two is applied in two factors (ggml's comment "numbers above 88.38
// will flush to infinity" is loose for this AVX2 form): results stay accurate up to the float
// overflow of exp at 88.7228, inputs below -103.97 give 0, results in between are subnormal.
TEST(OpsExpf, EdgesOfTheRange) {
    const float inf = std::numeric_limits<float>::infinity();
    for (float x = 87.0f; x <= 88.72f; x += 0.01f) EXPECT_LT(ulps(detail::ggml_expf(x), std::exp(double(x))), 2.0) << x;
    for (const float x : {88.73f, 89.0f, 100.0f, 1e10f, inf}) EXPECT_EQ(detail::ggml_expf(x), inf) << x;
    for (const float x : {-104.0f, -120.0f, -1e10f, -inf}) EXPECT_EQ(detail::ggml_expf(x), 0.0f) << x;
    // subnormal results: within a few subnormal steps (2^-149) of exp
    for (float x = -103.9f; x < -87.4f; x += 0.37f) {
        const double want = std::exp(double(x));
        EXPECT_LE(std::fabs(double(detail::ggml_expf(x)) - want), std::max(4e-7 * want, 3 * 0x1p-149)) << x;
    }
}

// ---- SiLU (ggml_vec_silu_f32) then the multiplication by up ----

TEST(OpsSwiglu, Avx2EqualsReferenceBitForBit) {
    VXQ_REQUIRE_AVX2(detail::cpu_has_avx2());
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    for (const int64_t n_rows : {1, 3}) {
        for (const int64_t n : kSizes) {
            std::vector<float> g(size_t(n_rows * n)), u(g.size());
            for (auto& v : g) v = nd(rng);
            for (auto& v : u) v = nd(rng);
            g[0] = 95.0f;  // exp(-x) of large |x|: the split-scale and flush paths of the approximation
            if (g.size() > 2) g[2] = -95.0f;
            std::vector<float> a = g, b = g;
            swiglu_rows(a.data(), u.data(), n_rows, n);
            swiglu_rows_ref(b.data(), u.data(), n_rows, n);
            ASSERT_TRUE(same_bits(a, b)) << "rows=" << n_rows << " n=" << n << " seed=" << seed;
        }
    }
}

// Per row: groups of 8 from the row start through ggml_v_expf, the n % 8 last ones through libm.
TEST(OpsSwiglu, RowLeftoversUseLibmExpLikeGgml) {
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    const int64_t rows = 3, n = 172;  // stories260K's n_ff: 21 groups of 8 and 4 leftovers per row
    std::vector<float> g(size_t(rows * n)), u(g.size());
    for (auto& v : g) v = nd(rng);
    for (auto& v : u) v = nd(rng);
    std::vector<float> got = g;
    swiglu_rows(got.data(), u.data(), rows, n);
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < n; ++c) {
            const size_t i = size_t(r * n + c);
            const float s = c < 168 ? detail::ggml_silu(g[i]) : g[i] / (1.0f + std::exp(-g[i]));
            ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(s * u[i])) << r << "," << c;
        }
    }
    std::vector<float> one = g;
    swiglu(one.data(), u.data(), 8);  // swiglu(n) is one row
    std::vector<float> want = g;
    swiglu_rows_ref(want.data(), u.data(), 1, 8);
    EXPECT_TRUE(same_bits(std::vector<float>(one.begin(), one.begin() + 8),
                          std::vector<float>(want.begin(), want.begin() + 8)));
}

// silu(x) = x / (1 + exp(-x)): the exp error (< 2 ulp) plus the add and the division (0.5 ulp
// each) bound the relative error by about 3 ulp = 3 * 2^-23 of the result (where |x| is not so
// large that exp(-x) overflows: the result is then exactly 0 or x, as in double).
TEST(OpsSwiglu, CloseToExactSilu) {
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> ud(-80.0f, 80.0f);
    const int64_t n = 4099;
    std::vector<float> g(static_cast<size_t>(n)), u(size_t(n), 1.0f);
    for (auto& v : g) v = ud(rng);
    std::vector<float> s = g;
    swiglu_rows(s.data(), u.data(), 1, n);
    for (int64_t i = 0; i < n; ++i) {
        const double x = g[size_t(i)];
        const double want = x / (1.0 + std::exp(-x));
        ASSERT_LE(std::fabs(double(s[size_t(i)]) - want), 3.0 * 0x1p-23 * std::fabs(want) + 0x1p-149)
            << "x=" << x << " seed=" << seed;
    }
}

// The CPU backend applies SiLU per row of n_ff, as ggml does (leftovers of each row scalar).
TEST(OpsSwiglu, BackendAppliesRowsOfNff) {
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    const int64_t n_ff = 20, n_in = 8, n_tok = 3;  // 20 = 2 groups of 8 + 4 leftovers
    std::vector<float> w(size_t(n_ff * n_in)), x(size_t(n_tok * n_in)), up(size_t(n_tok * n_ff));
    for (auto& v : w) v = nd(rng);
    for (auto& v : x) v = nd(rng);
    auto be = make_backend("cpu", 2);
    be->matmul(WeightView{GgmlType::F32, w.data(), n_ff, n_in, size_t(n_in) * sizeof(float)}, x.data(), n_tok,
               up.data());
    std::vector<float> g(up.size());
    for (auto& v : g) v = nd(rng);
    std::vector<float> got = g, want = g;
    be->swiglu(got.data(), up.data(), n_tok, n_ff);
    swiglu_rows_ref(want.data(), up.data(), n_tok, n_ff);
    EXPECT_TRUE(same_bits(got, want)) << "seed=" << seed;
}

// ---- RMSNorm ----

// ggml_compute_forward_rms_norm_f32: sum of float squares in double, `const float mean = sum/ne00`,
// `scale = 1.0f/sqrtf(mean + eps)` in float; then ggml_vec_scale_f32 and ggml_mul by the weight.
float ggml_rms_scale(const float* x, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += double(x[i] * x[i]);
    const float mean = float(sum / double(n));
    return 1.0f / std::sqrt(mean + eps);
}

TEST(OpsRmsNorm, EqualsGgmlFormula) {
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (const int64_t dim : {1, 7, 8, 64, 97, 1000}) {
        const int64_t rows = 5;
        std::vector<float> x(size_t(rows * dim)), w(static_cast<size_t>(dim)), y(x.size());
        for (auto& v : x) v = nd(rng) * 0.05f;
        for (auto& v : w) v = 1.0f + 0.1f * nd(rng);
        rms_norm(x.data(), w.data(), rows, dim, 1e-5f, y.data());
        for (int64_t r = 0; r < rows; ++r) {
            const float s = ggml_rms_scale(x.data() + r * dim, dim, 1e-5f);
            double ss = 0.0;
            for (int64_t c = 0; c < dim; ++c) ss += double(x[size_t(r * dim + c)]) * x[size_t(r * dim + c)];
            const double exact_scale = 1.0 / std::sqrt(ss / double(dim) + 1e-5);
            for (int64_t c = 0; c < dim; ++c) {
                const size_t i = size_t(r * dim + c);
                ASSERT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>((x[i] * s) * w[c]));
                // three float roundings after an exact-ish scale: a few ulp of the result
                const double exact = double(x[i]) * exact_scale * double(w[c]);
                ASSERT_LE(std::fabs(double(y[i]) - exact), 4.0 * 0x1p-24 * std::fabs(exact) + 1e-30) << seed;
            }
        }
    }
    // in place
    std::vector<float> x(64), w(64, 1.0f), y(64);
    for (auto& v : x) v = nd(rng);
    rms_norm(x.data(), w.data(), 1, 64, 1e-6f, y.data());
    rms_norm(x.data(), w.data(), 1, 64, 1e-6f, x.data());
    EXPECT_TRUE(same_bits(x, y));
}

// The mean is rounded to float before eps is added in float; rounding mean + eps once in double
// (what this engine did before) gives another scale for a fraction of rows.
TEST(OpsRmsNorm, MeanRoundsToFloatBeforeEps) {
    std::mt19937 rng(1234);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t dim = 64;
    std::vector<float> x(dim), w(dim, 1.0f), y(dim);
    int differing = 0;
    for (int trial = 0; trial < 2000 && differing < 3; ++trial) {
        for (auto& v : x) v = nd(rng) * 0.01f;
        double sum = 0.0;
        for (const float v : x) sum += double(v * v);
        const float other = 1.0f / std::sqrt(float(sum / double(dim) + double(1e-5f)));
        const float ggml = ggml_rms_scale(x.data(), dim, 1e-5f);
        if (other == ggml) continue;
        ++differing;
        rms_norm(x.data(), w.data(), 1, dim, 1e-5f, y.data());
        for (int64_t c = 0; c < dim; ++c) ASSERT_EQ(y[size_t(c)], x[size_t(c)] * ggml);
    }
    EXPECT_GT(differing, 0) << "no input found where the two roundings differ";
}

// ---- RoPE ----

TEST(OpsRope, RotationIsTheFusedFormOfGgml) {
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (const bool neox : {false, true}) {
        const int64_t n_tok = 3, n_heads = 2, d = 64, n_rot = 48, pos0 = 17;
        const RopeParams p{n_rot, 10000.0f, neox};
        std::vector<float> x(size_t(n_tok * n_heads * d));
        for (auto& v : x) v = nd(rng);
        std::vector<float> y = x;
        rope(y.data(), n_tok, n_heads, d, pos0, p);
        const float theta_scale = std::pow(10000.0f, -2.0f / float(n_rot));
        int fused_differs = 0;
        for (int64_t t = 0; t < n_tok; ++t) {
            for (int64_t h = 0; h < n_heads; ++h) {
                const float* xs = x.data() + (t * n_heads + h) * d;
                const float* ys = y.data() + (t * n_heads + h) * d;
                float theta = float(pos0 + t);
                for (int64_t i0 = 0; i0 < n_rot; i0 += 2, theta *= theta_scale) {
                    const float c = std::cos(theta), s = std::sin(theta);
                    const int64_t a = neox ? i0 / 2 : i0, b = neox ? i0 / 2 + n_rot / 2 : i0 + 1;
                    const float x0 = xs[a], x1 = xs[b];
                    const volatile float p0 = x0 * c, p1 = x1 * s, p2 = x0 * s, p3 = x1 * c;
                    ASSERT_EQ(ys[a], std::fma(x0, c, -p1));
                    ASSERT_EQ(ys[b], std::fma(x0, s, p3));
                    fused_differs += (ys[a] != p0 - p1) + (ys[b] != p2 + p3);
                    // rotation: the norm of the pair is kept to a few ulp
                    const double n0 = std::hypot(double(x0), double(x1)), n1 = std::hypot(double(ys[a]), double(ys[b]));
                    ASSERT_NEAR(n1, n0, 4e-7 * n0 + 1e-30);
                }
                for (int64_t i = n_rot; i < d; ++i) ASSERT_EQ(ys[i], xs[i]);  // not rotated
            }
        }
        EXPECT_GT(fused_differs, 0) << "the check above does not tell the fused form from the plain one";
    }
}

// Against exact rotation angles pos * base^(-2i/n): ggml's angles come from repeated float
// multiplication, so their error grows with i and with pos (|theta| up to pos); for pos < 512
// the angle error stays below ~2e-4 rad, hence |x' - exact| < 2e-4 * |x| + rounding.
TEST(OpsRope, CloseToExactRotation) {
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t d = 128, n_tok = 4;
    for (const int64_t pos0 : {0, 100, 500}) {
        std::vector<float> x(size_t(n_tok * d));
        for (auto& v : x) v = nd(rng);
        std::vector<float> y = x;
        rope(y.data(), n_tok, 1, d, pos0, RopeParams{d, 10000.0f, false});
        for (int64_t t = 0; t < n_tok; ++t) {
            for (int64_t i = 0; i < d / 2; ++i) {
                const double th = double(pos0 + t) * std::pow(10000.0, -2.0 * double(i) / double(d));
                const double x0 = x[size_t(t * d + 2 * i)], x1 = x[size_t(t * d + 2 * i + 1)];
                const double e0 = x0 * std::cos(th) - x1 * std::sin(th), e1 = x0 * std::sin(th) + x1 * std::cos(th);
                const double tol = 2e-4 * std::hypot(x0, x1) + 1e-6;
                ASSERT_NEAR(y[size_t(t * d + 2 * i)], e0, tol) << "pos " << pos0 + t << " i " << i;
                ASSERT_NEAR(y[size_t(t * d + 2 * i + 1)], e1, tol) << "pos " << pos0 + t << " i " << i;
            }
        }
    }
}

}  // namespace
}  // namespace vxq::cpu

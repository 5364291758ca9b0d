// CPU weight matmul: the optimized kernels equal the scalar reference bit for bit (the reference
// follows llama.cpp b4748's AVX2 summation order, see kernels/cpu/matmul.cpp), the reference is
// close to an exact double-precision dot, and the q8_0 quantizer / row dequantizers are right.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "core/thread_pool.h"
#include "formats/ggml_types.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_avx2.h"
#include "support/isa.h"
#include "support/random_weights.h"
#include "support/seed.h"

namespace vxq::cpu {
namespace {

using test::Weights;
using test::random_weights;

using test::fresh_seed;


std::vector<float> random_acts(int64_t n, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = nd(rng);
    // a few exact ties and outliers, as real activations have
    for (size_t i = 0; i < x.size(); i += 37) x[i] = float(int(x[i] * 8)) * 0.5f;
    for (size_t i = 5; i < x.size(); i += 101) x[i] *= 20.0f;
    return x;
}

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

// Exact-ish double dot of what the product really multiplies (activations in the dot type),
// computed independently of the kernels (dequantize_row, quantize_row_q8_0 then d*q), together
// with sum |w_i x_i| for the error bound.
void naive_dot(const Weights& w, int64_t r, const float* x, double& dot, double& mag) {
    const int64_t k = w.cols;
    std::vector<float> wr(static_cast<size_t>(k));
    dequantize_row(w.view(), r, wr.data());
    std::vector<double> xa(static_cast<size_t>(k));
    if (w.type == GgmlType::Q8_0 || w.type == GgmlType::Q4_0) {
        std::vector<BlockQ8_0> q(static_cast<size_t>(k / 32));
        quantize_row_q8_0(x, q.data(), k);
        for (int64_t i = 0; i < k; ++i)
            xa[size_t(i)] =
                double(fp16_to_fp32(q[size_t(i / 32)].d)) * q[size_t(i / 32)].qs[i % 32];
    } else {
        for (int64_t i = 0; i < k; ++i) {
            if (w.type == GgmlType::F16)
                xa[size_t(i)] = round_fp16(x[i]);
            else if (w.type == GgmlType::BF16)
                xa[size_t(i)] = bf16_to_fp32(fp32_to_bf16(x[i]));
            else
                xa[size_t(i)] = x[i];
        }
    }
    dot = 0;
    mag = 0;
    for (int64_t i = 0; i < k; ++i) {
        dot += double(wr[size_t(i)]) * xa[size_t(i)];
        mag += std::fabs(double(wr[size_t(i)]) * xa[size_t(i)]);
    }
}

const GgmlType kAllTypes[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0,
                              GgmlType::Q4_0};

class MatmulExact : public ::testing::TestWithParam<GgmlType> {};

TEST_P(MatmulExact, OptimizedEqualsReferenceBitForBit) {
    const GgmlType type = GetParam();
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + " type " + std::string(ggml_type_name(type)));
    std::mt19937 rng(seed);

    std::vector<int64_t> cols = {32, 64, 96, 384, 1024};
    if (type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16) {
        cols.push_back(8);    // k % 32 != 0 with k % 8 == 0
        cols.push_back(172);  // k % 8 != 0 (stories260K's ffn)
        cols.push_back(40);
    }
    const int64_t rows_list[] = {1, 7, 8, 33, 100, 128};
    const int64_t tokens_list[] = {1, 2, 5, 17, 64};
    ThreadPool pool1(1), pool2(2);

    for (int64_t k : cols) {
        for (int64_t m : rows_list) {
            const Weights w = random_weights(type, m, k, rng);
            const int64_t max_n = 64;
            const std::vector<float> x = random_acts(max_n * k, rng);
            for (int64_t n : tokens_list) {
                SCOPED_TRACE("rows " + std::to_string(m) + " cols " + std::to_string(k) +
                             " tokens " + std::to_string(n) + " order " +
                             dot_order_name(dot_order(w.view(), n)));
                std::vector<float> ref(static_cast<size_t>(n * m)), y1(size_t(n * m), -1.f),
                    y2(size_t(n * m), -2.f);
                matmul_ref(w.view(), x.data(), n, ref.data());
                matmul(w.view(), x.data(), n, y1.data(), pool1);
                matmul(w.view(), x.data(), n, y2.data(), pool2);
                int bad1 = 0, bad2 = 0;
                for (size_t i = 0; i < ref.size(); ++i) {
                    if (bits(y1[i]) != bits(ref[i]) && bad1++ < 3)
                        ADD_FAILURE()
                            << "1 thread: y[" << i << "] " << y1[i] << " vs ref " << ref[i];
                    if (bits(y2[i]) != bits(ref[i]) && bad2++ < 3)
                        ADD_FAILURE()
                            << "2 threads: y[" << i << "] " << y2[i] << " vs ref " << ref[i];
                }
                EXPECT_EQ(bad1, 0);
                EXPECT_EQ(bad2, 0);

                // the reference against an exact dot: forward error of a chain of L float roundings
                // (fma chain per lane + reduction levels) is at most about L * 2^-24 * sum |w x|.
                // L = k/8 + 8 covers every order used here (longest: lanes8, k/8 fmas + 3 adds).
                if (n <= 2) {
                    for (int64_t t = 0; t < n; ++t) {
                        for (int64_t r = 0; r < m; ++r) {
                            double dot, mag;
                            naive_dot(w, r, x.data() + t * k, dot, mag);
                            const double tol =
                                double(k / 8 + 8) * std::ldexp(1.0, -24) * mag + 1e-30;
                            const double got = ref[size_t(t * m + r)];
                            ASSERT_LE(std::fabs(got - dot), tol)
                                << "ref " << got << " exact " << dot << " row " << r << " token "
                                << t;
                        }
                    }
                }
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatmulExact, ::testing::ValuesIn(kAllTypes),
                         [](const ::testing::TestParamInfo<GgmlType>& info) {
                             return std::string(ggml_type_name(info.param));
                         });

TEST(MatmulOrder, RulesOfLlamaCppB4748) {
    auto v = [](GgmlType t, int64_t m, int64_t k) { return WeightView{t, nullptr, m, k, 0}; };
    EXPECT_EQ(dot_order(v(GgmlType::F16, 384, 384), 2), DotOrder::Lanes8);
    EXPECT_EQ(dot_order(v(GgmlType::F16, 384, 384), 1), DotOrder::VecF16);  // n < 2: no sgemm
    EXPECT_EQ(dot_order(v(GgmlType::F16, 33, 384), 64), DotOrder::VecF16);  // m % 4 != 0
    EXPECT_EQ(dot_order(v(GgmlType::F32, 64, 172), 64), DotOrder::VecF32);  // k % 8 != 0
    EXPECT_EQ(dot_order(v(GgmlType::F32, 64, 64), 5), DotOrder::Lanes8);
    EXPECT_EQ(dot_order(v(GgmlType::BF16, 64, 64), 1), DotOrder::VecBF16);
    EXPECT_EQ(dot_order(v(GgmlType::Q8_0, 4096, 384), 1), DotOrder::Q0Lanes);
    EXPECT_EQ(dot_order(v(GgmlType::Q8_0, 4096, 384), 512), DotOrder::Q0Lanes);
    EXPECT_EQ(dot_order(v(GgmlType::Q4_0, 1024, 384), 1), DotOrder::Q4Repack);  // repacked 8x8
    EXPECT_EQ(dot_order(v(GgmlType::Q4_0, 100, 384), 7), DotOrder::Q0Lanes);
}

// The orders really differ: the same numbers summed as lanes8 (n >= 2) and as ggml_vec_dot_f16
// (n == 1) give different bits somewhere, so a wrong choice of rule would be visible.
TEST(MatmulOrder, TokenCountChangesF16Rounding) {
    std::mt19937 rng(12345);
    const Weights w = random_weights(GgmlType::F16, 64, 1024, rng);
    const std::vector<float> x = random_acts(2 * 1024, rng);
    std::vector<float> one(64), two(128);
    matmul_ref(w.view(), x.data(), 1, one.data());
    matmul_ref(w.view(), x.data(), 2, two.data());
    int differ = 0;
    for (int r = 0; r < 64; ++r) differ += bits(one[size_t(r)]) != bits(two[size_t(r)]);
    EXPECT_GT(differ, 0);
}

TEST(MatmulEdge, ZeroColumnsAndIsa) {
    ThreadPool pool(2);
    std::vector<float> y(6, 1.0f);
    const float x[3] = {1, 2, 3};
    matmul(WeightView{GgmlType::F32, x, 2, 0, 0}, x, 3, y.data(), pool);
    for (float v : y) EXPECT_EQ(v, 0.0f);
    const std::string isa = matmul_isa();
    EXPECT_TRUE(isa == "avx2" || isa == "scalar");
}

// ---------------------------------------------------------------------------------------------

TEST(QuantizeQ8_0, KnownValuesTiesToEven) {
    // amax = 127 makes id exactly 1, so the codes are x rounded half to even
    float x[32] = {127.f, 0.5f,  1.5f,   2.5f,   -0.5f,  -1.5f,
                   -2.5f, 3.49f, -3.51f, 126.5f, -127.f, 0.f};
    for (int i = 12; i < 32; ++i) x[i] = float(i) - 0.5f;  // 11.5, 12.5, ... all ties
    BlockQ8_0 b;
    quantize_row_q8_0(x, &b, 32);
    EXPECT_EQ(b.d, fp32_to_fp16(1.0f));
    const int expect[12] = {127, 0, 2, 2, 0, -2, -2, 3, -4, 126, -127, 0};
    for (int i = 0; i < 12; ++i) EXPECT_EQ(b.qs[i], expect[i]) << "i=" << i;
    for (int i = 12; i < 32; ++i) {
        const int even = (i % 2 == 0) ? i : i - 1;  // i - 0.5 -> nearest even of {i-1, i}
        EXPECT_EQ(b.qs[i], even) << "i=" << i;
    }
}

TEST(QuantizeQ8_0, AllZeroBlockHasZeroScaleAndCodes) {
    float x[64] = {};
    x[40] = -0.0f;
    BlockQ8_0 b[2];
    std::memset(b, 0x5a, sizeof(b));
    quantize_row_q8_0(x, b, 64);
    for (const auto& blk : b) {
        EXPECT_EQ(blk.d, 0u);
        for (int8_t q : blk.qs) EXPECT_EQ(q, 0);
    }
}

TEST(QuantizeQ8_0, ReconstructsWithinHalfAStep) {
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const std::vector<float> x = random_acts(32 * 200, rng);
    std::vector<BlockQ8_0> q(200);
    quantize_row_q8_0(x.data(), q.data(), int64_t(x.size()));
    for (size_t b = 0; b < q.size(); ++b) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + size_t(j)]));
        const double d_exact = double(amax) / 127.0;
        const double d16 = fp16_to_fp32(q[b].d);
        EXPECT_NEAR(d16, d_exact, d_exact * std::ldexp(1.0, -11));  // fp16 rounding of the scale
        for (int j = 0; j < 32; ++j) {
            const double xv = x[b * 32 + size_t(j)];
            // codes are x / d rounded: within half a step of the exact scale ...
            EXPECT_LE(std::fabs(xv - q[b].qs[j] * d_exact), 0.5 * d_exact * (1 + 1e-5))
                << b << "," << j;
            // ... and within d/2 plus the scale's own rounding once reconstructed with the stored d
            EXPECT_LE(std::fabs(xv - q[b].qs[j] * d16),
                      0.5 * d16 + 127 * std::fabs(d16 - d_exact) + 1e-12);
        }
    }
}

bool cpu_has_avx2() {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
}

TEST(QuantizeQ8_0, ScalarEqualsAvx2) {
    VXQ_REQUIRE_AVX2(cpu_has_avx2());
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    std::vector<float> x = random_acts(32 * 300, rng);
    // edge blocks: ties at every multiple, tiny, huge, subnormal scales
    for (int j = 0; j < 32; ++j) x[size_t(j)] = float(j - 16) * 0.5f + (j == 0 ? 127.f : 0.f);
    for (int j = 32; j < 64; ++j) x[size_t(j)] = 1e-30f * float(j - 40);
    for (int j = 64; j < 96; ++j) x[size_t(j)] = 3e38f * float((j % 5) - 2) / 2;
    for (int j = 96; j < 128; ++j) x[size_t(j)] = 1e-42f * float(j - 100);
    std::vector<BlockQ8_0> a(300), b(300);
    std::vector<float> d(300);
    quantize_row_q8_0(x.data(), a.data(), int64_t(x.size()));
    avx2::quantize_q8_0(x.data(), b.data(), d.data(), int64_t(x.size()));
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(BlockQ8_0)), 0);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(bits(d[i]), bits(fp16_to_fp32(a[i].d)));
}

TEST(QuantizeQ8_0, ActivationRoundingMatchesFp16Bf16Helpers) {
    VXQ_REQUIRE_AVX2(cpu_has_avx2());
    std::mt19937 rng(fresh_seed());
    std::vector<float> x = random_acts(1000, rng);
    x.push_back(std::numeric_limits<float>::quiet_NaN());
    x.push_back(-std::numeric_limits<float>::infinity());
    x.push_back(65520.f);
    x.push_back(1e-8f);
    x.push_back(std::bit_cast<float>(0x3f808000u));  // bf16 tie, even
    x.push_back(std::bit_cast<float>(0x3f818000u));  // bf16 tie, odd
    std::vector<float> h(x.size()), b(x.size());
    avx2::round_f16(x.data(), h.data(), int64_t(x.size()));
    avx2::round_bf16(x.data(), b.data(), int64_t(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
        EXPECT_EQ(bits(h[i]), bits(round_fp16(x[i]))) << i;
        EXPECT_EQ(bits(b[i]), bits(bf16_to_fp32(fp32_to_bf16(x[i])))) << i;
    }
}

// ---------------------------------------------------------------------------------------------

template <typename Block>
WeightView view_of(GgmlType t, const std::vector<Block>& v, int64_t rows, int64_t cols) {
    return WeightView{t, v.data(), rows, cols, ggml_row_bytes(t, cols)};
}

TEST(DequantizeRow, F32F16Bf16) {
    const std::vector<float> f = {1.5f, -2.f, 0.f, 3e-3f, 7.f, 8.f, -9.f, 10.f};  // 2 rows of 4
    float out[4];
    dequantize_row(view_of(GgmlType::F32, f, 2, 4), 1, out);
    EXPECT_EQ(out[0], 7.f);
    EXPECT_EQ(out[3], 10.f);

    const std::vector<uint16_t> h = {0x3c00, 0xc000, 0x0001, 0x7bff,
                                     0x8000, 0x3555, 0x7c00, 0x0400};
    dequantize_row(view_of(GgmlType::F16, h, 2, 4), 0, out);
    EXPECT_EQ(out[0], 1.0f);
    EXPECT_EQ(out[1], -2.0f);
    EXPECT_EQ(out[2], std::ldexp(1.0f, -24));
    EXPECT_EQ(out[3], 65504.0f);
    dequantize_row(view_of(GgmlType::F16, h, 2, 4), 1, out);
    EXPECT_EQ(bits(out[0]), 0x80000000u);
    EXPECT_EQ(out[1], 0.333251953125f);
    EXPECT_TRUE(std::isinf(out[2]));
    EXPECT_EQ(out[3], std::ldexp(1.0f, -14));

    const std::vector<uint16_t> bf = {0x3f80, 0xc040, 0x0000, 0x4049};
    dequantize_row(view_of(GgmlType::BF16, bf, 1, 4), 0, out);
    EXPECT_EQ(out[0], 1.0f);
    EXPECT_EQ(out[1], -3.0f);
    EXPECT_EQ(out[2], 0.0f);
    EXPECT_EQ(out[3], 3.140625f);
}

TEST(DequantizeRow, Q8_0) {
    std::vector<BlockQ8_0> b(4);  // 2 rows x 2 blocks
    for (int i = 0; i < 4; ++i) {
        b[size_t(i)].d = i == 3 ? 0x3800 /* 0.5 */ : 0x3c00;
        for (int j = 0; j < 32; ++j) b[size_t(i)].qs[j] = int8_t(j * 8 - 127 + i);
    }
    b[3].qs[0] = -128;
    std::vector<float> out(64);
    dequantize_row(view_of(GgmlType::Q8_0, b, 2, 64), 1, out.data());
    for (int j = 0; j < 32; ++j) EXPECT_EQ(out[size_t(j)], float(j * 8 - 127 + 2)) << j;
    EXPECT_EQ(out[32], -64.0f);
    for (int j = 1; j < 32; ++j) EXPECT_EQ(out[size_t(32 + j)], float(j * 8 - 127 + 3) * 0.5f) << j;
}

TEST(DequantizeRow, Q4_0NibbleOrder) {
    std::vector<BlockQ4_0> b(2);  // 1 row x 2 blocks
    b[0].d = 0x4000;              // 2.0
    b[1].d = 0xb800;              // -0.5
    for (int j = 0; j < 16; ++j) {
        b[0].qs[j] = uint8_t((j & 15) | ((15 - j) << 4));  // value j: j, value j+16: 15-j
        b[1].qs[j] = uint8_t(0x8 | (0x0 << 4));            // 0 and -8
    }
    std::vector<float> out(64);
    dequantize_row(view_of(GgmlType::Q4_0, b, 1, 64), 0, out.data());
    for (int j = 0; j < 16; ++j) {
        EXPECT_EQ(out[size_t(j)], float(j - 8) * 2.0f) << j;
        EXPECT_EQ(out[size_t(j + 16)], float(15 - j - 8) * 2.0f) << j;
        EXPECT_EQ(out[size_t(32 + j)], 0.0f) << j;
        EXPECT_EQ(out[size_t(48 + j)], 4.0f) << j;  // (0 - 8) * -0.5
    }
}

}  // namespace
}  // namespace vxq::cpu

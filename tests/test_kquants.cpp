// Super-block weights on the CPU (kernels/cpu/matmul_kquants.h): Q6_K, TQ1_0, TQ2_0 (and TQ2_G128) with q8_K
// activations. The decoders against llama-quantize's real files (the ternary model's TQ tensors
// hold exactly its f16 weights), the q8_K quantizer against its definition, the dot product
// against a double-precision sum, and the threaded matmul against the scalar reference.
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
#include "formats/gguf.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_kquants.h"
#include "support/assets.h"
#include "support/isa.h"
#include "support/random_weights.h"
#include "support/seed.h"

namespace vxq::cpu {
namespace {

using test::fresh_seed;

std::vector<float> row_f32(const GgufFile& f, const GgufTensorInfo& t, int64_t r) {
    const int64_t cols = t.ne[0];
    const WeightView w{t.type, f.tensor_data(t), t.n_elements / cols, cols, ggml_row_bytes(t.type, cols)};
    std::vector<float> out(static_cast<size_t>(cols));
    dequantize_row(w, r, out.data());
    return out;
}

TEST(QuantizeQ8_K, ScaleFromTheFirstLargestValueAndTiesToEven) {
    std::vector<float> x(kQK_K, 0.0f);
    x[3] = -2.54f;  // the largest magnitude, negative: d = 1 / (-127 / -2.54) > 0
    x[7] = 2.54f;   // as large, later: not the one that sets the scale
    x[10] = 0.01f;  // 0.01 * 127 / 2.54 = 0.5: a tie, to even (0)
    x[11] = 0.03f;  // 1.5: to 2
    x[12] = -0.05f; // -2.5: to -2
    BlockQ8_K b;
    quantize_row_q8_K(x.data(), &b, kQK_K);
    const float iscale = -127.f / -2.54f;
    EXPECT_EQ(b.d, 1 / iscale);
    EXPECT_EQ(b.qs[3], -127);
    EXPECT_EQ(b.qs[7], 127);
    EXPECT_EQ(b.qs[10], int8_t(std::nearbyint(iscale * 0.01f)));
    EXPECT_EQ(b.qs[11], int8_t(std::nearbyint(iscale * 0.03f)));
    EXPECT_EQ(b.qs[12], int8_t(std::nearbyint(iscale * -0.05f)));
    EXPECT_EQ(b.bsums[0], b.qs[3] + b.qs[7] + b.qs[10] + b.qs[11] + b.qs[12]);
    for (int g = 1; g < 16; ++g) EXPECT_EQ(b.bsums[g], 0);

    std::fill(x.begin(), x.end(), 0.0f);
    quantize_row_q8_K(x.data(), &b, kQK_K);
    EXPECT_EQ(b.d, 0.0f);
    for (int j = 0; j < kQK_K; ++j) ASSERT_EQ(b.qs[j], 0);
    for (int g = 0; g < 16; ++g) ASSERT_EQ(b.bsums[g], 0);
}

TEST(QuantizeQ8_K, ReconstructsWithinHalfAStep) {
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    const std::vector<float> x = test::random_floats(4 * kQK_K, rng, 3.0f);
    std::vector<BlockQ8_K> b(4);
    quantize_row_q8_K(x.data(), b.data(), int64_t(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
        const BlockQ8_K& blk = b[i / kQK_K];
        ASSERT_LE(std::fabs(blk.d * blk.qs[i % kQK_K] - x[i]), std::fabs(blk.d) * 0.5001f) << "seed " << seed << " i " << i;
    }
}

// llama-quantize stored the ternary model's linear weights as TQ2_0 and TQ1_0 without loss: every
// row decodes to the f16 file's row, bit for bit (llama.cpp's dequantize_row_tq*_0 semantics).
TEST(DequantizeKQuant, TernaryFilesDecodeToTheF16Weights) {
    VXQ_REQUIRE_ASSET("assets/models/vxq-ternary-h64-f16.gguf");
    const GgufFile ref = GgufFile::open(test::shared_path("assets/models/vxq-ternary-h64-f16.gguf"));
    for (const char* file : {"vxq-ternary-h64-tq2_0.gguf", "vxq-ternary-h64-tq1_0.gguf"}) {
        VXQ_REQUIRE_ASSET(std::string("assets/models/") + file);
        const GgufFile f = GgufFile::open(test::shared_path(std::string("assets/models/") + file));
        int checked = 0;
        for (const GgufTensorInfo& t : f.tensors()) {
            if (t.type != GgmlType::TQ1_0 && t.type != GgmlType::TQ2_0) continue;
            const GgufTensorInfo* r = ref.find_tensor(t.name);
            ASSERT_NE(r, nullptr) << t.name;
            ASSERT_EQ(r->type, GgmlType::F16);
            for (int64_t row = 0; row < t.n_elements / t.ne[0]; row += 7) {
                ASSERT_EQ(row_f32(f, t, row), row_f32(ref, *r, row)) << file << " " << t.name << " row " << row;
            }
            ++checked;
        }
        EXPECT_EQ(checked, 8 * 7) << file;  // 7 linear weights per layer, 8 layers
    }
}

// The TQ files keep token_embd in Q6_K (llama-quantize's choice): it decodes close to the f16
// embedding (6-bit codes with an 8-bit scale per 16 values: ~1 % relative RMS error).
TEST(DequantizeKQuant, Q6KEmbeddingIsCloseToTheF16One) {
    VXQ_REQUIRE_ASSET("assets/models/vxq-ternary-h64-f16.gguf");
    VXQ_REQUIRE_ASSET("assets/models/vxq-ternary-h64-tq2_0.gguf");
    const GgufFile ref = GgufFile::open(test::shared_path("assets/models/vxq-ternary-h64-f16.gguf"));
    const GgufFile f = GgufFile::open(test::shared_path("assets/models/vxq-ternary-h64-tq2_0.gguf"));
    const GgufTensorInfo* t = f.find_tensor("token_embd.weight");
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->type, GgmlType::Q6_K);
    double err = 0.0, norm = 0.0;
    for (int64_t row = 0; row < t->n_elements / t->ne[0]; row += 3) {
        const auto a = row_f32(f, *t, row), b = row_f32(ref, *ref.find_tensor("token_embd.weight"), row);
        for (size_t i = 0; i < a.size(); ++i) {
            err += double(a[i] - b[i]) * (a[i] - b[i]);
            norm += double(b[i]) * b[i];
        }
    }
    EXPECT_LT(std::sqrt(err / norm), 0.02);
    EXPECT_GT(std::sqrt(err / norm), 1e-4);  // not the f16 data read twice
}

// Random rows of a super-block type and one random activation row quantized to q8_K.
struct DotCase {
    test::Weights w;
    std::vector<BlockQ8_K> xq;
    const uint8_t* row(int64_t r) const { return w.bytes.data() + size_t(r) * w.view().row_bytes; }
};
DotCase dot_case(GgmlType type, int64_t rows, int64_t cols, float x_scale, std::mt19937& rng) {
    DotCase c{test::random_weights(type, rows, cols, rng), std::vector<BlockQ8_K>(static_cast<size_t>(cols / kQK_K))};
    const std::vector<float> x = test::random_floats(static_cast<size_t>(cols), rng, x_scale);
    quantize_row_q8_K(x.data(), c.xq.data(), cols);
    return c;
}

// The dot of a row with q8_K activations: exact integers per block, float lanes after; within
// float rounding of the double-precision sum of the decoded values.
TEST(DotKQuant, CloseToTheDecodedDoubleSum) {
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    for (GgmlType type : {GgmlType::Q6_K, GgmlType::TQ1_0, GgmlType::TQ2_0, GgmlType::TQ2_G128}) {
        for (int64_t cols : {256, 512, 1536, 4096}) {
            const DotCase dc = dot_case(type, 3, cols, 1.0f, rng);
            for (int64_t r = 0; r < 3; ++r) {
                std::vector<float> wr(static_cast<size_t>(cols));
                dequantize_row(dc.w.view(), r, wr.data());
                double exact = 0.0, mag = 0.0;
                for (int64_t c = 0; c < cols; ++c) {
                    const BlockQ8_K& xb = dc.xq[size_t(c / kQK_K)];
                    const double xv = double(xb.d) * xb.qs[c % kQK_K];
                    exact += double(wr[size_t(c)]) * xv;
                    mag += std::fabs(double(wr[size_t(c)]) * xv);
                }
                const float got = dot_kquant_q8_K(type, dc.row(r), dc.xq.data(), cols / kQK_K);
                EXPECT_NEAR(got, exact, 1e-5 * mag + 1e-30)
                    << ggml_type_name(type) << " cols " << cols << " row " << r << " seed " << seed;
            }
        }
    }
}

// TQ1_0 rewritten as TQ2_0 (what the CUDA backend uploads for TQ1_0 weights): every value bit for
// bit and the same dot with q8_K activations, on random rows and on hand-made blocks (a negative
// scale, t = -1 everywhere at the largest fp16 scale, a block of zeros in its first 240 values).
TEST(DotKQuant, Tq1RepackedAsTq2KeepsEveryValue) {
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    for (int64_t cols : {256, 1536}) {
        DotCase dc = dot_case(GgmlType::TQ1_0, 3, cols, 1.0f, rng);
        auto* first = reinterpret_cast<BlockTQ1_0*>(dc.w.bytes.data());
        first[0].d = fp32_to_fp16(-0.375f);
        if (cols > 256) {
            std::memset(first[1].qs, 0, sizeof first[1].qs);  // digit 0: t = -1 everywhere
            first[1].d = fp32_to_fp16(65504.0f);
            for (uint8_t& q : first[2].qs) q = 128;  // every digit ((128 * 3^n mod 256) * 3) >> 8 = 1: zeros
        }
        for (int64_t r = 0; r < 3; ++r) {
            SCOPED_TRACE(testing::Message() << "cols " << cols << " row " << r << " seed " << seed);
            std::vector<uint8_t> tq2(ggml_row_bytes(GgmlType::TQ2_0, cols));
            tq1_0_row_as_tq2_0(dc.row(r), cols, tq2.data());
            std::vector<float> a(static_cast<size_t>(cols)), b(a.size());
            dequantize_row_kquant(GgmlType::TQ1_0, dc.row(r), cols, a.data());
            dequantize_row_kquant(GgmlType::TQ2_0, tq2.data(), cols, b.data());
            EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
            const float x = dot_kquant_q8_K(GgmlType::TQ1_0, dc.row(r), dc.xq.data(), cols / kQK_K);
            const float y = dot_kquant_q8_K(GgmlType::TQ2_0, tq2.data(), dc.xq.data(), cols / kQK_K);
            EXPECT_EQ(x, y);
        }
    }
}

// Q6_K unpacked into values, 16-value scales and d (what the CUDA backend uploads for Q6_K
// weights, its GEMV's units and its embedding): d * scale * q equals the CPU's dequantization bit
// for bit, on random rows and on hand-made blocks (a negative d, the largest fp16 d with scales
// -128 / 127 and the extreme codes -32 / 31).
TEST(DotKQuant, Q6KUnpackedKeepsEveryValue) {
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    for (int64_t cols : {256, 1024}) {
        DotCase dc = dot_case(GgmlType::Q6_K, 3, cols, 1.0f, rng);
        auto* first = reinterpret_cast<BlockQ6_K*>(dc.w.bytes.data());
        first[0].d = fp32_to_fp16(-0.0078125f);
        if (cols > 256) {
            first[1].d = fp32_to_fp16(65504.0f);
            for (int j = 0; j < 16; ++j) first[1].scales[j] = int8_t(j % 2 ? 127 : -128);
            std::memset(first[1].ql, 0, sizeof first[1].ql);  // q = 0 - 32
            std::memset(first[1].qh, 0, sizeof first[1].qh);
            std::memset(first[2].ql, 0xff, sizeof first[2].ql);  // q = 63 - 32
            std::memset(first[2].qh, 0xff, sizeof first[2].qh);
        }
        for (int64_t r = 0; r < 3; ++r) {
            SCOPED_TRACE(testing::Message() << "cols " << cols << " row " << r << " seed " << seed);
            std::vector<int8_t> q(static_cast<size_t>(cols)), sc(size_t(cols / 16));
            std::vector<uint16_t> d(size_t(cols / kQK_K));
            q6_K_row_unpacked(dc.row(r), cols, q.data(), sc.data(), d.data());
            std::vector<float> want(static_cast<size_t>(cols));
            dequantize_row_kquant(GgmlType::Q6_K, dc.row(r), cols, want.data());
            for (int64_t e = 0; e < cols; ++e) {
                const float got = fp16_to_fp32(d[size_t(e / kQK_K)]) * float(sc[size_t(e / 16)]) * float(q[size_t(e)]);
                ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want[size_t(e)])) << "value " << e;
                ASSERT_GE(q[size_t(e)], -32);
                ASSERT_LE(q[size_t(e)], 31);
            }
            if (r == 0 && cols > 256) {
                EXPECT_EQ(q[256], -32);
                EXPECT_EQ(q[512], 31);
            }
        }
    }
}

TEST(DotKQuant, Avx2EqualsScalar) {
    VXQ_REQUIRE_AVX2(std::string(matmul_isa()) == "avx2");
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    for (GgmlType type : {GgmlType::Q6_K, GgmlType::TQ1_0, GgmlType::TQ2_0, GgmlType::TQ2_G128}) {
        for (int64_t cols : {256, 512, 1536, 4096}) {
            const DotCase dc = dot_case(type, 4, cols, cols == 512 ? 30.0f : 1.0f, rng);
            for (int64_t r = 0; r < 4; ++r) {
                const float a = dot_kquant_q8_K(type, dc.row(r), dc.xq.data(), cols / kQK_K);
                const float b = avx2::dot_kquant_q8_K(type, dc.row(r), dc.xq.data(), cols / kQK_K);
                EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0)
                    << ggml_type_name(type) << " cols " << cols << " row " << r << ": " << a << " vs " << b << " seed " << seed;
            }
        }
    }
}

// The multi-token kernel (a block's digits unpacked once for up to 4 tokens) against the one-token
// kernel, token by token, bit for bit; tokens kept apart by a stride of more than a row.
TEST(DotKQuant, MultiTokenEqualsOneToken) {
    VXQ_REQUIRE_AVX2(std::string(matmul_isa()) == "avx2");
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    for (GgmlType type : {GgmlType::Q6_K, GgmlType::TQ1_0, GgmlType::TQ2_0, GgmlType::TQ2_G128}) {
        for (int64_t cols : {256, 1536}) {
            const int64_t nb = cols / kQK_K, stride = nb + 1;
            const test::Weights w = test::random_weights(type, 2, cols, rng);
            std::vector<BlockQ8_K> xq(size_t(avx2::kMultiTokens * stride));
            for (int j = 0; j < avx2::kMultiTokens; ++j) {
                const std::vector<float> x = test::random_floats(static_cast<size_t>(cols), rng, 1.0f);
                quantize_row_q8_K(x.data(), xq.data() + j * stride, cols);
            }
            for (int n_tok = 1; n_tok <= avx2::kMultiTokens; ++n_tok) {
                float out[avx2::kMultiTokens];
                const uint8_t* row = w.bytes.data() + w.view().row_bytes;
                avx2::dot_kquant_q8_K_multi(type, row, xq.data(), stride, nb, n_tok, out);
                for (int j = 0; j < n_tok; ++j) {
                    const float one = avx2::dot_kquant_q8_K(type, row, xq.data() + j * stride, nb);
                    EXPECT_EQ(std::memcmp(&one, &out[j], sizeof one), 0)
                        << ggml_type_name(type) << " cols " << cols << " n_tok " << n_tok << " token " << j << ": " << out[j]
                        << " vs " << one << " seed " << seed;
                }
            }
        }
    }
}

// The decode kernel of the ternary types (several rows per activation load) against the one-row
// kernel, row by row, bit for bit, for every row count it takes.
TEST(DotKQuant, RowsEqualOneRow) {
    VXQ_REQUIRE_AVX2(std::string(matmul_isa()) == "avx2");
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    for (GgmlType type : {GgmlType::TQ1_0, GgmlType::TQ2_0, GgmlType::TQ2_G128}) {
        ASSERT_TRUE(avx2::dot_kquant_rows_takes(type));
        for (int64_t cols : {256, 512, 1536}) {
            const DotCase dc = dot_case(type, avx2::kRowsTernary, cols, cols == 512 ? 30.0f : 1.0f, rng);
            const size_t row_bytes = size_t(dc.row(1) - dc.row(0));
            for (int n_rows = 1; n_rows <= avx2::kRowsTernary; ++n_rows) {
                float out[avx2::kRowsTernary];
                avx2::dot_kquant_q8_K_rows(type, dc.row(0), row_bytes, n_rows, dc.xq.data(), cols / kQK_K, out);
                for (int r = 0; r < n_rows; ++r) {
                    const float one = avx2::dot_kquant_q8_K(type, dc.row(r), dc.xq.data(), cols / kQK_K);
                    EXPECT_EQ(std::memcmp(&one, &out[r], sizeof one), 0)
                        << ggml_type_name(type) << " cols " << cols << " rows " << n_rows << " row " << r << ": " << out[r]
                        << " vs " << one << " seed " << seed;
                }
            }
        }
    }
    EXPECT_FALSE(avx2::dot_kquant_rows_takes(GgmlType::Q6_K));
}

TEST(MatmulKQuant, ThreadedEqualsReferenceAndOrderIsNamed) {
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    ThreadPool pool(3);
    for (GgmlType type : {GgmlType::Q6_K, GgmlType::TQ1_0, GgmlType::TQ2_0, GgmlType::TQ2_G128}) {
        for (auto [rows, cols, n] : {std::tuple<int64_t, int64_t, int64_t>{1, 256, 1}, {7, 512, 3}, {33, 768, 2}, {130, 1536, 5}, {9, 512, 11}, {37, 512, 1}, {130, 1536, 1}, {21, 512, 37}}) {
            const test::Weights w = test::random_weights(type, rows, cols, rng);
            EXPECT_EQ(dot_order(w.view(), n), DotOrder::KLanes);
            const std::vector<float> x = test::random_floats(static_cast<size_t>(n * cols), rng, 1.0f);
            std::vector<float> a(static_cast<size_t>(n * rows)), b(a.size());
            matmul(w.view(), x.data(), n, a.data(), pool);
            matmul_ref(w.view(), x.data(), n, b.data());
            EXPECT_EQ(a, b) << ggml_type_name(type) << " " << rows << "x" << cols << " n " << n << " seed " << seed;
        }
    }
    EXPECT_STREQ(dot_order_name(DotOrder::KLanes), "k_lanes");
}

}  // namespace
}  // namespace vxq::cpu

// Weight quantization (formats/ggml_quants.h's ternary quantizers, model/quantize.h's file
// quantizer, `vxq quantize`): the ternary packers against the CPU decoders on fresh random
// blocks and every base-3 byte, the two ternarization rules on their definitions, and the files
// against llama-quantize's: the ternary-trained model's matrices come out byte for byte as in
// vxq-ternary-h64-{tq2_0,tq1_0}.gguf.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/error.h"
#include "core/fp16.h"
#include "formats/ggml_quants.h"
#include "formats/ggml_types.h"
#include "formats/gguf.h"
#include "kernels/cpu/matmul_kquants.h"
#include "backend/backend.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "model/quantize.h"
#include "support/assets.h"
#include "support/random_weights.h"
#include "support/run_cli.h"
#include "support/seed.h"

namespace vxq {
namespace {

using test::fresh_seed;

std::string temp_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() / ("vxq_quantize_" + name + "_" + std::to_string(getpid()))).string();
}

// Values that are exactly g * t, t in {-1, 0, 1}, as a ternary-trained tensor's.
std::vector<float> ternary_values(std::mt19937& rng, int64_t n, float g) {
    std::uniform_int_distribution<int> t(-1, 1);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = round_fp16(g) * float(t(rng));
    return x;
}

std::vector<float> dequantized(GgmlType t, const std::vector<uint8_t>& q, int64_t n) {
    std::vector<float> out(static_cast<size_t>(n));
    cpu::dequantize_row_kquant(t, q.data(), n, out.data());
    return out;
}

std::vector<uint8_t> quantized(GgmlType t, TernaryRule rule, double gamma, const std::vector<float>& x) {
    std::vector<uint8_t> q(ggml_row_bytes(t, int64_t(x.size())));
    quantize_row_ternary(t, rule, gamma, x.data(), int64_t(x.size()), q.data());
    return q;
}

// A tensor that takes three values is stored without loss by both rules, in both formats.
TEST(QuantizeTernary, ThreeValuedRowsRoundTripExactly) {
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    for (GgmlType t : {GgmlType::TQ2_0, GgmlType::TQ1_0, GgmlType::TQ2_G128}) {
        for (TernaryRule rule : {TernaryRule::Absmean, TernaryRule::Amax}) {
            const std::vector<float> x = ternary_values(rng, 3 * kQK_K, 0.0371f);
            const std::vector<float> y = dequantized(t, quantized(t, rule, ternary_absmean(x.data(), int64_t(x.size())), x), int64_t(x.size()));
            EXPECT_EQ(x, y) << ggml_type_name(t) << " rule " << int(rule) << " seed " << seed;
        }
    }
}

// Every digit pattern of a TQ1_0 byte (5 digits in qs, 4 in qh) reads back: a block whose 256
// digits run through all 243 combinations at every position group.
TEST(QuantizeTernary, Tq1PackingCoversEveryBase3Byte) {
    std::vector<float> x(kQK_K);
    for (int combo = 0; combo < 243; ++combo) {
        // Digit n of this combo at every value of group n (the values a byte packs).
        for (int e = 0; e < kQK_K; ++e) {
            const int n = e < 160 ? e / 32 : e < 240 ? (e - 160) / 16 : (e - 240) / 4;
            int digit = combo;
            for (int k = 0; k < 4 - n; ++k) digit /= 3;
            x[size_t(e)] = float(digit % 3 - 1);
        }
        const std::vector<float> y = dequantized(GgmlType::TQ1_0, quantized(GgmlType::TQ1_0, TernaryRule::Amax, 0.0, x), kQK_K);
        ASSERT_EQ(x, y) << "combo " << combo;
    }
}

// Absmean on ordinary weights: t = clamp(round(x / gamma), -1, 1) with the tensor's gamma, and the
// block scale is the mean |x| of the non-zero t (fp16); Amax: d = max |x|, t = round(x / d).
TEST(QuantizeTernary, RulesFollowTheirDefinitions) {
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    const std::vector<float> x = test::random_floats(2 * kQK_K, rng, 0.02f);
    const double gamma = ternary_absmean(x.data(), int64_t(x.size()));
    for (GgmlType t : {GgmlType::TQ2_0, GgmlType::TQ1_0, GgmlType::TQ2_G128}) {
        const int bs = t == GgmlType::TQ2_G128 ? kQK_G128 : kQK_K;  // values per block (per scale)
        const std::vector<float> a = dequantized(t, quantized(t, TernaryRule::Absmean, gamma, x), int64_t(x.size()));
        const std::vector<float> m = dequantized(t, quantized(t, TernaryRule::Amax, 0.0, x), int64_t(x.size()));
        for (int b = 0; b < int(x.size()) / bs; ++b) {
            double sum = 0.0, amax = 0.0;
            int nonzero = 0;
            for (int j = 0; j < bs; ++j) {
                const float v = x[size_t(b * bs + j)];
                const long tj = std::clamp(std::lround(double(v) / gamma), -1L, 1L);
                if (tj != 0) {
                    sum += std::fabs(double(v));
                    ++nonzero;
                }
                amax = std::max(amax, double(std::fabs(v)));
            }
            const float d = round_fp16(float(sum / nonzero)), dm = round_fp16(float(amax));
            for (int j = 0; j < bs; ++j) {
                const size_t e = size_t(b * bs + j);
                const long tj = std::clamp(std::lround(double(x[e]) / gamma), -1L, 1L);
                ASSERT_EQ(a[e], d * float(tj)) << ggml_type_name(t) << " absmean, value " << e << ", seed " << seed;
                const long tm = std::lround(x[e] * (1.0f / float(amax)));
                ASSERT_EQ(m[e], dm * float(tm)) << ggml_type_name(t) << " amax, value " << e << ", seed " << seed;
            }
        }
    }
}

// The ternary-trained model through `vxq quantize`: every TQ tensor is llama-quantize's, byte for
// byte, for both rules; the rest of the file (norms f32, token_embd kept f16) loads and runs.
TEST(QuantizeModel, TernaryModelMatchesLlamaQuantizeByteForByte) {
    const std::string f16 = "assets/models/vxq-ternary-h64-f16.gguf";
    VXQ_REQUIRE_ASSET(f16);
    for (const char* type : {"tq2_0", "tq1_0"}) {
        const std::string ref_rel = std::string("assets/models/vxq-ternary-h64-") + type + ".gguf";
        VXQ_REQUIRE_ASSET(ref_rel);
        const GgufFile ref = GgufFile::open(test::shared_path(ref_rel));
        for (const char* rule : {"absmean", "amax"}) {
            SCOPED_TRACE(std::string(type) + " " + rule);
            const std::string out = temp_path(std::string(type) + "_" + rule + ".gguf");
            const auto r = test::run_cli({"quantize", "-m", test::shared_path(f16), "-o", out, "--type", type, "--ternary", rule});
            ASSERT_EQ(r.exit_code, 0) << r.err;
            EXPECT_NE(r.out.find(std::string("56 x f16 -> ") + type), std::string::npos) << r.out;
            const GgufFile mine = GgufFile::open(out);
            EXPECT_EQ(mine.get_int("general.file_type"), ref.get_int("general.file_type"));
            int compared = 0;
            for (const GgufTensorInfo& t : mine.tensors()) {
                const GgufTensorInfo* u = ref.find_tensor(t.name);
                ASSERT_NE(u, nullptr) << t.name;
                if (t.name == "token_embd.weight") {  // llama-quantize: Q6_K; here: kept
                    EXPECT_EQ(t.type, GgmlType::F16);
                    continue;
                }
                ASSERT_EQ(t.type, u->type) << t.name;
                ASSERT_EQ(t.n_bytes, u->n_bytes) << t.name;
                ASSERT_EQ(std::memcmp(mine.tensor_data(t), ref.tensor_data(*u), t.n_bytes), 0) << t.name;
                ++compared;
            }
            EXPECT_EQ(compared, 56 + 17);
            Model::load(out);  // loads (a TQ model with an f16 embedding)
            std::filesystem::remove(out);
        }
    }
}

// TQ2_G128 (veloxquant's Bonsai-style format) stores the ternary-trained model's weights without
// loss too: the same weights as TQ2_0 and the same integers per block, only each 128-value block
// adds its own fma (one matmul: ~3e-7 of the output apart). Through the layers a last-bit
// difference of an activation can move one of its q8_K quants a whole step, so the logits are
// compared as the CUDA tests compare quantized-activation paths (3e-2 of the largest), and the
// next token must be the same.
TEST(QuantizeModel, G128FileRunsLikeTq2_0) {
    const std::string f16 = "assets/models/vxq-ternary-h64-f16.gguf";
    VXQ_REQUIRE_ASSET(f16);
    std::vector<std::vector<float>> logits;
    for (GgmlType type : {GgmlType::TQ2_0, GgmlType::TQ2_G128}) {
        QuantizeOptions o;
        o.input = test::shared_path(f16);
        o.output = temp_path(std::string(ggml_type_name(type)) + "_run.gguf");
        o.type = type;
        quantize_model(o);
        auto model = Model::load(o.output);
        std::filesystem::remove(o.output);
        ASSERT_EQ(model->weights().layers[0].w_down.type, type);
        auto be = make_backend("cpu", 2);
        const ModelConfig& c = model->config();
        auto cache = make_kv_cache(KvShape{c.n_layer, c.n_head, c.n_head_kv, c.head_dim, 64}, KvSpec{});
        const auto ids = model->tokenizer().encode("Once upon a time there was", true);
        logits.emplace_back(size_t(c.n_vocab));
        model->forward(*be, *cache, std::vector<TokenId>(ids.begin(), ids.end()), false, logits.back().data());
    }
    float amax = 0.0f, diff = 0.0f;
    for (size_t i = 0; i < logits[0].size(); ++i) {
        amax = std::max(amax, std::fabs(logits[0][i]));
        diff = std::max(diff, std::fabs(logits[0][i] - logits[1][i]));
    }
    EXPECT_LT(diff, 3e-2f * std::max(1.0f, amax));
    EXPECT_GT(amax, 1.0f);  // not flat
    EXPECT_EQ(std::max_element(logits[0].begin(), logits[0].end()) - logits[0].begin(),
              std::max_element(logits[1].begin(), logits[1].end()) - logits[1].begin());
}

TEST(QuantizeModel, RefusesQuantizedInputAndWritesNothing) {
    const std::string q4 = "assets/models/vxq-llama-h64-q4_0.gguf";
    VXQ_REQUIRE_ASSET(q4);
    const std::string out = temp_path("refused.gguf");
    QuantizeOptions o;
    o.input = test::shared_path(q4);
    o.output = out;
    o.type = GgmlType::Q8_0;
    try {
        quantize_model(o);
        FAIL() << "a Q4_0 input was quantized";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("quantize from a file of f32, f16 or bf16 weights"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(out));
}

}  // namespace
}  // namespace vxq

// Parity with llama.cpp on real models: tokenization and 64-token greedy continuations from
// ../shared/golden (llama.cpp b4748, CPU). Greedy text on Q8_0/Q4_0 weights depends on the SIMD
// width llama.cpp was built for (activations are quantized to int8, so a last-bit difference can
// flip a code): two shared goldens carry AVX-512 numerics. tests/data/llamacpp_avx2_greedy.json
// holds the same llama.cpp version's output built for AVX2 without AVX-512 (scripts/
// make_references.sh makes it and names the build); the engine must equal it everywhere, and
// equal the shared golden wherever the two builds agree. The ternary model's goldens (Q6_K and TQ
// weights, whose kernels have no AVX-512 variant in that version) are the same from both builds.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kv/kv_cache.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "support/assets.h"

namespace vxq {
namespace {

struct GoldenCase {
    const char* model;
    const char* golden;  // under ../shared
    // Whether tests/data/llamacpp_avx2_greedy.json holds the AVX2 build's texts for the model (for
    // the others that build's texts equal the shared golden: checked by hand when they were added)
    bool avx2_fixture = true;
};

class GoldenParity : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(GoldenParity, TokenizationAndGreedyTextMatchLlamaCpp) {
    const GoldenCase& gc = GetParam();
    VXQ_REQUIRE_ASSET(std::string("assets/models/") + gc.model);
    VXQ_REQUIRE_ASSET(gc.golden);
    std::ifstream in(test::shared_path(gc.golden));
    const auto golden = nlohmann::json::parse(in);
    const auto model = Model::load(test::shared_path(std::string("assets/models/") + gc.model));

    for (const auto& t : golden["tokenize"]) {
        const std::string text = t["text"];
        EXPECT_EQ(model->tokenizer().encode(text, true), t["ids_with_bos"].get<std::vector<TokenId>>()) << text;
    }

    const ModelConfig& c = model->config();
    auto backend = make_backend("cpu", 2);
    auto cache = make_kv_cache(KvShape{c.n_layer, c.n_head, c.n_head_kv, c.head_dim, 512}, KvSpec{});
    if (!gc.avx2_fixture) {
        for (const auto& g : golden["greedy"]) {
            GenerateParams p;
            p.n_predict = g["n_predict"];
            p.sampler.temperature = 0.0f;
            const GenerateResult r = generate(*model, *backend, *cache, g["prompt"].get<std::string>(), p);
            EXPECT_EQ(r.text, g["continuation"].get<std::string>()) << "prompt: " << g["prompt"];
        }
        return;
    }

    std::ifstream in2(std::string(VXQ_TEST_DATA_DIR) + "/llamacpp_avx2_greedy.json");
    const auto avx2 = nlohmann::json::parse(in2)["greedy"][gc.model];
    ASSERT_EQ(avx2.size(), golden["greedy"].size());
    for (size_t i = 0; i < avx2.size(); ++i) {
        const auto& g = golden["greedy"][i];
        const auto& a = avx2[i];
        ASSERT_EQ(a["prompt"], g["prompt"]);
        GenerateParams p;
        p.n_predict = g["n_predict"];
        p.sampler.temperature = 0.0f;
        const GenerateResult r = generate(*model, *backend, *cache, g["prompt"].get<std::string>(), p);
        EXPECT_EQ(r.text, a["continuation"].get<std::string>()) << "prompt: " << g["prompt"] << " (llama.cpp AVX2 build)";
        if (a["same_as_shared_golden"].get<bool>()) {
            EXPECT_EQ(r.text, g["continuation"].get<std::string>()) << "prompt: " << g["prompt"] << " (shared golden)";
        } else {
            EXPECT_NE(a["continuation"], g["continuation"]) << "fixture claims a difference that is not there";
        }
    }
}

INSTANTIATE_TEST_SUITE_P(
    RealModels, GoldenParity,
    ::testing::Values(GoldenCase{"stories260K.gguf", "golden/stories260K.llamacpp.json"},
                      GoldenCase{"vxq-llama-h64-f16.gguf", "golden/vxq-llama-h64.llamacpp.json"},
                      GoldenCase{"vxq-llama-h64-q8_0.gguf", "golden/vxq-llama-h64-q8_0.llamacpp.json"},
                      GoldenCase{"vxq-llama-h64-q4_0.gguf", "golden/vxq-llama-h64-q4_0.llamacpp.json"},
                      // Q6_K embedding and output, TQ2_0 / TQ1_0 linear weights (kernels/cpu/matmul_kquants.h)
                      GoldenCase{"vxq-ternary-h64-f16.gguf", "assets/models/vxq-ternary-h64-f16.llamacpp.json", false},
                      GoldenCase{"vxq-ternary-h64-tq2_0.gguf", "assets/models/vxq-ternary-h64-tq2_0.llamacpp.json", false},
                      GoldenCase{"vxq-ternary-h64-tq1_0.gguf", "assets/models/vxq-ternary-h64-tq1_0.llamacpp.json", false}),
    [](const auto& info) { return test::model_param_name(info.param.model); });

}  // namespace
}  // namespace vxq

// Perplexity against llama.cpp's published figures (../shared/assets/README.md), full runs.
#include <gtest/gtest.h>

#include "kv/kv_cache.h"
#include "model/model.h"
#include "runtime/perplexity.h"
#include "support/assets.h"
#include <fstream>
#include <sstream>

namespace vxq {
namespace {

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

PerplexityResult run_ppl(const std::string& model_rel, const std::string& text_rel, int64_t n_ctx, int64_t chunks) {
    const auto model = Model::load(test::shared_path(model_rel));
    const ModelConfig& c = model->config();
    auto backend = make_backend("cpu", 2);
    auto cache = make_kv_cache(KvShape{c.n_layer, c.n_head, c.n_head_kv, c.head_dim, n_ctx}, KvSpec{});
    return perplexity(*model, *backend, *cache, read_text(test::shared_path(text_rel)),
                      PerplexityParams{n_ctx, chunks});
}

// llama-perplexity -m stories260K.gguf -f tinystories_valid_head.txt -c 512: 4.9744 (767 chunks).
// Tolerance 0.002 (the issue's): covers float-order differences in exp/softmax approximations.
TEST(Perplexity, Stories260KMatchesLlamaCpp) {
    VXQ_REQUIRE_ASSET("assets/models/stories260K.gguf");
    const auto r = run_ppl("assets/models/stories260K.gguf", "assets/text/tinystories_valid_head.txt", 512, -1);
    EXPECT_EQ(r.n_chunks, 767);
    EXPECT_NEAR(r.ppl, 4.9744, 0.002);
}

// llama-perplexity -m vxq-llama-h64-f16.gguf -f wikitext2_test.raw.crlf.txt -c 1024 --chunks 24: 98.9379.
TEST(Perplexity, VxqH64F16MatchesLlamaCpp) {
    VXQ_REQUIRE_ASSET("assets/models/vxq-llama-h64-f16.gguf");
    const auto r = run_ppl("assets/models/vxq-llama-h64-f16.gguf", "assets/text/wikitext2_test.raw.crlf.txt", 1024, 24);
    EXPECT_EQ(r.n_chunks, 24);
    EXPECT_NEAR(r.ppl, 98.9379, 0.1);
}

}  // namespace
}  // namespace vxq

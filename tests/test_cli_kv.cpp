// The KV options end to end through the CLI: the default context and a model that declares a
// huge one, K/V pairs in every command, --flash-attn.
#include <cstdio>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/assets.h"
#include "support/run_cli.h"
#include "support/tiny_model.h"

namespace vxq {
namespace {

const std::string kModelRel = "assets/models/vxq-llama-h64-f16.gguf";

// A model declaring 131072 tokens of context: the default context is 4096 (llama.cpp's), and
// the f16 cache holds pages for the tokens that arrived only, far under 64 MiB.
TEST(CliKv, DefaultContextOnAModelDeclaring128KTokensHoldsLittleKv) {
    test::TinyModelSpec spec;
    spec.n_ctx_train = 131072;
    const test::TinyModel m = test::build_tiny_model(spec);
    // The summary line on stderr: "kv cache: f16, ctx N | resident B bytes for T tokens ...".
    // (Plain output, not --json: a random tiny model samples bytes that are not UTF-8.)
    auto summary = [&](const std::vector<std::string>& extra) {
        std::vector<std::string> args = {"generate", "-m", m.path, "-p", "Once upon a time", "-n", "16", "--temp", "0", "-t", "1"};
        args.insert(args.end(), extra.begin(), extra.end());
        const auto r = test::run_cli(args);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        const size_t at = r.err.find("kv cache: ");
        EXPECT_NE(at, std::string::npos) << r.err;
        long long ctx = -1, bytes = -1;
        std::sscanf(r.err.c_str() + at, "kv cache: f16, ctx %lld | resident %lld bytes", &ctx, &bytes);
        return std::pair<long long, long long>(ctx, bytes);
    };
    const auto [ctx, bytes] = summary({});
    EXPECT_EQ(ctx, 4096);
    EXPECT_GT(bytes, 0);
    EXPECT_LT(bytes, 64ll << 20);
    // -c 0 is the model's context; the cache still allocates as tokens arrive.
    const auto [ctx0, bytes0] = summary({"-c", "0"});
    EXPECT_EQ(ctx0, 131072);
    EXPECT_EQ(bytes0, bytes);
}

TEST(CliKv, KvPairsInGenerateAndBench) {
    VXQ_REQUIRE_ASSET(kModelRel);
    const std::string model = test::shared_path(kModelRel);
    const auto g = test::run_cli({"generate", "-m", model, "-p", "The kernel", "-n", "8", "--temp", "0", "--json", "-t", "2",
                                  "-ctk", "q4_0", "-ctv", "f16"});
    ASSERT_EQ(g.exit_code, 0) << g.err;
    EXPECT_EQ(nlohmann::json::parse(g.out)["kv_cache"]["format"], "K q4_0 / V f16");
    const auto p = test::run_cli({"generate", "-m", model, "-p", "The kernel", "-n", "8", "--temp", "0", "--json", "-t", "2",
                                  "--kv", "q4_0/f16"});
    ASSERT_EQ(p.exit_code, 0) << p.err;
    EXPECT_EQ(nlohmann::json::parse(p.out)["ids"], nlohmann::json::parse(g.out)["ids"]) << "--kv K/V == -ctk/-ctv";
    const auto b = test::run_cli({"bench", "-m", model, "-p", "16", "-n", "4", "-r", "1", "-t", "1", "--kv", "f16,q4_0/f16",
                                  "--json", "--no-aa"});
    ASSERT_EQ(b.exit_code, 0) << b.err;
    const auto j = nlohmann::json::parse(b.out);
    bool pair = false;
    for (const auto& row : j["rows"]) pair |= row["kv_format"] == "K q4_0 / V f16";
    EXPECT_TRUE(pair) << b.out;
    // The backend and what it holds after the runs (the default device is the CPU).
    EXPECT_EQ(j["backend"].get<std::string>().rfind("cpu/", 0), 0u) << j["backend"];
    EXPECT_EQ(j["backend_memory"]["where"], "host RAM");
    EXPECT_EQ(j["backend_memory"]["weight_bytes"], 0);
    EXPECT_GT(j["backend_memory"]["activation_bytes"].get<size_t>(), 0u);
}

// --flash-attn sends an f16 cache through the fused kernel: same text on this model (greedy),
// slightly different logits (f32 accumulation instead of llama.cpp's fp16 rounding of q and p).
TEST(CliKv, FlashAttnReadsF16ThroughTheFusedKernel) {
    VXQ_REQUIRE_ASSET(kModelRel);
    const std::string model = test::shared_path(kModelRel);
    const auto fa = test::run_cli({"generate", "-m", model, "-p", "The kernel", "-n", "16", "--temp", "0", "--json", "-t",
                                   "2", "-fa"});
    ASSERT_EQ(fa.exit_code, 0) << fa.err;
    const auto base = test::run_cli({"generate", "-m", model, "-p", "The kernel", "-n", "16", "--temp", "0", "--json", "-t", "2"});
    ASSERT_EQ(base.exit_code, 0) << base.err;
    EXPECT_EQ(nlohmann::json::parse(fa.out)["text"], nlohmann::json::parse(base.out)["text"]);
}

TEST(CliKv, EmptyOrHalfKvSpecIsAnError) {
    VXQ_REQUIRE_ASSET(kModelRel);
    const std::string model = test::shared_path(kModelRel);
    for (const std::vector<std::string>& kv : {std::vector<std::string>{"--kv", ""}, {"--kv", "q4_0/"}, {"--kv", "/f16"},
                                               {"-ctk", "q9_9"}}) {
        std::vector<std::string> args = {"generate", "-m", model, "-p", "x", "-n", "1"};
        args.insert(args.end(), kv.begin(), kv.end());
        const auto r = test::run_cli(args);
        EXPECT_EQ(r.signal, 0);
        EXPECT_GT(r.exit_code, 0) << kv[0] << " '" << kv[1] << "'";
        EXPECT_NE(r.err.find("vxq: error:"), std::string::npos) << r.err;
    }
}

}  // namespace
}  // namespace vxq

// The CLI end to end: a table of bad inputs, each a clear error and a non-zero exit, never a
// crash; and the happy paths' output contracts (tokenize JSON, generate --json).
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/assets.h"
#include "support/run_cli.h"

namespace vxq {
namespace {

const std::string kModelRel = "assets/models/vxq-llama-h64-f16.gguf";

std::string tmp_file(const std::string& name, const std::string& bytes) {
    const auto p = std::filesystem::temp_directory_path() / ("vxq_cli_" + name);
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
}

std::string model_prefix(size_t n) {
    std::ifstream in(test::shared_path(kModelRel), std::ios::binary);
    std::string s(n, '\0');
    in.read(s.data(), std::streamsize(n));
    return s;
}

struct BadInput {
    const char* name;
    std::function<std::vector<std::string>()> args;
    const char* expect_in_stderr;
};

class CliBadInput : public ::testing::TestWithParam<BadInput> {};

TEST_P(CliBadInput, ClearErrorAndNonZeroExit) {
    VXQ_REQUIRE_ASSET(kModelRel);
    const BadInput& b = GetParam();
    const auto r = test::run_cli(b.args());
    EXPECT_EQ(r.signal, 0) << "crashed with signal " << r.signal << "\n" << r.err;
    EXPECT_GT(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find(b.expect_in_stderr), std::string::npos)
        << "stderr does not mention '" << b.expect_in_stderr << "':\n" << r.err;
}

std::string M() { return test::shared_path(kModelRel); }
std::string T() { return test::shared_path("assets/text/tinystories_valid_head.txt"); }

const BadInput kBadInputs[] = {
    {"UnknownFlag", [] { return std::vector<std::string>{"generate", "-m", M(), "-p", "x", "--bogus"}; }, "--bogus"},
    {"UnknownSubcommand", [] { return std::vector<std::string>{"frobnicate"}; }, "frobnicate"},
    {"NoSubcommand", [] { return std::vector<std::string>{}; }, "subcommand"},
    {"MissingModelFile", [] { return std::vector<std::string>{"generate", "-m", "/nonexistent.gguf", "-p", "x"}; }, "/nonexistent.gguf"},
    {"ModelIsDirectory", [] { return std::vector<std::string>{"inspect", "/tmp"}; }, "not a regular file"},
    {"NotGguf", [] { return std::vector<std::string>{"inspect", tmp_file("text.gguf", "hello, I am not a model file")}; }, "bad magic"},
    {"EmptyFile", [] { return std::vector<std::string>{"inspect", tmp_file("empty.gguf", "")}; }, "empty"},
    {"TruncatedHeader", [] { return std::vector<std::string>{"inspect", tmp_file("trunc16.gguf", model_prefix(16))}; }, "truncated"},
    {"TruncatedMetadata", [] { return std::vector<std::string>{"generate", "-m", tmp_file("trunc4k.gguf", model_prefix(4096)), "-p", "x"}; }, "truncated"},
    {"TruncatedTensorData", [] { return std::vector<std::string>{"generate", "-m", tmp_file("trunc1m.gguf", model_prefix(1 << 20)), "-p", "x"}; }, "past the end"},
    {"NegativePredict", [] { return std::vector<std::string>{"generate", "-m", M(), "-p", "x", "-n", "-5"}; }, ">= 0"},
    {"PromptLongerThanContext", [] { return std::vector<std::string>{"generate", "-m", M(), "-p", std::string(400, 'a') + " the end", "-c", "16"}; }, "longer than the context"},
    {"InvalidUtf8Prompt", [] { return std::vector<std::string>{"generate", "-m", M(), "-p", "caf\xc3(", "-n", "1"}; }, "UTF-8"},
    {"InvalidUtf8Tokenize", [] { return std::vector<std::string>{"tokenize", "-m", M(), "-p", "\xff\xfe"}; }, "UTF-8"},
    {"NonNumericPredict", [] { return std::vector<std::string>{"generate", "-m", M(), "-p", "x", "-n", "many"}; }, "n-predict"},
    {"NoPrompt", [] { return std::vector<std::string>{"generate", "-m", M()}; }, "prompt"},
    {"NegativeThreads", [] { return std::vector<std::string>{"generate", "-m", M(), "-p", "x", "-t", "-1"}; }, "threads"},
    {"TopPOutOfRange", [] { return std::vector<std::string>{"generate", "-m", M(), "-p", "x", "--top-p", "2"}; }, "top-p"},
    {"NonNumericCtx", [] { return std::vector<std::string>{"generate", "-m", M(), "-p", "x", "-c", "lots"}; }, "ctx"},
    {"HugeContext", [] { return std::vector<std::string>{"generate", "-m", M(), "-p", "x", "-c", "16000000"}; }, "memory"},
    {"PerplexityMissingText", [] { return std::vector<std::string>{"perplexity", "-m", M(), "-f", "/nonexistent.txt"}; }, "/nonexistent.txt"},
    {"PerplexityTextTooShort", [] { return std::vector<std::string>{"perplexity", "-m", M(), "-f", tmp_file("short.txt", "Just a few words."), "-c", "128"}; }, "needs at least"},
    {"PerplexityZeroChunks", [] { return std::vector<std::string>{"perplexity", "-m", M(), "-f", T(), "--chunks", "0"}; }, "chunks"},
    {"EvalNoMethods", [] { return std::vector<std::string>{"eval", "-m", M(), "-f", T(), "-c", "64", "--chunks", "1"}; }, "--kv"},
    {"EvalUnknownMethod", [] { return std::vector<std::string>{"eval", "-m", M(), "-f", T(), "-c", "64", "--kv", "q3_z"}; }, "q3_z"},
    {"EvalBadMode", [] { return std::vector<std::string>{"eval", "-m", M(), "-f", T(), "--kv", "f16", "--mode", "fast"}; }, "fast"},
    {"EvalBadKvPair", [] { return std::vector<std::string>{"eval", "-m", M(), "-f", T(), "-c", "64", "--kv", "q8_0/"}; }, "q8_0/"},
    {"EvalGateNotJson", [] { return std::vector<std::string>{"eval", "-m", M(), "-f", T(), "--gate", tmp_file("gate.json", "{limits")}; }, "gate.json"},
    {"EvalGateOtherModel", [] { return std::vector<std::string>{"eval", "-m", M(), "-f", T(), "--gate", std::string(VXQ_TEST_DATA_DIR) + "/gate/stories260K.json"}; }, "is for model"},
    {"EvalBenchJsonMissing", [] { return std::vector<std::string>{"eval", "-m", M(), "-f", T(), "--kv", "f16", "--bench", "/nonexistent_bench.json", "--speed-plot", "/tmp/vxq_s.svg"}; }, "/nonexistent_bench.json"},
    {"EvalGateWithMethods", [] { return std::vector<std::string>{"eval", "-m", M(), "-f", T(), "--kv", "q8_0", "--gate", std::string(VXQ_TEST_DATA_DIR) + "/gate/vxq-llama-h64.json"}; }, "drop --kv"},
    {"WeightTypeNotComputed", [] { return std::vector<std::string>{"generate", "-m", test::shared_path("assets/models/vxq-ternary-h64-tq2_0.gguf"), "-p", "x"}; },
     "tensor 'token_embd.weight' is Q6_K, which veloxquant cannot compute yet"},
    {"PromptFileMissing", [] { return std::vector<std::string>{"generate", "-m", M(), "-f", "/nonexistent_prompt.txt"}; }, "/nonexistent_prompt.txt"},
};

INSTANTIATE_TEST_SUITE_P(Table, CliBadInput, ::testing::ValuesIn(kBadInputs),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Cli, InspectNamesEveryTensorTypeOfATernaryFile) {
    const std::string rel = "assets/models/vxq-ternary-h64-tq2_0.gguf";
    VXQ_REQUIRE_ASSET(rel);
    const auto r = test::run_cli({"inspect", test::shared_path(rel)});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("token_embd.weight                q6_K"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("blk.7.ffn_up.weight              tq2_0"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("general.architecture"), std::string::npos);
}

TEST(Cli, TokenizePrintsJsonIds) {
    VXQ_REQUIRE_ASSET(kModelRel);
    const auto r = test::run_cli({"tokenize", "-m", M(), "-p", "The kernel"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out), nlohmann::json({1, 390, 676}));
}

TEST(Cli, GenerateJsonHasIdsTextAndTimings) {
    VXQ_REQUIRE_ASSET(kModelRel);
    const auto r = test::run_cli({"generate", "-m", M(), "-p", "The kernel", "-n", "64", "--temp", "0", "--json", "-t", "2"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["prompt_ids"], nlohmann::json({1, 390, 676}));
    EXPECT_EQ(j["text"], " will not use the following commands:");  // llama.cpp's greedy text (golden)
    EXPECT_TRUE(j["timings"].contains("predicted_per_second"));
    EXPECT_GT(j["kv_cache"]["resident_bytes"].get<size_t>(), 0u);
}

}  // namespace
}  // namespace vxq

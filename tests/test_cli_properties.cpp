// Property tests of the CLI: whatever the sampler draws and whatever a file is called, vxq never
// aborts. generate --json runs over many seeds and extreme sampling settings on stories260K (its
// byte tokens make invalid UTF-8 easy to sample), bench and eval run on copies of the model under
// file names that are not UTF-8 or carry quotes, newlines and format braces. Every run must exit
// 0 with output that parses as JSON and says whether strings were replaced.
//
// VXQ_PROPERTY_CASES sets the number of generate cases (default 300, a few seconds);
// scripts/property.sh runs thousands.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "formats/tokenizer.h"
#include "support/assets.h"
#include "support/run_cli.h"

namespace vxq {
namespace {

namespace fs = std::filesystem;

const std::string kStoriesRel = "assets/models/stories260K.gguf";
const std::string kTextRel = "assets/text/tinystories_valid_head.txt";

int property_cases() {
    const char* env = std::getenv("VXQ_PROPERTY_CASES");
    return env ? std::max(1, std::atoi(env)) : 300;
}

template <typename T>
T pick(std::mt19937_64& rng, const std::vector<T>& from) {
    return from[size_t(rng() % from.size())];
}

// What every successful --json run must show: no signal, exit 0, and stdout that parses as JSON.
nlohmann::json expect_clean_json(const test::CliResult& r, const std::string& what) {
    EXPECT_EQ(r.signal, 0) << what << ": killed by signal " << r.signal << "\n" << r.err;
    EXPECT_EQ(r.exit_code, 0) << what << "\n" << r.err;
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(r.out);
    } catch (const nlohmann::json::exception& e) {
        ADD_FAILURE() << what << ": stdout is not JSON (" << e.what() << ")";
    }
    return j;
}

TEST(CliProperty, GenerateJsonNeverAbortsOnAnySamplingSettings) {
    VXQ_REQUIRE_ASSET(kStoriesRel);
    const std::string model = test::shared_path(kStoriesRel);
    std::mt19937_64 rng(20261201);
    const std::vector<std::string> temps = {"0", "0.1", "0.8", "1", "2", "5", "20", "1000", "1e30"};
    const std::vector<std::string> top_ks = {"0", "1", "2", "40", "511", "512", "100000"};
    const std::vector<std::string> top_ps = {"0", "0.05", "0.5", "0.95", "1"};
    const std::vector<std::string> min_ps = {"0", "0.05", "0.5", "1"};
    const std::vector<std::string> n_predict = {"0", "1", "16", "64"};
    const std::vector<std::string> prompts = {"Once", "", "<s>", "</s>", "caf\xc3\xa9 \xf0\x9f\x98\x80", " ", "\n\n\t"};
    const int n = property_cases();
    int invalid_text = 0;
    for (int i = 0; i < n; ++i) {
        // Case 0 is the reproduction (SIGABRT before: the sampled bytes are not UTF-8).
        const std::vector<std::string> args =
            i == 0 ? std::vector<std::string>{"generate", "-m", model, "-p", "Once", "-n", "64", "--temp", "5", "--top-k", "0",
                                              "--top-p", "1", "--min-p", "0", "--seed", "2", "--json", "-t", "1"}
                   : std::vector<std::string>{"generate", "-m", model, "-p", pick(rng, prompts), "-n", pick(rng, n_predict),
                                              "--temp", pick(rng, temps), "--top-k", pick(rng, top_ks), "--top-p", pick(rng, top_ps),
                                              "--min-p", pick(rng, min_ps), "--seed", std::to_string(i), "--json", "-t", "1"};
        std::string what = "case " + std::to_string(i) + ":";
        for (size_t a = 3; a < args.size(); ++a) what += " " + args[a];
        const auto r = test::run_cli(args);
        const nlohmann::json j = expect_clean_json(r, what);
        if (!j.is_object()) break;
        ASSERT_TRUE(j.contains("text") && j.contains("text_valid_utf8") && j["text_valid_utf8"].is_boolean()) << what;
        const bool valid = j["text_valid_utf8"];
        EXPECT_EQ(j.contains("invalid_utf8_replaced"), !valid) << what;
        EXPECT_EQ(find_invalid_utf8(j["text"].get<std::string>()), -1) << what << ": JSON strings are UTF-8";
        invalid_text += !valid;
        if (HasFailure()) break;  // one reproducer is enough
    }
    // The property is only tested if some runs did sample invalid UTF-8 (case 0 does).
    EXPECT_GT(invalid_text, 0);
}

class CliOddFileNames : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / fmt::format("vxq_odd_names_{}", ::getpid());
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    // The model copied under `name` (bytes as given, not necessarily UTF-8).
    std::string model_named(const std::string& name) {
        const fs::path p = dir_ / (name + ".gguf");
        fs::copy_file(test::shared_path(kStoriesRel), p, fs::copy_options::overwrite_existing);
        return p.string();
    }
    fs::path dir_;
};

// Not UTF-8: a bare 0xFF, a truncated sequence, a lone continuation byte, an overlong '/', a
// surrogate; then names that are UTF-8 but hostile to JSON, CSV, markdown or fmt.
const std::vector<std::string> kOddNames = {
    "odd\xff",  "odd\xc3(", "odd\x80", "odd\xc0\xaf", "odd\xed\xa0\x80", "quote\"back\\slash", "new\nline",
    "{}{0}%s%n", "tab\tbar|pipe,comma", "caf\xc3\xa9 \xf0\x9f\x98\x80",
};

TEST_F(CliOddFileNames, BenchAndEvalNeverAbort) {
    VXQ_REQUIRE_ASSET(kStoriesRel);
    VXQ_REQUIRE_ASSET(kTextRel);
    for (const std::string& name : kOddNames) {
        const bool utf8 = find_invalid_utf8(name) == -1;
        const std::string model = model_named(name);
        const std::string what = "model file named '" + name + "'";

        const std::vector<std::string> bench = {"bench", "-m", model, "-p", "8", "-n", "4", "-r", "1", "-t", "1"};
        std::vector<std::string> args = bench;
        args.push_back("--json");
        const nlohmann::json jb = expect_clean_json(test::run_cli(args), what + ", bench --json");
        EXPECT_EQ(jb.contains("invalid_utf8_replaced"), !utf8) << what;
        for (const char* format : {"--csv", "-v"}) {
            args = bench;
            args.push_back(format);
            const auto r = test::run_cli(args);
            EXPECT_EQ(r.signal, 0) << what << ", bench " << format;
            EXPECT_EQ(r.exit_code, 0) << what << ", bench " << format << "\n" << r.err;
        }

        const std::string json_out = (dir_ / (name + ".eval.json")).string();
        const std::string plot_out = (dir_ / (name + ".kl.svg")).string();
        const auto r = test::run_cli({"eval", "-m", model, "-f", test::shared_path(kTextRel), "-c", "64", "--chunks", "1",
                                      "--kv", "bf16", "--json", json_out, "--plot", plot_out, "-t", "1"});
        EXPECT_EQ(r.signal, 0) << what << ", eval";
        ASSERT_EQ(r.exit_code, 0) << what << ", eval\n" << r.err;
        std::ifstream in(json_out, std::ios::binary);
        nlohmann::json je;
        ASSERT_NO_THROW(je = nlohmann::json::parse(in)) << what << ": eval --json file";
        EXPECT_EQ(je.contains("invalid_utf8_replaced"), !utf8) << what;
        EXPECT_EQ(je["methods"].size(), 1u) << what;
        EXPECT_TRUE(fs::exists(plot_out)) << what;
    }
}

}  // namespace
}  // namespace vxq

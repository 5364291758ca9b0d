// vxq bench with several depths (-d 0,8: one test per depth, every (config, test) pair once per
// round in a rotating order, an A/A row per test, depth / n_prompt / n_gen in the JSON rows) and
// vxq plot on its JSON (decode speed vs depth, one line per configuration), through the binary.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/assets.h"
#include "support/run_cli.h"
#include "support/text.h"

namespace vxq {
namespace {

using test::read_file;

namespace fs = std::filesystem;

const std::string kModelRel = "assets/models/stories260K.gguf";

std::string M() { return test::shared_path(kModelRel); }

// A fresh directory per test process (ctest runs the tests of this file in parallel).
fs::path work_dir(const std::string& test) {
    const fs::path d = fs::temp_directory_path() / ("vxq_bench_plot_" + test + "_" + std::to_string(getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
}

void write(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

size_t count(const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t pos = s.find(what); pos != std::string::npos; pos = s.find(what, pos + what.size())) ++n;
    return n;
}

bool is_one_error_line(const std::string& err) {
    return err.rfind("vxq: error: ", 0) == 0 && count(err, "\n") == 1 && err.back() == '\n';
}

// Two configurations (f16, f32) plus the A/A copy of f16, decode only, depths 0 and 8, two rounds.
// -t 1: the tests of this suite run in parallel. -v traces the order of the timed runs on stderr.
test::CliResult run_two_depth_bench() {
    return test::run_cli({"bench", "-m", M(), "-p", "0", "-n", "4", "-d", "0,8", "-r", "2", "-t", "1", "--kv", "f16,f32", "--json", "-v"});
}

TEST(BenchDepths, JsonHasRowsPerDepthWithDepthFieldAndAaPair) {
    VXQ_REQUIRE_ASSET(kModelRel);
    const auto r = run_two_depth_bench();
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j["rows"].size(), 6u) << j.dump(1);  // 2 tests (tg4, tg4@d8) x 3 configs (f16, A/A, f32)
    std::map<std::string, int> rows_per_test, aa_per_test;
    for (const auto& row : j["rows"]) {
        const std::string test = row["test"];
        const int64_t depth = row["depth"];
        EXPECT_EQ(test, depth == 0 ? "tg4" : "tg4@d8") << row.dump();
        EXPECT_TRUE(depth == 0 || depth == 8) << row.dump();
        EXPECT_EQ(row["n_gen"], 4) << row.dump();
        EXPECT_EQ(row["n_prompt"], 0) << row.dump();
        EXPECT_EQ(row["tps_samples"].size(), 2u) << row.dump();
        EXPECT_GT(row["tps_median"].get<double>(), 0) << row.dump();
        ++rows_per_test[test];
        if (row["aa"].get<bool>()) {
            ++aa_per_test[test];
            EXPECT_EQ(row["config"], "stories260K kv=f16 (A/A)");
        }
    }
    EXPECT_EQ(rows_per_test, (std::map<std::string, int>{{"tg4", 3}, {"tg4@d8", 3}}));
    EXPECT_EQ(aa_per_test, (std::map<std::string, int>{{"tg4", 1}, {"tg4@d8", 1}}));
}

// MEASURE.md: every round runs each (config, test) pair once, all depths interleaved in one
// process, and the order rotates so no pair always runs first; one prompt per round.
TEST(BenchDepths, EveryRoundRunsEveryPairOnceInARotatingOrder) {
    VXQ_REQUIRE_ASSET(kModelRel);
    const auto r = run_two_depth_bench();
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::regex line(R"(run +\d+: rep (\d+) (\S+) +(.*\S) +prompt #(\d+) ->)");
    std::map<int, std::vector<std::string>> order;  // round -> "test|config" in run order
    std::map<int, std::set<std::string>> prompts;
    std::istringstream err(r.err);
    for (std::string l; std::getline(err, l);) {
        std::smatch m;
        if (!std::regex_search(l, m, line)) continue;
        order[std::stoi(m[1])].push_back(m[2].str() + "|" + m[3].str());
        prompts[std::stoi(m[1])].insert(m[4]);
    }
    ASSERT_EQ(order.size(), 2u) << r.err;
    for (auto& [round, pairs] : order) {
        EXPECT_EQ(pairs.size(), 6u) << "round " << round << "\n" << r.err;
        EXPECT_EQ(std::set<std::string>(pairs.begin(), pairs.end()).size(), 6u) << "round " << round << "\n" << r.err;
        EXPECT_EQ(prompts[round].size(), 1u) << "round " << round << " used several prompts\n" << r.err;
    }
    EXPECT_NE(order[1].front(), order[2].front()) << "the order did not rotate\n" << r.err;
    EXPECT_NE(*prompts[1].begin(), *prompts[2].begin()) << "the prompt did not rotate\n" << r.err;
}

// A row's resident KV is what a cache holds after that test alone: read from the shared cache after
// the test's warm-up where no earlier run held more tokens, else from a fresh cache. Either order
// of the depths gives the same figures, and the shallow test holds less than the deep one.
TEST(BenchDepths, ResidentKvIsEachTestsOwnInEitherDepthOrder) {
    VXQ_REQUIRE_ASSET(kModelRel);
    std::map<std::string, size_t> bytes[2];  // "config|test" -> kv_bytes, per order
    const char* orders[2] = {"0,256", "256,0"};
    for (int o = 0; o < 2; ++o) {
        const auto r = test::run_cli({"bench", "-m", M(), "-p", "0", "-n", "4", "-d", orders[o], "-r", "1", "-t", "1", "--no-aa",
                                      "--kv", "f16,kivi:bits=2", "--json"});
        ASSERT_EQ(r.exit_code, 0) << r.err;
        const auto j = nlohmann::json::parse(r.out);
        for (const auto& row : j["rows"]) {
            bytes[o][row["config"].get<std::string>() + "|" + row["test"].get<std::string>()] = row["kv_bytes"].get<size_t>();
        }
    }
    ASSERT_EQ(bytes[0].size(), 4u);
    EXPECT_EQ(bytes[0], bytes[1]);
    for (const char* kv : {"f16", "kivi:bits=2"}) {
        const std::string c = std::string("stories260K kv=") + kv;
        EXPECT_LT(bytes[0][c + "|tg4"], bytes[0][c + "|tg4@d256"]) << kv;
    }
}

// --depth-fill kv: the depth enters the cache by Model::fill_kv, not the model; the rows say so
// (JSON depth_fill), and each row's resident KV is the prefill form's (the same tokens stored).
TEST(BenchDepths, DepthFillKvStoresAsManyTokensAsThePrefill) {
    VXQ_REQUIRE_ASSET(kModelRel);
    std::map<std::string, size_t> bytes[2];
    const char* fills[2] = {"prefill", "kv"};
    for (int f = 0; f < 2; ++f) {
        const auto r = test::run_cli({"bench", "-m", M(), "-p", "0", "-n", "4", "-d", "0,100", "-r", "1", "-t", "1", "--no-aa",
                                      "--kv", "f16,f32,kivi:bits=2", "--depth-fill", fills[f], "--json"});
        ASSERT_EQ(r.exit_code, 0) << r.err;
        const auto j = nlohmann::json::parse(r.out);
        EXPECT_EQ(j["depth_fill"], fills[f]);
        for (const auto& row : j["rows"]) {
            EXPECT_GT(row["tps_median"].get<double>(), 0) << row.dump();
            bytes[f][row["config"].get<std::string>() + "|" + row["test"].get<std::string>()] = row["kv_bytes"].get<size_t>();
        }
    }
    ASSERT_EQ(bytes[0].size(), 6u);
    EXPECT_EQ(bytes[0], bytes[1]);
    const auto bad = test::run_cli({"bench", "-m", M(), "-p", "0", "-n", "4", "-r", "1", "--depth-fill", "model"});
    EXPECT_GT(bad.exit_code, 0);
    EXPECT_NE(bad.err.find("--depth-fill"), std::string::npos) << bad.err;
}

TEST(BenchDepths, BadDepthListIsOneLineError) {
    VXQ_REQUIRE_ASSET(kModelRel);
    for (const char* bad : {"1,,2", "-5", "x", "0,-8", "8,", "1e3", "0,0"}) {
        const auto r = test::run_cli({"bench", "-m", M(), "-p", "0", "-n", "4", "-r", "1", "-d", bad});
        EXPECT_EQ(r.signal, 0) << "-d " << bad << ": crashed\n" << r.err;
        EXPECT_GT(r.exit_code, 0) << "-d " << bad << " was accepted\n" << r.out;
        EXPECT_TRUE(is_one_error_line(r.err)) << "-d " << bad << ":\n" << r.err;
        EXPECT_NE(r.err.find("depth"), std::string::npos) << "-d " << bad << ":\n" << r.err;
        EXPECT_TRUE(r.out.empty()) << "-d " << bad << ":\n" << r.out;
    }
}

class PlotBenchJson : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = work_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    }
    void TearDown() override { fs::remove_all(dir_); }
    fs::path dir_;
};

TEST_F(PlotBenchJson, OneLinePerConfigurationWithDefaultLabels) {
    VXQ_REQUIRE_ASSET(kModelRel);
    const auto b = run_two_depth_bench();
    ASSERT_EQ(b.exit_code, 0) << b.err;
    write(dir_ / "run.json", b.out);
    const fs::path svg = dir_ / "speed.svg";
    const auto r = test::run_cli({"plot", (dir_ / "run.json").string(), "-o", svg.string()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string s = read_file(svg);
    EXPECT_EQ(count(s, "<path "), 2u) << s;  // f16 and f32; the A/A row is not a series
    EXPECT_EQ(count(s, "<circle "), 4u) << s;  // 2 configurations x 2 depths
    EXPECT_NE(s.find(">stories260K kv=f16<"), std::string::npos) << s;
    EXPECT_NE(s.find(">stories260K kv=f32<"), std::string::npos) << s;
    EXPECT_EQ(s.find("A/A"), std::string::npos) << s;
    EXPECT_NE(s.find(">context depth (tokens)<"), std::string::npos) << s;
    EXPECT_NE(s.find(">decode tokens/s (median)<"), std::string::npos) << s;
    EXPECT_FALSE(fs::exists(svg.string() + ".tmp"));
}

// Older runs: one JSON per depth, without the depth field (read from the test name "tg4@d8").
TEST_F(PlotBenchJson, MergesFilesAndHonoursLabelOverrides) {
    VXQ_REQUIRE_ASSET(kModelRel);
    const auto b = run_two_depth_bench();
    ASSERT_EQ(b.exit_code, 0) << b.err;
    const auto j = nlohmann::json::parse(b.out);
    std::map<int64_t, nlohmann::json> per_depth;
    for (auto row : j["rows"]) {
        const int64_t d = row["depth"];
        row.erase("depth");
        per_depth[d]["rows"].push_back(row);
    }
    ASSERT_EQ(per_depth.size(), 2u);
    write(dir_ / "d0.json", per_depth[0].dump());
    write(dir_ / "d8.json", per_depth[8].dump());
    const fs::path svg = dir_ / "merged.svg";
    const auto r = test::run_cli({"plot", (dir_ / "d0.json").string(), (dir_ / "d8.json").string(), "-o", svg.string(), "--title",
                                  "my title", "--xlabel", "my x", "--ylabel", "my y"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string s = read_file(svg);
    EXPECT_EQ(count(s, "<path "), 2u) << s;
    EXPECT_EQ(count(s, "<circle "), 4u) << s;
    for (const char* label : {">my title<", ">my x<", ">my y<"}) EXPECT_NE(s.find(label), std::string::npos) << label << "\n" << s;
}

TEST_F(PlotBenchJson, BadJsonIsOneLineErrorNamingTheFileAndWritesNothing) {
    const fs::path svg = dir_ / "never.svg";
    const std::pair<const char*, const char*> bad[] = {
        {"truncated.json", R"({"rows": [{"config": "a", "test": "tg4")"},
        {"norows.json", R"({"machine": "x", "rows": []})"},
        {"notbench.json", R"([1, 2, 3])"},
        {"rowtype.json", R"({"rows": [{"config": "a", "test": "tg4", "depth": 0, "tps_median": "fast"}]})"},
        {"prefillonly.json", R"({"rows": [{"config": "a", "test": "pp4", "depth": 0, "tps_median": 10.0}]})"},
    };
    for (const auto& [name, text] : bad) {
        write(dir_ / name, text);
        const auto r = test::run_cli({"plot", (dir_ / name).string(), "-o", svg.string()});
        EXPECT_EQ(r.signal, 0) << name << ": crashed\n" << r.err;
        EXPECT_GT(r.exit_code, 0) << name << " was accepted";
        EXPECT_TRUE(is_one_error_line(r.err)) << name << ":\n" << r.err;
        EXPECT_NE(r.err.find(name), std::string::npos) << name << ":\n" << r.err;
        EXPECT_FALSE(fs::exists(svg)) << name;
        EXPECT_FALSE(fs::exists(svg.string() + ".tmp")) << name;
    }
}

TEST_F(PlotBenchJson, TableInputStillPlotsAndCannotBeMixedWithJson) {
    write(dir_ / "t.tsv", "# method\tbits\tppl\nf16\t16\t5.0\nq4_0\t4.5\t5.2\n");
    const fs::path svg = dir_ / "t.svg";
    const auto r = test::run_cli({"plot", (dir_ / "t.tsv").string(), "-o", svg.string(), "--x", "1", "--y", "2", "--label", "0"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string s = read_file(svg);
    EXPECT_EQ(count(s, "<circle "), 2u) << s;
    EXPECT_EQ(count(s, "<path "), 0u) << s;  // --lines not given
    EXPECT_NE(s.find(">q4_0<"), std::string::npos) << s;

    write(dir_ / "run.json", R"({"rows": [{"config": "a", "test": "tg4", "depth": 0, "tps_median": 10.0}]})");
    const fs::path mixed = dir_ / "mixed.svg";
    const auto m = test::run_cli({"plot", (dir_ / "t.tsv").string(), (dir_ / "run.json").string(), "-o", mixed.string()});
    EXPECT_GT(m.exit_code, 0);
    EXPECT_TRUE(is_one_error_line(m.err)) << m.err;
    EXPECT_FALSE(fs::exists(mixed));
}

}  // namespace
}  // namespace vxq

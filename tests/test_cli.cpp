// The CLI end to end: a table of bad inputs, each refused by the error contract (exactly one
// line on stderr starting "vxq: error: ", nothing on stdout, a non-zero exit, no signal); and
// the happy paths' output contracts (tokenize JSON, generate --json).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "core/sha256.h"
#include "kv/calibration.h"
#include "model/model.h"
#include "support/assets.h"
#include "support/run_cli.h"
#include "support/text.h"
#include "support/tiny_model.h"

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

// A tiny model file broken by `edit`, written once per name and kept until the tests exit.
std::string broken_model(const std::string& name, void (*edit)(test::TinyModelSpec&)) {
    static std::map<std::string, test::TinyModel> models;
    auto it = models.find(name);
    if (it == models.end()) {
        test::TinyModelSpec s;
        edit(s);
        it = models.emplace(name, test::build_tiny_model(s)).first;
    }
    return it->second.path;
}

// A thread count above 4x this machine's hardware threads (CLI11 caps -t at 1024 first on a
// machine of more than 255 threads; that refusal names the flag too).
std::string too_many_threads() { return std::to_string(4 * std::max(1u, std::thread::hardware_concurrency()) + 1); }

struct BadInput {
    const char* name;
    std::function<std::vector<std::string>()> args;
    const char* expect_in_stderr;
};

class CliBadInput : public ::testing::TestWithParam<BadInput> {};

TEST_P(CliBadInput, OneErrorLineOnStderrNothingOnStdout) {
    VXQ_REQUIRE_ASSET(kModelRel);
    const BadInput& b = GetParam();
    const auto r = test::run_cli(b.args());
    EXPECT_EQ(r.signal, 0) << "crashed with signal " << r.signal << "\n" << r.err;
    EXPECT_GT(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "") << "stdout is not empty on failure";
    EXPECT_EQ(r.err.rfind("vxq: error: ", 0), 0u) << "stderr does not start with the prefix:\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "stderr is not exactly one line:\n" << r.err;
    EXPECT_FALSE(r.err.empty() || r.err.back() != '\n') << r.err;
    EXPECT_NE(r.err.find(b.expect_in_stderr), std::string::npos)
        << "stderr does not mention '" << b.expect_in_stderr << "':\n" << r.err;
}

std::string M() { return test::shared_path(kModelRel); }
std::string T() { return test::shared_path("assets/text/tinystories_valid_head.txt"); }
using Args = std::vector<std::string>;

// A VecInfer calibration of M()'s shape (n=4, m=8, constant codebooks): made for M() itself when
// `for_this_model`, else for a model whose sha256 is all zeros. Written once per name.
std::string vecinfer_calib(const std::string& name, bool for_this_model) {
    const auto p = std::filesystem::temp_directory_path() / ("vxq_cli_calib_" + name + ".gguf");
    if (std::filesystem::exists(p)) return p.string();
    const auto model = Model::load(M());
    const ModelConfig& cfg = model->config();
    VecinferCalibration c;
    c.model_sha256 = for_this_model ? sha256_file(M()) : std::string(64, '0');
    c.model_file = "other.gguf";
    c.tokens = 1;
    c.n_layer = cfg.n_layer, c.n_head_kv = cfg.n_head_kv, c.head_dim = cfg.head_dim;
    for (int64_t l = 0; l < cfg.n_layer; ++l) {
        VecinferCalibration::Layer L;
        L.key_lambda.assign(size_t(cfg.head_dim), 1.0f);
        L.key_codebook.assign(size_t(cfg.head_dim * 256), 0.5f);
        L.value_codebook = L.key_codebook;
        c.layers.push_back(L);
    }
    save_vecinfer_calibration(p.string(), c);
    return p.string();
}
std::string calib_prefix(size_t n) {
    std::ifstream in(vecinfer_calib("this_model", true), std::ios::binary);
    std::string s(n, '\0');
    in.read(s.data(), std::streamsize(n));
    return s;
}

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
    {"HugeContext", [] { return std::vector<std::string>{"generate", "-m", M(), "-p", "x", "-c", "16000000"}; },
     "--device cpu: this run needs"},
    {"TpDoesNotDivideKvHeads", [] { return std::vector<std::string>{"generate", "-m", M(), "-p", "x", "--tp", "3"}; },
     "does not divide the 2 KV heads"},
    {"TpZero", [] { return std::vector<std::string>{"generate", "-m", M(), "-p", "x", "--tp", "0"}; }, "--tp"},
    {"TpQFilters", [] { return std::vector<std::string>{"perplexity", "-m", M(), "-f", T(), "--mode", "stream", "--tp", "2",
                                                        "--evict", "qfilters:budget=64,calib=/nonexistent.gguf"}; },
     "--evict qfilters with --tp 2"},
    {"SynthTpDoesNotSplit", [] { return std::vector<std::string>{"synth", "--shape", "tiny", "--type", "q4_0", "--tp", "4", "-o",
                                                                 (std::filesystem::temp_directory_path() / "vxq_cli_never.gguf").string()}; },
     "--shape tiny: --tp 4 does not divide the 2 KV heads"},
    {"BenchTpTwoModels", [] { return std::vector<std::string>{"bench", "-m", M(), "-m", M(), "-p", "0", "-n", "2", "--tp", "2"}; },
     "--tp 2 runs one model"},
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
    {"PromptFileMissing", [] { return std::vector<std::string>{"generate", "-m", M(), "-f", "/nonexistent_prompt.txt"}; }, "/nonexistent_prompt.txt"},
    // CLI11's own errors, reworded into one line.
    {"MissingModelFlag", [] { return Args{"generate", "-p", "x"}; }, "--model is required"},
    {"FlagWithoutValue", [] { return Args{"bench", "-m"}; }, "--model"},
    {"UnexpectedPositional", [] { return Args{"generate", "-m", M(), "-p", "x", "stray"}; }, "stray"},
    {"PromptAndFile", [] { return Args{"generate", "-m", M(), "-p", "x", "-f", T()}; }, "--prompt excludes --file"},
    {"TopLevelUnknownFlag", [] { return Args{"--bogus"}; }, "subcommand"},
    {"BenchCsvAndJson", [] { return Args{"bench", "-m", M(), "--csv", "--json"}; }, "--csv excludes --json"},
    {"EvalSpeedPlotWithoutBench", [] { return Args{"eval", "-m", M(), "-f", T(), "--kv", "f16", "--speed-plot", "/tmp/vxq_s.svg"}; }, "requires --bench"},
    // generate refuses a binary prompt file before echoing anything.
    {"BinaryPromptFile", [] { return Args{"generate", "-m", M(), "-f", tmp_file("binary.txt", std::string("\x7f" "ELF\x02\x01\x01\0\xff\xfe", 10) + std::string(3000, '\x90'))}; }, "UTF-8"},
    // perplexity and eval print nothing before a refusal.
    {"EvalTextTooShort", [] { return Args{"eval", "-m", M(), "-f", tmp_file("short_eval.txt", "Just a few words."), "--kv", "q8_0", "-c", "64"}; }, "needs at least"},
    // vxq passkey: the set file is checked before the model loads.
    {"PasskeyNotJson", [] { return Args{"passkey", "-m", M(), "-f", T()}; }, "not a pass-key set: invalid JSON"},
    {"PasskeyCaseWithoutAnswer", [] { return Args{"passkey", "-m", M(), "-f", tmp_file("pk.json", R"({"name": "x", "cases": [{"id": "a", "prompt": "p"}]})")}; }, "case 0 has no \"answer\""},
    {"PasskeyNoCaseOfLength", [] { return Args{"passkey", "-m", M(), "-f", tmp_file("pk1.json", R"({"name": "x", "cases": [{"id": "a", "prompt": "p", "answer": "1", "target_tokens": 8, "prompt_tokens": 3, "depth": 0.5}]})"), "--lengths", "4000"}; }, "no case of length 4000"},
    {"PasskeyMissingFile", [] { return Args{"passkey", "-m", M(), "-f", "/nonexistent/pk.json"}; }, "/nonexistent/pk.json"},
    // -f DIRECTORY is not an empty text.
    {"GeneratePromptFileIsDirectory", [] { return Args{"generate", "-m", M(), "-f", "/tmp"}; }, "is a directory"},
    {"PerplexityTextIsDirectory", [] { return Args{"perplexity", "-m", M(), "-f", "/tmp"}; }, "is a directory"},
    {"EvalTextIsDirectory", [] { return Args{"eval", "-m", M(), "-f", "/tmp", "--kv", "q8_0"}; }, "is a directory"},
    // Sampling settings: finite and in range.
    {"TempNan", [] { return Args{"generate", "-m", M(), "-p", "x", "--temp", "nan"}; }, "--temp"},
    {"TempInf", [] { return Args{"generate", "-m", M(), "-p", "x", "--temp", "inf"}; }, "--temp"},
    {"TempNegative", [] { return Args{"generate", "-m", M(), "-p", "x", "--temp", "-0.5"}; }, "--temp"},
    {"TempNotANumber", [] { return Args{"generate", "-m", M(), "-p", "x", "--temp", "hot"}; }, "--temp"},
    {"TopKNegative", [] { return Args{"generate", "-m", M(), "-p", "x", "--top-k", "-1"}; }, "--top-k"},
    {"TopPNan", [] { return Args{"generate", "-m", M(), "-p", "x", "--top-p", "nan"}; }, "--top-p"},
    {"MinPOutOfRange", [] { return Args{"generate", "-m", M(), "-p", "x", "--min-p", "1.5"}; }, "--min-p"},
    {"MinPNan", [] { return Args{"generate", "-m", M(), "-p", "x", "--min-p", "nan"}; }, "--min-p"},
    // --prefill-exact where it means nothing.
    {"GeneratePrefillExactF16", [] { return Args{"generate", "-m", M(), "-p", "x", "--prefill-exact"}; }, "--prefill-exact changes nothing"},
    {"PerplexityPrefillExactF16", [] { return Args{"perplexity", "-m", M(), "-f", T(), "--prefill-exact"}; }, "--prefill-exact changes nothing"},
    {"PerplexityPrefillExactStream", [] { return Args{"perplexity", "-m", M(), "-f", T(), "--kv", "q8_0", "--mode", "stream", "--prefill-exact"}; }, "stream mode"},
    {"EvalPrefillExactF16Only", [] { return Args{"eval", "-m", M(), "-f", T(), "--kv", "f16", "--prefill-exact"}; }, "--prefill-exact changes nothing"},
    {"EvalPrefillExactStreamOnly", [] { return Args{"eval", "-m", M(), "-f", T(), "--kv", "q8_0", "--mode", "stream", "--prefill-exact"}; }, "stream mode"},
    {"EvalAttnEveryPrefillOnly", [] { return Args{"eval", "-m", M(), "-f", T(), "--kv", "q8_0", "--mode", "prefill", "--attn-every", "8"}; }, "--attn-every"},
    // --evict: the spec and a Q-Filters calibration file are checked before any work.
    {"EvictUnknownPolicy", [] { return Args{"perplexity", "-m", M(), "-f", T(), "--mode", "stream", "--evict", "lru:budget=64"}; }, "unknown policy 'lru'"},
    {"EvictWithoutBudget", [] { return Args{"generate", "-m", M(), "-p", "x", "--evict", "knorm"}; }, "exactly one of budget"},
    {"EvictQFiltersWithoutCalib", [] { return Args{"generate", "-m", M(), "-p", "x", "--evict", "qfilters:budget=64"}; }, "needs its calibration"},
    {"EvictQFiltersMissingCalib", [] { return Args{"perplexity", "-m", M(), "-f", T(), "--mode", "stream", "--evict", "qfilters:budget=64,calib=/nonexistent/qf.gguf"}; }, "/nonexistent/qf.gguf"},
    {"PerplexityEvictInPrefillMode", [] { return Args{"perplexity", "-m", M(), "-f", T(), "--evict", "knorm:budget=64"}; }, "use --mode stream"},
    {"EvalEvictInPrefillMode", [] { return Args{"eval", "-m", M(), "-f", T(), "--kv", "f16@knorm:budget=64"}; }, "use --mode stream"},
    {"EvalEvictEmptyPolicy", [] { return Args{"eval", "-m", M(), "-f", T(), "--kv", "f16@", "--mode", "stream"}; }, "no eviction policy after '@'"},
    // Thread counts.
    {"GenerateTooManyThreads", [] { return Args{"generate", "-m", M(), "-p", "x", "-t", too_many_threads()}; }, "threads"},
    {"PerplexityTooManyThreads", [] { return Args{"perplexity", "-m", M(), "-f", T(), "-t", too_many_threads()}; }, "threads"},
    {"EvalTooManyThreads", [] { return Args{"eval", "-m", M(), "-f", T(), "--kv", "q8_0", "-c", "64", "--chunks", "1", "-t", too_many_threads()}; }, "threads"},
    {"BenchTooManyThreads", [] { return Args{"bench", "-m", M(), "-p", "0", "-n", "1", "-r", "1", "-t", too_many_threads()}; }, "threads"},
    // Output paths are checked before the run.
    {"EvalJsonUnwritable", [] { return Args{"eval", "-m", M(), "-f", T(), "--kv", "q8_0", "--json", "/nonexistent_dir/eval.json"}; }, "/nonexistent_dir/eval.json"},
    {"EvalPlotIsDirectory", [] { return Args{"eval", "-m", M(), "-f", T(), "--kv", "q8_0", "--plot", "/tmp"}; }, "is a directory"},
    // GGUF tensors that do not match the header, each named.
    // --device: an unknown name in every command that runs a model, and what the CUDA backend
    // cannot run, refused before any work whether or not this machine has a GPU (a build without
    // CUDA refuses the name itself).
    {"DeviceUnknownGenerate", [] { return Args{"generate", "-m", M(), "-p", "x", "--device", "nope"}; }, "unknown device 'nope' (this build has: cpu"},
    {"DeviceUnknownPerplexity", [] { return Args{"perplexity", "-m", M(), "-f", T(), "--device", "nope"}; }, "unknown device 'nope'"},
    {"DeviceUnknownEval", [] { return Args{"eval", "-m", M(), "-f", T(), "--kv", "q8_0", "--device", "nope"}; }, "unknown device 'nope'"},
    {"DeviceUnknownBench", [] { return Args{"bench", "-m", M(), "--device", "nope"}; }, "unknown device 'nope'"},
    {"DeviceCudaKeysF32", [] { return Args{"generate", "-m", M(), "-p", "x", "--device", "cuda", "-ctk", "f32"}; },
     VXQ_HAVE_CUDA ? "--device cuda: KV method f32 (keys) has no cuda reader yet; use --device cpu" : "this build has no CUDA backend"},
    {"DeviceCudaValuesBf16", [] { return Args{"generate", "-m", M(), "-p", "x", "--device", "cuda", "-ctv", "bf16"}; },
     VXQ_HAVE_CUDA ? "--device cuda: KV method bf16 (values) has no cuda reader yet" : "this build has no CUDA backend"},
    {"DeviceCudaPerplexityBf16", [] { return Args{"perplexity", "-m", M(), "-f", T(), "--device", "cuda", "--kv", "bf16"}; },
     VXQ_HAVE_CUDA ? "--device cuda: KV method bf16 (keys) has no cuda reader yet" : "this build has no CUDA backend"},
    {"DeviceCudaEvalMethod", [] { return Args{"eval", "-m", M(), "-f", T(), "--kv", "f16,fp8,bf16", "--device", "cuda"}; },
     VXQ_HAVE_CUDA ? "--device cuda: KV method bf16 (keys) has no cuda reader yet" : "this build has no CUDA backend"},
    {"DeviceCudaEvalReference", [] { return Args{"eval", "-m", M(), "-f", T(), "--kv", "f16", "--ref", "f32", "--device", "cuda"}; },
     VXQ_HAVE_CUDA ? "--device cuda: KV method f32 (keys) has no cuda reader yet" : "this build has no CUDA backend"},
    {"DeviceCudaBenchMethod", [] { return Args{"bench", "-m", M(), "--kv", "f16,q4_0/f32", "--device", "cuda"}; },
     VXQ_HAVE_CUDA ? "--device cuda: KV method f32 (values) has no cuda reader yet" : "this build has no CUDA backend"},
    {"BlockCountLowered", [] { return Args{"generate", "-m", broken_model("block_count", [](test::TinyModelSpec& s) { s.meta_n_layer = 1; }), "-p", "x"}; },
     "tensor 'blk.1.attn_norm.weight' is not used by a llama model with block_count 1"},
    {"ExtraTensor", [] { return Args{"generate", "-m", broken_model("extra", [](test::TinyModelSpec& s) { s.extra_tensors = {"rope_freqs.weight"}; }), "-p", "x"}; },
     "tensor 'rope_freqs.weight' is not used"},
    {"MissingTensor", [] { return Args{"generate", "-m", broken_model("missing", [](test::TinyModelSpec& s) { s.drop_tensors = {"blk.1.ffn_down.weight"}; }), "-p", "x"}; },
     "missing tensor 'blk.1.ffn_down.weight'"},
    {"WrongTensorShape", [] { return Args{"generate", "-m", broken_model("shape", [](test::TinyModelSpec& s) { s.reshape["blk.0.attn_v.weight"] = {64, 48}; }), "-p", "x"}; },
     "tensor 'blk.0.attn_v.weight' has shape [64, 48], expected [64, 32]"},
    // VecInfer calibration: the command's inputs, and a calibration file that is missing, of
    // another model, not a GGUF or truncated, in every command that takes --kv.
    {"CalibrateUnknownMethod", [] { return Args{"calibrate", "-m", M(), "-f", T(), "--method", "q4_0", "-o", "/tmp/vxq_c.gguf"}; }, "method 'q4_0' has no calibration"},
    {"CalibrateCalibOption", [] { return Args{"calibrate", "-m", M(), "-f", T(), "--method", "vecinfer:calib=x", "-o", "/tmp/vxq_c.gguf"}; }, "no option 'calib'"},
    {"CalibrateBadN", [] { return Args{"calibrate", "-m", M(), "-f", T(), "--method", "vecinfer:n=3", "-o", "/tmp/vxq_c.gguf"}; }, "power of two"},
    {"CalibrateMissingText", [] { return Args{"calibrate", "-m", M(), "-f", "/nonexistent_calib.txt", "--method", "vecinfer", "-o", "/tmp/vxq_c.gguf"}; }, "/nonexistent_calib.txt"},
    {"CalibrateTextTooShort", [] { return Args{"calibrate", "-m", M(), "-f", tmp_file("calib_short.txt", "Just a few words."), "--method", "vecinfer", "-o", "/tmp/vxq_c.gguf"}; }, "fewer than the 2^8 = 256 centroids"},
    {"CalibrateOutputUnwritable", [] { return Args{"calibrate", "-m", M(), "-f", T(), "--method", "vecinfer", "-o", "/nonexistent_dir/c.gguf"}; }, "/nonexistent_dir/c.gguf"},
    {"CalibrateTooManyIterations", [] { return Args{"calibrate", "-m", M(), "-f", T(), "--method", "vecinfer", "-o", "/tmp/vxq_c.gguf", "--iterations", "31"}; }, "--iterations"},
    {"VecinferWithoutCalibration", [] { return Args{"perplexity", "-m", M(), "-f", T(), "-c", "64", "--kv", "vecinfer"}; }, "calib=FILE"},
    {"VecinferCalibrationMissing", [] { return Args{"perplexity", "-m", M(), "-f", T(), "-c", "64", "--kv", "vecinfer:calib=/nonexistent_calib.gguf"}; }, "/nonexistent_calib.gguf"},
    {"VecinferCalibrationOtherModel", [] { return Args{"perplexity", "-m", M(), "-f", T(), "-c", "64", "--kv", "vecinfer:calib=" + vecinfer_calib("other_model", false)}; }, "calibration of another model"},
    {"VecinferCalibrationOtherModelEval", [] { return Args{"eval", "-m", M(), "-f", T(), "-c", "64", "--chunks", "1", "--kv", "q8_0,vecinfer:calib=" + vecinfer_calib("other_model", false)}; }, "calibration of another model"},
    {"VecinferCalibrationOtherModelBench", [] { return Args{"bench", "-m", M(), "-p", "0", "-n", "1", "-r", "1", "--kv", "vecinfer:calib=" + vecinfer_calib("other_model", false)}; }, "calibration of another model"},
    {"VecinferCalibrationOtherModelGenerate", [] { return Args{"generate", "-m", M(), "-p", "x", "-n", "1", "-ctk", "vecinfer:calib=" + vecinfer_calib("other_model", false)}; }, "calibration of another model"},
    {"VecinferCalibrationNotGguf", [] { return Args{"perplexity", "-m", M(), "-f", T(), "-c", "64", "--kv", "vecinfer:calib=" + tmp_file("calib_junk.gguf", "not a calibration at all")}; }, "bad magic"},
    {"VecinferCalibrationIsAModel", [] { return Args{"perplexity", "-m", M(), "-f", T(), "-c", "64", "--kv", "vecinfer:calib=" + M()}; }, "vxq.calibration.method"},
    {"VecinferCalibrationTruncatedHeader", [] { return Args{"perplexity", "-m", M(), "-f", T(), "-c", "64", "--kv", "vecinfer:calib=" + tmp_file("calib_trunc100.gguf", calib_prefix(100))}; }, "calib_trunc100.gguf: invalid GGUF"},
    {"VecinferCalibrationTruncatedData", [] { return Args{"perplexity", "-m", M(), "-f", T(), "-c", "64", "--kv", "vecinfer:calib=" + tmp_file("calib_trunc20k.gguf", calib_prefix(20000))}; }, "calib_trunc20k.gguf"},
    // vxq quantize: flags, files and inputs it cannot quantize; nothing is written.
    {"QuantizeUnknownType", [] { return Args{"quantize", "-m", M(), "-o", "/tmp/vxq_q.gguf", "--type", "q5_k"}; }, "unknown --type 'q5_k'"},
    {"QuantizeUnknownRule", [] { return Args{"quantize", "-m", M(), "-o", "/tmp/vxq_q.gguf", "--type", "tq2_0", "--ternary", "mean"}; }, "unknown --ternary 'mean'"},
    {"QuantizeMissingInput", [] { return Args{"quantize", "-m", "/nonexistent_in.gguf", "-o", "/tmp/vxq_q.gguf", "--type", "q8_0"}; }, "/nonexistent_in.gguf"},
    {"QuantizeOutputUnwritable", [] { return Args{"quantize", "-m", M(), "-o", "/nonexistent_dir/q.gguf", "--type", "q8_0"}; }, "/nonexistent_dir/q.gguf"},
    {"QuantizeOutputIsInput", [] { return Args{"quantize", "-m", tmp_file("q_same.gguf", model_prefix(1 << 20)), "-o", std::filesystem::temp_directory_path().string() + "/vxq_cli_q_same.gguf", "--type", "q8_0"}; }, "is the input"},
    {"QuantizeQuantizedInput", [] { return Args{"quantize", "-m", test::shared_path("assets/models/vxq-llama-h64-q4_0.gguf"), "-o", "/tmp/vxq_q.gguf", "--type", "q8_0"}; }, "quantize from a file of f32, f16 or bf16"},
    {"QuantizeTruncatedInput", [] { return Args{"quantize", "-m", tmp_file("q_trunc.gguf", model_prefix(4000)), "-o", "/tmp/vxq_q.gguf", "--type", "q8_0"}; }, "q_trunc.gguf"},
    // eval --passkey: the set and the options are checked before any model loads.
    {"EvalNeitherTextNorPasskey", [] { return Args{"eval", "-m", M(), "--kv", "q8_0"}; }, "a pass-key set (--passkey), or both"},
    {"EvalPasskeyNotJson", [] { return Args{"eval", "-m", M(), "--kv", "q8_0", "--passkey", T()}; }, "not a pass-key set: invalid JSON"},
    {"EvalPasskeyNoCaseOfLength", [] { return Args{"eval", "-m", M(), "--kv", "q8_0", "--passkey", tmp_file("pk2.json", R"({"name": "x", "cases": [{"id": "a", "prompt": "p", "answer": "1", "target_tokens": 8, "prompt_tokens": 3, "depth": 0.5}]})"), "--passkey-lengths", "4000"}; }, "no case of length 4000"},
    {"EvalPasskeyModelMissing", [] { return Args{"eval", "-m", M(), "--kv", "q8_0", "--passkey", tmp_file("pk3.json", R"({"name": "x", "cases": [{"id": "a", "prompt": "p", "answer": "1", "target_tokens": 8, "prompt_tokens": 3, "depth": 0.5}]})"), "--passkey-model", "/nonexistent_pk.gguf"}; }, "/nonexistent_pk.gguf"},
    {"EvalPasskeyLengthsWithoutSet", [] { return Args{"eval", "-m", M(), "-f", T(), "--kv", "q8_0", "--passkey-lengths", "4000"}; }, "go with --passkey"},
    {"EvalPlotWithoutText", [] { return Args{"eval", "-m", M(), "--kv", "q8_0", "--passkey", tmp_file("pk4.json", R"({"name": "x", "cases": [{"id": "a", "prompt": "p", "answer": "1", "target_tokens": 8, "prompt_tokens": 3, "depth": 0.5}]})"), "--plot", "/tmp/vxq_pk.svg"}; }, "needs a text (-f)"},
    // Empty or ill-formed inputs of eval, plot and calibrate: an error, never an empty success.
    {"EvalEmptyText", [] { return Args{"eval", "-m", M(), "-f", tmp_file("eval_empty.txt", ""), "--kv", "q8_0", "--plot", "/tmp/vxq_empty.svg"}; }, "eval_empty.txt is empty"},
    {"PlotEmptyTable", [] { return Args{"plot", tmp_file("plot_empty.tsv", "# only a comment\n"), "-o", "/tmp/vxq_plot_empty.svg"}; }, "no data rows"},
    {"PlotNotANumber", [] { return Args{"plot", tmp_file("plot_nan.tsv", "1\t2\n2\tnan\n"), "-o", "/tmp/vxq_plot_nan.svg"}; }, "plot_nan.tsv:2: column 2 ('nan') is not a finite number"},
    {"PlotTrailingJunk", [] { return Args{"plot", tmp_file("plot_junk.tsv", "1\t2 \n1\t12abc\n"), "-o", "/tmp/vxq_plot_junk.svg"}; }, "plot_junk.tsv:2: column 2 ('12abc') is not a finite number"},
    {"CalibrateTurboFewerVectorsThanHeadDim", [] { return Args{"calibrate", "-m", M(), "-f", T(), "--method", "turbo", "-o", "/tmp/vxq_turbo_few.gguf", "--tokens", "8", "-c", "8"}; }, "fewer than head_dim 64"},
    {"VecinferCalibrationWrongShape", [] { return Args{"perplexity", "-m", M(), "-f", T(), "-c", "64", "--kv", "vecinfer:n=8,calib=" + vecinfer_calib("this_model", true)}; }, "not n=8,m=8"},
};

INSTANTIATE_TEST_SUITE_P(Table, CliBadInput, ::testing::ValuesIn(kBadInputs),
                         [](const auto& info) { return std::string(info.param.name); });

// vxq calibrate writes a file that perplexity then runs with; the summary names the model's sha256.
TEST(Cli, CalibrateThenRunWithTheCalibration) {
    VXQ_REQUIRE_ASSET(kModelRel);
    const std::string out = (std::filesystem::temp_directory_path() / "vxq_cli_calibrated.gguf").string();
    std::filesystem::remove(out);
    const auto c = test::run_cli({"calibrate", "-m", M(), "-f", T(), "--method", "vecinfer:n=4,m=6", "--tokens", "160",
                                  "--iterations", "5", "-t", "2", "-o", out});
    ASSERT_EQ(c.exit_code, 0) << c.err;
    EXPECT_NE(c.out.find(sha256_file(M())), std::string::npos) << c.out;
    EXPECT_NE(c.out.find("use --kv vecinfer:n=4,m=6,calib=" + out), std::string::npos) << c.out;
    const auto r = test::run_cli({"perplexity", "-m", M(), "-f", T(), "-c", "64", "--chunks", "1", "-t", "2", "--kv",
                                  "vecinfer:n=4,m=6,calib=" + out});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("Final estimate: PPL = "), std::string::npos) << r.out;
}

// eval --passkey: every method and the reference answer the set on the pass-key model, in the
// table and the JSON. Two cases of 1024 tokens of the shared set (the f16 cache answers both).
TEST(Cli, EvalAnswersAPassKeySetWithEveryMethod) {
    const std::string model_rel = "assets/models/vxq-passkey-h64-f16.gguf", set_rel = "assets/passkey/passkey_wikitext.json";
    VXQ_REQUIRE_ASSET(model_rel);
    VXQ_REQUIRE_ASSET(set_rel);
    nlohmann::json set = nlohmann::json::parse(test::read_file(test::shared_path(set_rel)));
    nlohmann::json two = nlohmann::json::array();
    for (const auto& c : set["cases"]) {
        if (c["target_tokens"] == 1024 && two.size() < 2) two.push_back(c);
    }
    const std::string set_path = tmp_file("pk_two.json", nlohmann::json{{"name", "two"}, {"cases", two}}.dump());
    const std::string json_path = (std::filesystem::temp_directory_path() / "vxq_cli_pk_eval.json").string();
    std::filesystem::remove(json_path);
    const auto r = test::run_cli({"eval", "-m", test::shared_path(model_rel), "--passkey", set_path, "--kv",
                                  "q8_0,f16@streaming:budget=64", "-t", "2", "--json", json_path});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("| f16 (reference) | 2/2 | 1024: 2/2 |"), std::string::npos) << r.out;
    const auto j = nlohmann::json::parse(test::read_file(json_path));
    const auto& methods = j["passkey"]["methods"];
    ASSERT_EQ(methods.size(), 3u) << j.dump();
    EXPECT_EQ(methods[0]["method"], "f16");
    EXPECT_EQ(methods[0]["reference"], true);
    EXPECT_EQ(methods[1]["method"], "q8_0");
    EXPECT_EQ(methods[1]["correct"], 2);  // q8_0 answers all 40 cases of 4000 tokens (docs/kv-methods.md)
    EXPECT_EQ(methods[2]["method"], "f16@streaming:budget=64");
    for (const auto& m : methods) EXPECT_EQ(m["total"], 2) << m.dump();
    EXPECT_EQ(j["passkey"]["cases"], 2);
}

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

// The issue's reproduction: sampled byte tokens that are not UTF-8 aborted the JSON writer
// (SIGABRT). Now the text carries U+FFFD and two fields say so.
TEST(Cli, GenerateJsonReplacesInvalidUtf8AndSaysSo) {
    const std::string rel = "assets/models/stories260K.gguf";
    VXQ_REQUIRE_ASSET(rel);
    const auto r = test::run_cli({"generate", "-m", test::shared_path(rel), "-p", "Once", "-n", "64", "--temp", "5", "--top-k", "0",
                                  "--top-p", "1", "--min-p", "0", "--seed", "2", "--json", "-t", "1"});
    ASSERT_EQ(r.signal, 0) << r.err;
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["text_valid_utf8"], false);
    EXPECT_EQ(j["invalid_utf8_replaced"], true);
    EXPECT_NE(j["text"].get<std::string>().find("\xEF\xBF\xBD"), std::string::npos) << "no U+FFFD in the text";
    EXPECT_EQ(j["ids"].size(), 64u);
}

// --device cuda with the f16 cache: on a machine with a GPU it runs there and reports the weights
// it holds; without one (or in a build without CUDA) it is the backend's own one-line refusal,
// before anything is printed.
TEST(Cli, DeviceCudaRunsOrIsTheBackendsOneLineError) {
    VXQ_REQUIRE_ASSET(kModelRel);
    std::string refusal;
    try {
        make_backend("cuda", 1);
    } catch (const Error& e) {
        refusal = e.what();
    }
    const auto r = test::run_cli({"generate", "-m", M(), "-p", "The kernel", "-n", "4", "--temp", "0", "--json", "--device", "cuda"});
    ASSERT_EQ(r.signal, 0) << r.err;
    if (!refusal.empty()) {
        EXPECT_EQ(r.exit_code, 1);
        EXPECT_EQ(r.out, "");
        EXPECT_EQ(r.err, "vxq: error: " + refusal + "\n");
        return;
    }
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["backend"].get<std::string>().rfind("cuda/", 0), 0u) << j["backend"];
    EXPECT_EQ(j["backend_memory"]["where"].get<std::string>().rfind("GPU 0", 0), 0u) << j["backend_memory"];
    EXPECT_GT(j["backend_memory"]["weight_bytes"].get<size_t>(), 0u);
}

// generate --json reports what the backend holds: on the CPU no weight copies (the file is
// mapped), the activation buffers of the largest batch, in host RAM.
TEST(Cli, GenerateJsonReportsBackendMemory) {
    VXQ_REQUIRE_ASSET(kModelRel);
    const auto r = test::run_cli({"generate", "-m", M(), "-p", "The kernel", "-n", "2", "--temp", "0", "--json", "-t", "1",
                                  "--device", "cpu"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto m = nlohmann::json::parse(r.out)["backend_memory"];
    EXPECT_EQ(m["where"], "host RAM");
    EXPECT_EQ(m["weight_bytes"], 0);
    EXPECT_GT(m["activation_bytes"].get<size_t>(), 0u);
}

// --tp 2 on the CPU's reference group: the same greedy text as one rank, and each rank's
// backend, memory and KV bytes in the JSON (the two ranks hold one KV head each: half the bytes).
TEST(Cli, GenerateTp2MatchesTp1AndReportsEachRank) {
    VXQ_REQUIRE_ASSET(kModelRel);
    const std::vector<std::string> args{"generate", "-m", M(), "-p", "The kernel", "-n", "24", "--temp", "0", "--json", "-t", "2",
                                        "--kv", "q8_0"};
    const auto one = test::run_cli(args);
    auto split_args = args;
    split_args.insert(split_args.end(), {"--tp", "2"});
    const auto two = test::run_cli(split_args);
    ASSERT_EQ(one.exit_code, 0) << one.err;
    ASSERT_EQ(two.exit_code, 0) << two.err;
    const auto a = nlohmann::json::parse(one.out), b = nlohmann::json::parse(two.out);
    EXPECT_EQ(a["ids"], b["ids"]);
    EXPECT_FALSE(a.contains("tp"));
    ASSERT_EQ(b["tp"]["size"], 2);
    for (int r = 0; r < 2; ++r) {
        const auto& rank = b["tp"]["ranks"][size_t(r)];
        EXPECT_NE(rank["backend"].get<std::string>().find(fmt::format("rank {} of 2", r)), std::string::npos) << rank;
        EXPECT_EQ(rank["memory"]["where"], "host RAM");
        EXPECT_EQ(2 * rank["kv_resident_bytes"].get<size_t>(), a["kv_cache"]["resident_bytes"].get<size_t>());
    }
    EXPECT_EQ(b["kv_cache"]["resident_bytes"], a["kv_cache"]["resident_bytes"]);
    EXPECT_EQ(b["kv_cache"]["bits_per_element"], a["kv_cache"]["bits_per_element"]);
}

// --device cuda --tp 2: where the machine has no two GPUs (or the build no CUDA or no NCCL), the
// one-line refusal naming why, before anything is printed; with two, the same ids as --tp 1.
TEST(Cli, CudaTp2RunsOrIsOneLineError) {
    VXQ_REQUIRE_ASSET(kModelRel);
    const std::vector<std::string> args{"generate", "-m", M(), "-p", "The kernel", "-n", "8", "--temp", "0", "--json", "--device", "cuda"};
    auto two = args;
    two.insert(two.end(), {"--tp", "2"});
    const auto r = test::run_cli(two);
    ASSERT_EQ(r.signal, 0) << r.err;
    if (r.exit_code != 0) {
        EXPECT_EQ(r.out, "");
        EXPECT_EQ(r.err.rfind("vxq: error: ", 0), 0u) << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
        const bool why = r.err.find("no CUDA") != std::string::npos || r.err.find("needs 2 GPUs") != std::string::npos ||
                         r.err.find("no NCCL") != std::string::npos;
        EXPECT_TRUE(why) << r.err;
        return;
    }
    const auto one = test::run_cli(args);
    ASSERT_EQ(one.exit_code, 0) << one.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["ids"], nlohmann::json::parse(one.out)["ids"]);
}

// synth --tp N checks the split before writing: a refused one leaves no file.
TEST(Cli, SynthTpChecksBeforeWriting) {
    const auto out = std::filesystem::temp_directory_path() / "vxq_cli_synth_tp.gguf";
    std::filesystem::remove(out);
    const auto bad = test::run_cli({"synth", "--shape", "tiny", "--tp", "4", "-o", out.string()});
    EXPECT_EQ(bad.exit_code, 1) << bad.err;
    EXPECT_FALSE(std::filesystem::exists(out));
    const auto good = test::run_cli({"synth", "--shape", "tiny", "--tp", "2", "-o", out.string()});
    EXPECT_EQ(good.exit_code, 0) << good.err;
    EXPECT_TRUE(std::filesystem::exists(out));
    std::filesystem::remove(out);
}

// vxq bench --tp 2: every configuration on the group, each rank's memory in the JSON.
TEST(Cli, BenchTp2ReportsEachRank) {
    VXQ_REQUIRE_ASSET(kModelRel);
    const auto r = test::run_cli({"bench", "-m", M(), "-p", "0", "-n", "4", "-r", "1", "--kv", "f16,q4_0", "--tp", "2", "--json", "-t", "2"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["tp"]["size"], 2);
    EXPECT_EQ(j["tp"]["rank_memory"].size(), 2u);
    ASSERT_EQ(j["rows"].size(), 3u);  // f16, its A/A, q4_0
    EXPECT_NE(j["rows"][2]["config"].get<std::string>().find("kv=q4_0 tp2"), std::string::npos) << j["rows"][2];
    EXPECT_NE(j["rows"][2]["code_path"].get<std::string>().find("rank 0 of 2"), std::string::npos) << j["rows"][2];
}

// Between the core count and 4x it, -t runs, with one warning line.
TEST(Cli, ThreadsAboveCoreCountWarnOnce) {
    VXQ_REQUIRE_ASSET(kModelRel);
    const std::string t = std::to_string(std::max(1u, std::thread::hardware_concurrency()) + 1);
    const auto r = test::run_cli({"generate", "-m", M(), "-p", "The kernel", "-n", "2", "--temp", "0", "--json", "-t", t});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err.rfind("vxq: warning: -t/--threads " + t + " is more than", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

}  // namespace
}  // namespace vxq

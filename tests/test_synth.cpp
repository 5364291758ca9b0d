// vxq synth: random-weight GGUF files of real model shapes. The shapes' sizes against the
// published parameter counts, the streaming writer's byte layout, files that load and run with
// finite, varied logits, reproducibility, and the errors of bad options.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iterator>
#include <set>

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "core/error.h"
#include "formats/ggml_quants.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "kv/kv_cache.h"
#include "kv/formats/baseline.h"
#include "model/model.h"
#include "model/synth.h"
#include "support/run_cli.h"
#include "support/text.h"

namespace vxq {
namespace {

using test::read_file;

namespace fs = std::filesystem;

std::string temp_path(const std::string& tag) {
    return (fs::temp_directory_path() / ("vxq_synth_" + std::to_string(::getpid()) + "_" + tag + ".gguf")).string();
}

struct TempFile {
    std::string path;
    explicit TempFile(const std::string& tag) : path(temp_path(tag)) {}
    ~TempFile() {
        std::error_code ec;
        fs::remove(path, ec);
    }
};

uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// ---- sizes, without writing anything ----

TEST(Synth, ShapesHaveThePublishedParameterCounts) {
    // Parameter counts as published on the models' Hugging Face pages (safetensors metadata).
    const std::pair<const char*, int64_t> published[] = {
        {"llama3-8b", 8'030'261'248},
        {"llama3.2-1b", 1'235'814'400},
        {"qwen2.5-7b", 7'615'616'512},
        {"llama3-70b", 70'553'706'496},
    };
    for (const auto& [name, count] : published) {
        const SynthModel m(SynthOptions{name, GgmlType::F16});
        int64_t n = 0;
        for (const GgufTensorInfo& t : m.file().tensors()) n += t.n_elements;
        EXPECT_EQ(n, count) << name;
    }
}

TEST(Synth, FileBytesAreTheHeaderPlusTheTensors) {
    // Llama-3-8B: 8,030,261,248 parameters of which 266,240 are f32 norm weights (65 of 4096).
    const int64_t norms = 4096 * 65, matrices = 8'030'261'248 - norms;
    const std::pair<GgmlType, uint64_t> cases[] = {
        {GgmlType::F16, uint64_t(matrices) * 2 + norms * 4},        // 16,061,054,976 (issue: "16.06 GB")
        {GgmlType::Q8_0, uint64_t(matrices) / 32 * 34 + norms * 4},
        {GgmlType::Q4_0, uint64_t(matrices) / 32 * 18 + norms * 4},
    };
    for (const auto& [type, data] : cases) {
        const SynthModel m(SynthOptions{"llama3-8b", type});
        const GgufStreamWriter& f = m.file();
        EXPECT_EQ(f.data_bytes(), data) << ggml_type_name(type);
        uint64_t sum = 0;
        for (const GgufTensorInfo& t : f.tensors()) {
            EXPECT_EQ(t.offset, sum) << t.name;
            sum += round_up(t.n_bytes, 32);
        }
        EXPECT_EQ(f.file_bytes(), f.header_bytes() + sum);
        EXPECT_EQ(f.header_bytes() % 32, 0u);
    }
    // --layers and --vocab change exactly the tensors they should.
    const SynthModel one(SynthOptions{"llama3-8b", GgmlType::Q4_0, 1, 1, 512});
    EXPECT_EQ(one.file().tensors().size(), 3u + 9u);
    EXPECT_EQ(one.shape().n_layer, 1);
    EXPECT_EQ(one.shape().n_vocab, 512);
    EXPECT_EQ(one.shape().bos, 510);  // the published 128000 does not fit: moved to the end
}

// ---- the quantizers the weights are written with ----

TEST(Synth, WeightsUseGgmlsReferenceQuantizers) {
    // q8_0: d = amax / 127 = 1 here; ggml's _ref rounds half away from zero (2.5 -> 3), unlike the
    // AVX2 quantizer the KV cache mirrors (half to even: 2.5 -> 2).
    std::vector<float> x(32, 0.25f);
    x[0] = 127.0f;
    x[1] = 2.5f;
    x[2] = -3.5f;
    BlockQ8_0 q8;
    quantize_row_q8_0_ref(x.data(), &q8, 32);
    EXPECT_EQ(fp16_to_fp32(q8.d), 1.0f);
    EXPECT_EQ(q8.qs[0], 127);
    EXPECT_EQ(q8.qs[1], 3);
    EXPECT_EQ(q8.qs[2], -4);
    EXPECT_EQ(q8.qs[3], 0);
    uint8_t kv[sizeof(BlockQ8_0)];
    kvfmt::Q8_0::encode(x.data(), 32, kv, 1.0f);
    EXPECT_EQ(int8_t(kv[2 + 1]), 2);

    // q4_0 is the same function as the KV cache's q4_0 (kv/formats/baseline.h): bit-identical on
    // random data, degenerate blocks included.
    std::vector<float> r(32 * 64);
    uint64_t s = 7;
    for (size_t i = 0; i < r.size(); ++i) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        r[i] = float(int64_t(s >> 33) - (int64_t(1) << 30)) * 0x1p-28f;
    }
    std::fill(r.begin(), r.begin() + 32, 0.0f);  // an all-zero block: d = 0
    std::vector<BlockQ4_0> mine(64);
    std::vector<uint8_t> theirs(64 * sizeof(BlockQ4_0));
    quantize_row_q4_0_ref(r.data(), mine.data(), int64_t(r.size()));
    kvfmt::Q4_0::encode(r.data(), int64_t(r.size()), theirs.data(), 1.0f);
    EXPECT_EQ(std::memcmp(mine.data(), theirs.data(), theirs.size()), 0);
}

// ---- files that load and run ----

struct RunStats {
    bool finite = true;
    double stddev = 0;
    std::set<TokenId> greedy;  // argmax of the last logits, one per prompt
};

RunStats run_prompts(const Model& model) {
    const ModelConfig& c = model.config();
    auto be = make_backend("cpu", 2);
    RunStats st;
    std::vector<float> logits(size_t(c.n_vocab));
    for (const char* prompt : {"Hello", "The quick brown fox", "1 2 3 4 5", "hello world model"}) {
        auto cache = make_kv_cache(KvShape{c.n_layer, c.n_head, c.n_head_kv, c.head_dim, 64}, KvSpec{});
        const std::vector<TokenId> ids = model.tokenizer().encode(prompt, true);
        model.forward(*be, *cache, ids, false, logits.data());
        double sum = 0, sq = 0;
        for (float v : logits) {
            st.finite = st.finite && std::isfinite(v);
            sum += v;
            sq += double(v) * v;
        }
        const double mean = sum / double(logits.size());
        st.stddev = std::max(st.stddev, std::sqrt(sq / double(logits.size()) - mean * mean));
        st.greedy.insert(TokenId(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    }
    return st;
}

void expect_runs(const std::string& path, const SynthModel& m) {
    EXPECT_EQ(fs::file_size(path), m.file().file_bytes());
    const auto model = Model::load(path);
    const ModelConfig& c = model->config();
    EXPECT_EQ(c.n_embd, m.shape().n_embd);
    EXPECT_EQ(c.n_layer, m.shape().n_layer);
    EXPECT_EQ(c.n_vocab, m.shape().n_vocab);
    // The byte-level vocabulary round-trips any text.
    const std::string text = "Hello, world! 123 héllo";
    EXPECT_EQ(model->tokenizer().decode(model->tokenizer().encode(text, false)), text);
    const RunStats st = run_prompts(*model);
    EXPECT_TRUE(st.finite);
    // Logits have std ~1 by construction (N(0, 1/fan_in) head after RMSNorm); 0.3 leaves room
    // for quantization and a small vocabulary while failing on flat (all-equal) logits.
    EXPECT_GT(st.stddev, 0.3);
    EXPECT_LT(st.stddev, 10.0);
    EXPECT_GE(st.greedy.size(), 2u) << "greedy next token is the same for every prompt";
}

TEST(Synth, TinyShapesLoadAndRunInEveryType) {
    for (const char* shape : {"tiny", "tiny-qwen2"}) {
        for (const char* type : {"f16", "q8_0", "q4_0"}) {
            SCOPED_TRACE(std::string(shape) + " " + type);
            const SynthModel m(SynthOptions{shape, *synth_weight_type(type), 3});
            const TempFile f(std::string(shape) + "_" + type);
            m.write(f.path);
            expect_runs(f.path, m);
        }
    }
}

TEST(Synth, Llama3_8bOneLayerQ4_0LoadsAndRuns) {
    // The real layer at full width (dim 4096, ff 14336, 32/8 heads); a 512-token vocabulary keeps
    // the file at ~125 MB instead of ~420 MB of embeddings and head.
    const SynthModel m(SynthOptions{"llama3-8b", GgmlType::Q4_0, 1, 1, 512});
    const TempFile f("l8b");
    m.write(f.path);
    expect_runs(f.path, m);
    const GgufFile g = GgufFile::open(f.path);
    EXPECT_EQ(g.find_tensor("blk.0.ffn_down.weight")->type, GgmlType::Q4_0);
    EXPECT_EQ(g.find_tensor("output.weight")->type, GgmlType::Q4_0);
    EXPECT_EQ(g.find_tensor("blk.0.attn_norm.weight")->type, GgmlType::F32);
    EXPECT_EQ(g.get_float("llama.rope.freq_base"), 500000.0);
}

// Ternary weights (issue 14's end-to-end runs): every matrix, token_embd (tied output) included,
// by the absmean rule with N(0, stddev^2)'s mean |x|; a one-layer Llama-3.2-1B loads and runs.
TEST(Synth, TernaryOneLayerLoadsAndRuns) {
    for (const GgmlType t : {GgmlType::TQ2_0, GgmlType::TQ2_G128}) {
        SCOPED_TRACE(ggml_type_name(t));
        const SynthModel m(SynthOptions{"llama3.2-1b", t, 1, 1, 512});
        const TempFile f(std::string("tern_") + std::string(ggml_type_name(t)));
        m.write(f.path);
        expect_runs(f.path, m);
        const GgufFile g = GgufFile::open(f.path);
        EXPECT_EQ(g.find_tensor("blk.0.ffn_down.weight")->type, t);
        EXPECT_EQ(g.find_tensor("token_embd.weight")->type, t);
        EXPECT_EQ(g.find_tensor("blk.0.attn_norm.weight")->type, GgmlType::F32);
        EXPECT_EQ(synth_weight_type(ggml_type_name(t)), t);
    }
    // rows of other than whole 256-value blocks (tiny: n_embd 128) are refused
    EXPECT_THROW(SynthModel(SynthOptions{"tiny", GgmlType::TQ2_0}), Error);
}

TEST(Synth, SameSeedSameBytesWhateverTheThreadCount) {
    SynthOptions o{"tiny", GgmlType::Q4_0, 11};
    o.threads = 1;
    const TempFile a("seed_a"), b("seed_b"), c("seed_c");
    SynthModel(o).write(a.path);
    o.threads = 2;
    SynthModel(o).write(b.path);
    o.seed = 12;
    SynthModel(o).write(c.path);
    EXPECT_EQ(read_file(a.path), read_file(b.path));
    EXPECT_NE(read_file(a.path), read_file(c.path));
}

TEST(Synth, AReducedVocabularyKeepsBosAndEos) {
    for (const ModelShape& s : model_shapes()) {
        const SynthModel m(SynthOptions{std::string(s.name), GgmlType::Q4_0, 1, 1, 400});
        EXPECT_EQ(m.shape().n_vocab, 400) << s.name;
        EXPECT_EQ(m.shape().bos, 398) << s.name;
        EXPECT_EQ(m.shape().eos, 399) << s.name;
        EXPECT_EQ(m.file().tensors()[0].ne, (std::vector<int64_t>{s.n_embd, 400})) << s.name;
    }
}

// ---- errors ----

TEST(Synth, BadOptionsAreErrors) {
    EXPECT_THROW(SynthModel(SynthOptions{"llama4-9000b"}), Error);
    EXPECT_THROW(SynthModel(SynthOptions{"tiny", GgmlType::Q6_K}), Error);
    EXPECT_THROW(SynthModel(SynthOptions{"tiny", GgmlType::F16, 1, -1}), Error);
    EXPECT_THROW(SynthModel(SynthOptions{"tiny", GgmlType::F16, 1, 0, 100}), Error);      // below the minimum
    EXPECT_THROW(SynthModel(SynthOptions{"tiny", GgmlType::F16, 1, 0, 100000}), Error);   // above the shape's
    EXPECT_FALSE(synth_weight_type("q6_K").has_value());
    EXPECT_FALSE(synth_weight_type("f32").has_value());
}

TEST(Synth, WriteErrorsLeaveNothingBehind) {
    const SynthModel m(SynthOptions{"tiny", GgmlType::Q8_0});
    const fs::path dir = fs::temp_directory_path() / ("vxq_synth_dir_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    // A filler that fails half way: no file, no temporary.
    GgufStreamWriter w = m.file();
    const std::string target = (dir / "half.gguf").string();
    EXPECT_THROW(w.write(target, [](size_t t, int64_t, int64_t, std::span<uint8_t>) {
                     if (t == 5) throw Error("injected");
                 }),
                 Error);
    EXPECT_TRUE(fs::is_empty(dir));
    // Writing over a directory fails at the rename; the temporary is removed.
    fs::create_directories(dir / "sub.gguf" / "x");
    EXPECT_THROW(m.write((dir / "sub.gguf").string()), Error);
    EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
    fs::remove_all(dir);
}

TEST(Synth, CliWritesAFileGenerateRuns) {
    const TempFile f("cli");
    const auto r = test::run_cli({"synth", "--shape", "tiny", "--type", "q8_0", "-o", f.path, "--seed", "5"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("tiny q8_0, 2 layers, vocab 512, seed 5"), std::string::npos) << r.out;
    EXPECT_EQ(r.err, "");  // progress only on a terminal
    const auto g = test::run_cli({"generate", "-m", f.path, "-p", "Hello", "-n", "8"});
    EXPECT_EQ(g.exit_code, 0) << g.err;
}

TEST(Synth, CliBadInputIsOneLineAndNonZero) {
    const TempFile f("cli_bad");
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        {{"synth", "--shape", "nope", "-o", f.path}, "unknown shape 'nope'"},
        {{"synth", "--shape", "tiny", "--type", "q6_K", "-o", f.path}, "unknown --type 'q6_K'"},
        {{"synth", "--shape", "tiny", "-o", "/nonexistent-dir/x.gguf"}, "cannot write '/nonexistent-dir/x.gguf'"},
        {{"synth", "--shape", "tiny", "--vocab", "10", "-o", f.path}, "--vocab 10 is out of range"},
    };
    for (const auto& [args, want] : cases) {
        const auto r = test::run_cli(args);
        EXPECT_NE(r.exit_code, 0) << want;
        EXPECT_EQ(r.err.rfind("vxq: error: ", 0), 0u) << r.err;
        EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
        EXPECT_FALSE(fs::exists(f.path));
    }
}

}  // namespace
}  // namespace vxq

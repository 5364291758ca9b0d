// The backend interface seen from the model layer: the backend registry (make_backend), the
// weight-format table and the KV readers that decide what a backend can run, the activation
// buffers a backend keeps between forward passes, and the memory check before a run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/weight_formats.h"
#include "core/error.h"
#include "kv/codec.h"
#include "kv/evict.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "runtime/memory_check.h"
#include "support/forwarding_backend.h"
#include "support/text.h"
#include "support/tiny_model.h"

namespace vxq {
namespace {

using test::error_of;

TEST(BackendRegistry, MakesTheCpuBackend) {
    const std::vector<std::string> expected = VXQ_HAVE_CUDA ? std::vector<std::string>{"cpu", "cuda"}
                                                            : std::vector<std::string>{"cpu"};
    EXPECT_EQ(backend_names(), expected);
    const auto be = make_backend("cpu", 1);
    ASSERT_NE(be, nullptr);
    EXPECT_EQ(be->describe().rfind("cpu/", 0), 0u) << be->describe();
}

TEST(BackendRegistry, UnknownNameIsAnErrorListingTheBackends) {
    const std::string msg = error_of([] { make_backend("metal", 1); });
    EXPECT_EQ(msg, VXQ_HAVE_CUDA ? "unknown device 'metal' (this build has: cpu, cuda)"
                                 : "unknown device 'metal' (this build has: cpu)");
    // check_backend_name (what --device runs before any work) says the same and opens nothing.
    EXPECT_EQ(error_of([] { check_backend_name("metal"); }), msg);
    EXPECT_EQ(error_of([] { check_backend_name("cpu"); }), "");
    const std::string cuda = error_of([] { check_backend_name("cuda"); });
    if (VXQ_HAVE_CUDA) {
        EXPECT_EQ(cuda, "") << "the name is known, whether or not this machine has a GPU";
    } else {
        EXPECT_NE(cuda.find("this build has no CUDA backend"), std::string::npos) << cuda;
    }
}

// "cuda" either runs or is refused in one line naming why: the build has no CUDA backend, or the
// machine has no CUDA device. Never a silent CPU backend.
TEST(BackendRegistry, CudaRunsOrIsRefusedByName) {
    std::unique_ptr<Backend> be;
    std::string msg;
    try {
        be = make_backend("cuda", 1);
    } catch (const Error& e) {
        msg = e.what();
    }
    if (be) {
        EXPECT_TRUE(VXQ_HAVE_CUDA);
        EXPECT_NE(be->describe().find("cuda"), std::string::npos) << be->describe();
    } else if (VXQ_HAVE_CUDA) {
        EXPECT_NE(msg.find("no CUDA device"), std::string::npos) << msg;
    } else {
        EXPECT_NE(msg.find("this build has no CUDA backend"), std::string::npos) << msg;
    }
}

TEST(WeightFormats, RowsAgreeWithTheGgmlLayoutsAndTheRegistry) {
    const std::vector<std::string> names = backend_names();
    ASSERT_FALSE(weight_formats().empty());
    for (const WeightFormat& f : weight_formats()) {
        SCOPED_TRACE(ggml_type_display_name(f.type));
        const auto layout = ggml_type_traits(uint32_t(f.type));
        ASSERT_TRUE(layout.has_value());
        EXPECT_EQ(f.block_size, layout->block_size);
        EXPECT_EQ(f.block_bytes, layout->block_bytes);
        EXPECT_EQ(find_weight_format(f.type), &f);
        ASSERT_FALSE(f.backends.empty());
        for (std::string_view b : f.backends) {
            EXPECT_NE(std::find(names.begin(), names.end(), b), names.end()) << b << " is not a backend";
        }
    }
}

// ggml's vec_dot_type for each weight type, which the CPU matmul reproduces (kernels/cpu/matmul.h).
TEST(WeightFormats, DotTypesAreGgmls) {
    const std::pair<GgmlType, GgmlType> expected[] = {
        {GgmlType::F32, GgmlType::F32},  {GgmlType::F16, GgmlType::F16},   {GgmlType::BF16, GgmlType::BF16},
        {GgmlType::Q8_0, GgmlType::Q8_0}, {GgmlType::Q4_0, GgmlType::Q8_0}, {GgmlType::Q6_K, GgmlType::Q8_K},
        {GgmlType::TQ1_0, GgmlType::Q8_K}, {GgmlType::TQ2_0, GgmlType::Q8_K}, {GgmlType::TQ2_G128, GgmlType::Q8_K},
    };
    EXPECT_EQ(weight_formats().size(), std::size(expected));
    for (const auto& [type, dot] : expected) {
        const WeightFormat* f = find_weight_format(type);
        ASSERT_NE(f, nullptr) << ggml_type_display_name(type);
        EXPECT_EQ(f->dot_type, dot) << ggml_type_display_name(type);
        EXPECT_TRUE(f->runs_on("cpu"));
    }
}

TEST(WeightFormats, RefusesTypesWithoutKernelsNamingTheTensor) {
    EXPECT_EQ(find_weight_format(GgmlType::Q4_K), nullptr);
    EXPECT_EQ(error_of([] { check_weight_computable(GgmlType::Q4_K, "cpu", "m.gguf: tensor 'w'"); }),
              "m.gguf: tensor 'w' is Q4_K, which veloxquant cannot compute yet");
    EXPECT_EQ(error_of([] { check_weight_computable(GgmlType::Q6_K, "cuda", "m.gguf: tensor 'w'"); }), "");
    EXPECT_EQ(error_of([] { check_weight_computable(GgmlType::F16, "gpu", "m.gguf: tensor 'w'"); }),
              "m.gguf: tensor 'w' is F16, which the gpu backend cannot compute yet");
    EXPECT_EQ(error_of([] { check_weight_computable(GgmlType::Q4_0, "cpu", "m.gguf: tensor 'w'"); }), "");
}

TEST(WeightFormats, ModelLoadChecksTheChosenBackend) {
    const test::TinyModel tm = test::build_tiny_model({});
    EXPECT_NO_THROW(Model::load(tm.path, "cpu"));
    const std::string msg = error_of([&] { Model::load(tm.path, "gpu"); });
    EXPECT_NE(msg.find("tensor 'token_embd.weight' is F32, which the gpu backend cannot compute yet"), std::string::npos)
        << msg;
}

// The backend keeps the forward pass's activations: once the largest batch has run, further
// passes allocate nothing, and what earlier passes left in the buffers changes no result.
TEST(ActivationBuffers, ReusedAcrossForwardPassesWithUnchangedResults) {
    test::TinyModelSpec spec;
    spec.arch = "qwen2";
    const test::TinyModel tm = test::build_tiny_model(spec);
    const auto model = Model::load(tm.path);
    const ModelConfig& c = model->config();
    const KvShape shape{c.n_layer, c.n_head, c.n_head_kv, c.head_dim, 64};
    const int64_t V = c.n_vocab;

    const std::vector<TokenId> tokens = {1, 17, 250, 3, 99, 42, 7, 8, 260, 11, 5, 2};
    // A decode step first, then batches that grow and shrink, then decode steps again.
    const std::vector<size_t> chunks = {1, 5, 2, 1, 3};

    const auto kept = make_backend("cpu", 1);
    auto kept_cache = make_kv_cache(shape, KvSpec{});
    auto fresh_cache = make_kv_cache(shape, KvSpec{});
    size_t at = 0;
    size_t bytes_after_largest = 0;
    float* first_buffer = nullptr;
    for (size_t i = 0; i < chunks.size(); ++i) {
        const std::span<const TokenId> part(tokens.data() + at, chunks[i]);
        std::vector<float> a(chunks[i] * size_t(V)), b(chunks[i] * size_t(V));
        model->forward(*kept, *kept_cache, part, /*all_logits=*/true, a.data());
        const auto fresh = make_backend("cpu", 1);
        model->forward(*fresh, *fresh_cache, part, /*all_logits=*/true, b.data());
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "chunk " << i;
        at += chunks[i];

        if (i == 1) {  // the largest batch has run
            bytes_after_largest = kept->activation_bytes();
            first_buffer = kept->activation_buffer(0, 1);
        } else if (i > 1) {
            EXPECT_EQ(kept->activation_bytes(), bytes_after_largest) << "chunk " << i;
            EXPECT_EQ(kept->activation_buffer(0, 1), first_buffer) << "chunk " << i;
        }
    }
    // Eight buffers of 5 rows: x and cur of n_embd, q and attn of q_dim, k and v of kv_dim,
    // gate and up of n_ff floats.
    const size_t expected = 5 * size_t(2 * c.n_embd + 2 * c.q_dim() + 2 * c.kv_dim() + 2 * c.n_ff) * sizeof(float);
    EXPECT_EQ(bytes_after_largest, expected);
    EXPECT_EQ(model->activation_bytes(5), expected) << "the memory check's figure is what the forward pass asks for";
}

// Model::fill_kv (vxq bench --depth-fill kv): the cache holds the tokens afterwards, layer 0's
// keys and values are exactly what the forward pass stores (its input is the embedding in both;
// f16, f32 and KIVI-2 caches), the later layers' differ (their input stays the embedding),
// decoding after it runs, the fill ends by Backend::sync, and a cache whose eviction scores
// tokens by the attention is refused by name.
TEST(FillKv, StoresLayerZeroAsForwardDoesAndRefusesAttentionScoredEviction) {
    const test::TinyModel tm = test::build_tiny_model(test::TinyModelSpec{});
    const auto model = Model::load(tm.path);
    const ModelConfig& c = model->config();
    ASSERT_GE(c.n_layer, 2);
    const KvShape shape{c.n_layer, c.n_head, c.n_head_kv, c.head_dim, 64};
    const std::vector<TokenId> tokens = {1, 17, 250, 3, 99, 42, 7, 8, 260, 11, 5, 2};
    for (const char* spec : {"f16", "f32", "kivi:bits=2,group=8,residual=8"}) {  // (the tiny model: head_dim 16)
        SCOPED_TRACE(spec);
        const auto be = make_backend("cpu", 1);
        auto filled = make_kv_cache(shape, KvSpec::parse(spec));
        auto run = make_kv_cache(shape, KvSpec::parse(spec));
        model->fill_kv(*be, *filled, std::span(tokens).first(7));
        model->fill_kv(*be, *filled, std::span(tokens).subspan(7));
        std::vector<float> logits(size_t(c.n_vocab));
        model->forward(*be, *run, std::span(tokens).first(7), false, logits.data());
        model->forward(*be, *run, std::span(tokens).subspan(7), false, logits.data());
        ASSERT_EQ(filled->size(), int64_t(tokens.size()));
        for (int64_t layer = 0; layer < 2; ++layer) {
            bool all_equal = true;
            for (int64_t g = 0; g < c.n_head_kv; ++g) {
                std::vector<float> fk, fv, rk, rv;
                filled->dequantize(layer, g, filled->size(), fk, fv);
                run->dequantize(layer, g, run->size(), rk, rv);
                ASSERT_EQ(fk.size(), rk.size());
                const bool same = std::memcmp(fk.data(), rk.data(), fk.size() * sizeof(float)) == 0 &&
                                  std::memcmp(fv.data(), rv.data(), fv.size() * sizeof(float)) == 0;
                if (layer == 0) EXPECT_TRUE(same) << "layer 0, head " << g;
                all_equal = all_equal && same;
            }
            if (layer == 1) EXPECT_FALSE(all_equal) << "layer 1 equals the forward pass's: its input was not the embedding";
        }
        model->forward(*be, *filled, std::span(tokens).first(1), false, logits.data());  // a decode step after the fill
        EXPECT_EQ(filled->size(), int64_t(tokens.size()) + 1);
        EXPECT_TRUE(std::isfinite(logits[0]));
    }
    // The fill reads nothing back, so it must end by Backend::sync (a backend that records its
    // ops, the CUDA one, would otherwise run them inside the first timed step): once, after its
    // last store.
    struct Watch : test::ForwardingBackend {
        using ForwardingBackend::ForwardingBackend;
        int writes = 0, syncs = 0, writes_at_sync = -1;
        void kv_write(KvCache& cache, int64_t layer, int64_t pos0, const float* k, const float* v, int64_t n) override {
            ++writes;
            ForwardingBackend::kv_write(cache, layer, pos0, k, v, n);
        }
        void sync() override {
            ++syncs;
            writes_at_sync = writes;
            ForwardingBackend::sync();
        }
    } watch(make_backend("cpu", 1));
    auto watched = make_kv_cache(shape, KvSpec::parse("f16"));
    model->fill_kv(watch, *watched, tokens);
    EXPECT_EQ(watch.writes, c.n_layer);
    EXPECT_EQ(watch.syncs, 1);
    EXPECT_EQ(watch.writes_at_sync, c.n_layer);
    KvCacheOptions o;
    o.evict = EvictSpec::parse("h2o:budget=32,sink=2,window=8");
    auto h2o = make_kv_cache(shape, KvSpec::parse("f16"), o);
    const auto be = make_backend("cpu", 1);
    const std::string msg = error_of([&] { model->fill_kv(*be, *h2o, tokens); });
    EXPECT_NE(msg.find("--depth-fill kv"), std::string::npos) << msg;
    EXPECT_NE(msg.find("eviction"), std::string::npos) << msg;
}

// The KV codec registry is the one list of which backend reads which method: the CUDA backend
// reads f16, q8_0, q4_0, fp8, KIVI, TurboQuant, VecInfer and QJL caches (in builds that have it), the CPU
// backend every method, and every name it lists is a backend of this build.
TEST(KvReaders, RegistryListsTheBackendsThatReadEachMethod) {
    const std::vector<std::string> names = backend_names();
    for (const CodecInfo& info : list_codecs()) {
        SCOPED_TRACE(info.name);
        EXPECT_TRUE(codec_has_reader(info.name, "cpu"));
        const bool cuda_reads = info.name == "f16" || info.name == "q8_0" || info.name == "q4_0" || info.name == "fp8" ||
                                info.name == "kivi" || info.name.starts_with("turbo") ||
                                info.name == "vecinfer" || info.name == "qjl";
        EXPECT_EQ(codec_has_reader(info.name, "cuda"), VXQ_HAVE_CUDA && cuda_reads);
        for (const std::string& b : info.backends) {
            EXPECT_NE(std::find(names.begin(), names.end(), b), names.end()) << b << " is not a backend";
        }
    }
    EXPECT_NE(error_of([] { codec_has_reader("q3_z", "cpu"); }).find("unknown KV cache method 'q3_z'"), std::string::npos);
}

TEST(MemoryCheck, CpuBackendReportsHostRam) {
    const MemoryInfo m = make_backend("cpu", 1)->memory_info();
    EXPECT_EQ(m.where, "host RAM");
    EXPECT_GT(m.total, size_t(0));
    EXPECT_GT(m.free, size_t(0));
    EXPECT_LE(m.free, m.total);
}

// A backend that says it copies weights into its own memory, as a device backend does, those of
// type `doubled` at twice the file's bytes; it runs nothing (memory_need only asks it that).
class CopyingBackend final : public Backend {
public:
    explicit CopyingBackend(std::optional<GgmlType> doubled = std::nullopt) : doubled_(doubled) {}
    size_t copied_weight_bytes(GgmlType type, size_t file_bytes) const override {
        return type == doubled_ ? 2 * file_bytes : file_bytes;
    }
    std::string describe() const override { return "copying"; }
    MemoryInfo memory_info() const override { return {}; }
    float* activation_buffer(int, size_t) override { return nullptr; }
    size_t activation_bytes() const override { return 0; }
    const float* to_host(const float* x, size_t, int) override { return x; }
    void matmul(const WeightView&, const float*, int64_t, float*) override {}
    void embed(const WeightView&, const int32_t*, int64_t, float*) override {}
    void rms_norm(const float*, const float*, int64_t, int64_t, float, float*) override {}
    void rope(float*, int64_t, int64_t, int64_t, int64_t, const RopeParams&) override {}
    void swiglu(float*, const float*, int64_t, int64_t) override {}
    void add(float*, const float*, int64_t) override {}
    void add_bias(float*, const float*, int64_t, int64_t) override {}
    void attention(const KvLayerView&, const float*, int64_t, int64_t, float*, float* const*) override {}
    std::string attention_path(const KvLayerView&) const override { return ""; }

private:
    std::optional<GgmlType> doubled_;
};

TEST(MemoryCheck, NeedCountsDeviceWeightsFullCachesAndTheLargestBatch) {
    const test::TinyModel tm = test::build_tiny_model({});
    const auto model = Model::load(tm.path);
    const ModelConfig& c = model->config();
    const auto f16 = make_kv_cache({c.n_layer, c.n_head, c.n_head_kv, c.head_dim, 256}, KvSpec{});
    const auto fp8 = make_kv_cache({c.n_layer, c.n_head, c.n_head_kv, c.head_dim, 512}, KvSpec::parse("fp8"));
    const Model* models[] = {model.get()};
    const KvCache* caches[] = {f16.get(), fp8.get()};
    const size_t logits = 3 * size_t(c.n_vocab) * sizeof(float);

    const MemoryNeed cpu = memory_need(*make_backend("cpu", 1), models, caches, 64, 3);
    EXPECT_EQ(cpu.weights, 0u) << "the CPU backend reads the mapped file";
    EXPECT_EQ(cpu.kv, f16->bytes_for_tokens(256) + fp8->bytes_for_tokens(512));
    EXPECT_EQ(cpu.kv_tokens, 512);
    EXPECT_EQ(cpu.activations, model->activation_bytes(64) + logits);
    EXPECT_EQ(cpu.total(), cpu.kv + cpu.activations);

    size_t tensor_bytes = 0;
    for (const GgufTensorInfo& t : model->file().tensors()) tensor_bytes += t.n_bytes;
    const MemoryNeed dev = memory_need(CopyingBackend{}, models, caches, 64, 3);
    EXPECT_EQ(dev.weights, tensor_bytes);
    EXPECT_EQ(dev.kv, cpu.kv);
    EXPECT_EQ(dev.activations, cpu.activations);
    // A backend whose copies of some type take more than the file's bytes is asked per tensor.
    size_t f32_bytes = 0;
    for (const GgufTensorInfo& t : model->file().tensors()) f32_bytes += t.type == GgmlType::F32 ? t.n_bytes : 0;
    ASSERT_GT(f32_bytes, 0u);
    EXPECT_EQ(memory_need(CopyingBackend(GgmlType::F32), models, caches, 64, 3).weights, tensor_bytes + f32_bytes);
}

// The longest context is the largest n whose caches' bytes fit beside weights and activations.
TEST(MemoryCheck, LongestContextIsTheLargestThatFits) {
    const auto k = make_kv_cache({2, 4, 2, 64, 256}, KvSpec::parse("q4_0"));
    const auto v = make_kv_cache({2, 4, 2, 64, 256}, KvSpec::parse("kivi:bits=2"));
    const KvCache* caches[] = {k.get(), v.get()};
    MemoryNeed need;
    need.weights = 1000;
    need.activations = 24;
    const auto bytes = [&](int64_t n) { return need.weights + need.activations + k->bytes_for_tokens(n) + v->bytes_for_tokens(n); };
    const size_t free = bytes(5000) + 1;
    const int64_t n = longest_context(need, caches, free);
    EXPECT_LE(bytes(n), free);
    EXPECT_GT(bytes(n + 1), free);
    EXPECT_GE(n, 5000);
    EXPECT_EQ(longest_context(need, caches, bytes(0) - 1), 0) << "not even an empty cache";
    EXPECT_EQ(longest_context(need, caches, size_t(1) << 60, 1 << 20), 1 << 20) << "capped";
}

TEST(MemoryCheck, FitsOrIsOneLineNamingEachPart) {
    constexpr size_t GiB = size_t(1) << 30;
    MemoryNeed need;
    need.weights = size_t(16.1 * GiB);
    need.kv = GiB;
    need.kv_tokens = 8192;
    need.activations = size_t(0.1 * GiB);
    const MemoryInfo gpu{80 * GiB, 12 * GiB, "GPU 0 (NVIDIA H200)"};
    EXPECT_EQ(error_of([&] { check_fits(need, gpu, "cuda"); }),
              "--device cuda: this run needs 17.2 GiB (weights 16.1 GiB + KV cache 1.0 GiB for 8192 tokens + activations "
              "0.1 GiB) but GPU 0 (NVIDIA H200) has 12.0 GiB free");
    EXPECT_EQ(error_of([&] { check_fits(need, {80 * GiB, need.total(), "GPU 0"}, "cuda"); }), "") << "exactly the free bytes fit";
    EXPECT_NE(error_of([&] { check_fits(need, {80 * GiB, need.total() - 1, "GPU 0"}, "cuda"); }), "");

    need.weights = 0;  // the CPU backend: weights stay in the mapped file and are not named
    EXPECT_EQ(error_of([&] { check_fits(need, {4 * GiB, GiB, "host RAM"}, "cpu"); }),
              "--device cpu: this run needs 1.1 GiB (KV cache 1.0 GiB for 8192 tokens + activations 0.1 GiB) but host RAM "
              "has 1.0 GiB free");
    EXPECT_EQ(error_of([&] { check_fits(need, {4 * GiB, 2 * GiB, "host RAM"}, "cpu"); }), "");
}

}  // namespace
}  // namespace vxq

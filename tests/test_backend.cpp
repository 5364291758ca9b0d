// The backend interface seen from the model layer: the backend registry (make_backend), the
// weight-format table that decides which models a backend can run, and the activation buffers
// a backend keeps between forward passes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/weight_formats.h"
#include "core/error.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "support/tiny_model.h"

namespace vxq {
namespace {

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

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
    EXPECT_NE(msg.find("unknown backend 'metal'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("available: cpu"), std::string::npos) << msg;
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
        {GgmlType::Q8_0, GgmlType::Q8_0}, {GgmlType::Q4_0, GgmlType::Q8_0},
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
    EXPECT_EQ(find_weight_format(GgmlType::Q6_K), nullptr);
    EXPECT_EQ(error_of([] { check_weight_computable(GgmlType::Q6_K, "cpu", "m.gguf: tensor 'w'"); }),
              "m.gguf: tensor 'w' is Q6_K, which veloxquant cannot compute yet");
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
}

}  // namespace
}  // namespace vxq

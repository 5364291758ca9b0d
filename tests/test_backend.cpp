// The backend interface seen from the model layer: the backend registry (make_backend), the
// weight-format table that decides which models a backend can run.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/weight_formats.h"
#include "core/error.h"
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
    EXPECT_EQ(backend_names(), std::vector<std::string>{"cpu"});
    const auto be = make_backend("cpu", 1);
    ASSERT_NE(be, nullptr);
    EXPECT_EQ(be->describe().rfind("cpu/", 0), 0u) << be->describe();
}

TEST(BackendRegistry, UnknownNameIsAnErrorListingTheBackends) {
    const std::string msg = error_of([] { make_backend("cuda", 1); });
    EXPECT_NE(msg.find("unknown backend 'cuda'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("available: cpu"), std::string::npos) << msg;
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

}  // namespace
}  // namespace vxq

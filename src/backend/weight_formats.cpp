#include "backend/weight_formats.h"

#include <algorithm>

#include "core/error.h"

namespace vxq {

namespace {

// Whether this build has the CUDA backend (VXQ_CUDA): without it the table leaves "cuda" out, so
// every name in it is one make_backend accepts.
constexpr bool kHaveCuda = VXQ_HAVE_CUDA;

std::vector<WeightFormat> build_table() {
    struct Row {
        GgmlType type;
        GgmlType dot_type;
        std::vector<std::string_view> backends;
    };
    const Row rows[] = {
        {GgmlType::F32, GgmlType::F32, {"cpu", "cuda"}},
        {GgmlType::F16, GgmlType::F16, {"cpu", "cuda"}},
        {GgmlType::Q4_0, GgmlType::Q8_0, {"cpu", "cuda"}},
        {GgmlType::Q8_0, GgmlType::Q8_0, {"cpu", "cuda"}},
        {GgmlType::BF16, GgmlType::BF16, {"cpu", "cuda"}},
        {GgmlType::Q6_K, GgmlType::Q8_K, {"cpu", "cuda"}},
        {GgmlType::TQ1_0, GgmlType::Q8_K, {"cpu", "cuda"}},  // CUDA: repacked as TQ2_0 on upload
        {GgmlType::TQ2_0, GgmlType::Q8_K, {"cpu", "cuda"}},
        {GgmlType::TQ2_G128, GgmlType::Q8_K, {"cpu", "cuda"}},
    };
    std::vector<WeightFormat> table;
    for (const Row& r : rows) {
        const GgmlTypeTraits layout = *ggml_type_traits(uint32_t(r.type));
        std::vector<std::string_view> backends = r.backends;
        if (!kHaveCuda) std::erase(backends, std::string_view("cuda"));
        table.push_back({r.type, layout.block_size, layout.block_bytes, r.dot_type, backends});
    }
    return table;
}

}  // namespace

bool WeightFormat::runs_on(std::string_view backend) const {
    return std::find(backends.begin(), backends.end(), backend) != backends.end();
}

std::span<const WeightFormat> weight_formats() {
    static const std::vector<WeightFormat> table = build_table();
    return table;
}

const WeightFormat* find_weight_format(GgmlType type) {
    for (const WeightFormat& f : weight_formats()) {
        if (f.type == type) return &f;
    }
    return nullptr;
}

void check_weight_computable(GgmlType type, std::string_view backend, std::string_view what) {
    const WeightFormat* f = find_weight_format(type);
    if (!f) fail("{} is {}, which veloxquant cannot compute yet", what, ggml_type_display_name(type));
    if (!f->runs_on(backend)) {
        fail("{} is {}, which the {} backend cannot compute yet", what, ggml_type_display_name(type), backend);
    }
}

}  // namespace vxq

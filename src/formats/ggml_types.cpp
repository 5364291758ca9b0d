#include "formats/ggml_types.h"

#include "core/error.h"

namespace vxq {

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type_id) {
    switch (GgmlType(type_id)) {
        case GgmlType::F32: return GgmlTypeTraits{"f32", 1, 4};
        case GgmlType::F16: return GgmlTypeTraits{"f16", 1, 2};
        case GgmlType::BF16: return GgmlTypeTraits{"bf16", 1, 2};
        case GgmlType::Q8_0: return GgmlTypeTraits{"q8_0", kQK8_0, sizeof(BlockQ8_0)};
        case GgmlType::Q4_0: return GgmlTypeTraits{"q4_0", kQK4_0, sizeof(BlockQ4_0)};
    }
    return std::nullopt;
}

std::string_view ggml_type_name(GgmlType t) {
    const auto tr = ggml_type_traits(uint32_t(t));
    return tr ? tr->name : std::string_view("unknown");
}

size_t ggml_row_bytes(GgmlType t, int64_t n) {
    const auto tr = ggml_type_traits(uint32_t(t));
    VXQ_ASSERT(tr && n % tr->block_size == 0);
    return size_t(n / tr->block_size) * tr->block_bytes;
}

}  // namespace vxq

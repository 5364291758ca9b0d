#include "formats/ggml_types.h"

#include <array>
#include <cctype>

#include "core/error.h"

namespace vxq {

namespace {

// Block layouts of ggml b4748 (ggml-common.h: the static_asserts on each block_* struct).
// An empty name marks an id that is not (or no longer) defined.
constexpr std::array<GgmlTypeTraits, kGgmlTypeIdEnd> kTraits = [] {
    std::array<GgmlTypeTraits, kGgmlTypeIdEnd> t{};
    auto set = [&](GgmlType id, std::string_view name, int64_t block, size_t bytes) {
        t[size_t(id)] = GgmlTypeTraits{name, block, bytes};
    };
    set(GgmlType::F32, "f32", 1, 4);
    set(GgmlType::F16, "f16", 1, 2);
    set(GgmlType::Q4_0, "q4_0", kQK4_0, sizeof(BlockQ4_0));   // d + 16 nibbles
    set(GgmlType::Q4_1, "q4_1", 32, 20);                     // d, m + 16 nibbles
    set(GgmlType::Q5_0, "q5_0", 32, 22);                     // d, qh[4] + 16 nibbles
    set(GgmlType::Q5_1, "q5_1", 32, 24);                     // d, m, qh[4] + 16 nibbles
    set(GgmlType::Q8_0, "q8_0", kQK8_0, sizeof(BlockQ8_0));   // d + 32 int8
    set(GgmlType::Q8_1, "q8_1", 32, 36);                     // d, s + 32 int8
    set(GgmlType::Q2_K, "q2_K", kQK_K, 84);                  // 2 halves + 16 scales + 64 qs
    set(GgmlType::Q3_K, "q3_K", kQK_K, 110);                 // half + 32 hmask + 64 qs + 12 scales
    set(GgmlType::Q4_K, "q4_K", kQK_K, 144);                 // 2 halves + 12 scales + 128 qs
    set(GgmlType::Q5_K, "q5_K", kQK_K, 176);                 // 2 halves + 12 scales + 32 qh + 128 qs
    set(GgmlType::Q6_K, "q6_K", kQK_K, sizeof(BlockQ6_K));   // half + 16 scales + 192 ql/qh
    set(GgmlType::Q8_K, "q8_K", kQK_K, sizeof(BlockQ8_K));   // float + 256 int8 + 16 int16 sums
    set(GgmlType::IQ2_XXS, "iq2_xxs", kQK_K, 66);            // half + 32 uint16
    set(GgmlType::IQ2_XS, "iq2_xs", kQK_K, 74);              // half + 32 uint16 + 8 scales
    set(GgmlType::IQ3_XXS, "iq3_xxs", kQK_K, 98);            // half + 96
    set(GgmlType::IQ1_S, "iq1_s", kQK_K, 50);                // half + 32 qs + 16 uint16 qh
    set(GgmlType::IQ4_NL, "iq4_nl", 32, 18);                 // half + 16 nibbles
    set(GgmlType::IQ3_S, "iq3_s", kQK_K, 110);               // half + 13*8 + 4 scales
    set(GgmlType::IQ2_S, "iq2_s", kQK_K, 82);                // half + 64 qs + 16
    set(GgmlType::IQ4_XS, "iq4_xs", kQK_K, 136);             // half + uint16 + 4 + 128
    set(GgmlType::I8, "i8", 1, 1);
    set(GgmlType::I16, "i16", 1, 2);
    set(GgmlType::I32, "i32", 1, 4);
    set(GgmlType::I64, "i64", 1, 8);
    set(GgmlType::F64, "f64", 1, 8);
    set(GgmlType::IQ1_M, "iq1_m", kQK_K, 56);                // 32 qs + 16 qh + 8 scales
    set(GgmlType::BF16, "bf16", 1, 2);
    set(GgmlType::TQ1_0, "tq1_0", kQK_K, sizeof(BlockTQ1_0));  // 48 base-3 bytes + 4 qh + half
    set(GgmlType::TQ2_0, "tq2_0", kQK_K, sizeof(BlockTQ2_0));  // 64 two-bit bytes + half
    return t;
}();

}  // namespace

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type_id) {
    if (type_id == uint32_t(GgmlType::TQ2_G128)) return GgmlTypeTraits{"tq2_g128", kQK_G128, sizeof(BlockTQ2_G128)};
    if (type_id >= kGgmlTypeIdEnd || kTraits[type_id].name.empty()) return std::nullopt;
    return kTraits[type_id];
}

std::string_view ggml_type_name(GgmlType t) {
    const auto tr = ggml_type_traits(uint32_t(t));
    return tr ? tr->name : std::string_view("unknown");
}

std::string ggml_type_display_name(GgmlType t) {
    std::string s(ggml_type_name(t));
    for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
    return s;
}

size_t ggml_row_bytes(GgmlType t, int64_t n) {
    const auto tr = ggml_type_traits(uint32_t(t));
    VXQ_ASSERT(tr && n % tr->block_size == 0);
    return size_t(n / tr->block_size) * tr->block_bytes;
}

std::optional<uint32_t> llama_ftype(GgmlType t) {
    switch (t) {
        case GgmlType::F32: return 0;
        case GgmlType::F16: return 1;
        case GgmlType::Q4_0: return 2;
        case GgmlType::Q8_0: return 7;
        case GgmlType::BF16: return 32;
        case GgmlType::TQ1_0: return 36;
        case GgmlType::TQ2_0: return 37;
        default: return std::nullopt;
    }
}

}  // namespace vxq

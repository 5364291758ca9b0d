// Tensor element types of the GGUF format and their block layouts, defined once.
// Block formats match ggml bit for bit so files and KV caches compare like for like.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "core/fp16.h"

namespace vxq {

enum class GgmlType : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q8_0 = 8,
    BF16 = 30,
};

constexpr int kQK8_0 = 32;  // values per q8_0 block
constexpr int kQK4_0 = 32;  // values per q4_0 block

// q8_0: x = d * qs[j]
struct BlockQ8_0 {
    f16_t d;
    int8_t qs[kQK8_0];
};
static_assert(sizeof(BlockQ8_0) == 34, "q8_0 block is 2 + 32 bytes");

// q4_0: x = d * (q - 8); value j in the low nibble and value j+16 in the high nibble of qs[j]
struct BlockQ4_0 {
    f16_t d;
    uint8_t qs[kQK4_0 / 2];
};
static_assert(sizeof(BlockQ4_0) == 18, "q4_0 block is 2 + 16 bytes");

struct GgmlTypeTraits {
    std::string_view name;
    int64_t block_size;   // elements per block
    size_t block_bytes;   // bytes per block
};

// Traits of a supported type; nullopt for a type id this engine cannot read.
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type_id);
std::string_view ggml_type_name(GgmlType t);

// Bytes of a row of n elements; n must be a multiple of the block size.
size_t ggml_row_bytes(GgmlType t, int64_t n);

}  // namespace vxq

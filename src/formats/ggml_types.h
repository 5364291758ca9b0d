// Tensor element types of the GGUF format and their block layouts, defined once.
// Block formats match ggml bit for bit so files and KV caches compare like for like.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/fp16.h"

namespace vxq {

// Every type id ggml (llama.cpp b4748, ggml.h) defines. Ids 4, 5 and 31..33, 36..38 were
// retired; a file carrying one of them (or any id >= 39) is malformed.
enum class GgmlType : uint32_t {
    F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
    Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
    IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
    IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
    TQ1_0 = 34, TQ2_0 = 35,
    // veloxquant's own, not ggml's (llama.cpp cannot load a file that holds it): ternary weights
    // in 128-value blocks with an fp16 scale each, as PrismML's Bonsai stores them.
    TQ2_G128 = 1024,
};
constexpr uint32_t kGgmlTypeIdEnd = 39;  // one past the largest id ggml b4748 knows

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

constexpr int kQK_K = 256;  // values per k-quant and ternary super-block

// q6_K: x = d * scales[e / 16] * (q - 32), q the element's 6 bits: in each half of 128 values,
// value 32 v + l (v < 4, l < 32) has its low 4 bits in ql[l + 32 (v & 1)] (low nibble for v < 2,
// high for v >= 2) and its high 2 bits at bit 2 v of qh[l]; the next half uses the next 64 ql,
// 32 qh and 8 scales (llama.cpp's block_q6_K)
struct BlockQ6_K {
    uint8_t ql[kQK_K / 2];
    uint8_t qh[kQK_K / 4];
    int8_t scales[kQK_K / 16];
    f16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210, "q6_K block is 128 + 64 + 16 + 2 bytes");

// tq1_0: x = d * (t - 1), t a base-3 digit (0, 1, 2): 5 digits per byte of qs (values 0-239),
// 4 per byte of qh (240-255), digit n of byte q being ((q * 3^n mod 256) * 3) >> 8 (llama.cpp's
// block_tq1_0)
struct BlockTQ1_0 {
    uint8_t qs[48];
    uint8_t qh[4];
    f16_t d;
};
static_assert(sizeof(BlockTQ1_0) == 54, "tq1_0 block is 48 + 4 + 2 bytes");

// tq2_0: x = d * (t - 1), t = the 2-bit field l of qs[32 h + m] for value 128 h + 32 l + m
// (llama.cpp's block_tq2_0)
struct BlockTQ2_0 {
    uint8_t qs[kQK_K / 4];
    f16_t d;
};
static_assert(sizeof(BlockTQ2_0) == 66, "tq2_0 block is 64 + 2 bytes");

// tq2_g128 (veloxquant's): 128 values, byte m holding in bits 2 l the digit t + 1 of value 32 l + m
// (TQ2_0's layout for one half), x = d * t: 2.125 bits per weight. Rows are whole 256-value
// super-blocks (pairs of blocks), as the q8_K activations are.
struct BlockTQ2_G128 {
    uint8_t qs[32];
    f16_t d;
};
static_assert(sizeof(BlockTQ2_G128) == 34, "tq2_g128 block is 32 + 2 bytes");
constexpr int kQK_G128 = 128;

// q8_K, for activations only: x = d * qs[j], bsums[g] = the sum of qs[16 g .. 16 g + 15]
struct BlockQ8_K {
    float d;
    int8_t qs[kQK_K];
    int16_t bsums[kQK_K / 16];
};
static_assert(sizeof(BlockQ8_K) == 292, "q8_K block is 4 + 256 + 32 bytes");

// The storage layout of a type: enough to size and skip a tensor of it. Whether a backend can
// compute with the type is a separate question, answered when a model is loaded.
struct GgmlTypeTraits {
    std::string_view name;  // ggml's spelling ("q6_K", "tq2_0", ...)
    int64_t block_size;     // elements per block
    size_t block_bytes;     // bytes per block
};

// Traits of a type ggml defines; nullopt for an id it never defined or has retired.
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type_id);
std::string_view ggml_type_name(GgmlType t);
// The name in upper case, as people write it in prose and error messages ("Q6_K").
std::string ggml_type_display_name(GgmlType t);

// Bytes of a row of n elements; n must be a multiple of the block size.
size_t ggml_row_bytes(GgmlType t, int64_t n);

// llama.cpp's llama_ftype, the value of general.file_type for a file whose matrices are mostly of
// type t (F32 0, F16 1, Q4_0 2, Q8_0 7, BF16 32, TQ1_0 36, TQ2_0 37); nullopt for other types.
std::optional<uint32_t> llama_ftype(GgmlType t);

}  // namespace vxq

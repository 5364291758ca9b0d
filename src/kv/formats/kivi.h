// KIVI (Liu et al., ICML 2024): asymmetric min/max integer quantization, keys per channel over
// groups of G consecutive tokens, values per token over groups of G consecutive channels, with an
// fp16 residual window of R tokens kept by the paged cache. The contract is
// ../shared/docs/METHODS.md, section "KIVI"; this header is the block layout and the scalar
// reference of one group; the codec is kv/codecs/kivi.cpp, the CPU readers kernels/cpu/kv_read_kivi*.
//
// Precision (bit for bit): z = min, s = (max - min) / (2^b - 1) in f32, both rounded to fp16 and
// stored; codes from the stored values in f32: q = rint(clamp((x - z16) / s16, 0, 2^b - 1));
// x^ = fl32(fl32(q * s16) + z16). When s16 == 0 (a constant group, or a range so small that s
// rounds to zero in fp16) every code is 0 and x^ = z16 exactly: no 0/0.
// Note on FMA: q <= 255 has 8 significant bits and s16 11, so q * s16 is exact in f32 and
// fma(q, s16, z16) == fl32(fl32(q * s16) + z16) for every input; the readers rely on that to
// dequantize with one FMA, and the decoder still keeps the two operations separate.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/fp16.h"
#include "kv/spec.h"

namespace vxq::codecs::kivi {

struct Params {
    int bits = 2;             // 2, 4 or 8
    int group = 32;           // G: 8..256, a power of two
    int64_t residual = 128;   // R: a multiple of G
};

// Reads and validates bits / group / residual (vxq::Error on a bad value or an unknown option).
Params parse_params(const CodecSpec& spec);

// One packed block = `rows` quantization groups ("rows") of `group` codes each:
//   keys   (block = G tokens x head_dim):  rows = head_dim, row c = channel c over the G tokens
//   values (block = 1 token):              rows = ceil(head_dim / G), row g = channels [gG, gG+G)
//                                          (a ragged last row is padded by repeating its last
//                                          real element; its padding codes are stored too)
// Byte layout, little endian, no padding between parts:
//   [zero  fp16 x rows][scale fp16 x rows][codes: rows x (G*b/8) bytes]
// Code j of a row sits at byte j*b/8, bits (j*b) mod 8 .. +b-1 (LSB first) -- the same as bit
// offset j*b of the row's little-endian 32-bit words. b divides 8, so no code straddles a byte.
struct Layout {
    int bits = 2;
    int group = 32;
    int64_t rows = 0;

    constexpr int64_t row_code_bytes() const { return int64_t(group) * bits / 8; }
    constexpr size_t zero_offset() const { return 0; }
    constexpr size_t scale_offset() const { return size_t(rows) * sizeof(f16_t); }
    constexpr size_t codes_offset() const { return 2 * size_t(rows) * sizeof(f16_t); }
    constexpr size_t block_bytes() const { return codes_offset() + size_t(rows * row_code_bytes()); }
};

constexpr Layout key_layout(int bits, int group, int64_t head_dim) { return {bits, group, head_dim}; }
constexpr Layout value_layout(int bits, int group, int64_t head_dim) {
    return {bits, group, (head_dim + group - 1) / group};
}

static_assert(sizeof(f16_t) == 2);
// KIVI-2, G = 32, d = 128: keys 128 x (4 + 8) bytes for 32 x 128 elements, values 4 x 12 bytes for
// 128 elements: both 3.0 bits per element (METHODS.md).
static_assert(key_layout(2, 32, 128).block_bytes() == 1536 && 1536 * 8 == 3 * 32 * 128);
static_assert(value_layout(2, 32, 128).block_bytes() == 48 && 48 * 8 == 3 * 128);
static_assert(value_layout(4, 32, 100).block_bytes() == 4 * (4 + 16));  // ragged: 4 rows
static_assert(key_layout(8, 8, 64).row_code_bytes() == 8 && key_layout(2, 8, 64).row_code_bytes() == 2);

// ---- the scalar reference of one group (what encode/decode are made of) ----

// x: n values (n = G; a ragged value group is already padded) -> stored zero/scale and n codes
// (one per byte, unpacked).
void quantize_group(const float* x, int64_t n, int bits, f16_t* z16, f16_t* s16, uint8_t* codes);
// x^ = fl32(fl32(q * s16) + z16), two roundings.
float dequantize(int q, f16_t s16, f16_t z16);
// Packs n codes into a row (n * bits / 8 bytes) / reads code j of a packed row.
void pack_row(const uint8_t* codes, int64_t n, int bits, uint8_t* row);
inline int code_at(const uint8_t* row, int64_t j, int bits) {
    const int64_t bit = j * bits;
    return (row[bit >> 3] >> (bit & 7)) & ((1 << bits) - 1);
}

}  // namespace vxq::codecs::kivi

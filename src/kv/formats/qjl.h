// QJL (Zandieh et al., 2024) keys: a 1-bit Johnson-Lindenstrauss sketch of each key plus its norm,
// with the outlier channels of each 32-token block sketched apart. The contract is
// ../shared/docs/METHODS.md, section "QJL"; this header is the block layout, the per-layer
// state (the two sketches) and the scalar reference; the codec is kv/codecs/qjl.cpp (values:
// KIVI-2 per token, kv/formats/kivi.h), the CPU reader kernels/cpu/kv_read_qjl.cpp.
//
// A block is 32 consecutive tokens of one KV head (tokens wait in the cache's fp16 window until
// `residual` of them, a multiple of 32, are pending). Per block, the O channels with the largest
// norm over the block's 32 tokens are its outliers (ties: the lower channel). Per token k:
//   k_out = k on the outlier channels (0 elsewhere), k_in = k - k_out,
//   stored: ||k_in||, ||k_out|| (fp16), sign(S k_in) (m bits), sign(S_o k_out) (m_o bits),
// with S in R^{m x d} and S_o in R^{m_o x d} seeded Gaussian (kv/formats/qjl_sketch.h; rows not
// orthogonalized). ||k||^2 = ||k_in||^2 + ||k_out||^2: we store the two parts' norms rather than
// ||k|| and ||k_out|| (METHODS.md's ||k_in|| = sqrt(||k||^2 - ||k_out||^2) in exact arithmetic),
// because after fp16 rounding the difference would lose ||k_in|| to cancellation whenever the
// outliers carry most of the norm. The score of a query q (unquantized, f32) is
//   <q, k> ~ (sqrt(pi/2)/m)   ||k_in||  <S q_in,    sign(S k_in)>
//          + (sqrt(pi/2)/m_o) ||k_out|| <S_o q_out, sign(S_o k_out)>
// with q_in / q_out the query restricted to the block's inlier / outlier channels: each term is
// unbiased (over S), with variance ((pi/2) ||q_in||^2 ||k_in||^2 - <q_in, k_in>^2) / m and the
// same with m_o for the outliers, so the sum is under METHODS.md's (pi/(2m)) ||q||^2 ||k||^2
// whenever m_o ||q_in||^2 >= (m - m_o) ||q_out||^2 (m_o = m/2: the query's outlier channels
// carry at most half its energy). Restricting q to the block's channels costs no per-token
// work: the reader projects each query once per step (u = S q, the one m x d product) and per
// block uses its O outlier columns (S q_in = u - sum_{c in O} q_c S[:, c], S_o q_out =
// sum_{c in O} q_c S_o[:, c]): O (m + m_o) multiply-adds per block and query head, against the
// 32 (m + m_o) of the block's sign sums.
//
// decode() returns the vector whose inner product with every q is that estimator:
//   x^_c = (sqrt(pi/2)/m)   ||k_in||  (S^T   sign(S k_in))_c     for inlier channels c,
//   x^_c = (sqrt(pi/2)/m_o) ||k_out|| (S_o^T sign(S_o k_out))_c  for outlier channels c,
// an unbiased (not least-squares) reconstruction: dequantize-then-attend over x^ is exactly the
// fused reader's arithmetic, up to float rounding.
//
// Block layout (little endian, no padding between parts), O = outliers, B = 32:
//   [outlier channels: O uint8, ascending][||k_in|| fp16 x B][||k_out|| fp16 x B (O > 0)]
//   [sign(S k_in): B x m/8 bytes][sign(S_o k_out): B x m_o/8 bytes (O > 0)]
// Bits/element: (m + m_o + 32 + O/4) / d with outliers (O = 0: (m + 16) / d); defaults m = 2d,
// m_o = d, O = 8: 3 + 34/d (d = 128: 3.27; d = 64: 3.53). Per layer (keys; counted as resident):
// S and S_o, (m + m_o) d fp32.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kv/codec.h"
#include "kv/formats/qjl_sketch.h"

namespace vxq::codecs::qjl {

constexpr int64_t kBlockTokens = 32;  // METHODS.md: outliers are chosen per block of 32 tokens

struct Params {
    int64_t m = 0;          // inlier sketch rows (default 2d, rounded up to a multiple of 8), a multiple of 8
    int64_t mo = 0;         // outlier sketch rows (default d, rounded up likewise), a multiple of 8
    int outliers = 8;       // O outlier channels per block, 0 .. min(d, 64)
    int64_t residual = 32;  // R: keys are encoded R at a time; values keep the R newest in fp16
    uint64_t seed = 0;      // with the layer, seeds S and S_o
};

// Reads and validates m / mo / outliers / residual / seed at head_dim d (vxq::Error on a bad
// value, an unknown option, or d outside [1, 256]: outlier channels are stored as one byte).
Params parse_params(const CodecSpec& spec, int64_t d);
int64_t default_rows(int64_t n);

struct Layout {
    int64_t d = 0, m = 0, mo = 0;  // mo = 0 when outliers = 0
    int outliers = 0;

    constexpr size_t norm_in_offset() const { return size_t(outliers); }
    constexpr size_t norm_out_offset() const { return norm_in_offset() + 2 * kBlockTokens; }
    constexpr size_t signs_in_offset() const { return norm_out_offset() + (outliers > 0 ? 2 * kBlockTokens : 0); }
    constexpr size_t signs_out_offset() const { return signs_in_offset() + size_t(kBlockTokens * m / 8); }
    constexpr size_t block_bytes() const { return signs_out_offset() + size_t(kBlockTokens * mo / 8); }
};

Layout layout_of(const Params& p, int64_t d);

// d = 128, m = 256, m_o = 128, O = 8: 8 + 64 + 64 + 1024 + 512 bytes for 32 x 128 elements,
// (256 + 128 + 32 + 2) / 128 = 3.265625 bits per element.
static_assert(Layout{128, 256, 128, 8}.block_bytes() == 1672 && 1672 * 8 == 3.265625 * 32 * 128);
static_assert(Layout{64, 128, 0, 0}.block_bytes() == 64 + 512);

// Everything a layer's heads share for keys; the reader reaches it through
// KvFormatParams::layer_state.
struct State final : KvLayerState {
    State(const Params& p, int64_t d, int64_t layer);
    size_t bytes() const override { return inliers.bytes() + outliers.bytes(); }

    Params params;
    Layout layout;
    Sketch inliers;   // S   [m, d]
    Sketch outliers;  // S_o [m_o, d]; empty when O = 0
};

// ---- the scalar reference of one block ----

// Picks the block's outliers, splits, measures and sketches its 32 tokens.   x: [32, d]
void encode(const State& s, const float* x, uint8_t* block);
// x^ as above (the estimator's vector) for the block's 32 tokens.   x: [32, d]
void decode(const State& s, const uint8_t* block, float* x);

}  // namespace vxq::codecs::qjl

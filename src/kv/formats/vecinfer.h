// VecInfer (product vector quantization of the KV cache, 2025). The contract is
// ../shared/docs/METHODS.md, section "VecInfer"; this header is the block layout, the per-layer
// state (smoothing factors and codebooks from a calibration file), the scalar reference and the
// k-means that trains the codebooks; the codec is kv/codecs/vecinfer.cpp, the calibration file
// kv/calibration.h, the CPU reader kernels/cpu/kv_read_vecinfer.cpp.
//
// Per token of one KV head (block_tokens = 1), x in R^d:
//   keys    y = H (x / lambda) / sqrt(d)     lambda_i = sqrt(max_t |K_{t,i}|) from calibration
//   values  y = H x / sqrt(d)
// with H the Walsh-Hadamard matrix (turbo::fwht; d a power of two), so the transform is
// orthonormal and symmetric: its inverse is itself. y is cut into d/n sub-vectors of n elements;
// sub-vector j is stored as the m-bit index of its nearest centroid in codebook C_j (2^m
// centroids of n floats). Nothing else is stored per token: bits/element = m/n exactly
// (n=4, m=8: 2.0). Block: d/n indices of m bits, index j at bit offset j*m, LSB first.
//
// Per layer and role (shared by the layer's KV heads, counted as resident): the codebooks
// [d/n, 2^m, n] fp32 and, for keys, lambda [d] fp32. lambda is per (layer, channel): the maximum
// over the layer's KV heads as well as its tokens (the state is per layer, see KvLayerState).
//
// Attention: since H/sqrt(d) is orthonormal, <q, k> = <H (lambda * q) / sqrt(d), y>; the reader
// builds LUT[j][c] = <q~_j, C_j[c]> once per query (prepare_query) and scores a key as
// sum_j LUT[j][idx_j]; values sum p_t * C_j[idx_j] in the transformed domain and are mapped back
// (H / sqrt(d)) once after the weighted sum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kv/codec.h"
#include "kv/formats/turbo.h"

namespace vxq::codecs::vecinfer {

// head_dim at most (a power of two: the Walsh-Hadamard transform); the reference and the reader
// keep a token's coded vector on the stack.
constexpr int64_t kMaxHeadDim = 1024;

struct Params {
    int n = 4;          // elements per sub-vector, a power of two dividing head_dim
    int m = 8;          // index bits: 2^m centroids per sub-space, 1..8
    std::string calib;  // a calibration file (vxq calibrate), or "random" (tests: see make_random_state)
};

// Reads and validates n / m / calib at head_dim d (vxq::Error on a bad value or unknown option).
// `calib` may be absent here (a codec probe: block sizes only); a layer state needs it.
Params parse_params(const CodecSpec& spec, int64_t d);

struct Layout {
    int64_t d = 0;
    int n = 4, m = 8;
    constexpr int64_t subvectors() const { return d / n; }
    constexpr int64_t centroids() const { return int64_t(1) << m; }
    constexpr size_t block_bytes() const { return size_t((subvectors() * m + 7) / 8); }
};
// n=4, m=8 at d = 128: 32 one-byte indices = 2.0 bits/element; n=2, m=5 at d = 64: 160 bits.
static_assert(Layout{128, 4, 8}.block_bytes() == 32 && 32 * 8 == 2 * 128);
static_assert(Layout{64, 2, 5}.block_bytes() == 20);

// Everything a layer's heads share for one role; the reader reaches it through
// KvFormatParams::layer_state.
struct State final : KvLayerState {
    Layout layout;
    std::vector<float> lambda;    // keys: [d] smoothing factors (> 0); values: empty
    std::vector<float> codebook;  // [d/n, 2^m, n]
    size_t bytes() const override { return (lambda.size() + codebook.size()) * sizeof(float); }
    const float* centroids(int64_t j) const { return codebook.data() + size_t(j * layout.centroids() * layout.n); }
};

// A deterministic state from seeded N(0, 1) draws (lambda = 1, each centroid a draw: k-means'
// initialisation without iterations), for `calib=random`: tests and the registry's variants,
// which need a state without a model. It claims no quality.
std::unique_ptr<State> make_random_state(const Layout& l, KvRole role, int64_t layer);

// x -> the coded domain (keys: divided by lambda first).   x, y: [d]
void forward_transform(const State& s, const float* x, float* y);
// The orthonormal Walsh-Hadamard transform H y / sqrt(d) in place (its own inverse), counted
// by `transform_calls`.   y: [d]
void hadamard(float* y, int64_t d);
uint64_t transform_calls();

// Index of the centroid nearest to v (squared distance; a tie goes to the lower index), scanning
// the k centroids one by one: the fused argmin, no distance table.   c: [k, n]; v: [n]
int nearest(const float* c, int64_t k, int n, const float* v);

// Index j of a code area (m bits each, LSB first): TurboQuant's packing.
using turbo::index_at;
using turbo::put_index;

// ---- the scalar reference of one block ----
void encode(const State& s, const float* x, uint8_t* block);           // x: [d]
void coded_vector(const State& s, const uint8_t* block, float* y);      // y: [d], the coded domain
void decode(const State& s, const uint8_t* block, float* x);            // x: [d]

// ---- training ----
// k-means (Lloyd) on N points of n floats into k centroids: initialised with k distinct points
// drawn by a seeded shuffle (points repeat when N < k), then at most `max_iter` rounds of
// assign (fused argmin) + mean, stopping early when no assignment changes; an empty cluster
// keeps its centroid. Deterministic for a seed.   x: [N, n]; returns [k, n]
std::vector<float> kmeans(const float* x, int64_t N, int n, int64_t k, int max_iter, uint64_t seed);
// Codebooks of one layer and role from calibration vectors already in the coded domain: one
// k-means per sub-space j (seed mixed with j).   y: [N, d]; returns [d/n, 2^m, n]
std::vector<float> train_codebooks(const Layout& l, const float* y, int64_t N, int max_iter, uint64_t seed);
// Mean squared error per element of coding y with the codebooks.   y: [N, d]
double coding_mse(const Layout& l, const float* codebook, const float* y, int64_t N);

}  // namespace vxq::codecs::vecinfer

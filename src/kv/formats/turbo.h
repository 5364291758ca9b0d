// TurboQuant (Zandieh et al., ICLR 2026): per vector x (one token of one KV head) store n = ||x||
// in fp16, rotate y = Pi x / n with a seeded random orthogonal Pi, and code each coordinate of y
// with a Lloyd-Max codebook for N(0, 1/d) (the coordinate density of a uniform point on the
// sphere). The contract is ../shared/docs/METHODS.md, section "TurboQuant"; this header is the
// block layout, the per-layer state (rotation, codebooks, QJL sketch) and the scalar reference;
// the codecs are kv/codecs/turbo.cpp, the CPU readers kernels/cpu/kv_read_turbo.cpp.
//
// Three families, one block per token (block_tokens = 1), little endian, no padding between parts:
//   turbo       (mse)  [n fp16][idx1: d x b bits]                                  b + 16/d bits/element
//   turbo-prod  keys   [n fp16][gamma fp16][idx1: d x (b-1) bits][sign(S r): d bits] b + 32/d
//               values: TurboQuant_mse at b bits (the QJL term is an inner-product estimator; a
//               value is read back as a vector, where the MSE code is the better one)
//   turbo-rvq   (2 stages of b bits) [n fp16][idx1: d x b bits][idx2: d x b bits]  2b + 16/d
// Index j of a code area sits at bit offset j*bits, LSB first, and may straddle a byte (b = 3);
// each area is rounded up to whole bytes. Per layer and role (shared by the heads, counted as
// resident): the rotation (d fp32 signs for the Hadamard one, d x d fp32 for Haar), the
// codebooks and their thresholds (fp32), and for turbo-prod keys the d x d fp32 sketch S.
//
// Rotation: Pi = H diag(s) / sqrt(d) (H the Walsh-Hadamard matrix, s seeded +-1), applied by the
// in-place fast transform in O(d log d); it needs d to be a power of two. For any other d the
// dense Haar rotation (QR of a seeded Gaussian matrix, O(d^2) per vector) is used; `rot=haar`
// selects it for any d (the reference). Attention never rotates a cached token: the query is
// rotated once per step (q' = Pi q, the reader's prepare_query) and the values' weighted sum once
// at the end (o = Pi^T sum p n c), see `rotation_calls`. `rot=calib` (turbo only) takes the
// layer's calibrated eigenbasis as Pi and per coordinate its own bit count (Params::calibrated).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "kv/codec.h"
#include "kv/formats/qjl_sketch.h"

namespace vxq::codecs::turbo {

enum class Family { Mse, Prod, Rvq };

struct Params {
    Family family = Family::Mse;
    int bits = 3;           // b, 1..4 (rvq: per stage)
    bool haar = false;      // dense Haar rotation instead of the randomized Hadamard one
    uint64_t seed = 0;      // with the layer and role, seeds the rotation and the sketch
    // rot=calib (turbo only): the layer's calibrated eigenbasis instead of a random rotation, and
    // per coordinate its own number of bits (b x d in all, given out where the coordinate's
    // variance, times for keys the queries' weight on it, makes the error fall most) with the
    // Lloyd-Max codebook scaled to its variance.
    // calib: the file (`vxq calibrate --method turbo`), or "random" (a seeded basis and spectrum,
    // for tests only); set exactly when rot=calib.
    std::string calib;
    bool calibrated() const { return !calib.empty(); }
};

// Reads and validates bits / rot / seed for `family` at head_dim d (vxq::Error on a bad value,
// an unknown option, or rot=hadamard with d not a power of two).
Params parse_params(const CodecSpec& spec, Family family, int64_t d);

// The block of one token: which parts it has and where they are.
struct Layout {
    int64_t d = 0;
    int bits1 = 0;      // first-stage index bits (0: no first stage, turbo-prod:bits=1)
    int bits2 = 0;      // second-stage index bits (rvq), else 0
    bool qjl = false;   // gamma + d sign bits (turbo-prod keys)

    static constexpr int64_t area(int64_t d, int bits) { return (d * bits + 7) / 8; }
    constexpr size_t gamma_offset() const { return 2; }
    constexpr size_t idx1_offset() const { return qjl ? 4 : 2; }
    constexpr size_t idx2_offset() const { return idx1_offset() + size_t(area(d, bits1)); }
    constexpr size_t sign_offset() const { return idx2_offset() + size_t(area(d, bits2)); }
    constexpr size_t block_bytes() const { return sign_offset() + (qjl ? size_t(area(d, 1)) : 0); }
};

Layout layout_of(const Params& p, KvRole role, int64_t d);

// turbo:bits=3 at d = 128: 2 + 48 bytes = 3.125 bits/element; turbo-prod:bits=3 keys: 4 + 32 + 16.
static_assert(Layout{128, 3, 0, false}.block_bytes() == 50 && 50 * 8 == 3.125 * 128);
static_assert(Layout{128, 2, 0, true}.block_bytes() == 52 && Layout{128, 2, 0, true}.sign_offset() == 36);
static_assert(Layout{64, 3, 3, false}.block_bytes() == 2 + 24 + 24);

// A seeded orthogonal d x d matrix Pi.
class Rotation {
public:
    Rotation(int64_t d, bool haar, uint64_t seed);
    Rotation(int64_t d, std::vector<float> rows);  // a given orthonormal Pi: [d, d] row-major
    const std::vector<float>& rows() const { return dense_; }  // a dense Pi's rows (else empty)
    const std::vector<float>& signs() const { return signs_; }  // a Hadamard Pi's signs (else empty)
    void apply(float* x) const;     // x <- Pi x      x: [d]
    void apply_t(float* x) const;   // x <- Pi^T x    x: [d]
    size_t bytes() const { return (signs_.size() + dense_.size()) * sizeof(float); }
    bool haar() const { return !dense_.empty(); }

private:
    int64_t d_;
    std::vector<float> signs_;  // Hadamard: [d] +-1
    std::vector<float> dense_;  // Haar: [d, d] row-major
};

// How many times a rotation (apply or apply_t) has run in this process: the test that attention
// never rotates per cached token reads it around an attention call.
uint64_t rotation_calls();

// Fast Walsh-Hadamard transform in place (unnormalized: H x with entries +-1).   x: [d], d = 2^k
void fwht(float* x, int64_t d);

// A scalar quantizer: ascending centroids and the midpoints between neighbours.
struct Codebook {
    std::vector<float> centroids;   // [2^bits]
    std::vector<float> thresholds;  // [2^bits - 1]
    int index(float y) const;       // nearest centroid (a threshold tie goes up)
};

// Lloyd-Max in N(0, 1) units (the caller divides by sqrt(d)): `lloyd_max_gaussian(b)` for the
// standard normal, `lloyd_max_residual(b1, b2)` for the residual y - c1[Q1(y)] of a b1-bit
// Gaussian quantizer, fitted with b2 bits. The solver is kv/codecs/turbo.cpp's lloyd_max.
std::vector<double> lloyd_max_gaussian(int bits);
std::vector<double> lloyd_max_residual(int bits1, int bits2);
// E[(y - c[Q(y)])^2] for y ~ N(0, 1) and lloyd_max_gaussian(bits), bits 0..8 (1 at 0 bits).
double lloyd_max_mse(int bits);
// `total` bits over coordinates of these variances, one at a time to the coordinate whose
// expected error variance * lloyd_max_mse(b) falls most (at most 8 each; ties to the lower index).
std::vector<int> allocate_bits(const std::vector<double>& variances, int64_t total);

// A layer's rotation for one role and, with rot=calib, what its coordinates' bits are given out
// by: each rotated coordinate's variance (sum 1) and how much its error counts (keys: the queries'
// weight on it). Needed while the State is built, not kept.
struct Basis {
    Rotation rot;
    std::vector<double> variances, weights;
};

// Everything a layer's heads share for one role; the readers reach it through
// KvFormatParams::layer_state.
struct State final : KvLayerState {
    State(const Params& p, KvRole role, int64_t d, int64_t layer);
    size_t bytes() const override;

    Params params;
    Layout layout;
    Rotation rot;
    Codebook cb1, cb2;             // in unit-sphere units (N(0,1) values / sqrt(d)); cb2: rvq
    // calibrated: coordinate c has coord_bits[c] bits at bit coord_offset[c] of the index area and
    // the value coord_scale[c] * cbk[bits].centroids[index] (cbk in N(0, 1) units).
    std::vector<uint8_t> coord_bits;
    std::vector<int32_t> coord_offset;
    std::vector<float> coord_scale;
    std::vector<Codebook> cbk;
    qjl::Sketch sketch;            // turbo-prod keys: S [d, d], N(0, 1) entries (kv/formats/qjl_sketch.h)
    float qjl_scale = 0.0f;        // sqrt(pi/2) / d

private:
    State(const Params& p, KvRole role, int64_t d, int64_t layer, Basis basis);
};

// ---- the scalar reference of one block ----

// A field of `bits` bits (1..8) at bit offset `bit`, packed LSB first: bits_at reads it, put_bits
// ORs it into a zeroed area. Index j of a uniform area (index_at, put_index) is at j * bits.
inline int bits_at(const uint8_t* area, int64_t bit, int bits) {
    unsigned w = area[bit >> 3];
    if ((bit & 7) + bits > 8) w |= unsigned(area[(bit >> 3) + 1]) << 8;
    return int(w >> (bit & 7)) & ((1 << bits) - 1);
}
inline void put_bits(uint8_t* area, int64_t bit, int bits, int v) {
    const unsigned w = unsigned(v) << (bit & 7);
    area[bit >> 3] = uint8_t(area[bit >> 3] | (w & 0xff));
    if ((bit & 7) + bits > 8) area[(bit >> 3) + 1] = uint8_t(area[(bit >> 3) + 1] | (w >> 8));
}
inline int index_at(const uint8_t* area, int64_t j, int bits) { return bits_at(area, j * bits, bits); }
inline void put_index(uint8_t* area, int64_t j, int bits, int v) { put_bits(area, j * bits, bits, v); }

// Rotate + quantize + pack one token in one pass.   x: [d]
void encode(const State& s, const float* x, uint8_t* block);
// The block's vector in the rotated unit domain, MSE stages only: y[c] = c1[i1] (+ c2[i2]).
// What the readers score and accumulate (times the stored norm).   y: [d]
void rotated_codes(const State& s, const uint8_t* block, float* y);
// x^ = n Pi^T (y + qjl_scale * gamma * S^T sign(S r)) (the QJL term for turbo-prod keys only).
void decode(const State& s, const uint8_t* block, float* x);

}  // namespace vxq::codecs::turbo

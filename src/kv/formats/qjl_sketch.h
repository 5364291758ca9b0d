// The 1-bit Johnson-Lindenstrauss sketch (QJL, Zandieh et al. 2024), shared by the `qjl` keys
// (kv/formats/qjl.h) and TurboQuant_prod's residual term (kv/formats/turbo.h): a seeded Gaussian
// S in R^{m x d}, the packed signs sign(S x) of a vector, the projection S q of a query, and the
// transpose S^T sign(S x). For Gaussian rows s, E[<s, q> sign(<s, x>)] = sqrt(2/pi) <q, x> / ||x||,
// so (sqrt(pi/2) / m) ||x|| <S q, sign(S x)> is an unbiased estimate of <q, x> with variance
// ((pi/2) ||q||^2 ||x||^2 - <q, x>^2) / m (METHODS.md, "QJL").
//
// The rows are i.i.d. N(0, I_d) and NOT orthogonalized (METHODS.md allows orthogonalizing per
// d x d block): with independent Gaussian rows the estimator is exactly unbiased and the variance
// above is exact, where unit-norm-times-sqrt(d) orthogonal rows would leave a bias of order 1/d.
//
// Sign bits: bit i of the packed area is sign(<s_i, x>) >= 0, at bit i % 8 of byte i / 8 (LSB
// first); a zero projection counts as +.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kv/codec.h"

namespace vxq::codecs::qjl {

// One seed per (user seed, layer, role, purpose): splitmix64 of their combination (the seeds of
// TurboQuant's rotations and sketches and of the qjl sketches).
uint64_t mix_seed(uint64_t seed, int64_t layer, KvRole role, uint64_t purpose);

inline bool sign_bit(const uint8_t* bits, int64_t i) { return (bits[i >> 3] >> (i & 7)) & 1; }

class Sketch {
public:
    Sketch() = default;
    // m rows of d i.i.d. N(0, 1) entries, drawn row by row from mt19937_64(seed).
    Sketch(int64_t m, int64_t d, uint64_t seed);

    int64_t rows() const { return m_; }
    int64_t dim() const { return d_; }
    bool empty() const { return m_ == 0; }
    float scale() const { return scale_; }  // sqrt(pi/2) / m
    const float* row(int64_t i) const { return s_.data() + i * d_; }
    float at(int64_t i, int64_t c) const { return s_[size_t(i * d_ + c)]; }
    size_t bytes() const { return s_.size() * sizeof(float); }

    // bits <- sign(S x): (m + 7) / 8 bytes, overwritten.   x: [d]
    void signs(const float* x, uint8_t* bits) const;
    // u <- S q, the query side of the estimator; counted by projection_calls().   q: [d]; u: [m]
    void project(const float* q, float* u) const;
    // x += w * S^T sign, sign the packed bits of signs().   x: [d]
    void add_transposed(const uint8_t* bits, float w, float* x) const;

private:
    int64_t m_ = 0, d_ = 0;
    float scale_ = 0.0f;
    std::vector<float> s_;  // [m, d] row-major
};

// How many query projections (Sketch::project) have run in this process: the tests that attention
// sketches each query once per step, never per cached token, read it around an attention call.
uint64_t projection_calls();

}  // namespace vxq::codecs::qjl

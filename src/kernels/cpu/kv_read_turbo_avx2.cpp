// AVX2 + FMA + F16C kernels of the TurboQuant reader for MSE-only blocks (kv_read_turbo.h);
// called only after kv_avx2_available(). No project header and no std template here, everything
// but the entry points in an anonymous namespace (kv_read_baseline_avx2.cpp says why).
//
// A block's indices are unpacked 8 at a time straight from the packed area (8 b-bit indices are
// b whole bytes, so every chunk of 8 channels starts on a byte) into int32 lanes, and the codebook
// lookup is a lane permute of the codebook held in registers: one permute for b <= 3 (<= 8
// entries), two and a blend on index bit 3 for b = 4. turbo-rvq adds the second stage's lookup.
// The 8 values so made are applied to every query head of the call (GQA: read once).
//   keys:   s[h][t] = n_t * <q'_h, y_t>, 8 lanes of FMA per (head, token), summed across lanes at
//           the end: the scalar reader sums channel by channel, so the two differ by summation
//           order only (tests/test_turbo.cpp bounds it).
//   values: acc[h][c] += fl(p[h][t] * n_t) * y_t[c] with a separate multiply and add, token after
//           token, exactly the scalar reader's operations in its order: equal bit for bit.
#include <immintrin.h>

#include "kernels/cpu/avx2_inl.h"

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/kv_read_turbo.h"

// The value path's bit-exactness needs every product and sum rounded on its own.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace vxq::cpu::turbo_avx2 {

namespace {

// Index j of a packed area (LSB first, may straddle a byte): turbo.h's index_at.
inline int index_at(const uint8_t* area, int64_t j, int bits) {
    const int64_t bit = j * bits;
    unsigned w = area[bit >> 3];
    if ((bit & 7) + bits > 8) w |= unsigned(area[(bit >> 3) + 1]) << 8;
    return int(w >> (bit & 7)) & ((1 << bits) - 1);
}

// Indices [c, c + 8) of a packed area, c % 8 == 0, in int32 lanes. Reads exactly B bytes.
template <int B>
inline __m256i indices8(const uint8_t* area, int64_t c) {
    const uint8_t* p = area + c / 8 * B;
    uint32_t w;
    if constexpr (B == 1) {
        w = p[0];
    } else if constexpr (B == 2) {
        w = uint32_t(p[0]) | uint32_t(p[1]) << 8;
    } else if constexpr (B == 3) {
        w = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16;
    } else {
        static_assert(B == 4);
        std::memcpy(&w, p, 4);
    }
    const __m256i shifts = _mm256_setr_epi32(0, B, 2 * B, 3 * B, 4 * B, 5 * B, 6 * B, 7 * B);
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(w)), shifts), _mm256_set1_epi32((1 << B) - 1));
}

// A codebook of 2^B entries in registers: lo = entries 0..7 (zero-padded), hi = 8..15 (B = 4).
struct Lut {
    __m256 lo, hi;
};

template <int B>
inline Lut lut_of(const float* cb) {
    alignas(32) float e[16] = {};
    for (int i = 0; i < (1 << B); ++i) e[i] = cb[i];
    return {_mm256_load_ps(e), _mm256_load_ps(e + 8)};
}

template <int B>
inline __m256 lookup(const Lut& l, __m256i idx) {
    const __m256 lo = _mm256_permutevar8x32_ps(l.lo, idx);  // uses idx & 7
    if constexpr (B < 4) return lo;
    const __m256 hi = _mm256_permutevar8x32_ps(l.hi, idx);
    return _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));  // bit 3 -> sign
}

// What the kernels need of the page, with the codebooks in registers.
template <int B, bool Rvq>
struct Page {
    const CodePage& c;
    Lut l1, l2;
    explicit Page(const CodePage& cp) : c(cp), l1(lut_of<B>(cp.cb1)), l2(Rvq ? lut_of<B>(cp.cb2) : Lut{}) {}

    // y_t[k, k + 8) of the block at T, k % 8 == 0
    __m256 y8(const uint8_t* T, int64_t k) const {
        __m256 y = lookup<B>(l1, indices8<B>(T + c.idx1_offset, k));
        if constexpr (Rvq) y = _mm256_add_ps(y, lookup<B>(l2, indices8<B>(T + c.idx2_offset, k)));
        return y;
    }
    float y1(const uint8_t* T, int64_t k) const {
        float y = c.cb1[index_at(T + c.idx1_offset, k, B)];
        if constexpr (Rvq) y += c.cb2[index_at(T + c.idx2_offset, k, B)];
        return y;
    }
};

// NH heads x NT consecutive tokens from t0, accumulators in registers.
template <int B, bool Rvq, int NH, int NT>
void key_tile(const Page<B, Rvq>& pg, const float* q, const uint8_t* blk, int64_t t0, int64_t n, float* s) {
    const int64_t d = pg.c.d, d8 = d / 8 * 8;
    const uint8_t* T[NT];
    for (int k = 0; k < NT; ++k) T[k] = blk + size_t(t0 + k) * pg.c.block_bytes;
    __m256 acc[NH][NT];
    for (int h = 0; h < NH; ++h)
        for (int k = 0; k < NT; ++k) acc[h][k] = _mm256_setzero_ps();
    for (int64_t c = 0; c < d8; c += 8) {
        __m256 y[NT];
        for (int k = 0; k < NT; ++k) y[k] = pg.y8(T[k], c);
        for (int h = 0; h < NH; ++h) {
            const __m256 qv = _mm256_loadu_ps(q + h * d + c);
            for (int k = 0; k < NT; ++k) acc[h][k] = _mm256_fmadd_ps(qv, y[k], acc[h][k]);
        }
    }
    for (int k = 0; k < NT; ++k) {
        const float nrm = fp16_at(T[k]);
        for (int h = 0; h < NH; ++h) {
            float dot = hsum(acc[h][k]);
            for (int64_t c = d8; c < d; ++c) dot += q[h * d + c] * pg.y1(T[k], c);
            s[h * n + t0 + k] = nrm * dot;
        }
    }
}

template <int B, bool Rvq, int NH>
void key_heads(const Page<B, Rvq>& pg, const float* q, const uint8_t* blk, int64_t n, float* s) {
    constexpr int NT = NH >= 4 ? 2 : 4;
    int64_t t = 0;
    for (; t + NT <= n; t += NT) key_tile<B, Rvq, NH, NT>(pg, q, blk, t, n, s);
    for (; t < n; ++t) key_tile<B, Rvq, NH, 1>(pg, q, blk, t, n, s);
}

template <int B, bool Rvq>
void key_scores_b(const CodePage& c, const float* q, int64_t n_q, const uint8_t* blk, int64_t n, float* s) {
    const Page<B, Rvq> pg(c);
    const int64_t d = c.d;
    int64_t h = 0;
    for (; h + 4 <= n_q; h += 4) key_heads<B, Rvq, 4>(pg, q + h * d, blk, n, s + h * n);
    for (; h + 2 <= n_q; h += 2) key_heads<B, Rvq, 2>(pg, q + h * d, blk, n, s + h * n);
    for (; h < n_q; ++h) key_heads<B, Rvq, 1>(pg, q + h * d, blk, n, s + h * n);
}

// NH heads x NC chunks of 8 channels from c0, summed over all n tokens in registers.
template <int B, bool Rvq, int NH, int NC>
void value_tile(const Page<B, Rvq>& pg, const float* p, const uint8_t* blk, int64_t n, int64_t c0, float* acc) {
    const int64_t d = pg.c.d;
    __m256 a[NH][NC];
    for (int h = 0; h < NH; ++h)
        for (int k = 0; k < NC; ++k) a[h][k] = _mm256_loadu_ps(acc + h * d + c0 + 8 * k);
    for (int64_t t = 0; t < n; ++t) {
        const uint8_t* T = blk + size_t(t) * pg.c.block_bytes;
        const float nrm = fp16_at(T);
        __m256 y[NC];
        for (int k = 0; k < NC; ++k) y[k] = pg.y8(T, c0 + 8 * k);
        for (int h = 0; h < NH; ++h) {
            const __m256 w = _mm256_set1_ps(p[h * n + t] * nrm);
            for (int k = 0; k < NC; ++k) a[h][k] = _mm256_add_ps(a[h][k], _mm256_mul_ps(w, y[k]));
        }
    }
    for (int h = 0; h < NH; ++h)
        for (int k = 0; k < NC; ++k) _mm256_storeu_ps(acc + h * d + c0 + 8 * k, a[h][k]);
}

template <int B, bool Rvq, int NH>
void value_heads(const Page<B, Rvq>& pg, const float* p, const uint8_t* blk, int64_t n, float* acc) {
    constexpr int NC = NH == 1 ? 8 : NH == 2 ? 4 : 2;
    const int64_t d = pg.c.d, d8 = d / 8 * 8;
    int64_t c = 0;
    for (; c + 8 * NC <= d8; c += 8 * NC) value_tile<B, Rvq, NH, NC>(pg, p, blk, n, c, acc);
    for (; c < d8; c += 8) value_tile<B, Rvq, NH, 1>(pg, p, blk, n, c, acc);
    if (d8 == d) return;
    for (int64_t t = 0; t < n; ++t) {  // the last d % 8 channels
        const uint8_t* T = blk + size_t(t) * pg.c.block_bytes;
        const float nrm = fp16_at(T);
        for (c = d8; c < d; ++c) {
            const float y = pg.y1(T, c);
            for (int h = 0; h < NH; ++h) acc[h * d + c] += (p[h * n + t] * nrm) * y;
        }
    }
}

template <int B, bool Rvq>
void value_accumulate_b(const CodePage& c, const float* p, int64_t n_q, const uint8_t* blk, int64_t n, float* acc) {
    const Page<B, Rvq> pg(c);
    const int64_t d = c.d;
    int64_t h = 0;
    for (; h + 4 <= n_q; h += 4) value_heads<B, Rvq, 4>(pg, p + h * n, blk, n, acc + h * d);
    for (; h + 2 <= n_q; h += 2) value_heads<B, Rvq, 2>(pg, p + h * n, blk, n, acc + h * d);
    for (; h < n_q; ++h) value_heads<B, Rvq, 1>(pg, p + h * n, blk, n, acc + h * d);
}

}  // namespace

void key_scores(const CodePage& c, const float* q, int64_t n_q, const uint8_t* blk, int64_t n, float* s) {
    const bool rvq = c.cb2 != nullptr;
    switch (c.bits * 2 + (rvq ? 1 : 0)) {
        case 2: return key_scores_b<1, false>(c, q, n_q, blk, n, s);
        case 3: return key_scores_b<1, true>(c, q, n_q, blk, n, s);
        case 4: return key_scores_b<2, false>(c, q, n_q, blk, n, s);
        case 5: return key_scores_b<2, true>(c, q, n_q, blk, n, s);
        case 6: return key_scores_b<3, false>(c, q, n_q, blk, n, s);
        case 7: return key_scores_b<3, true>(c, q, n_q, blk, n, s);
        case 8: return key_scores_b<4, false>(c, q, n_q, blk, n, s);
        default: return key_scores_b<4, true>(c, q, n_q, blk, n, s);
    }
}

void value_accumulate(const CodePage& c, const float* p, int64_t n_q, const uint8_t* blk, int64_t n, float* acc) {
    const bool rvq = c.cb2 != nullptr;
    switch (c.bits * 2 + (rvq ? 1 : 0)) {
        case 2: return value_accumulate_b<1, false>(c, p, n_q, blk, n, acc);
        case 3: return value_accumulate_b<1, true>(c, p, n_q, blk, n, acc);
        case 4: return value_accumulate_b<2, false>(c, p, n_q, blk, n, acc);
        case 5: return value_accumulate_b<2, true>(c, p, n_q, blk, n, acc);
        case 6: return value_accumulate_b<3, false>(c, p, n_q, blk, n, acc);
        case 7: return value_accumulate_b<3, true>(c, p, n_q, blk, n, acc);
        case 8: return value_accumulate_b<4, false>(c, p, n_q, blk, n, acc);
        default: return value_accumulate_b<4, true>(c, p, n_q, blk, n, acc);
    }
}

}  // namespace vxq::cpu::turbo_avx2

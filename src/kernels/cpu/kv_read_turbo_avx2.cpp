// AVX2 + FMA + F16C kernels of the TurboQuant reader for MSE-only blocks (kv_read_turbo.h);
// called only after kv_avx2_available(). No project header and no std template here, everything
// but the entry points in an anonymous namespace (kv_read_baseline_avx2.cpp says why).
//
// A block's indices are unpacked 8 at a time straight from the packed area (8 b-bit indices are
// b whole bytes, so every chunk of 8 channels starts on a byte) into int32 lanes, and the codebook
// lookup is a lane permute of the codebook held in registers: one permute for b <= 3 (<= 8
// entries), two and a blend on index bit 3 for b = 4. turbo-rvq adds the second stage's lookup.
// turbo:rot=calib blocks give each coordinate its own bit count (0..8) and scaled codebook, so
// 8 coordinates' fields start anywhere and span at most 9 bytes: one 16-byte window of the index
// area holds them, a byte shuffle puts each field's two bytes into its lane, a variable shift and
// a mask make the index; then permutes of the codebooks of up to 4 bits, held in registers, times
// the coordinates' scales, or for a group with a wider field a gather from the per-coordinate
// value table (State::coord_values), make y: the very products scale * centroid that the scalar
// reader forms. Windows, shuffles, shifts, masks and offsets depend on the layer only and are
// worked out once per call (CalibView).
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
#include <type_traits>

#include "kernels/cpu/kv_read_turbo.h"

// The value path's bit-exactness needs every product and sum rounded on its own.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace vxq::cpu::turbo_avx2 {

namespace {

// A field of `bits` bits (0..8) at bit offset `bit` (LSB first, may straddle a byte): turbo.h's bits_at.
inline int bits_at(const uint8_t* area, int64_t bit, int bits) {
    unsigned w = area[bit >> 3];
    if ((bit & 7) + bits > 8) w |= unsigned(area[(bit >> 3) + 1]) << 8;
    return int(w >> (bit & 7)) & ((1 << bits) - 1);
}
inline int index_at(const uint8_t* area, int64_t j, int bits) { return bits_at(area, j * bits, bits); }

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

// What the kernels need of a rot=calib page: per group g of 8 coordinates [8g, 8g + 8), the
// window's first byte in the index area and, per lane, the shuffle that brings the field's byte and
// the next one to the lane's low 16 bits, the field's bit within that byte and its mask. A group
// whose fields have at most 4 bits (most of them: the budget is b <= 4 bits a coordinate on
// average) looks its values up in registers without a branch: the codebooks of 3, 2, 1 and 0 bits
// side by side in 16 entries (at 0, 8, 12, 14), reached by the index plus the lane's offset, and
// the one of 4 bits on its own, blended in on the lanes of 4 bits. A group with a wider field
// gathers from all the layer's codebooks laid end to end instead. Either way the N(0, 1) value so
// found times the lane's scale is the very product scale * centroid of the scalar reader.
struct CalibView {
    static constexpr int kMaxGroups = 128;  // d <= 1024, the scalar reader's limit
    const CalibPage& c;
    bool small;     // an index area under 16 bytes: its window is a zero-padded copy
    Lut mix, four;  // [cb3 | cb2 cb1 0 0], cb4
    alignas(32) uint8_t shuf[kMaxGroups][32];
    alignas(32) int32_t shift[kMaxGroups][8];
    alignas(32) int32_t mask[kMaxGroups][8];
    alignas(32) float books[511];              // cb[0], cb[1], ..., cb[8] end to end (2^9 - 1 entries at most)
    alignas(32) int32_t lift[kMaxGroups][8];   // where each lane's codebook starts: in books (wide groups), else in mix
    alignas(32) int32_t lanes4[kMaxGroups][8];  // -1 on the lanes of 4 bits
    alignas(32) float scale[kMaxGroups][8];
    int32_t start[kMaxGroups];
    bool wide[kMaxGroups];  // a field of more than 4 bits: gathered
    bool has4[kMaxGroups];  // a field of 4 bits

    explicit CalibView(const CalibPage& cp) : c(cp), small(cp.idx_bytes < 16) {
        alignas(32) float e[16] = {}, f[16] = {};
        static constexpr int kAt[4] = {14, 12, 8, 0};  // where the codebook of w bits starts in mix
        for (int w = 1; w <= 3; ++w)
            for (int i = 0; c.cb[w] != nullptr && i < (1 << w); ++i) e[kAt[w] + i] = c.cb[w][i];
        for (int i = 0; c.cb[4] != nullptr && i < 16; ++i) f[i] = c.cb[4][i];
        mix = {_mm256_load_ps(e), _mm256_load_ps(e + 8)};
        four = {_mm256_load_ps(f), _mm256_load_ps(f + 8)};
        int32_t at_books[9] = {};
        for (int w = 0, at = 0; w <= 8; at += 1 << w, ++w) {
            at_books[w] = at;
            for (int i = 0; c.cb[w] != nullptr && i < (1 << w); ++i) books[at + i] = c.cb[w][i];
        }
        for (int64_t g = 0; g < c.d / 8; ++g) {
            // 8 fields of <= 8 bits from bit offset[8g] end within 9 bytes of its byte, and the
            // area ends at or after them: a window that starts there, or 16 bytes before the
            // area's end, holds the group and stays inside the block.
            const int32_t g0 = c.offset[8 * g] >> 3;
            start[g] = small ? 0 : g0 < int32_t(c.idx_bytes) - 16 ? g0 : int32_t(c.idx_bytes) - 16;
            wide[g] = has4[g] = false;
            for (int i = 0; i < 8; ++i) {
                wide[g] |= c.bits[8 * g + i] > 4;
                has4[g] |= c.bits[8 * g + i] == 4;
            }
            for (int i = 0; i < 8; ++i) {
                const int64_t k = 8 * g + i;
                const int w = c.bits[k];
                const int r = (c.offset[k] >> 3) - start[g];  // 0..15; the window sits in both 128-bit halves
                shuf[g][4 * i] = uint8_t(r);
                shuf[g][4 * i + 1] = r + 1 < 16 ? uint8_t(r + 1) : 0x80;  // past the window only if unused
                shuf[g][4 * i + 2] = shuf[g][4 * i + 3] = 0x80;                // zero
                shift[g][i] = c.offset[k] & 7;
                mask[g][i] = (1 << w) - 1;
                lift[g][i] = wide[g] ? at_books[w] : w < 4 ? kAt[w] : 0;
                lanes4[g][i] = w == 4 ? -1 : 0;
                scale[g][i] = c.scale[k];
            }
        }
    }

    // y_t[k, k + 8) of the block at T, k % 8 == 0
    __m256 y8(const uint8_t* T, int64_t k) const {
        const int64_t g = k / 8;
        const uint8_t* area = T + c.idx_offset;
        __m128i w;
        if (small) {
            uint8_t pad[16] = {};
            std::memcpy(pad, area, c.idx_bytes);
            w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(pad));
        } else {
            w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(area + start[g]));
        }
        const __m256i pair = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(w), load8(shuf[g]));
        const __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(pair, load8(shift[g])), load8(mask[g]));
        const __m256i at = _mm256_add_epi32(idx, load8(lift[g]));
        __m256 y;
        if (wide[g]) {
            y = _mm256_i32gather_ps(books, at, 4);
        } else {
            y = lookup<4>(mix, at);
            if (has4[g]) y = _mm256_blendv_ps(y, lookup<4>(four, idx), _mm256_castsi256_ps(load8(lanes4[g])));
        }
        return _mm256_mul_ps(y, _mm256_load_ps(scale[g]));
    }
    float y1(const uint8_t* T, int64_t k) const {
        const int w = c.bits[k];
        return w == 0 ? 0.0f : c.scale[k] * c.cb[w][bits_at(T + c.idx_offset, c.offset[k], w)];
    }

    template <class V>
    static __m256i load8(const V* v) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(v)); }
};

// The kernels below read a page through Pg (Page, CalibView): y8(T, k) and y1(T, k).

// NH heads x NT consecutive tokens from t0, accumulators in registers.
template <class Pg, int NH, int NT>
void key_tile(const Pg& pg, const float* q, const uint8_t* blk, int64_t t0, int64_t n, float* s) {
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

template <class Pg, int NH, int NT = NH >= 4 ? 2 : 4>
void key_heads(const Pg& pg, const float* q, const uint8_t* blk, int64_t n, float* s) {
    int64_t t = 0;
    for (; t + NT <= n; t += NT) key_tile<Pg, NH, NT>(pg, q, blk, t, n, s);
    for (; t < n; ++t) key_tile<Pg, NH, 1>(pg, q, blk, t, n, s);
}

template <int B, bool Rvq>
void key_scores_b(const CodePage& c, const float* q, int64_t n_q, const uint8_t* blk, int64_t n, float* s) {
    const Page<B, Rvq> pg(c);
    const int64_t d = c.d;
    int64_t h = 0;
    for (; h + 4 <= n_q; h += 4) key_heads<Page<B, Rvq>, 4>(pg, q + h * d, blk, n, s + h * n);
    for (; h + 2 <= n_q; h += 2) key_heads<Page<B, Rvq>, 2>(pg, q + h * d, blk, n, s + h * n);
    for (; h < n_q; ++h) key_heads<Page<B, Rvq>, 1>(pg, q + h * d, blk, n, s + h * n);
}

// NH heads x NC chunks of 8 channels from c0, summed over all n tokens in registers.
template <class Pg, int NH, int NC>
void value_tile(const Pg& pg, const float* p, const uint8_t* blk, int64_t n, int64_t c0, float* acc) {
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

template <class Pg, int NH, int NC = NH == 1 ? 8 : NH == 2 ? 4 : 2>
void value_heads(const Pg& pg, const float* p, const uint8_t* blk, int64_t n, float* acc) {
    const int64_t d = pg.c.d, d8 = d / 8 * 8;
    int64_t c = 0;
    for (; c + 8 * NC <= d8; c += 8 * NC) value_tile<Pg, NH, NC>(pg, p, blk, n, c, acc);
    for (; c < d8; c += 8) value_tile<Pg, NH, 1>(pg, p, blk, n, c, acc);
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
    for (; h + 4 <= n_q; h += 4) value_heads<Page<B, Rvq>, 4>(pg, p + h * n, blk, n, acc + h * d);
    for (; h + 2 <= n_q; h += 2) value_heads<Page<B, Rvq>, 2>(pg, p + h * n, blk, n, acc + h * d);
    for (; h < n_q; ++h) value_heads<Page<B, Rvq>, 1>(pg, p + h * n, blk, n, acc + h * d);
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

// rot=calib: every head of the call (up to 4 at a time) in one tile, so that a token's block is
// unpacked once for all of them (GQA 3 would otherwise go as 2 + 1 and unpack twice):
// f(NH, h) for heads [h, h + NH), NH a std::integral_constant.
template <class F>
void calib_head_tiles(int64_t n_q, F f) {
    for (int64_t h = 0; h < n_q; h += 4) {
        switch (n_q - h < 4 ? n_q - h : 4) {
            case 1: f(std::integral_constant<int, 1>{}, h); break;
            case 2: f(std::integral_constant<int, 2>{}, h); break;
            case 3: f(std::integral_constant<int, 3>{}, h); break;
            default: f(std::integral_constant<int, 4>{}, h); break;
        }
    }
}

// Keys one token a tile, which leaves registers for the codebooks.
void key_scores(const CalibPage& c, const float* q, int64_t n_q, const uint8_t* blk, int64_t n, float* s) {
    const CalibView v(c);
    const int64_t d = c.d;
    calib_head_tiles(n_q, [&](auto nh, int64_t h) {
        key_heads<CalibView, decltype(nh)::value, 1>(v, q + h * d, blk, n, s + h * n);
    });
}

void value_accumulate(const CalibPage& c, const float* p, int64_t n_q, const uint8_t* blk, int64_t n, float* acc) {
    const CalibView v(c);
    const int64_t d = c.d;
    calib_head_tiles(n_q, [&](auto nh, int64_t h) {
        value_heads<CalibView, decltype(nh)::value>(v, p + h * n, blk, n, acc + h * d);
    });
}

}  // namespace vxq::cpu::turbo_avx2

// AVX2 + FMA + F16C matmul kernels.  The order of every floating-point operation is the one
// documented at the top of matmul.cpp; only the integer parts (which are exact) and the order in
// which *different* outputs are computed are free.  Mind that GCC contracts a*b+c into an fma
// whenever FMA is enabled (even in ISO mode), so float expressions here never add a product:
// every multiply-add is an explicit _mm256_fmadd_ps / _mm_fmadd_ss.
#include "kernels/cpu/matmul_avx2.h"

#include <immintrin.h>

#include <cstring>

namespace vxq::cpu::avx2 {

namespace {

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

inline uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

// tinyBLAS hsum / hsum_float_8: (hi + lo), then x + movehl(x), then lane0 + lane1.
inline float hsum8(__m256 x) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

// hsum8 of four accumulators at once: [hsum8(a0), hsum8(a1), hsum8(a2), hsum8(a3)], each with the
// very same additions as hsum8.
inline __m128 hsum8x4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m128 v0 = _mm_add_ps(_mm256_extractf128_ps(a0, 1), _mm256_castps256_ps128(a0));
    const __m128 v1 = _mm_add_ps(_mm256_extractf128_ps(a1, 1), _mm256_castps256_ps128(a1));
    const __m128 v2 = _mm_add_ps(_mm256_extractf128_ps(a2, 1), _mm256_castps256_ps128(a2));
    const __m128 v3 = _mm_add_ps(_mm256_extractf128_ps(a3, 1), _mm256_castps256_ps128(a3));
    // p01 = [v0_0+v0_2, v1_0+v1_2, v0_1+v0_3, v1_1+v1_3]
    const __m128 p01 = _mm_add_ps(_mm_unpacklo_ps(v0, v1), _mm_unpackhi_ps(v0, v1));
    const __m128 p23 = _mm_add_ps(_mm_unpacklo_ps(v2, v3), _mm_unpackhi_ps(v2, v3));
    return _mm_add_ps(_mm_movelh_ps(p01, p23), _mm_movehl_ps(p23, p01));
}

// GGML_F32x8_REDUCE of 4 accumulators.
inline float reduce4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    a0 = _mm256_add_ps(a0, a2);
    a1 = _mm256_add_ps(a1, a3);
    a0 = _mm256_add_ps(a0, a1);
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    return _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
}

// ggml_vec_dot_bf16 (AVX2) final reduction: (c1+c3)+(c2+c4), then hsum8.
inline float reduce4_bf16(__m256 c1, __m256 c2, __m256 c3, __m256 c4) {
    return hsum8(_mm256_add_ps(_mm256_add_ps(c1, c3), _mm256_add_ps(c2, c4)));
}

// ---------------------------------------------------------------------------------------------
// weight loads, 8 elements widened to f32

inline __m256 load8_f16(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8_bf16(const uint8_t* p) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
inline __m256 load8_f32(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }

template <int T>  // 0 = f32, 1 = f16, 2 = bf16
inline __m256 load8w(const uint8_t* row, int64_t i) {
    if constexpr (T == 0) return load8_f32(row + 4 * i);
    else if constexpr (T == 1) return load8_f16(row + 2 * i);
    else return load8_bf16(row + 2 * i);
}

template <int T>
inline float load1w(const uint8_t* row, int64_t i) {
    if constexpr (T == 0) {
        float v;
        std::memcpy(&v, row + 4 * i, 4);
        return v;
    } else if constexpr (T == 1) {
        return f16_to_f32(load_u16(row + 2 * i));
    } else {
        const uint32_t u = uint32_t(load_u16(row + 2 * i)) << 16;
        float v;
        std::memcpy(&v, &u, 4);
        return v;
    }
}

// ---------------------------------------------------------------------------------------------
// Lanes8 (tinyBLAS): one 8-lane fma chain per output, hsum8.

template <int RM, int RN>
inline void tile_lanes8(const float* A, int64_t lda, const float* B, int64_t ldb, int64_t k,
                        float* C, int64_t ldc) {
    __m256 acc[RN][RM];
#pragma GCC unroll 16
    for (int j = 0; j < RN; ++j)
#pragma GCC unroll 16
        for (int i = 0; i < RM; ++i) acc[j][i] = _mm256_setzero_ps();

    for (int64_t l = 0; l < k; l += 8) {
        __m256 b[RN];
#pragma GCC unroll 16
        for (int j = 0; j < RN; ++j) b[j] = _mm256_loadu_ps(B + j * ldb + l);
#pragma GCC unroll 16
        for (int i = 0; i < RM; ++i) {
            const __m256 a = _mm256_loadu_ps(A + i * lda + l);
#pragma GCC unroll 16
            for (int j = 0; j < RN; ++j) acc[j][i] = _mm256_fmadd_ps(a, b[j], acc[j][i]);
        }
    }
#pragma GCC unroll 16
    for (int j = 0; j < RN; ++j) {
        if constexpr (RM == 4) {
            _mm_storeu_ps(C + j * ldc, hsum8x4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]));
        } else {
            for (int i = 0; i < RM; ++i) C[j * ldc + i] = hsum8(acc[j][i]);
        }
    }
}

// 4 rows of f16 / bf16 weights widened into a dense f32 panel (row stride k).
void widen_panel(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t k, float* panel) {
    for (int i = 0; i < 4; ++i) {
        const uint8_t* row = w + size_t(i) * row_bytes;
        float* out = panel + i * k;
        if (type == GgmlType::F16) {
            for (int64_t c = 0; c < k; c += 8) _mm256_storeu_ps(out + c, load8_f16(row + 2 * c));
        } else if (type == GgmlType::BF16) {
            for (int64_t c = 0; c < k; c += 8) _mm256_storeu_ps(out + c, load8_bf16(row + 2 * c));
        } else {
            std::memcpy(out, row, size_t(k) * 4);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// ggml_vec_dot_{f32,f16,bf16}: 4 x 8 lanes over steps of 32, R rows at once.

template <int T, int R>
inline void vec_rows(const uint8_t* w, size_t row_bytes, const float* x, int64_t k, float* out) {
    const int64_t np = k & ~int64_t(31);
    __m256 acc[R][4];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_setzero_ps();

    for (int64_t i = 0; i < np; i += 32) {
        __m256 xv[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) xv[j] = _mm256_loadu_ps(x + i + 8 * j);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            const uint8_t* row = w + size_t(r) * row_bytes;
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j)
                acc[r][j] = _mm256_fmadd_ps(load8w<T>(row, i + 8 * j), xv[j], acc[r][j]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        const uint8_t* row = w + size_t(r) * row_bytes;
        if constexpr (T == 0) {
            // float sum; leftovers fused one at a time
            __m128 s = _mm_set_ss(reduce4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
            for (int64_t i = np; i < k; ++i)
                s = _mm_fmadd_ss(_mm_set_ss(load1w<T>(row, i)), _mm_set_ss(x[i]), s);
            out[r] = _mm_cvtss_f32(s);
        } else {
            const float main = T == 1 ? reduce4(acc[r][0], acc[r][1], acc[r][2], acc[r][3])
                                      : reduce4_bf16(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
            double s = double(main);
            for (int64_t i = np; i < k; ++i) {
                const float p = _mm_cvtss_f32(
                    _mm_mul_ss(_mm_set_ss(load1w<T>(row, i)), _mm_set_ss(x[i])));  // exact
                s += double(p);
            }
            out[r] = float(s);
        }
    }
}

#ifndef VXQ_VEC_ROWS
#define VXQ_VEC_ROWS 2
#endif
template <int T>
void gemv_vec_t(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const float* x,
                int64_t t0, int64_t t1, int64_t k, float* y, int64_t ldy) {
    constexpr int R = VXQ_VEC_ROWS;
    int64_t r = r0;
    float out[R];
    for (; r + R <= r1; r += R) {
        const uint8_t* wr = w + size_t(r) * row_bytes;
        for (int64_t t = t0; t < t1; ++t) {
            vec_rows<T, R>(wr, row_bytes, x + t * k, k, out);
            for (int i = 0; i < R; ++i) y[t * ldy + r + i] = out[i];
        }
    }
    for (; r < r1; ++r) {
        const uint8_t* wr = w + size_t(r) * row_bytes;
        for (int64_t t = t0; t < t1; ++t) {
            vec_rows<T, 1>(wr, row_bytes, x + t * k, k, out);
            y[t * ldy + r] = out[0];
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Q8_0 / Q4_0 in ggml's lane order: lanes = madd(maddubs(|w|, sign(x, w)), 1), then
// acc = fma(set1(dw * dx), float(lanes), acc), hsum8.

inline __m256i unpack_q4_0(const uint8_t* qs) {  // ggml bytes_from_nibbles_32 - 8
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m256i both = _mm256_insertf128_si256(_mm256_castsi128_si256(raw), _mm_srli_epi16(raw, 4), 1);
    return _mm256_sub_epi8(_mm256_and_si256(both, _mm256_set1_epi8(0x0f)), _mm256_set1_epi8(8));
}

template <bool Q4>
inline const uint8_t* block_ptr(const uint8_t* row, int64_t b) {
    return row + size_t(b) * (Q4 ? sizeof(BlockQ4_0) : sizeof(BlockQ8_0));
}

template <bool Q4>
inline __m256i load_codes(const uint8_t* blk) {
    if constexpr (Q4) return unpack_q4_0(blk + 2);
    else return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
}

inline __m256 lanes_i8(__m256i aw, __m256i w, __m256i x) {
    const __m256i p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

template <bool Q4, int RM, int RN>
inline void tile_q0(const uint8_t* w, size_t row_bytes, const BlockQ8_0* xq, const float* xd,
                    int64_t nb, float* C, int64_t ldc) {
    __m256 acc[RN][RM];
#pragma GCC unroll 16
    for (int j = 0; j < RN; ++j)
#pragma GCC unroll 16
        for (int i = 0; i < RM; ++i) acc[j][i] = _mm256_setzero_ps();

    for (int64_t b = 0; b < nb; ++b) {
        __m256i wv[RM], aw[RM];
        float dw[RM];
#pragma GCC unroll 16
        for (int i = 0; i < RM; ++i) {
            const uint8_t* blk = block_ptr<Q4>(w + size_t(i) * row_bytes, b);
            wv[i] = load_codes<Q4>(blk);
            aw[i] = _mm256_sign_epi8(wv[i], wv[i]);
            dw[i] = f16_to_f32(load_u16(blk));
        }
#pragma GCC unroll 16
        for (int j = 0; j < RN; ++j) {
            const BlockQ8_0& xb = xq[j * nb + b];
            const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs));
            const float dx = xd[j * nb + b];
#pragma GCC unroll 16
            for (int i = 0; i < RM; ++i) {
                const __m256 d = _mm256_set1_ps(dw[i] * dx);
                acc[j][i] = _mm256_fmadd_ps(d, lanes_i8(aw[i], wv[i], xv), acc[j][i]);
            }
        }
    }
#pragma GCC unroll 16
    for (int j = 0; j < RN; ++j) {
        if constexpr (RM == 4) {
            _mm_storeu_ps(C + j * ldc, hsum8x4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]));
        } else {
            for (int i = 0; i < RM; ++i) C[j * ldc + i] = hsum8(acc[j][i]);
        }
    }
}

template <bool Q4, int RN>
inline void tile_q0_rows(int64_t rm, const uint8_t* w, size_t row_bytes, const BlockQ8_0* xq,
                         const float* xd, int64_t nb, float* C, int64_t ldc) {
    switch (rm) {
        case 4: tile_q0<Q4, 4, RN>(w, row_bytes, xq, xd, nb, C, ldc); break;
        case 3: tile_q0<Q4, 3, RN>(w, row_bytes, xq, xd, nb, C, ldc); break;
        case 2: tile_q0<Q4, 2, RN>(w, row_bytes, xq, xd, nb, C, ldc); break;
        default: tile_q0<Q4, 1, RN>(w, row_bytes, xq, xd, nb, C, ldc); break;
    }
}

template <bool Q4>
void gemm_q0_t(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const BlockQ8_0* xq,
               const float* xd, int64_t t0, int64_t t1, int64_t nb, float* y, int64_t ldy) {
    constexpr int64_t RN = 3;
    for (int64_t r = r0; r < r1; r += 4) {
        const int64_t rm = min64(4, r1 - r);
        const uint8_t* wr = w + size_t(r) * row_bytes;
        int64_t t = t0;
        for (; t + RN <= t1; t += RN)
            tile_q0_rows<Q4, RN>(rm, wr, row_bytes, xq + t * nb, xd + t * nb, nb, y + t * ldy + r, ldy);
        for (; t < t1; ++t)
            tile_q0_rows<Q4, 1>(rm, wr, row_bytes, xq + t * nb, xd + t * nb, nb, y + t * ldy + r, ldy);
    }
}

// ---------------------------------------------------------------------------------------------
// Q4_0 in the order of ggml's repacked q4_0_8x8 kernels: per output, the exact integer dot of each
// block, then acc = fma(float(isum), dw * dx, acc).  8 rows at once: lane r of acc is row r.

// Sums the 8 lanes of each of p[0..7] into lane r of the result (exact integer adds).
inline __m256i reduce_rows8(__m256i p0, __m256i p1, __m256i p2, __m256i p3, __m256i p4, __m256i p5,
                            __m256i p6, __m256i p7) {
    const __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
    const __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(p4, p5), _mm256_hadd_epi32(p6, p7));
    return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                            _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

inline __m256i isum_pairs(__m256i aw, __m256i w, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
}

template <int RN>
inline void tile_q4_repack(const uint8_t* w, size_t row_bytes, const BlockQ8_0* xq,
                           const float* xd, int64_t nb, float* C, int64_t ldc) {
    __m256 acc[RN];
#pragma GCC unroll 8
    for (int j = 0; j < RN; ++j) acc[j] = _mm256_setzero_ps();

    for (int64_t b = 0; b < nb; ++b) {
        __m256i xv[RN];
#pragma GCC unroll 8
        for (int j = 0; j < RN; ++j)
            xv[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[j * nb + b].qs));
        __m256i p[RN][8];
        alignas(16) uint16_t dbits[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
            const uint8_t* blk = w + size_t(i) * row_bytes + size_t(b) * sizeof(BlockQ4_0);
            dbits[i] = load_u16(blk);
            const __m256i wv = unpack_q4_0(blk + 2);
            const __m256i aw = _mm256_sign_epi8(wv, wv);
#pragma GCC unroll 8
            for (int j = 0; j < RN; ++j) p[j][i] = isum_pairs(aw, wv, xv[j]);
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(dbits)));
#pragma GCC unroll 8
        for (int j = 0; j < RN; ++j) {
            const __m256i tot =
                reduce_rows8(p[j][0], p[j][1], p[j][2], p[j][3], p[j][4], p[j][5], p[j][6], p[j][7]);
            const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(xd[j * nb + b]));  // exact
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), s, acc[j]);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < RN; ++j) _mm256_storeu_ps(C + j * ldc, acc[j]);
}

}  // namespace

// ---------------------------------------------------------------------------------------------

void round_f16(const float* x, float* out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; ++i) out[i] = _cvtsh_ss(_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT));
}

void round_bf16(const float* x, float* out, int64_t n) {
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i quiet = _mm256_set1_epi32(64);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i));
        const __m256i hi = _mm256_srli_epi32(u, 16);
        const __m256i rounded =
            _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(hi, one))), 16);
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absmask), inf);
        const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, quiet), nan);
        _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(r, 16)));
    }
    for (; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, x + i, 4);
        uint32_t r;
        if ((u & 0x7fffffffu) > 0x7f800000u) r = (u >> 16) | 64u;
        else r = (u + (0x7fffu + ((u >> 16) & 1u))) >> 16;
        r <<= 16;
        std::memcpy(out + i, &r, 4);
    }
}

void quantize_q8_0(const float* x, BlockQ8_0* y, float* yd, int64_t n) {
    const int64_t nb = n / 32;
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < nb; ++b) {
        const float* v = x + 32 * b;
        __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
        __m256 v2 = _mm256_loadu_ps(v + 16), v3 = _mm256_loadu_ps(v + 24);
        __m256 max_abs = _mm256_andnot_ps(sign_bit, v0);
        max_abs = _mm256_max_ps(max_abs, _mm256_andnot_ps(sign_bit, v1));
        max_abs = _mm256_max_ps(max_abs, _mm256_andnot_ps(sign_bit, v2));
        max_abs = _mm256_max_ps(max_abs, _mm256_andnot_ps(sign_bit, v3));
        __m128 max4 = _mm_max_ps(_mm256_extractf128_ps(max_abs, 1), _mm256_castps256_ps128(max_abs));
        max4 = _mm_max_ps(max4, _mm_movehl_ps(max4, max4));
        max4 = _mm_max_ss(max4, _mm_movehdup_ps(max4));
        const float amax = _mm_cvtss_f32(max4);

        const float d = amax / 127.f;
        const uint16_t dh = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        y[b].d = dh;
        yd[b] = _cvtsh_ss(dh);
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        const __m256 mul = _mm256_set1_ps(id);
        v0 = _mm256_round_ps(_mm256_mul_ps(v0, mul), _MM_ROUND_NEAREST);
        v1 = _mm256_round_ps(_mm256_mul_ps(v1, mul), _MM_ROUND_NEAREST);
        v2 = _mm256_round_ps(_mm256_mul_ps(v2, mul), _MM_ROUND_NEAREST);
        v3 = _mm256_round_ps(_mm256_mul_ps(v3, mul), _MM_ROUND_NEAREST);
        __m256i i0 = _mm256_cvtps_epi32(v0), i1 = _mm256_cvtps_epi32(v1);
        __m256i i2 = _mm256_cvtps_epi32(v2), i3 = _mm256_cvtps_epi32(v3);
        i0 = _mm256_packs_epi32(i0, i1);
        i2 = _mm256_packs_epi32(i2, i3);
        i0 = _mm256_packs_epi16(i0, i2);
        i0 = _mm256_permutevar8x32_epi32(i0, perm);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs), i0);
    }
}

void gemm_lanes8(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1,
                 const float* x, int64_t t0, int64_t t1, int64_t k, float* y, int64_t ldy,
                 float* panel) {
#ifndef VXQ_LANES8_CHUNK
#define VXQ_LANES8_CHUNK 48
#endif
    constexpr int64_t kChunk = VXQ_LANES8_CHUNK;  // tokens per pass over the weights
    const bool direct = type == GgmlType::F32 && row_bytes % 4 == 0;
    for (int64_t tc = t0; tc < t1; tc += kChunk) {
        const int64_t te = min64(tc + kChunk, t1);
        for (int64_t r = r0; r < r1; r += 4) {
            const uint8_t* wr = w + size_t(r) * row_bytes;
            const float* A;
            int64_t lda;
            if (direct) {
                A = reinterpret_cast<const float*>(wr);
                lda = int64_t(row_bytes / 4);
            } else {
                widen_panel(type, wr, row_bytes, k, panel);
                A = panel;
                lda = k;
            }
            int64_t t = tc;
            for (; t + 3 <= te; t += 3) tile_lanes8<4, 3>(A, lda, x + t * k, k, k, y + t * ldy + r, ldy);
            if (te - t == 2) tile_lanes8<4, 2>(A, lda, x + t * k, k, k, y + t * ldy + r, ldy);
            else if (te - t == 1) tile_lanes8<4, 1>(A, lda, x + t * k, k, k, y + t * ldy + r, ldy);
        }
    }
}

void gemv_vec(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1,
              const float* x, int64_t t0, int64_t t1, int64_t k, float* y, int64_t ldy) {
    switch (type) {
        case GgmlType::F32: gemv_vec_t<0>(w, row_bytes, r0, r1, x, t0, t1, k, y, ldy); break;
        case GgmlType::F16: gemv_vec_t<1>(w, row_bytes, r0, r1, x, t0, t1, k, y, ldy); break;
        case GgmlType::BF16: gemv_vec_t<2>(w, row_bytes, r0, r1, x, t0, t1, k, y, ldy); break;
        default: break;
    }
}

void gemm_q0_lanes(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1,
                   const BlockQ8_0* xq, const float* xd, int64_t t0, int64_t t1, int64_t nb,
                   float* y, int64_t ldy) {
    if (type == GgmlType::Q4_0) gemm_q0_t<true>(w, row_bytes, r0, r1, xq, xd, t0, t1, nb, y, ldy);
    else gemm_q0_t<false>(w, row_bytes, r0, r1, xq, xd, t0, t1, nb, y, ldy);
}

void gemm_q4_repack(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1,
                    const BlockQ8_0* xq, const float* xd, int64_t t0, int64_t t1, int64_t nb,
                    float* y, int64_t ldy) {
    constexpr int64_t RN = 2;
    for (int64_t r = r0; r + 8 <= r1; r += 8) {
        const uint8_t* wr = w + size_t(r) * row_bytes;
        int64_t t = t0;
        for (; t + RN <= t1; t += RN)
            tile_q4_repack<RN>(wr, row_bytes, xq + t * nb, xd + t * nb, nb, y + t * ldy + r, ldy);
        for (; t < t1; ++t)
            tile_q4_repack<1>(wr, row_bytes, xq + t * nb, xd + t * nb, nb, y + t * ldy + r, ldy);
    }
}

}  // namespace vxq::cpu::avx2

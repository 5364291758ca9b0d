// AVX2 + FMA + F16C matmul kernels.  The order of every floating-point operation is the one
// documented at the top of matmul.cpp; only the integer parts (which are exact) and the order in
// which *different* outputs are computed are free.  Mind that GCC contracts a*b+c into an fma
// whenever FMA is enabled (even in ISO mode), so float expressions here never add a product:
// every multiply-add is an explicit _mm256_fmadd_ps / _mm_fmadd_ss.
//
// Tuning knobs (compile-time; they change speed only, never results), chosen from a sweep of the
// variants with a standalone harness (see the commit report):
//   VXQ_LANES8_CHUNK  tokens per pass over the weights in gemm_lanes8           (96)
//   VXQ_LANES8_L1     bytes of widened weight panels kept in L1 per pass          (20 KiB)
//   VXQ_VEC_ROWS      rows per ggml_vec_dot-order GEMV step                        (1)
//                     (2 measured 1.4-2x slower in decode on the 2-core EPYC VM on 2026-12-02:
//                     tg64 vxq-ternary-h64-f16 221-250 against 389-426 t/s, vxq-llama-h64-f16
//                     633-909 against 1244-1246; one row is one sequential weight stream)
//   VXQ_PF_DIST       software prefetch distance in weight bytes for GEMV (0 = off) (2048)
//   VXQ_Q0_RM/RN      rows x tokens of a Q0Lanes GEMM tile (GEMV: 4 x 1)           (3 x 3)
//   VXQ_Q4R_RN        tokens per Q4Repack tile of 8 rows                           (4)
#include "kernels/cpu/matmul_avx2.h"

#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/avx2_inl.h"

#ifndef VXQ_LANES8_CHUNK
#define VXQ_LANES8_CHUNK 96
#endif
#ifndef VXQ_LANES8_L1
#define VXQ_LANES8_L1 (20 * 1024)
#endif
#ifndef VXQ_VEC_ROWS
#define VXQ_VEC_ROWS 1
#endif
#ifndef VXQ_PF_DIST
#define VXQ_PF_DIST 2048
#endif
#ifndef VXQ_Q0_RM
#define VXQ_Q0_RM 3
#endif
#ifndef VXQ_Q0_RN
#define VXQ_Q0_RN 3
#endif
#ifndef VXQ_Q4R_RN
#define VXQ_Q4R_RN 4
#endif

namespace vxq::cpu::avx2 {

namespace {

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

inline uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

// hsum (avx2_inl.h: tinyBLAS's hsum, ggml's hsum_float_8) of four accumulators at once:
// [hsum(a0), hsum(a1), hsum(a2), hsum(a3)], each with the very same additions.
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
    return hsum(_mm256_add_ps(_mm256_add_ps(c1, c3), _mm256_add_ps(c2, c4)));
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
inline __m256 load8_f32(const uint8_t* p) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
}

template <int T>  // 0 = f32, 1 = f16, 2 = bf16
inline __m256 load8w(const uint8_t* row, int64_t i) {
    if constexpr (T == 0)
        return load8_f32(row + 4 * i);
    else if constexpr (T == 1)
        return load8_f16(row + 2 * i);
    else
        return load8_bf16(row + 2 * i);
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
            for (int i = 0; i < RM; ++i) C[j * ldc + i] = hsum(acc[j][i]);
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
#if VXQ_PF_DIST > 0
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r)
            _mm_prefetch(reinterpret_cast<const char*>(w + size_t(r) * row_bytes) +
                             (T == 0 ? 4 : 2) * i + VXQ_PF_DIST,
                         _MM_HINT_T0);
#endif
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
            for (int64_t i = np; i < k; ++i) {
                const __m128 wi = _mm_set_ss(load1w<T>(row, i)), xi = _mm_set_ss(x[i]);
                if constexpr (kF32LeftoverFma)
                    s = _mm_fmadd_ss(wi, xi, s);
                else
                    s = _mm_add_ss(s, _mm_mul_ss(wi, xi));
            }
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
    const __m256i both =
        _mm256_insertf128_si256(_mm256_castsi128_si256(raw), _mm_srli_epi16(raw, 4), 1);
    return _mm256_sub_epi8(_mm256_and_si256(both, _mm256_set1_epi8(0x0f)), _mm256_set1_epi8(8));
}

template <bool Q4>
inline const uint8_t* block_ptr(const uint8_t* row, int64_t b) {
    return row + size_t(b) * (Q4 ? sizeof(BlockQ4_0) : sizeof(BlockQ8_0));
}

template <bool Q4>
inline __m256i load_codes(const uint8_t* blk) {
    if constexpr (Q4)
        return unpack_q4_0(blk + 2);
    else
        return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
}

inline __m256 lanes_i8(__m256i aw, __m256i w, __m256i x) {
    const __m256i p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

template <bool Q4, int RM, int RN>
inline void tile_q0(const uint8_t* w, size_t row_bytes, const BlockQ8_0* xq, const float* xd,
                    int64_t nb, float* C, int64_t ldc) {
    static_assert(RM <= 4, "scales of up to 4 rows are gathered in one xmm");
    __m256 acc[RN][RM];
#pragma GCC unroll 16
    for (int j = 0; j < RN; ++j)
#pragma GCC unroll 16
        for (int i = 0; i < RM; ++i) acc[j][i] = _mm256_setzero_ps();

    for (int64_t b = 0; b < nb; ++b) {
        __m256i wv[RM], aw[RM];
        __m128i dbits = _mm_setzero_si128();
#pragma GCC unroll 16
        for (int i = 0; i < RM; ++i) {
            const uint8_t* blk = block_ptr<Q4>(w + size_t(i) * row_bytes, b);
#if VXQ_PF_DIST > 0
            if constexpr (RN == 1)
                _mm_prefetch(reinterpret_cast<const char*>(blk) + VXQ_PF_DIST, _MM_HINT_T0);
#endif
            wv[i] = load_codes<Q4>(blk);
            aw[i] = _mm256_sign_epi8(wv[i], wv[i]);
            dbits = _mm_insert_epi16(dbits, load_u16(blk), i);
        }
        const __m128 dw = _mm_cvtph_ps(dbits);
#pragma GCC unroll 16
        for (int j = 0; j < RN; ++j) {
            const BlockQ8_0& xb = xq[j * nb + b];
            const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs));
            // dw[i] * dx for the RM rows (each product exact), then broadcast per row
            const __m256 d4 = _mm256_castps128_ps256(_mm_mul_ps(dw, _mm_set1_ps(xd[j * nb + b])));
#pragma GCC unroll 16
            for (int i = 0; i < RM; ++i) {
                const __m256 d = _mm256_permutevar8x32_ps(d4, _mm256_set1_epi32(i));
                acc[j][i] = _mm256_fmadd_ps(d, lanes_i8(aw[i], wv[i], xv), acc[j][i]);
            }
        }
    }
#pragma GCC unroll 16
    for (int j = 0; j < RN; ++j) {
        if constexpr (RM == 4) {
            _mm_storeu_ps(C + j * ldc, hsum8x4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]));
        } else {
            for (int i = 0; i < RM; ++i) C[j * ldc + i] = hsum(acc[j][i]);
        }
    }
}

template <bool Q4, int RN>
inline void tile_q0_any(int64_t rm, const uint8_t* w, size_t row_bytes, const BlockQ8_0* xq,
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
    // one token: 4 rows per tile; several tokens: RM x RN tiles
    const int64_t RM = t1 - t0 == 1 ? 4 : VXQ_Q0_RM;
    constexpr int64_t RN = VXQ_Q0_RN;
    for (int64_t r = r0; r < r1; r += RM) {
        const int64_t rm = min64(RM, r1 - r);
        const uint8_t* wr = w + size_t(r) * row_bytes;
        int64_t t = t0;
        for (; t + RN <= t1; t += RN)
            tile_q0_any<Q4, RN>(rm, wr, row_bytes, xq + t * nb, xd + t * nb, nb, y + t * ldy + r,
                                ldy);
        for (; t < t1; ++t)
            tile_q0_any<Q4, 1>(rm, wr, row_bytes, xq + t * nb, xd + t * nb, nb, y + t * ldy + r,
                               ldy);
    }
}

// ---------------------------------------------------------------------------------------------
// Q4_0 in the order of ggml's repacked q4_0_8x8 kernels: per output, the exact integer dot of each
// block, then acc = fma(float(isum), dw * dx, acc).  8 rows at once: lane r of acc is row r.

inline __m256i nibbles_q4_0(const uint8_t* qs) {  // the 32 raw nibbles (0..15), ggml's order
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m256i both =
        _mm256_insertf128_si256(_mm256_castsi128_si256(raw), _mm_srli_epi16(raw, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

// 8 * sum of the 32 codes of x, in every lane.
inline __m256i sum8_codes(__m256i x) {
    __m256i s =
        _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(8), x), _mm256_set1_epi16(1));
    s = _mm256_add_epi32(s, _mm256_shuffle_epi32(s, 0x4e));
    s = _mm256_add_epi32(s, _mm256_shuffle_epi32(s, 0xb1));
    return _mm256_add_epi32(s, _mm256_permute2x128_si256(s, s, 0x01));
}

// isum_r = sum_e (u_r[e] - 8) * x[e] = sum_e u_r[e] x[e] - 8 sum_e x[e]: exact integers, equal to
// ggml's sign/maddubs lanes for every activation code other than -128 (which the q8_0 quantizer
// never produces from finite input).
template <int RN>
inline void tile_q4_repack(const uint8_t* w, size_t row_bytes, const BlockQ8_0* xq, const float* xd,
                           int64_t nb, float* C, int64_t ldc) {
    __m256 acc[RN];
#pragma GCC unroll 8
    for (int j = 0; j < RN; ++j) acc[j] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);

    for (int64_t b = 0; b < nb; ++b) {
        __m256i xv[RN];
#pragma GCC unroll 8
        for (int j = 0; j < RN; ++j)
            xv[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[j * nb + b].qs));
        __m256i h[RN][4];
        __m128i dbits = _mm_setzero_si128();
#pragma GCC unroll 8
        for (int i = 0; i < 8; i += 2) {
            const uint8_t* b0 = w + size_t(i) * row_bytes + size_t(b) * sizeof(BlockQ4_0);
            const uint8_t* b1 = b0 + row_bytes;
#if VXQ_PF_DIST > 0
            if constexpr (RN == 1) {
                _mm_prefetch(reinterpret_cast<const char*>(b0) + VXQ_PF_DIST, _MM_HINT_T0);
                _mm_prefetch(reinterpret_cast<const char*>(b1) + VXQ_PF_DIST, _MM_HINT_T0);
            }
#endif
            dbits = _mm_insert_epi16(dbits, load_u16(b0), i);
            dbits = _mm_insert_epi16(dbits, load_u16(b1), i + 1);
            const __m256i u0 = nibbles_q4_0(b0 + 2), u1 = nibbles_q4_0(b1 + 2);
#pragma GCC unroll 8
            for (int j = 0; j < RN; ++j)
                h[j][i / 2] =
                    _mm256_hadd_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(u0, xv[j]), ones),
                                      _mm256_madd_epi16(_mm256_maddubs_epi16(u1, xv[j]), ones));
        }
        const __m256 dw = _mm256_cvtph_ps(dbits);
#pragma GCC unroll 8
        for (int j = 0; j < RN; ++j) {
            const __m256i h0123 = _mm256_hadd_epi32(h[j][0], h[j][1]);
            const __m256i h4567 = _mm256_hadd_epi32(h[j][2], h[j][3]);
            __m256i tot = _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                                           _mm256_permute2x128_si256(h0123, h4567, 0x31));
            tot = _mm256_sub_epi32(tot, sum8_codes(xv[j]));
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
        const __m256i rounded = _mm256_srli_epi32(
            _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(hi, one))), 16);
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absmask), inf);
        const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, quiet), nan);
        _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(r, 16)));
    }
    for (; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, x + i, 4);
        uint32_t r;
        if ((u & 0x7fffffffu) > 0x7f800000u)
            r = (u >> 16) | 64u;
        else
            r = (u + (0x7fffu + ((u >> 16) & 1u))) >> 16;
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
        __m128 max4 =
            _mm_max_ps(_mm256_extractf128_ps(max_abs, 1), _mm256_castps256_ps128(max_abs));
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

void gemm_lanes8(const Job& job) {
    const GgmlType type = job.type;
    const uint8_t* w = job.w;
    const size_t row_bytes = job.row_bytes;
    const int64_t k = job.k, r0 = job.r0, r1 = job.r1, t0 = job.t0, t1 = job.t1, ldy = job.ldy;
    const float* x = job.x;
    float* y = job.y;
    float* panel = job.scratch;
    // Loop nest: token chunks (their activations stay in L2) > blocks of P panels of 4 rows (in
    // L1, widened to f32 once per chunk) > token triples (3 rows of activations, reused from L1
    // across the P panels) > panels.
    constexpr int64_t kChunk = VXQ_LANES8_CHUNK;
    const bool direct = type == GgmlType::F32 && row_bytes % 4 == 0;
    int64_t P = VXQ_LANES8_L1 / (16 * k);
    P = P < 1 ? 1 : (P > kLanes8MaxPanels ? kLanes8MaxPanels : P);
    const float* A[kLanes8MaxPanels];
    const int64_t lda = direct ? int64_t(row_bytes / 4) : k;
    for (int64_t tc = t0; tc < t1; tc += kChunk) {
        const int64_t te = min64(tc + kChunk, t1);
        for (int64_t rb = r0; rb < r1; rb += 4 * P) {
            const int64_t np = min64(P, (r1 - rb) / 4);
            for (int64_t p = 0; p < np; ++p) {
                const uint8_t* wr = w + size_t(rb + 4 * p) * row_bytes;
                if (direct) {
                    A[p] = reinterpret_cast<const float*>(wr);
                } else {
                    widen_panel(type, wr, row_bytes, k, panel + p * 4 * k);
                    A[p] = panel + p * 4 * k;
                }
            }
            int64_t t = tc;
            for (; t + 3 <= te; t += 3)
                for (int64_t p = 0; p < np; ++p)
                    tile_lanes8<4, 3>(A[p], lda, x + t * k, k, k, y + t * ldy + rb + 4 * p, ldy);
            for (int64_t p = 0; p < np; ++p) {
                if (te - t == 2)
                    tile_lanes8<4, 2>(A[p], lda, x + t * k, k, k, y + t * ldy + rb + 4 * p, ldy);
                else if (te - t == 1)
                    tile_lanes8<4, 1>(A[p], lda, x + t * k, k, k, y + t * ldy + rb + 4 * p, ldy);
            }
        }
    }
}

void gemv_vec(const Job& j) {
    switch (j.type) {
        case GgmlType::F32:
            gemv_vec_t<0>(j.w, j.row_bytes, j.r0, j.r1, j.x, j.t0, j.t1, j.k, j.y, j.ldy);
            break;
        case GgmlType::F16:
            gemv_vec_t<1>(j.w, j.row_bytes, j.r0, j.r1, j.x, j.t0, j.t1, j.k, j.y, j.ldy);
            break;
        case GgmlType::BF16:
            gemv_vec_t<2>(j.w, j.row_bytes, j.r0, j.r1, j.x, j.t0, j.t1, j.k, j.y, j.ldy);
            break;
        default: break;
    }
}

void gemm_q0_lanes(const Job& j) {
    const int64_t nb = j.k / 32;
    if (j.type == GgmlType::Q4_0)
        gemm_q0_t<true>(j.w, j.row_bytes, j.r0, j.r1, j.xq, j.xd, j.t0, j.t1, nb, j.y, j.ldy);
    else
        gemm_q0_t<false>(j.w, j.row_bytes, j.r0, j.r1, j.xq, j.xd, j.t0, j.t1, nb, j.y, j.ldy);
}

void gemm_q4_repack(const Job& j) {
    constexpr int64_t RN = VXQ_Q4R_RN;
    const int64_t nb = j.k / 32;
    for (int64_t r = j.r0; r + 8 <= j.r1; r += 8) {
        const uint8_t* wr = j.w + size_t(r) * j.row_bytes;
        int64_t t = j.t0;
        for (; t + RN <= j.t1; t += RN)
            tile_q4_repack<RN>(wr, j.row_bytes, j.xq + t * nb, j.xd + t * nb, nb,
                               j.y + t * j.ldy + r, j.ldy);
        for (; t < j.t1; ++t)
            tile_q4_repack<1>(wr, j.row_bytes, j.xq + t * nb, j.xd + t * nb, nb,
                              j.y + t * j.ldy + r, j.ldy);
    }
}

}  // namespace vxq::cpu::avx2

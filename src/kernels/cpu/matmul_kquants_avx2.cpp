// AVX2 kernels of matmul_kquants.h: the same 8 integer lanes per super-block (value e in lane
// (e % 32) / 4: byte e % 32 of a 32-byte vector, four bytes per 32-bit lane), the same fma per
// lane and the same final sum, so they equal dot_kquant_q8_K bit for bit (tests/test_kquants.cpp).
#include <immintrin.h>

#include <cstring>

#include "core/fp16.h"
#include "kernels/cpu/avx2_inl.h"
#include "kernels/cpu/matmul_kquants.h"

namespace vxq::cpu::avx2 {

namespace {

// Pairs of 16-bit lanes added into 32-bit lanes.
__m256i widen_pairs(__m256i v) { return _mm256_madd_epi16(v, _mm256_set1_epi16(1)); }

// Base-3 digits of bytes, each byte q in 16-bit lane arithmetic: ((q * m mod 256) * 3) >> 8 with
// m = 3^n given per 16-bit lane (both bytes of a lane take the same n).
__m256i tq1_digits(__m256i q, __m256i m) {
    const __m256i low = _mm256_set1_epi16(0x00FF), three = _mm256_set1_epi16(3);
    const auto digit = [&](__m256i b) {  // b: one byte per 16-bit lane
        const __m256i s = _mm256_and_si256(_mm256_mullo_epi16(b, m), low);
        return _mm256_srli_epi16(_mm256_mullo_epi16(s, three), 8);
    };
    const __m256i even = digit(_mm256_and_si256(q, low)), odd = digit(_mm256_srli_epi16(q, 8));
    return _mm256_or_si256(even, _mm256_slli_epi16(odd, 8));
}

// Q6_K: per half of 128 values, vector v holds values 32 v + b; q - 32 through maddubs(q, y) -
// maddubs(32, y), then each 16-bit lane (two values of one 16-value group) times its scale.
__m256i q6_lanes(const BlockQ6_K& w, const BlockQ8_K& x) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3), k32 = _mm256_set1_epi8(32);
    __m256i s32 = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
        const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.ql + 64 * half));
        const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.ql + 64 * half + 32));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qh + 32 * half));
        const __m256i q[4] = {
            _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_slli_epi16(_mm256_and_si256(qh, two), 4)),
            _mm256_or_si256(_mm256_and_si256(ql1, low4),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), two), 4)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), two), 4)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), two), 4)),
        };
        for (int v = 0; v < 4; ++v) {
            const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + 128 * half + 32 * v));
            const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q[v], y), _mm256_maddubs_epi16(k32, y));
            // 16-bit lanes 0-7 (values 0-15 of the vector) take scale 2 g, lanes 8-15 scale 2 g + 1
            const int g = 8 * half + 2 * v;
            const __m256i sc = _mm256_setr_epi16(w.scales[g], w.scales[g], w.scales[g], w.scales[g], w.scales[g],
                                                 w.scales[g], w.scales[g], w.scales[g], w.scales[g + 1],
                                                 w.scales[g + 1], w.scales[g + 1], w.scales[g + 1], w.scales[g + 1],
                                                 w.scales[g + 1], w.scales[g + 1], w.scales[g + 1]);
            s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(sc, p));
        }
    }
    return s32;
}

// A ternary super-block's digits as the dots multiply them: vectors v of 32 digits, each against
// the activations at x.qs + off[v]. TQ2_0: digit l of byte m of half h is value 128 h + 32 l + m.
// TQ1_0: qs[0..31] digit n is value 32 n + m; qs[32..47] digit n is value 160 + 16 n + m, so
// digits (0, 1), (2, 3) and (4, then qh's) share a 32-byte vector in halves; qh[j] digit n is
// value 240 + 4 n + j (byte 16 + 4 n + j of the last vector). TQ2_G128: two 128-value blocks, each
// its own scale and 16-value sums (half h: vectors 4 h .. 4 h + 3; digit l of byte m is value 32 l
// + m). The 16-bit lane sums stay below 2^12 (maddubs pairs of digits <= 2 and |x| <= 127).
struct TernaryDigits {
    __m256i t[8];
    int off[8];
    float dw[2];
};

__attribute__((always_inline)) inline void ternary_digits(GgmlType type, const uint8_t* row, int64_t i, TernaryDigits& d) {
    const __m256i three = _mm256_set1_epi8(3);
    if (type == GgmlType::TQ1_0) {
        const auto& w = reinterpret_cast<const BlockTQ1_0*>(row)[i];
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs));
        constexpr int16_t kPow3[5] = {1, 3, 9, 27, 81};
        for (int n = 0; n < 5; ++n) {
            d.t[n] = tq1_digits(a, _mm256_set1_epi16(kPow3[n]));
            d.off[n] = 32 * n;
        }
        const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.qs + 32)));
        const auto halves = [](int16_t lo, int16_t hi) {
            return _mm256_setr_epi16(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi);
        };
        d.t[5] = tq1_digits(b, halves(1, 3));
        d.t[6] = tq1_digits(b, halves(9, 27));
        uint32_t qh;
        std::memcpy(&qh, w.qh, sizeof qh);
        const __m256i c = _mm256_inserti128_si256(b, _mm_set1_epi32(int(qh)), 1);
        d.t[7] = tq1_digits(c, _mm256_setr_epi16(81, 81, 81, 81, 81, 81, 81, 81, 1, 1, 3, 3, 9, 9, 27, 27));
        d.off[5] = 160;
        d.off[6] = 192;
        d.off[7] = 224;
        d.dw[0] = fp16_to_fp32(w.d);
        return;
    }
    for (int h = 0; h < 2; ++h) {
        const uint8_t* qs;
        if (type == GgmlType::TQ2_0) {
            const auto& w = reinterpret_cast<const BlockTQ2_0*>(row)[i];
            qs = w.qs + 32 * h;
            d.dw[0] = fp16_to_fp32(w.d);
        } else {
            const auto& w = reinterpret_cast<const BlockTQ2_G128*>(row)[2 * i + h];
            qs = w.qs;
            d.dw[h] = fp16_to_fp32(w.d);
        }
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
        for (int l = 0; l < 4; ++l) {
            d.t[4 * h + l] = _mm256_and_si256(_mm256_srli_epi16(q, 2 * l), three);
            d.off[4 * h + l] = 128 * h + 32 * l;
        }
    }
}

// The 16-bit lane sums of vectors [v0, v1) of d against x, minus `sums` (the activations' sums:
// t - 1 instead of the stored digit t; TQ2_G128 subtracts its 8 sums in lanes 0-7 only).
__attribute__((always_inline)) inline __m256i ternary_s16(const TernaryDigits& d, const BlockQ8_K& x, int v0, int v1,
                                                           __m256i sums) {
    __m256i s16 = _mm256_setzero_si256();
    for (int v = v0; v < v1; ++v) {
        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(d.t[v], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + d.off[v]))));
    }
    return _mm256_sub_epi16(s16, sums);
}

}  // namespace

namespace {

// dot_kquant_q8_K_multi for one ternary type and token count, so the accumulators stay in registers.
template <GgmlType T, int N>
void dot_ternary_multi(const uint8_t* row, const BlockQ8_K* x, int64_t x_stride, int64_t nb, float* out) {
    __m256 acc[N];
    for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps();
    TernaryDigits d;
    for (int64_t i = 0; i < nb; ++i) {
        ternary_digits(T, row, i, d);
        for (int j = 0; j < N; ++j) {
            const BlockQ8_K& xb = x[j * x_stride + i];
            if constexpr (T == GgmlType::TQ2_G128) {
                for (int h = 0; h < 2; ++h) {
                    const __m128i bs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.bsums + 8 * h));
                    const __m256i lanes = widen_pairs(ternary_s16(d, xb, 4 * h, 4 * h + 4, _mm256_inserti128_si256(_mm256_setzero_si256(), bs, 0)));
                    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(xb.d * d.dw[h]), acc[j]);
                }
            } else {
                const __m256i lanes = widen_pairs(ternary_s16(d, xb, 0, 8, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.bsums))));
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(xb.d * d.dw[0]), acc[j]);
            }
        }
    }
    for (int j = 0; j < N; ++j) out[j] = hsum(acc[j]);
}

template <GgmlType T>
void dot_ternary_multi_n(const uint8_t* row, const BlockQ8_K* x, int64_t x_stride, int64_t nb, int n_tok, float* out) {
    static_assert(kMultiTokens == 4);
    switch (n_tok) {
        case 1: dot_ternary_multi<T, 1>(row, x, x_stride, nb, out); break;
        case 2: dot_ternary_multi<T, 2>(row, x, x_stride, nb, out); break;
        case 3: dot_ternary_multi<T, 3>(row, x, x_stride, nb, out); break;
        default: dot_ternary_multi<T, 4>(row, x, x_stride, nb, out); break;
    }
}

}  // namespace

void dot_kquant_q8_K_multi(GgmlType t, const uint8_t* row, const BlockQ8_K* x, int64_t x_stride, int64_t nb, int n_tok,
                           float* out) {
    switch (t) {
        case GgmlType::TQ1_0: dot_ternary_multi_n<GgmlType::TQ1_0>(row, x, x_stride, nb, n_tok, out); return;
        case GgmlType::TQ2_0: dot_ternary_multi_n<GgmlType::TQ2_0>(row, x, x_stride, nb, n_tok, out); return;
        case GgmlType::TQ2_G128: dot_ternary_multi_n<GgmlType::TQ2_G128>(row, x, x_stride, nb, n_tok, out); return;
        default:
            for (int j = 0; j < n_tok; ++j) out[j] = dot_kquant_q8_K(t, row, x + j * x_stride, nb);
    }
}

namespace {

// R rows of TQ2_0 / TQ2_G128 (2-bit digits, value 32 v + m is digit v % 4 of byte m of the
// block's 32-byte half v / 4) against one token: each activation vector is loaded once for all
// rows and every row's digits are shifted out of its two 32-byte loads as they are needed. Per
// row the same operations in the same order as the one-row kernel (16-bit lane sums over v, minus
// the activation sums, widened, one fma per scale).
template <bool G128, int R>
void dot_2bit_rows(const uint8_t* row0, size_t row_bytes, const BlockQ8_K* x, int64_t nb, float* out) {
    const __m256i three = _mm256_set1_epi8(3);
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
        const BlockQ8_K& xb = x[i];
        __m256i q[R][2];
        float dw[R][2];
        for (int r = 0; r < R; ++r) {
            const uint8_t* row = row0 + size_t(r) * row_bytes;
            for (int h = 0; h < 2; ++h) {
                const uint8_t* qs;
                if constexpr (G128) {
                    const auto& w = reinterpret_cast<const BlockTQ2_G128*>(row)[2 * i + h];
                    qs = w.qs;
                    dw[r][h] = fp16_to_fp32(w.d);
                } else {
                    const auto& w = reinterpret_cast<const BlockTQ2_0*>(row)[i];
                    qs = w.qs + 32 * h;
                    dw[r][h] = fp16_to_fp32(w.d);
                }
                q[r][h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
            }
        }
        if constexpr (G128) {
            for (int h = 0; h < 2; ++h) {
                __m256i s16[R];
                for (int r = 0; r < R; ++r) s16[r] = _mm256_setzero_si256();
                for (int l = 0; l < 4; ++l) {
                    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs + 128 * h + 32 * l));
                    for (int r = 0; r < R; ++r) {
                        const __m256i t = _mm256_and_si256(_mm256_srli_epi16(q[r][h], 2 * l), three);
                        s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(t, xv));
                    }
                }
                const __m128i bs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.bsums + 8 * h));
                const __m256i sums = _mm256_inserti128_si256(_mm256_setzero_si256(), bs, 0);
                for (int r = 0; r < R; ++r) {
                    const __m256i lanes = widen_pairs(_mm256_sub_epi16(s16[r], sums));
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(xb.d * dw[r][h]), acc[r]);
                }
            }
        } else {
            __m256i s16[R];
            for (int r = 0; r < R; ++r) s16[r] = _mm256_setzero_si256();
            for (int v = 0; v < 8; ++v) {
                const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs + 32 * v));
                for (int r = 0; r < R; ++r) {
                    const __m256i t = _mm256_and_si256(_mm256_srli_epi16(q[r][v / 4], 2 * (v % 4)), three);
                    s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(t, xv));
                }
            }
            const __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.bsums));
            for (int r = 0; r < R; ++r) {
                const __m256i lanes = widen_pairs(_mm256_sub_epi16(s16[r], sums));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(xb.d * dw[r][0]), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
}

// R rows of TQ1_0 against one token, the same way: per row its 32 + 16 qs bytes and qh stay in
// registers and each digit vector is computed (ternary_digits' arithmetic) as its activation
// vector comes; the same operations per row as the one-row kernel.
template <int R>
void dot_tq1_rows(const uint8_t* row0, size_t row_bytes, const BlockQ8_K* x, int64_t nb, float* out) {
    constexpr int16_t kPow3[5] = {1, 3, 9, 27, 81};
    const auto halves = [](int16_t lo, int16_t hi) {
        return _mm256_setr_epi16(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi);
    };
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
        const BlockQ8_K& xb = x[i];
        __m256i a[R], b[R], c[R];
        float dw[R];
        for (int r = 0; r < R; ++r) {
            const auto& w = reinterpret_cast<const BlockTQ1_0*>(row0 + size_t(r) * row_bytes)[i];
            a[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs));
            b[r] = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.qs + 32)));
            uint32_t qh;
            std::memcpy(&qh, w.qh, sizeof qh);
            c[r] = _mm256_inserti128_si256(b[r], _mm_set1_epi32(int(qh)), 1);
            dw[r] = fp16_to_fp32(w.d);
        }
        __m256i s16[R];
        for (int r = 0; r < R; ++r) s16[r] = _mm256_setzero_si256();
        for (int v = 0; v < 8; ++v) {
            const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs + 32 * v));
            for (int r = 0; r < R; ++r) {
                __m256i t;
                if (v < 5) {
                    t = tq1_digits(a[r], _mm256_set1_epi16(kPow3[v]));
                } else if (v == 5) {
                    t = tq1_digits(b[r], halves(1, 3));
                } else if (v == 6) {
                    t = tq1_digits(b[r], halves(9, 27));
                } else {
                    t = tq1_digits(c[r], _mm256_setr_epi16(81, 81, 81, 81, 81, 81, 81, 81, 1, 1, 3, 3, 9, 9, 27, 27));
                }
                s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(t, xv));
            }
        }
        const __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.bsums));
        for (int r = 0; r < R; ++r) {
            const __m256i lanes = widen_pairs(_mm256_sub_epi16(s16[r], sums));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(xb.d * dw[r]), acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
}

}  // namespace

bool dot_kquant_rows_takes(GgmlType t) {
    return t == GgmlType::TQ1_0 || t == GgmlType::TQ2_0 || t == GgmlType::TQ2_G128;
}

void dot_kquant_q8_K_rows(GgmlType t, const uint8_t* row0, size_t row_bytes, int n_rows, const BlockQ8_K* x,
                          int64_t nb, float* out) {
    if (t == GgmlType::TQ1_0) {  // two rows at a time: three registers of digits' sources per row
        int r = 0;
        for (; r + 2 <= n_rows; r += 2) dot_tq1_rows<2>(row0 + size_t(r) * row_bytes, row_bytes, x, nb, out + r);
        if (r < n_rows) dot_tq1_rows<1>(row0 + size_t(r) * row_bytes, row_bytes, x, nb, out + r);
        return;
    }
    const bool g128 = t == GgmlType::TQ2_G128;
    if (n_rows == kRowsTernary) {
        g128 ? dot_2bit_rows<true, kRowsTernary>(row0, row_bytes, x, nb, out)
             : dot_2bit_rows<false, kRowsTernary>(row0, row_bytes, x, nb, out);
        return;
    }
    for (int r = 0; r < n_rows; ++r) {
        g128 ? dot_2bit_rows<true, 1>(row0 + size_t(r) * row_bytes, row_bytes, x, nb, out + r)
             : dot_2bit_rows<false, 1>(row0 + size_t(r) * row_bytes, row_bytes, x, nb, out + r);
    }
}

float dot_kquant_q8_K(GgmlType t, const uint8_t* row, const BlockQ8_K* x, int64_t nb) {
    if (t != GgmlType::Q6_K) {  // the ternary types: the multi-token kernel with one token
        float out;
        dot_kquant_q8_K_multi(t, row, x, 0, nb, 1, &out);
        return out;
    }
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
        const auto& w = reinterpret_cast<const BlockQ6_K*>(row)[i];
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q6_lanes(w, x[i])), _mm256_set1_ps(x[i].d * fp16_to_fp32(w.d)), acc);
    }
    return hsum(acc);
}

}  // namespace vxq::cpu::avx2

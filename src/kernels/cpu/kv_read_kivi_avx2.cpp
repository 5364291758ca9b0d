// AVX2 + FMA + F16C readers of the KIVI codec (kv/formats/kivi.h); called only after kv_avx2_available().
// Codes are unpacked 8 at a time into f32 lanes straight from the packed rows; nothing is written
// back but scores / accumulators.
//   keys:   s[h][t] = sum_c (q_h[c] * s16[c]) * code[c][t] + sum_c q_h[c] * z16[c]
//   values: acc[h][c] += p[h][t] * x^[t][c], x^ = fma(code, s16, z16), which equals the decoder's
//           fl32(fl32(q * s16) + z16) bit for bit because q * s16 is exact in f32 (kv/formats/kivi.h).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/avx2_inl.h"
#include "kernels/cpu/kv_read_kivi.h"

namespace vxq::cpu::kivi {

using codecs::kivi::code_at;

namespace {

// 8 codes of a packed row starting at code j (a multiple of 8) -> 8 f32 lanes.
template <int B>
inline __m256 load8(const uint8_t* row, int64_t j) {
    const uint8_t* p = row + j * B / 8;  // 8 codes = B bytes
    if constexpr (B == 8) {
        return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    } else if constexpr (B == 4) {
        uint32_t w;
        std::memcpy(&w, p, 4);
        const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(int(w)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
        return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
    } else {
        static_assert(B == 2);
        uint16_t w;
        std::memcpy(&w, p, 2);
        const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(int(w)), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
        return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(3)));
    }
}

inline double hsum8_d(__m256 x) {
    alignas(32) float l[8];
    _mm256_store_ps(l, x);
    double s = 0.0;
    for (float v : l) s += double(v);
    return s;
}

// Per block: qs[h][c] = q_h[c] * s16[c] and cst[h] = sum_c q_h[c] * z16[c].
void key_prepare(const Layout& l, const float* q, int64_t n_q, const uint8_t* B, int64_t d, float* qs, double* cst) {
    const uint8_t* zp = B + l.zero_offset();
    const uint8_t* sp = B + l.scale_offset();
    const int64_t d8 = d / 8 * 8;
    for (int64_t h = 0; h < n_q; ++h) {
        const float* qh = q + h * d;
        float* qsh = qs + h * d;
        __m256 cz = _mm256_setzero_ps();
        for (int64_t c = 0; c < d8; c += 8) {
            const __m256 z = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(zp + 2 * c)));
            const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sp + 2 * c)));
            const __m256 qv = _mm256_loadu_ps(qh + c);
            cz = _mm256_fmadd_ps(qv, z, cz);
            _mm256_storeu_ps(qsh + c, _mm256_mul_ps(qv, s));
        }
        double c0 = hsum8_d(cz);
        for (int64_t c = d8; c < d; ++c) {
            c0 += double(qh[c]) * double(fp16_at(zp + 2 * c));
            qsh[c] = qh[c] * fp16_at(sp + 2 * c);
        }
        cst[h] = c0;
    }
}

// NH heads x NT chunks of 8 tokens of one block, accumulators in registers.
template <int B, int NH, int NT>
void key_tile(const uint8_t* codes, int64_t rb, int64_t d, const float* qs, const double* cst, int64_t tok0,
              float* const* out) {
    __m256 acc[NH][NT];
    for (int h = 0; h < NH; ++h)
        for (int k = 0; k < NT; ++k) acc[h][k] = _mm256_setzero_ps();
    for (int64_t c = 0; c < d; ++c) {
        const uint8_t* row = codes + c * rb;
        __m256 v[NT];
        for (int k = 0; k < NT; ++k) v[k] = load8<B>(row, tok0 + 8 * k);
        for (int h = 0; h < NH; ++h) {
            const __m256 w = _mm256_broadcast_ss(qs + h * d + c);
            for (int k = 0; k < NT; ++k) acc[h][k] = _mm256_fmadd_ps(w, v[k], acc[h][k]);
        }
    }
    for (int h = 0; h < NH; ++h) {
        const __m256 cv = _mm256_set1_ps(float(cst[h]));
        for (int k = 0; k < NT; ++k) _mm256_storeu_ps(out[h] + tok0 + 8 * k, _mm256_add_ps(acc[h][k], cv));
    }
}

template <int B, int NH>
void key_heads(const Layout& l, const uint8_t* codes, int64_t d, const float* qs, const double* cst, float* const* out) {
    const int64_t G = l.group, rb = l.row_code_bytes();
    constexpr int NTmax = NH <= 2 ? 4 : 2;
    const int64_t chunks = G / 8;
    if (chunks % NTmax == 0) {
        for (int64_t t = 0; t < G; t += 8 * NTmax) key_tile<B, NH, NTmax>(codes, rb, d, qs, cst, t, out);
    } else if (chunks % 2 == 0) {
        for (int64_t t = 0; t < G; t += 16) key_tile<B, NH, 2>(codes, rb, d, qs, cst, t, out);
    } else {
        for (int64_t t = 0; t < G; t += 8) key_tile<B, NH, 1>(codes, rb, d, qs, cst, t, out);
    }
}

template <int B>
void key_scores_b(const Layout& l, const float* q, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d, float* s) {
    const int64_t G = l.group, nb = n / G;
    const size_t bytes = l.block_bytes();
    thread_local std::vector<float> qs;
    thread_local std::vector<double> cst;
    qs.resize(size_t(n_q * d));
    cst.resize(size_t(n_q));
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* Bk = blk + size_t(b) * bytes;
        key_prepare(l, q, n_q, Bk, d, qs.data(), cst.data());
        const uint8_t* codes = Bk + l.codes_offset();
        int64_t h = 0;
        float* out[4];
        auto outs = [&](int64_t h0, int nh) {
            for (int i = 0; i < nh; ++i) out[i] = s + (h0 + i) * n + b * G;
        };
        for (; h + 4 <= n_q; h += 4) {
            outs(h, 4);
            key_heads<B, 4>(l, codes, d, qs.data() + h * d, cst.data() + h, out);
        }
        for (; h + 2 <= n_q; h += 2) {
            outs(h, 2);
            key_heads<B, 2>(l, codes, d, qs.data() + h * d, cst.data() + h, out);
        }
        for (; h < n_q; ++h) {
            outs(h, 1);
            key_heads<B, 1>(l, codes, d, qs.data() + h * d, cst.data() + h, out);
        }
    }
}

// NH heads x NC chunks of 8 channels starting at c0, accumulated over all n tokens in registers.
template <int B, int NH, int NC>
void value_tile(const Layout& l, const float* p, const uint8_t* blk, int64_t n, int64_t c0, int64_t d, float* const* acc_h) {
    const int64_t G = l.group, rb = l.row_code_bytes();
    const size_t bytes = l.block_bytes();
    __m256 acc[NH][NC];
    for (int h = 0; h < NH; ++h)
        for (int k = 0; k < NC; ++k) acc[h][k] = _mm256_loadu_ps(acc_h[h] + c0 + 8 * k);
    int64_t g[NC], j[NC];
    for (int k = 0; k < NC; ++k) {
        g[k] = (c0 + 8 * k) / G;
        j[k] = (c0 + 8 * k) % G;
    }
    const bool one_group = g[0] == g[NC - 1];
    for (int64_t t = 0; t < n; ++t) {
        const uint8_t* Bt = blk + size_t(t) * bytes;
        __m256 x[NC];
        if (one_group) {  // the usual case (G >= 8 * NC): one zero/scale for the whole tile
            const __m256 z = _mm256_set1_ps(fp16_at(Bt + l.zero_offset() + 2 * g[0]));
            const __m256 s = _mm256_set1_ps(fp16_at(Bt + l.scale_offset() + 2 * g[0]));
            const uint8_t* row = Bt + l.codes_offset() + g[0] * rb;
            for (int k = 0; k < NC; ++k) x[k] = _mm256_fmadd_ps(load8<B>(row, j[k]), s, z);
        } else {
            for (int k = 0; k < NC; ++k) {
                const __m256 z = _mm256_set1_ps(fp16_at(Bt + l.zero_offset() + 2 * g[k]));
                const __m256 s = _mm256_set1_ps(fp16_at(Bt + l.scale_offset() + 2 * g[k]));
                x[k] = _mm256_fmadd_ps(load8<B>(Bt + l.codes_offset() + g[k] * rb, j[k]), s, z);
            }
        }
        for (int h = 0; h < NH; ++h) {
            const __m256 w = _mm256_broadcast_ss(p + h * n + t);
            for (int k = 0; k < NC; ++k) acc[h][k] = _mm256_fmadd_ps(w, x[k], acc[h][k]);
        }
    }
    for (int h = 0; h < NH; ++h)
        for (int k = 0; k < NC; ++k) _mm256_storeu_ps(acc_h[h] + c0 + 8 * k, acc[h][k]);
}

template <int B, int NH>
void value_heads(const Layout& l, const float* p, const uint8_t* blk, int64_t n, int64_t d, float* const* acc_h) {
    constexpr int NC = NH <= 2 ? 4 : 2;
    const int64_t d8 = d / 8 * 8;
    int64_t c = 0;
    for (; c + 8 * NC <= d8; c += 8 * NC) value_tile<B, NH, NC>(l, p, blk, n, c, d, acc_h);
    for (; c < d8; c += 8) value_tile<B, NH, 1>(l, p, blk, n, c, d, acc_h);
    if (d8 == d) return;
    const size_t bytes = l.block_bytes();
    const int64_t G = l.group, rb = l.row_code_bytes();
    for (int64_t t = 0; t < n; ++t) {  // the last d % 8 channels
        const uint8_t* Bt = blk + size_t(t) * bytes;
        for (c = d8; c < d; ++c) {
            const int64_t g = c / G;
            const float z = fp16_at(Bt + l.zero_offset() + 2 * g), s = fp16_at(Bt + l.scale_offset() + 2 * g);
            const float x = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(float(code_at(Bt + l.codes_offset() + g * rb, c % G, B))),
                                                       _mm_set_ss(s), _mm_set_ss(z)));
            for (int h = 0; h < NH; ++h) acc_h[h][c] += p[h * n + t] * x;
        }
    }
}

template <int B>
void value_accumulate_b(const Layout& l, const float* p, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d, float* acc) {
    float* a[4];
    auto set = [&](int64_t h0, int nh) {
        for (int i = 0; i < nh; ++i) a[i] = acc + (h0 + i) * d;
    };
    int64_t h = 0;
    for (; h + 4 <= n_q; h += 4) {
        set(h, 4);
        value_heads<B, 4>(l, p + h * n, blk, n, d, a);
    }
    for (; h + 2 <= n_q; h += 2) {
        set(h, 2);
        value_heads<B, 2>(l, p + h * n, blk, n, d, a);
    }
    for (; h < n_q; ++h) {
        set(h, 1);
        value_heads<B, 1>(l, p + h * n, blk, n, d, a);
    }
}

}  // namespace

void key_scores_avx2(const Layout& l, const float* q, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d, float* s) {
    switch (l.bits) {
        case 2: return key_scores_b<2>(l, q, n_q, blk, n, d, s);
        case 4: return key_scores_b<4>(l, q, n_q, blk, n, d, s);
        default: return key_scores_b<8>(l, q, n_q, blk, n, d, s);
    }
}

void value_accumulate_avx2(const Layout& l, const float* p, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,
                           float* acc) {
    switch (l.bits) {
        case 2: return value_accumulate_b<2>(l, p, n_q, blk, n, d, acc);
        case 4: return value_accumulate_b<4>(l, p, n_q, blk, n, d, acc);
        default: return value_accumulate_b<8>(l, p, n_q, blk, n, d, acc);
    }
}

}  // namespace vxq::cpu::kivi

// AVX2 + FMA + F16C inner loops of attention_f16; compiled only into this file, called after a
// runtime CPU check. Same operation order as the scalar reference in attention.cpp.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/ops_avx2_inl.h"

#pragma GCC optimize("fp-contract=off")  // every product and sum rounds on its own, as in the reference

namespace vxq::cpu::detail {

namespace {
inline float hsum8(__m256 x) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}
inline __m256 load_f16(const f16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
// GGML_F32x8_REDUCE of four accumulators (ggml_vec_dot_f16): (a0+a2) + (a1+a3), lanes l + (l+4),
// then two horizontal adds.
inline float reduce4x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m256 x = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    return _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
}
inline float fp16_scalar(f16_t h) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))); }
}  // namespace

void attn_scores_f16_avx2(const float* q16, const f16_t* k, int64_t n_kv, int64_t d, float* s) {
    if (d % 8 != 0 || d > 256) {  // rare shapes: lane-by-lane, same order
        for (int64_t t = 0; t < n_kv; ++t) {
            float acc[8] = {};
            for (int64_t c = 0; c < d; ++c) {
                __m128 x = _mm_cvtph_ps(_mm_cvtsi32_si128(k[t * d + c]));
                acc[c % 8] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(q16[c]), x, _mm_set_ss(acc[c % 8])));
            }
            s[t] = hsum8(_mm256_loadu_ps(acc));
        }
        return;
    }
    __m256 qv[32];
    const int64_t nb = d / 8;
    for (int64_t b = 0; b < nb; ++b) qv[b] = _mm256_loadu_ps(q16 + 8 * b);
    int64_t t = 0;
    for (; t + 4 <= n_kv; t += 4) {  // four keys at a time: independent FMA chains
        const f16_t* k0 = k + t * d;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t b = 0; b < nb; ++b) {
            a0 = _mm256_fmadd_ps(qv[b], load_f16(k0 + 8 * b), a0);
            a1 = _mm256_fmadd_ps(qv[b], load_f16(k0 + d + 8 * b), a1);
            a2 = _mm256_fmadd_ps(qv[b], load_f16(k0 + 2 * d + 8 * b), a2);
            a3 = _mm256_fmadd_ps(qv[b], load_f16(k0 + 3 * d + 8 * b), a3);
        }
        s[t] = hsum8(a0);
        s[t + 1] = hsum8(a1);
        s[t + 2] = hsum8(a2);
        s[t + 3] = hsum8(a3);
    }
    for (; t < n_kv; ++t) {
        __m256 a0 = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; ++b) a0 = _mm256_fmadd_ps(qv[b], load_f16(k + t * d + 8 * b), a0);
        s[t] = hsum8(a0);
    }
}

void attn_weighted_sum_f16_avx2(const float* p16, const f16_t* v, int64_t n_kv, int64_t d, float* out) {
    // acc[l][c]: lane l of output c. For d % 8 == 0 hold the 8 lanes of 8 outputs as 8 vectors
    // indexed by lane, i.e. lanes are the key index mod 8 and the vector runs over channels.
    if (d % 8 != 0 || d > 256) {
        for (int64_t c = 0; c < d; ++c) {
            float acc[8] = {};
            for (int64_t t = 0; t < n_kv; ++t) {
                __m128 x = _mm_cvtph_ps(_mm_cvtsi32_si128(v[t * d + c]));
                acc[t % 8] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(p16[t]), x, _mm_set_ss(acc[t % 8])));
            }
            out[c] = hsum8(_mm256_loadu_ps(acc));
        }
        return;
    }
    const int64_t nb = d / 8;
    alignas(32) float acc[8][256];
    for (int l = 0; l < 8; ++l)
        for (int64_t b = 0; b < nb; ++b) _mm256_store_ps(&acc[l][8 * b], _mm256_setzero_ps());
    for (int64_t t = 0; t < n_kv; ++t) {
        if (p16[t] == 0.0f) continue;  // fma(0, v, a) == a for finite v: skipping is exact
        const __m256 p = _mm256_set1_ps(p16[t]);
        float* a = acc[t % 8];
        const f16_t* vt = v + t * d;
        for (int64_t b = 0; b < nb; ++b) {
            _mm256_store_ps(a + 8 * b, _mm256_fmadd_ps(p, load_f16(vt + 8 * b), _mm256_load_ps(a + 8 * b)));
        }
    }
    // Reduce the 8 lanes of each channel in ggml's hsum order: (l0+l4 + l2+l6) + (l1+l5 + l3+l7).
    for (int64_t b = 0; b < nb; ++b) {
        const int64_t c = 8 * b;
        const __m256 t0 = _mm256_add_ps(_mm256_load_ps(&acc[0][c]), _mm256_load_ps(&acc[4][c]));
        const __m256 t1 = _mm256_add_ps(_mm256_load_ps(&acc[1][c]), _mm256_load_ps(&acc[5][c]));
        const __m256 t2 = _mm256_add_ps(_mm256_load_ps(&acc[2][c]), _mm256_load_ps(&acc[6][c]));
        const __m256 t3 = _mm256_add_ps(_mm256_load_ps(&acc[3][c]), _mm256_load_ps(&acc[7][c]));
        _mm256_storeu_ps(out + c, _mm256_add_ps(_mm256_add_ps(t0, t2), _mm256_add_ps(t1, t3)));
    }
}

void attn_softmax_f16_avx2(float* s, int64_t n, float scale) {
    const int64_t n8 = n - n % 8;
    // w = s * scale and its maximum (max is exact in any order).
    const __m256 vscale = _mm256_set1_ps(scale);
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    for (int64_t t = 0; t < n8; t += 8) {
        const __m256 w = _mm256_mul_ps(_mm256_loadu_ps(s + t), vscale);
        _mm256_storeu_ps(s + t, w);
        vmax = _mm256_max_ps(vmax, w);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmax);
    float mx = lanes[0];
    for (int l = 1; l < 8; ++l) mx = std::max(mx, lanes[l]);
    for (int64_t t = n8; t < n; ++t) {
        s[t] *= scale;
        mx = std::max(mx, s[t]);
    }
    // exp(w - max) in groups of 8 from t = 0; each group's hsum8 is added to a double.
    const __m256 vmx = _mm256_set1_ps(mx);
    double sum = 0.0;
    for (int64_t t = 0; t < n8; t += 8) {
        const __m256 e = expf8(_mm256_sub_ps(_mm256_loadu_ps(s + t), vmx));
        _mm256_storeu_ps(s + t, e);
        sum += double(hsum8(e));
    }
    if (n8 < n) {  // the masked keys that complete the group give exactly 0
        alignas(32) float tail[8];
        for (int l = 0; l < 8; ++l) tail[l] = n8 + l < n ? s[n8 + l] : -INFINITY;
        const __m256 e = expf8(_mm256_sub_ps(_mm256_load_ps(tail), vmx));
        _mm256_store_ps(tail, e);
        for (int64_t t = n8; t < n; ++t) s[t] = tail[t - n8];
        sum += double(hsum8(e));
    }
    // p = e * float(1/sum), rounded to fp16 (round to nearest even, as F16C with imm 0).
    const float inv = float(1.0 / sum);
    const __m256 vinv = _mm256_set1_ps(inv);
    for (int64_t t = 0; t < n8; t += 8) {
        const __m128i h = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(s + t), vinv), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_ps(s + t, _mm256_cvtph_ps(h));
    }
    for (int64_t t = n8; t < n; ++t) {
        const __m128i h = _mm_cvtps_ph(_mm_set_ss(s[t] * inv), _MM_FROUND_TO_NEAREST_INT);
        s[t] = _mm_cvtss_f32(_mm_cvtph_ps(h));
    }
}

void attn_scores_f16_vecdot_avx2(const float* q16, const f16_t* k, int64_t n_kv, int64_t d, float* s) {
    const int64_t np = d & ~int64_t(31);
    for (int64_t t = 0; t < n_kv; ++t) {
        const f16_t* kt = k + t * d;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t c = 0; c < np; c += 32) {
            a0 = _mm256_fmadd_ps(load_f16(kt + c), _mm256_loadu_ps(q16 + c), a0);
            a1 = _mm256_fmadd_ps(load_f16(kt + c + 8), _mm256_loadu_ps(q16 + c + 8), a1);
            a2 = _mm256_fmadd_ps(load_f16(kt + c + 16), _mm256_loadu_ps(q16 + c + 16), a2);
            a3 = _mm256_fmadd_ps(load_f16(kt + c + 24), _mm256_loadu_ps(q16 + c + 24), a3);
        }
        double sum = reduce4x8(a0, a1, a2, a3);
        for (int64_t c = np; c < d; ++c) sum += double(fp16_scalar(kt[c]) * q16[c]);
        s[t] = float(sum);
    }
}

void attn_weighted_sum_f16_vecdot_avx2(const float* p16, const f16_t* v, int64_t n_kv, int64_t d, float* out) {
    if (d % 8 != 0 || d > 256) {  // rare shapes: channel by channel, same order
        for (int64_t c = 0; c < d; ++c) {
            float acc[32] = {};
            for (int64_t t = 0; t < n_kv; ++t) {
                const __m128 x = _mm_set_ss(fp16_scalar(v[t * d + c]));
                acc[t % 32] = _mm_cvtss_f32(_mm_fmadd_ss(x, _mm_set_ss(p16[t]), _mm_set_ss(acc[t % 32])));
            }
            out[c] = reduce4x8(_mm256_loadu_ps(acc), _mm256_loadu_ps(acc + 8), _mm256_loadu_ps(acc + 16),
                               _mm256_loadu_ps(acc + 24));
        }
        return;
    }
    // acc[slot][c], slot = t % 32 = 8 * accumulator + lane; vectors run over channels.
    const int64_t nb = d / 8;
    alignas(32) float acc[32][256];
    for (int sl = 0; sl < 32; ++sl)
        for (int64_t b = 0; b < nb; ++b) _mm256_store_ps(&acc[sl][8 * b], _mm256_setzero_ps());
    for (int64_t t = 0; t < n_kv; ++t) {
        if (p16[t] == 0.0f) continue;  // fma(v, 0, a) == a for finite v: skipping is exact
        const __m256 p = _mm256_set1_ps(p16[t]);
        float* a = acc[t % 32];
        const f16_t* vt = v + t * d;
        for (int64_t b = 0; b < nb; ++b) {
            _mm256_store_ps(a + 8 * b, _mm256_fmadd_ps(load_f16(vt + 8 * b), p, _mm256_load_ps(a + 8 * b)));
        }
    }
    // Per channel: x_l = (acc0 + acc2) + (acc1 + acc3) at lane l, t_l = x_l + x_{l+4},
    // out = (t0 + t1) + (t2 + t3).
    for (int64_t b = 0; b < nb; ++b) {
        const int64_t c = 8 * b;
        __m256 x[8];
        for (int l = 0; l < 8; ++l) {
            x[l] = _mm256_add_ps(_mm256_add_ps(_mm256_load_ps(&acc[l][c]), _mm256_load_ps(&acc[16 + l][c])),
                                 _mm256_add_ps(_mm256_load_ps(&acc[8 + l][c]), _mm256_load_ps(&acc[24 + l][c])));
        }
        const __m256 t0 = _mm256_add_ps(x[0], x[4]), t1 = _mm256_add_ps(x[1], x[5]);
        const __m256 t2 = _mm256_add_ps(x[2], x[6]), t3 = _mm256_add_ps(x[3], x[7]);
        _mm256_storeu_ps(out + c, _mm256_add_ps(_mm256_add_ps(t0, t1), _mm256_add_ps(t2, t3)));
    }
}

}  // namespace vxq::cpu::detail

#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/ops_impl.h"

// Exact products and sums in the order documented in attention.h: no FMA contraction here.
#pragma GCC optimize("fp-contract=off")

namespace vxq::cpu {

namespace {

// ggml's hsum of an 8-lane accumulator: (l0+l4 + l2+l6) + (l1+l5 + l3+l7).
float hsum8(const float* l) {
    const float t0 = l[0] + l[4], t1 = l[1] + l[5], t2 = l[2] + l[6], t3 = l[3] + l[7];
    return (t0 + t2) + (t1 + t3);
}

void scores_ref(const float* q16, const f16_t* k, int64_t n_kv, int64_t d, float* s) {
    for (int64_t t = 0; t < n_kv; ++t) {
        const f16_t* kt = k + t * d;
        float acc[8] = {};
        for (int64_t c = 0; c < d; ++c) acc[c % 8] = std::fma(q16[c], fp16_to_fp32(kt[c]), acc[c % 8]);
        s[t] = hsum8(acc);
    }
}

void weighted_sum_ref(const float* p16, const f16_t* v, int64_t n_kv, int64_t d, float* out) {
    std::vector<float> acc(size_t(8 * d), 0.0f);
    for (int64_t t = 0; t < n_kv; ++t) {
        float* a = acc.data() + (t % 8) * d;
        for (int64_t c = 0; c < d; ++c) a[c] = std::fma(p16[t], fp16_to_fp32(v[t * d + c]), a[c]);
    }
    for (int64_t c = 0; c < d; ++c) {
        float l[8];
        for (int i = 0; i < 8; ++i) l[i] = acc[size_t(i * d + c)];
        out[c] = hsum8(l);
    }
}

using ScoresFn = void (*)(const float*, const f16_t*, int64_t, int64_t, float*);
using WeightedSumFn = void (*)(const float*, const f16_t*, int64_t, int64_t, float*);
using SoftmaxFn = void (*)(float*, int64_t, float);

void row(const AttentionF16Args& a, int64_t i, int64_t h, float* scratch, ScoresFn scores, SoftmaxFn softmax,
         WeightedSumFn wsum) {
    const int64_t d = a.head_dim;
    const int64_t g = h / (a.n_head / a.n_head_kv);
    const int64_t n_kv = a.pos0 + i + 1;
    const float* q = a.q + (i * a.n_head + h) * d;
    float q16[1024];
    for (int64_t c = 0; c < d; ++c) q16[c] = round_fp16(q[c]);
    scores(q16, a.k + g * a.stride_head, n_kv, d, scratch);
    softmax(scratch, n_kv, a.scale);
    wsum(scratch, a.v + g * a.stride_head, n_kv, d, a.out + (i * a.n_head + h) * d);
}

}  // namespace

namespace detail {

// softmax(s * scale) in place, then rounded to fp16 (llama.cpp converts the probabilities to
// the V cache's type before the weighted sum). The order of ggml_compute_forward_soft_max_f32 +
// ggml_vec_soft_max_f32 (AVX2 branch), llama.cpp b4748 ggml-cpu.c:
//   w = s * scale (+ mask: 0 for visible keys, -inf for the others), max = max(w),
//   for each group of 8 from index 0: e = ggml_v_expf(w - max), sum (double) += hsum8(e) in float,
//   then p = e * float(1.0 / sum).
// llama.cpp attends over n_kv = max(32, round_up(cells used, 32)) cache cells, so a row always has
// a multiple of 8 entries and the scalar expf tail of ggml_vec_soft_max_f32 never runs; the masked
// entries give exp(-inf) = 0 exactly. Here only the n visible keys are stored: the last partial
// group of 8 is completed with zeros, which is what ggml sums.
void attn_softmax_f16_ref(float* s, int64_t n, float scale) {
    float mx = -INFINITY;
    for (int64_t t = 0; t < n; ++t) {
        s[t] *= scale;
        mx = std::max(mx, s[t]);
    }
    double sum = 0.0;
    for (int64_t t0 = 0; t0 < n; t0 += 8) {
        float lane[8] = {};
        for (int64_t t = t0; t < std::min(n, t0 + 8); ++t) lane[t - t0] = s[t] = detail::ggml_expf(s[t] - mx);
        sum += double(hsum8(lane));
    }
    const float inv = float(1.0 / sum);
    for (int64_t t = 0; t < n; ++t) s[t] = round_fp16(s[t] * inv);
}

}  // namespace detail

void attention_f16_row_ref(const AttentionF16Args& a, int64_t i, int64_t h, float* scratch) {
    row(a, i, h, scratch, scores_ref, detail::attn_softmax_f16_ref, weighted_sum_ref);
}

void attention_f16_row(const AttentionF16Args& a, int64_t i, int64_t h, float* scratch) {
    static const bool avx2 = detail::cpu_has_avx2();
    if (avx2) {
        row(a, i, h, scratch, detail::attn_scores_f16_avx2, detail::attn_softmax_f16_avx2,
            detail::attn_weighted_sum_f16_avx2);
    } else {
        row(a, i, h, scratch, scores_ref, detail::attn_softmax_f16_ref, weighted_sum_ref);
    }
}

namespace detail {
bool cpu_has_avx2() {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
}  // namespace detail

}  // namespace vxq::cpu

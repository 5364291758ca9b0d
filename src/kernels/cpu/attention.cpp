#include "kernels/cpu/attention.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/attention_impl.h"

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

// softmax(s * scale) in place, then rounded to fp16 (llama.cpp converts the probabilities to
// the V cache's type before the weighted sum).
void softmax_to_f16(float* s, int64_t n, float scale) {
    float mx = -INFINITY;
    for (int64_t t = 0; t < n; ++t) {
        s[t] *= scale;
        mx = std::max(mx, s[t]);
    }
    double sum = 0.0;
    for (int64_t t = 0; t < n; ++t) {
        s[t] = std::exp(s[t] - mx);
        sum += double(s[t]);
    }
    const float inv = float(1.0 / sum);
    for (int64_t t = 0; t < n; ++t) s[t] = round_fp16(s[t] * inv);
}

using ScoresFn = void (*)(const float*, const f16_t*, int64_t, int64_t, float*);
using WeightedSumFn = void (*)(const float*, const f16_t*, int64_t, int64_t, float*);

void row(const AttentionF16Args& a, int64_t i, int64_t h, float* scratch, ScoresFn scores, WeightedSumFn wsum) {
    const int64_t d = a.head_dim;
    const int64_t g = h / (a.n_head / a.n_head_kv);
    const int64_t n_kv = a.pos0 + i + 1;
    const float* q = a.q + (i * a.n_head + h) * d;
    float q16[1024];
    for (int64_t c = 0; c < d; ++c) q16[c] = round_fp16(q[c]);
    scores(q16, a.k + g * a.stride_head, n_kv, d, scratch);
    softmax_to_f16(scratch, n_kv, a.scale);
    wsum(scratch, a.v + g * a.stride_head, n_kv, d, a.out + (i * a.n_head + h) * d);
}

}  // namespace

void attention_f16_row_ref(const AttentionF16Args& a, int64_t i, int64_t h, float* scratch) {
    row(a, i, h, scratch, scores_ref, weighted_sum_ref);
}

void attention_f16_row(const AttentionF16Args& a, int64_t i, int64_t h, float* scratch) {
    static const bool avx2 = detail::cpu_has_avx2();
    if (avx2) {
        row(a, i, h, scratch, detail::attn_scores_f16_avx2, detail::attn_weighted_sum_f16_avx2);
    } else {
        row(a, i, h, scratch, scores_ref, weighted_sum_ref);
    }
}

namespace detail {
bool cpu_has_avx2() {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
}  // namespace detail

}  // namespace vxq::cpu

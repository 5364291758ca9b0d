#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/ops_impl.h"

// Exact products and sums in the order documented in attention.h: no FMA contraction here.
#pragma GCC optimize("fp-contract=off")

// How llama.cpp b4748 (ggml-cpu.c, llamafile/sgemm.cpp) computes KQ = K q and KQV = V p on the CPU
// with an f16 cache (non flash-attention path), both as GGML_OP_MUL_MAT with src1 converted to f16:
//  * llamafile_sgemm (tinyBLAS<8, __m256, ...>) when the batch has n >= 2 query tokens ("only enable
//    sgemm for prompt processing") and its shape fits (k % 8 == 0, m % 4 == 0): one 8-lane
//    accumulator per output, element l of the dot product in lane l % 8, then hsum8.
//  * otherwise, i.e. for every single-token decode step, ggml_vec_dot_f16: four 8-lane accumulators
//    (element l in accumulator (l / 8) % 4, lane l % 8) over the first n & ~31 elements, reduced as
//    GGML_F32x8_REDUCE, then the remaining elements added one by one in double.
// The V product runs over n_kv = a multiple of 32 cells (llama.cpp's KV padding); the cells past
// the query's position have probability 0 and add nothing, so it is enough to go over the visible
// keys with the same lane assignment.

namespace vxq::cpu {

namespace {


// tinyBLAS's hsum of an 8-lane accumulator: (l0+l4 + l2+l6) + (l1+l5 + l3+l7).
float hsum8(const float* l) {
    const float t0 = l[0] + l[4], t1 = l[1] + l[5], t2 = l[2] + l[6], t3 = l[3] + l[7];
    return (t0 + t2) + (t1 + t3);
}

// GGML_F32x8_REDUCE of four 8-lane accumulators a[j][l]: a0+a2, a1+a3, then their sum, then
// lanes l + (l+4), then two horizontal adds: (t0+t1) + (t2+t3).
float reduce4x8(const float (*a)[8]) {
    float x[8], t[4];
    for (int l = 0; l < 8; ++l) x[l] = (a[0][l] + a[2][l]) + (a[1][l] + a[3][l]);
    for (int l = 0; l < 4; ++l) t[l] = x[l] + x[l + 4];
    return (t[0] + t[1]) + (t[2] + t[3]);
}

void scores_tinyblas_ref(const float* q16, const f16_t* k, int64_t n_kv, int64_t d, float* s) {
    for (int64_t t = 0; t < n_kv; ++t) {
        const f16_t* kt = k + t * d;
        float acc[8] = {};
        for (int64_t c = 0; c < d; ++c) acc[c % 8] = std::fma(q16[c], fp16_to_fp32(kt[c]), acc[c % 8]);
        s[t] = hsum8(acc);
    }
}

void scores_vecdot_ref(const float* q16, const f16_t* k, int64_t n_kv, int64_t d, float* s) {
    const int64_t np = d & ~int64_t(31);
    for (int64_t t = 0; t < n_kv; ++t) {
        const f16_t* kt = k + t * d;
        float acc[4][8] = {};
        for (int64_t c = 0; c < np; ++c) {
            float& a = acc[(c / 8) % 4][c % 8];
            a = std::fma(fp16_to_fp32(kt[c]), q16[c], a);
        }
        double sum = reduce4x8(acc);
        for (int64_t c = np; c < d; ++c) sum += double(fp16_to_fp32(kt[c]) * q16[c]);
        s[t] = float(sum);
    }
}

void weighted_sum_tinyblas_ref(const float* p16, const f16_t* v, int64_t n_kv, int64_t d, float* out) {
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

void weighted_sum_vecdot_ref(const float* p16, const f16_t* v, int64_t n_kv, int64_t d, float* out) {
    std::vector<float> acc(size_t(32 * d), 0.0f);  // slot t % 32 = accumulator (t / 8) % 4, lane t % 8
    for (int64_t t = 0; t < n_kv; ++t) {
        float* a = acc.data() + (t % 32) * d;
        for (int64_t c = 0; c < d; ++c) a[c] = std::fma(fp16_to_fp32(v[t * d + c]), p16[t], a[c]);
    }
    for (int64_t c = 0; c < d; ++c) {
        float a[4][8];
        for (int s = 0; s < 32; ++s) a[s / 8][s % 8] = acc[size_t(s * d + c)];
        out[c] = reduce4x8(a);
    }
}

struct Kernels {
    void (*scores_tinyblas)(const float*, const f16_t*, int64_t, int64_t, float*);
    void (*scores_vecdot)(const float*, const f16_t*, int64_t, int64_t, float*);
    void (*softmax)(float*, int64_t, float);
    void (*wsum_tinyblas)(const float*, const f16_t*, int64_t, int64_t, float*);
    void (*wsum_vecdot)(const float*, const f16_t*, int64_t, int64_t, float*);
};

void row(const AttentionF16Args& a, int64_t i, int64_t h, float* scratch, const Kernels& kern) {
    const int64_t d = a.head_dim;
    const int64_t g = h / (a.n_head / a.n_head_kv);
    const int64_t n_kv = kv_visible(a.heads[g], a.pos0 + i);
    float* out = a.out + (i * a.n_head + h) * d;
    if (n_kv == 0) {  // every token of this head was evicted: nothing to attend to
        std::fill(out, out + d, 0.0f);
        return;
    }
    const float* q = a.q + (i * a.n_head + h) * d;
    float q16[1024];
    for (int64_t c = 0; c < d; ++c) q16[c] = round_fp16(q[c]);
    // tinyBLAS needs n >= 2 and k % 8 == 0 (KQ: k = d, m = n_kv padded to 32; KQV: k = n_kv padded,
    // m = d must be a multiple of 4).
    const bool batch = a.n_q >= 2;
    const auto scores = batch && d % 8 == 0 ? kern.scores_tinyblas : kern.scores_vecdot;
    scores(q16, a.k[g], n_kv, d, scratch);
    kern.softmax(scratch, n_kv, a.scale);
    (batch && d % 4 == 0 ? kern.wsum_tinyblas : kern.wsum_vecdot)(scratch, a.v[g], n_kv, d, out);
}

constexpr Kernels kRef{scores_tinyblas_ref, scores_vecdot_ref, detail::attn_softmax_f16_ref,
                       weighted_sum_tinyblas_ref, weighted_sum_vecdot_ref};
constexpr Kernels kAvx2{detail::attn_scores_f16_avx2, detail::attn_scores_f16_vecdot_avx2,
                        detail::attn_softmax_f16_avx2, detail::attn_weighted_sum_f16_avx2,
                        detail::attn_weighted_sum_f16_vecdot_avx2};

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
        for (int64_t t = t0; t < std::min(n, t0 + 8); ++t) lane[t - t0] = s[t] = ggml_expf(s[t] - mx);
        sum += double(hsum8(lane));
    }
    const float inv = float(1.0 / sum);
    for (int64_t t = 0; t < n; ++t) s[t] = round_fp16(s[t] * inv);
}

bool cpu_has_avx2() {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

}  // namespace detail

void attention_f16_row_ref(const AttentionF16Args& a, int64_t i, int64_t h, float* scratch) {
    row(a, i, h, scratch, kRef);
}

void attention_f16_row(const AttentionF16Args& a, int64_t i, int64_t h, float* scratch) {
    static const bool avx2 = detail::cpu_has_avx2();
    row(a, i, h, scratch, avx2 ? kAvx2 : kRef);
}

bool attention_f16_applies(const KvLayerView& view) {
    if (view.flash_attn || view.chunk <= 0 || (view.chunk & (view.chunk - 1)) != 0) return false;
    for (int64_t g = 0; g < view.n_head_kv; ++g) {
        const KvHeadView& h = view.heads[g];
        if (h.k.fmt.kind != KvFormatKind::F16 || h.v.fmt.kind != KvFormatKind::F16) return false;
        for (const KvStreamView* s : {&h.k, &h.v})
            for (int64_t i = 0; i < s->n_segs; ++i)
                if (s->segs[i].window) return false;
    }
    return true;
}

void attention_f16(const KvLayerView& view, const float* q, int64_t n_q, int64_t pos0, float scale, float* out,
                   ThreadPool& pool, float* const* token_mass) {
    VXQ_ASSERT(attention_f16_applies(view));
    const int64_t H = view.n_head_kv;
    int64_t max_tokens = 0;
    for (int64_t g = 0; g < H; ++g) max_tokens = std::max(max_tokens, view.heads[g].n_tokens);
    // Every stream's pages are one contiguous run (kv/memory.h): a head is read as one array.
    thread_local std::vector<const f16_t*> kp, vp;  // reused: a decode step allocates nothing here
    kp.resize(size_t(H));
    vp.resize(size_t(H));
    for (int64_t g = 0; g < H; ++g) {
        kp[size_t(g)] = reinterpret_cast<const f16_t*>(kv_packed_blocks(view.heads[g].k));
        vp[size_t(g)] = reinterpret_cast<const f16_t*>(kv_packed_blocks(view.heads[g].v));
    }
    const AttentionF16Args a{q, view.heads, kp.data(), vp.data(),
                             out, n_q, pos0, view.n_head, H, view.head_dim, scale};
    const int64_t units = n_q * view.n_head;
    const int64_t n_gqa = view.n_head / H;
    // Attention mass: each thread adds the rows' probabilities (scratch after the row) into its own
    // [H, max_tokens] buffer; the buffers are summed in thread order afterwards.
    std::vector<std::vector<float>> mass(token_mass ? size_t(pool.size()) : 0);
    pool.run([&](int ith, int nth) {
        thread_local std::vector<float> scratch;  // per worker, kept between calls
        if (scratch.size() < size_t(max_tokens)) scratch.resize(size_t(max_tokens));
        if (token_mass) mass[size_t(ith)].assign(size_t(H * max_tokens), 0.0f);
        // Interleaved split: causal rows grow with i, so contiguous chunks would be unbalanced.
        for (int64_t u = ith; u < units; u += nth) {
            const int64_t i = u / view.n_head, h = u % view.n_head, g = h / n_gqa;
            attention_f16_row(a, i, h, scratch.data());
            if (!token_mass) continue;
            const int64_t n_kv = kv_visible(view.heads[g], pos0 + i);
            float* m = mass[size_t(ith)].data() + g * max_tokens;
            for (int64_t t = 0; t < n_kv; ++t) m[t] += scratch[size_t(t)];
        }
    });
    for (const auto& m : mass)
        for (int64_t g = 0; g < H; ++g)
            for (int64_t t = 0; t < view.heads[g].n_tokens; ++t) token_mass[g][t] += m[size_t(g * max_tokens + t)];
}

}  // namespace vxq::cpu

#include "kernels/cpu/attention_fused.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/softmax_state.h"

namespace vxq::cpu {

namespace {

// Calls fn(segment, offset_in_chunk, data, n) for the whole-block pieces of `stream` that cover
// tokens [a, b); a piece may run past b up to its block's end (callers mask those tokens).
template <typename Fn>
void for_pieces(const KvStreamView& stream, int64_t a, int64_t b, Fn&& fn) {
    for (const KvSegment& s : stream) {
        const int64_t lo = std::max(a, s.first);
        const int64_t hi = std::min(b, s.first + s.n_tokens);
        if (lo >= hi) continue;
        const int64_t blk0 = (lo - s.first) / s.block_tokens;
        const int64_t blk1 = (hi - s.first + s.block_tokens - 1) / s.block_tokens;
        const int64_t start = s.first + blk0 * s.block_tokens;
        VXQ_ASSERT(start >= a);  // chunks start on block boundaries
        fn(s, start - a, s.data + size_t(blk0) * s.block_bytes, (blk1 - blk0) * s.block_tokens);
    }
}

struct Work {
    int64_t i, g, split;
};

}  // namespace

void attention_fused(const FusedAttentionArgs& a, ThreadPool& pool) {
    const int64_t d = a.head_dim;
    const int64_t n_gqa = a.n_head / a.n_head_kv;
    const int64_t C = a.chunk;
    const int64_t max_len = a.pos0 + a.n_q;
    const int64_t n_chunks = (max_len + C - 1) / C;
    // Split long streams over chunk ranges when there are few (query, KV head) units (decode);
    // the partial states are merged below. The split depends on the shape only, never on the
    // thread count, so results are the same bit for bit with any -t (a last-bit difference in
    // K/V can flip a low-bit code and move a KIVI perplexity by 0.04 %).
    constexpr int64_t kWorkItems = 32;
    const int64_t units = a.n_q * a.n_head_kv;
    const int64_t n_split = std::clamp<int64_t>((kWorkItems + units - 1) / units, 1, std::max<int64_t>(1, n_chunks / 2));
    const int64_t state_floats = n_gqa * (d + 2);
    std::vector<float> partial(size_t(units * n_split * state_floats));

    pool.run([&](int ith, int nth) {
        // Per thread: scores/probabilities for one chunk (+ a block of overhang), accumulator.
        std::vector<float> s(size_t(n_gqa * (C + 256)));
        std::vector<float> acc(size_t(n_gqa * d));
        std::vector<SoftmaxState> st(static_cast<size_t>(n_gqa));
        std::vector<float> tmp(size_t(n_gqa * (C + 256)));  // one piece's scores or probabilities
        for (int64_t w = ith; w < units * n_split; w += nth) {
            const int64_t unit = w / n_split, split = w % n_split;
            const int64_t i = unit / a.n_head_kv, g = unit % a.n_head_kv;
            const int64_t len = a.pos0 + i + 1;  // visible tokens
            const int64_t chunks_here = (len + C - 1) / C;
            const int64_t c0 = chunks_here * split / n_split, c1 = chunks_here * (split + 1) / n_split;
            // The group's n_gqa query heads are contiguous. The readers get the UNSCALED query and
            // the scale multiplies each score afterwards, as in llama.cpp's CPU flash attention
            // (`kq_vec_dot(...); s = s*scale;`): that is what makes q8_0 / q4_0 keys, whose readers
            // quantize the query to q8_0 first, match it.
            const float* qg = a.q + (i * a.n_head + g * n_gqa) * d;
            std::fill(acc.begin(), acc.end(), 0.0f);
            std::fill(st.begin(), st.end(), SoftmaxState{});
            const KvStreamView& ks = a.keys(g);
            const KvStreamView& vs = a.values(g);
            for (int64_t ch = c0; ch < c1; ++ch) {
                const int64_t ta = ch * C, tb = std::min(len, ta + C), n = tb - ta;
                const int64_t ld = C + 256;  // row stride of s: room for a piece's overhang
                // Scores for the chunk, one reader call per piece, for all heads of the group.
                for_pieces(ks, ta, tb, [&](const KvSegment& seg, int64_t off, const uint8_t* data, int64_t m) {
                    VXQ_ASSERT(off + m <= ld);
                    seg.reader->scores(qg, n_gqa, data, m, d, tmp.data());
                    for (int64_t h = 0; h < n_gqa; ++h) {
                        const float* th = tmp.data() + h * m;
                        float* sh = s.data() + h * ld + off;
                        for (int64_t t = 0; t < m; ++t) sh[t] = th[t] * a.scale;
                    }
                });
                for (int64_t h = 0; h < n_gqa; ++h) {
                    float* sh = s.data() + h * ld;
                    float mx = st[size_t(h)].m;
                    for (int64_t t = 0; t < n; ++t) mx = std::max(mx, sh[t]);
                    const float r = SoftmaxState::rescale(st[size_t(h)].m, mx);
                    for (int64_t t = 0; t < n; ++t) sh[t] -= mx;
                    vec_expf(sh, sh, n);  // ggml's 8-lane exp (what llama.cpp's softmax uses)
                    float sum = 0.0f;
                    for (int64_t t = 0; t < n; ++t) sum += sh[t];
                    if (std::isnan(sum)) mx = NAN;  // NaN scores poison the state, never vanish
                    std::fill(sh + n, sh + ld, 0.0f);  // tokens past the visible end weigh nothing
                    st[size_t(h)].l = st[size_t(h)].l * r + sum;
                    st[size_t(h)].m = mx;
                    float* ah = acc.data() + h * d;
                    for (int64_t c = 0; c < d; ++c) ah[c] *= r;
                }
                for_pieces(vs, ta, tb, [&](const KvSegment& seg, int64_t off, const uint8_t* data, int64_t m) {
                    for (int64_t h = 0; h < n_gqa; ++h) std::copy_n(s.data() + h * ld + off, m, tmp.data() + h * m);
                    seg.reader->accumulate(tmp.data(), n_gqa, data, m, d, acc.data());
                });
            }
            float* part = partial.data() + size_t(w) * size_t(state_floats);
            for (int64_t h = 0; h < n_gqa; ++h) {
                part[h * (d + 2)] = st[size_t(h)].m;
                part[h * (d + 2) + 1] = st[size_t(h)].l;
                std::copy_n(acc.data() + h * d, d, part + h * (d + 2) + 2);
            }
        }
    });

    // Merge the splits of each unit and normalize.
    std::vector<float> acc(static_cast<size_t>(d));
    for (int64_t unit = 0; unit < units; ++unit) {
        const int64_t i = unit / a.n_head_kv, g = unit % a.n_head_kv;
        for (int64_t h = 0; h < n_gqa; ++h) {
            SoftmaxState st;
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int64_t sp = 0; sp < n_split; ++sp) {
                const float* part = partial.data() + size_t(unit * n_split + sp) * size_t(state_floats) + h * (d + 2);
                merge_softmax(st, acc.data(), SoftmaxState{part[0], part[1]}, part + 2, d);
            }
            float* o = a.out + (i * a.n_head + g * n_gqa + h) * d;
            // Only a state that saw no token is empty (l = 0, output 0); a NaN sum stays NaN, so
            // NaN in the cache reaches the logits as it does in llama.cpp, never a silent 0.
            const float inv = st.l == 0.0f ? 0.0f : 1.0f / st.l;
            for (int64_t c = 0; c < d; ++c) o[c] = acc[size_t(c)] * inv;
        }
    }
}

void attention_dequant_ref(const float* q, float* out, int64_t n_q, int64_t pos0, int64_t n_head, int64_t n_head_kv,
                           int64_t head_dim, float scale, const std::function<const float*(int64_t g, bool key)>& decoded) {
    const int64_t d = head_dim, n_gqa = n_head / n_head_kv;
    for (int64_t i = 0; i < n_q; ++i) {
        const int64_t len = pos0 + i + 1;
        for (int64_t h = 0; h < n_head; ++h) {
            const float* k = decoded(h / n_gqa, true);
            const float* v = decoded(h / n_gqa, false);
            const float* qh = q + (i * n_head + h) * d;
            std::vector<double> s(static_cast<size_t>(len));
            double mx = -INFINITY;
            for (int64_t t = 0; t < len; ++t) {
                double dot = 0;
                for (int64_t c = 0; c < d; ++c) dot += double(qh[c]) * double(k[t * d + c]);
                s[size_t(t)] = dot * scale;
                mx = std::max(mx, s[size_t(t)]);
            }
            double sum = 0;
            for (auto& x : s) sum += x = std::exp(x - mx);
            for (int64_t c = 0; c < d; ++c) {
                double o = 0;
                for (int64_t t = 0; t < len; ++t) o += s[size_t(t)] * double(v[t * d + c]);
                out[(i * n_head + h) * d + c] = float(o / sum);
            }
        }
    }
}

}  // namespace vxq::cpu

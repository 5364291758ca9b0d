#include "kernels/cpu/attention_fused.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/kv_reader.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/softmax_state.h"

namespace vxq::cpu {

namespace {

// One stream's formats and readers.
struct StreamRead {
    const KvStreamView* view;
    const KvReader* main;
    const KvReader* window;
    const KvFormatParams& fmt(const KvSegment& s) const { return s.window ? view->window_fmt : view->fmt; }
    const KvReader& reader(const KvSegment& s) const { return s.window ? *window : *main; }
};

StreamRead stream_read(const KvStreamView& v) {
    return {&v, &kv_reader(v.fmt.kind), &kv_reader(v.window_fmt.kind)};
}

// Calls fn(segment, offset_in_chunk, data, n) for the whole-block pieces of `stream` that cover
// stored tokens [a, b); a piece may run past b up to its block's end (callers mask those tokens).
// Segments are sorted by `first`: a binary search finds the first one, so a chunk costs
// O(log segments), not a scan of the whole stream.
template <typename Fn>
void for_pieces(const StreamRead& st, int64_t a, int64_t b, Fn&& fn) {
    const KvSegment* begin = st.view->segs;
    const KvSegment* end = begin + st.view->n_segs;
    const KvSegment* s = std::partition_point(begin, end, [&](const KvSegment& x) { return x.first + x.n_tokens <= a; });
    for (; s != end && s->first < b; ++s) {
        const KvFormatParams& f = st.fmt(*s);
        const int64_t lo = std::max(a, s->first);
        const int64_t hi = std::min(b, s->first + s->n_tokens);
        if (lo >= hi) continue;
        const int64_t blk0 = (lo - s->first) / f.block_tokens;
        const int64_t blk1 = (hi - s->first + f.block_tokens - 1) / f.block_tokens;
        const int64_t start = s->first + blk0 * f.block_tokens;
        VXQ_ASSERT(start >= a);  // chunks start on block boundaries
        fn(*s, f, start - a, s->data + size_t(blk0) * f.block_bytes, (blk1 - blk0) * f.block_tokens);
    }
}

// The probability each stored token receives, p = exp(s - m) / l with the final (m, l) of each
// (query, head), summed over queries and the group's heads into token_mass[g][t]. A second pass
// over the keys (scores again): only for callers that observe attention (H2O, SnapKV, tests).
void attention_mass(const KvLayerView& view, const float* q, int64_t n_q, int64_t pos0, float scale,
                    const std::vector<StreamRead>& keys, const std::vector<SoftmaxState>& final_state, ThreadPool& pool,
                    float* const* token_mass) {
    const int64_t d = view.head_dim, H = view.n_head_kv, n_gqa = view.n_head / H, C = view.chunk;
    int64_t max_tokens = 0;
    for (int64_t g = 0; g < H; ++g) max_tokens = std::max(max_tokens, view.heads[g].n_tokens);
    std::vector<std::vector<float>> mass(size_t(pool.size()));
    pool.run([&](int ith, int nth) {
        std::vector<float>& m = mass[size_t(ith)];
        m.assign(size_t(H * max_tokens), 0.0f);
        const int64_t ld = C + 256;
        std::vector<float> s(size_t(n_gqa * ld)), tmp(size_t(n_gqa * ld));
        PreparedQuery pq_main, pq_window;
        for (int64_t unit = ith; unit < n_q * H; unit += nth) {
            const int64_t i = unit / H, g = unit % H;
            const int64_t len = kv_visible(view.heads[g], pos0 + i);
            if (len == 0) continue;
            const float* qg = q + (i * view.n_head + g * n_gqa) * d;
            const StreamRead& ks = keys[size_t(g)];
            ks.main->prepare_query(ks.view->fmt, qg, n_gqa, d, pq_main);
            ks.window->prepare_query(ks.view->window_fmt, qg, n_gqa, d, pq_window);
            for (int64_t ta = 0; ta < len; ta += C) {
                const int64_t tb = std::min(len, ta + C);
                for_pieces(ks, ta, tb, [&](const KvSegment& seg, const KvFormatParams& f, int64_t off, const uint8_t* data, int64_t n) {
                    ks.reader(seg).scores(f, seg.window ? pq_window : pq_main, n_gqa, data, n, d, tmp.data());
                    for (int64_t h = 0; h < n_gqa; ++h)
                        for (int64_t t = 0; t < n; ++t) s[size_t(h * ld + off + t)] = tmp[size_t(h * n + t)] * scale;
                });
                float* mg = m.data() + g * max_tokens + ta;
                for (int64_t h = 0; h < n_gqa; ++h) {
                    const SoftmaxState& st = final_state[size_t(unit * n_gqa + h)];
                    const float inv = st.l == 0.0f ? 0.0f : 1.0f / st.l;
                    for (int64_t t = 0; t < tb - ta; ++t) mg[t] += std::exp(s[size_t(h * ld + t)] - st.m) * inv;
                }
            }
        }
    });
    for (const auto& m : mass)
        for (int64_t g = 0; g < H; ++g)
            for (int64_t t = 0; t < view.heads[g].n_tokens; ++t) token_mass[g][t] += m[size_t(g * max_tokens + t)];
}

}  // namespace

void attention_fused(const KvLayerView& view, const float* q, int64_t n_q, int64_t pos0, float scale, float* out,
                     ThreadPool& pool, float* const* token_mass) {
    const int64_t d = view.head_dim;
    const int64_t H = view.n_head_kv;
    const int64_t n_gqa = view.n_head / H;
    const int64_t C = view.chunk;
    int64_t max_len = 0;
    for (int64_t g = 0; g < H; ++g) max_len = std::max(max_len, kv_visible(view.heads[g], pos0 + n_q - 1));
    const int64_t n_chunks = (max_len + C - 1) / C;
    // Split long streams over chunk ranges when there are few (query, KV head) units (decode);
    // the partial states are merged below. The split depends on the shape only, never on the
    // thread count, so results are the same bit for bit with any -t (a last-bit difference in
    // K/V can flip a low-bit code and move a KIVI perplexity by 0.04 %).
    constexpr int64_t kWorkItems = 32;
    const int64_t units = n_q * H;
    const int64_t n_split = std::clamp<int64_t>((kWorkItems + units - 1) / units, 1, std::max<int64_t>(1, n_chunks / 2));
    const int64_t state_floats = n_gqa * (d + 2);
    std::vector<float> partial(size_t(units * n_split * state_floats));
    std::vector<StreamRead> keys, values;
    for (int64_t g = 0; g < H; ++g) {
        keys.push_back(stream_read(view.heads[g].k));
        values.push_back(stream_read(view.heads[g].v));
    }

    pool.run([&](int ith, int nth) {
        // Per thread: scores/probabilities for one chunk (+ a block of overhang), accumulator.
        const int64_t ld = C + 256;  // row stride of s: room for a piece's overhang
        std::vector<float> s(size_t(n_gqa * ld));
        std::vector<float> acc(size_t(n_gqa * d));
        std::vector<float> acc_window(size_t(n_gqa * d));  // window values of an own-domain stream
        std::vector<SoftmaxState> st(static_cast<size_t>(n_gqa));
        std::vector<float> tmp(size_t(n_gqa * ld));  // one piece's scores or probabilities
        PreparedQuery pq_main, pq_window;
        for (int64_t w = ith; w < units * n_split; w += nth) {
            const int64_t unit = w / n_split, split = w % n_split;
            const int64_t i = unit / H, g = unit % H;
            const int64_t len = kv_visible(view.heads[g], pos0 + i);  // visible stored tokens
            const int64_t chunks_here = (len + C - 1) / C;
            const int64_t c0 = chunks_here * split / n_split, c1 = chunks_here * (split + 1) / n_split;
            // The group's n_gqa query heads are contiguous. The readers get the UNSCALED query and
            // the scale multiplies each score afterwards, as in llama.cpp's CPU flash attention
            // (`kq_vec_dot(...); s = s*scale;`): that is what makes q8_0 / q4_0 keys, whose readers
            // quantize the query to q8_0 first, match it. The query is prepared once per unit.
            const float* qg = q + (i * view.n_head + g * n_gqa) * d;
            std::fill(acc.begin(), acc.end(), 0.0f);
            std::fill(st.begin(), st.end(), SoftmaxState{});
            const StreamRead& ks = keys[size_t(g)];
            const StreamRead& vs = values[size_t(g)];
            // Values read in the reader's own domain (a rotation): window tokens sum apart.
            const bool own_domain = vs.main->own_value_domain();
            if (own_domain) std::fill(acc_window.begin(), acc_window.end(), 0.0f);
            if (c0 < c1) {
                ks.main->prepare_query(ks.view->fmt, qg, n_gqa, d, pq_main);
                ks.window->prepare_query(ks.view->window_fmt, qg, n_gqa, d, pq_window);
            }
            for (int64_t ch = c0; ch < c1; ++ch) {
                const int64_t ta = ch * C, tb = std::min(len, ta + C), n = tb - ta;
                // Scores for the chunk, one reader call per piece, for all heads of the group.
                for_pieces(ks, ta, tb, [&](const KvSegment& seg, const KvFormatParams& f, int64_t off, const uint8_t* data, int64_t m) {
                    VXQ_ASSERT(off + m <= ld);
                    ks.reader(seg).scores(f, seg.window ? pq_window : pq_main, n_gqa, data, m, d, tmp.data());
                    for (int64_t h = 0; h < n_gqa; ++h) {
                        const float* th = tmp.data() + h * m;
                        float* sh = s.data() + h * ld + off;
                        for (int64_t t = 0; t < m; ++t) sh[t] = th[t] * scale;
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
                    if (own_domain) {
                        float* wh = acc_window.data() + h * d;
                        for (int64_t c = 0; c < d; ++c) wh[c] *= r;
                    }
                }
                for_pieces(vs, ta, tb, [&](const KvSegment& seg, const KvFormatParams& f, int64_t off, const uint8_t* data, int64_t m) {
                    for (int64_t h = 0; h < n_gqa; ++h) std::copy_n(s.data() + h * ld + off, m, tmp.data() + h * m);
                    float* into = own_domain && seg.window ? acc_window.data() : acc.data();
                    vs.reader(seg).accumulate(f, tmp.data(), n_gqa, data, m, d, into);
                });
            }
            if (own_domain && c0 < c1) {
                vs.main->finish_accumulate(vs.view->fmt, acc.data(), n_gqa, d);
                for (size_t c = 0; c < acc.size(); ++c) acc[c] += acc_window[c];
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
    std::vector<SoftmaxState> final_state(size_t(units * n_gqa));  // per (unit, head): the softmax's m and l
    for (int64_t unit = 0; unit < units; ++unit) {
        const int64_t i = unit / H, g = unit % H;
        for (int64_t h = 0; h < n_gqa; ++h) {
            SoftmaxState& st = final_state[size_t(unit * n_gqa + h)];
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int64_t sp = 0; sp < n_split; ++sp) {
                const float* part = partial.data() + size_t(unit * n_split + sp) * size_t(state_floats) + h * (d + 2);
                merge_softmax(st, acc.data(), SoftmaxState{part[0], part[1]}, part + 2, d);
            }
            float* o = out + (i * view.n_head + g * n_gqa + h) * d;
            // Only a state that saw no token is empty (l = 0, output 0); a NaN sum stays NaN, so
            // NaN in the cache reaches the logits as it does in llama.cpp, never a silent 0.
            const float inv = st.l == 0.0f ? 0.0f : 1.0f / st.l;
            for (int64_t c = 0; c < d; ++c) o[c] = acc[size_t(c)] * inv;
        }
    }
    if (token_mass) attention_mass(view, q, n_q, pos0, scale, keys, final_state, pool, token_mass);
}

void attention_dequant_ref(const float* q, float* out, int64_t n_q, int64_t pos0, int64_t n_head, int64_t n_head_kv,
                           int64_t head_dim, float scale, const std::function<const float*(int64_t g, bool key)>& decoded,
                           const std::function<int64_t(int64_t g)>& n_tokens,
                           const std::function<const int32_t*(int64_t g)>& positions) {
    const int64_t d = head_dim, n_gqa = n_head / n_head_kv;
    for (int64_t i = 0; i < n_q; ++i) {
        for (int64_t h = 0; h < n_head; ++h) {
            // Visible tokens counted here on their own (not through kv_visible), so the test of the
            // kernel's visibility rule is independent of it.
            const int64_t stored = n_tokens ? n_tokens(h / n_gqa) : pos0 + n_q;
            const int32_t* pos = positions ? positions(h / n_gqa) : nullptr;
            int64_t len = 0;
            while (len < stored && (pos ? pos[len] : len) <= pos0 + i) ++len;
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

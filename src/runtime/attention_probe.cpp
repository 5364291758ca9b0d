#include "runtime/attention_probe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace vxq {

AttentionProbe::AttentionProbe(std::unique_ptr<KvCache> inner) : inner_(std::move(inner)) {
    const KvShape& s = inner_->shape();
    const size_t per_layer = size_t(s.n_ctx * s.n_head_kv * s.head_dim);
    exact_k_.assign(size_t(s.n_layer), std::vector<float>(per_layer));
    exact_v_.assign(size_t(s.n_layer), std::vector<float>(per_layer));
    inner_->set_observer(this);
}

void AttentionProbe::on_write(int64_t layer, int64_t pos0, const float* k, const float* v, int64_t n) {
    const KvShape& s = inner_->shape();
    const size_t row = size_t(s.n_head_kv * s.head_dim);
    std::memcpy(exact_k_[size_t(layer)].data() + size_t(pos0) * row, k, size_t(n) * row * sizeof(float));
    std::memcpy(exact_v_[size_t(layer)].data() + size_t(pos0) * row, v, size_t(n) * row * sizeof(float));
}

namespace {

double pearson(const std::vector<double>& a, const std::vector<double>& b) {
    const size_t n = a.size();
    if (n < 2) return std::numeric_limits<double>::quiet_NaN();
    double ma = 0, mb = 0;
    for (size_t i = 0; i < n; ++i) ma += a[i], mb += b[i];
    ma /= double(n);
    mb /= double(n);
    double sab = 0, saa = 0, sbb = 0;
    for (size_t i = 0; i < n; ++i) {
        sab += (a[i] - ma) * (b[i] - mb);
        saa += (a[i] - ma) * (a[i] - ma);
        sbb += (b[i] - mb) * (b[i] - mb);
    }
    if (saa <= 0 || sbb <= 0) return std::numeric_limits<double>::quiet_NaN();
    return sab / std::sqrt(saa * sbb);
}

}  // namespace

void AttentionProbe::on_attention(int64_t layer, const float* q, int64_t n_q, int64_t pos0, const float* out) {
    if (!armed_) return;
    const KvShape& s = inner_->shape();
    const int64_t d = s.head_dim, H = s.n_head_kv, n_gqa = s.n_head / s.n_head_kv;
    const double scale = 1.0 / std::sqrt(double(d));
    const float* ek = exact_k_[size_t(layer)].data();
    const float* ev = exact_v_[size_t(layer)].data();
    std::vector<float> kh, vh;
    std::vector<double> s_exact, s_kept, s_cache, o(static_cast<size_t>(d));
    for (int64_t g = 0; g < H; ++g) {
        // The stored tokens and their positions (all of them unless a policy evicted some).
        const int64_t n_stored = inner_->head_tokens(layer, g);
        const std::vector<int32_t> pos = inner_->head_positions(layer, g);
        inner_->dequantize(layer, g, n_stored, kh, vh);
        for (int64_t i = 0; i < n_q; ++i) {
            const int64_t len = pos0 + i + 1;
            for (int64_t h = g * n_gqa; h < (g + 1) * n_gqa; ++h) {
                const float* qh = q + (i * s.n_head + h) * d;
                s_exact.assign(size_t(len), 0.0);
                double mx = -INFINITY;
                for (int64_t t = 0; t < len; ++t) {
                    const float* k = ek + (t * H + g) * d;
                    double a = 0;
                    for (int64_t c = 0; c < d; ++c) a += double(qh[c]) * double(k[c]);
                    s_exact[size_t(t)] = a * scale;
                    mx = std::max(mx, a * scale);
                }
                // Scores from the cache's codes against the exact ones, over the tokens it keeps.
                s_kept.clear();
                s_cache.clear();
                for (int64_t j = 0; j < n_stored && pos[size_t(j)] < len; ++j) {
                    const float* kc = kh.data() + j * d;
                    double b = 0;
                    for (int64_t c = 0; c < d; ++c) b += double(qh[c]) * double(kc[c]);
                    s_kept.push_back(s_exact[size_t(pos[size_t(j)])]);
                    s_cache.push_back(b * scale);
                }
                AttentionSample smp;
                smp.layer = layer;
                smp.head = h;
                smp.len = len;
                smp.score_corr = pearson(s_kept, s_cache);
                std::fill(o.begin(), o.end(), 0.0);
                double sum = 0;
                for (int64_t t = 0; t < len; ++t) {
                    const double p = std::exp(s_exact[size_t(t)] - mx);
                    sum += p;
                    const float* v = ev + (t * H + g) * d;
                    for (int64_t c = 0; c < d; ++c) o[size_t(c)] += p * double(v[c]);
                }
                double err = 0, ref = 0;
                const float* oc = out + (i * s.n_head + h) * d;
                for (int64_t c = 0; c < d; ++c) {
                    const double x = o[size_t(c)] / sum;
                    err += (double(oc[c]) - x) * (double(oc[c]) - x);
                    ref += x * x;
                }
                smp.out_rel_err = ref > 0 ? std::sqrt(err / ref) : std::sqrt(err);
                samples_.push_back(smp);
            }
        }
    }
}

}  // namespace vxq

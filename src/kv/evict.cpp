#include "kv/evict.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "kv/calibration.h"
#include "kv/codecs/option_parse.h"
#include "kv/kv_cache.h"
#include "kv/spec.h"

#include <fmt/format.h>

namespace vxq {

const char* evict_policy_name(EvictPolicy p) {
    switch (p) {
        case EvictPolicy::Streaming: return "streaming";
        case EvictPolicy::KNorm: return "knorm";
        case EvictPolicy::QFilters: return "qfilters";
        case EvictPolicy::H2O: return "h2o";
        case EvictPolicy::SnapKV: return "snapkv";
        case EvictPolicy::None: break;
    }
    return "none";
}

EvictSpec EvictSpec::parse(const std::string& text) {
    EvictSpec e;
    if (text.empty()) return e;
    const CodecSpec c = CodecSpec::parse(text);
    for (EvictPolicy p : {EvictPolicy::Streaming, EvictPolicy::KNorm, EvictPolicy::QFilters, EvictPolicy::H2O, EvictPolicy::SnapKV}) {
        if (c.name == evict_policy_name(p)) e.policy = p;
    }
    if (!e.active()) {
        fail("--evict: unknown policy '{}' (streaming, knorm, qfilters, h2o, snapkv)", c.name);
    }
    codecs::check_known_options(c, {"budget", "ratio", "sink", "window", "every", "calib", "obs"});
    const bool has_budget = c.options.count("budget") > 0, has_ratio = c.options.count("ratio") > 0;
    if (has_budget == has_ratio) fail("--evict {}: give exactly one of budget=N (tokens per head) or ratio=R", c.name);
    e.sink = codecs::int_option(c, "sink", 4, 0, 1 << 20);
    e.window = codecs::int_option(c, "window", 64, 0, 1 << 24);
    e.window_given = c.options.count("window") > 0;
    e.every = codecs::int_option(c, "every", 1, 1, 1 << 20);
    if (c.options.count("obs") > 0 && e.policy != EvictPolicy::SnapKV) fail("--evict {}: obs= is for snapkv only", c.name);
    e.obs = codecs::int_option(c, "obs", 64, 1, 1 << 16);
    if (has_budget) {
        e.budget = codecs::int_option(c, "budget", 0, e.sink + 2, int64_t(1) << 30);
    } else {
        const std::string& r = c.options.at("ratio");
        char* end = nullptr;
        e.ratio = std::strtod(r.c_str(), &end);
        if (r.empty() || *end != '\0' || !(e.ratio > 0.0 && e.ratio <= 1.0)) {
            fail("--evict {}: ratio={} is not a number in (0, 1]", c.name, r);
        }
    }
    if (auto it = c.options.find("calib"); it != c.options.end()) {
        if (e.policy != EvictPolicy::QFilters) fail("--evict {}: calib= is for qfilters only", c.name);
        e.calib = it->second;
    }
    if (e.policy == EvictPolicy::QFilters && e.calib.empty()) {
        fail("--evict qfilters needs its calibration: calib=FILE from `vxq calibrate --method qfilters`");
    }
    return e;
}

std::string EvictSpec::str() const {
    if (!active()) return "";
    std::string s = fmt::format("{}:{}", evict_policy_name(policy), budget > 0 ? fmt::format("budget={}", budget)
                                                                              : fmt::format("ratio={}", ratio));
    if (sink != 4) s += fmt::format(",sink={}", sink);
    if (window_given) s += fmt::format(",window={}", window);
    if (every != 1) s += fmt::format(",every={}", every);
    if (!calib.empty()) s += ",calib=" + calib;
    if (policy == EvictPolicy::SnapKV && obs != 64) s += fmt::format(",obs={}", obs);
    return s;
}

int64_t EvictSpec::budget_for(int64_t seen) const {
    if (budget > 0) return budget;
    return std::max(sink + 2, int64_t(std::ceil(ratio * double(seen))));
}

int64_t EvictSpec::window_for(int64_t b) const {
    if (policy == EvictPolicy::Streaming) return std::max<int64_t>(0, b - sink);  // the window is the policy
    if (window_given) return std::min(window, std::max<int64_t>(0, b - sink));
    return std::min(window, std::max<int64_t>(0, (b - sink) / 2));
}

std::vector<uint8_t> evict_keep_mask(std::span<const float> scores, int64_t budget, int64_t sink, int64_t window) {
    const int64_t n = int64_t(scores.size());
    std::vector<uint8_t> keep(size_t(n), 1);
    if (n <= budget) return keep;
    sink = std::min(sink, budget);
    window = std::min(window, budget - sink);
    const int64_t lo = sink, hi = n - window;  // the scored stretch [lo, hi)
    const int64_t pick = budget - sink - window;
    std::vector<int64_t> idx(size_t(hi - lo));
    std::iota(idx.begin(), idx.end(), lo);
    const auto key = [&](int64_t t) { return std::isnan(scores[size_t(t)]) ? -INFINITY : scores[size_t(t)]; };
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
        return key(a) != key(b) ? key(a) > key(b) : a > b;  // ties: the more recent
    });
    for (int64_t t = lo; t < hi; ++t) keep[size_t(t)] = 0;
    for (int64_t i = 0; i < pick; ++i) keep[size_t(idx[size_t(i)])] = 1;
    return keep;
}

Evictor::Evictor(const EvictSpec& spec, const KvShape& shape)
    : spec_(spec), n_layer_(shape.n_layer), n_head_kv_(shape.n_head_kv), head_dim_(shape.head_dim) {
    VXQ_ASSERT(spec.active());
    n_head_ = shape.n_head;
    if (spec.policy == EvictPolicy::H2O) mass_.resize(size_t(n_layer_ * n_head_kv_));
    if (spec.policy == EvictPolicy::SnapKV) {
        votes_.resize(size_t(n_layer_ * n_head_kv_));
        step_mass_.resize(size_t(n_layer_ * n_head_kv_));
        prompt_q_.resize(size_t(n_layer_));
        prompt_pos0_.assign(size_t(n_layer_), 0);
    }
    if (spec.policy == EvictPolicy::QFilters) {
        const QFiltersCalibration c = load_qfilters_calibration(spec.calib);
        if (c.n_layer != n_layer_ || c.n_head_kv != n_head_kv_ || c.head_dim != head_dim_) {
            fail("{}: Q-Filters for {} layers x {} KV heads x head_dim {}, the model has {} x {} x {}", spec.calib,
                 c.n_layer, c.n_head_kv, c.head_dim, n_layer_, n_head_kv_, head_dim_);
        }
        filters_ = c.filters;
    }
}

Evictor::~Evictor() = default;

std::span<const float> Evictor::filter(int64_t layer, int64_t head) const {
    if (filters_.empty()) return {};
    return std::span(filters_).subspan(size_t((layer * n_head_kv_ + head) * head_dim_), size_t(head_dim_));
}

void Evictor::add_attention_mass(int64_t layer, int64_t head, const float* mass, int64_t n_tokens) {
    if (spec_.policy == EvictPolicy::SnapKV) {  // kept until on_queries says whether it was one query
        step_mass_[size_t(layer * n_head_kv_ + head)].assign(mass, mass + n_tokens);
        return;
    }
    std::vector<float>& acc = mass_[size_t(layer * n_head_kv_ + head)];
    if (int64_t(acc.size()) < n_tokens) acc.resize(size_t(n_tokens), 0.0f);  // new tokens start at 0
    for (int64_t t = 0; t < n_tokens; ++t) acc[size_t(t)] += mass[t];
}

void Evictor::on_queries(int64_t layer, const float* q, int64_t n_q, int64_t pos0) {
    if (spec_.policy != EvictPolicy::SnapKV) return;
    if (n_q == 1) {  // a decode step: its attention mass is one query's vote
        for (int64_t g = 0; g < n_head_kv_; ++g) {
            const size_t i = size_t(layer * n_head_kv_ + g);
            std::vector<std::vector<float>>& v = votes_[i];
            v.push_back(std::move(step_mass_[i]));
            step_mass_[i].clear();
            if (int64_t(v.size()) > spec_.obs) v.erase(v.begin());
        }
        return;
    }
    // A prompt: its last obs queries vote once the cache holds their keys (after_commit).
    const int64_t keep = std::min(spec_.obs, n_q), row = n_head_ * head_dim_;
    prompt_q_[size_t(layer)].assign(q + (n_q - keep) * row, q + n_q * row);
    prompt_pos0_[size_t(layer)] = pos0 + n_q - keep;
    for (int64_t g = 0; g < n_head_kv_; ++g) {
        votes_[size_t(layer * n_head_kv_ + g)].clear();
        step_mass_[size_t(layer * n_head_kv_ + g)].clear();
    }
}

void Evictor::vote_from_queries(const KvCache& cache, int64_t layer) {
    std::vector<float>& q = prompt_q_[size_t(layer)];
    if (q.empty()) return;
    const int64_t d = head_dim_, rep = n_head_ / n_head_kv_, n_q = int64_t(q.size()) / (n_head_ * d);
    const double scale = 1.0 / std::sqrt(double(d));
    std::vector<float> k, v;
    std::vector<double> s;
    for (int64_t g = 0; g < n_head_kv_; ++g) {
        const int64_t n = cache.head_tokens(layer, g);
        const std::vector<int32_t> pos = cache.head_positions(layer, g);
        cache.dequantize(layer, g, n, k, v);
        std::vector<std::vector<float>>& votes = votes_[size_t(layer * n_head_kv_ + g)];
        for (int64_t i = 0; i < n_q; ++i) {
            const int64_t p = prompt_pos0_[size_t(layer)] + i;
            std::vector<float> vote(size_t(n), 0.0f);
            for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
                const float* qh = q.data() + (i * n_head_ + h) * d;
                s.assign(size_t(n), -INFINITY);
                double mx = -INFINITY;
                for (int64_t t = 0; t < n && pos[size_t(t)] <= p; ++t) {
                    double a = 0.0;
                    for (int64_t c = 0; c < d; ++c) a += double(qh[c]) * double(k[size_t(t * d + c)]);
                    s[size_t(t)] = a * scale;
                    mx = std::max(mx, s[size_t(t)]);
                }
                double sum = 0.0;
                for (double& x : s) sum += (x = std::exp(x - mx));
                for (int64_t t = 0; t < n; ++t) vote[size_t(t)] += float(s[size_t(t)] / sum);
            }
            votes.push_back(std::move(vote));
        }
        while (int64_t(votes.size()) > spec_.obs) votes.erase(votes.begin());
    }
    q.clear();
}

void Evictor::compact(std::vector<float>& x, std::span<const uint8_t> keep, int64_t n) {
    x.resize(size_t(n), 0.0f);
    int64_t w = 0;
    for (int64_t t = 0; t < n; ++t) {
        if (keep[size_t(t)]) x[size_t(w++)] = x[size_t(t)];
    }
    x.resize(size_t(w));
}

std::vector<float> Evictor::scores(const KvCache& cache, int64_t layer, int64_t head) const {
    const int64_t n = cache.head_tokens(layer, head);
    std::vector<float> s(size_t(n), 0.0f);
    switch (spec_.policy) {
        case EvictPolicy::Streaming: {
            const std::vector<int32_t> pos = cache.head_positions(layer, head);
            for (int64_t t = 0; t < n; ++t) s[size_t(t)] = float(pos[size_t(t)]);
            break;
        }
        case EvictPolicy::KNorm:
        case EvictPolicy::QFilters: {
            std::vector<float> k, v;
            cache.dequantize(layer, head, n, k, v);
            const std::span<const float> f = filter(layer, head);
            for (int64_t t = 0; t < n; ++t) {
                const float* kt = k.data() + t * head_dim_;
                double a = 0.0;
                for (int64_t i = 0; i < head_dim_; ++i) a += spec_.policy == EvictPolicy::KNorm ? double(kt[i]) * kt[i] : double(kt[i]) * f[size_t(i)];
                s[size_t(t)] = spec_.policy == EvictPolicy::KNorm ? -float(std::sqrt(a)) : float(a);
            }
            break;
        }
        case EvictPolicy::H2O: {
            const std::vector<float>& acc = mass_[size_t(layer * n_head_kv_ + head)];
            for (int64_t t = 0; t < n && t < int64_t(acc.size()); ++t) s[size_t(t)] = acc[size_t(t)];
            break;
        }
        case EvictPolicy::SnapKV: {
            std::vector<double> vote(size_t(n), 0.0);
            for (const std::vector<float>& v : votes_[size_t(layer * n_head_kv_ + head)]) {
                for (int64_t t = 0; t < n && t < int64_t(v.size()); ++t) vote[size_t(t)] += v[size_t(t)];
            }
            const int64_t r = EvictSpec::kPool / 2;  // average over the neighbours that exist
            for (int64_t t = 0; t < n; ++t) {
                double a = 0.0;
                const int64_t lo = std::max<int64_t>(0, t - r), hi = std::min(n - 1, t + r);
                for (int64_t u = lo; u <= hi; ++u) a += vote[size_t(u)];
                s[size_t(t)] = float(a / double(hi - lo + 1));
            }
            break;
        }
        case EvictPolicy::None: break;
    }
    return s;
}

int64_t Evictor::evict(KvCache& cache) {
    const int64_t budget = spec_.budget_for(cache.size());
    const int64_t window = spec_.window_for(budget);
    int64_t dropped = 0;
    for (int64_t l = 0; l < n_layer_; ++l) {
        for (int64_t g = 0; g < n_head_kv_; ++g) {
            const int64_t n = cache.head_tokens(l, g);
            if (n <= budget) continue;
            const std::vector<uint8_t> keep = evict_keep_mask(scores(cache, l, g), budget, spec_.sink, window);
            cache.retain(l, g, keep);
            if (!mass_.empty()) compact(mass_[size_t(l * n_head_kv_ + g)], keep, n);  // H2O's sums follow their tokens
            if (!votes_.empty()) {
                for (std::vector<float>& v : votes_[size_t(l * n_head_kv_ + g)]) compact(v, keep, n);
            }
            dropped += n - cache.head_tokens(l, g);
        }
    }
    return dropped;
}

void Evictor::after_truncate(const KvCache& cache) {
    steps_ = 0;
    for (int64_t l = 0; l < n_layer_; ++l) {
        for (int64_t g = 0; g < n_head_kv_; ++g) {
            const size_t n = size_t(cache.head_tokens(l, g)), i = size_t(l * n_head_kv_ + g);
            if (!mass_.empty()) mass_[i].resize(std::min(mass_[i].size(), n));
            if (!votes_.empty()) {
                if (n == 0) votes_[i].clear();
                for (std::vector<float>& v : votes_[i]) v.resize(std::min(v.size(), n));
            }
        }
        if (!prompt_q_.empty()) prompt_q_[size_t(l)].clear();
    }
}

void Evictor::after_commit(KvCache& cache, int64_t n_new) {
    if (n_new <= 0) return;
    for (int64_t l = 0; l < n_layer_ && !prompt_q_.empty(); ++l) vote_from_queries(cache, l);
    if (n_new == 1 && ++steps_ < spec_.every) return;
    steps_ = 0;
    evict(cache);
}

}  // namespace vxq

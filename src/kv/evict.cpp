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
        case EvictPolicy::None: break;
    }
    return "none";
}

EvictSpec EvictSpec::parse(const std::string& text) {
    EvictSpec e;
    if (text.empty()) return e;
    const CodecSpec c = CodecSpec::parse(text);
    for (EvictPolicy p : {EvictPolicy::Streaming, EvictPolicy::KNorm, EvictPolicy::QFilters, EvictPolicy::H2O}) {
        if (c.name == evict_policy_name(p)) e.policy = p;
    }
    if (!e.active()) {
        fail("--evict: unknown policy '{}' (streaming, knorm, qfilters, h2o; snapkv is not implemented yet)", c.name);
    }
    codecs::check_known_options(c, {"budget", "ratio", "sink", "window", "every", "calib"});
    const bool has_budget = c.options.count("budget") > 0, has_ratio = c.options.count("ratio") > 0;
    if (has_budget == has_ratio) fail("--evict {}: give exactly one of budget=N (tokens per head) or ratio=R", c.name);
    e.sink = codecs::int_option(c, "sink", 4, 0, 1 << 20);
    e.window = codecs::int_option(c, "window", 64, 0, 1 << 24);
    e.every = codecs::int_option(c, "every", 1, 1, 1 << 20);
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
    if (window != 64) s += fmt::format(",window={}", window);
    if (every != 1) s += fmt::format(",every={}", every);
    if (!calib.empty()) s += ",calib=" + calib;
    return s;
}

int64_t EvictSpec::budget_for(int64_t seen) const {
    if (budget > 0) return budget;
    return std::max(sink + 2, int64_t(std::ceil(ratio * double(seen))));
}

int64_t EvictSpec::window_for(int64_t b) const {
    if (policy == EvictPolicy::Streaming) return std::max<int64_t>(0, b - sink);  // the window is the policy
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
    if (spec.policy == EvictPolicy::H2O) mass_.resize(size_t(n_layer_ * n_head_kv_));
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
    std::vector<float>& acc = mass_[size_t(layer * n_head_kv_ + head)];
    if (int64_t(acc.size()) < n_tokens) acc.resize(size_t(n_tokens), 0.0f);  // new tokens start at 0
    for (int64_t t = 0; t < n_tokens; ++t) acc[size_t(t)] += mass[t];
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
            if (!mass_.empty()) {  // H2O's sums follow their tokens
                std::vector<float>& acc = mass_[size_t(l * n_head_kv_ + g)];
                acc.resize(size_t(n), 0.0f);
                int64_t w = 0;
                for (int64_t t = 0; t < n; ++t) {
                    if (keep[size_t(t)]) acc[size_t(w++)] = acc[size_t(t)];
                }
                acc.resize(size_t(w));
            }
            dropped += n - cache.head_tokens(l, g);
        }
    }
    return dropped;
}

void Evictor::after_truncate(const KvCache& cache) {
    steps_ = 0;
    for (int64_t l = 0; l < n_layer_ && !mass_.empty(); ++l) {
        for (int64_t g = 0; g < n_head_kv_; ++g) {
            std::vector<float>& acc = mass_[size_t(l * n_head_kv_ + g)];
            acc.resize(std::min(acc.size(), size_t(cache.head_tokens(l, g))));
        }
    }
}

void Evictor::after_commit(KvCache& cache, int64_t n_new) {
    if (n_new <= 0) return;
    if (n_new == 1 && ++steps_ < spec_.every) return;
    steps_ = 0;
    evict(cache);
}

}  // namespace vxq

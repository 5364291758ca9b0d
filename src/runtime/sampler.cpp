#include "runtime/sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace vxq {

int32_t argmax(std::span<const float> logits) {
    int32_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i) {
        if (logits[i] > logits[size_t(best)]) best = int32_t(i);
    }
    return best;
}

Sampler::Sampler(const SamplerParams& p)
    : p_(p),
      seed_(p.seed == 0xFFFFFFFFu ? uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) : p.seed),
      rng_(seed_) {}

int32_t Sampler::sample(std::span<const float> logits) {
    if (p_.temperature <= 0.0f) return argmax(logits);
    cand_.clear();
    for (size_t i = 0; i < logits.size(); ++i) cand_.emplace_back(logits[i], int32_t(i));
    auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
    size_t n = cand_.size();
    if (p_.top_k > 0 && size_t(p_.top_k) < n) {
        std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
        n = size_t(p_.top_k);
    } else {
        std::sort(cand_.begin(), cand_.end(), by_logit);
    }
    cand_.resize(n);
    // Probabilities at temperature 1 for the truncation steps, as llama.cpp's top-p/min-p.
    std::vector<double> prob(n);
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += prob[i] = std::exp(double(cand_[i].first - cand_[0].first));
    if (p_.top_p < 1.0f) {
        double cum = 0.0;
        size_t keep = n;
        for (size_t i = 0; i < n; ++i) {
            cum += prob[i] / sum;
            if (cum >= p_.top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (p_.min_p > 0.0f) {
        size_t keep = 1;
        while (keep < n && prob[keep] / prob[0] >= p_.min_p) ++keep;
        n = keep;
    }
    std::vector<double> w(n);
    for (size_t i = 0; i < n; ++i) w[i] = std::exp(double(cand_[i].first - cand_[0].first) / p_.temperature);
    std::discrete_distribution<size_t> dist(w.begin(), w.end());
    return cand_[dist(rng_)].second;
}

}  // namespace vxq

// Token sampling from logits, with llama.cpp's chain order and defaults:
// top-k -> top-p -> min-p -> temperature -> draw. temperature <= 0 means greedy (argmax).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace vxq {

struct SamplerParams {
    float temperature = 0.8f;
    int32_t top_k = 40;       // <= 0: off
    float top_p = 0.95f;      // >= 1: off
    float min_p = 0.05f;      // <= 0: off
    uint64_t seed = 0xFFFFFFFFu;  // llama.cpp's "random seed" value: pick one from the clock
};

class Sampler {
public:
    explicit Sampler(const SamplerParams& p);
    int32_t sample(std::span<const float> logits);
    uint64_t seed() const { return seed_; }

private:
    SamplerParams p_;
    uint64_t seed_;
    std::mt19937_64 rng_;
    std::vector<std::pair<float, int32_t>> cand_;
};

// Index of the largest logit (the first one on ties, as llama.cpp's greedy sampler).
int32_t argmax(std::span<const float> logits);

}  // namespace vxq

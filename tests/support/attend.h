// Attention over one layer of a cache with the CPU kernels, as the CPU backend dispatches it
// (llama.cpp-parity path for an f16/f16 cache without --flash-attn, the fused kernel otherwise),
// on a pool the test chooses.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_fused.h"
#include "kv/kv_cache.h"

namespace vxq::test {

inline void attend(const KvCache& c, int64_t layer, const float* q, int64_t n_q, int64_t pos0, float* out,
                   ThreadPool& pool) {
    const KvLayerView v = c.view(layer);
    const float scale = 1.0f / std::sqrt(float(v.head_dim));
    if (cpu::attention_f16_applies(v)) {
        cpu::attention_f16(v, q, n_q, pos0, scale, out, pool);
    } else {
        cpu::attention_fused(v, q, n_q, pos0, scale, out, pool);
    }
}

// Standard-normal keys and values [n, n_head_kv, d] and queries [n, n_head, d] from one seed.
struct RandomKvq {
    std::vector<float> k, v, q;
};
inline RandomKvq random_kvq(int64_t n, int64_t n_head_kv, int64_t n_head, int64_t d, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    RandomKvq r{std::vector<float>(size_t(n * n_head_kv * d)), std::vector<float>(size_t(n * n_head_kv * d)),
                std::vector<float>(size_t(n * n_head * d))};
    for (auto* x : {&r.k, &r.v, &r.q})
        for (float& e : *x) e = nd(rng);
    return r;
}

}  // namespace vxq::test

// Attention over one layer of a cache with the CPU kernels, as the CPU backend dispatches it
// (llama.cpp-parity path for an f16/f16 cache without --flash-attn, the fused kernel otherwise),
// on a pool the test chooses.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_fused.h"
#include "kernels/cpu/kv_reader.h"
#include "kv/kv_cache.h"
#include "support/isa.h"

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

// The fused attention of layer 0 against dequantize-then-attend (cpu::attention_dequant_ref over
// the cache's decoded K/V, all heads): max |out - ref| / max |ref| over the outputs.
inline double fused_vs_dequant_error(const KvCache& c, const float* q, int64_t n_q, int64_t pos0, ThreadPool& pool) {
    const KvShape& s = c.shape();
    std::vector<std::vector<float>> dk(size_t(s.n_head_kv)), dv(size_t(s.n_head_kv));
    for (int64_t g = 0; g < s.n_head_kv; ++g) c.dequantize(0, g, c.size(), dk[size_t(g)], dv[size_t(g)]);
    std::vector<float> out(size_t(n_q * s.n_head * s.head_dim)), ref(out.size());
    attend(c, 0, q, n_q, pos0, out.data(), pool);
    cpu::attention_dequant_ref(q, ref.data(), n_q, pos0, s.n_head, s.n_head_kv, s.head_dim,
                               1.0f / std::sqrt(float(s.head_dim)),
                               [&](int64_t g, bool key) { return key ? dk[size_t(g)].data() : dv[size_t(g)].data(); });
    double max_ref = 0, max_err = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        max_ref = std::max(max_ref, std::abs(double(ref[i])));
        max_err = std::max(max_err, std::abs(double(out[i]) - double(ref[i])));
    }
    return max_err / max_ref;
}

// One decode step (the last token's query, every head) over layer 0 of a `spec` cache holding n
// random tokens: how much a codec's work counter (`counter()`) grew during the step.
template <class Counter>
uint64_t count_in_one_decode_step(const std::string& spec, const KvShape& shape, int64_t n, Counter counter,
                                  uint32_t seed, ThreadPool& pool);

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

template <class Counter>
uint64_t count_in_one_decode_step(const std::string& spec, const KvShape& shape, int64_t n, Counter counter,
                                  uint32_t seed, ThreadPool& pool) {
    auto cache = make_kv_cache(shape, spec, spec);
    const RandomKvq r = random_kvq(n, shape.n_head_kv, shape.n_head, shape.head_dim, seed);
    cache->write(0, 0, r.k.data(), r.v.data(), n);
    cache->commit(n);
    std::vector<float> out(size_t(shape.n_head * shape.head_dim));
    const uint64_t before = counter();
    attend(*cache, 0, r.q.data(), 1, n - 1, out.data(), pool);
    return counter() - before;
}

}  // namespace vxq::test

// VXQ_REQUIRE_AVX2 (support/isa.h) for the AVX2 KV readers.
#define VXQ_REQUIRE_KV_AVX2() VXQ_REQUIRE_AVX2(::vxq::cpu::kv_avx2_available())

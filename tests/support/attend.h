// Attention over one layer of a cache with the CPU kernels, as the CPU backend dispatches it
// (llama.cpp-parity path for an f16/f16 cache without --flash-attn, the fused kernel otherwise),
// on a pool the test chooses.
#pragma once

#include <cmath>

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

}  // namespace vxq::test

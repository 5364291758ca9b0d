// Fused attention over a KV layer view (kv/kv_view.h): split over KV chunks and threads, online
// softmax with a mergeable state, K and V read in place by the readers of their formats
// (kv_reader.h). Used for every codec, and for f16 with --flash-attn; `attention_dequant_ref`
// dequantizes everything first and runs plain softmax attention, for tests.
#pragma once

#include <cstdint>
#include <functional>

#include "kv/kv_view.h"

namespace vxq {
class ThreadPool;
}

namespace vxq::cpu {

// Causal attention of n_q query tokens at positions [pos0, pos0 + n_q): query i sees the stored
// tokens of its KV head at positions <= pos0 + i. Scores are scaled by `scale`.
//   q, out: [n_q, n_head, head_dim], q after RoPE
// token_mass: as Backend::attention (nullptr: not wanted); a second pass over the keys computes it.
void attention_fused(const KvLayerView& view, const float* q, int64_t n_q, int64_t pos0, float scale, float* out,
                     ThreadPool& pool, float* const* token_mass = nullptr);

// Reference: decoded(g, key) gives [n_tokens(g), head_dim] f32 K or V of head g, positions(g)
// their positions (nullptr: token t at position t); plain attention in double precision.
void attention_dequant_ref(const float* q, float* out, int64_t n_q, int64_t pos0, int64_t n_head, int64_t n_head_kv,
                           int64_t head_dim, float scale, const std::function<const float*(int64_t g, bool key)>& decoded,
                           const std::function<int64_t(int64_t g)>& n_tokens = nullptr,
                           const std::function<const int32_t*(int64_t g)>& positions = nullptr);

}  // namespace vxq::cpu

// Internal: the inner loops of attention_f16, per instruction set.
#pragma once

#include <cstdint>

#include "core/fp16.h"

namespace vxq::cpu::detail {

// s[t] = hsum8(sum over 8 lanes of q16 * k_t), k_t = k + t*d. q16 holds fp16-rounded values.
void attn_scores_f16_avx2(const float* q16, const f16_t* k, int64_t n_kv, int64_t d, float* s);
// out[c] = hsum8 over lanes l of sum_{t = l mod 8} p16[t] * v_t[c]
void attn_weighted_sum_f16_avx2(const float* p16, const f16_t* v, int64_t n_kv, int64_t d, float* out);
// s[t] <- round_fp16(softmax(s * scale)[t]) for the n visible keys, in ggml's order (see
// attention.cpp): ggml_v_expf in groups of 8 from t = 0, each group's hsum8 added in double.
void attn_softmax_f16_ref(float* s, int64_t n, float scale);
void attn_softmax_f16_avx2(float* s, int64_t n, float scale);

bool cpu_has_avx2();

}  // namespace vxq::cpu::detail

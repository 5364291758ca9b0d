// Internal: the inner loops of attention_f16, per instruction set.
#pragma once

#include <cstdint>

#include "core/fp16.h"

namespace vxq::cpu::detail {

// tinyBLAS order (batches): s[t] = hsum8(sum over 8 lanes of q16 * k_t), k_t = k + t*d; q16 holds
// fp16-rounded values.
void attn_scores_f16_avx2(const float* q16, const f16_t* k, int64_t n_kv, int64_t d, float* s);
// ggml_vec_dot_f16 order (single token): 4 x 8 lanes over d & ~31, GGML_F32x8_REDUCE, tail in double.
void attn_scores_f16_vecdot_avx2(const float* q16, const f16_t* k, int64_t n_kv, int64_t d, float* s);
// tinyBLAS order: out[c] = hsum8 over lanes l of sum_{t = l mod 8} p16[t] * v_t[c]
void attn_weighted_sum_f16_avx2(const float* p16, const f16_t* v, int64_t n_kv, int64_t d, float* out);
// ggml_vec_dot_f16 order: key t in accumulator (t / 8) % 4, lane t % 8, then GGML_F32x8_REDUCE.
void attn_weighted_sum_f16_vecdot_avx2(const float* p16, const f16_t* v, int64_t n_kv, int64_t d, float* out);
// s[t] <- round_fp16(softmax(s * scale)[t]) for the n visible keys, in ggml's order (see
// attention.cpp): ggml_v_expf in groups of 8 from t = 0, each group's hsum8 added in double.
void attn_softmax_f16_ref(float* s, int64_t n, float scale);
void attn_softmax_f16_avx2(float* s, int64_t n, float scale);

bool cpu_has_avx2();

}  // namespace vxq::cpu::detail

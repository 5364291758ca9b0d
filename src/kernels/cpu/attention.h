// Attention over an fp16 K/V store, in llama.cpp's (non flash-attention) numerics: the query is
// rounded to fp16, each score is an 8-lane fp16 dot product reduced as ggml's hsum, softmax in
// f32 with ggml's exp approximation (ggml_v_expf) over groups of 8 keys whose sums add up in
// double, probabilities rounded to fp16, and the weighted sum of V accumulates in 8 lanes by key
// index (key j goes to lane j mod 8).
#pragma once

#include <cstdint>

#include "core/fp16.h"

namespace vxq::cpu {

struct AttentionF16Args {
    const float* q;       // [n_q, n_head, head_dim]
    const f16_t* k;       // [n_head_kv, k_stride_head] — key t of head g at k + g*stride + t*head_dim
    const f16_t* v;       // same layout as k
    int64_t stride_head;  // elements between KV heads (capacity * head_dim)
    float* out;           // [n_q, n_head, head_dim]
    int64_t n_q;
    int64_t pos0;         // query i sees keys [0, pos0 + i]
    int64_t n_head;
    int64_t n_head_kv;
    int64_t head_dim;
    float scale;
};

// One (query token, head) pair; scratch holds >= pos0 + n_q floats.
void attention_f16_row(const AttentionF16Args& a, int64_t i, int64_t h, float* scratch);
void attention_f16_row_ref(const AttentionF16Args& a, int64_t i, int64_t h, float* scratch);

}  // namespace vxq::cpu

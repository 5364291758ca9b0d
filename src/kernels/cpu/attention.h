// Attention over an fp16 K/V store, in llama.cpp b4748's (non flash-attention) CPU numerics: the
// query is rounded to fp16; scores and the weighted sum of V are f16 dot products in the order of
// tinyBLAS (llamafile sgemm) for batches of n_q >= 2 tokens and of ggml_vec_dot_f16 for a single
// token (see attention.cpp); the softmax is ggml's (ggml_v_expf over groups of 8 keys, sums added in
// double) and its probabilities are rounded to fp16 before the V product.
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

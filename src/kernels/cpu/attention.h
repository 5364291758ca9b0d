// Attention over an fp16 K/V store, in llama.cpp b4748's (non flash-attention) CPU numerics: the
// query is rounded to fp16; scores and the weighted sum of V are f16 dot products in the order of
// tinyBLAS (llamafile sgemm) for batches of n_q >= 2 tokens and of ggml_vec_dot_f16 for a single
// token (see attention.cpp); the softmax is ggml's (ggml_v_expf over groups of 8 keys, sums added in
// double) and its probabilities are rounded to fp16 before the V product.
#pragma once

#include <cstdint>

#include "core/fp16.h"
#include "kv/kv_view.h"

namespace vxq {
class ThreadPool;
}

namespace vxq::cpu {

struct AttentionF16Args {
    const float* q;               // [n_q, n_head, head_dim]
    const KvHeadView* heads;      // [n_head_kv]: stored tokens and their positions
    const f16_t* const* k;        // [n_head_kv]: head g's keys, [tokens, head_dim] (a stream is contiguous)
    const f16_t* const* v;        // same layout as k
    float* out;                   // [n_q, n_head, head_dim]
    int64_t n_q;
    int64_t pos0;                 // query i sees the stored tokens at positions <= pos0 + i
    int64_t n_head;
    int64_t n_head_kv;
    int64_t head_dim;
    float scale;
};

// One (query token, head) pair; scratch holds >= the head's stored tokens floats.
void attention_f16_row(const AttentionF16Args& a, int64_t i, int64_t h, float* scratch);
void attention_f16_row_ref(const AttentionF16Args& a, int64_t i, int64_t h, float* scratch);

// Whether a layer is an f16/f16 cache read without --flash-attn (the llama.cpp-parity path).
bool attention_f16_applies(const KvLayerView& view);
// Causal attention over such a layer, every (query token, head) row on the pool.
//   q, out: [n_q, n_head, head_dim]
// token_mass: as Backend::attention (nullptr: not wanted).
void attention_f16(const KvLayerView& view, const float* q, int64_t n_q, int64_t pos0, float scale, float* out,
                   ThreadPool& pool, float* const* token_mass = nullptr);

}  // namespace vxq::cpu

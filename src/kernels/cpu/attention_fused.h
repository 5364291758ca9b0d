// Fused attention over packed KV streams: split over KV chunks and threads, online softmax with
// a mergeable state, K and V read in place through their codecs' readers. Used for every codec
// of the paged cache (kv/paged_cache.cpp); the scalar reference `attention_dequant_ref`
// dequantizes everything first and runs plain softmax attention, for tests.
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/cpu/kv_reader.h"

namespace vxq {
class ThreadPool;
}

namespace vxq::cpu {

struct FusedAttentionArgs {
    const float* q;       // [n_q, n_head, head_dim], after RoPE
    float* out;           // [n_q, n_head, head_dim]
    int64_t n_q;
    int64_t pos0;         // query i sees stream tokens [0, pos0 + i]
    int64_t n_head;
    int64_t n_head_kv;
    int64_t head_dim;
    float scale;          // applied to scores, 1/sqrt(head_dim)
    int64_t chunk;        // tokens per chunk: a multiple of every segment's block_tokens
    // Streams of KV head g.
    std::function<const KvStreamView&(int64_t g)> keys;
    std::function<const KvStreamView&(int64_t g)> values;
};

void attention_fused(const FusedAttentionArgs& a, ThreadPool& pool);

// Reference: decode(g) fills [n_tokens, head_dim] f32 for K or V of head g; plain attention.
void attention_dequant_ref(const float* q, float* out, int64_t n_q, int64_t pos0, int64_t n_head, int64_t n_head_kv,
                           int64_t head_dim, float scale, const std::function<const float*(int64_t g, bool key)>& decoded);

}  // namespace vxq::cpu

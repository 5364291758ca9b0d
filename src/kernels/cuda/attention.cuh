// The f16 KV cache in device memory: the store kernel (new keys and values into each head's
// pages) and causal attention over those pages. Every value that changes from one decode step to
// the next (positions, token counts, page addresses) is read from a small device table, not
// passed as a kernel argument, so a captured CUDA graph of the step stays valid as the cache grows.
//
// Attention is the foundation's simple kernel (one block per query token and head, scores in
// device scratch, softmax and the V sum in f32; with round_f16 the two fp16 roundings of
// llama.cpp's non-flash path). Not yet the split-K online-softmax kernel with per-format readers:
// compressed formats have no CUDA reader, and the backend refuses them by name.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace vxq::cuda {

// The per-head table both kernels read (device memory), one entry per KV head.
struct KvHeadDev {
    uint64_t k, v;      // addresses of the head's key and value pages ([tokens, head_dim] fp16, contiguous)
    int64_t n_tokens;   // tokens stored (store: before this write; attention: all)
};

struct F16StoreParams {
    const float* k;           // [n, n_head_kv, head_dim] (device)
    const float* v;
    const KvHeadDev* heads;   // [n_head_kv]: n_tokens = the slot of the first new token
    int64_t n, n_head_kv, head_dim;
};
// Rounds to fp16 as the CPU's f16 codec does (round to nearest even): bit-exact.
void store_f16(const F16StoreParams& p, cudaStream_t stream);

struct F16AttentionParams {
    const float* q;           // [n_q, n_head, head_dim] after RoPE (device)
    const int64_t* pos0;      // position of query 0 (device); query i sees positions <= pos0 + i
    const KvHeadDev* heads;   // [n_head_kv] (device); token t of a head is at position t
    float* scores;            // [n_q, n_head, max_tokens] scratch (device)
    float* out;               // [n_q, n_head, head_dim] (device)
    int64_t n_q, n_head, n_head_kv, head_dim;
    int64_t max_tokens;       // scratch row stride: >= every head's n_tokens
    float scale;              // 1 / sqrt(head_dim)
    // llama.cpp's non-flash-attention numerics (an f16 cache without -fa, as the CPU backend
    // runs them): q rounded to fp16 before the scores, the normalized probabilities rounded to
    // fp16 before the V sum. false: f32 throughout (-fa).
    bool round_f16;
};

void attention_f16(const F16AttentionParams& p, cudaStream_t stream);

}  // namespace vxq::cuda

// Causal attention over an f16 KV cache on the device: the foundation's simple, correct kernel
// (one block per query token and head, scores in device scratch, softmax and the V sum in f32;
// with round_f16 the two fp16 roundings of llama.cpp's non-flash path).
// Not yet the split-K online-softmax kernel with per-format readers (STYLE.md): compressed
// formats have no CUDA reader, and the backend refuses them by name.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace vxq::cuda {

struct F16AttentionParams {
    const float* q;           // [n_q, n_head, head_dim] after RoPE (device)
    const __half* k;          // per KV head g: [n_tokens_g, head_dim] at k + offset[g] (device)
    const __half* v;          // same layout as k
    const int64_t* offset;    // [n_head_kv] element offsets into k and v (device)
    const int32_t* visible;   // [n_q, n_head_kv] stored tokens query i sees in head g (device)
    float* scores;            // [n_q, n_head, max_tokens] scratch (device)
    float* out;               // [n_q, n_head, head_dim] (device)
    int64_t n_q, n_head, n_head_kv, head_dim, max_tokens;
    float scale;              // 1 / sqrt(head_dim)
    // llama.cpp's non-flash-attention numerics (an f16 cache without -fa, as the CPU backend
    // runs them): q rounded to fp16 before the scores, the normalized probabilities rounded to
    // fp16 before the V sum. false: f32 throughout (-fa).
    bool round_f16 = false;
};

void attention_f16(const F16AttentionParams& p, cudaStream_t stream);

}  // namespace vxq::cuda

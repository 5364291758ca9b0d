// The attention mass on the device (Backend::attention's token_mass, what H2O accumulates and
// SnapKV votes with): the probability each stored token receives, summed over the call's queries
// and the query heads of its KV head. Two kernels that run after the attention (which they leave
// untouched), reading the same pages in place:
//   1. block (query i, query head h): its scores over the tokens it sees, their max m and the
//      softmax's 1 / sum exp(s - m); q8_0 / q4_0 keys: q quantized to q8_0 first, into scratch;
//   2. thread (KV head g, token t): sum over queries i that see t and heads h of g of
//      exp(s - m) * inv, the score computed again by the same device function, in a fixed order
//      (no atomics: the same bits every run, so an eviction's choice never depends on timing).
// The scores follow the CPU backend's readers: f16 keys dot an f32 q (without -fa on an f16/f16
// cache: q rounded to fp16 and each probability rounded to fp16, llama.cpp's non-flash numerics
// as the attention itself runs them); q8_0 / q4_0 keys the CPU's q8_0-query dot bit for bit
// (kernels/cpu/kv_read_baseline.cpp: 8 lanes of exact 4-element integer dots, fma'd with
// d_k * d_q, summed as hsum_float_8), then times the scale.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/kv_codes.cuh"

namespace vxq::cuda {

struct AttentionMassParams {
    const float* q;           // [n_q, n_head, head_dim] after RoPE (device)
    const int64_t* pos0;      // position of query 0 (device); query i sees positions <= pos0 + i
    const KvHeadDev* heads;   // [n_head_kv] (device): the attention's table (n_tokens, evicted)
    float* stats;             // [n_q, n_head, 2] scratch (device): each row's max score and 1 / sum
    int8_t* q8;               // [n_q, n_head, head_dim] scratch (device): q as q8_0 quants (q8_0 / q4_0 keys)
    float* q8_d;              // [n_q, n_head, head_dim / 32] scratch (device): their scales
    float* mass;              // [n_head_kv, stride] (device): head g's token t at g * stride + t, t < n_tokens
    int64_t n_q, n_head, n_head_kv, head_dim;
    int64_t stride;           // >= every head's n_tokens; fixed per call, so a captured pass holds
    float scale;              // 1 / sqrt(head_dim)
    KvCode k_code;            // the keys' format (the values play no part)
    bool round_f16;           // f16/f16 cache without -fa: q and the probabilities rounded to fp16
};

// Writes p.mass[g * stride + t] for every head g and stored token t < heads[g].n_tokens (0 where
// no query sees t). q8_0 / q4_0 keys need head_dim % 32 == 0 (kv_code_fits).
void attention_mass(const AttentionMassParams& p, cudaStream_t stream);

}  // namespace vxq::cuda

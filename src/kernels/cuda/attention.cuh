// The KV cache in device memory: the store kernel (new keys and values into each head's pages,
// in their format: f16, q8_0, q4_0 or fp8, kv_codes.cuh) and causal attention over those pages. Every
// value that changes from one decode step to the next (positions, token counts, page addresses)
// is read from a small device table, not passed as a kernel argument, so a captured CUDA graph of
// the step stays valid as the cache grows.
//
// Attention takes one of three paths:
//   decode with -fa (n_q < kAttnGemmMinQueries, GQA 1/2/3/4/8, head_dim a multiple of 32), and
//     every call on a q8_0 / q4_0 / fp8 cache: split-K over the tokens with an online softmax and an
//     in-kernel merge, reading each format in place (attention_split below);
//   decode without -fa, or other shapes (f16 only): one block per query token and head, scores
//     in device scratch, softmax and the V sum in f32; with round_f16 the two fp16 roundings of
//     llama.cpp's non-flash path (attention_f16);
//   prefill of an f16 cache (n_q >= kAttnGemmMinQueries): cuBLAS tensor-core GEMMs for the
//     scores and the V sum around a softmax kernel (attention_f16_gemm below).
// KIVI caches have their own store and attention (kivi.cuh); other formats have no CUDA reader
// yet and are refused by name (backend_cuda.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/kv_codes.cuh"

namespace vxq::cuda {

// The per-head table both kernels read (device memory), one entry per KV head.
struct KvHeadDev {
    uint64_t k, v;      // addresses of the head's key and value pages (token t at t * kv_token_bytes, contiguous)
    int64_t n_tokens;   // tokens stored (store: before this write; attention: all)
    // Attention: positions before the current batch that the head no longer holds (eviction;
    // 0 without). The batch's queries are its last stored tokens, so query i (position pos0 + i)
    // sees its first pos0 + i + 1 - evicted stored tokens.
    int64_t evicted;
    float k_scale = 1.0f, v_scale = 1.0f;  // fp8: the streams' scales (x = e4m3(code) * scale); 1 for the other formats
};
#ifdef __CUDACC__
// Stored tokens of `head` that query i of a batch starting at position pos0 sees (the batch's
// queries are the head's last stored tokens; positions evicted before it no longer count).
__device__ __forceinline__ int64_t kv_visible(const KvHeadDev& head, int64_t pos0, int64_t i) {
    const int64_t seen = pos0 + i + 1 - head.evicted;
    return seen < 0 ? 0 : (seen < head.n_tokens ? seen : head.n_tokens);
}
#endif

struct KvStoreParams {
    const float* k;           // [n, n_head_kv, head_dim] (device)
    const float* v;
    const KvHeadDev* heads;   // [n_head_kv]: n_tokens = the slot of the first new token
    int64_t n, n_head_kv, head_dim;
    KvCode k_code, v_code;
};
// Encodes as the CPU's codecs do (kv_codes.cuh): bit-exact. kv_store.cu.
void store_kv(const KvStoreParams& p, cudaStream_t stream);
// q8_0 and fp8 codes in store_kv by the hardware's conversions (cvt.rni.sat.s8,
// cvt.rn.satfinite.e4m3x2: kv_store_kernels.cuh; the same bytes, fewer instructions) instead of
// the scalar steps: on by default (on the H100 at 2048 tokens fp8's store 61 -> 78 % of the copy,
// q8_0's 74 -> 75 %: docs/gpu.md, 2026-12-06); VXQ_CUDA_KV_STORE_CVT=0 at start turns it off.
// For A/B measurements and tests; returns the setting it replaces.
bool set_kv_store_hw_convert(bool on);

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

// RoPE of q and k and the store of k and v in one kernel (the decode step's three ops): the
// arithmetic of cuda::rope and store_kv, the same bits. q: [n, n_head, head_dim], k, v: [n,
// n_head_kv, head_dim] (device); q and k are rotated in place.
struct RopeStoreParams {
    float* q;
    float* k;
    const float* v;
    const KvHeadDev* heads;   // as F16StoreParams
    const int64_t* pos0;      // position of token 0 (device)
    int64_t n, n_head, n_head_kv, head_dim, n_rot;
    float theta_scale;        // freq_base^(-2 / n_rot), as cuda::rope computes it
    bool neox;
    KvCode k_code, v_code;
};
void rope_store_kv(const RopeStoreParams& p, cudaStream_t stream);

// ---- decode with -fa: split-K over the tokens ------------------------------------------------
// Few queries (decode) with flash-attention numerics (f32 softmax, f32-exact products): block (KV
// head g, query group, split z) takes 16 rows, the query heads that share g (GQA) of up to
// 16 / group queries, and reads its stretch of g's tokens once for all of them, tile by tile
// (p.tile tokens of keys and of values copied into shared memory with cp.async, p.stages - 1
// more tiles in flight while one is computed). Scores and the weighted sum of values are tensor-core
// MMAs (attention.cu says how q, the keys, the probabilities and the values enter them exactly);
// the readers are templates on the key and the value format (kv_codes.cuh): q8_0 / q4_0 keys are
// scored against the query quantized to q8_0 once per block, as the CPU does; fp8 codes enter as
// the fp16 numbers they are (like f16 pages, from a byte each), the scores times the keys' scale,
// each split's output times the values' scale. Each split writes
// an unnormalized partial (o, max, sum) per row; the last block of (group, g) to finish (an
// arrival counter) merges the splits with their log-sum-exp weights, so the step runs one kernel,
// not two. The split count is fixed per call (a graph argument) and each split's stretch follows
// from the token count on the device, so a captured step stays valid at any depth. Before waiting
// for the previous kernel (PDL) a block prefetches the first keys and values of its stretch into
// L2 (tokens of earlier steps, written before the step began); it lets the next kernel launch only
// after its tiles (waiting blocks of that kernel would hold the SM slots the tiles need). Against
// the one-kernel path: the same products, exponentials of (s - m_split) rescaled by exp(m_split -
// m) instead of exp(s - m): ~1e-7 relative.
//
// With `rope` (one query, the decode step) the kernel also does the step's RoPE + KV store
// (rope_store_kv's arithmetic, the same bits): every block rotates its group's q rows in shared
// memory, the block whose stretch holds the new token's slot rotates k, stores k and v in their
// formats and then reads them like any other token, and the merging block writes the rotated q back
// (every block of the group has read q by then), so memory ends as after the separate ops.
constexpr int kAttnSplitMaxHeadDim = 256;
constexpr int kAttnSplitMaxSplits = 128;
// Splits are planned for the whole context (fixed per shape, so a step's graph holds at any
// depth): about kAttnSplitBlocksPerSm* blocks per SM, rounded up to a power of two (for 8 KV
// heads on 132 SMs: 32 splits for f16 and q8_0 keys, one wave of 256 blocks; 64 for q4_0 keys). A
// split's stretch holds at least kAttnSplitMinTokens tokens, so at a short depth only the first
// splits hold any (the others exit after the RoPE) and the merge reads those alone. The values
// come from vxq_gpu_attention's sweep on the H200 (docs/gpu.md, 2026-12-02: splits 32/64/128 x
// tile 32/64/128 x stages 2-4 at 4K/32K/128K tokens, 32/8 heads of 128): with 64-token tiles in 2
// stages, f16 took 99 / 358 us at 32K / 128K with 32 splits against 115 / 372 with 64; q4_0 84 /
// 285 with 32 against 67 / 209 with 64 (q8_0 88 / 299 against 70 / 218). With the stream form
// (one query; 2026-12-03, second session: 16 / 32 / 64 splits): f16 56 / 183 us with 32 against 72 /
// 198 with 64; q8_0 46 / 138 with 32 against 62 / 155 with 64; q4_0 45 / 115 with 64 against 50 /
// 149 with 32. VXQ_CUDA_ATTN_BLOCKS_PER_SM=N overrides all three.
constexpr int kAttnSplitBlocksPerSmF16 = 1;
constexpr int kAttnSplitBlocksPerSmQ8 = 1;
constexpr int kAttnSplitBlocksPerSmQ4 = 2;
constexpr int kAttnSplitBlocksPerSmFp8 = 1;  // as f16 (not swept)
constexpr int kAttnSplitMinTokens = 16;  // the stretch's granule: a tile starts 16-byte aligned in every format
// The fewest tokens a split holds (SplitAttentionParams::min_stretch; VXQ_CUDA_ATTN_MIN_STRETCH
// overrides it): at a short depth fewer splits hold tokens, so fewer blocks read, write partials
// and are merged. 64: on the H200 (docs/gpu.md, 2026-12-02) 64 f16 tokens took 11.0 us in one
// split against 13.8 in the 4 splits of 16 tokens that the granule alone gave, and Q4_0 8B decode
// at depth 1024 ran 4 % faster than with 16 (level at depth 0).
constexpr int kAttnSplitMinStretch = 64;
// How a query group's n_vis visible tokens are cut: stretches of `per` tokens (whole granules of
// kAttnSplitMinTokens, at least min_stretch rounded up to a granule, and few enough that `splits`
// of them hold all), the first `active` splits holding tokens (0 when n_vis is 0; the last may
// hold fewer). The kernel and the host-side test share it.
struct SplitStretch {
    int64_t per;
    int active;
};
__host__ __device__ inline SplitStretch split_stretch(int64_t n_vis, int64_t splits, int32_t min_stretch) {
    const int64_t g = kAttnSplitMinTokens;
    const int64_t want = (n_vis + splits - 1) / splits;
    const int64_t floor_tokens = ((min_stretch > g ? min_stretch : g) + g - 1) / g * g;
    const int64_t whole = (want + g - 1) / g * g;
    const int64_t per = whole > floor_tokens ? whole : floor_tokens;
    return SplitStretch{per, int((n_vis + per - 1) / per)};
}
// Tiles: p.tile tokens (32, 64 or 128) of keys and of values per shared-memory stage, p.stages
// stages (2 to 4; stages - 1 tiles in flight while one is computed). The backend's choice:
// kAttnSplitTile x kAttnSplitStages, VXQ_CUDA_ATTN_TILE / VXQ_CUDA_ATTN_STAGES override it where the
// layout fits kAttnSplitMaxSmem: dynamic shared memory, below the H100/H200 opt-in limit per block
// (227 KB) by room for the kernel's static shared memory (up to ~10 KB: the merge's weights at
// GQA 8; the launcher checks the sum against the device's limit).
// The same sweep: 64 x 2 was the fastest or within 6 % of it for every format and context at its
// split count (geometric mean 0.78 of the time of 32 x 3, the layout before); more stages cost more
// in blocks per SM (shared memory) than they buy in loads in flight.
constexpr int kAttnSplitTile = 64;
constexpr int kAttnSplitStages = 2;
constexpr int kAttnSplitMaxSmem = 213 * 1024;

struct SplitAttentionParams {
    const float* q;           // [n_q, n_head, head_dim] after RoPE (device); with rope.q: before
    const int64_t* pos0;      // as F16AttentionParams
    const KvHeadDev* heads;   // [n_head_kv] (device)
    float* partial;           // [n_q, n_head, splits, head_dim + 2] scratch: o, then max and sum
    unsigned* arrivals;       // [n_q, n_head_kv] (device, one per query group and KV head used): 0 before the call, 0 after
    float* out;               // [n_q, n_head, head_dim] (device)
    int64_t n_q, n_head, n_head_kv, head_dim;
    int64_t splits;
    float scale;
    RopeStoreParams rope;     // n_q == 1 and rope.q == q: RoPE + KV store fused (above); else rope.q null
    Q8Act out_q8;             // n_q == 1, head_dim a multiple of 32: out also as q8_0 activations (below)
    KvCode k_code, v_code;    // the pages' formats (rope's store uses the same)
    int32_t tile, stages;     // the tiling (above); attention_split_tiling_fits
    int32_t min_stretch;      // tokens a split holds at least (split_stretch rounds it up to whole granules)
    int32_t short_tokens;     // one query seeing at most this many tokens: the short form (below); 0: never
    int32_t stream_stages;    // n_q == 1: the stream form (below) with this many tiles per warp's ring; 0: the tensor-core form
    int32_t stream_mma;       // with stream_stages: 1 runs the stream form on tensor cores (attention_stream_mma_fits must hold)
    int32_t tma_stages;       // > 0: the one-query kernel through a ring of bulk copies, this deep (below; attention_stream_tma_fits)
};
//
// With out_q8 (one query) the merging block also quantizes its query heads' rows of out to q8_0
// (the quantize kernel's bits, q8_act.cuh), for a Q8_0/Q4_0 output projection that then needs no
// quantize kernel (GemvFusion::x_q8).
//
// The short form: one query (n_q == 1) that sees at most p.short_tokens tokens (at most
// attention_split_short_cap(p), a multiple of kAttnSplitMinTokens) is taken by the first split of
// each KV head alone; the other splits exit at once, and no partial, arrival counter or merge is
// used, so a decode step over a short context is a short chain: the block copies all the head's
// keys and values into shared memory (with `rope`, before waiting for the previous kernel: they
// were written by earlier steps, and the new token's row, written by this kernel, is encoded into
// shared memory by the block itself instead of being read back), then scores every token (four
// lanes per token, each a quarter of the row, added by shuffles) and sums the values (a thread per
// channel pair and token group, the groups added by shuffles) in f32 FMAs: the products of the
// split form's MMAs (q8_0 / q4_0 keys: the same q8_0 query and exact int32 block dots, times d_k *
// d_q), summed in another order (~1e-7 relative). The RoPE's angles are computed before the wait
// (the position is in the step block), and q and the new key are loaded in one batch after it. On
// the H200, with the GEMVs' weights evict-first in L2 (gemv.cu), Q4_0 8B decode from an empty
// cache ran 8 % faster with it than without (440-446 against 406-408 t/s; docs/gpu.md, 2026-12-02,
// fourth session); these parallel loops (against a thread per token and per channel) made Q4_0 3 %
// and F16 1.4 % faster (sixth session).
// VXQ_CUDA_ATTN_SHORT=N sets the backend's threshold (0: off).
constexpr int kAttnShortTokens = 128;
//
// The stream form: one query (decode) over more tokens than the short form takes, head_dim 64,
// 128 or 256, with p.stream_stages in [1, 4] (1: a warp waits for each tile it issues; the
// block's other warps compute meanwhile). No tensor cores and no block-wide barrier in the
// loop: each of the block's 4 warps streams its own tiles of the split's stretch (16 f16 or fp8
// tokens or 32 q8_0 / q4_0 tokens a tile, copied with cp.async into a ring of stream_stages tiles
// of its own) and keeps the online softmax of the group's query heads in registers; the four
// warps' states are merged into the split's partial at the end (attention.cu says how each format
// is read). The tensor-core form spends 12 of its 16 MMA rows on padding at one query and
// synchronizes the block several times per tile; on the H200 it read 13-35 % of the copy bandwidth at 32K-128K
// tokens (docs/gpu.md); the stream form 1.5-2.0x faster on the same shapes (docs/gpu.md, session
// of 2026-12-03 (second)). VXQ_CUDA_ATTN_STREAM=0 turns the stream form off, =N forces N stages.
// The default ring: 2 tiles per warp. On the H200 (32 / 8 heads of 128, 4K / 32K / 128K tokens)
// 2 stages at the default split counts beat 3 and 4 in every format: deeper rings hold more shared
// memory than two (f16, q8_0) or four (q4_0) blocks per SM leave, and the split count's grid then
// runs in waves; 3 stages only paid off with half the splits (one block per SM).
constexpr int kAttnStreamStages = 2;
//
// The stream form on tensor cores (p.stream_mma, attention_stream_mma_fits: f16 / fp8 keys and
// values, head_dim 64 or 128): each warp reads its 16-token tiles from global memory straight into
// registers laid out as the MMAs' fragments (its next tiles requested into L2 by one bulk prefetch
// each, no ring), scores q hi / lo against the keys and sums P hi / lo times the values on tensor
// cores (attention.cu says how the operands are laid out): the ring form's per-token f32 FMAs
// (~20 instructions per token and lane) become 2 MMAs per token and warp. The same f32-exact
// products, f32 sums in another order. The backend takes it where a side is fp8 (on the H200 fp8
// at 32K / 128K tokens: 43 / 123 us against the ring's 59 / 194; f16: 60 / 190 against 59 / 184);
// VXQ_CUDA_ATTN_STREAM_MMA=1 takes it for f16 too, =0 never.
bool attention_stream_mma_fits(const SplitAttentionParams& p);
// The backend's choice for p (stream_stages set): on tensor cores where a side is fp8 and it fits.
inline bool attention_stream_mma_default(const SplitAttentionParams& p) {
    return (p.k_code == KvCode::FP8 || p.v_code == KvCode::FP8) && attention_stream_mma_fits(p);
}
//
// The stream form through bulk copies (p.tma_stages > 0, attention_stream_tma_fits: one query, f16 /
// fp8 keys and values or q8_0 / q4_0 keys and values, head_dim 64 or 128, p.short_tokens 0): a
// kernel of its own (the split kernel's other forms reserve ~90 KB of shared memory and more
// registers a block, which left 8 warps per SM with one tile in flight each), 4 warps and two
// blocks per SM. Each warp keeps a ring of p.tma_stages tiles of up to 8 KB of keys and values
// (whole 16-token tiles: 16 f16 tokens of 128 dims, 32 fp8, 48 q4_0, 16 q8_0 ones) in
// shared memory, requested by its lane 0 as one bulk copy of keys and one of values (the TMA unit,
// completing on an mbarrier per stage: no load instructions or registers held for the bytes in
// flight), p.tma_stages - 1 tiles ahead of the one it computes with the tensor-core stream form's
// arithmetic (the same products and sums, q's fragments in registers; q8_0 / q4_0 pages: the keys'
// codes against the query's q8_0 codes on int8 MMAs, the exact block dots times d_k d_q as the other
// forms, and the values' codes as exact fp16 numbers against P d_v split hi / lo, attention.cu).
// Tiles of tokens stored by earlier steps are requested before the wait for the previous kernel. The RoPE + store, the
// partials, the merge and the q8_0 output as the split kernel. The backend takes it for one query
// once the context is past the short form's (p.short_tokens then 0: a step's graph changes form
// once); VXQ_CUDA_ATTN_TMA=0 turns it off, =N sets the ring's depth for every format.
constexpr int kAttnTmaStages = 3;
// Its plan by the keys' format. q4_0 / fp8: rings of kAttnTmaStages, about kAttnTmaBlocksPerSm
// blocks per SM (a power of two, at most kAttnSplitMaxSplits): 32 splits for 8 KV heads on 132
// SMs (256 blocks, one wave at two an SM). On the H100 (docs/gpu.md, 2026-12-05, sixth session)
// q4_0 pages at 32K / 128K tokens took 29.7 / 75.7 us with 32 splits against 39.8 / 86.7 with the
// split kernel's q4_0 plan of 64, q8_0 39.0 / 120.9 against 49.8 / 145.5. q8_0: the same splits,
// rings of 4 (34.6 / 108.6 us against 37.8 / 115.6 with 3). f16: rings of 4 and a block per SM
// (the largest power of two of splits whose blocks the SMs hold one each: 16 for 8 KV heads),
// 51.1 / 179.0 us against 53.6 / 184.1 with 32 splits and rings of 3, which leave some SMs two
// blocks and others one (H100, second session of 2026-12-06). VXQ_CUDA_ATTN_BLOCKS_PER_SM=N
// overrides the splits as for the other forms.
constexpr int kAttnTmaBlocksPerSm = 1;
int64_t attention_stream_tma_splits(int64_t n_head_kv, KvCode k_code);
int attention_stream_tma_stages(KvCode k_code);
// The page formats and head sizes the bulk-copy kernel has instances for (f16 / fp8 keys and
// values, or q8_0 / q4_0 keys and values; head_dim 64 / 128); attention_stream_tma_fits checks them
// and the rest of p.
bool attention_stream_tma_formats(KvCode k, KvCode v, int64_t head_dim);
bool attention_stream_tma_fits(const SplitAttentionParams& p);
// Whether the stream form takes p (one query, head_dim 64 / 128 / 256, p.stream_stages in [1, 4], fits
// kAttnSplitMaxSmem), and the default stages for p's shape and formats (0: it does not take it).
bool attention_stream_fits(const SplitAttentionParams& p);
int32_t attention_stream_stages(const SplitAttentionParams& p);
// Whether the split kernel takes this shape (GQA group, head_dim) and these formats.
bool attention_split_fits(int64_t n_head, int64_t n_head_kv, int64_t head_dim, KvCode k_code, KvCode v_code);
// Whether the split kernel can take `rope` with the attention of p (one query, one new token, the
// same heads and head_dim, full rotation pairs within head_dim).
bool attention_split_rope_fits(const SplitAttentionParams& p, const RopeStoreParams& rope);
// Whether the split kernel can write out as q8_0 for p (one query, head_dim a multiple of 32).
bool attention_split_q8_fits(const SplitAttentionParams& p);
// Splits for a call: kAttnSplitBlocksPerSm* blocks per SM by the key format (a power of two, at most kAttnSplitMaxSplits).
int64_t attention_splits(int64_t n_q, int64_t n_head_kv, KvCode k_code);
// Dynamic shared memory of a call, and whether p.tile / p.stages are valid and fit kAttnSplitMaxSmem.
size_t attention_split_smem(const SplitAttentionParams& p);
bool attention_split_tiling_fits(const SplitAttentionParams& p);
// The most tokens the short form holds in p's shared memory (p's tiling, shape and formats), at most kAttnShortTokens.
int32_t attention_split_short_cap(const SplitAttentionParams& p);
size_t attention_split_scratch_floats(int64_t n_q, int64_t n_head, int64_t head_dim, int64_t splits);
void attention_split(const SplitAttentionParams& p, cudaStream_t stream);

// ---- prefill: flash-style (attention_prefill.cu) ----------------------------------------------
// A batch of >= kAttnPrefillMinQueries queries (the backend's threshold; VXQ_CUDA_ATTN_PREFILL_MIN
// sets it) over a cache in any of the token-wise formats, head_dim 64 or 128, with flash-attention
// numerics: flash_prefill.cuh's blocks of 64 (query, head) rows of one KV head on tensor cores,
// each 32-token tile of keys and values read from the pages and converted once per block (against
// once per 4 queries in the split kernel, and no n_q x n_kv score matrix as the cuBLAS path
// writes). Keys: f16 and fp8 as fp16 numbers against q hi / lo (fp8: the score times the keys'
// scale); q8_0 / q4_0 as int8 codes against q quantized to q8_0 per row (the CPU reader's
// prepare_query), m16n8k32 integer MMAs per 32-block times d_k d_q, summed in f32 (the split
// kernel's products). Values: f16 and fp8 as fp16 numbers (fp8: the output times the values'
// scale); q8_0 / q4_0 as hi / lo halves of code * d (exact in f32). It reads p's q, pos0, heads,
// out, shape, scale and formats; writes out directly (no partials, no merge).
constexpr int64_t kAttnPrefillMinQueries = 64;
bool attention_prefill_fits(int64_t n_head, int64_t n_head_kv, int64_t head_dim, KvCode k_code, KvCode v_code);
void attention_prefill(const SplitAttentionParams& p, cudaStream_t stream);

// ---- prefill: batched cuBLAS GEMMs ----------------------------------------------------------
// Per query head h (KV head g = h / (n_head / n_head_kv)), one batch entry of each GEMM:
//   S_h = Q_h K_g^T                       [n_q, n_kv] f32: every query against every stored token
//   P_h = softmax(scale S_h), causal      [n_q, n_kv]: 0 past a query's position
//   O_h = P_h V_g                         [n_q, head_dim] f32, into out
// Keys and values are read in place from the pages. Tensor cores multiply fp16 numbers, so q and
// P are fp16 on the GEMMs' input side:
//   -fa: each is split into hi = fp16(x) and lo = fp16((x - hi) * kAttnLoScale), and each GEMM
//     runs twice: hi (beta 0), then lo with alpha 1 / kAttnLoScale (beta 1). x - hi is exact in
//     f32; the power-of-two scale keeps lo out of fp16's subnormals (x - hi is about 2^-12 x) and
//     is undone exactly, so hi + lo / kAttnLoScale is x within 2^-22 |x| + 2^-36. Products of fp16
//     numbers are exact in f32 and cuBLAS sums them in f32 (CUBLAS_COMPUTE_32F): f32 numerics
//     up to the summation order and the split's 2^-22. |q| must stay below 65504 (fp16's range).
//   without -fa (round_f16): q and P rounded to fp16, llama.cpp's non-flash numerics; hi only.
// The softmax is the decode kernel's: s = dot * scale, m = max, e = expf(s - m), p = e * float(1 /
// double(sum)) (ggml's), over the tokens a query sees; a query that sees none gets a zero row.
// The GEMMs cover n_kv tokens, so every head must hold n_kv tokens (the backend checks it).
// Scratch (one device buffer, attn_gemm_layout): q hi/lo, the scores [n_head, n_q, stride] f32,
// P hi/lo [n_head, n_q, stride] fp16 and the cuBLAS workspace; the batched GEMMs' operand
// pointers are a device array the caller fills from attn_gemm_operands (the backend puts it in
// its step block).
constexpr int64_t kAttnGemmMinQueries = 16;
constexpr float kAttnLoScale = 2048.0f;  // 2^11: lo = (x - hi) * 2^11 is about as large as hi's last bit
constexpr size_t kAttnCublasWorkspaceBytes = size_t(32) << 20;  // cuBLAS's recommendation for Hopper

struct F16AttentionGemmParams {
    const float* q;              // [n_q, n_head, head_dim] after RoPE (device)
    const int64_t* pos0;         // position of query 0 (device); query i sees positions <= pos0 + i
    const KvHeadDev* heads;      // [n_head_kv] (device); every head holds n_kv tokens
    const void* const* operands; // [kAttnGemmOperands, n_head] (device): attn_gemm_operands' pointers
    void* scratch;               // attn_gemm_layout(*this).total bytes (device), 256-byte aligned
    float* out;                  // [n_q, n_head, head_dim] (device), 16-byte aligned
    int64_t n_q, n_head, n_head_kv, head_dim;
    int64_t n_kv;                // tokens of every head: the GEMMs' token range
    int64_t stride;              // elements per score / probability row: >= n_kv, a multiple of 8
    float scale;                 // 1 / sqrt(head_dim)
    bool round_f16;              // as F16AttentionParams (false: the hi/lo split)
};

// Byte offsets into the scratch, each 256-byte aligned; q_lo and p_lo are empty with round_f16.
struct AttnGemmLayout {
    size_t q_hi, q_lo;      // [n_q, n_head, head_dim] fp16 (q's layout)
    size_t scores;          // [n_head, n_q, stride] f32
    size_t p_hi, p_lo;      // [n_head, n_q, stride] fp16
    size_t workspace;       // kAttnCublasWorkspaceBytes for cuBLAS
    size_t total;
};
AttnGemmLayout attn_gemm_layout(const F16AttentionGemmParams& p);

// Whether the GEMM path takes a call of this shape: n_q >= kAttnGemmMinQueries, n_kv >= 1, every
// GEMM dimension within cuBLAS's int (and n_head * n_q, the softmax's grid), and 16-byte aligned
// operands (head_dim and stride multiples of 8, out 16-byte aligned): cuBLAS cannot see the
// alignment of the pointers it reads from device memory.
bool attention_gemm_fits(int64_t n_q, int64_t n_head, int64_t head_dim, int64_t n_kv, int64_t stride, const float* out);

// The GEMMs' operands, one array of n_head pointers each (operands[o * n_head + h]).
enum AttnGemmOperand : int { kOpKeys, kOpValues, kOpQHi, kOpQLo, kOpScores, kOpPHi, kOpPLo, kOpOut, kAttnGemmOperands };
// Fills ptrs[kAttnGemmOperands * n_head] from a host copy of the heads table (each head's key and
// value page addresses), p.scratch and p.out (p.operands is not read).
void attn_gemm_operands(const F16AttentionGemmParams& p, const KvHeadDev* heads_host, const void** ptrs);

// One cublasGemmBatchedEx call (cuBLAS's column-major terms; a, b, c name operand arrays):
// C = alpha op(A) op(B) + beta C, op(A) m x k, op(B) k x n, A/B fp16, C f32, batch n_head.
struct AttnGemmCall {
    cublasOperation_t trans_a, trans_b;
    int m, n, k;
    float alpha, beta;
    AttnGemmOperand a, b, c;
    int lda, ldb, ldc;
};
// The calls in launch order: calls[0, n_scores) before the softmax, calls[n_scores, n_calls) after.
struct AttnGemmPlan {
    AttnGemmCall calls[4];
    int n_scores, n_calls;
};
AttnGemmPlan attn_gemm_plan(const F16AttentionGemmParams& p);

// The prefill attention's device scratch and its own cuBLAS handle: a GemvScratch. Grows, never
// shrinks; reserving attn_gemm_layout(p).total (which holds a cuBLAS workspace) also creates the
// handle, after which attention_f16_gemm allocates and creates nothing and can be captured in a
// CUDA graph.
using AttnGemmScratch = GemvScratch;

// p.scratch is s.buf, reserved for p; p.operands holds attn_gemm_operands(p, ...) by launch time.
void attention_f16_gemm(const F16AttentionGemmParams& p, AttnGemmScratch& s, cudaStream_t stream);

}  // namespace vxq::cuda

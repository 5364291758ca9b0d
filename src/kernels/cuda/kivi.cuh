// KIVI caches in device memory (METHODS.md "KIVI"; layout kv/formats/kivi.h): the store, which
// encodes what a write flushes (keys per channel over G tokens, values per token over G channels)
// and puts the rest in each stream's fp16 window, bit-exact with the CPU codec; and a split-K
// attention that reads the packed codes and the windows in place, for any number of queries.
//
// A write follows the cache's plan (KvCache::reserve_write, kv_view.h): the tokens it encodes
// are the window's oldest and then new ones, rounded to fp16 as the window holds them; new tokens
// that are not encoded go into the window. The encoder reads old window slots that the window
// write may overwrite, so a large write is two kernels in this order (the default layout's
// encoder keeps a group in registers, others stage tokens in shared memory) and a decode step's
// one kernel encodes first (a step whose keys flush nothing: one round of loads). The plan
// and every address are in device memory (the step block), so a captured decode step stays valid
// as the cache grows; the grids depend on the batch size and the codec's options only.
//
// The attention: block (split, KV head, query) takes its stretch of the tokens the query sees and
// all the query heads of the KV head (GQA <= 8); each of its 4 warps takes every 4th 32-token
// tile (its bytes through a 2-stage cp.async ring in shared memory), keeps an online softmax and
// writes its state; the block merges its warps into a partial (o, max, sum) and a second kernel
// merges the splits' partials. Two forms:
//   tensor cores  2- and 4-bit keys and values, head_dim 64 or 128, G a multiple of 32 (values'
//                 G of 16): the tiles where keys lie in one packed block and values are packed.
//                 Codes are exact fp16 numbers of m16n8k16 MMAs: scores = codes x (q * s per
//                 channel, split into fp16 hi + lo: mma.cuh), values = codes^T x (p * s per token
//                 and row, split alike), the zeros' terms on the side (sum_c q z per key block,
//                 sum_t p z by an MMA of the zeros against p per tile); a split a 32-token tile
//                 after them takes the rest (the fp16 windows, tokens whose key or value is still
//                 in one, a partial tile) with the whole block: the tile's
//                 keys and values staged as f32 in shared memory (packed ones dequantized, all
//                 loads in flight at once), then a warp per 8 tokens.
//   SIMT          everything else: keys of a tile inside one packed block as sum_c (q_c s_c)
//                 code_c,t + sum_c q_c z_c by a lane per token (q * s per channel once per tile);
//                 other keys (the window, G < 32) a lane per token element by element; values a
//                 lane per channel run, fma(code, s, z) per value (exact: kivi.h).
// A batch of >= 64 queries (a prompt chunk; head_dim 32, 64, 96 or 128) takes a third, flash-style
// form instead: block (query block, KV head) holds 64 rows (query, head) on tensor cores, stages
// each 32-token tile of keys and values once for all of them (any layout: packed tokens
// dequantized, window tokens as they are, split into fp16 hi + lo) and writes out normalized, no
// partials or merge (kivi.cu, "prefill").
// All f32 in the end (the tensor cores add in f32): dequantize-then-attend within ~1e-6
// relative (other summation orders).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/q8_act.cuh"
#include "kv/kv_view.h"

namespace vxq::cuda {

struct KiviFormatDev {
    // Keys of bits 0 are encoded by another kernel before the store (QJL's, qjl_kv.cuh): the
    // store writes their window only (group 32, block_bytes theirs).
    int32_t bits, group, rows;  // rows: keys head_dim, values ceil(head_dim / group)
    int32_t block_bytes;        // keys: a block of `group` tokens; values: one token
    int32_t slots;              // ring slots of the fp16 window
};

// One KV head as the KIVI kernels read it (device table).
struct KiviHeadDev {
    uint64_t k, v;                // packed blocks: key block b at k + b * block_bytes, value token t at v + t * block_bytes
    uint64_t kw, vw;              // fp16 rings: slot s at kw + s * head_dim * 2
    int64_t n_tokens;             // stored tokens
    int64_t k_packed, v_packed;   // of which in packed blocks: [0, packed)
    int64_t k_head, v_head;       // ring slot of stored token `packed`
};

// A stream's format and a head's table entry, from the cache's view (host side).
inline KiviFormatDev kivi_format(const KvStreamView& s) {
    return KiviFormatDev{s.fmt.bits, s.fmt.group, int32_t(s.fmt.rows), int32_t(s.fmt.block_bytes), int32_t(s.ring_slots)};
}
inline KiviHeadDev kivi_head(const KvHeadView& h) {
    const auto addr = [](const void* p) { return uint64_t(reinterpret_cast<uintptr_t>(p)); };
    return KiviHeadDev{addr(kv_packed_blocks(h.k)), addr(kv_packed_blocks(h.v)), addr(h.k.ring), addr(h.v.ring),
                       h.n_tokens, h.k.n_packed, h.v.n_packed, h.k.ring_head, h.v.ring_head};
}

// A decode step's RoPE of q and of the new key, done by the store kernel before it encodes (the
// arithmetic of cuda::rope, rope.cuh: the same bits), so the step's KIVI layer launches no RoPE
// kernels. Each block (KV head g) rotates q's rows of g's query heads and k's row of g in place,
// the angles computed before it waits for the previous kernel (the position is in the step block).
struct KiviRope {
    float* q;                   // [n_head, head_dim] (device); null: no RoPE here
    float* k;                   // the store's k, rotated in place
    const int64_t* pos0;        // the token's position (device)
    int64_t n_head, n_rot;      // n_rot <= head_dim, even
    float theta_scale;          // freq_base^(-2 / n_rot), as cuda::rope computes it
    int32_t neox;
};

struct KiviStoreParams {
    const float* k;             // [n, n_head_kv, head_dim] after RoPE (device)
    const float* v;
    const KiviHeadDev* heads;   // [n_head_kv] (device): the addresses
    const KvWindowWrite* plan;  // [2] (device): keys, values
    int64_t n, n_head_kv, head_dim;
    KiviFormatDev kf, vf;
    KiviRope rope;              // n == 1: the step's RoPE of q and k before the store (k before RoPE then); else q null
    // The plan's bounds, where the host passes them (plan_bounds nonzero; kivi_store_bounds): the
    // tokens encoded (the more of keys' and values'), the first new token a window takes (n:
    // none). The store's grids then fit them; else grids for any plan (a captured decode step's
    // plan changes from step to step in the step block, its parameters do not).
    int64_t plan_bounds, encoded_most, window_first;
};
// Sets p's plan bounds from the plan the host wrote into p.plan (writes of more than
// kKiviSmallWrite tokens: a decode step's store keeps parameters that do not change with it).
constexpr int64_t kKiviSmallWrite = 8;  // tokens a write may have for the one-kernel store
inline void kivi_store_bounds(KiviStoreParams& p, const KvWindowWrite& k, const KvWindowWrite& v) {
    if (p.n <= kKiviSmallWrite) return;
    const auto window_first = [&](const KvWindowWrite& w) { return std::max<int64_t>(0, w.encoded - w.pending); };
    p.plan_bounds = 1;
    p.encoded_most = std::max(k.encoded, v.encoded);
    p.window_first = std::min(window_first(k), window_first(v));
}
void kivi_store(const KiviStoreParams& p, cudaStream_t stream);

// A decode step's store inside the attention (the step's one token; set by the backend where the
// store would take its short path: keys flush nothing, and the values' token it would encode was
// packed ahead by the step before). The heads' table is the state after the store; the new token
// (stored token n_tokens - 1) is not yet in the windows: the tail block that reads it takes its
// key (RoPE applied) and value from k and v, rounds them to fp16 as the window holds them and
// writes them to their ring slots. q comes before RoPE: every block rotates its rows as it reads
// them (rope.cuh's arithmetic, as the store kernel's: the same bits). The merge kernel then leaves
// q and k rotated in place, as the store kernel leaves them.
struct KiviFresh {
    float* q;                   // the attention's q (p.q) before RoPE, rotated in place by the merge kernel
    float* k;                   // [n_head_kv, head_dim] the new key before RoPE, alike; null: no fused store
    const float* v;             // [n_head_kv, head_dim]
    const int64_t* pos0;        // the token's position (device; the step block)
    int64_t n_rot;              // even, <= head_dim, <= 2 kKiviMaxRopePairs; 0: no RoPE
    float theta_scale;          // freq_base^(-2 / n_rot), as cuda::rope computes it
    int32_t neox;
    // Nonzero: each tensor-core warp's first tile is copied before the PDL wait. Safe here: no
    // kernel of the step writes packed blocks before this one (no store kernel runs; the values'
    // token was encoded ahead by the step before's merge kernel, a kernel boundary ago).
    int32_t early;
};
constexpr int kKiviMaxRopePairs = 128;  // head_dim <= 256

struct KiviAttentionParams {
    const float* q;             // [n_q, n_head, head_dim] after RoPE (device); before it where fresh.k is set
    const KiviHeadDev* heads;   // [n_head_kv] (device); query i sees the first n_tokens - n_q + i + 1 tokens
    float* partial;             // [n_q, n_head, parts, head_dim + 2] scratch (kivi_attention_scratch_floats): o, max, sum
    float* out;                 // [n_q, n_head, head_dim] (device)
    int64_t n_q, n_head, n_head_kv, head_dim, splits;
    float scale;
    KiviFormatDev kf, vf;
    int64_t simt;               // nonzero: the SIMT form alone (the benchmark's comparison)
    int64_t prefill_min;        // queries from which a batch takes the prefill form (0: kKiviPrefillMinQueries)
    int64_t parts;              // partials per (query, head): set by kivi_attention
    int64_t blocks_per_sm;      // the tensor-core form at GQA <= 4: 0 the default (4 blocks an SM at 128
                                // registers a thread), 5 (96 registers: 20 warps an SM to issue from)
    KiviFresh fresh;            // a decode step's store done here (n_q == 1, the tensor-core form)
    // One query (a decode step): the merge kernel also encodes the values' oldest window token
    // where the next step's store would encode it (the window holds slots - 1 tokens), into its
    // packed block: no block of this step reads that block, and the next step's attention can
    // then take the fused store (fresh) without encoding anything. Bit for bit the store's
    // encoding; a store that encodes the token again writes the same bytes.
    int64_t pack_ahead;
    // Where set: each tensor-core warp that did its stretch again in the SIMT form (a B part
    // overflowed) adds 1, so that a test tells which form gave its output and the backend reports
    // the slow path at exit.
    int* fallbacks;
    // The L2 priority of the tensor-core form's straight tile copies (both streams in groups of
    // 32): nonzero, evict-first. A layer's codes are read once a step, and at long contexts the
    // layers' codes together are far past L2, so no line of them is read from there again; with
    // the normal priority they stay at the expense of lines that are (which ones was not
    // measured). On an H100, synthetic Llama-3-8B Q4_0: kivi-2 decode +3.2 % at 32K, +4.6 % at
    // 128K, level at 1K (docs/gpu.md, seventh session of 2026-12-07). Zero: plain copies, no policy
    // (the backend's default until this form's device tests pass; VXQ_CUDA_KIVI_EVICT_FIRST=1).
    int32_t tiles_evict_first;
    // Where set (qs non-null): the merge also writes out as q8_0 activations (q8_act.cuh, the
    // quantize kernel's bits), each of its blocks one q8_0 block of 32 channels, so that a
    // Q8_0 / Q4_0 output projection reading out runs no quantize kernel (backend_cuda.cpp's
    // q8_handoff; as the split attention does). Not with the prefill form, which has no merge.
    Q8Act out_q8;
    // Where set: no merge kernel. The block that writes the last of (query i, KV head g)'s
    // partials (counted here, [n_q][n_head_kv], zero between launches: the merger leaves its
    // counter at 0) merges them into out (and out_q8) for g's query heads, leaves q and k rotated
    // after a fused store, and a decode step's value token encoded ahead (pack_ahead) is encoded
    // by one block of each KV head before its wait. Checked in the SIMT emulator only so far; the
    // backend sets it with VXQ_CUDA_KIVI_MERGE_INSIDE=1.
    unsigned* arrivals;
    // Nonzero: the merge kernel lets the next kernel launch once its blocks are resident
    // (pdl_launch_dependents after its wait), else at its end (the backend's default until this
    // has run on a GPU; VXQ_CUDA_KIVI_MERGE_EARLY=1).
    int32_t merge_launch_early;
};
// GQA group <= 8, head_dim a multiple of 32 up to 256.
bool kivi_attention_fits(int64_t n_head, int64_t n_head_kv, int64_t head_dim);
// Splits for p's queries (p: n_q, n_head, n_head_kv, head_dim, kf, vf, simt, blocks_per_sm set):
// one query on tensor cores takes what leaves one wave of kivi_blocks_per_sm(p) blocks an SM with
// its tail splits; else about 4 blocks per SM for one query, fewer as queries add blocks.
int64_t kivi_attention_splits(const KiviAttentionParams& p);
// Whether kivi_attention takes the tensor-core form for these formats and head_dim (unless asked
// for the SIMT form alone: p.simt).
bool kivi_tensor_cores(int64_t head_dim, const KiviFormatDev& kf, const KiviFormatDev& vf);
inline bool kivi_tensor_cores(const KiviAttentionParams& p) { return !p.simt && kivi_tensor_cores(p.head_dim, p.kf, p.vf); }
// Whether p (n_q, n_head, n_head_kv, head_dim, kf, vf, simt, blocks_per_sm set) can take a decode
// step's store inside (KiviFresh): one query in the tensor-core form at 4 blocks an SM.
bool kivi_fused_store_fits(const KiviAttentionParams& p);
// Blocks an SM the attention kernel runs at for p: 5 where p.blocks_per_sm asks for it and p takes
// the tensor-core form with one n-tile (GQA <= 4), else 4.
int kivi_blocks_per_sm(const KiviAttentionParams& p);
// Partials per (query, head): the splits, and the tensor-core form's tail splits (the windows and
// a partial tile, a 32-token tile each). p: n_q, n_head, head_dim, splits, kf, vf, simt set.
int64_t kivi_attention_parts(const KiviAttentionParams& p);
// Whether p takes the prefill form (>= p.prefill_min queries, head_dim 32 / 64 / 96 / 128, not
// p.simt). Fewer queries take the per-query forms, whose grid has a block per query and split: at
// a few queries over a long context the prefill form's one block per 64 rows would leave most SMs
// idle. 64: a chunk of 16 queries at GQA 4 per block keeps a 512-token chunk's 256 blocks (8 KV
// heads) on the H200's 132 SMs.
constexpr int64_t kKiviPrefillMinQueries = 64;
bool kivi_prefill(const KiviAttentionParams& p);
// The partials' scratch (p as kivi_attention_parts; none for the prefill form).
size_t kivi_attention_scratch_floats(const KiviAttentionParams& p);
void kivi_attention(const KiviAttentionParams& p, cudaStream_t stream);

}  // namespace vxq::cuda

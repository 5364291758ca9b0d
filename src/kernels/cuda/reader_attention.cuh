// The split-K decode attention of the codecs whose blocks only their own reader can read in place
// (reader_attention_kernels.cuh): one kernel templated on a reader policy that says how a 32-token
// tile's keys are scored and its values read, how the query is prepared once per block (rotated,
// sketched) and how the merged output is mapped back once per (query, head). The rotated-domain
// codecs (rotated_kv.cuh: TurboQuant, VecInfer) and QJL (qjl_kv.cuh) are its readers. Here: its
// parameters and its plan (rows a block, splits, scratch), host side.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/check.cuh"

namespace vxq::cuda {

// head_dim a multiple of 32 up to this (the readers' shared buffers); splits up to kReaderMaxSplits.
constexpr int64_t kReaderMaxHeadDim = 256;
constexpr int kReaderMaxSplits = 128;

// KF / VF: the keys' and values' device formats; Head: a KV head's table entry (KvHeadDev for
// token-wise pages, KiviHeadDev where an fp16 window sits beside the blocks).
template <class KF, class VF, class Head>
struct ReaderAttentionParams {
    const float* q;             // [n_q, n_head, head_dim] after RoPE (device)
    const Head* heads;          // [n_head_kv]; query i sees the first n_tokens - n_q + i + 1 tokens
    float* partial;             // [n_q, n_head, splits, head_dim + 2] scratch: o (the reader's domain), max, sum
    float* out;                 // [n_q, n_head, head_dim] (device)
    int64_t n_q, n_head, n_head_kv, head_dim, splits;
    float scale;
    int32_t pad;                // (every field 8 bytes wide in pairs: the bytes key a captured graph)
    KF kf;
    VF vf;
};

// GQA group <= 8, head_dim a multiple of 32 up to kReaderMaxHeadDim.
bool reader_attention_fits(int64_t n_head, int64_t n_head_kv, int64_t head_dim);
// The rows (query, query head) of an attention block: a decode step's one query and its GQA group
// (rounded up to a power of two), a batch's 8 / group queries of it (each cached tile is read
// once for all of them).
constexpr int reader_rows_per_block(int64_t n_q, int64_t group) {
    return n_q > 1 ? 8 : group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8;
}
// The attention's blocks along the queries.
constexpr int64_t reader_query_blocks(int64_t n_q, int64_t group) {
    const int64_t qb = reader_rows_per_block(n_q, group) / group;
    return (n_q + qb - 1) / qb;
}
// Splits over the tokens: about 4 blocks per SM for one query, fewer as query blocks add blocks.
int64_t reader_attention_splits(int64_t n_q, int64_t n_head, int64_t n_head_kv);
inline size_t reader_attention_scratch_floats(int64_t n_q, int64_t n_head, int64_t head_dim, int64_t splits) {
    return size_t(n_q * n_head * splits * (head_dim + 2));
}
// A launcher's check of p (the shape fits, the formats' head_dim is p's, the splits in range):
// cudaErrorInvalidValue naming `what` otherwise.
template <class P>
void check_reader_attention(const P& p, const char* what) {
    if (!reader_attention_fits(p.n_head, p.n_head_kv, p.head_dim) || p.kf.d != p.head_dim || p.splits < 1 ||
        p.splits > kReaderMaxSplits) {
        throw_cuda_error(cudaErrorInvalidValue, what, __FILE__, __LINE__);
    }
}

}  // namespace vxq::cuda

// QJL caches in device memory (METHODS.md "QJL"; layout and scalar reference kv/formats/qjl.h):
// keys in blocks of 32 tokens (outlier channels, the two parts' fp16 norms, sign(S k_in) and
// sign(S_o k_out)), values KIVI-2 per token (kv/formats/kivi.h), each stream with KIVI's fp16
// window of the newest tokens (the same ring and write plan as kivi.cuh).
//
// The store is two kernels. qjl_key_store encodes the key blocks a write flushes, as
// qjl::encode does, the same operations in the same order so the bytes are the CPU codec's:
// block (32 write-local tokens, KV head) stages the tokens as the window holds them (fp16), each
// channel's sum of squares over the block in double in token order (a thread per channel), the
// outliers as the first O channels of a stable descending sort (a NaN sum counts as +inf; a warp
// picks the largest, lowest channel first, O times), each token's two norms in double in channel
// order, and sign(S k_in) / sign(S_o k_out) as f32 dot products in channel order (a lane per
// token, a warp per 8 sketch rows: one byte of every token). Then kivi_store in its keys-elsewhere
// form (KiviFormatDev::bits = 0) encodes the values and writes both windows (kivi.cuh).
//
// The attention is the reader-policy split-K kernel (reader_attention.cuh) with QjlReader
// (qjl_kv_kernels.cuh): the query scaled and sketched once per block (u = S q, the one m x d
// product), then per 32-token key block (one tile) the block's corrections from its O outlier
// columns (S q_in = u - sum_{c in O} q_c S[:, c], S_o q_out = sum_{c in O} q_c S_o[:, c]: O (m + m_o)
// multiply-adds per row), and a token per lane scored from its packed signs:
// (sqrt(pi/2)/m) ||k_in|| <S q_in, sign> + (sqrt(pi/2)/m_o) ||k_out|| <S_o q_out, sign_o>. Window
// keys are read as fp16; values fma(code, scale, zero) per channel from the packed token or fp16
// from the window. f32 throughout: dequantize-then-attend (qjl::decode's estimator vector) within
// ~1e-6 relative (other summation orders).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "kernels/cuda/kivi.cuh"
#include "kernels/cuda/reader_attention.cuh"
#include "kernels/cuda/rotated_kv.cuh"

namespace vxq::codecs::qjl {
struct State;
}

namespace vxq::cuda {

// The keys' format on the device: a layer's qjl::State (its two sketches, row-major and
// transposed, in one device allocation: QjlStateCopy) and the block layout.
struct QjlFormatDev {
    int32_t d, m, mo, outliers;   // mo = 0 without outliers
    int32_t block_bytes, slots;   // slots: the key window's ring (set by the backend)
    int32_t norm_in, norm_out;    // bytes into a block: the fp16 norms of the 32 tokens
    int32_t signs_in, signs_out;  // ... and their sign bits (m / 8, m_o / 8 bytes a token)
    float scale_in, scale_out;    // sqrt(pi/2) / m, sqrt(pi/2) / m_o
    const float* s_in;            // S   [m, d] (the store: a warp reads one row)
    const float* s_out;           // S_o [m_o, d]
    const float* t_in;            // S^T [d, m] (the attention: adjacent lanes read adjacent rows of a column)
    const float* t_out;           // S_o^T [d, m_o]
};
using QjlStateCopy = DeviceStateCopy<QjlFormatDev>;
QjlStateCopy qjl_state_copy(const codecs::qjl::State& s);
// The same parts laid out in `bytes` (host memory), the format pointing into them (the
// kernels' CPU test reads it).
QjlFormatDev qjl_format_host(const codecs::qjl::State& s, std::vector<uint8_t>& bytes);

struct QjlKeyStoreParams {
    const float* k;              // [n, n_head_kv, head_dim] after RoPE (device)
    const KiviHeadDev* heads;    // [n_head_kv]: the pages and rings
    const KvWindowWrite* plan;   // the keys' plan (device: a captured step reads the current one)
    int64_t n, n_head_kv, head_dim;
    QjlFormatDev kf;
};
// The blocks a write of n tokens may flush at most, per head (the grid: it depends on n and the
// ring only, so a captured decode step stays valid): the plan encodes at most slots - 1 pending
// tokens and the n new ones, in whole blocks.
constexpr int64_t qjl_store_max_blocks(int64_t n, int64_t slots) { return (slots - 1 + n) / 32; }
void qjl_key_store(const QjlKeyStoreParams& p, cudaStream_t stream);

using QjlAttentionParams = ReaderAttentionParams<QjlFormatDev, KiviFormatDev, KiviHeadDev>;
// Whether the attention takes these formats: the reader-policy shape (reader_attention_fits),
// values KIVI-2 in groups of 32 channels, and the sketched queries of a block within the
// device's shared memory (m + m_o sketch rows a query row).
bool qjl_attention_fits(const QjlFormatDev& kf, const KiviFormatDev& vf, int64_t n_head, int64_t n_head_kv, int64_t head_dim);
void qjl_attention(const QjlAttentionParams& p, cudaStream_t stream);

}  // namespace vxq::cuda

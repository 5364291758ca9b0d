// How the fused attention kernel reads a KV stream: a codec's reader scores keys or accumulates
// values straight from packed bytes, one virtual call per run of whole blocks (up to a chunk of
// >= 64 tokens), for all query heads that share the KV head (GQA: the bytes are read once).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace vxq {

class CodecReader {
public:
    virtual ~CodecReader() = default;
    // s[h * n + t] = <q_h, k_t> for heads h < n_q and the n tokens of n / block_tokens
    // consecutive blocks starting at blk.   q: [n_q, head_dim]; s: [n_q, n]
    virtual void scores(const float* q, int64_t n_q, const uint8_t* blk, int64_t n, int64_t head_dim,
                        float* s) const = 0;
    // acc[h * head_dim + c] += sum_t p[h * n + t] * v_t[c].   p: [n_q, n]; acc: [n_q, head_dim]
    virtual void accumulate(const float* p, int64_t n_q, const uint8_t* blk, int64_t n, int64_t head_dim,
                            float* acc) const = 0;
};

// A run of whole blocks of one codec covering tokens [first, first + n_tokens) of a stream.
struct KvSegment {
    const CodecReader* reader = nullptr;
    const uint8_t* data = nullptr;
    int64_t first = 0;
    int64_t n_tokens = 0;      // a multiple of block_tokens
    int64_t block_tokens = 1;
    size_t block_bytes = 0;
};

// One (layer, KV head) stream of keys or values: segments in token order, covering [0, size).
using KvStreamView = std::vector<KvSegment>;

}  // namespace vxq

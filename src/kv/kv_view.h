// What an attention kernel reads of one layer of the KV cache: plain data (pointers, counts and
// format parameters), no virtual calls, so every backend reads the same view. The storage behind
// it (kv/kv_cache.h) is per (layer, KV head) a page table: the head's tokens, in the order they
// arrived, are packed blocks in fixed-size pages plus a small fp16 window of the newest ones; each
// stored token keeps the position it was written at, so heads may hold different tokens
// (eviction) while every kept key keeps its RoPE phase and its causal visibility.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kv/format.h"

namespace vxq {

class KvMemory;

// A run of whole blocks covering stored tokens [first, first + n_tokens) of a stream.
struct KvSegment {
    const uint8_t* data = nullptr;
    int64_t first = 0;
    int64_t n_tokens = 0;  // a multiple of the format's block_tokens
    bool window = false;   // read with the stream's window format instead of its main one
};

// The keys or the values of one KV head: segments in stored order, covering [0, n_tokens).
struct KvStreamView {
    KvFormatParams fmt;         // the packed pages
    KvFormatParams window_fmt;  // the fp16 window (or the exact f32 batch of --prefill-exact)
    const KvSegment* segs = nullptr;
    int64_t n_segs = 0;
    // The fp16 window as a ring, for kernels that address it as one (a device cache's): stored
    // token n_packed + i is at ring slot (ring_head + i) % ring_slots, head_dim fp16 per slot.
    // ring null: no window (token-wise formats) or an exact batch (segs say where).
    const uint8_t* ring = nullptr;
    int64_t ring_head = 0, ring_slots = 0;
    int64_t n_packed = 0;  // stored tokens in packed blocks: [0, n_packed)
};

// What a write of n tokens does to one stream (the same in every head of a layer), for a device
// backend whose kernels do the encoding (KvCache::reserve_write). Before the write the stream held
// `packed` tokens in blocks and `pending` in its window, the oldest at ring slot `head` of `slots`
// (slots 0: no window, every token encoded on arrival). The write encodes `encoded` tokens as
// blocks at [packed, packed + encoded): the window's oldest first, then new ones (write-local
// index i < pending: ring slot (head + i) % slots, else new token i - pending). New token j with
// pending + j >= encoded then waits in the window, at ring slot (head + pending + j) % slots.
struct KvWindowWrite {
    int64_t packed = 0, pending = 0, head = 0, slots = 0, encoded = 0;
    bool operator==(const KvWindowWrite&) const = default;
};
struct KvWritePlan {
    KvWindowWrite k, v;
};

// The packed blocks of a stream: its pages are one contiguous run (kv/memory.h), the first
// segment, so block b is at the returned address + b * fmt.block_bytes (on the cache's device,
// see KvLayerView::memory). nullptr while the stream holds no packed block.
inline const uint8_t* kv_packed_blocks(const KvStreamView& s) {
    return s.n_segs > 0 && !s.segs[0].window ? s.segs[0].data : nullptr;
}

struct KvHeadView {
    KvStreamView k, v;
    int64_t n_tokens = 0;
    const int32_t* pos = nullptr;  // [n_tokens] ascending positions; nullptr: token t is at position t
};

struct KvLayerView {
    int64_t n_head = 0, n_head_kv = 0, head_dim = 0;
    int64_t chunk = 64;              // tokens per page: a multiple of every block_tokens
    const KvHeadView* heads = nullptr;  // [n_head_kv]
    bool flash_attn = false;         // false: an f16/f16 cache runs llama.cpp's non-flash numerics
    const KvMemory* memory = nullptr;  // where the pages are (KvCacheOptions::memory); nullptr: host RAM
};

// Stored tokens of a head that a query at position p sees (positions <= p).
inline int64_t kv_visible(const KvHeadView& h, int64_t p) {
    if (h.pos == nullptr) return std::clamp<int64_t>(p + 1, 0, h.n_tokens);
    return std::upper_bound(h.pos, h.pos + h.n_tokens, int32_t(std::min<int64_t>(p, INT32_MAX))) - h.pos;
}

}  // namespace vxq

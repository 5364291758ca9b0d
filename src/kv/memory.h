// Where a KV cache keeps its pages. Each stream (one layer, KV head, K or V) reserves address
// space for its whole context up front and commits memory page by page as tokens arrive, so a
// stream is one contiguous run of pages: a reader streams through it, and a device kernel needs
// only its base address. Host RAM is the default (mmap); a device backend supplies its own
// memory (Backend::kv_memory), whose pages only that backend's kernels read and write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace vxq {

// One stream's pages: page p at base() + p * page_bytes, pages [0, pages()) committed.
class KvPages {
public:
    virtual ~KvPages() = default;
    virtual uint8_t* base() const = 0;
    virtual int64_t pages() const = 0;
    // Commits pages [pages(), n) (no-op when n <= pages()).
    virtual void grow_to(int64_t n) = 0;
    // Gives pages [n, pages()) back (no-op when n >= pages()).
    virtual void shrink_to(int64_t n) = 0;
    // Bytes committed: what this stream holds.
    virtual size_t resident_bytes() const = 0;
};

class KvMemory {
public:
    virtual ~KvMemory() = default;
    // Address space for max_pages pages of page_bytes, nothing committed; vxq::Error when the
    // address space cannot be reserved.
    virtual std::unique_ptr<KvPages> reserve(size_t page_bytes, int64_t max_pages) = 0;
    // Whether host code may read and write the pages directly (true for host RAM).
    virtual bool host_accessible() const = 0;
    // bytes from src (in pages of this memory) to host memory dst, e.g. to dequantize for a test.
    virtual void copy_to_host(void* dst, const void* src, size_t bytes) const = 0;
    // bytes from host memory src into dst (in pages of this memory), visible to every later reader
    // (eviction compacts a device stream's blocks through the host).
    virtual void copy_from_host(void* dst, const void* src, size_t bytes) const = 0;
    // e.g. "host RAM", "GPU 0 (NVIDIA H200)"
    virtual std::string name() const = 0;
    // Bytes a stream commits at a time: what it holds is its pages' bytes rounded up to this
    // (CUDA's virtual memory maps 2 MiB chunks). 1 where commits are as fine as pages.
    virtual size_t commit_granularity() const { return 1; }
};

// Host RAM through anonymous mappings (MAP_NORESERVE; madvise(DONTNEED) gives pages back).
KvMemory& host_kv_memory();

}  // namespace vxq

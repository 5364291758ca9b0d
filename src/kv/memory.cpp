// Host RAM for KV pages: a virtual range per stream, reserved for the whole context (nothing is
// resident until written), committed by first touch and given back with madvise(DONTNEED).
// A stream's pages are adjacent: pages from one shared heap, interleaved across heads, made the
// f16 decode attention 15 % slower at 16K tokens (the hardware prefetchers follow one address
// stream, not a page list).
#include "kv/memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace vxq {

namespace {

class HostPages final : public KvPages {
public:
    HostPages(size_t page_bytes, int64_t max_pages) : page_bytes_(page_bytes), max_pages_(max_pages) {
        reserved_ = std::max<size_t>(1, page_bytes * size_t(max_pages));
        void* p = mmap(nullptr, reserved_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) fail("cannot reserve {} bytes of address space for a KV stream", reserved_);
        base_ = static_cast<uint8_t*>(p);
    }
    ~HostPages() override { munmap(base_, reserved_); }

    uint8_t* base() const override { return base_; }
    int64_t pages() const override { return n_pages_; }
    void grow_to(int64_t n) override {
        VXQ_ASSERT(n <= max_pages_);
        n_pages_ = std::max(n_pages_, n);
    }
    void shrink_to(int64_t n) override {
        if (n >= n_pages_) return;
        madvise(base_ + size_t(n) * page_bytes_, size_t(n_pages_ - n) * page_bytes_, MADV_DONTNEED);
        n_pages_ = n;
    }
    size_t resident_bytes() const override { return size_t(n_pages_) * page_bytes_; }

private:
    uint8_t* base_ = nullptr;
    size_t reserved_ = 0, page_bytes_ = 0;
    int64_t max_pages_ = 0, n_pages_ = 0;
};

class HostMemory final : public KvMemory {
public:
    std::unique_ptr<KvPages> reserve(size_t page_bytes, int64_t max_pages) override {
        return std::make_unique<HostPages>(page_bytes, max_pages);
    }
    bool host_accessible() const override { return true; }
    void copy_to_host(void* dst, const void* src, size_t bytes) const override { std::memcpy(dst, src, bytes); }
    void copy_from_host(void* dst, const void* src, size_t bytes) const override { std::memcpy(dst, src, bytes); }
    std::string name() const override { return "host RAM"; }
};

}  // namespace

KvMemory& host_kv_memory() {
    static HostMemory m;
    return m;
}

}  // namespace vxq

// A copy of some bytes whose last byte abuts an inaccessible page, so that a kernel run by the
// SIMT emulator (support/simt.h) that reads past the end of its input faults at once, where the
// slack of a std::vector's allocation would let the read pass unseen. Linux / POSIX (mmap).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>

namespace vxq::test {

class GuardedBytes {
public:
    explicit GuardedBytes(std::span<const uint8_t> bytes) {
        const size_t page = size_t(sysconf(_SC_PAGESIZE));
        const size_t data_pages = (bytes.size() + page - 1) / page;
        len_ = (data_pages + 1) * page;
        map_ = mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (map_ == MAP_FAILED) throw std::runtime_error("GuardedBytes: mmap failed");
        auto* base = static_cast<uint8_t*>(map_);
        if (mprotect(base + data_pages * page, page, PROT_NONE) != 0) throw std::runtime_error("GuardedBytes: mprotect failed");
        data_ = base + data_pages * page - bytes.size();
        if (!bytes.empty()) std::memcpy(data_, bytes.data(), bytes.size());
    }
    GuardedBytes(const GuardedBytes&) = delete;
    GuardedBytes& operator=(const GuardedBytes&) = delete;
    ~GuardedBytes() { munmap(map_, len_); }
    const uint8_t* data() const { return data_; }

private:
    void* map_ = nullptr;
    size_t len_ = 0;
    uint8_t* data_ = nullptr;
};

}  // namespace vxq::test

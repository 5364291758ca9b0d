// SHA-256 (FIPS 180-4), for naming the exact model a calibration file was made from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace vxq {

class Sha256 {
public:
    Sha256();
    void update(std::span<const uint8_t> bytes);
    // The digest as 64 lowercase hex digits; the object is spent afterwards.
    std::string hex();

private:
    void block(const uint8_t* p);
    uint32_t h_[8];
    uint8_t buf_[64];
    size_t buf_len_ = 0;
    uint64_t total_ = 0;
};

std::string sha256_hex(std::span<const uint8_t> bytes);
// The file's digest, read in chunks; vxq::Error naming the file if it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace vxq

// GGUF reader (versions 2 and 3) over a read-only mmap. Everything read from the file is
// validated before use: magic, version, counts, string lengths, value types, tensor dimensions,
// sizes without overflow, offsets and alignment inside the file. Any violation is a vxq::Error
// naming the file, the offset and what was wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "formats/ggml_types.h"

namespace vxq {

enum class GgufValueType : uint32_t {
    UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
    BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};

std::string_view gguf_value_type_name(GgufValueType t);

struct GgufValue {
    GgufValueType type = GgufValueType::UINT8;
    // Scalars: integers (and bool) in `i` (uint64 stored by bit pattern), floats in `f`.
    int64_t i = 0;
    double f = 0.0;
    std::string s;
    // Arrays: element type, and one of the vectors below filled by element type.
    GgufValueType elem_type = GgufValueType::UINT8;
    std::vector<int64_t> ints;        // integer and bool arrays
    std::vector<double> floats;       // float arrays
    std::vector<std::string> strs;    // string arrays
    std::vector<GgufValue> items;     // arrays of arrays
    size_t array_size() const;
};

struct GgufTensorInfo {
    std::string name;
    std::vector<int64_t> ne;  // dimensions, ne[0] is the contiguous (fastest) one
    GgmlType type = GgmlType::F32;
    uint64_t offset = 0;      // from the start of the tensor data section
    int64_t n_elements = 0;
    size_t n_bytes = 0;
};

class GgufFile {
public:
    // Maps and parses a file. Throws vxq::Error on any malformed input.
    static GgufFile open(const std::string& path);
    // Parses a buffer (copied); used by tests and the fuzz target.
    static GgufFile parse(std::span<const uint8_t> bytes, std::string name = "<memory>");

    GgufFile(GgufFile&&) noexcept;
    GgufFile& operator=(GgufFile&&) noexcept;
    ~GgufFile();

    const std::string& path() const { return path_; }
    uint32_t version() const { return version_; }
    size_t size() const { return size_; }
    size_t alignment() const { return alignment_; }

    const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
    const GgufValue* find(std::string_view key) const;

    // Typed getters: nullopt when absent, vxq::Error naming the key when present with a wrong type.
    std::optional<int64_t> get_int(std::string_view key) const;     // any integer type
    std::optional<double> get_float(std::string_view key) const;    // float32/64 or integer
    std::optional<bool> get_bool(std::string_view key) const;
    std::optional<std::string> get_string(std::string_view key) const;
    const GgufValue* get_array(std::string_view key) const;          // nullptr when absent

    const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
    const GgufTensorInfo* find_tensor(std::string_view name) const;
    const uint8_t* tensor_data(const GgufTensorInfo& t) const { return data_ + t.offset; }

private:
    GgufFile() = default;
    void parse_all();

    std::string path_;
    const uint8_t* base_ = nullptr;  // whole file
    size_t size_ = 0;
    const uint8_t* data_ = nullptr;  // tensor data section
    uint32_t version_ = 0;
    size_t alignment_ = 32;
    std::vector<std::pair<std::string, GgufValue>> kv_;
    std::unordered_map<std::string, size_t> kv_index_;
    std::vector<GgufTensorInfo> tensors_;
    std::unordered_map<std::string, size_t> tensor_index_;
    void* map_ = nullptr;            // mmap region, if mapped
    std::vector<uint8_t> owned_;     // buffer copy, if parsed from memory
};

}  // namespace vxq

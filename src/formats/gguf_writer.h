// Writing GGUF v3 files: metadata values, and a writer that streams tensor data to disk.
//
// GgufStreamWriter holds the metadata and the tensor infos (small) and asks a callback for each
// tensor's data a few rows at a time while it writes, so a 16 GB model never sits in memory. The
// layout is ggml's (gguf.cpp, gguf_write_to_buf): header, key-value pairs, tensor infos, zero
// padding to the alignment, then each tensor at an aligned offset followed by zero padding to
// the alignment. The file appears under its name only when complete (a temporary in the same
// folder, renamed at the end; removed on any error).
//
//   GgufStreamWriter w;
//   w.add_string("general.architecture", "llama");
//   w.add_tensor("token_embd.weight", {4096, 128256}, GgmlType::F16);  // ne[0] is contiguous
//   w.write(path, [&](size_t tensor, int64_t row0, int64_t n_rows, std::span<uint8_t> out) { ... });
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "formats/ggml_types.h"
#include "formats/gguf.h"

namespace vxq {

// GGUF's little-endian encoding of a scalar and of a string (u64 length, bytes), appended to out;
// the library writer and the tests' deliberately-broken-file writer share them.
template <typename T>
void gguf_put(std::vector<uint8_t>& out, T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t at = out.size();
    out.resize(at + sizeof(T));
    std::memcpy(out.data() + at, &v, sizeof(T));
}
inline void gguf_put_string(std::vector<uint8_t>& out, const std::string& s) {
    gguf_put<uint64_t>(out, s.size());
    const size_t at = out.size();
    out.resize(at + s.size());
    if (!s.empty()) std::memcpy(out.data() + at, s.data(), s.size());  // (insert() trips GCC 12's -Warray-bounds)
}

// One encoded metadata value (type tag kept apart from the payload), nestable into arrays.
class GgufWriterValue {
public:
    GgufValueType type() const { return type_; }
    const std::vector<uint8_t>& payload() const { return payload_; }

    static GgufWriterValue u8(uint8_t v) { return scalar(GgufValueType::UINT8, v); }
    static GgufWriterValue i8(int8_t v) { return scalar(GgufValueType::INT8, v); }
    static GgufWriterValue u16(uint16_t v) { return scalar(GgufValueType::UINT16, v); }
    static GgufWriterValue i16(int16_t v) { return scalar(GgufValueType::INT16, v); }
    static GgufWriterValue u32(uint32_t v) { return scalar(GgufValueType::UINT32, v); }
    static GgufWriterValue i32(int32_t v) { return scalar(GgufValueType::INT32, v); }
    static GgufWriterValue u64(uint64_t v) { return scalar(GgufValueType::UINT64, v); }
    static GgufWriterValue i64(int64_t v) { return scalar(GgufValueType::INT64, v); }
    static GgufWriterValue f32(float v) { return scalar(GgufValueType::FLOAT32, v); }
    static GgufWriterValue f64(double v) { return scalar(GgufValueType::FLOAT64, v); }
    static GgufWriterValue boolean(bool v) { return scalar(GgufValueType::BOOL, uint8_t(v ? 1 : 0)); }
    static GgufWriterValue string(const std::string& s);

    // Array of values that all have type `elem` (throws std::invalid_argument otherwise).
    // Arrays of arrays nest: array(ARRAY, {array(...), array(...)}).
    static GgufWriterValue array(GgufValueType elem, const std::vector<GgufWriterValue>& items);
    // Array of C++ scalars or strings; the element type follows from T
    // (uint8_t..int64_t, float, double, bool, std::string).
    template <typename T>
    static GgufWriterValue array_of(const std::vector<T>& v);

    // The value as a parsed file holds it (GgufFile::metadata), to copy metadata between files.
    static GgufWriterValue of(const GgufValue& v);
    // Any tag with any payload, written verbatim: lets tests build values the reader must refuse.
    static GgufWriterValue raw(uint32_t type, std::vector<uint8_t> payload);

    uint32_t type_id() const { return type_id_; }

private:
    template <typename T>
    static GgufWriterValue scalar(GgufValueType t, T v);

    GgufValueType type_ = GgufValueType::UINT8;
    uint32_t type_id_ = 0;  // as written; differs from type_ only for raw()
    std::vector<uint8_t> payload_;
};

template <typename T>
constexpr GgufValueType gguf_value_type_of() {
    if constexpr (std::is_same_v<T, bool>) return GgufValueType::BOOL;
    else if constexpr (std::is_same_v<T, uint8_t>) return GgufValueType::UINT8;
    else if constexpr (std::is_same_v<T, int8_t>) return GgufValueType::INT8;
    else if constexpr (std::is_same_v<T, uint16_t>) return GgufValueType::UINT16;
    else if constexpr (std::is_same_v<T, int16_t>) return GgufValueType::INT16;
    else if constexpr (std::is_same_v<T, uint32_t>) return GgufValueType::UINT32;
    else if constexpr (std::is_same_v<T, int32_t>) return GgufValueType::INT32;
    else if constexpr (std::is_same_v<T, uint64_t>) return GgufValueType::UINT64;
    else if constexpr (std::is_same_v<T, int64_t>) return GgufValueType::INT64;
    else if constexpr (std::is_same_v<T, float>) return GgufValueType::FLOAT32;
    else if constexpr (std::is_same_v<T, double>) return GgufValueType::FLOAT64;
    else if constexpr (std::is_same_v<T, std::string>) return GgufValueType::STRING;
    else static_assert(sizeof(T) == 0, "no GGUF value type for this C++ type");
}

class GgufStreamWriter {
public:
    // Rows [row0, row0 + n_rows) of tensor `tensor` (a row is ne[0] elements; rows run over
    // ne[1..] in order), n_rows * row_bytes bytes, into `out`.
    using RowFiller = std::function<void(size_t tensor, int64_t row0, int64_t n_rows, std::span<uint8_t> out)>;
    // Bytes of tensor data written so far, of the total; called after every chunk.
    using Progress = std::function<void(uint64_t done, uint64_t total)>;

    // ---- metadata, in insertion order ----
    GgufStreamWriter& add(const std::string& key, const GgufWriterValue& v);
    GgufStreamWriter& add_u32(const std::string& k, uint32_t v) { return add(k, GgufWriterValue::u32(v)); }
    GgufStreamWriter& add_i32(const std::string& k, int32_t v) { return add(k, GgufWriterValue::i32(v)); }
    GgufStreamWriter& add_f32(const std::string& k, float v) { return add(k, GgufWriterValue::f32(v)); }
    GgufStreamWriter& add_bool(const std::string& k, bool v) { return add(k, GgufWriterValue::boolean(v)); }
    GgufStreamWriter& add_string(const std::string& k, const std::string& v) {
        return add(k, GgufWriterValue::string(v));
    }
    template <typename T>
    GgufStreamWriter& add_array(const std::string& k, const std::vector<T>& v) {
        return add(k, GgufWriterValue::array_of(v));
    }
    // Data alignment (a power of two); writes general.alignment when it is not ggml's default 32.
    GgufStreamWriter& set_alignment(uint32_t alignment);

    // ---- tensors; returns the tensor's index. vxq::Error for a bad shape or a type whose block
    // size does not divide ne[0]. ----
    size_t add_tensor(const std::string& name, const std::vector<int64_t>& ne, GgmlType type);
    // Name, dims, type, offset (relative to the data section) and byte size of each tensor.
    const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

    // ---- layout ----
    uint64_t header_bytes() const;  // up to the data section, padding included
    uint64_t data_bytes() const;    // the data section, each tensor padded to the alignment
    uint64_t file_bytes() const { return header_bytes() + data_bytes(); }

    // Writes the file (see the top of this header); vxq::Error naming the path on any I/O error,
    // with nothing left behind. Exceptions from fill or progress also remove the temporary.
    void write(const std::string& path, const RowFiller& fill, const Progress& progress = {}) const;

private:
    std::vector<uint8_t> header() const;

    uint32_t alignment_ = 32;
    std::vector<std::vector<uint8_t>> kvs_;  // each: key, type tag, payload
    std::vector<GgufTensorInfo> tensors_;
};

template <typename T>
GgufWriterValue GgufWriterValue::array_of(const std::vector<T>& v) {
    constexpr GgufValueType t = gguf_value_type_of<T>();
    std::vector<GgufWriterValue> items;
    items.reserve(v.size());
    for (const auto& x : v) {  // also fine for std::vector<bool>
        if constexpr (t == GgufValueType::STRING) items.push_back(string(x));
        else if constexpr (t == GgufValueType::BOOL) items.push_back(boolean(bool(x)));
        else items.push_back(scalar(t, T(x)));
    }
    return array(t, items);
}

template <typename T>
GgufWriterValue GgufWriterValue::scalar(GgufValueType t, T v) {
    static_assert(std::is_arithmetic_v<T>);
    GgufWriterValue r;
    r.type_ = t;
    r.type_id_ = uint32_t(t);
    r.payload_.resize(sizeof(T));
    std::memcpy(r.payload_.data(), &v, sizeof(T));  // little-endian host assumed (x86-64)
    return r;
}

}  // namespace vxq

// A small in-memory GGUF v3 writer for tests: metadata of every value type, tensors of every supported
// type, correct alignment and offsets. It validates only what it needs to lay the file out, so
// tests can also build deliberately broken files (raw key-value entries, raw tensor infos,
// overridden counts / magic / version / offsets), or patch the byte vector using the Layout.
// Valid files at real scale are written by the library's streaming vxq::GgufStreamWriter
// (formats/gguf_writer.h); this one shares its metadata values and ggml's reference quantizers.
//
//   vxq::test::GgufWriter w;
//   w.add_string("general.architecture", "llama").add_u32("llama.block_count", 2);
//   w.add_tensor_f32("token_embd.weight", {64, 32}, values);  // ne[0] = 64 is contiguous
//   w.write(path);                                             // or: auto bytes = w.bytes();
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "formats/ggml_types.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"

namespace vxq::test {

// Metadata values are the library's (formats/gguf_writer.h), raw tags included.
using vxq::GgufWriterValue;
using vxq::gguf_value_type_of;

class GgufWriter {
public:
    // Where things landed in the last bytes(): absolute file offsets unless noted.
    struct Layout {
        std::vector<size_t> kv_offsets;           // start of each key-value entry (key length)
        std::vector<size_t> kv_value_offsets;     // start of each value payload (after the type tag)
        std::vector<size_t> tensor_info_offsets;  // start of each tensor info (name length)
        size_t data_start = 0;                    // tensor data section (aligned)
        std::vector<uint64_t> tensor_offsets;     // relative to data_start, as written in the infos
        size_t size = 0;
    };

    // A tensor info written as given, with no checks: for broken files. `data` is placed in the
    // data section at the next aligned position; `offset`, when set, replaces the offset written
    // in the info (the data still goes where it would have gone).
    struct RawTensor {
        std::string name;
        std::vector<uint64_t> dims;
        uint32_t type_id = 0;
        std::vector<uint8_t> data;
        std::optional<uint64_t> offset;
    };

    explicit GgufWriter(uint32_t version = 3) : version_(version) {}

    // ---- metadata (kept in insertion order; duplicates are written as given) ----
    GgufWriter& add(const std::string& key, const GgufWriterValue& v);
    GgufWriter& add_u8(const std::string& k, uint8_t v) { return add(k, GgufWriterValue::u8(v)); }
    GgufWriter& add_i8(const std::string& k, int8_t v) { return add(k, GgufWriterValue::i8(v)); }
    GgufWriter& add_u16(const std::string& k, uint16_t v) { return add(k, GgufWriterValue::u16(v)); }
    GgufWriter& add_i16(const std::string& k, int16_t v) { return add(k, GgufWriterValue::i16(v)); }
    GgufWriter& add_u32(const std::string& k, uint32_t v) { return add(k, GgufWriterValue::u32(v)); }
    GgufWriter& add_i32(const std::string& k, int32_t v) { return add(k, GgufWriterValue::i32(v)); }
    GgufWriter& add_u64(const std::string& k, uint64_t v) { return add(k, GgufWriterValue::u64(v)); }
    GgufWriter& add_i64(const std::string& k, int64_t v) { return add(k, GgufWriterValue::i64(v)); }
    GgufWriter& add_f32(const std::string& k, float v) { return add(k, GgufWriterValue::f32(v)); }
    GgufWriter& add_f64(const std::string& k, double v) { return add(k, GgufWriterValue::f64(v)); }
    GgufWriter& add_bool(const std::string& k, bool v) { return add(k, GgufWriterValue::boolean(v)); }
    GgufWriter& add_string(const std::string& k, const std::string& v) {
        return add(k, GgufWriterValue::string(v));
    }
    template <typename T>
    GgufWriter& add_array(const std::string& k, const std::vector<T>& v) {
        return add(k, GgufWriterValue::array_of(v));
    }
    // A whole key-value entry written verbatim (counted as one entry): for broken files.
    GgufWriter& add_raw_kv(std::vector<uint8_t> entry);

    // Sets the data alignment used for the layout and, when write_key, general.alignment (u32).
    GgufWriter& set_alignment(uint32_t alignment, bool write_key = true);
    uint32_t alignment() const { return alignment_; }

    // ---- tensors; ne[0] is the contiguous dimension, as in GgufTensorInfo::ne ----
    // Raw bytes; their size must match the type and dims (std::invalid_argument otherwise).
    GgufWriter& add_tensor(const std::string& name, const std::vector<int64_t>& ne, GgmlType type,
                           std::vector<uint8_t> data);
    // From floats, converted / quantized to the type (q8_0 and q4_0 as ggml's reference
    // quantizers do; ne[0] must then be a multiple of 32).
    GgufWriter& add_tensor_f32(const std::string& name, const std::vector<int64_t>& ne,
                               const std::vector<float>& values);
    GgufWriter& add_tensor_f16(const std::string& name, const std::vector<int64_t>& ne,
                               const std::vector<float>& values);
    GgufWriter& add_tensor_bf16(const std::string& name, const std::vector<int64_t>& ne,
                                const std::vector<float>& values);
    GgufWriter& add_tensor_q8_0(const std::string& name, const std::vector<int64_t>& ne,
                                const std::vector<float>& values);
    GgufWriter& add_tensor_q4_0(const std::string& name, const std::vector<int64_t>& ne,
                                const std::vector<float>& values);
    GgufWriter& add_tensor_from_f32(const std::string& name, const std::vector<int64_t>& ne,
                                    GgmlType type, const std::vector<float>& values);
    GgufWriter& add_tensor_raw(RawTensor t);

    // ---- deliberate breakage of the header ----
    GgufWriter& set_magic(uint32_t magic) { magic_ = magic; return *this; }
    GgufWriter& set_version(uint32_t version) { version_ = version; return *this; }
    GgufWriter& set_tensor_count(std::optional<uint64_t> n) { tensor_count_ = n; return *this; }
    GgufWriter& set_kv_count(std::optional<uint64_t> n) { kv_count_ = n; return *this; }
    // Pads the file after the last tensor to the alignment (as ggml's writer does). Off by
    // default, so the file ends with the last tensor's last byte.
    GgufWriter& set_pad_end(bool pad) { pad_end_ = pad; return *this; }

    size_t kv_count() const { return kvs_.size(); }
    size_t tensor_count() const { return tensors_.size(); }

    std::vector<uint8_t> bytes(Layout* layout = nullptr) const;
    void write(const std::string& path) const;  // throws std::runtime_error on I/O failure

    // Encoders, shared with the add_tensor_* helpers; values.size() must be a multiple of 32.
    static std::vector<uint8_t> encode(GgmlType type, const std::vector<float>& values);

private:
    struct Kv {
        std::vector<uint8_t> entry;  // key, type tag and payload
        size_t value_offset;         // payload offset inside entry
    };
    struct Tensor {
        std::string name;
        std::vector<uint64_t> dims;
        uint32_t type_id;
        std::vector<uint8_t> data;
        std::optional<uint64_t> offset;
    };

    uint32_t magic_ = 0x46554747;  // "GGUF"
    uint32_t version_;
    uint32_t alignment_ = 32;
    std::optional<uint64_t> tensor_count_;
    std::optional<uint64_t> kv_count_;
    bool pad_end_ = false;
    std::vector<Kv> kvs_;
    std::vector<Tensor> tensors_;
};

}  // namespace vxq::test

#include "support/gguf_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "formats/ggml_quants.h"

namespace vxq::test {

namespace {

uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

[[noreturn]] void invalid(const std::string& what) { throw std::invalid_argument("GgufWriter: " + what); }

uint64_t element_count(const std::string& name, const std::vector<int64_t>& ne) {
    if (ne.empty() || ne.size() > 4) invalid("tensor '" + name + "' needs 1..4 dimensions");
    uint64_t n = 1;
    for (int64_t d : ne) {
        if (d <= 0) invalid("tensor '" + name + "' has a dimension <= 0");
        n *= uint64_t(d);
    }
    return n;
}

}  // namespace

// ---- metadata ----

GgufWriter& GgufWriter::add(const std::string& key, const GgufWriterValue& v) {
    Kv kv;
    gguf_put_string(kv.entry, key);
    gguf_put<uint32_t>(kv.entry, v.type_id());
    kv.value_offset = kv.entry.size();
    kv.entry.insert(kv.entry.end(), v.payload().begin(), v.payload().end());
    kvs_.push_back(std::move(kv));
    return *this;
}

GgufWriter& GgufWriter::add_raw_kv(std::vector<uint8_t> entry) {
    Kv kv;
    kv.value_offset = 0;  // unknown for raw entries
    kv.entry = std::move(entry);
    kvs_.push_back(std::move(kv));
    return *this;
}

GgufWriter& GgufWriter::set_alignment(uint32_t alignment, bool write_key) {
    if (alignment == 0) invalid("alignment 0");
    alignment_ = alignment;
    if (write_key) add_u32("general.alignment", alignment);
    return *this;
}

// ---- tensors ----

std::vector<uint8_t> GgufWriter::encode(GgmlType type, const std::vector<float>& x) {
    if (!can_quantize_ref(type)) invalid("unsupported tensor type");
    const auto tr = ggml_type_traits(uint32_t(type));
    if (x.size() % size_t(tr->block_size)) invalid(std::string(tr->name) + " needs a multiple of 32 values");
    std::vector<uint8_t> out(ggml_row_bytes(type, int64_t(x.size())));
    if (!x.empty()) quantize_row_ref(type, x.data(), int64_t(x.size()), out.data());
    return out;
}

GgufWriter& GgufWriter::add_tensor(const std::string& name, const std::vector<int64_t>& ne, GgmlType type,
                                   std::vector<uint8_t> data) {
    const uint64_t n = element_count(name, ne);
    const auto tr = ggml_type_traits(uint32_t(type));
    if (!tr) invalid("tensor '" + name + "' has an unsupported type");
    if (ne[0] % tr->block_size != 0) invalid("tensor '" + name + "' row is not a multiple of the block size");
    const uint64_t want = n / uint64_t(tr->block_size) * tr->block_bytes;
    if (data.size() != want) {
        invalid("tensor '" + name + "' has " + std::to_string(data.size()) + " bytes, expected " +
                std::to_string(want));
    }
    Tensor t{name, {}, uint32_t(type), std::move(data), std::nullopt};
    for (int64_t d : ne) t.dims.push_back(uint64_t(d));
    tensors_.push_back(std::move(t));
    return *this;
}

GgufWriter& GgufWriter::add_tensor_from_f32(const std::string& name, const std::vector<int64_t>& ne,
                                            GgmlType type, const std::vector<float>& values) {
    if (element_count(name, ne) != values.size()) {
        invalid("tensor '" + name + "' dims do not match the " + std::to_string(values.size()) + " values");
    }
    return add_tensor(name, ne, type, encode(type, values));
}

GgufWriter& GgufWriter::add_tensor_f32(const std::string& name, const std::vector<int64_t>& ne,
                                       const std::vector<float>& values) {
    return add_tensor_from_f32(name, ne, GgmlType::F32, values);
}
GgufWriter& GgufWriter::add_tensor_f16(const std::string& name, const std::vector<int64_t>& ne,
                                       const std::vector<float>& values) {
    return add_tensor_from_f32(name, ne, GgmlType::F16, values);
}
GgufWriter& GgufWriter::add_tensor_bf16(const std::string& name, const std::vector<int64_t>& ne,
                                        const std::vector<float>& values) {
    return add_tensor_from_f32(name, ne, GgmlType::BF16, values);
}
GgufWriter& GgufWriter::add_tensor_q8_0(const std::string& name, const std::vector<int64_t>& ne,
                                        const std::vector<float>& values) {
    return add_tensor_from_f32(name, ne, GgmlType::Q8_0, values);
}
GgufWriter& GgufWriter::add_tensor_q4_0(const std::string& name, const std::vector<int64_t>& ne,
                                        const std::vector<float>& values) {
    return add_tensor_from_f32(name, ne, GgmlType::Q4_0, values);
}

GgufWriter& GgufWriter::add_tensor_raw(RawTensor t) {
    tensors_.push_back(Tensor{std::move(t.name), std::move(t.dims), t.type_id, std::move(t.data), t.offset});
    return *this;
}

// ---- output ----

std::vector<uint8_t> GgufWriter::bytes(Layout* layout) const {
    Layout lay;
    std::vector<uint8_t> out;
    gguf_put<uint32_t>(out, magic_);
    gguf_put<uint32_t>(out, version_);
    gguf_put<uint64_t>(out, tensor_count_.value_or(tensors_.size()));
    gguf_put<uint64_t>(out, kv_count_.value_or(kvs_.size()));

    for (const auto& kv : kvs_) {
        lay.kv_offsets.push_back(out.size());
        lay.kv_value_offsets.push_back(out.size() + kv.value_offset);
        out.insert(out.end(), kv.entry.begin(), kv.entry.end());
    }

    // Data positions first: each tensor starts at the next multiple of the alignment.
    std::vector<uint64_t> pos;
    uint64_t data_size = 0;
    for (const auto& t : tensors_) {
        const uint64_t at = round_up(data_size, alignment_);
        pos.push_back(at);
        data_size = at + t.data.size();
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
        const auto& t = tensors_[i];
        lay.tensor_info_offsets.push_back(out.size());
        gguf_put_string(out, t.name);
        gguf_put<uint32_t>(out, uint32_t(t.dims.size()));
        for (uint64_t d : t.dims) gguf_put<uint64_t>(out, d);
        gguf_put<uint32_t>(out, t.type_id);
        const uint64_t off = t.offset.value_or(pos[i]);
        gguf_put<uint64_t>(out, off);
        lay.tensor_offsets.push_back(off);
    }

    lay.data_start = round_up(out.size(), alignment_);
    if (!tensors_.empty() || pad_end_) out.resize(lay.data_start, 0);
    for (size_t i = 0; i < tensors_.size(); ++i) {
        out.resize(lay.data_start + pos[i], 0);
        out.insert(out.end(), tensors_[i].data.begin(), tensors_[i].data.end());
    }
    if (pad_end_) out.resize(round_up(out.size(), alignment_), 0);
    lay.size = out.size();
    if (layout) *layout = std::move(lay);
    return out;
}

void GgufWriter::write(const std::string& path) const {
    const std::vector<uint8_t> b = bytes();
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) throw std::runtime_error("GgufWriter: cannot create " + path);
    f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
    f.close();
    if (!f) throw std::runtime_error("GgufWriter: cannot write " + path);
}

}  // namespace vxq::test

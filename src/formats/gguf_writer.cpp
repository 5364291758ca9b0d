#include "formats/gguf_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "core/error.h"

namespace vxq {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF"
constexpr uint32_t kGgufVersion = 3;
// Tensor data is produced and written in chunks of about this many bytes (at least one row).
constexpr uint64_t kChunkBytes = uint64_t(32) << 20;

uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// An open temporary next to `path`, renamed over it by commit(); removed if never committed.
class AtomicFile {
public:
    explicit AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp." + std::to_string(::getpid())) {
        fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        if (fd_ < 0) fail("cannot write '{}': {}", path_, std::strerror(errno));
    }
    ~AtomicFile() {
        if (fd_ >= 0) ::close(fd_);
        if (!committed_) ::unlink(tmp_.c_str());
    }
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    void write(const uint8_t* p, size_t n) {
        while (n > 0) {
            const ssize_t w = ::write(fd_, p, n);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) fail("cannot write '{}': {}", path_, std::strerror(w < 0 ? errno : ENOSPC));
            p += w;
            n -= size_t(w);
        }
    }
    void commit() {
        if (::fsync(fd_) != 0) fail("cannot write '{}': {}", path_, std::strerror(errno));
        const int rc = ::close(fd_);
        fd_ = -1;
        if (rc != 0) fail("cannot write '{}': {}", path_, std::strerror(errno));
        if (std::rename(tmp_.c_str(), path_.c_str()) != 0) fail("cannot write '{}': {}", path_, std::strerror(errno));
        committed_ = true;
    }

private:
    std::string path_, tmp_;
    int fd_ = -1;
    bool committed_ = false;
};

}  // namespace

// ---- values ----

GgufWriterValue GgufWriterValue::string(const std::string& s) {
    GgufWriterValue r;
    r.type_ = GgufValueType::STRING;
    r.type_id_ = uint32_t(GgufValueType::STRING);
    gguf_put_string(r.payload_, s);
    return r;
}

GgufWriterValue GgufWriterValue::array(GgufValueType elem, const std::vector<GgufWriterValue>& items) {
    GgufWriterValue r;
    r.type_ = GgufValueType::ARRAY;
    r.type_id_ = uint32_t(GgufValueType::ARRAY);
    gguf_put<uint32_t>(r.payload_, uint32_t(elem));
    gguf_put<uint64_t>(r.payload_, items.size());
    for (const auto& it : items) {
        if (it.type_id_ != uint32_t(elem)) throw std::invalid_argument("GGUF array element of another type than the array's");
        r.payload_.insert(r.payload_.end(), it.payload_.begin(), it.payload_.end());
    }
    return r;
}

GgufWriterValue GgufWriterValue::of(const GgufValue& v) {
    switch (v.type) {
        case GgufValueType::UINT8: return u8(uint8_t(v.i));
        case GgufValueType::INT8: return i8(int8_t(v.i));
        case GgufValueType::UINT16: return u16(uint16_t(v.i));
        case GgufValueType::INT16: return i16(int16_t(v.i));
        case GgufValueType::UINT32: return u32(uint32_t(v.i));
        case GgufValueType::INT32: return i32(int32_t(v.i));
        case GgufValueType::UINT64: return u64(uint64_t(v.i));
        case GgufValueType::INT64: return i64(v.i);
        case GgufValueType::FLOAT32: return f32(float(v.f));
        case GgufValueType::FLOAT64: return f64(v.f);
        case GgufValueType::BOOL: return boolean(v.i != 0);
        case GgufValueType::STRING: return string(v.s);
        case GgufValueType::ARRAY: {
            std::vector<GgufWriterValue> items;
            items.reserve(v.array_size());
            for (size_t k = 0; k < v.array_size(); ++k) {
                if (v.elem_type == GgufValueType::ARRAY) {
                    items.push_back(of(v.items[k]));
                    continue;
                }
                GgufValue e;  // the element as a scalar of the array's type
                e.type = v.elem_type;
                if (v.elem_type == GgufValueType::STRING) {
                    e.s = v.strs[k];
                } else if (v.elem_type == GgufValueType::FLOAT32 || v.elem_type == GgufValueType::FLOAT64) {
                    e.f = v.floats[k];
                } else {
                    e.i = v.ints[k];
                }
                items.push_back(of(e));
            }
            return array(v.elem_type, items);
        }
    }
    throw std::invalid_argument("GGUF value of an unknown type");
}

GgufWriterValue GgufWriterValue::raw(uint32_t type, std::vector<uint8_t> payload) {
    GgufWriterValue r;
    r.type_ = GgufValueType(type);
    r.type_id_ = type;
    r.payload_ = std::move(payload);
    return r;
}

// ---- the stream writer ----

GgufStreamWriter& GgufStreamWriter::add(const std::string& key, const GgufWriterValue& v) {
    std::vector<uint8_t> entry;
    gguf_put_string(entry, key);
    gguf_put<uint32_t>(entry, v.type_id());
    entry.insert(entry.end(), v.payload().begin(), v.payload().end());
    kvs_.push_back(std::move(entry));
    return *this;
}

GgufStreamWriter& GgufStreamWriter::set_alignment(uint32_t alignment) {
    VXQ_ASSERT(alignment != 0 && (alignment & (alignment - 1)) == 0);
    VXQ_ASSERT(tensors_.empty());  // offsets already laid out with the old alignment
    alignment_ = alignment;
    if (alignment != 32) add_u32("general.alignment", alignment);
    return *this;
}

size_t GgufStreamWriter::add_tensor(const std::string& name, const std::vector<int64_t>& ne, GgmlType type) {
    if (ne.empty() || ne.size() > 4) fail("GGUF writer: tensor '{}' needs 1 to 4 dimensions", name);
    const auto tr = ggml_type_traits(uint32_t(type));
    VXQ_ASSERT(tr.has_value());
    int64_t n = 1;
    for (int64_t d : ne) {
        if (d <= 0 || n > INT64_MAX / d) fail("GGUF writer: tensor '{}' has a bad dimension {}", name, d);
        n *= d;
    }
    if (ne[0] % tr->block_size != 0) {
        fail("GGUF writer: tensor '{}': a row of {} values is not a whole number of {} blocks ({} values)", name,
             ne[0], tr->name, tr->block_size);
    }
    GgufTensorInfo t;
    t.name = name;
    t.ne = ne;
    t.type = type;
    t.n_elements = n;
    t.n_bytes = size_t(n / tr->block_size) * tr->block_bytes;
    t.offset = tensors_.empty() ? 0 : round_up(tensors_.back().offset + tensors_.back().n_bytes, alignment_);
    tensors_.push_back(std::move(t));
    return tensors_.size() - 1;
}

std::vector<uint8_t> GgufStreamWriter::header() const {
    std::vector<uint8_t> out;
    gguf_put<uint32_t>(out, kGgufMagic);
    gguf_put<uint32_t>(out, kGgufVersion);
    gguf_put<uint64_t>(out, tensors_.size());
    gguf_put<uint64_t>(out, kvs_.size());
    for (const auto& kv : kvs_) out.insert(out.end(), kv.begin(), kv.end());
    for (const GgufTensorInfo& t : tensors_) {
        gguf_put_string(out, t.name);
        gguf_put<uint32_t>(out, uint32_t(t.ne.size()));
        for (int64_t d : t.ne) gguf_put<uint64_t>(out, uint64_t(d));
        gguf_put<uint32_t>(out, uint32_t(t.type));
        gguf_put<uint64_t>(out, t.offset);
    }
    out.resize(round_up(out.size(), alignment_), 0);
    return out;
}

uint64_t GgufStreamWriter::header_bytes() const { return header().size(); }

uint64_t GgufStreamWriter::data_bytes() const {
    if (tensors_.empty()) return 0;
    return round_up(tensors_.back().offset + tensors_.back().n_bytes, alignment_);
}

void GgufStreamWriter::write(const std::string& path, const RowFiller& fill, const Progress& progress) const {
    AtomicFile file(path);
    const std::vector<uint8_t> head = header();
    file.write(head.data(), head.size());

    const uint64_t total = data_bytes();
    uint64_t done = 0;
    std::vector<uint8_t> buf;
    const uint8_t zeros[64] = {};
    for (size_t i = 0; i < tensors_.size(); ++i) {
        const GgufTensorInfo& t = tensors_[i];
        const size_t row_bytes = ggml_row_bytes(t.type, t.ne[0]);
        const int64_t n_rows = t.n_elements / t.ne[0];
        const int64_t rows_per_chunk = std::max<int64_t>(1, int64_t(kChunkBytes / row_bytes));
        for (int64_t r0 = 0; r0 < n_rows; r0 += rows_per_chunk) {
            const int64_t nr = std::min(rows_per_chunk, n_rows - r0);
            buf.resize(size_t(nr) * row_bytes);
            fill(i, r0, nr, std::span<uint8_t>(buf));
            file.write(buf.data(), buf.size());
            done += buf.size();
            if (progress) progress(done, total);
        }
        const size_t pad = size_t(round_up(t.n_bytes, alignment_) - t.n_bytes);
        for (size_t left = pad; left > 0;) {
            const size_t n = std::min(left, sizeof zeros);
            file.write(zeros, n);
            left -= n;
        }
        done += pad;
    }
    file.commit();
}

}  // namespace vxq

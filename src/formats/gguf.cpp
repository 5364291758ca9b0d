#include "formats/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace vxq {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint64_t kMaxStringBytes = 1ull << 30;
constexpr int kMaxDims = 4;                    // ggml's GGML_MAX_DIMS
constexpr int kMaxArrayNesting = 4;

size_t scalar_size(GgufValueType t) {
    switch (t) {
        case GgufValueType::UINT8: case GgufValueType::INT8: case GgufValueType::BOOL: return 1;
        case GgufValueType::UINT16: case GgufValueType::INT16: return 2;
        case GgufValueType::UINT32: case GgufValueType::INT32: case GgufValueType::FLOAT32: return 4;
        case GgufValueType::UINT64: case GgufValueType::INT64: case GgufValueType::FLOAT64: return 8;
        default: return 0;
    }
}

bool is_integer(GgufValueType t) {
    switch (t) {
        case GgufValueType::UINT8: case GgufValueType::INT8: case GgufValueType::UINT16:
        case GgufValueType::INT16: case GgufValueType::UINT32: case GgufValueType::INT32:
        case GgufValueType::UINT64: case GgufValueType::INT64: return true;
        default: return false;
    }
}

bool is_float(GgufValueType t) {
    return t == GgufValueType::FLOAT32 || t == GgufValueType::FLOAT64;
}

// Bounds-checked little-endian reader over the file bytes.
class Cursor {
public:
    Cursor(const uint8_t* p, size_t n, const std::string& name) : p_(p), n_(n), name_(name) {}

    size_t offset() const { return off_; }

    [[noreturn]] void bad(const std::string& what) const {
        fail("{}: invalid GGUF at byte offset {}: {}", name_, off_, what);
    }

    void need(uint64_t bytes, const char* what) const {
        if (bytes > n_ - off_) {
            bad(fmt::format("truncated file: {} needs {} bytes, {} left", what, bytes, n_ - off_));
        }
    }

    template <typename T>
    T read(const char* what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, p_ + off_, sizeof(T));
        off_ += sizeof(T);
        return v;
    }

    std::string read_string(const char* what) {
        const uint64_t len = read<uint64_t>(what);
        if (len > kMaxStringBytes) bad(fmt::format("{} has absurd length {}", what, len));
        need(len, what);
        std::string s(reinterpret_cast<const char*>(p_ + off_), len);
        off_ += len;
        return s;
    }

    void skip(uint64_t bytes, const char* what) {
        need(bytes, what);
        off_ += bytes;
    }

    uint64_t remaining() const { return n_ - off_; }

private:
    const uint8_t* p_;
    size_t n_;
    size_t off_ = 0;
    const std::string& name_;
};

GgufValueType read_value_type(Cursor& c, const std::string& key) {
    const uint32_t t = c.read<uint32_t>("value type");
    if (t > uint32_t(GgufValueType::FLOAT64)) {
        c.bad(fmt::format("metadata key '{}' has unknown value type {}", key, t));
    }
    return GgufValueType(t);
}

int64_t read_int_scalar(Cursor& c, GgufValueType t) {
    switch (t) {
        case GgufValueType::UINT8: return c.read<uint8_t>("u8");
        case GgufValueType::INT8: return c.read<int8_t>("i8");
        case GgufValueType::UINT16: return c.read<uint16_t>("u16");
        case GgufValueType::INT16: return c.read<int16_t>("i16");
        case GgufValueType::UINT32: return c.read<uint32_t>("u32");
        case GgufValueType::INT32: return c.read<int32_t>("i32");
        case GgufValueType::UINT64: return int64_t(c.read<uint64_t>("u64"));
        case GgufValueType::INT64: return c.read<int64_t>("i64");
        case GgufValueType::BOOL: {
            const uint8_t b = c.read<uint8_t>("bool");
            if (b > 1) c.bad(fmt::format("bool value {} is neither 0 nor 1", b));
            return b;
        }
        default: VXQ_ASSERT(false);
    }
}

double read_float_scalar(Cursor& c, GgufValueType t) {
    if (t == GgufValueType::FLOAT32) return c.read<float>("f32");
    return c.read<double>("f64");
}

void read_value(Cursor& c, GgufValue& v, const std::string& key, int depth);

void read_array(Cursor& c, GgufValue& v, const std::string& key, int depth) {
    if (depth > kMaxArrayNesting) c.bad(fmt::format("metadata key '{}': arrays nested too deep", key));
    v.elem_type = read_value_type(c, key);
    const uint64_t n = c.read<uint64_t>("array length");
    const size_t es = scalar_size(v.elem_type);
    // Every element takes at least one byte (a string at least 8), so the count is bounded by
    // what is left of the file: reject before reserving memory.
    const uint64_t min_bytes = v.elem_type == GgufValueType::STRING ? 8
                             : v.elem_type == GgufValueType::ARRAY  ? 12 : es;
    if (n > c.remaining() / min_bytes) {
        c.bad(fmt::format("metadata key '{}': array of {} elements does not fit in the file (truncated or corrupt)", key, n));
    }
    if (v.elem_type == GgufValueType::STRING) {
        v.strs.reserve(n);
        for (uint64_t i = 0; i < n; ++i) v.strs.push_back(c.read_string("array string"));
    } else if (v.elem_type == GgufValueType::ARRAY) {
        // Grown as elements are read (no reserve): a GgufValue is ~50x larger than its smallest
        // encoding, so reserving from the declared count would let a small file demand a lot.
        for (uint64_t i = 0; i < n; ++i) {
            GgufValue item;
            item.type = GgufValueType::ARRAY;
            read_array(c, item, key, depth + 1);
            v.items.push_back(std::move(item));
        }
    } else if (is_float(v.elem_type)) {
        v.floats.reserve(n);
        for (uint64_t i = 0; i < n; ++i) v.floats.push_back(read_float_scalar(c, v.elem_type));
    } else {
        v.ints.reserve(n);
        for (uint64_t i = 0; i < n; ++i) v.ints.push_back(read_int_scalar(c, v.elem_type));
    }
}

void read_value(Cursor& c, GgufValue& v, const std::string& key, int depth) {
    switch (v.type) {
        case GgufValueType::STRING: v.s = c.read_string("string value"); break;
        case GgufValueType::ARRAY: read_array(c, v, key, depth + 1); break;
        case GgufValueType::FLOAT32: case GgufValueType::FLOAT64:
            v.f = read_float_scalar(c, v.type);
            break;
        default: v.i = read_int_scalar(c, v.type); break;
    }
}

}  // namespace

std::string_view gguf_value_type_name(GgufValueType t) {
    static constexpr std::string_view names[] = {"u8",  "i8",   "u16",   "i16", "u32",
                                                 "i32", "f32",  "bool",  "string",
                                                 "array", "u64", "i64",  "f64"};
    const auto i = uint32_t(t);
    return i < std::size(names) ? names[i] : std::string_view("?");
}

size_t GgufValue::array_size() const {
    if (type != GgufValueType::ARRAY) return 0;
    return ints.size() + floats.size() + strs.size() + items.size();
}

GgufFile::GgufFile(GgufFile&& o) noexcept { *this = std::move(o); }

GgufFile& GgufFile::operator=(GgufFile&& o) noexcept {
    if (this != &o) {
        if (map_) munmap(map_, size_);
        path_ = std::move(o.path_);
        base_ = o.base_;
        size_ = o.size_;
        data_ = o.data_;
        version_ = o.version_;
        alignment_ = o.alignment_;
        kv_ = std::move(o.kv_);
        kv_index_ = std::move(o.kv_index_);
        tensors_ = std::move(o.tensors_);
        tensor_index_ = std::move(o.tensor_index_);
        map_ = o.map_;
        owned_ = std::move(o.owned_);
        if (!owned_.empty()) base_ = owned_.data(), data_ = base_ + (o.data_ - o.base_);
        o.map_ = nullptr;
        o.base_ = o.data_ = nullptr;
        o.size_ = 0;
    }
    return *this;
}

GgufFile::~GgufFile() {
    if (map_) munmap(map_, size_);
}

GgufFile GgufFile::open(const std::string& path) {
    GgufFile g;
    g.path_ = path;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("{}: cannot open model file: {}", path, std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        fail("{}: not a regular file", path);
    }
    g.size_ = size_t(st.st_size);
    if (g.size_ == 0) {
        ::close(fd);
        fail("{}: invalid GGUF: the file is empty", path);
    }
    void* p = mmap(nullptr, g.size_, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) fail("{}: mmap failed: {}", path, std::strerror(errno));
    g.map_ = p;
    g.base_ = static_cast<const uint8_t*>(p);
    g.parse_all();
    return g;
}

GgufFile GgufFile::parse(std::span<const uint8_t> bytes, std::string name) {
    GgufFile g;
    g.path_ = std::move(name);
    g.owned_.assign(bytes.begin(), bytes.end());
    g.owned_.push_back(0);  // a non-empty buffer even for empty input; not part of size_
    g.base_ = g.owned_.data();
    g.size_ = bytes.size();
    g.parse_all();
    return g;
}

void GgufFile::parse_all() {
    Cursor c(base_, size_, path_);
    const uint32_t magic = c.read<uint32_t>("magic");
    if (magic != kGgufMagic) c.bad("bad magic: not a GGUF file");
    version_ = c.read<uint32_t>("version");
    if (version_ != 2 && version_ != 3) {
        c.bad(fmt::format("unsupported GGUF version {} (2 and 3 are supported)", version_));
    }
    const uint64_t n_tensors = c.read<uint64_t>("tensor count");
    const uint64_t n_kv = c.read<uint64_t>("metadata count");
    // A key-value pair takes >= 13 bytes and a tensor info >= 29: bound counts by the file size.
    if (n_kv > c.remaining() / 13) c.bad(fmt::format("metadata count {} exceeds the file", n_kv));
    if (n_tensors > c.remaining() / 29) c.bad(fmt::format("tensor count {} exceeds the file", n_tensors));

    kv_.reserve(n_kv);
    for (uint64_t i = 0; i < n_kv; ++i) {
        std::string key = c.read_string("metadata key");
        if (key.empty()) c.bad("empty metadata key");
        GgufValue v;
        v.type = read_value_type(c, key);
        read_value(c, v, key, 0);
        if (!kv_index_.emplace(key, kv_.size()).second) c.bad(fmt::format("duplicate metadata key '{}'", key));
        kv_.emplace_back(std::move(key), std::move(v));
    }

    if (const GgufValue* a = find("general.alignment")) {
        if (!is_integer(a->type) || a->i <= 0 || a->i > (1 << 20) || (a->i & (a->i - 1)) != 0) {
            c.bad("general.alignment must be a power of two integer");
        }
        alignment_ = size_t(a->i);
    }

    tensors_.reserve(n_tensors);
    for (uint64_t i = 0; i < n_tensors; ++i) {
        GgufTensorInfo t;
        t.name = c.read_string("tensor name");
        const uint32_t n_dims = c.read<uint32_t>("tensor dimension count");
        if (n_dims == 0 || n_dims > kMaxDims) {
            c.bad(fmt::format("tensor '{}' has {} dimensions (1..{} allowed)", t.name, n_dims, kMaxDims));
        }
        int64_t n_el = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            const uint64_t ne = c.read<uint64_t>("tensor dimension");
            if (ne == 0 || ne > uint64_t(std::numeric_limits<int64_t>::max()) ||
                uint64_t(n_el) > uint64_t(std::numeric_limits<int64_t>::max()) / ne) {
                c.bad(fmt::format("tensor '{}' dimension {} = {} is zero or overflows", t.name, d, ne));
            }
            n_el *= int64_t(ne);
            t.ne.push_back(int64_t(ne));
        }
        const uint32_t type_id = c.read<uint32_t>("tensor type");
        const auto traits = ggml_type_traits(type_id);
        if (!traits) c.bad(fmt::format("tensor '{}' has type id {}, which ggml does not define", t.name, type_id));
        t.type = GgmlType(type_id);
        if (t.ne[0] % traits->block_size != 0) {
            c.bad(fmt::format("tensor '{}' row of {} elements is not a multiple of the {} block size {}",
                              t.name, t.ne[0], traits->name, traits->block_size));
        }
        t.n_elements = n_el;
        // n_el < 2^63, but 2^62 f32 elements already take 2^64 bytes: check before multiplying.
        const uint64_t n_blocks = uint64_t(n_el / traits->block_size);
        if (n_blocks > std::numeric_limits<size_t>::max() / traits->block_bytes) {
            c.bad(fmt::format("tensor '{}' of {} {} elements is too large", t.name, n_el, traits->name));
        }
        t.n_bytes = size_t(n_blocks) * traits->block_bytes;
        t.offset = c.read<uint64_t>("tensor offset");
        if (t.offset % alignment_ != 0) {
            c.bad(fmt::format("tensor '{}' offset {} is not aligned to {}", t.name, t.offset, alignment_));
        }
        if (!tensor_index_.emplace(t.name, tensors_.size()).second) {
            c.bad(fmt::format("duplicate tensor name '{}'", t.name));
        }
        tensors_.push_back(std::move(t));
    }

    const size_t data_start = (c.offset() + alignment_ - 1) / alignment_ * alignment_;
    if (data_start > size_) {
        if (!tensors_.empty()) c.bad("truncated file: tensor data section is missing");
    }
    data_ = base_ + std::min(data_start, size_);
    const uint64_t data_size = size_ - std::min(data_start, size_);
    for (const auto& t : tensors_) {
        if (t.offset > data_size || t.n_bytes > data_size - t.offset) {
            fail("{}: invalid GGUF: tensor '{}' ({} bytes at data offset {}) lies past the end of the "
                 "file (data section holds {} bytes)", path_, t.name, t.n_bytes, t.offset, data_size);
        }
    }
}

const GgufValue* GgufFile::find(std::string_view key) const {
    const auto it = kv_index_.find(std::string(key));
    return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

namespace {
[[noreturn]] void wrong_type(const std::string& path, std::string_view key, GgufValueType got,
                             const char* want) {
    fail("{}: metadata key '{}' has type {}, expected {}", path, key, gguf_value_type_name(got), want);
}
}  // namespace

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (!is_integer(v->type)) wrong_type(path_, key, v->type, "an integer");
    return v->i;
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (is_float(v->type)) return v->f;
    if (is_integer(v->type)) return double(v->i);
    wrong_type(path_, key, v->type, "a number");
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (v->type != GgufValueType::BOOL) wrong_type(path_, key, v->type, "bool");
    return v->i != 0;
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (v->type != GgufValueType::STRING) wrong_type(path_, key, v->type, "string");
    return v->s;
}

const GgufValue* GgufFile::get_array(std::string_view key) const {
    const GgufValue* v = find(key);
    if (v && v->type != GgufValueType::ARRAY) wrong_type(path_, key, v->type, "array");
    return v;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
    const auto it = tensor_index_.find(std::string(name));
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace vxq

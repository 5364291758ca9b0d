#include "kv/calibration.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "core/sha256.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "kv/evict.h"

namespace vxq {

namespace {

constexpr const char* kMethod = "vxq.calibration.method";
constexpr const char* kSha = "vxq.calibration.model_sha256";
constexpr const char* kModelFile = "vxq.calibration.model_file";
constexpr const char* kTokens = "vxq.calibration.tokens";

std::string tensor_name(int64_t layer, const char* what) { return "blk." + std::to_string(layer) + "." + what; }

bool is_sha256_hex(const std::string& s) {
    if (s.size() != 64) return false;
    for (char c : s) {
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    }
    return true;
}

int64_t int_key(const GgufFile& f, const char* key, int64_t lo, int64_t hi) {
    const std::optional<int64_t> v = f.get_int(key);
    if (!v) fail("{}: calibration key '{}' is missing", f.path(), key);
    if (*v < lo || *v > hi) fail("{}: calibration key '{}' = {} is out of range [{}, {}]", f.path(), key, *v, lo, hi);
    return *v;
}

std::string string_key(const GgufFile& f, const char* key) {
    const std::optional<std::string> v = f.get_string(key);
    if (!v) fail("{}: calibration key '{}' is missing", f.path(), key);
    return *v;
}

// The F32 tensor `name` of exactly shape ne, copied; vxq::Error naming it otherwise.
std::vector<float> f32_tensor(const GgufFile& f, const std::string& name, const std::vector<int64_t>& ne) {
    const GgufTensorInfo* t = f.find_tensor(name);
    if (!t) fail("{}: calibration tensor '{}' is missing", f.path(), name);
    if (t->type != GgmlType::F32) fail("{}: calibration tensor '{}' is {}, expected F32", f.path(), name, ggml_type_name(t->type));
    if (t->ne != ne) {
        std::string got, want;
        for (int64_t v : t->ne) got += (got.empty() ? "" : ", ") + std::to_string(v);
        for (int64_t v : ne) want += (want.empty() ? "" : ", ") + std::to_string(v);
        fail("{}: calibration tensor '{}' has shape [{}], expected [{}]", f.path(), name, got, want);
    }
    std::vector<float> out(static_cast<size_t>(t->n_elements));
    std::memcpy(out.data(), f.tensor_data(*t), out.size() * sizeof(float));
    for (float v : out) {
        if (!std::isfinite(v)) fail("{}: calibration tensor '{}' holds a non-finite value", f.path(), name);
    }
    return out;
}

// The keys every calibration file starts with (method, model sha256 and file name, tokens).
template <class C>
void write_common(GgufStreamWriter& w, const char* method, const C& c) {
    w.add_string(kMethod, method);
    w.add_string(kSha, c.model_sha256);
    w.add_string(kModelFile, c.model_file);
    w.add(kTokens, GgufWriterValue::i64(c.tokens));
}

// Reads them back; vxq::Error unless the file is a calibration for `method`.
template <class C>
void read_common(const GgufFile& f, const char* method, C& c) {
    const std::string m = string_key(f, kMethod);
    if (m != method) fail("{}: a calibration for '{}', not for {}", f.path(), m, method);
    c.model_sha256 = string_key(f, kSha);
    if (!is_sha256_hex(c.model_sha256)) fail("{}: '{}' is not a sha256 (64 lowercase hex digits)", f.path(), kSha);
    c.model_file = string_key(f, kModelFile);
    c.tokens = int_key(f, kTokens, 1, INT64_MAX);
}

// Writes the file, tensor i's rows from *data[i] (f32, ne[0] contiguous).
void write_f32_tensors(GgufStreamWriter& w, const std::string& path, const std::vector<const std::vector<float>*>& data) {
    w.write(path, [&](size_t tensor, int64_t row0, int64_t n_rows, std::span<uint8_t> out) {
        const int64_t row = w.tensors()[tensor].ne[0];
        std::memcpy(out.data(), data[tensor]->data() + row0 * row, size_t(n_rows * row) * sizeof(float));
    });
}

}  // namespace

void save_vecinfer_calibration(const std::string& path, const VecinferCalibration& c) {
    const int64_t d = c.head_dim, J = d / c.n, K = int64_t(1) << c.m;
    VXQ_ASSERT(int64_t(c.layers.size()) == c.n_layer && is_sha256_hex(c.model_sha256));
    GgufStreamWriter w;
    write_common(w, "vecinfer", c);
    w.add("vecinfer.n", GgufWriterValue::i64(c.n));
    w.add("vecinfer.m", GgufWriterValue::i64(c.m));
    w.add("vecinfer.layers", GgufWriterValue::i64(c.n_layer));
    w.add("vecinfer.kv_heads", GgufWriterValue::i64(c.n_head_kv));
    w.add("vecinfer.head_dim", GgufWriterValue::i64(d));
    w.add("vecinfer.iterations", GgufWriterValue::i64(c.iterations));
    w.add("vecinfer.seed", GgufWriterValue::u64(c.seed));
    std::vector<const std::vector<float>*> data;
    for (int64_t l = 0; l < c.n_layer; ++l) {
        const VecinferCalibration::Layer& L = c.layers[size_t(l)];
        VXQ_ASSERT(int64_t(L.key_lambda.size()) == d && int64_t(L.key_codebook.size()) == d * K &&
                   int64_t(L.value_codebook.size()) == d * K);
        w.add_tensor(tensor_name(l, "key_lambda"), {d}, GgmlType::F32);
        w.add_tensor(tensor_name(l, "key_codebook"), {c.n, K, J}, GgmlType::F32);
        w.add_tensor(tensor_name(l, "value_codebook"), {c.n, K, J}, GgmlType::F32);
        data.insert(data.end(), {&L.key_lambda, &L.key_codebook, &L.value_codebook});
    }
    write_f32_tensors(w, path, data);
}

VecinferCalibration load_vecinfer_calibration(const std::string& path) {
    const GgufFile f = GgufFile::open(path);
    VecinferCalibration c;
    read_common(f, "vecinfer", c);
    c.n = int(int_key(f, "vecinfer.n", 1, 64));
    c.m = int(int_key(f, "vecinfer.m", 1, 8));
    c.n_layer = int_key(f, "vecinfer.layers", 1, 4096);
    c.n_head_kv = int_key(f, "vecinfer.kv_heads", 1, 4096);
    c.head_dim = int_key(f, "vecinfer.head_dim", 1, 1024);
    c.iterations = int(int_key(f, "vecinfer.iterations", 0, 1000));
    c.seed = uint64_t(int_key(f, "vecinfer.seed", INT64_MIN, INT64_MAX));
    if (!std::has_single_bit(uint64_t(c.head_dim)) || !std::has_single_bit(unsigned(c.n)) || c.head_dim % c.n != 0) {
        fail("{}: head_dim {} and n {} must be powers of two, n dividing head_dim", path, c.head_dim, c.n);
    }
    const int64_t d = c.head_dim, J = d / c.n, K = int64_t(1) << c.m;
    if (int64_t(f.tensors().size()) != 3 * c.n_layer) {
        fail("{}: {} tensors, expected 3 per layer for {} layers", path, f.tensors().size(), c.n_layer);
    }
    c.layers.resize(size_t(c.n_layer));
    for (int64_t l = 0; l < c.n_layer; ++l) {
        VecinferCalibration::Layer& L = c.layers[size_t(l)];
        L.key_lambda = f32_tensor(f, tensor_name(l, "key_lambda"), {d});
        L.key_codebook = f32_tensor(f, tensor_name(l, "key_codebook"), {c.n, K, J});
        L.value_codebook = f32_tensor(f, tensor_name(l, "value_codebook"), {c.n, K, J});
        for (float v : L.key_lambda) {
            if (!(v > 0.0f)) fail("{}: calibration tensor '{}' holds a factor <= 0", path, tensor_name(l, "key_lambda"));
        }
    }
    return c;
}

void save_qfilters_calibration(const std::string& path, const QFiltersCalibration& c) {
    VXQ_ASSERT(is_sha256_hex(c.model_sha256) && int64_t(c.filters.size()) == c.n_layer * c.n_head_kv * c.head_dim);
    GgufStreamWriter w;
    write_common(w, "qfilters", c);
    w.add("qfilters.layers", GgufWriterValue::i64(c.n_layer));
    w.add("qfilters.kv_heads", GgufWriterValue::i64(c.n_head_kv));
    w.add("qfilters.head_dim", GgufWriterValue::i64(c.head_dim));
    w.add_tensor("qfilters", {c.head_dim, c.n_head_kv, c.n_layer}, GgmlType::F32);
    write_f32_tensors(w, path, {&c.filters});
}

QFiltersCalibration load_qfilters_calibration(const std::string& path) {
    const GgufFile f = GgufFile::open(path);
    QFiltersCalibration c;
    read_common(f, "qfilters", c);
    c.n_layer = int_key(f, "qfilters.layers", 1, 4096);
    c.n_head_kv = int_key(f, "qfilters.kv_heads", 1, 4096);
    c.head_dim = int_key(f, "qfilters.head_dim", 1, 1024);
    if (f.tensors().size() != 1) fail("{}: {} tensors, expected 1 (qfilters)", path, f.tensors().size());
    c.filters = f32_tensor(f, "qfilters", {c.head_dim, c.n_head_kv, c.n_layer});
    return c;
}

void save_turbo_calibration(const std::string& path, const TurboCalibration& c) {
    const int64_t d = c.head_dim;
    VXQ_ASSERT(int64_t(c.layers.size()) == c.n_layer && is_sha256_hex(c.model_sha256));
    GgufStreamWriter w;
    write_common(w, "turbo", c);
    w.add("turbo.layers", GgufWriterValue::i64(c.n_layer));
    w.add("turbo.head_dim", GgufWriterValue::i64(d));
    std::vector<const std::vector<float>*> data;
    for (int64_t l = 0; l < c.n_layer; ++l) {
        const TurboCalibration::Layer& L = c.layers[size_t(l)];
        VXQ_ASSERT(int64_t(L.key_basis.size()) == d * d && int64_t(L.value_basis.size()) == d * d &&
                   int64_t(L.key_variance.size()) == d && int64_t(L.value_variance.size()) == d &&
                   int64_t(L.key_weight.size()) == d);
        w.add_tensor(tensor_name(l, "key_basis"), {d, d}, GgmlType::F32);
        w.add_tensor(tensor_name(l, "key_variance"), {d}, GgmlType::F32);
        w.add_tensor(tensor_name(l, "value_basis"), {d, d}, GgmlType::F32);
        w.add_tensor(tensor_name(l, "value_variance"), {d}, GgmlType::F32);
        w.add_tensor(tensor_name(l, "key_weight"), {d}, GgmlType::F32);
        data.insert(data.end(), {&L.key_basis, &L.key_variance, &L.value_basis, &L.value_variance, &L.key_weight});
    }
    write_f32_tensors(w, path, data);
}

TurboCalibration load_turbo_calibration(const std::string& path) {
    const GgufFile f = GgufFile::open(path);
    TurboCalibration c;
    read_common(f, "turbo", c);
    c.n_layer = int_key(f, "turbo.layers", 1, 4096);
    c.head_dim = int_key(f, "turbo.head_dim", 1, 1024);
    const int64_t d = c.head_dim;
    if (int64_t(f.tensors().size()) != 5 * c.n_layer) {
        fail("{}: {} tensors, expected 5 per layer for {} layers", path, f.tensors().size(), c.n_layer);
    }
    c.layers.resize(size_t(c.n_layer));
    for (int64_t l = 0; l < c.n_layer; ++l) {
        TurboCalibration::Layer& L = c.layers[size_t(l)];
        for (const char* role : {"key", "value"}) {
            const bool key = role[0] == 'k';
            std::vector<float>& basis = key ? L.key_basis : L.value_basis;
            std::vector<float>& var = key ? L.key_variance : L.value_variance;
            const std::string bn = tensor_name(l, key ? "key_basis" : "value_basis");
            const std::string vn = tensor_name(l, key ? "key_variance" : "value_variance");
            basis = f32_tensor(f, bn, {d, d});
            var = f32_tensor(f, vn, {d});
            for (float v : var) {
                if (v < 0.0f) fail("{}: calibration tensor '{}' holds a negative variance", path, vn);
            }
            for (int64_t i = 0; i < d; ++i) {  // rows of unit length (orthonormality within float rounding)
                double n2 = 0.0;
                for (int64_t k = 0; k < d; ++k) n2 += double(basis[size_t(i * d + k)]) * basis[size_t(i * d + k)];
                if (std::fabs(n2 - 1.0) > 1e-3) fail("{}: calibration tensor '{}': row {} is not a unit vector", path, bn, i);
            }
        }
        L.key_weight = f32_tensor(f, tensor_name(l, "key_weight"), {d});
        for (float v : L.key_weight) {
            if (!(v > 0.0f)) fail("{}: calibration tensor '{}' holds a weight <= 0", path, tensor_name(l, "key_weight"));
        }
    }
    return c;
}

namespace {

// vxq::Error unless the calibration (file `calib`, made from `calib_model` with sha `calib_sha`)
// belongs to the model at model_path; `model_sha` caches the model's sha256 between calls.
void check_model_sha(const std::string& calib, const std::string& calib_model, const std::string& calib_sha,
                     const std::string& model_path, std::string& model_sha) {
    if (model_sha.empty()) model_sha = sha256_file(model_path);
    if (calib_sha != model_sha) {
        fail("{}: calibration of another model ({}, sha256 {}...), not {} (sha256 {}...); run vxq calibrate on this model",
             calib, calib_model, calib_sha.substr(0, 12), std::filesystem::path(model_path).filename().string(),
             model_sha.substr(0, 12));
    }
}

}  // namespace

void check_calibration_model(const KvSpec& spec, const std::string& model_path) {
    std::string model_sha;
    for (const CodecSpec* s : {&spec.k, &spec.v}) {
        const auto it = s->options.find("calib");
        if (it == s->options.end() || it->second == "random") continue;
        if (s->name == "vecinfer") {
            const VecinferCalibration c = load_vecinfer_calibration(it->second);
            check_model_sha(it->second, c.model_file, c.model_sha256, model_path, model_sha);
        } else if (s->name == "turbo") {
            const TurboCalibration c = load_turbo_calibration(it->second);
            check_model_sha(it->second, c.model_file, c.model_sha256, model_path, model_sha);
        }  // other codecs refuse an option they do not have
    }
}

void check_calibration_model(const EvictSpec& spec, const std::string& model_path) {
    if (spec.policy != EvictPolicy::QFilters) return;
    const QFiltersCalibration c = load_qfilters_calibration(spec.calib);
    std::string model_sha;
    check_model_sha(spec.calib, c.model_file, c.model_sha256, model_path, model_sha);
}

}  // namespace vxq

#include "model/config.h"

#include <cmath>

#include "core/error.h"
#include "formats/gguf.h"

namespace vxq {

namespace {

int64_t require_int(const GgufFile& f, const std::string& key) {
    const auto v = f.get_int(key);
    if (!v) fail("{}: missing metadata key '{}'", f.path(), key);
    return *v;
}

void require_range(const GgufFile& f, const std::string& key, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi) fail("{}: metadata '{}' = {} is out of range [{}, {}]", f.path(), key, v, lo, hi);
}

}  // namespace

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
    ModelConfig c;
    const auto arch = f.get_string("general.architecture");
    if (!arch) fail("{}: missing metadata key 'general.architecture'", f.path());
    c.arch = *arch;
    if (c.arch == "llama") {
        c.rope_style = RopeStyle::Normal;
    } else if (c.arch == "qwen2") {
        c.rope_style = RopeStyle::NeoX;
        c.attn_qkv_bias = true;
    } else if (c.arch == "qwen3") {
        c.rope_style = RopeStyle::NeoX;
        c.attn_qk_norm = true;
    } else {
        fail("{}: unsupported model architecture '{}' (supported: llama, qwen2, qwen3)", f.path(), c.arch);
    }
    c.name = f.get_string("general.name").value_or("");
    const std::string p = c.arch + ".";
    constexpr int64_t kBig = int64_t(1) << 24;
    c.n_embd = require_int(f, p + "embedding_length");
    require_range(f, p + "embedding_length", c.n_embd, 1, kBig);
    c.n_layer = require_int(f, p + "block_count");
    require_range(f, p + "block_count", c.n_layer, 1, 4096);
    c.n_head = require_int(f, p + "attention.head_count");
    require_range(f, p + "attention.head_count", c.n_head, 1, 4096);
    c.n_head_kv = f.get_int(p + "attention.head_count_kv").value_or(c.n_head);
    require_range(f, p + "attention.head_count_kv", c.n_head_kv, 1, c.n_head);
    if (c.n_head % c.n_head_kv != 0) {
        fail("{}: head_count {} is not a multiple of head_count_kv {}", f.path(), c.n_head, c.n_head_kv);
    }
    c.n_ff = require_int(f, p + "feed_forward_length");
    require_range(f, p + "feed_forward_length", c.n_ff, 1, kBig);
    c.n_ctx_train = f.get_int(p + "context_length").value_or(2048);
    require_range(f, p + "context_length", c.n_ctx_train, 1, int64_t(1) << 30);
    c.head_dim = f.get_int(p + "attention.key_length").value_or(c.n_embd / c.n_head);
    require_range(f, p + "attention.key_length", c.head_dim, 2, 1024);
    const int64_t v_len = f.get_int(p + "attention.value_length").value_or(c.head_dim);
    if (v_len != c.head_dim) {
        fail("{}: attention.value_length {} differs from key_length {} (unsupported)", f.path(), v_len, c.head_dim);
    }
    if (c.head_dim % 2 != 0) fail("{}: head dimension {} is odd", f.path(), c.head_dim);
    c.n_rot = f.get_int(p + "rope.dimension_count").value_or(c.head_dim);
    require_range(f, p + "rope.dimension_count", c.n_rot, 2, c.head_dim);
    if (c.n_rot % 2 != 0) fail("{}: rope.dimension_count {} is odd", f.path(), c.n_rot);
    c.rms_eps = float(f.get_float(p + "attention.layer_norm_rms_epsilon").value_or(1e-5));
    if (!(c.rms_eps > 0.0f && c.rms_eps < 1.0f)) fail("{}: layer_norm_rms_epsilon {} is out of range", f.path(), c.rms_eps);
    c.rope_freq_base = float(f.get_float(p + "rope.freq_base").value_or(10000.0));
    if (!(c.rope_freq_base > 1.0f) || !std::isfinite(c.rope_freq_base)) {
        fail("{}: rope.freq_base {} is out of range", f.path(), c.rope_freq_base);
    }
    if (const auto s = f.get_string(p + "rope.scaling.type"); s && *s != "none") {
        fail("{}: rope scaling '{}' is not supported", f.path(), *s);
    }
    return c;
}

}  // namespace vxq

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "kv/codecs/codecs.h"

namespace vxq {

namespace {

struct Entry {
    CodecInfo info;
    CodecFactory make;
};

std::vector<Entry>& entries() {
    static std::vector<Entry> e = {
        {{"f16", "", "IEEE half precision (llama.cpp's default cache)"}, codecs::make_f16},
        {{"bf16", "", "bfloat16"}, codecs::make_bf16},
        {{"f32", "", "single precision"}, codecs::make_f32},
        {{"q8_0", "", "llama.cpp q8_0 blocks: 32 int8 + fp16 scale along head_dim"}, codecs::make_q8_0},
        {{"q4_0", "", "llama.cpp q4_0 blocks: 32 4-bit codes + fp16 scale along head_dim"}, codecs::make_q4_0},
        {{"fp8", "scale=prompt|S (prompt)", "e4m3fn, one fp32 scale per (layer, KV head): amax/448 of a prompt of >= 16 tokens, else 1"}, codecs::make_fp8},
        {{"kivi", "bits=2|4|8 (2), group=G (32), residual=R (128, multiple of G)",
          "KIVI: per-channel keys over G tokens, per-token values over G channels, fp16 window of R"},
         codecs::make_kivi},
    };
    return e;
}

}  // namespace

CodecSpec CodecSpec::parse(const std::string& text) {
    CodecSpec s;
    const size_t colon = text.find(':');
    s.name = text.substr(0, colon);
    if (s.name.empty()) fail("empty KV cache method in '{}'", text);
    if (colon == std::string::npos) return s;
    std::string rest = text.substr(colon + 1);
    size_t pos = 0;
    while (pos <= rest.size()) {
        const size_t comma = std::min(rest.find(',', pos), rest.size());
        const std::string kv = rest.substr(pos, comma - pos);
        const size_t eq = kv.find('=');
        if (eq == std::string::npos || eq == 0 || eq + 1 == kv.size()) {
            fail("bad option '{}' in KV cache method '{}' (expected key=value)", kv, text);
        }
        if (!s.options.emplace(kv.substr(0, eq), kv.substr(eq + 1)).second) {
            fail("option '{}' given twice in '{}'", kv.substr(0, eq), text);
        }
        pos = comma + 1;
    }
    return s;
}

std::string CodecSpec::str() const {
    std::string out = name;
    char sep = ':';
    for (const auto& [k, v] : options) {
        out += sep + k + "=" + v;
        sep = ',';
    }
    return out;
}

std::unique_ptr<Codec> make_codec(const CodecSpec& spec, KvRole role, int64_t head_dim) {
    for (const auto& e : entries()) {
        if (e.info.name == spec.name) return e.make(spec, role, head_dim);
    }
    std::string names;
    for (const auto& e : entries()) names += (names.empty() ? "" : ", ") + e.info.name;
    fail("unknown KV cache method '{}' (available: {})", spec.name, names);
}

void register_codec(const CodecInfo& info, CodecFactory make) {
    if (info.name.empty() || info.name.find_first_of(":,/=") != std::string::npos) {
        fail("cannot register KV method '{}': a name is non-empty and has none of ':,/='", info.name);
    }
    for (const auto& e : entries()) {
        if (e.info.name == info.name) fail("KV method '{}' is already registered", info.name);
    }
    entries().push_back({info, make});
}

std::vector<CodecInfo> list_codecs() {
    std::vector<CodecInfo> out;
    for (const auto& e : entries()) out.push_back(e.info);
    return out;
}

}  // namespace vxq

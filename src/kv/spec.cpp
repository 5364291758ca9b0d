#include "kv/spec.h"

#include <algorithm>

#include "core/error.h"

namespace vxq {

namespace {

// The '/' that separates K from V in a pair, or npos. A file path option (`calib=PATH`, a
// calibration file) may hold '/': its value runs to the next ',' and its slashes are not
// separators (a pair with a calibrated K is written with calib= before another option, or with
// -ctk / -ctv).
size_t pair_slash(const std::string& text) {
    bool in_path = false;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (c == ',' || c == ':') {
            in_path = text.compare(i + 1, 6, "calib=") == 0;
        } else if (c == '/' && !in_path) {
            return i;
        }
    }
    return std::string::npos;
}

}  // namespace

CodecSpec CodecSpec::parse(const std::string& text) {
    CodecSpec s;
    if (pair_slash(text) != std::string::npos) fail("KV cache method '{}' names two methods where one is expected", text);
    const size_t colon = text.find(':');
    s.name = text.substr(0, colon);
    if (s.name.empty()) fail("empty KV cache method in '{}'", text);
    if (colon == std::string::npos) return s;
    const std::string rest = text.substr(colon + 1);
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

KvSpec KvSpec::parse(const std::string& text) {
    const size_t slash = pair_slash(text);
    if (slash == std::string::npos) {
        if (text.empty()) fail("empty KV cache method (e.g. f16, q4_0, kivi:bits=2; vxq methods lists them)");
        const CodecSpec m = CodecSpec::parse(text);
        return KvSpec{m, m};
    }
    const std::string k = text.substr(0, slash), v = text.substr(slash + 1);
    if (k.empty() || v.empty()) fail("KV cache pair '{}' needs a method on both sides of '/' (K/V, e.g. q4_0/f16)", text);
    return KvSpec{CodecSpec::parse(k), CodecSpec::parse(v)};
}

KvSpec KvSpec::from_flags(const std::string& kv, const std::string& ctk, const std::string& ctv) {
    KvSpec s = kv.empty() ? KvSpec{} : parse(kv);
    if (!ctk.empty()) s.k = CodecSpec::parse(ctk);
    if (!ctv.empty()) s.v = CodecSpec::parse(ctv);
    return s;
}

std::string KvSpec::str() const {
    const std::string a = k.str(), b = v.str();
    return a == b ? a : a + "/" + b;
}

}  // namespace vxq

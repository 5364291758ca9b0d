#include "kv/codecs/option_parse.h"

#include <charconv>

#include "core/error.h"

namespace vxq::codecs {

int64_t int_option(const CodecSpec& spec, const std::string& key, int64_t def, int64_t lo, int64_t hi) {
    const auto it = spec.options.find(key);
    if (it == spec.options.end()) return def;
    int64_t v = 0;
    const auto* b = it->second.data();
    const auto* e = b + it->second.size();
    const auto r = std::from_chars(b, e, v);
    if (r.ec != std::errc() || r.ptr != e) fail("KV method '{}': option {}={} is not an integer", spec.name, key, it->second);
    if (v < lo || v > hi) fail("KV method '{}': option {}={} is out of range [{}, {}]", spec.name, key, v, lo, hi);
    return v;
}

void check_known_options(const CodecSpec& spec, std::initializer_list<const char*> known) {
    for (const auto& [k, v] : spec.options) {
        bool ok = false;
        for (const char* n : known) ok |= k == n;
        if (!ok) fail("KV method '{}' has no option '{}'", spec.name, k);
    }
}

}  // namespace vxq::codecs

// KV cache method specs, parsed in one place. A method is "name[:key=value,...]" (CodecSpec);
// a cache takes a K/V pair: "--kv q4_0" (both), "--kv q4_0/f16" (K q4_0, V f16), or
// "-ctk q4_0 -ctv f16" as in llama.cpp (KvSpec).
#pragma once

#include <map>
#include <string>

namespace vxq {

struct CodecSpec {
    std::string name;
    std::map<std::string, std::string> options;

    static CodecSpec parse(const std::string& text);  // vxq::Error on malformed text
    std::string str() const;
    bool is_plain(const char* n) const { return name == n && options.empty(); }
};

struct KvSpec {
    CodecSpec k{"f16", {}};
    CodecSpec v{"f16", {}};

    // "M" (K = V = M) or "MK/MV". vxq::Error on an empty half or malformed method.
    static KvSpec parse(const std::string& text);
    // From the CLI: --kv SPEC, and -ctk / -ctv which override its halves; all empty = f16.
    static KvSpec from_flags(const std::string& kv, const std::string& ctk, const std::string& ctv);
    std::string str() const;  // "q4_0", or "q4_0/f16" when K and V differ
};

}  // namespace vxq

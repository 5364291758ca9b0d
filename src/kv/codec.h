// A KV codec: how one KV head's keys or values are stored and read back. A codec is a plug-in:
// it defines its packed block format, a scalar reference encoder/decoder, and a *reader* that
// the fused attention kernel (kernels/cpu/attention_fused.h) calls to score keys or accumulate
// values directly from the packed bytes. Adding a codec never touches the attention kernel.
//
// Storage model (kv/paged_cache.cpp): per (layer, KV head, K or V), tokens arrive one by one and
// wait in an fp16 residual window; once `flush_at()` are pending, the oldest `flush_count()` are
// encoded together as whole blocks of `block_tokens()` tokens. Token-wise formats (q8_0, fp8, ...)
// have block_tokens = 1, flush_at = 1: every token is encoded on arrival. KIVI keys use groups of
// G tokens per channel and a residual window of R tokens (flush_at = R, flush_count = R); KIVI
// values keep the R newest tokens in fp16 (flush_at = R + 1, flush_count = 1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/kv_reader.h"

namespace vxq {

// A parsed "--kv" spec: "kivi:bits=2,group=32,residual=128" -> name "kivi" + options.
struct CodecSpec {
    std::string name;
    std::map<std::string, std::string> options;

    static CodecSpec parse(const std::string& text);  // vxq::Error on malformed text
    std::string str() const;
};

enum class KvRole { Key, Value };

class Codec {
public:
    virtual ~Codec() = default;

    virtual std::string spec() const = 0;        // canonical spec, e.g. "kivi:bits=2,group=32,residual=128"
    virtual int64_t block_tokens() const { return 1; }
    virtual size_t block_bytes(int64_t head_dim) const = 0;
    virtual int64_t flush_at() const { return 1; }
    virtual int64_t flush_count() const { return 1; }

    // Called once with the first batch of tokens this stream receives (the prompt), before any
    // encode: codecs with a per-(layer, head) scale (fp8) set it here.   x: [n, head_dim]
    virtual void observe_first_batch(const float* x, int64_t n, int64_t head_dim) {}

    // x: [block_tokens, head_dim] f32 -> one packed block. The scalar reference of the format.
    virtual void encode(const float* x, int64_t head_dim, uint8_t* block) const = 0;
    // One packed block -> x: [block_tokens, head_dim].
    virtual void decode(const uint8_t* block, int64_t head_dim, float* x) const = 0;

    // Bits per element of the encoded part (codes + scales/zeros/norms), excluding the window.
    double bits_per_element(int64_t head_dim) const {
        return 8.0 * double(block_bytes(head_dim)) / double(block_tokens() * head_dim);
    }

    virtual const CodecReader& reader() const = 0;
};

struct CodecInfo {
    std::string name;
    std::string options;       // human-readable option list with defaults
    std::string description;
};

// Registry (kv/codecs/registry.cpp lists every codec's factory): `make_codec` validates the
// options (vxq::Error naming an unknown codec or option, or a bad value) and builds the codec
// for a role and head dimension.
using CodecFactory = std::unique_ptr<Codec> (*)(const CodecSpec&, KvRole, int64_t head_dim);
std::unique_ptr<Codec> make_codec(const CodecSpec& spec, KvRole role, int64_t head_dim);
std::vector<CodecInfo> list_codecs();
// Adds a codec at run time (a plug-in outside the built-in list; tests register deliberately
// broken ones). Not thread-safe: register before building caches. vxq::Error on a taken name.
void register_codec(const CodecInfo& info, CodecFactory make);

}  // namespace vxq

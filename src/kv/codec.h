// A KV codec: the storage format of one (layer, KV head) stream of keys or values. A codec is
// data plus its scalar reference: its block layout (`params()`, plain data any backend reads),
// encode and decode. It knows nothing of attention: each backend has a reader per format kind
// (kernels/cpu/kv_reader.h) that scores keys or accumulates values from the packed bytes, so
// adding a codec never touches the attention kernel.
//
// Storage model (kv/kv_cache.cpp): per (layer, KV head, K or V), tokens arrive one by one and
// wait in an fp16 residual window; once `flush_at()` are pending, the oldest `flush_count()` are
// encoded together as whole blocks of `block_tokens()` tokens. Token-wise formats (q8_0, fp8, ...)
// have block_tokens = 1, flush_at = 1: every token is encoded on arrival. KIVI keys use groups of
// G tokens per channel and a residual window of R tokens (flush_at = R, flush_count = R); KIVI
// values keep the R newest tokens in fp16 (flush_at = R + 1, flush_count = 1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kv/format.h"
#include "kv/spec.h"

namespace vxq {

enum class KvRole { Key, Value };

// State a codec keeps per layer, shared by the layer's KV heads (a rotation, a codebook, a
// calibration). Created once per (layer, role) by the cache; its bytes count as resident.
class KvLayerState {
public:
    KvLayerState();  // takes the next id
    KvLayerState(const KvLayerState&) = delete;
    KvLayerState& operator=(const KvLayerState&) = delete;
    virtual ~KvLayerState() = default;
    virtual size_t bytes() const = 0;
    // Unique in the process (never reused, unlike an address): what a backend keys its own copy
    // of the state by (the CUDA backend's device copy of a TurboQuant rotation and codebooks).
    uint64_t id() const { return id_; }

private:
    uint64_t id_;
};

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
    // Whether observe_first_batch reads a first batch of n tokens (a device cache copies it to the
    // host only then).
    virtual bool wants_first_batch(int64_t n) const { return false; }

    // x: [block_tokens, head_dim] f32 -> one packed block. The scalar reference of the format.
    virtual void encode(const float* x, int64_t head_dim, uint8_t* block) const = 0;
    // One packed block -> x: [block_tokens, head_dim].
    virtual void decode(const uint8_t* block, int64_t head_dim, float* x) const = 0;

    // The block layout as plain data for the backends' readers.
    virtual KvFormatParams params(int64_t head_dim) const = 0;

    // Bits per element of the encoded part (codes + scales/zeros/norms), excluding the window.
    double bits_per_element(int64_t head_dim) const {
        return 8.0 * double(block_bytes(head_dim)) / double(block_tokens() * head_dim);
    }
};

// One row of the registry (kv/codecs/registry.cpp): the method's name, options, the bits per
// element it stores (a formula), what it is, which backends read it in place, and its factories.
using CodecFactory = std::unique_ptr<Codec> (*)(const CodecSpec&, KvRole, int64_t head_dim, const KvLayerState* state);
using LayerStateFactory = std::unique_ptr<KvLayerState> (*)(const CodecSpec&, KvRole, int64_t head_dim, int64_t layer);

struct CodecInfo {
    std::string name;
    std::string options;       // human-readable option list with defaults
    std::string description;
    std::string bits;          // bits/element formula, e.g. "8.5" or "16/G + b + 16/G (keys)"
    // Backends (make_backend names) with a reader for its blocks: the one list of which backend
    // can attend over which method; --device checks a run's methods against it.
    std::vector<std::string> backends = {"cpu"};
    // Specs that exercise the method (its default first, then notable options): what the tests
    // iterate, so a new row is tested without touching them.
    std::vector<std::string> variants = {};
};

// `make_codec` validates the options (vxq::Error naming an unknown codec or option, or a bad
// value) and builds the codec for a role and head dimension; `state` is the layer's state from
// `make_layer_state` (nullptr for codecs without one).
std::unique_ptr<Codec> make_codec(const CodecSpec& spec, KvRole role, int64_t head_dim,
                                  const KvLayerState* state = nullptr);
// The layer state of a method, or nullptr when it keeps none.
std::unique_ptr<KvLayerState> make_layer_state(const CodecSpec& spec, KvRole role, int64_t head_dim, int64_t layer);
std::vector<CodecInfo> list_codecs();
// Whether `backend` reads the blocks of `method` (a registered name; vxq::Error naming an unknown one).
bool codec_has_reader(const std::string& method, std::string_view backend);
// Adds a codec at run time (a plug-in outside the built-in list; tests register deliberately
// broken ones). Not thread-safe: register before building caches. vxq::Error on a taken name.
void register_codec(CodecInfo info, CodecFactory make, LayerStateFactory make_state = nullptr);

}  // namespace vxq

// A codec of a spec with its layer state, as a KV cache builds them (make_layer_state, then
// make_codec over that state): for tests of one codec's encode/decode and readers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kv/codec.h"

namespace vxq::test {

struct BoundCodec {
    std::unique_ptr<KvLayerState> state;
    std::unique_ptr<Codec> codec;
    BoundCodec(const std::string& spec, KvRole role, int64_t d, int64_t layer = 0)
        : state(make_layer_state(CodecSpec::parse(spec), role, d, layer)),
          codec(make_codec(CodecSpec::parse(spec), role, d, state.get())) {}
};

}  // namespace vxq::test

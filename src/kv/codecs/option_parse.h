// Reading a codec's options: integers with a range, and rejecting options it does not know.
#pragma once

#include <initializer_list>
#include <string>

#include "kv/codec.h"

namespace vxq::codecs {

// The integer option `key` of spec (or `def` when absent), checked to lie in [lo, hi].
int64_t int_option(const CodecSpec& spec, const std::string& key, int64_t def, int64_t lo, int64_t hi);
// vxq::Error naming the first option of spec that is not in `known`.
void check_known_options(const CodecSpec& spec, std::initializer_list<const char*> known);

}  // namespace vxq::codecs

// The CPU reader of VecInfer blocks (kv/formats/vecinfer.h), kv_read_vecinfer.cpp.
#pragma once

#include <cstdint>

namespace vxq::cpu {

// How many query lookup tables (LUT[j][c] = <q~_j, C_j[c]>, one per query head) the VecInfer
// reader has built in this process: prepare_query builds them, never scores(), so a test reads
// it around an attention call to see that none is built per cached token.
uint64_t vecinfer_lut_builds();

}  // namespace vxq::cpu

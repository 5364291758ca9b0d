// The AVX2 kernel of the QJL reader (kv_read_qjl_avx2.cpp): plain pointers only, so that file
// includes no project header (kv_read_baseline_avx2.cpp says why).
#pragma once

#include <cstdint>

namespace vxq::cpu::qjl_avx2 {

// sum_i (bit i ? v_i : -v_i) over m packed sign bits (bit i % 8 of byte i / 8), m a multiple
// of 8, in 8 lanes (two accumulators) then across them.   v: [m]
float signed_sum(const float* v, const uint8_t* bits, int64_t m);

}  // namespace vxq::cpu::qjl_avx2

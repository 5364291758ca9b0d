// CPU readers of the KIVI format (kv/formats/kivi.h): the scalar reference and the AVX2 kernels,
// exposed so the tests can reach each one. Blocks consecutive, `n` a multiple of block tokens;
// the contract of KvReader::scores / accumulate.
#pragma once

#include <cstdint>

#include "kv/formats/kivi.h"

namespace vxq::cpu::kivi {

using codecs::kivi::Layout;

void key_scores_scalar(const Layout& l, const float* q, int64_t n_q, const uint8_t* blk, int64_t n,
                       int64_t head_dim, float* s);
void value_accumulate_scalar(const Layout& l, const float* p, int64_t n_q, const uint8_t* blk, int64_t n,
                             int64_t head_dim, float* acc);
// AVX2 + FMA + F16C (kv_read_kivi_avx2.cpp); call only when kv_avx2_available().
void key_scores_avx2(const Layout& l, const float* q, int64_t n_q, const uint8_t* blk, int64_t n,
                     int64_t head_dim, float* s);
void value_accumulate_avx2(const Layout& l, const float* p, int64_t n_q, const uint8_t* blk, int64_t n,
                           int64_t head_dim, float* acc);

}  // namespace vxq::cpu::kivi

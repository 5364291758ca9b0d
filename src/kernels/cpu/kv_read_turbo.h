// The AVX2 kernels of the TurboQuant reader (kv_read_turbo_avx2.cpp) for the MSE-only blocks
// (turbo, turbo-rvq, turbo-prod's values): what they need of a block's layout and state, in plain
// fields, so that file includes no project header (kv_read_baseline_avx2.cpp says why).
// turbo-prod keys (the QJL term) stay on the scalar reader; turbo:rot=calib (a bit count and a
// scaled codebook per coordinate) has its own entry points.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vxq::cpu::turbo_avx2 {

// One token's block: [n fp16][idx1: d x bits][idx2: d x bits (rvq)], codebooks in rotated units.
struct CodePage {
    int64_t d = 0;
    size_t block_bytes = 0;
    size_t idx1_offset = 0;
    size_t idx2_offset = 0;
    int bits = 0;               // 1..4, both stages
    const float* cb1 = nullptr;  // [2^bits]
    const float* cb2 = nullptr;  // [2^bits], rvq; nullptr for one stage
};

// turbo:rot=calib's block: [n fp16][index area: coordinate k's bits[k] bits at bit offset[k]],
// y_t[k] = scale[k] * cb[bits[k]][index] (0 for 0 bits; kv/formats/turbo.h, State::cbk).
struct CalibPage {
    int64_t d = 0;
    size_t block_bytes = 0;
    size_t idx_offset = 0;
    size_t idx_bytes = 0;             // the index area, whole bytes
    const uint8_t* bits = nullptr;    // [d], 0..8
    const int32_t* offset = nullptr;  // [d]
    const float* scale = nullptr;     // [d]
    const float* cb[9] = {};          // [2^w] the N(0, 1) codebook of w bits (cb[0] = {0}); nullptr above the widest
};

// s[h * n + t] = n_t * <q'_h, y_t>.   q: [n_q, d] rotated queries; s: [n_q, n]
void key_scores(const CodePage& c, const float* q, int64_t n_q, const uint8_t* blk, int64_t n, float* s);
void key_scores(const CalibPage& c, const float* q, int64_t n_q, const uint8_t* blk, int64_t n, float* s);
// acc[h * d + k] += (p[h * n + t] * n_t) * y_t[k], rotated domain.   p: [n_q, n]; acc: [n_q, d]
void value_accumulate(const CodePage& c, const float* p, int64_t n_q, const uint8_t* blk, int64_t n, float* acc);
void value_accumulate(const CalibPage& c, const float* p, int64_t n_q, const uint8_t* blk, int64_t n, float* acc);

}  // namespace vxq::cpu::turbo_avx2

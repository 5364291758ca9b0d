// The AVX2 kernels of the TurboQuant reader (kv_read_turbo_avx2.cpp) for the MSE-only blocks
// (turbo, turbo-rvq, turbo-prod's values): what they need of a block's layout and state, in plain
// fields, so that file includes no project header (kv_read_baseline_avx2.cpp says why).
// turbo-prod keys (the QJL term) stay on the scalar reader.
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

// s[h * n + t] = n_t * <q'_h, y_t>.   q: [n_q, d] rotated queries; s: [n_q, n]
void key_scores(const CodePage& c, const float* q, int64_t n_q, const uint8_t* blk, int64_t n, float* s);
// acc[h * d + k] += (p[h * n + t] * n_t) * y_t[k], rotated domain.   p: [n_q, n]; acc: [n_q, d]
void value_accumulate(const CodePage& c, const float* p, int64_t n_q, const uint8_t* blk, int64_t n, float* acc);

}  // namespace vxq::cpu::turbo_avx2

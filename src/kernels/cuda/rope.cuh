// RoPE's arithmetic on the device, shared by every kernel that rotates (cuda::rope, the fused
// RoPE + KV store of attention.cu and the KIVI store of kivi.cu), so a fused rotation has the
// bits of the separate one. theta follows ggml_rope_cache_init's recurrence, theta_{i+1} =
// theta_i * theta_scale in float, so each pair's angle rounds as the CPU's does; cosf/sinf are
// CUDA's (within 2 ulp of the CPU's libm, not bit-equal); ggml's compiled C fuses the first
// product of each rotated value (kernels/cpu/ops.cpp), and so do these.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace vxq::cuda {

#ifdef __CUDACC__
// (cos, sin) of pair i's angle at position pos.
__device__ __forceinline__ float2 rope_angle(int64_t i, int64_t pos, float theta_scale) {
    float theta = float(pos);
    for (int64_t k = 0; k < i; ++k) theta = __fmul_rn(theta, theta_scale);
    return make_float2(cosf(theta), sinf(theta));
}
// Pair i of a row of n_rot rotated values (neox: i and i + n_rot / 2; else 2 i and 2 i + 1):
// where the pair lies and its rotated values.
struct RopePair {
    int64_t a, b;
    float ya, yb;
};
__device__ __forceinline__ RopePair rope_pair(const float* row, int64_t i, float2 cs, int64_t n_rot, bool neox) {
    const int64_t a = neox ? i : 2 * i;
    const int64_t b = neox ? i + n_rot / 2 : 2 * i + 1;
    const float x0 = row[a], x1 = row[b];
    return RopePair{a, b, fmaf(x0, cs.x, -__fmul_rn(x1, cs.y)), fmaf(x0, cs.y, __fmul_rn(x1, cs.x))};
}
__device__ __forceinline__ void rope_rotate_pair(float* row, int64_t i, float2 cs, int64_t n_rot, bool neox) {
    const RopePair r = rope_pair(row, i, cs, n_rot, neox);
    row[r.a] = r.ya;
    row[r.b] = r.yb;
}
#endif

}  // namespace vxq::cuda

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

#if defined(__CUDACC__) || defined(VXQ_SIMT)
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
// Channel c of a row after RoPE (c < n_rot) from its pair's values x0 (the pair's first channel)
// and x1, and the pair's angle: rope_pair's ya or yb, the same operations.
__device__ __forceinline__ float rope_value(float x0, float x1, float2 cs, bool second) {
    return second ? fmaf(x0, cs.y, __fmul_rn(x1, cs.x)) : fmaf(x0, cs.x, -__fmul_rn(x1, cs.y));
}
// Channel c of a row (at `row`) after RoPE, the pairs' angles in cs[n_rot / 2]: channels past
// n_rot as they are.
__device__ __forceinline__ float rope_channel(const float* row, int c, const float2* cs, int n_rot, bool neox) {
    if (c >= n_rot) return row[c];
    const int half = n_rot / 2;
    const int i = neox ? (c < half ? c : c - half) : c / 2;
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    return rope_value(row[a], row[b], cs[i], c == b);
}
__device__ __forceinline__ void rope_rotate_pair(float* row, int64_t i, float2 cs, int64_t n_rot, bool neox) {
    const RopePair r = rope_pair(row, i, cs, n_rot, neox);
    row[r.a] = r.ya;
    row[r.b] = r.yb;
}
// KV head g's query rows (q + g gqa d, gqa of them) and its key row (k + g d) rotated in place,
// the pairs' angles in cs[n_rot / 2], by threads tid of nt: a step's RoPE over one head's group
// (the KIVI store kernel, and the merge kernel after a fused store).
__device__ __forceinline__ void rope_rotate_group(float* q, float* k, int64_t g, int gqa, int64_t d, const float2* cs,
                                                  int64_t n_rot, bool neox, int tid, int nt) {
    const int half = int(n_rot / 2);
    for (int e = tid; e < (gqa + 1) * half; e += nt) {
        const int row = e / half, i = e - row * half;
        rope_rotate_pair(row < gqa ? q + (g * gqa + row) * d : k + g * d, i, cs[i], n_rot, neox);
    }
}
#endif

}  // namespace vxq::cuda

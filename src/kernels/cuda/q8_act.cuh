// q8_0 activations on the device: what the Q8_0/Q4_0 GEMV multiplies. A kernel that produces
// an activation row (the split attention's merge) can write it in this form too, so the GEMV
// that reads the row needs no quantize kernel of its own (gemv.cuh, GemvFusion::x_q8).
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#if defined(__CUDACC__) || defined(VXQ_SIMT)
#include "kernels/cuda/device_math.cuh"  // device code (and the SIMT emulator: tests/support/simt.h) only (below)
#endif

namespace vxq::cuda {

constexpr int kQBlock = 32;  // elements per q8_0 / q4_0 block

// A q8_0 activation block's scale (the fp16 value, widened) and the sum of its 32 quants (the
// Q4_0 kernel subtracts 8 * sum instead of 8 from every weight nibble).
struct __align__(8) Q8Scale {
    float d;
    int sum;
};

// One quantized row: quants [cols] and scales [cols / kQBlock] (device). Plain data (kernel
// parameter structs holding it are zeroed with memset): value-initialize it.
struct Q8Act {
    int8_t* qs;
    Q8Scale* s;
};

#if defined(__CUDACC__) || defined(VXQ_SIMT)
// One lane's value of a q8_0 block of 32 (all 32 lanes of the warp call): ggml's AVX2
// quantize_row_q8_0, amax over |x|, id = amax != 0 ? 127 / amax : 0, q = round-to-nearest-even(x
// * id), d = fp16(amax / 127) (returned widened).
struct Q8Lane {
    int q;
    float d;
};
__device__ __forceinline__ Q8Lane quantize_q8_0_lane(float v) {
    const float amax = warp_max(fabsf(v));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    return Q8Lane{__float2int_rn(__fmul_rn(v, id)), __half2float(__float2half_rn(amax / 127.0f))};  // |v * id| <= 127
}

// Block b of q8_0 activations from its 32 values, one per lane, with the quants' sum.
__device__ __forceinline__ void quantize_block_q8_0(float v, int64_t b, int lane, int8_t* __restrict__ qs,
                                                    Q8Scale* __restrict__ s) {
    const Q8Lane r = quantize_q8_0_lane(v);
    qs[b * kQBlock + lane] = int8_t(r.q);
    const int sum = __reduce_add_sync(0xffffffffu, r.q);
    if (lane == 0) s[b] = Q8Scale{r.d, sum};
}
#endif

}  // namespace vxq::cuda

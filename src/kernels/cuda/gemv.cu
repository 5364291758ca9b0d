#include "kernels/cuda/gemv.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cuda/check.cuh"

namespace vxq::cuda {

namespace {

// ---- element conversions ----------------------------------------------------------------------

__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

// fp32 -> bf16 -> fp32 with round to nearest even, as core/fp16.h's fp32_to_bf16 (NaN stays NaN).
__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 64u);
    return uint16_t((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

// Storage of the dense weight types: T is the 16-bit or 32-bit element as raw bits.
struct F32Elem {  // activations are used as they are: no conversion kernel
    using Raw = float;
    static __device__ __forceinline__ float load(Raw v) { return v; }
};
struct F16Elem {
    using Raw = __half;
    static __device__ __forceinline__ float load(Raw v) { return __half2float(v); }
    static __device__ __forceinline__ Raw from_float(float f) { return __float2half_rn(f); }
};
struct BF16Elem {
    using Raw = uint16_t;
    static __device__ __forceinline__ float load(Raw v) { return bf16_bits_to_float(v); }
    static __device__ __forceinline__ Raw from_float(float f) { return float_to_bf16_bits(f); }
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---- activation conversion --------------------------------------------------------------------

template <class E>
__global__ void convert_kernel(const float* __restrict__ x, typename E::Raw* __restrict__ out, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        out[i] = E::from_float(x[i]);
    }
}

// One warp per 32-element block, lane = element. ggml's AVX2 quantize_row_q8_0: amax over |x|,
// id = amax != 0 ? 127 / amax : 0, q = round-to-nearest-even(x * id), d = fp16(amax / 127).
// d is kept widened to f32 (the value is the fp16 one).
__global__ void quantize_q8_0_kernel(const float* __restrict__ x, int8_t* __restrict__ qs, float* __restrict__ d,
                                     int64_t n_blocks) {
    const int64_t b = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (b >= n_blocks) return;
    const float v = x[b * kQBlock + lane];
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    qs[b * kQBlock + lane] = int8_t(__float2int_rn(__fmul_rn(v, id)));
    if (lane == 0) d[b] = __half2float(__float2half_rn(amax / 127.0f));
}

// ---- GEMV kernels ------------------------------------------------------------------------------
// Grid: x = groups of kGemvRowsPerBlock rows, y = groups of kGemvTokens tokens. The block's
// warps split the columns of its rows (thread i takes chunks i, i + blockDim, ...), so even a
// matrix of few long rows has many warps in flight; each warp sums its part, then the block adds
// the warps' sums. Every activation load feeds kGemvRowsPerBlock rows; the last group's missing
// rows re-read the last row and write nothing.

constexpr int kGemvThreads = kGemvWarps * 32;

__device__ __forceinline__ void store_rows(float (&acc)[kGemvRowsPerBlock][kGemvTokens], int64_t row0, int64_t rows,
                                           int64_t t0, int nt, float* __restrict__ y) {
    __shared__ float partial[kGemvWarps][kGemvRowsPerBlock * kGemvTokens];
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
#pragma unroll
    for (int r = 0; r < kGemvRowsPerBlock; ++r) {
#pragma unroll
        for (int t = 0; t < kGemvTokens; ++t) {
            const float s = warp_sum(acc[r][t]);
            if (lane == 0) partial[warp][r * kGemvTokens + t] = s;
        }
    }
    __syncthreads();
    const int i = threadIdx.x;
    if (i < kGemvRowsPerBlock * kGemvTokens) {
        const int r = i / kGemvTokens, t = i % kGemvTokens;
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < kGemvWarps; ++w) s += partial[w][i];
        if (t < nt && row0 + r < rows) y[(t0 + t) * rows + row0 + r] = s;
    }
}

template <class E>
__global__ void __launch_bounds__(kGemvThreads)
gemv_dense_kernel(const typename E::Raw* __restrict__ w, const typename E::Raw* __restrict__ x,
                  int64_t rows, int64_t cols, int64_t n, float* __restrict__ y) {
    using Raw = typename E::Raw;
    constexpr int kPer16 = 16 / int(sizeof(Raw));  // elements per 16-byte load
    const int64_t row0 = int64_t(blockIdx.x) * kGemvRowsPerBlock;
    if (row0 >= rows) return;
    const int64_t t0 = int64_t(blockIdx.y) * kGemvTokens;
    const int nt = n - t0 < kGemvTokens ? int(n - t0) : kGemvTokens;
    const Raw* wr[kGemvRowsPerBlock];
#pragma unroll
    for (int r = 0; r < kGemvRowsPerBlock; ++r) wr[r] = w + (row0 + r < rows ? row0 + r : rows - 1) * cols;
    float acc[kGemvRowsPerBlock][kGemvTokens] = {};
    if (cols % kPer16 == 0) {  // rows start 16-byte aligned: vector path
        const int64_t n16 = cols / kPer16;
#pragma unroll 2
        for (int64_t c = threadIdx.x; c < n16; c += kGemvThreads) {
            float wf[kGemvRowsPerBlock][kPer16];
#pragma unroll
            for (int r = 0; r < kGemvRowsPerBlock; ++r) {
                const int4 wv = __ldg(reinterpret_cast<const int4*>(wr[r]) + c);
                const Raw* we = reinterpret_cast<const Raw*>(&wv);
#pragma unroll
                for (int e = 0; e < kPer16; ++e) wf[r][e] = E::load(we[e]);
            }
#pragma unroll
            for (int t = 0; t < kGemvTokens; ++t) {
                if (t < nt) {
                    const int4 xv = *(reinterpret_cast<const int4*>(x + (t0 + t) * cols) + c);
                    const Raw* xe = reinterpret_cast<const Raw*>(&xv);
#pragma unroll
                    for (int e = 0; e < kPer16; ++e) {
                        const float xf = E::load(xe[e]);
#pragma unroll
                        for (int r = 0; r < kGemvRowsPerBlock; ++r) acc[r][t] += wf[r][e] * xf;
                    }
                }
            }
        }
    } else {
        for (int64_t c = threadIdx.x; c < cols; c += kGemvThreads) {
#pragma unroll
            for (int t = 0; t < kGemvTokens; ++t) {
                if (t < nt) {
                    const float xf = E::load(x[(t0 + t) * cols + c]);
#pragma unroll
                    for (int r = 0; r < kGemvRowsPerBlock; ++r) acc[r][t] += E::load(wr[r][c]) * xf;
                }
            }
        }
    }
    store_rows(acc, row0, rows, t0, nt, y);
}

// Q8_0 weights x q8_0 activations: per block the integer dot (dp4a) times d_w * d_x.
__global__ void __launch_bounds__(kGemvThreads)
gemv_q8_0_kernel(const int8_t* __restrict__ wq, const __half* __restrict__ wd, const int8_t* __restrict__ xq,
                 const float* __restrict__ xd, int64_t rows, int64_t cols, int64_t n, float* __restrict__ y) {
    const int64_t row0 = int64_t(blockIdx.x) * kGemvRowsPerBlock;
    if (row0 >= rows) return;
    const int64_t t0 = int64_t(blockIdx.y) * kGemvTokens;
    const int nt = n - t0 < kGemvTokens ? int(n - t0) : kGemvTokens;
    const int64_t nb = cols / kQBlock;
    int64_t wrow[kGemvRowsPerBlock];
#pragma unroll
    for (int r = 0; r < kGemvRowsPerBlock; ++r) wrow[r] = row0 + r < rows ? row0 + r : rows - 1;
    float acc[kGemvRowsPerBlock][kGemvTokens] = {};
    for (int64_t b = threadIdx.x; b < nb; b += kGemvThreads) {
        int wi[kGemvRowsPerBlock][8];
        float dw[kGemvRowsPerBlock];
#pragma unroll
        for (int r = 0; r < kGemvRowsPerBlock; ++r) {
            const int4* wb = reinterpret_cast<const int4*>(wq + wrow[r] * cols + b * kQBlock);
            const int4 w0 = __ldg(wb), w1 = __ldg(wb + 1);
            wi[r][0] = w0.x; wi[r][1] = w0.y; wi[r][2] = w0.z; wi[r][3] = w0.w;
            wi[r][4] = w1.x; wi[r][5] = w1.y; wi[r][6] = w1.z; wi[r][7] = w1.w;
            dw[r] = __half2float(wd[wrow[r] * nb + b]);
        }
#pragma unroll
        for (int t = 0; t < kGemvTokens; ++t) {
            if (t < nt) {
                const int4* xb = reinterpret_cast<const int4*>(xq + (t0 + t) * cols + b * kQBlock);
                const int4 x0 = xb[0], x1 = xb[1];
                const int xi[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
                const float dx = xd[(t0 + t) * nb + b];
#pragma unroll
                for (int r = 0; r < kGemvRowsPerBlock; ++r) {
                    int sumi = 0;
#pragma unroll
                    for (int j = 0; j < 8; ++j) sumi = __dp4a(wi[r][j], xi[j], sumi);
                    acc[r][t] += float(sumi) * (dw[r] * dx);
                }
            }
        }
    }
    store_rows(acc, row0, rows, t0, nt, y);
}

// Q4_0 weights x q8_0 activations. A block's 16 quant bytes hold element j in the low nibble of
// byte j and element j + 16 in the high nibble; values are nibble - 8.
__global__ void __launch_bounds__(kGemvThreads)
gemv_q4_0_kernel(const uint8_t* __restrict__ wq, const __half* __restrict__ wd, const int8_t* __restrict__ xq,
                 const float* __restrict__ xd, int64_t rows, int64_t cols, int64_t n, float* __restrict__ y) {
    const int64_t row0 = int64_t(blockIdx.x) * kGemvRowsPerBlock;
    if (row0 >= rows) return;
    const int64_t t0 = int64_t(blockIdx.y) * kGemvTokens;
    const int nt = n - t0 < kGemvTokens ? int(n - t0) : kGemvTokens;
    const int64_t nb = cols / kQBlock;
    int64_t wrow[kGemvRowsPerBlock];
#pragma unroll
    for (int r = 0; r < kGemvRowsPerBlock; ++r) wrow[r] = row0 + r < rows ? row0 + r : rows - 1;
    float acc[kGemvRowsPerBlock][kGemvTokens] = {};
#pragma unroll 2
    for (int64_t b = threadIdx.x; b < nb; b += kGemvThreads) {
        int lo[kGemvRowsPerBlock][4], hi[kGemvRowsPerBlock][4];
        float dw[kGemvRowsPerBlock];
#pragma unroll
        for (int r = 0; r < kGemvRowsPerBlock; ++r) {
            const int4 wv = __ldg(reinterpret_cast<const int4*>(wq + wrow[r] * (cols / 2) + b * 16));
            const int wraw[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                lo[r][j] = __vsubss4(wraw[j] & 0x0F0F0F0F, 0x08080808);
                hi[r][j] = __vsubss4((wraw[j] >> 4) & 0x0F0F0F0F, 0x08080808);
            }
            dw[r] = __half2float(wd[wrow[r] * nb + b]);
        }
#pragma unroll
        for (int t = 0; t < kGemvTokens; ++t) {
            if (t < nt) {
                const int4* xb = reinterpret_cast<const int4*>(xq + (t0 + t) * cols + b * kQBlock);
                const int4 x0 = xb[0], x1 = xb[1];
                const int xlo[4] = {x0.x, x0.y, x0.z, x0.w};
                const int xhi[4] = {x1.x, x1.y, x1.z, x1.w};
                const float dx = xd[(t0 + t) * nb + b];
#pragma unroll
                for (int r = 0; r < kGemvRowsPerBlock; ++r) {
                    int sumi = 0;
#pragma unroll
                    for (int j = 0; j < 4; ++j) sumi = __dp4a(hi[r][j], xhi[j], __dp4a(lo[r][j], xlo[j], sumi));
                    acc[r][t] += float(sumi) * (dw[r] * dx);
                }
            }
        }
    }
    store_rows(acc, row0, rows, t0, nt, y);
}

// ---- embedding rows ----------------------------------------------------------------------------

__device__ float weight_at(const DeviceWeight& w, int64_t r, int64_t c) {
    switch (w.type) {
        case GgmlType::F32: return static_cast<const float*>(w.data)[r * w.cols + c];
        case GgmlType::F16: return __half2float(static_cast<const __half*>(w.data)[r * w.cols + c]);
        case GgmlType::BF16: return bf16_bits_to_float(static_cast<const uint16_t*>(w.data)[r * w.cols + c]);
        case GgmlType::Q8_0: {
            const float d = __half2float(w.scales[r * (w.cols / kQBlock) + c / kQBlock]);
            return d * float(static_cast<const int8_t*>(w.data)[r * w.cols + c]);
        }
        case GgmlType::Q4_0: {
            const float d = __half2float(w.scales[r * (w.cols / kQBlock) + c / kQBlock]);
            const int64_t b = c / kQBlock, j = c % kQBlock;
            const uint8_t byte = static_cast<const uint8_t*>(w.data)[r * (w.cols / 2) + b * 16 + (j % 16)];
            const int q = (j < 16 ? (byte & 0x0F) : (byte >> 4)) - 8;
            return d * float(q);
        }
        default: return __int_as_float(0x7fc00000);  // upload_weight admits no other type
    }
}

__global__ void embed_kernel(DeviceWeight table, const int32_t* __restrict__ ids, float* __restrict__ out) {
    const int64_t i = blockIdx.x;
    const int64_t r = ids[i];
    for (int64_t c = threadIdx.x; c < table.cols; c += blockDim.x) out[i * table.cols + c] = weight_at(table, r, c);
}

unsigned gemv_row_groups(int64_t rows) {
    return unsigned((rows + kGemvRowsPerBlock - 1) / kGemvRowsPerBlock);
}

unsigned grid_for(int64_t n, int threads) { return unsigned(std::min<int64_t>((n + threads - 1) / threads, 65535)); }

template <class E>
void gemv_dense(const DeviceWeight& w, const float* x, int64_t n, float* y, GemvScratch& s, cudaStream_t st) {
    using Raw = typename E::Raw;
    const Raw* xt;
    if constexpr (std::is_same_v<Raw, float>) {
        xt = x;
    } else {
        Raw* conv = static_cast<Raw*>(s.reserve(size_t(n * w.cols) * sizeof(Raw)));
        convert_kernel<E><<<grid_for(n * w.cols, 256), 256, 0, st>>>(x, conv, n * w.cols);
        VXQ_CUDA_CHECK_LAUNCH();
        xt = conv;
    }
    const dim3 grid(gemv_row_groups(w.rows), unsigned((n + kGemvTokens - 1) / kGemvTokens));
    gemv_dense_kernel<E><<<grid, kGemvThreads, 0, st>>>(static_cast<const Raw*>(w.data), xt, w.rows, w.cols, n, y);
    VXQ_CUDA_CHECK_LAUNCH();
}

}  // namespace

GemvScratch::~GemvScratch() { cudaFree(buf); }

void* GemvScratch::reserve(size_t n) {
    if (n > bytes) {
        VXQ_CUDA_CHECK(cudaFree(buf));
        buf = nullptr;
        bytes = 0;
        VXQ_CUDA_CHECK(cudaMalloc(&buf, n));
        bytes = n;
    }
    return buf;
}

size_t gemv_scratch_bytes(const DeviceWeight& w, int64_t n) {
    switch (w.type) {
        case GgmlType::F32: return 0;
        case GgmlType::F16:
        case GgmlType::BF16: return size_t(n * w.cols) * 2;
        default: return size_t(n * w.cols) + size_t(n * (w.cols / kQBlock)) * sizeof(float);
    }
}

void gemv(const DeviceWeight& w, const float* x, int64_t n, float* y, GemvScratch& s, cudaStream_t st) {
    switch (w.type) {
        case GgmlType::F32: return gemv_dense<F32Elem>(w, x, n, y, s, st);
        case GgmlType::F16: return gemv_dense<F16Elem>(w, x, n, y, s, st);
        case GgmlType::BF16: return gemv_dense<BF16Elem>(w, x, n, y, s, st);
        case GgmlType::Q8_0:
        case GgmlType::Q4_0: {
            const int64_t nb = w.cols / kQBlock;
            // scratch: [n, cols] int8 quants, then [n, nb] f32 scales (16-byte aligned: cols % 32 == 0)
            uint8_t* base = static_cast<uint8_t*>(s.reserve(size_t(n * w.cols) + size_t(n * nb) * sizeof(float)));
            int8_t* xq = reinterpret_cast<int8_t*>(base);
            float* xd = reinterpret_cast<float*>(base + n * w.cols);
            quantize_q8_0_kernel<<<unsigned((n * nb * 32 + 255) / 256), 256, 0, st>>>(x, xq, xd, n * nb);
            VXQ_CUDA_CHECK_LAUNCH();
            const dim3 grid(gemv_row_groups(w.rows), unsigned((n + kGemvTokens - 1) / kGemvTokens));
            if (w.type == GgmlType::Q8_0) {
                gemv_q8_0_kernel<<<grid, kGemvThreads, 0, st>>>(static_cast<const int8_t*>(w.data), w.scales, xq, xd,
                                                                  w.rows, w.cols, n, y);
            } else {
                gemv_q4_0_kernel<<<grid, kGemvThreads, 0, st>>>(static_cast<const uint8_t*>(w.data), w.scales, xq, xd,
                                                                  w.rows, w.cols, n, y);
            }
            VXQ_CUDA_CHECK_LAUNCH();
            return;
        }
        default:
            // upload_weight admits no other type
            throw_cuda_error(cudaErrorInvalidValue, "gemv: a weight type without a CUDA kernel", __FILE__, __LINE__);
    }
}

void embed_rows(const DeviceWeight& table, const int32_t* ids, int64_t n, float* out, cudaStream_t st) {
    if (n == 0) return;
    embed_kernel<<<unsigned(n), 256, 0, st>>>(table, ids, out);
    VXQ_CUDA_CHECK_LAUNCH();
}

}  // namespace vxq::cuda

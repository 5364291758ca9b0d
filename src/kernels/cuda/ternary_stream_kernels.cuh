// The batch-1 ternary GEMV (TQ2_0, TQ2_G128: y = W x with x in q8_K) that puts a block's weights
// in flight before it waits for x. Apart from gemv.cu (which launches it: gemv_q8k_group) so that
// a test can run it on the CPU (tests/support/simt.h compiles this header as C++; the
// asynchronous copies are then plain copies, a valid order of the same program).
//
// Why: the group GEMV (gemv.cu) issues one round of loads per warp and then waits for them, in
// short-lived blocks, and the q8_K quantize kernel and its boundary come before any of it; at
// Bonsai-27B's shapes it read 23 MB in 18-20 us, 27-31 % of the copy bandwidth (docs/gpu.md).
// Here a block per SM owns a contiguous stretch of rows. Each of its W warps (16 or 32) owns every
// W-th group of R rows of the stretch and a ring of S stages in shared memory, one group of
// R rows (their quant bytes and fp16 scales) a stage, filled by cp.async. The block's first S
// groups per warp are issued before griddepcontrol.wait, so the weights stream while the kernel
// before (the quantize, or whatever wrote x) finishes: on those shapes the ring holds 82-97 % of a
// block's rows, so most of the matrix is in flight at once. Then x (q8_K, cols bytes and the
// blocks' scales: copied from the quantize kernel's output, or, by default where x comes in f32,
// quantized by the block itself, after the decode step's RMSNorm where one is fused; 2026-12-06:
// one kernel and boundary fewer a matmul, +7 % TQ2_0 decode) goes into shared memory, laid out
// [quarter-run l][unit] so that a warp's 32 lanes read 32 consecutive 16-byte units (no bank
// conflicts), and each warp walks its groups: wait for stage g, a unit (64 weights, 16 bytes) per
// lane per row, issue group g + S into the slot.
//
// Numerics: TQ2Format's in gemv.cu. Unit u of a row holds in bits 2 l of byte k the digit t + 1 of
// value 128 (c / 2) + 32 l + 16 (c % 2) + k of 256-block u / 4 (c = u % 4); the integer sum of
// (digit - 1) x over the unit is dp4a(digits, x) - (the quarter's quant sum), times d_w * d_x in
// float, summed per lane over its units and then over the warp (butterfly).
#pragma once

#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "formats/ggml_types.h"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.cuh"

namespace vxq::cuda {

// A q8_K activation block (256 values, TQ2_0's dot type) as the ternary GEMVs read it: the scale
// d and the quant sums of the block's four 64-value quarters, quarter c holding the values 128 (c /
// 2) + 32 l + 16 (c % 2) + j (l < 4, j < 16): those of TQ2_0 quant bytes 16 c .. 16 c + 15.
struct Q8KScale {
    float d;
    int sum[4];
};

constexpr int kTsMaxMatrices = 3;  // kGemvGroupMax: matrices that share x (gate and up; q, k, v)

struct TernaryStreamParams {
    const uint8_t* w[kTsMaxMatrices];    // matrix i's quant bytes [rows_i, cols / 4]
    const __half* scale[kTsMaxMatrices];  // its fp16 scales [rows_i, cols / scale_group]
    float* y[kTsMaxMatrices];            // [rows_i]
    int first_row[kTsMaxMatrices + 1];   // matrix i is rows [first_row[i], first_row[i + 1]) of the stack
    int count;
    int cols;                            // a multiple of 256 whose rows' scales are 4-byte multiples
    int scale_group;                     // weights per scale: 256 (TQ2_0) or 128 (TQ2_G128)
    int rows_per_block;                  // a block's stretch of the stacked rows
    const int8_t* xq;                    // q8_K activations [cols]
    const Q8KScale* xs;                  // [cols / 256]
    const float* xf;                     // or f32 activations [cols], which every block of the stream kernel
                                         // quantizes to q8_K itself (then xq, xs unused); nullptr: none
    const float* norm_w;                 // with xf: x = rms_norm(xf) * norm_w first (GemvFusion's RMSNorm:
    float norm_eps;                      //   the same bits as cuda::rms_norm), or nullptr
    float* x_out;                        // with norm_w: where the normalized x is written too (the blocks
                                         //   share the 256-blocks out), or nullptr
    int evict_first;                     // the weights through L2 as evict-first (gemv.cu's policy)
    int n;                               // tokens (x's rows, y's [n, rows_i]; 0 means 1): above 1 only in the
                                         //   tensor-core kernel's batch form, with xq / xs and no resid
    float* resid;                        // one matrix: resid[r] += y[r] as y is stored (cuda::add's order), or nullptr
};

// Shared memory (bytes): x [4][cols / 64] units of 16 bytes, the blocks' Q8KScale, then the warps'
// rings of S stages of R rows (quant bytes, then scales).
__host__ __device__ constexpr int ts_align16(int b) { return (b + 15) / 16 * 16; }
__host__ __device__ constexpr int ts_stage_bytes(int cols, int scale_group, int R) {
    return ts_align16(R * (cols / 4 + 2 * (cols / scale_group)));
}
__host__ __device__ constexpr int ts_x_bytes(int cols) {
    return ts_align16(cols) + ts_align16(int(sizeof(Q8KScale)) * (cols / kQK_K));
}
__host__ __device__ constexpr int ts_smem_bytes(int cols, int scale_group, int W, int R, int S) {
    return ts_x_bytes(cols) + W * S * ts_stage_bytes(cols, scale_group, R);
}
// The stream kernel's static shared memory (ts_stage_x's RMSNorm partials), beside the dynamic.
constexpr int kTsStaticSmem = int(sizeof(double)) * kNormThreads;

// 16 and 4 bytes from global into shared memory, asynchronously on the device (cp.async; the
// 16-byte copies with the weights' L2 policy); a copy in the emulator.
__device__ __forceinline__ void ts_copy16(void* smem, const void* gmem, uint64_t policy) { cp_async16_hint(smem, gmem, policy); }
__device__ __forceinline__ void ts_copy4(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__)
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(gmem) : "memory");
#else
    std::memcpy(smem, gmem, 4);
#endif
}
__device__ __forceinline__ void ts_commit() {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void ts_wait() {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}
// The weights' L2 policy (gemv.cu's weight_policy too): both made, one selected, no branch per load.
__device__ __forceinline__ uint64_t ts_policy(int evict_first) { return l2_policy(evict_first != 0); }

// The matrix of stacked row `row` and an element of a per-matrix parameter, by compares and
// selects: an index computed at run time into the kernel's parameters would copy them to local memory.
__device__ __forceinline__ int ts_matrix(const TernaryStreamParams& p, int row) {
    int m = 0;
#pragma unroll
    for (int i = 1; i < kTsMaxMatrices; ++i) m += i < p.count && row >= p.first_row[i] ? 1 : 0;
    return m;
}
template <class T, int N>
__device__ __forceinline__ T ts_pick(const T (&a)[N], int m) {
    T v = a[0];
#pragma unroll
    for (int i = 1; i < N; ++i) v = m == i ? a[i] : v;
    return v;
}

// q8_K of one 256-block by a warp (ggml's quantize_row_q8_K, as the CPU backend computes it): the
// signed value of largest magnitude (the first of equals), iscale = -127 / max, q = min(127,
// round-to-nearest-even(iscale x)), d = 1 / iscale; all zero for a zero block. Lane l holds values
// 8 l .. 8 l + 7 (in quarter 2 (l / 16) + (l % 4) / 2); it gets their quants (8 bytes) and, as
// every lane, the block's scale and quarter sums. Every lane calls.
__device__ __forceinline__ void q8k_quantize_block(const float (&v)[8], int lane, int2& quants, Q8KScale& r) {
    // The largest magnitude by a max butterfly (fmaxf passes over NaN as `>` does), then the first
    // value holding it: the lowest lane with one (a ballot), its lowest j. (Before: a butterfly of
    // (|x|, value, index) triples, ~3x the instructions.)
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float mine = 0.0f;
    bool has = false;
#pragma unroll
    for (int j = 7; j >= 0; --j) {
        if (fabsf(v[j]) == amax) mine = v[j], has = true;
    }
    const float mx = __shfl_sync(0xffffffffu, mine, (__ffs(__ballot_sync(0xffffffffu, has)) - 1) & 31);
    const float iscale = amax != 0.0f ? __fdiv_rn(-127.0f, mx) : 0.0f;
    int sum = 0;
    uint32_t word[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int qj = amax != 0.0f ? min(127, __float2int_rn(__fmul_rn(iscale, v[j]))) : 0;
        word[j / 4] |= uint32_t(uint8_t(int8_t(qj))) << (8 * (j % 4));
        sum += qj;
    }
    quants = make_int2(int(word[0]), int(word[1]));
    const int quarter = 2 * (lane / 16) + (lane % 4) / 2;
#pragma unroll
    for (int c = 0; c < 4; ++c) r.sum[c] = __reduce_add_sync(0xffffffffu, quarter == c ? sum : 0);
    r.d = amax != 0.0f ? __fdiv_rn(1.0f, iscale) : 0.0f;
}

// a . b over four byte pairs plus c, a's bytes unsigned and b's signed (dp4a.u32.s32).
__device__ __forceinline__ int ts_dp4a_us(unsigned a, int b, int c) {
#if defined(__CUDA_ARCH__)
    int r;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#else
    for (int i = 0; i < 4; ++i) c += int((a >> (8 * i)) & 0xffu) * int(int8_t(uint32_t(b) >> (8 * i)));
    return c;
#endif
}

// Sum of digit x digit-run products of a unit: byte k of w's 16 holds in bits 2 l the digit of
// quarter-run l. The digits are masked in place, not shifted down: t_l = sum (4^l digit) x, an
// unsigned byte (<= 192) times a signed one, so sum_l t_l / 4^l (exact shifts of multiples of
// 4^l) is the sum; four independent accumulators.
__device__ __forceinline__ int ts_dot_unit(const int4& w, const int4 (&x)[4]) {
    int t[4];
#pragma unroll
    for (int l = 0; l < 4; ++l) {
        const unsigned m = 0x03030303u << (2 * l);
        t[l] = ts_dp4a_us(unsigned(w.x) & m, x[l].x, 0);
        t[l] = ts_dp4a_us(unsigned(w.y) & m, x[l].y, t[l]);
        t[l] = ts_dp4a_us(unsigned(w.z) & m, x[l].z, t[l]);
        t[l] = ts_dp4a_us(unsigned(w.w) & m, x[l].w, t[l]);
    }
    return t[0] + (t[1] >> 2) + (t[2] >> 4) + (t[3] >> 6);
}

// x into a block's shared memory as q8_K, once the kernel that wrote it is done (pdl_wait): the
// 16 bytes of 256-block b's quarter-run l of unit c (values 128 (c / 2) + 16 (c % 2) + 32 l + j,
// j < 16) at xs + run(b, c, l), the blocks' Q8KScale at xsc[b]. Where x comes in f32 (p.xf) it is
// quantized here (no quantize kernel and boundary before the GEMV): warp w takes 256-blocks w, w +
// W, ..., kQ of them with their loads in flight at once (kQ: fewer where the caller holds loads in
// registers across this); lane l's values 8 l .. 8 l + 7 of block b are bytes 8 (l % 2) .. of
// quarter-run (l % 16) / 4 of unit 2 (l / 16) + (l % 4) / 2. With the RMSNorm first: its scale by
// the block (block_rms_scale: the first 256 threads sum in rms_norm's order, every thread meets
// its barriers), then each value as rms_apply; block b % grid writes 256-block b of the
// normalized x out. Else x's q8_K (p.xq, p.xs) is copied, for `tokens` rows of
// x (token t's runs at t cols bytes further, its Q8KScale at t cols / 256 further). Every thread
// of the block (W warps) calls; x is not yet visible to the others at return (the caller's barrier).
template <int W, int kQ = 4, class Run>
__device__ __forceinline__ void ts_stage_x(const TernaryStreamParams& p, int total, uint8_t* xs, Q8KScale* xsc, Run run,
                                           int tokens = 1) {
    const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, cols = p.cols, nb = cols / kQK_K;
    pdl_wait();
    if (p.xf) {
        const int c = 2 * (lane / 16) + (lane % 4) / 2, l = (lane % 16) / 4;
        __shared__ double rms_partial[kNormThreads];
        const int grid = (total + p.rows_per_block - 1) / p.rows_per_block;  // the launch's blocks
        const float scale = p.norm_w ? block_rms_scale(p.xf, cols, p.norm_eps, rms_partial) : 1.0f;
        const auto load8 = [&](const float* base, int b, float (&v)[8]) {
            const float4* src = reinterpret_cast<const float4*>(base + b * kQK_K + 8 * lane);
            const float4 a = src[0], e = src[1];
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
            v[4] = e.x, v[5] = e.y, v[6] = e.z, v[7] = e.w;
        };
        for (int b0 = warp; b0 < nb; b0 += kQ * W) {
            float v[kQ][8], nw[kQ][8];
#pragma unroll
            for (int k = 0; k < kQ; ++k) {
                const int b = b0 + k * W < nb ? b0 + k * W : 0;
                load8(p.xf, b, v[k]);
                if (p.norm_w) load8(p.norm_w, b, nw[k]);
            }
#pragma unroll
            for (int k = 0; k < kQ; ++k) {
                const int b = b0 + k * W;
                if (b >= nb) break;  // warp-uniform
                if (p.norm_w) {
#pragma unroll
                    for (int j = 0; j < 8; ++j) v[k][j] = rms_apply(v[k][j], scale, nw[k][j]);
                    if (p.x_out && b % grid == int(blockIdx.x)) {
                        float4* dst = reinterpret_cast<float4*>(p.x_out + b * kQK_K + 8 * lane);
                        dst[0] = make_float4(v[k][0], v[k][1], v[k][2], v[k][3]);
                        dst[1] = make_float4(v[k][4], v[k][5], v[k][6], v[k][7]);
                    }
                }
                int2 q;
                Q8KScale r;
                q8k_quantize_block(v[k], lane, q, r);
                *reinterpret_cast<int2*>(xs + run(b, c, l) + 8 * (lane % 2)) = q;
                if (lane == 0) xsc[b] = r;
            }
        }
    } else {
        for (int e = tid; e < tokens * 16 * nb; e += W * 32) {
            const int t = e / (16 * nb), r = e - t * 16 * nb, b = r >> 4, c = (r >> 2) & 3, l = r & 3;
            *reinterpret_cast<int4*>(xs + t * cols + run(b, c, l)) =
                __ldg(reinterpret_cast<const int4*>(p.xq + t * cols + b * kQK_K + 128 * (c >> 1) + 16 * (c & 1) + 32 * l));
        }
        for (int b = tid; b < tokens * nb; b += W * 32) xsc[b] = p.xs[b];
    }
}

// Block b: stacked rows [b rows_per_block, + rows_per_block); warp w: its groups g = 0, 1, ...,
// rows first + (g W + w) R + i (i < R) while below the stretch's end. S = 1: no ring (a warp waits
// for its group, then issues the next; its neighbours' copies and products overlap it).
// MinBlocks = 2: the half-SM form (gemv.cu's plan keeps the shared memory within half an SM too),
// so that the next call's blocks, launched by PDL, find room beside this call's on every SM and
// put their rings in flight while this call's blocks compute and drain (a kernel that only reads
// the same bytes takes 7.2 us so and 9.8 us one call after the other: docs/gpu.md, sixth session
// of 2026-12-06).
template <int W, int R, int S, int MinBlocks = 1>
__global__ void __launch_bounds__(W * 32, MinBlocks) ternary_stream_kernel(const TernaryStreamParams p) {
    VXQ_DYNAMIC_SMEM(smem);
    const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
    const int cols = p.cols, units = cols / 64, rb = cols / 4, ns = cols / p.scale_group;
    // Units per scale, 4 or 2: a unit's scale is u >> ushift (a run-time division here cost ~20
    // instructions a unit, a quarter of the loop's: PTX of 2026-12-05).
    const int ushift = p.scale_group == 128 ? 1 : 2;
    const int first = int(blockIdx.x) * p.rows_per_block;
    const int total = ts_pick(p.first_row, p.count);
    const int end = total - first < p.rows_per_block ? total : first + p.rows_per_block;
    const int stage = ts_stage_bytes(cols, p.scale_group, R);
    auto* xu = reinterpret_cast<int4*>(smem);                        // [4][units]
    auto* xsc = reinterpret_cast<Q8KScale*>(smem + ts_align16(cols));  // [cols / 256]
    uint8_t* ring = smem + ts_x_bytes(cols) + warp * S * stage;
    const uint64_t policy = ts_policy(p.evict_first);

    // This warp's groups, and the copy of group g into slot g % S (one commit a call, empty or not).
    const int mine = end - first > warp * R ? (end - first - warp * R + W * R - 1) / (W * R) : 0;
    const auto row_of = [&](int g, int i) { return first + (g * W + warp) * R + i; };
    const auto issue = [&](int g) {
        if (g < mine) {
            uint8_t* dst = ring + (g % S) * stage;
#pragma unroll
            for (int i = 0; i < R; ++i) {
                const int row = row_of(g, i);
                if (row >= end) break;
                const int m = ts_matrix(p, row);
                const int64_t local = row - ts_pick(p.first_row, m);
                const uint8_t* src = ts_pick(p.w, m) + local * rb;
                for (int o = lane * 16; o < rb; o += 32 * 16) ts_copy16(dst + i * rb + o, src + o, policy);
                const auto* ssrc = reinterpret_cast<const uint8_t*>(ts_pick(p.scale, m) + local * ns);
                for (int o = lane * 4; o < 2 * ns; o += 32 * 4) ts_copy4(dst + R * rb + i * 2 * ns + o, ssrc + o);
            }
        }
        ts_commit();
    };
#pragma unroll
    for (int g = 0; g < S; ++g) issue(g);

    // x, once the kernel that wrote it is done: unit u's quarter-run l (16 bytes) at xu[l units + u].
    // (Half an SM: 2 of the quantize's 256-blocks in flight a warp, where 4 spilled at 64 registers.)
    ts_stage_x<W, MinBlocks == 2 ? 2 : 4>(p, total, smem, xsc, [&](int b, int c, int l) { return (l * units + 4 * b + c) * 16; });
    __syncthreads();
    pdl_launch_dependents();

    for (int g = 0; g < mine; ++g) {
        ts_wait<S - 1>();  // group g's copies (this lane's); the warp's after the barrier
        __syncwarp();
        const uint8_t* st = ring + (g % S) * stage;
        const auto* ws = reinterpret_cast<const __half*>(st + R * rb);
        float acc[R];
#pragma unroll
        for (int i = 0; i < R; ++i) acc[i] = 0.0f;
#pragma unroll 2
        for (int u = lane; u < units; u += 32) {
            int4 x[4];
#pragma unroll
            for (int l = 0; l < 4; ++l) x[l] = xu[l * units + u];
            const Q8KScale& xb = xsc[u >> 2];
            const float dx = xb.d;
            const int sum = xb.sum[u & 3];
#pragma unroll
            for (int i = 0; i < R; ++i) {
                const int4 w = *reinterpret_cast<const int4*>(st + i * rb + 16 * u);
                const float d = __half2float(ws[i * ns + (u >> ushift)]);
                acc[i] += float(ts_dot_unit(w, x) - sum) * (d * dx);
            }
        }
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const float v = warp_sum(acc[i]);
            const int row = row_of(g, i);
            if (lane == 0 && row < end) {
                const int m = ts_matrix(p, row);
                ts_pick(p.y, m)[row - ts_pick(p.first_row, m)] = v;
                if (p.resid) p.resid[row] += v;  // count == 1: row is the matrix's own
            }
        }
        __syncwarp();  // every lane has read the slot before it is filled again
        issue(g + S);
    }
    ts_wait<0>();  // nothing left in flight at exit
}

// ---- the lane-piece form ------------------------------------------------------------------------
// The stream kernel above runs at about half the copy bandwidth on the H100, bound by issue (docs/
// gpu.md: ~5-6 M warp instructions a 5120 x 17408 call, 4 shared-memory loads of x a 16-byte
// unit). Here nothing goes through shared memory but the final sums: thread j of a block owns
// pieces j P .. j P + P - 1 (a piece: 8 quant bytes, 32 weights; P = 1 or 2, a whole 16-byte unit)
// of every row of the block's stretch, so its 32 P x values (four runs of 8 P bytes, one per
// quarter-run l) and their sum stay in registers, loaded once. A row costs a lane one 8 P-byte
// load from global memory (a warp's 32 loads are contiguous; through L2 with the weights' policy,
// as the stream kernel's copies), the digits by shift and mask (7 instructions a 4-byte word),
// 8 P dp4a, its fp16 scale and 4 float operations. Loads run Ahead rows ahead (the first ones
// issued before griddepcontrol.wait). Rows go 16 at a time: each lane's 16 partial sums are
// reduced across the warp by a transposed butterfly (lanes i and i + 16 end with row i's sum of
// the warp: 16 shuffles for 16 rows), then across the block's warps in shared memory.
// Block: 32 ceil(cols / (32 P) / 32) threads (<= kTlMaxThreads / P); lanes past the row's last
// piece load piece 0 and count zero x. Off by default (gemv.cu): timed on H100s since 2026-12-05,
// no faster than the stream kernel.
constexpr int kTlBatch = 16, kTlAhead = 8, kTlMaxThreads = 576;
// The block size for rows of `cols` (a multiple of 256, <= 32 kTlMaxThreads) at P pieces a lane.
__host__ __device__ constexpr int ternary_lanes_threads(int cols, int P) { return (cols / (32 * P) + 31) / 32 * 32; }

// A lane's P pieces of a row (8 P bytes) and their 4-byte words.
template <int P>
using TlWords = std::conditional_t<P == 1, uint2, uint4>;
__device__ __forceinline__ unsigned tl_word(const uint2& w, int k) { return k == 0 ? w.x : w.y; }
__device__ __forceinline__ unsigned tl_word(const uint4& w, int k) { return at4(w, k); }

// Sum of digit x value over a lane's pieces: byte k of its 8 P bytes holds in bits 2 l the digit
// of quarter-run l, whose x values at the same bytes are x[2 P l .. 2 P l + 2 P) (4 a word).
template <int P>
__device__ __forceinline__ int tl_dot(const TlWords<P>& w, const int (&x)[8 * P]) {
    int s = 0;
#pragma unroll
    for (int l = 0; l < 4; ++l) {
#pragma unroll
        for (int k = 0; k < 2 * P; ++k) s = ts_dp4a_us((tl_word(w, k) >> (2 * l)) & 0x03030303u, x[2 * P * l + k], s);
    }
    return s;
}

// (Not inlined on the device: its 24 inlined copies in the unrolled loops below spilled registers;
// called where a row starts a matrix of the stack, once or twice a block.)
#if defined(__CUDACC__)
#define VXQ_TL_NOINLINE __noinline__
#else
#define VXQ_TL_NOINLINE
#endif
// The transposed butterfly over a batch's partial sums (all lanes call): after the step of S,
// lane l's acc[i] (i < S) holds its pair's sum of row i + (l's bits S' >= S below kTlBatch); at
// the end acc[0] is row l % kTlBatch's sum over l's half-warp (kTlBatch = 16).
template <int S>
__device__ __forceinline__ void tl_fold(float (&acc)[kTlBatch], int lane) {
    if constexpr (S > 0) {
        const bool up = (lane & S) != 0;
#pragma unroll
        for (int i = 0; i < S; ++i) {
            const float send = up ? acc[i] : acc[i + S];
            const float keep = up ? acc[i + S] : acc[i];
            acc[i] = keep + __shfl_xor_sync(0xffffffffu, send, S);
        }
        tl_fold<S / 2>(acc, lane);
    }
}

// A lane's pieces (8 P bytes) and a scale through L2 with the weights' policy (ts_policy); plain
// loads in the emulator.
template <int P>
__device__ __forceinline__ TlWords<P> tl_load_pieces(const uint8_t* p, [[maybe_unused]] uint64_t policy) {
    TlWords<P> v;
#if defined(__CUDA_ARCH__)
    if constexpr (P == 1) {
        asm("ld.global.nc.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;" : "=r"(v.x), "=r"(v.y) : "l"(p), "l"(policy));
    } else {
        asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p), "l"(policy));
    }
#else
    std::memcpy(&v, p, sizeof v);
#endif
    return v;
}
__device__ __forceinline__ __half tl_load_scale(const __half* p, [[maybe_unused]] uint64_t policy) {
#if defined(__CUDA_ARCH__)
    unsigned short v;
    asm("ld.global.nc.L2::cache_hint.u16 %0, [%1], %2;" : "=h"(v) : "l"(p), "l"(policy));
    return __ushort_as_half(v);
#else
    return *p;
#endif
}

// Where the next row to load is: this lane's first piece and its scale; `next` the first row of
// the next matrix of the stack (where the addresses are found again).
struct TlCursor {
    const uint8_t* w;
    const __half* s;
    int next;
};
__device__ inline VXQ_TL_NOINLINE TlCursor tl_cursor(const TernaryStreamParams& p, int row, int piece, int sshift) {
    const int m = ts_matrix(p, row);
    const int64_t local = row - ts_pick(p.first_row, m);
    const int next = m + 1 < p.count ? ts_pick(p.first_row, m + 1) : INT_MAX;
    return TlCursor{ts_pick(p.w, m) + local * (p.cols / 4) + 8 * piece,
                    ts_pick(p.scale, m) + local * (p.cols / p.scale_group) + (piece >> sshift), next};
}

// Ahead: rows of loads in flight (kTlAhead); P: pieces a lane. (A template also so that the
// header defines it in every file that includes it, the emulator's tests and gemv.cu alike.)
template <int Ahead, int P>
__global__ void __launch_bounds__(kTlMaxThreads / P) ternary_lanes_kernel(const TernaryStreamParams p) {
    __shared__ float red[kTlMaxThreads / P / 32][kTlBatch + 1];  // [warp][row of the batch]
    const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, nwarps = ternary_lanes_threads(p.cols, P) >> 5;
    const int cols = p.cols, rb = cols / 4, ns = cols / p.scale_group;
    const int sshift = p.scale_group == 128 ? 2 : 3;  // pieces a scale: 4 (TQ2_G128) or 8 (TQ2_0)
    const bool real = tid < cols / (32 * P);
    const int piece = real ? tid * P : 0;  // this lane's first piece (P = 2: h = 0, a whole unit)
    const int first = int(blockIdx.x) * p.rows_per_block;
    const int total = ts_pick(p.first_row, p.count);
    const int end = total - first < p.rows_per_block ? total : first + p.rows_per_block;
    if (first >= end) return;  // (the whole block)

    // The first Ahead rows' pieces and scales, before the wait (no kernel writes the weights).
    TlWords<P> wb[Ahead];
    __half sb[Ahead];
    const uint64_t policy = ts_policy(p.evict_first);
    TlCursor cur = tl_cursor(p, first, piece, sshift);
    int loaded = first;  // the next row to load
    const auto load_next = [&](int a) {
        wb[a] = tl_load_pieces<P>(cur.w, policy);
        sb[a] = tl_load_scale(cur.s, policy);
        if (++loaded < end) {
            if (loaded >= cur.next) {
                cur = tl_cursor(p, loaded, piece, sshift);
            } else {
                cur.w += rb;
                cur.s += ns;
            }
        }
    };
#pragma unroll
    for (int a = 0; a < Ahead; ++a) {
        if (loaded < end) load_next(a);
    }

    // x, once the kernel that wrote it is done: the pieces' four runs of 8 P bytes, their sum, d_x.
    pdl_wait();
    int x[8 * P];
    int xsum = 0;
    float dx = 0.0f;
    {
        const int u = piece >> 1, h = piece & 1, b = u >> 2, c = u & 3;
        const int8_t* xr = p.xq + b * kQK_K + 128 * (c >> 1) + 16 * (c & 1) + 8 * h;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            if constexpr (P == 1) {  // 8-byte aligned (16 for P = 2: whole units)
                const int2 v = real ? __ldg(reinterpret_cast<const int2*>(xr + 32 * l)) : make_int2(0, 0);
                x[2 * l] = v.x;
                x[2 * l + 1] = v.y;
            } else {
                const int4 v = real ? __ldg(reinterpret_cast<const int4*>(xr + 32 * l)) : make_int4(0, 0, 0, 0);
                x[4 * l] = v.x;
                x[4 * l + 1] = v.y;
                x[4 * l + 2] = v.z;
                x[4 * l + 3] = v.w;
            }
        }
#pragma unroll
        for (int i = 0; i < 8 * P; ++i) xsum = ts_dp4a_us(0x01010101u, x[i], xsum);
        dx = real ? p.xs[b].d : 0.0f;
    }
    pdl_launch_dependents();

    for (int base = first; base < end; base += kTlBatch) {
        float acc[kTlBatch];
        // A batch's rows; Guarded: the last batches, whose rows or loads may pass the stretch's
        // end. (Past it the cursor stays on the last row and no one stores those rows' sums, so
        // the unguarded form would give the same results: the guards skip work, not errors.)
        const auto rows = [&]<bool Guarded>() {
#pragma unroll
            for (int i = 0; i < kTlBatch; ++i) {
                const int a = i % Ahead;  // base - first is a multiple of kTlBatch: row base + i's slot
                acc[i] = 0.0f;
                if (!Guarded || base + i < end) {
                    const TlWords<P> w = wb[a];
                    const float d = __half2float(sb[a]);
                    if (!Guarded || loaded < end) load_next(a);
                    acc[i] = float(tl_dot<P>(w, x) - xsum) * (d * dx);
                }
            }
        };
        if (base + kTlBatch + Ahead <= end) {
            rows.template operator()<false>();
        } else {
            rows.template operator()<true>();
        }
        tl_fold<kTlBatch / 2>(acc, lane);
        acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], 16);
        if (lane < kTlBatch) red[warp][lane] = acc[0];
        __syncthreads();
        const int row = base + tid;
        if (tid < kTlBatch && row < end) {
            float v = 0.0f;
            for (int w = 0; w < nwarps; ++w) v += red[w][tid];
            const int m = ts_matrix(p, row);
            ts_pick(p.y, m)[row - ts_pick(p.first_row, m)] = v;
            if (p.resid) p.resid[row] += v;  // count == 1: row is the matrix's own
        }
        __syncthreads();  // red is read before the next batch writes it
    }
}

}  // namespace vxq::cuda

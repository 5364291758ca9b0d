// Weight x activation products: dispatch, threading, and the scalar reference.
//
// ================================================================================================
// SUMMATION ORDER: what llama.cpp b4748 computes on an AVX2+FMA+F16C CPU without AVX-512
// ================================================================================================
// Sources read (ggml as vendored in llama.cpp around b4748, Feb 2025):
// [MM] ggml-cpu.c ggml_compute_forward_mul_mat: with src1 contiguous it first calls
//      llamafile_sgemm(m = weight rows, n = tokens, k = cols / block size) on the f32 activations;
//      if that declines, src1 is converted row by row to the weight's vec_dot_type (F16 -> f16,
//      BF16 -> bf16, Q8_0/Q4_0 -> q8_0) and llamafile_sgemm is tried again on the converted
//      activations; if that declines too, each output is one ggml_vec_dot_<type> call
//      (vec_dot_num_rows is 1 on x86).
// [SG] llamafile/sgemm.cpp (after PR #10714, Dec 2024): llamafile_sgemm returns false when n < 2
//      ("only enable sgemm for prompt processing").  F32 needs Btype F32, F16 needs Btype F16 and
//      BF16 needs Btype BF16, so the last two only take the *converted* activations.
//      tinyBLAS<KN = 8, __m256>::matmul declines unless k % 8 == 0 and m % 4 == 0 (4-row tiles).
//      Q8_0 and Q4_0 go to tinyBLAS_Q0_AVX, which never declines.
//      tinyBLAS::gemm_bloc keeps one __m256 accumulator per output: Cv = fma(A[l..l+8),
//      B[l..l+8), Cv) for l = 0, 8, 16, ... (lane j sums elements j, j+8, ...), then hsum(Cv):
//      v = hi128 + lo128; v = v + movehl(v); r = v[0] + v[1], i.e.
//      ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)).
//      tinyBLAS_Q0_AVX (gemm, gemm4xN, gemmMx4): per block, lanes = madd(maddubs(sign(a, a),
//      sign(b, a)), 1) (lane i = bytes 4i..4i+3; a = weight codes, b = activation codes) as
//      float, Cv = fma(set1(fp16(da) * fp16(db)), lanes, Cv); hsum as above.
// [VD] ggml-cpu.c ggml_vec_dot_f32 / _f16 (GGML_F32_STEP = GGML_F16_STEP = 32, EPR = 8):
//      accumulators acc[j], j = 0..3, of 8 lanes; for i in steps of 32:
//      acc[j] = fma(x[i+8j ..], y[i+8j ..], acc[j]).  GGML_F32x8_REDUCE: acc0 += acc2,
//      acc1 += acc3, acc0 += acc1, t = lo128 + hi128, t = hadd(t, t), r = hadd(t, t)[0], i.e.
//      (t0+t1) + (t2+t3).
//      f32: sumf is a float; leftovers (n % 32) `sumf += x[i]*y[i]` one at a time.  ggml-cpu is
//      built -O3 -march=native in GNU C mode (-ffp-contract=fast), so GCC fuses this into
//      sumf = fma(x[i], y[i], sumf)  (ASSUMPTION, see kF32LeftoverFma).
//      f16: sumf is a double (ggml_float) = r; leftovers sumf += (double)(fp16(x) * fp16(y)),
//      the product exact in float; result (float)sumf.
// [VB] ggml_vec_dot_bf16, AVX2 branch: c1..c4 (offsets 0, 8, 16, 24 in steps of 32) accumulate
//      mul+add (the product of two bf16 is exact in f32, so this equals fma),
//      c1 = (c1+c3) + (c2+c4), hsum as tinyBLAS, into a double; leftovers in double; (float)sumf.
// [QD] ggml-cpu-quants.c ggml_vec_dot_q8_0_q8_0 / q4_0_q8_0, AVX2 branch: one __m256 acc,
//      acc = fma(set1(fp16(dx) * fp16(dy)), mul_sum_i8_pairs_float(qx, qy), acc), hsum_float_8
//      (the tinyBLAS reduction).  Q4_0: qx = bytes_from_nibbles_32(qs) - 8: value j in the low
//      nibble of byte j, value j+16 in its high nibble.  So the Q0 orders of [SG] and [QD] are
//      the same: Q8_0 (and Q4_0 with rows % 8 != 0) use it for every n.
// [QQ] quantize_row_q8_0, AVX2 branch: amax by max_ps over |x| (4 vectors, hi/lo, movehl,
//      movehdup), d = amax / 127.f stored as fp16 (F16C, nearest even),
//      id = amax != 0 ? 127.f / amax : 0, q = cvtps_epi32(round_ps(x * id, NEAREST)) packed with
//      signed saturation.  ggml_quantize_mat_q8_0_4x8 (used with repacked Q4_0) gives the same
//      codes and scales.
// [RP] ggml-cpu-aarch64.cpp: on AVX2 every 2-D Q4_0 weight with rows % 8 == 0 is repacked at load
//      time into block_q4_0x8 (ggml_aarch64_get_optimal_repack_type) and its MUL_MAT runs
//      ggml_gemm_q4_0_8x8_q8_0 (4 tokens at a time) / ggml_gemv_q4_0_8x8_q8_0 (the rest).  On
//      AVX2 both take, per output, the exact integer dot of each 32-element block and accumulate
//      acc = fma(float(isum), fp16(dw) * fp16(dx), acc) block after block: a single fma chain,
//      no lanes, no horizontal sum.  (Q8_0 is not repacked on x86 in b4748.)
// Conversions: fp32 -> fp16 rounds to nearest even (F16C); fp32 -> bf16 is
// ggml_compute_fp32_to_bf16 (nearest even, NaN quieted); fp16/bf16 -> f32 are exact.
//
// Hence, for m = rows, n = n_tokens, k = cols (DotOrder, see dot_order()):
//   F32, F16, BF16 with n >= 2 && k % 8 == 0 && m % 4 == 0  -> Lanes8   (tinyBLAS)
//   F32 otherwise                                          -> VecF32   (float sum, fused leftovers)
//   F16 otherwise                                          -> VecF16   (double sum and leftovers)
//   BF16 otherwise                                         -> VecBF16
//   Q8_0 always, Q4_0 with m % 8 != 0                      -> Q0Lanes
//   Q4_0 with m % 8 == 0                                   -> Q4Repack
// The reference below implements these literally, one output at a time, with std::fma where ggml
// fuses and plain float/double adds elsewhere (this file is compiled for baseline x86-64, which
// has no FMA instruction, so the compiler cannot contract anything else).  The AVX2 kernels in
// matmul_avx2.cpp compute the same operations in the same order and must match bit for bit.
// ================================================================================================
#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/weight_formats.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "kernels/cpu/matmul_avx2.h"
#include "kernels/cpu/matmul_kquants.h"

namespace vxq::cpu {

namespace {

// ---------------------------------------------------------------------------------------------
// Scalar emulation of the x86 operations ggml uses.

// hsum of tinyBLAS / hsum_float_8: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))
float hsum8(const float l[8]) {
    const float v0 = l[4] + l[0], v1 = l[5] + l[1], v2 = l[6] + l[2], v3 = l[7] + l[3];
    const float w0 = v0 + v2, w1 = v1 + v3;
    return w0 + w1;
}

// GGML_F32x8_REDUCE of 4 accumulators: lanes a0+a2, a1+a3, then +, then lo+hi and two hadds.
float reduce4x8(const float acc[4][8]) {
    float a[8];
    for (int l = 0; l < 8; ++l) {
        const float s02 = acc[0][l] + acc[2][l];
        const float s13 = acc[1][l] + acc[3][l];
        a[l] = s02 + s13;
    }
    float t[4];
    for (int i = 0; i < 4; ++i) t[i] = a[i] + a[i + 4];
    const float h0 = t[0] + t[1], h1 = t[2] + t[3];
    return h0 + h1;
}

int8_t sign_epi8(int8_t a, int8_t b) {  // _mm256_sign_epi8 for one byte (negation wraps)
    if (b < 0) return int8_t(uint8_t(-int(a)));
    return b == 0 ? int8_t(0) : a;
}

int16_t maddubs_pair(uint8_t a0, int8_t b0, uint8_t a1, int8_t b1) {  // _mm256_maddubs_epi16
    const int s = int(a0) * int(b0) + int(a1) * int(b1);
    return int16_t(std::clamp(s, -32768, 32767));
}

// One int32 lane of ggml's mul_sum_i8_pairs: w = weight codes (signs), x = activation codes.
int32_t dot4(const int8_t* w, const int8_t* x) {
    uint8_t aw[4];
    int8_t sx[4];
    for (int i = 0; i < 4; ++i) {
        aw[i] = uint8_t(sign_epi8(w[i], w[i]));
        sx[i] = sign_epi8(x[i], w[i]);
    }
    return int32_t(maddubs_pair(aw[0], sx[0], aw[1], sx[1])) +
           int32_t(maddubs_pair(aw[2], sx[2], aw[3], sx[3]));
}

void unpack_q4_0(const BlockQ4_0& b, int8_t out[32]) {
    for (int j = 0; j < 16; ++j) {
        out[j] = int8_t((b.qs[j] & 0x0f) - 8);
        out[j + 16] = int8_t((b.qs[j] >> 4) - 8);
    }
}

// cvtps_epi32 (out of range / NaN -> INT32_MIN) followed by the signed-saturating packs to int8.
int8_t cvt_pack_i8(float r) {
    int32_t i;
    if (!(r >= -2147483648.0f && r < 2147483648.0f)) {
        i = INT32_MIN;
    } else {
        i = int32_t(r);
    }
    return int8_t(std::clamp<int32_t>(i, -128, 127));
}

float maxps(float a, float b) { return a > b ? a : b; }  // MAXPS: second operand unless a > b

// ---------------------------------------------------------------------------------------------
// Reference dot products, one output each.

// tinyBLAS: lane l sums elements l, l+8, ... with fma, then hsum8.  w, x already in f32.
float dot_lanes8(const float* w, const float* x, int64_t k) {
    float acc[8] = {};
    for (int64_t i = 0; i < k; i += 8)
        for (int l = 0; l < 8; ++l) acc[l] = std::fma(w[i + l], x[i + l], acc[l]);
    return hsum8(acc);
}

// ggml_vec_dot_f32 / _f16 main part: 4 x 8 lanes over steps of 32, reduce4x8.
float dot_vec_main(const float* w, const float* x, int64_t np) {
    float acc[4][8] = {};
    for (int64_t i = 0; i < np; i += 32)
        for (int j = 0; j < 4; ++j)
            for (int l = 0; l < 8; ++l)
                acc[j][l] = std::fma(w[i + 8 * j + l], x[i + 8 * j + l], acc[j][l]);
    return reduce4x8(acc);
}

float dot_vec_f32(const float* w, const float* x, int64_t k) {
    const int64_t np = k & ~int64_t(31);
    float sum = dot_vec_main(w, x, np);
    for (int64_t i = np; i < k; ++i) {
        if constexpr (kF32LeftoverFma) {
            sum = std::fma(w[i], x[i], sum);
        } else {
            const volatile float p = w[i] * x[i];
            sum = sum + p;
        }
    }
    return sum;
}

// f16 and bf16 values (already widened to f32): the products are exact in f32.
float dot_vec_f16(const float* w, const float* x, int64_t k) {
    const int64_t np = k & ~int64_t(31);
    double sum = double(dot_vec_main(w, x, np));
    for (int64_t i = np; i < k; ++i) sum += double(w[i] * x[i]);
    return float(sum);
}

float dot_vec_bf16(const float* w, const float* x, int64_t k) {
    const int64_t np = k & ~int64_t(31);
    float c[4][8] = {};
    for (int64_t i = 0; i < np; i += 32)
        for (int j = 0; j < 4; ++j)
            for (int l = 0; l < 8; ++l)
                c[j][l] = std::fma(w[i + 8 * j + l], x[i + 8 * j + l], c[j][l]);  // == mul+add
    float lanes[8];
    for (int l = 0; l < 8; ++l) {
        const float s13 = c[0][l] + c[2][l];
        const float s24 = c[1][l] + c[3][l];
        lanes[l] = s13 + s24;
    }
    double sum = double(hsum8(lanes));
    for (int64_t i = np; i < k; ++i) sum += double(w[i] * x[i]);
    return float(sum);
}

// ggml_vec_dot_q8_0_q8_0 / q4_0_q8_0 order (also tinyBLAS_Q0_AVX).  wq: nb*32 weight codes.
float dot_q0_lanes(const int8_t* wq, const float* wd, const BlockQ8_0* xb, int64_t nb) {
    float acc[8] = {};
    for (int64_t b = 0; b < nb; ++b) {
        const float d = wd[b] * fp16_to_fp32(xb[b].d);
        for (int l = 0; l < 8; ++l) {
            const int32_t lane = dot4(wq + 32 * b + 4 * l, xb[b].qs + 4 * l);
            acc[l] = std::fma(d, float(lane), acc[l]);
        }
    }
    return hsum8(acc);
}

// ggml_gemv/gemm_q4_0_8x8_q8_0 order: exact block integer dot, one fma chain.
float dot_q4_repack(const int8_t* wq, const float* wd, const BlockQ8_0* xb, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
        int32_t isum = 0;
        for (int l = 0; l < 8; ++l) isum += dot4(wq + 32 * b + 4 * l, xb[b].qs + 4 * l);
        const float s = wd[b] * fp16_to_fp32(xb[b].d);
        acc = std::fma(float(isum), s, acc);
    }
    return acc;
}

const uint8_t* row_ptr(const WeightView& w, int64_t r) {
    return static_cast<const uint8_t*>(w.data) + size_t(r) * w.row_bytes;
}

void check_view(const WeightView& w) {
    VXQ_ASSERT(w.data != nullptr || w.rows == 0);
    VXQ_ASSERT(w.rows >= 0 && w.cols >= 0);
    VXQ_ASSERT(w.row_bytes >= ggml_row_bytes(w.type, w.cols));
}

// What the activations become before the dot product with w (backend/weight_formats.h).
GgmlType dot_type_of(const WeightView& w) {
    const WeightFormat* f = find_weight_format(w.type);
    if (!f) fail("matmul: no kernel for weight type {}", ggml_type_name(w.type));
    return f->dot_type;
}

// ---------------------------------------------------------------------------------------------
// AVX2 dispatch

bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
    static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                           __builtin_cpu_supports("f16c");
    return ok;
#else
    return false;
#endif
}

// Per-thread scratch, grown on demand and kept for the thread's life (no allocation per call once
// warm).  The calling thread holds the converted activations; every worker its weight panel.
struct Scratch {
    std::vector<float> xf;      // activations widened after f16/bf16 rounding
    std::vector<BlockQ8_0> xq;  // activations quantized to q8_0
    std::vector<float> xd;      // their scales as f32
    std::vector<float> panel;   // per-worker weight panel
    std::vector<BlockQ8_K> xk;  // activations quantized to q8_K
};
thread_local Scratch t_scratch;

template <typename T>
T* grow(std::vector<T>& v, size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
}

// Splits [0, units) into nth near-equal contiguous ranges.
inline void split(int64_t units, int ith, int nth, int64_t& b, int64_t& e) {
    b = units * ith / nth;
    e = units * (ith + 1) / nth;
}

// Activations of n tokens as q8_K blocks, [n, k / 256], in `out` (grown to fit).
const BlockQ8_K* quantize_tokens_q8_K(const float* x, int64_t n, int64_t k, std::vector<BlockQ8_K>& out) {
    VXQ_ASSERT(k % kQK_K == 0);
    BlockQ8_K* xq = grow(out, size_t(n * (k / kQK_K)));
    for (int64_t t = 0; t < n; ++t) quantize_row_q8_K(x + t * k, xq + t * (k / kQK_K), k);
    return xq;
}

// Q6_K / TQ1_0 / TQ2_0 / TQ2_G128: activations to q8_K, then rows split across the pool, each row
// against up to kMultiTokens tokens at once by the AVX2 kernels of matmul_kquants.h.
void matmul_kquant_path(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool& pool) {
    const int64_t m = w.rows, nb = w.cols / kQK_K;
    const BlockQ8_K* xq = quantize_tokens_q8_K(x, n, w.cols, t_scratch.xk);
    if (n == 1 && avx2::dot_kquant_rows_takes(w.type)) {  // decode: kRowsTernary rows per activation load
        pool.run([&](int ith, int nth) {
            int64_t r0, r1;
            split(m, ith, nth, r0, r1);
            for (int64_t r = r0; r < r1; r += avx2::kRowsTernary) {
                const int k = int(std::min<int64_t>(avx2::kRowsTernary, r1 - r));
                avx2::dot_kquant_q8_K_rows(w.type, row_ptr(w, r), w.row_bytes, k, xq, nb, y + r);
            }
        });
        return;
    }
    // Tokens in tiles of kTokenTile, each tile's activations (L1-sized) swept by all of this
    // thread's rows: a row's weights are read once per tile, the activations stay in L1 (row by row
    // over all the tokens, every row re-read all the activations from L2).
    constexpr int64_t kTokenTile = 16;
    pool.run([&](int ith, int nth) {
        int64_t r0, r1;
        split(m, ith, nth, r0, r1);
        float out[avx2::kMultiTokens];
        for (int64_t tt = 0; tt < n; tt += kTokenTile) {
            const int64_t te = std::min(n, tt + kTokenTile);
            for (int64_t r = r0; r < r1; ++r) {
                for (int64_t t0 = tt; t0 < te; t0 += avx2::kMultiTokens) {
                    const int k = int(std::min<int64_t>(avx2::kMultiTokens, te - t0));
                    avx2::dot_kquant_q8_K_multi(w.type, row_ptr(w, r), xq + t0 * nb, nb, nb, k, out);
                    for (int j = 0; j < k; ++j) y[(t0 + j) * m + r] = out[j];
                }
            }
        }
    });
}

void matmul_avx2_path(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool& pool) {
    const int64_t m = w.rows, k = w.cols;
    const DotOrder order = dot_order(w, n);
    if (order == DotOrder::KLanes) return matmul_kquant_path(w, x, n, y, pool);
    const auto* wbase = static_cast<const uint8_t*>(w.data);
    const GgmlType dot = dot_type_of(w);
    Scratch& s = t_scratch;
    const int nth_pool = pool.size();

    // 1. activations -> dot type, once per call (split by tokens across the pool when large)
    const float* xa = x;
    const BlockQ8_0* xq = nullptr;
    const float* xd = nullptr;
    const int64_t nb = k / 32;
    float* xf_buf = nullptr;
    BlockQ8_0* xq_buf = nullptr;
    float* xd_buf = nullptr;
    if (dot == GgmlType::F16 || dot == GgmlType::BF16) {
        xf_buf = grow(s.xf, size_t(n * k));
        xa = xf_buf;
    } else if (dot == GgmlType::Q8_0) {
        xq_buf = grow(s.xq, size_t(n * nb));
        xd_buf = grow(s.xd, size_t(n * nb));
        xq = xq_buf;
        xd = xd_buf;
    }
    if (dot != GgmlType::F32) {
        auto convert = [&](int64_t t0, int64_t t1) {
            if (t0 >= t1) return;
            const float* xs = x + t0 * k;
            const int64_t cnt = (t1 - t0) * k;
            if (dot == GgmlType::F16)
                avx2::round_f16(xs, xf_buf + t0 * k, cnt);
            else if (dot == GgmlType::BF16)
                avx2::round_bf16(xs, xf_buf + t0 * k, cnt);
            else
                avx2::quantize_q8_0(xs, xq_buf + t0 * nb, xd_buf + t0 * nb, cnt);
        };
        if (nth_pool > 1 && n >= 2 * nth_pool && n * k >= (int64_t(1) << 16)) {
            pool.run([&](int ith, int nth) {
                int64_t t0, t1;
                split(n, ith, nth, t0, t1);
                convert(t0, t1);
            });
        } else {
            convert(0, n);
        }
    }

    // 2. products, split across the pool
    avx2::Job job;
    job.type = w.type;
    job.w = wbase;
    job.row_bytes = w.row_bytes;
    job.k = k;
    job.t1 = n;
    job.x = xa;
    job.xq = xq;
    job.xd = xd;
    job.y = y;
    job.ldy = m;
    switch (order) {
        case DotOrder::Lanes8: {
            // panels of 4 rows; split rows across threads unless there are too few of them
            const int64_t panels = m / 4;
            const bool by_rows = panels >= 2 * int64_t(nth_pool) || n < 2 * 3 * int64_t(nth_pool);
            pool.run([&](int ith, int nth) {
                avx2::Job j = job;
                int64_t p0 = 0, p1 = panels;
                if (by_rows)
                    split(panels, ith, nth, p0, p1);
                else
                    split(n, ith, nth, j.t0, j.t1);
                if (p0 >= p1 || j.t0 >= j.t1) return;
                j.r0 = 4 * p0;
                j.r1 = 4 * p1;
                if (w.type != GgmlType::F32)
                    j.scratch = grow(t_scratch.panel, size_t(avx2::kLanes8MaxPanels * 4 * k));
                avx2::gemm_lanes8(j);
            });
            break;
        }
        case DotOrder::VecF32:
        case DotOrder::VecF16:
        case DotOrder::VecBF16:
        case DotOrder::Q0Lanes: {
            pool.run([&](int ith, int nth) {
                avx2::Job j = job;
                split(m, ith, nth, j.r0, j.r1);
                if (j.r0 >= j.r1) return;
                if (order == DotOrder::Q0Lanes)
                    avx2::gemm_q0_lanes(j);
                else
                    avx2::gemv_vec(j);
            });
            break;
        }
        case DotOrder::KLanes: break;  // matmul_kquant_path, above
        case DotOrder::Q4Repack: {
            pool.run([&](int ith, int nth) {
                avx2::Job j = job;
                int64_t g0, g1;
                split(m / 8, ith, nth, g0, g1);
                if (g0 >= g1) return;
                j.r0 = 8 * g0;
                j.r1 = 8 * g1;
                avx2::gemm_q4_repack(j);
            });
            break;
        }
    }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

DotOrder dot_order(const WeightView& w, int64_t n_tokens) {
    const int64_t m = w.rows, k = w.cols;
    switch (w.type) {
        case GgmlType::F32:
        case GgmlType::F16:
        case GgmlType::BF16: {
            if (n_tokens >= 2 && k % 8 == 0 && m % 4 == 0) return DotOrder::Lanes8;
            if (w.type == GgmlType::F32) return DotOrder::VecF32;
            return w.type == GgmlType::F16 ? DotOrder::VecF16 : DotOrder::VecBF16;
        }
        case GgmlType::Q8_0: return DotOrder::Q0Lanes;
        case GgmlType::Q4_0: return m % 8 == 0 ? DotOrder::Q4Repack : DotOrder::Q0Lanes;
        case GgmlType::Q6_K:
        case GgmlType::TQ1_0:
        case GgmlType::TQ2_0:
        case GgmlType::TQ2_G128: return DotOrder::KLanes;
        default: break;
    }
    fail("matmul: unsupported weight type {}", uint32_t(w.type));
}

const char* dot_order_name(DotOrder o) {
    switch (o) {
        case DotOrder::Lanes8: return "lanes8";
        case DotOrder::VecF32: return "vec_f32";
        case DotOrder::VecF16: return "vec_f16";
        case DotOrder::VecBF16: return "vec_bf16";
        case DotOrder::Q0Lanes: return "q0_lanes";
        case DotOrder::Q4Repack: return "q4_repack";
        case DotOrder::KLanes: return "k_lanes";
    }
    return "?";
}

void quantize_row_q8_0(const float* x, BlockQ8_0* out, int64_t n) {
    VXQ_ASSERT(n % kQK8_0 == 0);
    for (int64_t b = 0; b < n / kQK8_0; ++b) {
        const float* v = x + b * kQK8_0;
        // amax in the AVX2 reduction order (matters only for NaN): 4 vectors, hi/lo, movehl,
        // movehdup
        float m8[8];
        for (int l = 0; l < 8; ++l) {
            float a = std::fabs(v[l]);
            for (int j = 1; j < 4; ++j) a = maxps(a, std::fabs(v[8 * j + l]));
            m8[l] = a;
        }
        float m4[4];
        for (int l = 0; l < 4; ++l) m4[l] = maxps(m8[l + 4], m8[l]);
        const float m2a = maxps(m4[0], m4[2]), m2b = maxps(m4[1], m4[3]);
        const float amax = maxps(m2a, m2b);

        const float d = amax / 127.f;
        out[b].d = fp32_to_fp16(d);
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        for (int j = 0; j < kQK8_0; ++j) out[b].qs[j] = cvt_pack_i8(std::nearbyint(v[j] * id));
    }
}

void dequantize_row(const WeightView& w, int64_t r, float* out) {
    check_view(w);
    VXQ_ASSERT(r >= 0 && r < w.rows);
    const uint8_t* p = row_ptr(w, r);
    const int64_t k = w.cols;
    switch (w.type) {
        case GgmlType::F32: std::memcpy(out, p, size_t(k) * sizeof(float)); return;
        case GgmlType::F16:
            for (int64_t i = 0; i < k; ++i) {
                f16_t h;
                std::memcpy(&h, p + 2 * i, 2);
                out[i] = fp16_to_fp32(h);
            }
            return;
        case GgmlType::BF16:
            for (int64_t i = 0; i < k; ++i) {
                bf16_t h;
                std::memcpy(&h, p + 2 * i, 2);
                out[i] = bf16_to_fp32(h);
            }
            return;
        case GgmlType::Q8_0: {
            const auto* b = reinterpret_cast<const BlockQ8_0*>(p);
            for (int64_t i = 0; i < k / kQK8_0; ++i) {
                const float d = fp16_to_fp32(b[i].d);
                for (int j = 0; j < kQK8_0; ++j) out[i * kQK8_0 + j] = float(b[i].qs[j]) * d;
            }
            return;
        }
        case GgmlType::Q4_0: {
            const auto* b = reinterpret_cast<const BlockQ4_0*>(p);
            for (int64_t i = 0; i < k / kQK4_0; ++i) {
                const float d = fp16_to_fp32(b[i].d);
                for (int j = 0; j < kQK4_0 / 2; ++j) {
                    out[i * kQK4_0 + j] = float((b[i].qs[j] & 0x0f) - 8) * d;
                    out[i * kQK4_0 + j + 16] = float((b[i].qs[j] >> 4) - 8) * d;
                }
            }
            return;
        }
        case GgmlType::Q6_K:
        case GgmlType::TQ1_0:
        case GgmlType::TQ2_0:
        case GgmlType::TQ2_G128: dequantize_row_kquant(w.type, p, k, out); return;
        default: break;
    }
    fail("dequantize_row: unsupported weight type {}", uint32_t(w.type));
}

void matmul_ref(const WeightView& w, const float* x, int64_t n_tokens, float* y) {
    check_view(w);
    const int64_t m = w.rows, k = w.cols;
    if (m == 0 || n_tokens <= 0) return;
    const DotOrder order = dot_order(w, n_tokens);
    const GgmlType dot = dot_type_of(w);

    if (dot == GgmlType::Q8_K) {
        std::vector<BlockQ8_K> buf;
        const BlockQ8_K* xq = quantize_tokens_q8_K(x, n_tokens, k, buf);
        const int64_t nb = k / kQK_K;
        for (int64_t r = 0; r < m; ++r) {
            for (int64_t t = 0; t < n_tokens; ++t) y[t * m + r] = dot_kquant_q8_K(w.type, row_ptr(w, r), xq + t * nb, nb);
        }
        return;
    }
    if (dot != GgmlType::Q8_0) {
        // activations in the dot type, weights widened to f32 (exact conversions after rounding)
        std::vector<float> xa(static_cast<size_t>(n_tokens * k)), wr(static_cast<size_t>(k));
        for (int64_t i = 0; i < n_tokens * k; ++i) {
            if (dot == GgmlType::F16)
                xa[size_t(i)] = round_fp16(x[i]);
            else if (dot == GgmlType::BF16)
                xa[size_t(i)] = bf16_to_fp32(fp32_to_bf16(x[i]));
            else
                xa[size_t(i)] = x[i];
        }
        for (int64_t r = 0; r < m; ++r) {
            dequantize_row(w, r, wr.data());
            for (int64_t t = 0; t < n_tokens; ++t) {
                const float* xt = xa.data() + t * k;
                float v = 0.0f;
                switch (order) {
                    case DotOrder::Lanes8: v = dot_lanes8(wr.data(), xt, k); break;
                    case DotOrder::VecF32: v = dot_vec_f32(wr.data(), xt, k); break;
                    case DotOrder::VecF16: v = dot_vec_f16(wr.data(), xt, k); break;
                    case DotOrder::VecBF16: v = dot_vec_bf16(wr.data(), xt, k); break;
                    default: VXQ_ASSERT(false);
                }
                y[t * m + r] = v;
            }
        }
        return;
    }

    // Q8_0 / Q4_0: activations quantized per token row
    VXQ_ASSERT(k % 32 == 0);
    const int64_t nb = k / 32;
    std::vector<BlockQ8_0> xq(static_cast<size_t>(n_tokens * nb));
    for (int64_t t = 0; t < n_tokens; ++t) quantize_row_q8_0(x + t * k, xq.data() + t * nb, k);
    std::vector<int8_t> wq(static_cast<size_t>(k));
    std::vector<float> wd(static_cast<size_t>(nb));
    for (int64_t r = 0; r < m; ++r) {
        const uint8_t* p = row_ptr(w, r);
        for (int64_t b = 0; b < nb; ++b) {
            if (w.type == GgmlType::Q8_0) {
                const auto& blk = reinterpret_cast<const BlockQ8_0*>(p)[b];
                std::memcpy(wq.data() + 32 * b, blk.qs, 32);
                wd[size_t(b)] = fp16_to_fp32(blk.d);
            } else {
                const auto& blk = reinterpret_cast<const BlockQ4_0*>(p)[b];
                unpack_q4_0(blk, wq.data() + 32 * b);
                wd[size_t(b)] = fp16_to_fp32(blk.d);
            }
        }
        for (int64_t t = 0; t < n_tokens; ++t) {
            const BlockQ8_0* xb = xq.data() + t * nb;
            y[t * m + r] = order == DotOrder::Q4Repack ? dot_q4_repack(wq.data(), wd.data(), xb, nb)
                                                       : dot_q0_lanes(wq.data(), wd.data(), xb, nb);
        }
    }
}

void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool) {
    check_view(w);
    if (w.rows == 0 || n_tokens <= 0) return;
    if (w.cols == 0) {
        std::fill(y, y + n_tokens * w.rows, 0.0f);
        return;
    }
    if (!cpu_has_avx2()) {
        static const bool warned = [] {
            std::fprintf(stderr,
                         "vxq: no AVX2+FMA+F16C on this CPU: matmul runs the scalar "
                         "reference (single thread, slow)\n");
            return true;
        }();
        (void)warned;
        matmul_ref(w, x, n_tokens, y);
        return;
    }
    matmul_avx2_path(w, x, n_tokens, y, pool);
}

const char* matmul_isa() { return cpu_has_avx2() ? "avx2" : "scalar"; }

}  // namespace vxq::cpu

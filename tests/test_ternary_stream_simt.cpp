// The batch-1 ternary GEMVs (kernels/cuda/ternary_stream_kernels.cuh: the stream kernel and the
// lane-piece kernel; ternary_mma_kernels.cuh: the tensor-core kernel, TQ2_0, its int8 MMAs as the
// emulator's mma.cuh computes them) run on the CPU by the SIMT emulator (support/simt.h), in every build that has
// the CUDA headers: TQ2_0 and TQ2_G128 rows (GGUF blocks split into the quant and scale planes the
// upload makes) against the CPU backend's dot_kquant_q8_K on the same q8_K activations, for single
// matrices and stacks of matrices that share x, odd row counts, 16 and 32 warps, ring depths 1-8
// and both row counts a warp takes, with stretches long enough that every warp's ring wraps; the
// lane-piece kernel at 1 and 2 pieces a lane with blocks of a partial warp (cols 256-1024),
// several warps (4096: 128 pieces), batches of 16 rows cut short and stacks whose matrices change
// inside a batch; every weight plane ends at an inaccessible page (a read past it faults). On a GPU,
// CudaGemv's TQ2_0 / TQ2_G128 shapes at n = 1 and Cuda.TernaryStreamEqualsGroupKernel run the
// same kernels as compiled for the device. A build without CUDA reports these tests' absence in
// RotatedKvSimt.NeedsACudaBuild.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/fp16.h"
#include "formats/ggml_types.h"
#include "kernels/cpu/matmul_kquants.h"
#include "support/guarded.h"
#include "support/seed.h"

#if VXQ_HAVE_CUDA
#include "support/simt.h"
// (after simt.h: it defines the device built-ins the kernel uses)
#include "kernels/cuda/ternary_mma_kernels.cuh"
#include "kernels/cuda/ternary_stream_kernels.cuh"
#endif

namespace vxq {
namespace {

#if VXQ_HAVE_CUDA

// A matrix as the file holds it (GGUF blocks, random digits 0..2 and fp16 scales of both signs)
// and as the device holds it (quant bytes [rows, cols / 4], scales [rows, cols / group]).
struct TernaryMatrix {
    int64_t rows = 0;
    std::vector<uint8_t> file, quants;
    std::vector<uint16_t> scales;
};
TernaryMatrix random_ternary(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
    const int group = type == GgmlType::TQ2_G128 ? kQK_G128 : kQK_K;  // values a block
    const int qbytes = group / 4, bbytes = qbytes + 2;
    const int64_t nb = cols / group;
    TernaryMatrix m;
    m.rows = rows;
    m.file.resize(size_t(rows * nb * bbytes));
    std::uniform_int_distribution<int> digit(0, 2);
    std::uniform_real_distribution<float> scale(0.01f, 2.0f);
    for (int64_t b = 0; b < rows * nb; ++b) {
        uint8_t* blk = &m.file[size_t(b * bbytes)];
        for (int j = 0; j < qbytes; ++j) {
            blk[j] = uint8_t(digit(rng) | digit(rng) << 2 | digit(rng) << 4 | digit(rng) << 6);
            m.quants.push_back(blk[j]);
        }
        const uint16_t d = fp32_to_fp16(rng() % 2 ? scale(rng) : -scale(rng));
        std::memcpy(blk + qbytes, &d, 2);
        m.scales.push_back(d);
    }
    return m;
}

// x quantized as the CPU backend does, and as the device reads it: the quants [cols] and per
// block the scale and the quant sums of its four 64-value quarters (quarter c: values 128 (c / 2)
// + 32 l + 16 (c % 2) + j, l < 4, j < 16).
struct Q8K {
    std::vector<BlockQ8_K> blocks;
    std::vector<int8_t> qs;
    std::vector<cuda::Q8KScale> scales;
};
Q8K quantize_x(const std::vector<float>& x) {
    Q8K q;
    const int64_t nb = int64_t(x.size()) / kQK_K;
    q.blocks.resize(size_t(nb));
    cpu::quantize_row_q8_K(x.data(), q.blocks.data(), int64_t(x.size()));
    for (const BlockQ8_K& b : q.blocks) {
        cuda::Q8KScale s{b.d, {0, 0, 0, 0}};
        for (int v = 0; v < kQK_K; ++v) {
            q.qs.push_back(b.qs[v]);
            s.sum[2 * (v / 128) + (v % 32) / 16] += b.qs[v];
        }
        q.scales.push_back(s);
    }
    return q;
}

struct Case {
    GgmlType type;
    int64_t cols;
    std::vector<int64_t> rows;  // the stacked matrices' rows
    int sms;                    // the SMs the launch is sized for (blocks = min(sms, rows))
};

// The kernels' parameters over ms, launched as gemv.cu does with c.sms blocks; each matrix's
// quant and scale planes copied to the end of a page followed by an inaccessible one, so that a
// read past a plane faults. resid: the residual the kernel adds the one matrix's rows to
// (GemvFusion::resid), or nullptr.
struct Launch {
    cuda::TernaryStreamParams p{};
    int grid = 0;
    std::vector<std::unique_ptr<test::GuardedBytes>> planes;
};
Launch launch_of(const Case& c, const std::vector<TernaryMatrix>& ms, const Q8K& x, std::vector<std::vector<float>>& y,
                 float* resid) {
    Launch l;
    cuda::TernaryStreamParams& p = l.p;
    p.resid = resid;
    p.count = int(ms.size());
    y.assign(ms.size(), {});
    for (size_t i = 0; i < ms.size(); ++i) {
        y[i].assign(size_t(ms[i].rows), NAN);
        l.planes.push_back(std::make_unique<test::GuardedBytes>(ms[i].quants));
        p.w[i] = l.planes.back()->data();
        l.planes.push_back(std::make_unique<test::GuardedBytes>(
            std::span(reinterpret_cast<const uint8_t*>(ms[i].scales.data()), ms[i].scales.size() * sizeof(uint16_t))));
        p.scale[i] = reinterpret_cast<const __half*>(l.planes.back()->data());
        p.y[i] = y[i].data();
        p.first_row[i + 1] = p.first_row[i] + int(ms[i].rows);
    }
    p.cols = int(c.cols);
    p.scale_group = c.type == GgmlType::TQ2_G128 ? kQK_G128 : kQK_K;
    p.xq = x.qs.data();
    p.xs = x.scales.data();
    p.evict_first = 1;
    const int total = p.first_row[p.count];
    const int blocks = std::min(c.sms, total);
    p.rows_per_block = (total + blocks - 1) / blocks;
    l.grid = (total + p.rows_per_block - 1) / p.rows_per_block;
    return l;
}

// launch_of with xf: x in f32 for the kernel to quantize itself (x's q8_K then not passed), or
// nullptr; with it norm_w: the RMSNorm first (eps), the normalized x also written to x_out.
Launch launch_with(const Case& c, const std::vector<TernaryMatrix>& ms, const Q8K& x, std::vector<std::vector<float>>& y,
                   float* resid, const float* xf, const float* norm_w, float eps, float* x_out) {
    Launch l = launch_of(c, ms, x, y, resid);
    if (xf) l.p.xq = nullptr, l.p.xs = nullptr, l.p.xf = xf;
    l.p.norm_w = norm_w, l.p.norm_eps = eps, l.p.x_out = x_out;
    return l;
}
// The stream kernel at W warps, R rows a warp and a ring of S (launch_with's arguments); MinBlocks
// 2: the half-SM form (its own quantize with 2 blocks in flight a warp).
template <int W, int R, int S, int MinBlocks = 1>
void run_stream_with(const Case& c, const std::vector<TernaryMatrix>& ms, const Q8K& x, std::vector<std::vector<float>>& y,
                     float* resid, const float* xf, const float* norm_w = nullptr, float eps = 0.0f, float* x_out = nullptr) {
    const Launch l = launch_with(c, ms, x, y, resid, xf, norm_w, eps, x_out);
    simt::launch(dim3(unsigned(l.grid)), dim3(W * 32), size_t(cuda::ts_smem_bytes(l.p.cols, l.p.scale_group, W, R, S)),
                 [&] { cuda::ternary_stream_kernel<W, R, S, MinBlocks>(l.p); });
}
using RunWith = void (*)(const Case&, const std::vector<TernaryMatrix>&, const Q8K&, std::vector<std::vector<float>>&, float*,
                         const float*, const float*, float, float*);
template <int W, int R, int S, int MinBlocks = 1>
void run_stream(const Case& c, const std::vector<TernaryMatrix>& ms, const Q8K& x, std::vector<std::vector<float>>& y,
                float* resid = nullptr) {
    run_stream_with<W, R, S, MinBlocks>(c, ms, x, y, resid, nullptr);
}

// The lane-piece kernel (ternary_lanes_kernel) at P pieces a lane.
template <int P>
void run_lanes(const Case& c, const std::vector<TernaryMatrix>& ms, const Q8K& x, std::vector<std::vector<float>>& y,
               float* resid) {
    const Launch l = launch_of(c, ms, x, y, resid);
    simt::launch(dim3(unsigned(l.grid)), dim3(unsigned(cuda::ternary_lanes_threads(l.p.cols, P))), 0,
                 [&] { cuda::ternary_lanes_kernel<cuda::kTlAhead, P>(l.p); });
}

// The tensor-core kernel (ternary_mma_kernel, TQ2_0 only) at W warps and D pairs in flight a
// warp, with the stream kernel's arguments (run_stream_with).
template <int W, int D>
void run_mma_with(const Case& c, const std::vector<TernaryMatrix>& ms, const Q8K& x, std::vector<std::vector<float>>& y,
                  float* resid, const float* xf, const float* norm_w = nullptr, float eps = 0.0f, float* x_out = nullptr) {
    const Launch l = launch_with(c, ms, x, y, resid, xf, norm_w, eps, x_out);
    simt::launch(dim3(unsigned(l.grid)), dim3(W * 32), size_t(cuda::tm_smem_bytes(l.p.cols, W, l.p.rows_per_block)),
                 [&] { cuda::ternary_mma_kernel<W, D, 1>(l.p); });
}
template <int W, int D>
void run_mma(const Case& c, const std::vector<TernaryMatrix>& ms, const Q8K& x, std::vector<std::vector<float>>& y,
             float* resid = nullptr) {
    run_mma_with<W, D>(c, ms, x, y, resid, nullptr);
}

// The kernels' forms the tests run: the stream kernel at both warp counts, both row counts a warp
// takes, rings of 1-8, and in its half-SM form at 8 and 16 warps; the lane-piece kernel; the
// tensor-core kernel (TQ2_0 only) at 16 warps (gemv.cu's) and at 4 and 8 warps with rings of 2 and
// 3 (warps that take many pairs, across tiles).
using Run = void (*)(const Case&, const std::vector<TernaryMatrix>&, const Q8K&, std::vector<std::vector<float>>&, float*);
struct Form {
    const char* name;
    Run run;
    bool tq2_0_only;
};
const Form kForms[] = {
    {"W 16, R 2, S 2", run_stream<16, 2, 2>, false}, {"W 16, R 1, S 2", run_stream<16, 1, 2>, false},
    {"W 16, R 2, S 4", run_stream<16, 2, 4>, false}, {"W 16, R 1, S 8", run_stream<16, 1, 8>, false},
    {"W 32, R 1, S 1", run_stream<32, 1, 1>, false}, {"W 32, R 2, S 1", run_stream<32, 2, 1>, false},
    {"W 32, R 1, S 4", run_stream<32, 1, 4>, false}, {"half-SM W 8, R 1, S 2", run_stream<8, 1, 2, 2>, false},
    {"half-SM W 16, R 1, S 1", run_stream<16, 1, 1, 2>, false}, {"lanes", run_lanes<1>, false},
    {"lanes x2", run_lanes<2>, false},                {"mma W 16, D 4", run_mma<16, 4>, true},
    {"mma W 4, D 2", run_mma<4, 2>, true},            {"mma W 8, D 3", run_mma<8, 3>, true}};

// Every row against dot_kquant_q8_K. The kernel sums per 64 weights in float where the CPU sums
// the integers of 256 (TQ2_0) / 128 (TQ2_G128) and then in float: the same products, other float
// sums, each term's rounding at most 2^-24 relative, over cols / 64 terms.
void expect_rows_match(const Case& c, const std::vector<TernaryMatrix>& ms, const Q8K& x,
                       const std::vector<std::vector<float>>& y, const char* form) {
    const int group = c.type == GgmlType::TQ2_G128 ? kQK_G128 : kQK_K, bbytes = group / 4 + 2;
    const int64_t nb = c.cols / group;
    for (size_t i = 0; i < ms.size(); ++i) {
        for (int64_t r = 0; r < ms[i].rows; ++r) {
            const uint8_t* row = &ms[i].file[size_t(r * nb * bbytes)];
            const float want = cpu::dot_kquant_q8_K(c.type, row, x.blocks.data(), c.cols / kQK_K);
            // the magnitude the float sums work at: sum over blocks of |d_w d_x| * 127 * values
            double mag = 0.0;
            for (int64_t b = 0; b < nb; ++b) {
                mag += std::fabs(double(fp16_to_fp32(ms[i].scales[size_t(r * nb + b)])) * x.blocks[size_t(b * group / kQK_K)].d) * 127.0 * group;
            }
            ASSERT_NEAR(y[i][size_t(r)], want, 4e-6 * mag + 1e-30)
                << form << ": matrix " << i << " row " << r << " of " << ms[i].rows << ", cols " << c.cols;
        }
    }
}

TEST(TernaryStreamSimt, EqualsCpuDotOnEveryRowFormAndStack) {
    const uint32_t seed = test::fresh_seed();
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937 rng(seed);
    const Case cases[] = {
        {GgmlType::TQ2_0, 512, {37}, 5},              // a few rows a block, most warps idle
        {GgmlType::TQ2_0, 1024, {5, 17, 40}, 7},      // a stack of three (q, k, v), blocks across matrices
        {GgmlType::TQ2_0, 512, {200}, 2},             // 100 rows a block: every warp's ring wraps
        {GgmlType::TQ2_G128, 768, {50}, 3},           // a scale per 128 (6 a row)
        {GgmlType::TQ2_G128, 256, {130, 3}, 1},       // one block holds everything; a 3-row matrix
        {GgmlType::TQ2_0, 2560, {1}, 4},              // one row, 40 units a row (lanes 8..31 take 1)
        {GgmlType::TQ2_0, 4096, {70, 9}, 2},         // lanes: 128 pieces, 40 rows a block (a batch of 32 and 8), a stack
    };
    for (const Case& c : cases) {
        std::vector<TernaryMatrix> ms;
        for (const int64_t rows : c.rows) ms.push_back(random_ternary(c.type, rows, c.cols, rng));
        std::vector<float> xf(size_t(c.cols));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (float& v : xf) v = nd(rng);
        xf[size_t(rng() % c.cols)] = 0.0f;
        const Q8K x = quantize_x(xf);
        std::vector<std::vector<float>> y;
        for (const auto& [form, run, tq2_0_only] : kForms) {
            if (tq2_0_only && c.type != GgmlType::TQ2_0) continue;
            run(c, ms, x, y, nullptr);
            expect_rows_match(c, ms, x, y, form);
        }
    }
}

// The residual add of one matrix (the backend's fusion of the add after the O / down projection):
// every row's resid becomes resid + y, y itself stored too, in every form of kForms.
TEST(TernaryStreamSimt, ResidualAddIsResidPlusEveryRow) {
    const uint32_t seed = test::fresh_seed();
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937 rng(seed);
    const Case c{GgmlType::TQ2_0, 1024, {75}, 3};  // (the stream kernel takes rows of an even number of scales)
    const std::vector<TernaryMatrix> ms{random_ternary(c.type, 75, c.cols, rng)};
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> xf(size_t(c.cols)), r0(75);
    for (float& v : xf) v = nd(rng);
    for (float& v : r0) v = nd(rng);
    const Q8K x = quantize_x(xf);
    std::vector<std::vector<float>> y;
    for (const auto& [form, run, tq2_0_only] : kForms) {
        std::vector<float> resid = r0;
        run(c, ms, x, y, resid.data());
        expect_rows_match(c, ms, x, y, form);
        for (size_t r = 0; r < r0.size(); ++r) ASSERT_EQ(resid[r], r0[r] + y[0][r]) << form << ", row " << r;
    }
}

// Every row of every matrix in got equal bit for bit to want's.
void expect_rows_bit_equal(const Case& c, const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want,
                           const char* form) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].size(), want[i].size());
        for (size_t r = 0; r < got[i].size(); ++r) {
            ASSERT_EQ(std::bit_cast<uint32_t>(got[i][r]), std::bit_cast<uint32_t>(want[i][r]))
                << form << ": matrix " << i << " row " << r << ", cols " << c.cols << ": " << got[i][r] << " vs " << want[i][r];
        }
    }
}

// x in f32, quantized to q8_K by the stream kernel's own blocks (TernaryStreamParams::xf, the
// default where x comes in f32): every row equal bit for bit to the same kernel reading the CPU's
// q8_K (quantize_row_q8_K), so every quant, scale and quarter sum the blocks make is the CPU's.
// x holds a zero 256-block, values on exact half steps of iscale (ties to even), blocks whose
// largest magnitude comes twice with both signs (which one is the maximum flips q and d together,
// so y cannot tell: a planted last-of-equals choice passes, as it should) and random values; three
// forms of the ring and two half-SM forms (batches of two), a stack, both scale groups, one to
// nine 256-blocks a warp (W 16 at 17408 columns: 68 blocks, the loop's batches of four cut short).
// Planted bugs caught: the quants' byte offset in a unit, truncation for round-to-nearest, a
// quarter sum's lanes.
TEST(TernaryStreamSimt, QuantizingXInTheKernelEqualsTheCpuQuantsBitForBit) {
    const uint32_t seed = test::fresh_seed();
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937 rng(seed);
    const Case cases[] = {
        {GgmlType::TQ2_0, 1024, {5, 17, 40}, 7},
        {GgmlType::TQ2_G128, 768, {50}, 3},
        {GgmlType::TQ2_0, 17408, {9}, 4},
        {GgmlType::TQ2_0, 5120, {33}, 2},
    };
    const std::pair<const char*, RunWith> forms[] = {
        {"W 16, R 1, S 2", run_stream_with<16, 1, 2>}, {"W 16, R 2, S 4", run_stream_with<16, 2, 4>}, {"W 32, R 1, S 1", run_stream_with<32, 1, 1>},
        {"half-SM W 8, R 2, S 4", run_stream_with<8, 2, 4, 2>}, {"half-SM W 16, R 1, S 1", run_stream_with<16, 1, 1, 2>}};
    for (const Case& c : cases) {
        std::vector<TernaryMatrix> ms;
        for (const int64_t rows : c.rows) ms.push_back(random_ternary(c.type, rows, c.cols, rng));
        std::vector<float> xf(size_t(c.cols));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (float& v : xf) v = nd(rng);
        const int64_t nb = c.cols / kQK_K;
        std::fill_n(xf.begin(), kQK_K, 0.0f);  // block 0: zero
        if (nb > 1) {  // block 1: the largest magnitude twice, negative first; and values 127 k / 254 of it
            float* b1 = xf.data() + kQK_K;
            b1[rng() % 64] = -4.0f;
            b1[128 + rng() % 64] = 4.0f;
            for (int k = 0; k < 16; ++k) b1[64 + k] = 4.0f * float(2 * k + 1) / 254.0f;  // iscale x = (2 k + 1) / 2
        }
        if (nb > 2) {  // block 2: the largest magnitude twice, positive first
            float* b2 = xf.data() + 2 * kQK_K;
            b2[rng() % 128] = 3.0f;
            b2[128 + rng() % 128] = -3.0f;
        }
        const Q8K x = quantize_x(xf);
        std::vector<std::vector<float>> want, got;
        run_stream<16, 1, 2>(c, ms, x, want);
        expect_rows_match(c, ms, x, want, "reading the CPU's q8_K");
        for (const auto& [form, run] : forms) {
            run(c, ms, x, got, nullptr, xf.data(), nullptr, 0.0f, nullptr);
            expect_rows_bit_equal(c, got, want, form);
        }
        if (c.type == GgmlType::TQ2_0) {  // the tensor-core kernel's own quantize (its x layout) against it reading the CPU's
            const std::pair<const char*, RunWith> mma_forms[] = {{"mma W 16, D 4", run_mma_with<16, 4>}, {"mma W 8, D 3", run_mma_with<8, 3>}};
            for (const auto& [form, run] : mma_forms) {
                run(c, ms, x, want, nullptr, nullptr, nullptr, 0.0f, nullptr);
                expect_rows_match(c, ms, x, want, form);
                run(c, ms, x, got, nullptr, xf.data(), nullptr, 0.0f, nullptr);
                expect_rows_bit_equal(c, got, want, form);
            }
        }
    }
}

// rms_norm's scale as block_rms_scale (device_math.cuh) sums: thread t < 256 sums x[t + 256 k]^2
// in double in k's order, partials folded at 128 and 64, then within warp 0 by p[t] + p[t + 32] and
// shuffles down 16 .. 1; the mean rounded to float before eps.
float rms_scale_as_device(const std::vector<float>& x, float eps) {
    std::vector<double> p(256, 0.0);
    for (size_t c = 0; c < x.size(); ++c) p[c % 256] += double(x[c] * x[c]);
    for (int s = 128; s > 32; s >>= 1) {
        for (int t = 0; t < s; ++t) p[size_t(t)] += p[size_t(t + s)];
    }
    double v[32];
    for (int t = 0; t < 32; ++t) v[t] = p[size_t(t)] + p[size_t(t + 32)];
    for (int s = 16; s > 0; s >>= 1) {
        double next[32];
        for (int t = 0; t < 32; ++t) next[t] = v[t] + (t + s < 32 ? v[t + s] : v[t]);
        std::copy(next, next + 32, v);
    }
    const float mean = float(v[0] / double(x.size()));
    return 1.0f / std::sqrt(mean + eps);
}

// The RMSNorm before the matmul in the stream kernel's own quantize (GemvFusion's norm at n = 1):
// y equal bit for bit to the kernel reading the q8_K of x normalized on the host as rms_norm does
// (rms_scale_as_device, then x s w rounded after each product), and the normalized x written out
// equal to it, every 256-block by some block (grids of 1-7 blocks over 2-68 256-blocks); a stack.
// Planted bugs caught: only block 0 writing, x w s for x s w, every value with block 0's weights.
TEST(TernaryStreamSimt, RmsNormBeforeTheQuantizeEqualsNormalizingFirst) {
    const uint32_t seed = test::fresh_seed();
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937 rng(seed);
    const Case cases[] = {
        {GgmlType::TQ2_0, 1024, {5, 17, 40}, 7},
        {GgmlType::TQ2_G128, 512, {50}, 1},
        {GgmlType::TQ2_0, 17408, {9}, 3},
    };
    for (const Case& c : cases) {
        std::vector<TernaryMatrix> ms;
        for (const int64_t rows : c.rows) ms.push_back(random_ternary(c.type, rows, c.cols, rng));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> in(size_t(c.cols)), w(size_t(c.cols));
        for (float& v : in) v = 3.0f * nd(rng);
        for (float& v : w) v = 1.0f + 0.25f * nd(rng);
        const float eps = 1e-5f;
        const float scale = rms_scale_as_device(in, eps);
        std::vector<float> normed(in.size());
        for (size_t i = 0; i < in.size(); ++i) normed[i] = (in[i] * scale) * w[i];
        const Q8K x = quantize_x(normed);
        std::vector<std::vector<float>> want, got;
        run_stream<16, 1, 2>(c, ms, x, want);
        std::vector<float> out(in.size(), NAN);
        run_stream_with<16, 2, 4>(c, ms, x, got, nullptr, in.data(), w.data(), eps, out.data());
        for (size_t i = 0; i < in.size(); ++i) {
            ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(normed[i])) << "normalized x[" << i << "], cols " << c.cols;
        }
        expect_rows_bit_equal(c, got, want, "the RMSNorm in the kernel");
        if (c.type == GgmlType::TQ2_0) {  // the same in the tensor-core kernel
            run_mma<16, 4>(c, ms, x, want);
            std::fill(out.begin(), out.end(), NAN);
            run_mma_with<16, 4>(c, ms, x, got, nullptr, in.data(), w.data(), eps, out.data());
            for (size_t i = 0; i < in.size(); ++i) {
                ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(normed[i])) << "mma: normalized x[" << i << "]";
            }
            expect_rows_bit_equal(c, got, want, "the RMSNorm in the tensor-core kernel");
        }
    }
}

// The tensor-core kernel's batch form (NB = 8 columns): n = 2..8 tokens of x in one pass over the
// weights, y [n, rows] of each matrix, every token's rows against dot_kquant_q8_K on that token's
// q8_K; stacks, rows that end inside a tile, warps with pairs of several tiles (W 4, D 2), and
// tokens with a zero x. Planted bugs caught: every column reading token 0's x, one token's scales
// for both of a lane's columns, matrix 0's rows as every matrix's token stride (writes past y),
// only tokens 0 and 1 flushed.
TEST(TernaryStreamSimt, MmaBatchFormTakesUpToEightTokens) {
    const uint32_t seed = test::fresh_seed();
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937 rng(seed);
    struct BatchCase {
        Case c;
        int n;
    };
    const BatchCase cases[] = {
        {{GgmlType::TQ2_0, 1024, {5, 17, 40}, 7}, 3},
        {{GgmlType::TQ2_0, 512, {200}, 2}, 8},
        {{GgmlType::TQ2_0, 4096, {70, 9}, 2}, 2},
        {{GgmlType::TQ2_0, 2560, {33}, 3}, 5},
    };
    for (const auto& [c, n] : cases) {
        std::vector<TernaryMatrix> ms;
        for (const int64_t rows : c.rows) ms.push_back(random_ternary(c.type, rows, c.cols, rng));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<Q8K> xs;
        Q8K all;  // the n tokens' q8_K one after another, as the quantize kernel writes [n] rows
        for (int t = 0; t < n; ++t) {
            std::vector<float> xf(size_t(c.cols));
            for (float& v : xf) v = t == 1 ? 0.0f : nd(rng);  // token 1: zero
            xs.push_back(quantize_x(xf));
            all.qs.insert(all.qs.end(), xs.back().qs.begin(), xs.back().qs.end());
            all.scales.insert(all.scales.end(), xs.back().scales.begin(), xs.back().scales.end());
        }
        for (const auto& [form, W] : {std::pair<const char*, int>{"mma batch W 16, D 4", 16}, std::pair<const char*, int>{"mma batch W 4, D 2", 4}}) {
            std::vector<std::vector<float>> y;
            Launch l = launch_of(c, ms, all, y, nullptr);
            l.p.n = n;
            for (size_t i = 0; i < ms.size(); ++i) {
                y[i].assign(size_t(n * ms[i].rows), NAN);
                l.p.y[i] = y[i].data();
            }
            const size_t smem = size_t(cuda::tm_smem_bytes(l.p.cols, W, l.p.rows_per_block, cuda::kTmMaxTokens, n));
            if (W == 16) {
                simt::launch(dim3(unsigned(l.grid)), dim3(16 * 32), smem, [&] { cuda::ternary_mma_kernel<16, 4, cuda::kTmMaxTokens>(l.p); });
            } else {
                simt::launch(dim3(unsigned(l.grid)), dim3(4 * 32), smem, [&] { cuda::ternary_mma_kernel<4, 2, cuda::kTmMaxTokens>(l.p); });
            }
            for (int t = 0; t < n; ++t) {
                std::vector<std::vector<float>> yt(ms.size());
                for (size_t i = 0; i < ms.size(); ++i) {
                    yt[i].assign(y[i].begin() + t * ms[i].rows, y[i].begin() + (t + 1) * ms[i].rows);
                }
                SCOPED_TRACE(testing::Message() << form << ", token " << t << " of " << n);
                expect_rows_match(c, ms, xs[size_t(t)], yt, form);
                if (t == 1) {
                    for (const auto& v : yt) {
                        for (const float f : v) ASSERT_EQ(f, 0.0f);
                    }
                }
            }
        }
    }
}

// An all-zero x (q8_K: d = 0, every quant 0) gives 0 for every row, whatever the weights.
TEST(TernaryStreamSimt, ZeroActivationsGiveZero) {
    std::mt19937 rng(test::fresh_seed());
    const Case c{GgmlType::TQ2_0, 512, {33}, 2};
    const std::vector<TernaryMatrix> ms{random_ternary(c.type, 33, c.cols, rng)};
    const Q8K x = quantize_x(std::vector<float>(size_t(c.cols), 0.0f));
    std::vector<std::vector<float>> y;
    run_stream<16, 2, 4>(c, ms, x, y);
    for (const float v : y[0]) EXPECT_EQ(v, 0.0f);
}

#endif

}  // namespace
}  // namespace vxq

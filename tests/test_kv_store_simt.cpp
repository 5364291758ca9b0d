// The store of keys and values into token-wise pages (kernels/cuda/kv_store_kernels.cuh: f16, q8_0,
// q4_0, fp8, every key / value pair) run on the CPU by the SIMT emulator (support/simt.h): every
// stored byte against the CPU codec's encoder (kv/formats/baseline.h), on random rows with planted
// values where the encoders have their edge cases (NaN of both signs, infinities, signed zeros,
// subnormals, fp8's saturation and ties, all-zero blocks, blocks of tiny subnormals (q4_0's 1 / d
// infinite or near it), q4_0's first value of largest magnitude among equal ones of both signs),
// head_dim 64 / 96 / 128 / 256 (a lane's stretch partly outside the row), odd token and head counts
// (a warp's pairs cut short), heads whose slots start anywhere and input rows that end at an
// inaccessible page; both forms of q8_0's and fp8's codes (the scalar steps, and the conversion
// instructions' form, whose two instructions are here their PTX semantics in C++). The bytes around
// each written token must stay as they were. On a GPU the same kernel as compiled for the device
// (the instructions themselves) is checked by Cuda.TokenStoreBitExactOnEdgeValues and the caches'
// byte comparisons (Cuda.CompressedKvMirrorsCpuInEveryLayer). Also kv_store_row, the per-row store
// of other head sizes and of the split kernel's fused RoPE + store. A build without CUDA reports these
// tests' absence in RotatedKvSimt.NeedsACudaBuild.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "kv/formats/baseline.h"
#include "support/guarded.h"
#include "support/seed.h"

#if VXQ_HAVE_CUDA
#include "support/simt.h"
// (after simt.h: it defines the device built-ins the kernel uses)
#include "kernels/cuda/kv_store_kernels.cuh"
#include "support/kv_code_cpu.h"
#endif

namespace vxq {
namespace {

#if VXQ_HAVE_CUDA

using cuda::KvCode;

using test::kv_code_name;
using test::kv_encode_cpu;

// Rows of N(0, s) values, s per row from 1e-3 to 1e3, a third of the values replaced by one of
// the planted ones; every 7th 32-block all zero, every 5th holding a value and its negation as
// its largest magnitude.
std::vector<float> random_rows(size_t n, int64_t hd, std::mt19937& rng) {
    const float inf = std::numeric_limits<float>::infinity();
    const float planted[] = {NAN,    -NAN,   inf,    -inf,     0.0f,    -0.0f,     1e-40f,   -1e-45f,   0x1p-10f,
                             0x1p-6f, 1.0625f, -1.1875f, 447.9f, 465.0f, 240.0f, 232.0f, 2.5f, -3.5f};
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(n * size_t(hd));
    for (size_t r = 0; r < n; ++r) {
        const float s = std::pow(10.0f, float(int(rng() % 7) - 3));
        for (int64_t c = 0; c < hd; ++c) {
            float& e = x[r * size_t(hd) + size_t(c)];
            e = rng() % 3 == 0 ? planted[rng() % std::size(planted)] : s * nd(rng);
            if ((r + size_t(c / 32)) % 7 == 0) e = 0.0f;
        }
        for (int64_t b = 0; b < hd / 32; ++b) {
            if ((r + size_t(b)) % 5 != 0) continue;
            float* blk = &x[r * size_t(hd) + size_t(32 * b)];
            for (int j = 0; j < 32; ++j) blk[j] = std::isfinite(blk[j]) ? std::fmin(std::fabs(blk[j]), 4.0f) : 1.0f;
            blk[rng() % 32] = -8.0f;
            blk[rng() % 32] = 8.0f;
        }
        for (int64_t b = 0; b < hd / 32; ++b) {  // every 11th block of tiny numbers: q4_0's 1 / d overflows, or nearly
            if ((r + size_t(b)) % 11 != 3) continue;
            const float tiny[] = {0x1p-149f, 0x1p-140f, 0x1p-126f, 0x1p-125f, 0x1.8p-124f};
            const float unit = tiny[rng() % std::size(tiny)];
            float* blk = &x[r * size_t(hd) + size_t(32 * b)];
            for (int j = 0; j < 32; ++j) blk[j] = float(int(rng() % 15) - 7) * unit;
        }
    }
    return x;
}

// Every byte; f16 pages by their fp16 numbers, where a NaN equals any NaN (the conversion's NaN:
// the device's is the canonical 0x7fff, the CPU's keeps the payload; f16 has no NaN of its own).
void expect_pages_equal(KvCode c, const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, int64_t tb, const char* what) {
    ASSERT_EQ(got.size(), want.size());
    const auto is_nan = [](const uint8_t* p) { return (p[1] & 0x7c) == 0x7c && ((p[1] & 3) | p[0]) != 0; };
    for (size_t i = 0; i < got.size(); ++i) {
        if (c == KvCode::F16 && is_nan(&got[i & ~size_t(1)]) && is_nan(&want[i & ~size_t(1)])) continue;
        ASSERT_EQ(got[i], want[i]) << what << ", slot " << int64_t(i) / tb << " byte " << int64_t(i) % tb;
    }
}

template <KvCode KC, KvCode VC, bool HwCvt>
void expect_store_matches_cpu(int64_t n, int64_t n_head_kv, int64_t hd, std::mt19937& rng, uint32_t seed) {
    SCOPED_TRACE(testing::Message() << kv_code_name(KC) << "/" << kv_code_name(VC) << (HwCvt ? " (conversion instructions)" : "") << " n "
                                    << n << " heads " << n_head_kv << " head_dim " << hd << " seed " << seed);
    const int64_t ktb = cuda::kv_token_bytes(KC, hd), vtb = cuda::kv_token_bytes(VC, hd);
    const int64_t cap = n + 9;  // slots a head's pages hold
    std::vector<float> k = random_rows(size_t(n * n_head_kv), hd, rng), v = random_rows(size_t(n * n_head_kv), hd, rng);
    std::vector<std::vector<uint8_t>> kp(static_cast<size_t>(n_head_kv)), vp(static_cast<size_t>(n_head_kv));
    std::vector<cuda::KvHeadDev> heads(static_cast<size_t>(n_head_kv));
    for (int64_t g = 0; g < n_head_kv; ++g) {
        kp[size_t(g)].assign(size_t(cap * ktb), uint8_t(0xa5));
        vp[size_t(g)].assign(size_t(cap * vtb), uint8_t(0x5a));
        cuda::KvHeadDev& h = heads[size_t(g)];
        h.k = reinterpret_cast<uint64_t>(kp[size_t(g)].data());
        h.v = reinterpret_cast<uint64_t>(vp[size_t(g)].data());
        h.n_tokens = int64_t(rng() % 10);
        h.evicted = 0;
        h.k_scale = g % 2 ? 1e-3f : 0x1p-7f;  // fp8: the division and the power-of-two reciprocal
        h.v_scale = g % 3 ? 0x1p-7f : 3.0f;
    }
    const auto expected_k = kp, expected_v = vp;
    // The rows end at an inaccessible page: a read past them faults.
    const auto bytes_of = [](const std::vector<float>& x) {
        return std::span(reinterpret_cast<const uint8_t*>(x.data()), x.size() * sizeof(float));
    };
    const test::GuardedBytes gk(bytes_of(k)), gv(bytes_of(v));
    const cuda::KvStoreParams p{reinterpret_cast<const float*>(gk.data()), reinterpret_cast<const float*>(gv.data()),
                                heads.data(), n, n_head_kv, hd, KC, VC};
    const int64_t per_block = int64_t(cuda::kKvStoreWarps) * cuda::kKvStorePairs;
    simt::launch(dim3(unsigned((n * n_head_kv + per_block - 1) / per_block)), dim3(cuda::kKvStoreWarps * 32), 0,
                 [&] { cuda::kv_store_rows_kernel<KC, VC, HwCvt>(p); });
    for (int64_t g = 0; g < n_head_kv; ++g) {
        SCOPED_TRACE(testing::Message() << "head " << g);
        const cuda::KvHeadDev& h = heads[size_t(g)];
        std::vector<uint8_t> ek = expected_k[size_t(g)], ev = expected_v[size_t(g)];
        for (int64_t t = 0; t < n; ++t) {
            const size_t row = size_t((t * n_head_kv + g) * hd);
            kv_encode_cpu(KC, &k[row], hd, &ek[size_t((h.n_tokens + t) * ktb)], h.k_scale);
            kv_encode_cpu(VC, &v[row], hd, &ev[size_t((h.n_tokens + t) * vtb)], h.v_scale);
        }
        expect_pages_equal(KC, kp[size_t(g)], ek, ktb, "keys");
        expect_pages_equal(VC, vp[size_t(g)], ev, vtb, "values");
    }
}

// Every shape (head_dim 64 / 96 / 128 / 256; 1-37 tokens, 1-8 heads) or, `few`, one of each
// head_dim; the conversion instructions' form too where the pair has q8_0 or fp8.
template <KvCode KC, KvCode VC>
void shapes(bool few, std::mt19937& rng, uint32_t seed) {
    constexpr bool converts = KC == KvCode::Q8_0 || KC == KvCode::FP8 || VC == KvCode::Q8_0 || VC == KvCode::FP8;
    const std::pair<int64_t, int64_t> all[] = {{1, 1}, {1, 8}, {3, 3}, {37, 2}, {16, 8}};
    for (const int64_t hd : {64, 96, 128, 256}) {
        for (const auto& [n, heads] : all) {
            if (few && n != 3) continue;
            expect_store_matches_cpu<KC, VC, false>(n, heads, hd, rng, seed);
            if constexpr (converts) expect_store_matches_cpu<KC, VC, true>(n, heads, hd, rng, seed);
        }
    }
}

TEST(KvStoreSimt, EveryFormatPairBitExactWithCpuEncoders) {
    const uint32_t seed = test::fresh_seed();
    std::mt19937 rng(seed);
    shapes<KvCode::F16, KvCode::F16>(false, rng, seed);
    shapes<KvCode::Q8_0, KvCode::Q8_0>(false, rng, seed);
    shapes<KvCode::Q4_0, KvCode::Q4_0>(false, rng, seed);
    shapes<KvCode::FP8, KvCode::FP8>(false, rng, seed);
    shapes<KvCode::Q8_0, KvCode::F16>(true, rng, seed);
    shapes<KvCode::F16, KvCode::Q4_0>(true, rng, seed);
    shapes<KvCode::Q4_0, KvCode::Q8_0>(true, rng, seed);
    shapes<KvCode::FP8, KvCode::Q4_0>(true, rng, seed);
    shapes<KvCode::Q8_0, KvCode::FP8>(true, rng, seed);
}

// kv_store_row (kv_codes.cuh: the store of other head sizes and the split kernel's fused RoPE +
// store take a row through it, a warp per q8_0 / q4_0 block, kv_encode_q8_0 / kv_encode_q4_0) on
// the same rows: every byte against the CPU codec's, at head_dim 32 .. 256 with 64 or 128 threads.
TEST(KvStoreSimt, RowStoreBitExactWithCpuEncoders) {
    const uint32_t seed = test::fresh_seed();
    std::mt19937 rng(seed);
    for (const KvCode c : {KvCode::F16, KvCode::Q8_0, KvCode::Q4_0, KvCode::FP8}) {
        for (const int64_t hd : {32, 64, 96, 128, 256}) {
            for (const int threads : {64, 128}) {
                SCOPED_TRACE(testing::Message() << kv_code_name(c) << " head_dim " << hd << " threads " << threads << " seed " << seed);
                const int64_t rows = 9, tb = cuda::kv_token_bytes(c, hd);
                const std::vector<float> x = random_rows(size_t(rows), hd, rng);
                std::vector<uint8_t> got(size_t(rows * tb), uint8_t(0xa5)), want = got;
                const float scale = c == KvCode::FP8 ? 0x1p-7f : 1.0f;
                simt::launch(dim3(unsigned(rows)), dim3(unsigned(threads)), 0, [&] {
                    const int64_t r = blockIdx.x;
                    cuda::kv_store_row(c, &x[size_t(r * hd)], &got[size_t(r * tb)], int(hd), int(threadIdx.x), threads, scale);
                });
                for (int64_t r = 0; r < rows; ++r) kv_encode_cpu(c, &x[size_t(r * hd)], hd, &want[size_t(r * tb)], scale);
                expect_pages_equal(c, got, want, tb, "rows");
            }
        }
    }
}

#endif

}  // namespace
}  // namespace vxq

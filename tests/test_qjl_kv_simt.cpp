// The QJL CUDA kernels (kernels/cuda/qjl_kv_kernels.cuh) run on the CPU by the SIMT emulator
// (support/simt.h), in every build that has the CUDA headers, GPU or not: the key store against
// the CPU codec's bytes (window tokens and new ones, ties between channels, a NaN), the attention
// and its merge against dequantize-then-attend over packed blocks and fp16 windows. On a GPU,
// Cuda.RotatedStoreBitExactAndAttentionMatchesCpu checks the same kernels as compiled for the
// device, the values' store (kivi.cu) included. A build without CUDA reports the emulated tests'
// absence in RotatedKvSimt.NeedsACudaBuild.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "kv/codec.h"
#include "kv/formats/qjl.h"
#include "kv/spec.h"
#include "support/random_weights.h"
#include "support/seed.h"

#if VXQ_HAVE_CUDA
#include "support/simt.h"
// (after simt.h: it defines the device built-ins the kernels use)
#include "kernels/cuda/qjl_kv_kernels.cuh"
#include "support/reader_simt.h"
#endif

namespace vxq {
namespace {

#if VXQ_HAVE_CUDA
using test::fresh_seed;
using test::random_floats;

uint64_t addr(const void* p) { return uint64_t(reinterpret_cast<uintptr_t>(p)); }

// Layer 0's key state and both codecs of a qjl spec at head_dim d, and the device formats (host
// memory) with the rings a cache gives them: R key slots, R + 1 value slots.
struct Qjl {
    std::unique_ptr<KvLayerState> state;
    std::unique_ptr<Codec> keys, values;
    std::vector<uint8_t> bytes;
    cuda::QjlFormatDev kf{};
    cuda::KiviFormatDev vf{};
    int64_t residual = 0;
    Qjl(const std::string& spec, int64_t d) {
        const CodecSpec cs = KvSpec::parse(spec).k;
        state = make_layer_state(cs, KvRole::Key, d, 0);
        keys = make_codec(cs, KvRole::Key, d, state.get());
        values = make_codec(cs, KvRole::Value, d, nullptr);
        residual = keys->flush_at();
        kf = cuda::qjl_format_host(*static_cast<const codecs::qjl::State*>(state.get()), bytes);
        kf.slots = int32_t(residual);
        const KvFormatParams vp = values->params(d);
        vf = cuda::KiviFormatDev{vp.bits, vp.group, int32_t(vp.rows), int32_t(vp.block_bytes), int32_t(values->flush_at())};
    }
};

struct KeyStoreCase {
    const char* spec;
    int64_t d, pending, head, n;  // the window's pending tokens from ring slot `head`, then n new ones
};

// The key store writes the CPU codec's block for every block the plan encodes (the window's
// oldest tokens, then new ones rounded to fp16), leaves the blocks before and the grid's idle
// blocks alone; KV head 1 has a NaN in a window token, head 2 only values from {0, +-1, 0.5}
// (channels of equal sums of squares: the outliers' ties), token 0 of the new ones is zero.
TEST(QjlSimt, KeyStoreWritesTheCpuCodecsBytes) {
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    const KeyStoreCase cases[] = {{"qjl:residual=64", 128, 40, 50, 40},
                                  {"qjl:outliers=0", 64, 31, 7, 1},
                                  {"qjl:m=40,mo=24,outliers=3", 96, 0, 0, 100},
                                  {"qjl:m=64,mo=32,outliers=64,residual=64", 256, 10, 60, 60},
                                  {"qjl:outliers=32", 32, 5, 20, 30}};
    for (const KeyStoreCase& c : cases) {
        SCOPED_TRACE(testing::Message() << c.spec << " d " << c.d << " pending " << c.pending << " n " << c.n << " seed " << seed);
        const Qjl qj(c.spec, c.d);
        const int64_t d = c.d, H = 3, R = qj.residual, before = 64, total = c.pending + c.n;
        const int64_t encoded = total >= R ? ((total - R) / R + 1) * R : 0;
        const int64_t blocks = cuda::qjl_store_max_blocks(c.n, R), bb = qj.kf.block_bytes;
        ASSERT_GT(encoded, 0);
        ASSERT_LE(encoded / 32, blocks);
        std::vector<std::vector<f16_t>> ring(size_t(H), std::vector<f16_t>(size_t(R * d)));
        std::vector<float> k = random_floats(size_t(c.n * H * d), rng);
        std::uniform_real_distribution<float> scale(-4.0f, 4.0f);
        const float pool[] = {0.0f, 1.0f, -1.0f, 0.5f};
        for (int64_t g = 0; g < H; ++g) {
            for (f16_t& e : ring[size_t(g)]) e = fp32_to_fp16(g == 2 ? pool[rng() % 4] : std::exp2(scale(rng)) * random_floats(1, rng)[0]);
            for (int64_t t = 0; t < c.n; ++t) {
                float* row = &k[size_t((t * H + g) * d)];
                const float s = std::exp2(scale(rng));
                for (int64_t e = 0; e < d; ++e) row[e] = g == 2 ? pool[rng() % 4] : t == 0 ? 0.0f : row[e] * s;
            }
        }
        if (c.pending > 0) ring[1][size_t((c.head % R) * d + 3)] = fp32_to_fp16(NAN);
        std::vector<std::vector<uint8_t>> pages(size_t(H), std::vector<uint8_t>(size_t((before / 32 + blocks) * bb), 0xab));
        std::vector<cuda::KiviHeadDev> heads;
        for (int64_t g = 0; g < H; ++g) {
            cuda::KiviHeadDev h{};
            h.k = addr(pages[size_t(g)].data());
            h.kw = addr(ring[size_t(g)].data());
            heads.push_back(h);
        }
        const KvWindowWrite plan{before, c.pending, c.head, R, encoded};
        cuda::QjlKeyStoreParams p{};
        p.k = k.data();
        p.heads = heads.data();
        p.plan = &plan;
        p.n = c.n;
        p.n_head_kv = H;
        p.head_dim = d;
        p.kf = qj.kf;
        simt::launch(dim3(unsigned(blocks), unsigned(H)), dim3(cuda::kQjlStoreThreads), 0, [&] { cuda::qjl_key_store_kernel(p); });
        std::vector<float> x(size_t(32 * d));
        std::vector<uint8_t> want(static_cast<size_t>(bb));
        for (int64_t g = 0; g < H; ++g) {
            const auto& pg = pages[size_t(g)];
            for (int64_t b = 0; b < blocks; ++b) {
                const auto got = pg.begin() + long((before / 32 + b) * bb);
                if (b * 32 >= encoded) {
                    EXPECT_TRUE(std::all_of(got, got + long(bb), [](uint8_t e) { return e == 0xab; })) << "idle block " << b;
                    continue;
                }
                for (int64_t t = 0; t < 32; ++t) {
                    const int64_t i = b * 32 + t;
                    for (int64_t e = 0; e < d; ++e) {
                        x[size_t(t * d + e)] = i < c.pending ? fp16_to_fp32(ring[size_t(g)][size_t(((c.head + i) % R) * d + e)])
                                                             : round_fp16(k[size_t(((i - c.pending) * H + g) * d + e)]);
                    }
                }
                qj.keys->encode(x.data(), d, want.data());
                EXPECT_TRUE(std::equal(want.begin(), want.end(), got)) << "block " << b << ", head " << g;
            }
            EXPECT_TRUE(std::all_of(pg.begin(), pg.begin() + long(before / 32 * bb), [](uint8_t e) { return e == 0xab; }))
                << "head " << g << ": the blocks before the write";
        }
    }
}

struct AttentionCase {
    const char* spec;
    int64_t d, n_head, n_head_kv, n_tokens, k_window, v_window, n_q, splits;
};

// The attention (split-K, then the merge) equals dequantize-then-attend (qjl::decode's estimator
// vectors, KIVI's decode, the windows' fp16; scores and softmax in double) within 2e-5 on
// outputs of size ~1: f32 sums in another order, the sketch products S q in f32.
TEST(QjlSimt, AttentionEqualsDequantizeThenAttend) {
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    const AttentionCase cases[] = {{"qjl", 128, 4, 1, 75, 11, 20, 1, 2},
                                   {"qjl:outliers=0,residual=64", 64, 6, 2, 70, 6, 50, 3, 3},
                                   {"qjl:m=40,mo=24,outliers=3", 96, 2, 2, 40, 8, 32, 2, 1},
                                   {"qjl:m=64,mo=32,outliers=64", 256, 2, 1, 33, 1, 1, 1, 4},
                                   {"qjl", 64, 3, 3, 96, 0, 0, 37, 2},
                                   {"qjl", 32, 8, 2, 20, 20, 20, 9, 1},
                                   // vxq-llama-h64's shape (head_dim 64, GQA 3, default outliers)
                                   {"qjl", 64, 6, 2, 64, 0, 0, 64, 1},
                                   {"qjl", 64, 6, 2, 72, 8, 8, 1, 2},
                                   // 11 tiles: three of 4 splits hold tokens (4, 4 and 3)
                                   {"qjl", 64, 4, 1, 340, 20, 20, 1, 4}};
    for (const AttentionCase& c : cases) {
        SCOPED_TRACE(testing::Message() << c.spec << " d " << c.d << " heads " << c.n_head << "/" << c.n_head_kv << " tokens "
                                        << c.n_tokens << " windows " << c.k_window << "/" << c.v_window << " n_q " << c.n_q
                                        << " splits " << c.splits << " seed " << seed);
        const Qjl qj(c.spec, c.d);
        const int64_t d = c.d, kpk = c.n_tokens - c.k_window, vpk = c.n_tokens - c.v_window;
        ASSERT_EQ(kpk % 32, 0);
        ASSERT_LT(c.k_window, qj.kf.slots);
        ASSERT_LT(c.v_window, qj.vf.slots);
        const size_t kbb = size_t(qj.kf.block_bytes), vbb = size_t(qj.vf.block_bytes);
        std::vector<std::vector<uint8_t>> kp(size_t(c.n_head_kv)), vp(size_t(c.n_head_kv));
        std::vector<std::vector<f16_t>> kr(size_t(c.n_head_kv)), vr(size_t(c.n_head_kv));
        std::vector<std::vector<float>> kd(size_t(c.n_head_kv)), vd(size_t(c.n_head_kv));  // decoded
        std::vector<cuda::KiviHeadDev> heads;
        for (int64_t g = 0; g < c.n_head_kv; ++g) {
            const std::vector<float> keys = random_floats(size_t(c.n_tokens * d), rng), vals = random_floats(keys.size(), rng);
            auto &kpg = kp[size_t(g)], &vpg = vp[size_t(g)];
            auto &kdg = kd[size_t(g)], &vdg = vd[size_t(g)];
            kpg.assign(size_t(kpk / 32) * kbb + 16, 0x5a);
            vpg.assign(size_t(vpk) * vbb + 16, 0x5a);
            kr[size_t(g)].assign(size_t(qj.kf.slots * d), 0x7e00);  // unused slots: NaN (never read)
            vr[size_t(g)].assign(size_t(qj.vf.slots * d), 0x7e00);
            kdg.resize(keys.size());
            vdg.resize(keys.size());
            for (int64_t b = 0; b < kpk / 32; ++b) {
                qj.keys->encode(&keys[size_t(b * 32 * d)], d, &kpg[size_t(b) * kbb]);
                qj.keys->decode(&kpg[size_t(b) * kbb], d, &kdg[size_t(b * 32 * d)]);
            }
            for (int64_t t = 0; t < vpk; ++t) {
                qj.values->encode(&vals[size_t(t * d)], d, &vpg[size_t(t) * vbb]);
                qj.values->decode(&vpg[size_t(t) * vbb], d, &vdg[size_t(t * d)]);
            }
            cuda::KiviHeadDev h{addr(kpg.data()), addr(vpg.data()), addr(kr[size_t(g)].data()), addr(vr[size_t(g)].data()),
                                c.n_tokens, kpk, vpk, int64_t(rng() % uint32_t(qj.kf.slots)), int64_t(rng() % uint32_t(qj.vf.slots))};
            for (int64_t t = kpk; t < c.n_tokens; ++t) {  // the windows: ring slot (head + t - packed) % slots
                f16_t* slot = &kr[size_t(g)][size_t((h.k_head + t - kpk) % qj.kf.slots * d)];
                for (int64_t e = 0; e < d; ++e) kdg[size_t(t * d + e)] = fp16_to_fp32(slot[e] = fp32_to_fp16(keys[size_t(t * d + e)]));
            }
            for (int64_t t = vpk; t < c.n_tokens; ++t) {
                f16_t* slot = &vr[size_t(g)][size_t((h.v_head + t - vpk) % qj.vf.slots * d)];
                for (int64_t e = 0; e < d; ++e) vdg[size_t(t * d + e)] = fp16_to_fp32(slot[e] = fp32_to_fp16(vals[size_t(t * d + e)]));
            }
            heads.push_back(h);
        }
        cuda::QjlAttentionParams p{};
        p.n_q = c.n_q;
        p.n_head = c.n_head;
        p.n_head_kv = c.n_head_kv;
        p.head_dim = d;
        p.splits = c.splits;
        p.kf = qj.kf;
        p.vf = qj.vf;
        test::expect_reader_attention<cuda::QjlReader>(p, heads, c.n_tokens, kd, vd, rng);
    }
}
#endif

}  // namespace
}  // namespace vxq

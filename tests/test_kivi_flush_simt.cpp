// KIVI's flush kernel (kernels/cuda/kivi_flush_kernels.cuh: the default layout, groups of 32, 2-
// and 4-bit keys and values, head_dim 64 / 128) run on the CPU by the SIMT emulator
// (support/simt.h): every packed byte against the CPU codec's kivi::quantize_group + pack_row, the
// bytes around the encoded blocks unchanged. Groups of every kind the encoder has an edge for:
// normal values with planted infinities, NaN, values that overflow fp16 or round to a subnormal or
// zero; values from {+0, -0, 1, -1, 0.25} and from {+0, -0} (a group's minimum a zero of either
// sign, first in either lane: the zero's sign bit); constant groups (scale 0); fp16 subnormals a
// few steps apart (the scale rounded down: quotients past qmax, clamped); groups on the
// lattice of their own zero and scale at, next to and between the half-integers (the codes' near
// ties, where the division decides). Writes with no pending window tokens (a prompt) and with
// pending ones in a wrapping ring, a lane's 8 keys partly from the ring and partly from the rows;
// values encoded in a partial chunk; and blocks past the plan (nothing written). The rows end at
// an inaccessible page. On a GPU the kernel as compiled for the device is checked by
// Cuda.KiviStoreBitExact* (test_cuda.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "core/fp16.h"
#include "kv/formats/kivi.h"
#include "support/guarded.h"
#include "support/seed.h"

#if VXQ_HAVE_CUDA
#include "support/simt.h"
// (after simt.h: it defines the device built-ins the kernel uses)
#include "kernels/cuda/kivi_flush_kernels.cuh"
#endif

namespace vxq {
namespace {

#if VXQ_HAVE_CUDA

// The values of one group (32, in group order) for a stream of `bits` bits: a kind chosen by `kind`.
std::vector<float> group_values(int kind, int bits, std::mt19937& rng) {
    const float inf = std::numeric_limits<float>::infinity();
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> g(32);
    switch (kind) {
        case 0:
        case 1:
        case 2: {  // normal, planted edge values
            const float s = std::pow(10.0f, float(int(rng() % 7) - 3));
            const float planted[] = {inf, -inf, 0.0f, -0.0f, 1e-6f, -3e-8f, 1e-9f, 65504.0f, -70000.0f, 0x1p-24f};
            for (float& e : g) e = s * nd(rng);
            if (kind == 1) {
                for (float& e : g) {
                    if (rng() % 8 == 0) e = planted[rng() % std::size(planted)];
                }
            }
            if (kind == 2 && rng() % 3 == 0) g[rng() % 32] = rng() % 2 ? NAN : -NAN;
            break;
        }
        case 3: {
            const float pool[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.25f};
            for (float& e : g) e = pool[rng() % 5];
            break;
        }
        case 4: {  // zeros of both signs, now and then a positive value
            for (float& e : g) e = rng() % 2 ? 0.0f : -0.0f;
            if (rng() % 2) g[rng() % 32] = 0.5f;
            break;
        }
        case 5: {  // constant
            const float c = round_fp16(nd(rng));
            std::fill(g.begin(), g.end(), c);
            break;
        }
        case 6: {  // fp16 subnormals over a few steps: the scale rounded far down, quotients past qmax
            const float unit = 0x1p-24f, base = float(int(rng() % 201) - 100) * unit;
            const int steps = 1 + int(rng() % 12);
            for (float& e : g) e = base + float(int(rng() % uint32_t(steps + 1))) * unit;
            if (rng() % 2) g[rng() % 32] = base + 0.6f * unit;  // rounds to a neighbour (x only)
            break;
        }
        default: {  // the lattice of the group's own zero and scale: near ties
            const float qmax = float((1 << bits) - 1);
            const float z = round_fp16(float(int(rng() % 65)) / 8.0f - 4.0f);
            const float mx = round_fp16(z + qmax * std::exp2(float(int(rng() % 15)) - 10.0f) * (1.0f + float(rng() % 100) / 100.0f));
            const float s = fp16_to_fp32(fp32_to_fp16((mx - z) / qmax));  // the scale the group gets
            for (float& e : g) {
                const int k = int(rng() % uint32_t(qmax));
                const f16_t h = f16_t(fp32_to_fp16(z + (float(k) + 0.5f) * s) + int(rng() % 3) - 1);
                e = std::clamp(fp16_to_fp32(h), z, mx);
            }
            g[rng() % 32] = z;
            g[rng() % 32] = mx;
            break;
        }
    }
    return g;
}

// One stream's write (keys: role 0, values: role 1) of `n` new tokens for every head, its plan
// and ring, run through the kernel, against the CPU.
struct StreamCase {
    int64_t pending, head, slots, packed, encoded;
};

template <int D, int KB, int VB>
void expect_flush_matches_cpu(int64_t n, int64_t n_head_kv, const StreamCase (&sc)[2], std::mt19937& rng, uint32_t seed) {
    SCOPED_TRACE(testing::Message() << "D " << D << " bits " << KB << "/" << VB << " n " << n << " heads " << n_head_kv
                                    << " pending " << sc[0].pending << "/" << sc[1].pending << " encoded " << sc[0].encoded << "/"
                                    << sc[1].encoded << " seed " << seed);
    constexpr int G = 32;
    const codecs::kivi::Layout lay[2] = {codecs::kivi::key_layout(KB, G, D), codecs::kivi::value_layout(VB, G, D)};
    // The logical values of every encoded token (write-local i < encoded), per role and head:
    // keys by (block, channel) groups, values by (token, row) groups.
    std::vector<float> x[2];
    std::vector<std::vector<uint16_t>> ring[2];
    std::vector<std::vector<uint8_t>> blocks[2];
    std::vector<cuda::KiviHeadDev> heads(static_cast<size_t>(n_head_kv));
    std::vector<std::vector<uint8_t>> want[2];
    for (int role = 0; role < 2; ++role) {
        const StreamCase& c = sc[role];
        const int bits = role ? VB : KB;
        x[role].assign(size_t(n * n_head_kv * D), 7.0f);  // rows not encoded: any value
        for (int64_t g = 0; g < n_head_kv; ++g) {
            std::vector<float> logical(size_t(c.encoded * D));
            if (role == 0) {
                for (int64_t b = 0; b < c.encoded / G; ++b) {
                    for (int64_t ch = 0; ch < D; ++ch) {
                        const std::vector<float> v = group_values(int(rng() % 9), bits, rng);
                        for (int t = 0; t < G; ++t) logical[size_t((b * G + t) * D + ch)] = v[size_t(t)];
                    }
                }
            } else {
                for (int64_t t = 0; t < c.encoded; ++t) {
                    for (int64_t r = 0; r < D / G; ++r) {
                        const std::vector<float> v = group_values(int(rng() % 9), bits, rng);
                        std::copy(v.begin(), v.end(), logical.begin() + (t * D + r * G));
                    }
                }
            }
            ring[role].emplace_back(size_t(c.slots * D));
            std::vector<uint16_t>& rg = ring[role].back();
            for (uint16_t& h : rg) h = uint16_t(rng());  // slots not read: anything
            std::vector<float> rounded(logical.size());  // as the window holds them
            for (int64_t i = 0; i < c.encoded; ++i) {
                for (int64_t ch = 0; ch < D; ++ch) {
                    const float v = logical[size_t(i * D + ch)];
                    if (i < c.pending) {
                        const f16_t h = fp32_to_fp16(v);
                        rg[size_t(((c.head + i) % c.slots) * D + ch)] = h;
                        rounded[size_t(i * D + ch)] = fp16_to_fp32(h);
                    } else {
                        x[role][size_t(((i - c.pending) * n_head_kv + g) * D + ch)] = v;
                        rounded[size_t(i * D + ch)] = round_fp16(v);
                    }
                }
            }
            const int64_t nblocks = role == 0 ? (c.packed + c.encoded) / G + 1 : c.packed + c.encoded + 1;  // one past: untouched
            blocks[role].emplace_back(size_t(nblocks) * lay[role].block_bytes(), uint8_t(0xa5 + role));
            std::vector<uint8_t> expect = blocks[role].back();
            const codecs::kivi::Layout& l = lay[role];
            std::vector<float> vals(G);
            std::vector<uint8_t> codes(G);
            const auto put = [&](uint8_t* blk, int64_t row) {
                f16_t z16, s16;
                codecs::kivi::quantize_group(vals.data(), G, l.bits, &z16, &s16, codes.data());
                std::memcpy(blk + l.zero_offset() + 2 * size_t(row), &z16, 2);
                std::memcpy(blk + l.scale_offset() + 2 * size_t(row), &s16, 2);
                codecs::kivi::pack_row(codes.data(), G, l.bits, blk + l.codes_offset() + size_t(row * l.row_code_bytes()));
            };
            if (role == 0) {
                for (int64_t b = 0; b < c.encoded / G; ++b) {
                    for (int64_t ch = 0; ch < D; ++ch) {
                        for (int t = 0; t < G; ++t) vals[size_t(t)] = rounded[size_t((b * G + t) * D + ch)];
                        put(expect.data() + size_t(c.packed / G + b) * l.block_bytes(), ch);
                    }
                }
            } else {
                for (int64_t t = 0; t < c.encoded; ++t) {
                    for (int64_t r = 0; r < D / G; ++r) {
                        std::copy_n(rounded.begin() + (t * D + r * G), G, vals.begin());
                        put(expect.data() + size_t(c.packed + t) * l.block_bytes(), r);
                    }
                }
            }
            want[role].push_back(std::move(expect));
        }
    }
    for (int64_t g = 0; g < n_head_kv; ++g) {
        const auto addr = [](const void* p) { return uint64_t(reinterpret_cast<uintptr_t>(p)); };
        heads[size_t(g)] = cuda::KiviHeadDev{addr(blocks[0][size_t(g)].data()), addr(blocks[1][size_t(g)].data()),
                                             addr(ring[0][size_t(g)].data()), addr(ring[1][size_t(g)].data()), 0, 0, 0, 0, 0};
    }
    const auto bytes_of = [](const std::vector<float>& v) { return std::span(reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4); };
    const test::GuardedBytes gk(bytes_of(x[0])), gv(bytes_of(x[1]));
    const KvWindowWrite plan[2] = {{sc[0].packed, sc[0].pending, sc[0].head, sc[0].slots, sc[0].encoded},
                                   {sc[1].packed, sc[1].pending, sc[1].head, sc[1].slots, sc[1].encoded}};
    cuda::KiviStoreParams p{};
    p.k = reinterpret_cast<const float*>(gk.data());
    p.v = reinterpret_cast<const float*>(gv.data());
    p.heads = heads.data();
    p.plan = plan;
    p.n = n;
    p.n_head_kv = n_head_kv;
    p.head_dim = D;
    p.kf = {KB, G, D, int32_t(lay[0].block_bytes()), int32_t(sc[0].slots)};
    p.vf = {VB, G, D / G, int32_t(lay[1].block_bytes()), int32_t(sc[1].slots)};
    const int64_t chunks = (std::max(sc[0].encoded, sc[1].encoded) + G - 1) / G + 2;  // two past the plan: no work
    simt::launch(dim3(unsigned(chunks * cuda::kFlushQuarters<D>), unsigned(n_head_kv), 2), dim3(cuda::kFlushThreads), 0,
                 [&] { cuda::kivi_flush_kernel<D, KB, VB>(p); });
    for (int role = 0; role < 2; ++role) {
        for (int64_t g = 0; g < n_head_kv; ++g) {
            const std::vector<uint8_t>& got = blocks[role][size_t(g)];
            const std::vector<uint8_t>& exp = want[role][size_t(g)];
            for (size_t i = 0; i < got.size(); ++i) {
                ASSERT_EQ(int(got[i]), int(exp[i])) << (role ? "values" : "keys") << " head " << g << " block "
                                                    << i / lay[role].block_bytes() << " byte " << i % lay[role].block_bytes();
            }
        }
    }
}

template <int D, int KB, int VB>
void cases(std::mt19937& rng, uint32_t seed) {
    // A prompt of 100 tokens (keys: 3 whole blocks, values: 71 tokens, a partial chunk);
    expect_flush_matches_cpu<D, KB, VB>(100, 3, {{0, 0, 128, 0, 96}, {0, 0, 129, 5, 71}}, rng, seed);
    // 37 pending tokens in a ring that wraps (a lane's 8 keys from the ring and the rows), 60 new;
    expect_flush_matches_cpu<D, KB, VB>(60, 2, {{37, 110, 128, 64, 96}, {37, 120, 129, 3, 90}}, rng, seed);
    // the whole ring pending (127 of 128 slots) and one new token.
    expect_flush_matches_cpu<D, KB, VB>(9, 1, {{127, 77, 128, 32, 128}, {128, 5, 129, 0, 130}}, rng, seed);
}

TEST(KiviFlushSimt, BitExactWithCpuEncoderOnEdgeGroups) {
    const uint32_t seed = test::fresh_seed();
    std::mt19937 rng(seed);
    cases<128, 2, 2>(rng, seed);
    cases<128, 4, 4>(rng, seed);
    cases<128, 2, 4>(rng, seed);
    cases<64, 4, 2>(rng, seed);
    cases<64, 2, 2>(rng, seed);
}

#endif

}  // namespace
}  // namespace vxq

// The tensor-core decode attention's tile arithmetic (kernels/cuda/attention_tiles.cuh: the scores,
// online softmax and O += P V of 16-token tiles that the stream and bulk-copy kernels share) run
// on the CPU by the SIMT emulator (support/simt.h, with mma.cuh's MMAs emulated from the PTX
// fragment layouts): one warp walks a stretch of tiles as the bulk-copy kernel walks its ring
// (rows read where the kernel reads them, a last tile cut short), and its state, written out as
// mma_state_write_partial writes it, is compared with a scalar reference in double: softmax of the
// scores against the keys as stored (f16 / fp8: their values times q; q8_0 / q4_0: the exact
// integer block dots of the codes with the query's q8_0 codes, times both scales), times the
// values as stored. Every format pair the kernel takes (f16 / fp8 pairs, the four block pairs),
// head_dim 64 / 128, GQA 1 / 3 / 4 / 8, stretches of 1 to 45 tokens, values of sizes 1e-3 and 1e3.
// Tolerance 2e-5 relative to the largest |value| (the GPU tests' bound): q is split hi / lo (x
// within 2^-22), P likewise (~2^-22), products exact, f32 sums in another order.
// On a GPU the same functions as compiled for the device run in Cuda.AttentionStreamFormMatchesCpu*.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "kv/formats/baseline.h"
#include "support/seed.h"

#if VXQ_HAVE_CUDA
#include "support/simt.h"
// (after simt.h: it defines the device built-ins the kernel uses)
#include "kernels/cuda/attention_tiles.cuh"
#include "support/kv_code_cpu.h"
#endif

namespace vxq {
namespace {

#if VXQ_HAVE_CUDA

using cuda::KvCode;

using test::kv_code_name;
using test::kv_decode_cpu;
using test::kv_encode_cpu;

// What the warp computed: o [REP][HD] unnormalized (as the partial holds it), its max and sum per head.
struct TileOut {
    std::vector<float> o, m, l;
};

// One warp over n tokens (rows of kv_token_bytes apart, keys then values), REP heads of q
// (f32 rows; the block formats' keys take them as q8_0 codes qc and scales qd).
template <int REP, KvCode KC, KvCode VC, int HD>
TileOut run_tiles(const std::vector<uint8_t>& keys, const std::vector<uint8_t>& values, int n, const std::vector<float>& q,
                  const std::vector<int8_t>& qc, const std::vector<float>& qd, float score_scale) {
    using namespace cuda;
    constexpr int ktb = int(kv_token_bytes(KC, HD)), vtb = int(kv_token_bytes(VC, HD)), KC32 = HD / 32, VH = HD / 64;
    TileOut out{std::vector<float>(REP * HD), std::vector<float>(REP), std::vector<float>(REP)};
    simt::launch(dim3(1), dim3(32), 0, [&] {
        const int lane = int(threadIdx.x), gid = lane >> 2, tig = lane & 3;
        uint4 qa[HD / 16];
        QBlockFrag<HD> qb{};
        if constexpr (kv_half_keys(KC)) {
            for (int s = 0; s < HD / 16; ++s) qa[s] = mma_q_fragment<REP, HD>(q.data(), s);
        } else {
            qb = q_block_frag<REP, KC, HD>(qc.data(), qd.data());
        }
        const auto qfrag = [&](int s) { return qa[s]; };
        MmaTileState<HD> st;
        for (int t0 = 0; t0 < n; t0 += kStreamMmaTile) {
            const int ul = std::min(kStreamMmaTile, n - t0);
            const uint8_t* ku = keys.data() + size_t(t0) * ktb;
            const uint8_t* vu = values.data() + size_t(t0) * vtb;
            float sc[2][2];
            if constexpr (kv_half_keys(KC)) {
                Raw8<KC> kw[2][KC32];
                for (int m = 0; m < 2; ++m) {
                    for (int c = 0; c < KC32; ++c) {
                        std::memcpy(&kw[m][c], ku + std::min(8 * m + gid, ul - 1) * ktb + (32 * c + 8 * tig) * ktb / HD, sizeof(Raw8<KC>));
                    }
                }
                mma_tile_scores<KC, HD>(qfrag, kw, ul, score_scale, sc);
            } else {
                mma_tile_scores_q<KC, HD>(qb, ku, ul, score_scale, sc);
            }
            if constexpr (kv_half_keys(VC)) {
                Raw8<VC> vw[4][VH];
                for (int i = 0; i < 4; ++i) {
                    const int t = std::min(2 * tig + (i & 1) + 8 * (i >> 1), ul - 1);
                    for (int h = 0; h < VH; ++h) std::memcpy(&vw[i][h], vu + t * vtb + (64 * h + 8 * gid) * vtb / HD, sizeof(Raw8<VC>));
                }
                mma_tile_values<VC, HD>(sc, vw, ul, st);
            } else {
                mma_tile_values_q<VC, HD>(sc, vu, ul, st);
            }
        }
        if (gid < REP) {  // as mma_state_write_partial lays the state out
            for (int nt = 0; nt < HD / 8; ++nt) {
                for (int i = 0; i < 2; ++i) {
                    const int c = 2 * tig + i;
                    if constexpr (kv_half_keys(VC)) {
                        out.o[size_t(gid * HD + hv_dim(nt, c))] = (st.acc[nt][i] + st.acc[nt][i + 2]) * kPScaleInv;
                    } else {
                        out.o[size_t(gid * HD + qv_dim<VC>(nt, c))] = st.acc[nt][i] + st.acc[nt][i + 2] * kLoInv;
                    }
                }
            }
            if (tig == 0) out.m[size_t(gid)] = st.m_run, out.l[size_t(gid)] = st.l_run;
        }
    });
    return out;
}

template <int REP, KvCode KC, KvCode VC, int HD>
void check_case(int n, float value_size, std::mt19937& rng) {
    SCOPED_TRACE(std::string(kv_code_name(KC)) + "/" + kv_code_name(VC) + " hd " + std::to_string(HD) + " rep " + std::to_string(REP) + " n " +
                 std::to_string(n) + " values ~" + std::to_string(value_size));
    constexpr int ktb = int(cuda::kv_token_bytes(KC, HD)), vtb = int(cuda::kv_token_bytes(VC, HD));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> q(REP * HD), k(size_t(n) * HD), v(size_t(n) * HD);
    for (float& x : q) x = nd(rng);
    for (float& x : k) x = nd(rng);
    for (float& x : v) x = value_size * nd(rng);
    // Some tokens' keys far larger (a sharp softmax: the running max moves within and across tiles).
    for (int t = 0; t < n; t += 7) {
        for (int d = 0; d < HD; ++d) k[size_t(t) * HD + d] *= 3.0f;
    }
    std::vector<uint8_t> kb(size_t(n) * ktb), vb(size_t(n) * vtb);
    std::vector<float> kd(size_t(n) * HD), vd(size_t(n) * HD);
    for (int t = 0; t < n; ++t) {
        kv_encode_cpu(KC, &k[size_t(t) * HD], HD, &kb[size_t(t) * ktb], 1.0f);
        kv_encode_cpu(VC, &v[size_t(t) * HD], HD, &vb[size_t(t) * vtb], 1.0f);
        kv_decode_cpu(KC, &kb[size_t(t) * ktb], HD, &kd[size_t(t) * HD], 1.0f);
        kv_decode_cpu(VC, &vb[size_t(t) * vtb], HD, &vd[size_t(t) * HD], 1.0f);
    }
    // The block formats' query: q8_0 (codes and a scale per 32), as the kernel quantizes it.
    std::vector<int8_t> qc(REP * HD);
    std::vector<float> qd(REP * HD / 32);
    for (int b = 0; b < REP * HD / 32; ++b) {
        uint8_t blk[34];
        kvfmt::Q8_0::encode(&q[size_t(b) * 32], 32, blk, 1.0f);
        qd[size_t(b)] = load_fp16(blk);
        std::memcpy(&qc[size_t(b) * 32], blk + 2, 32);
    }
    const float score_scale = 1.0f / std::sqrt(float(HD));
    const TileOut got = run_tiles<REP, KC, VC, HD>(kb, vb, n, q, qc, qd, score_scale);
    float vmax = 0.0f;
    for (float x : vd) vmax = std::fmax(vmax, std::fabs(x));
    for (int r = 0; r < REP; ++r) {
        std::vector<double> s(static_cast<size_t>(n));
        double mx = -INFINITY;
        for (int t = 0; t < n; ++t) {
            double dot = 0.0;
            if constexpr (cuda::kv_half_keys(KC)) {
                for (int d = 0; d < HD; ++d) dot += double(q[size_t(r) * HD + d]) * kd[size_t(t) * HD + d];
            } else {
                constexpr int bb = KC == KvCode::Q8_0 ? 34 : 18;
                for (int b = 0; b < HD / 32; ++b) {
                    const uint8_t* blk = &kb[size_t(t) * ktb + size_t(b) * bb];
                    const double dk = load_fp16(blk);
                    int sum = 0;
                    for (int j = 0; j < 32; ++j) {
                        const int code = KC == KvCode::Q8_0 ? int(int8_t(blk[2 + j])) : int((blk[2 + j % 16] >> (4 * (j / 16))) & 15) - 8;
                        sum += int(qc[size_t(r) * HD + 32 * b + j]) * code;
                    }
                    dot += double(sum) * dk * qd[size_t(r * HD / 32 + b)];
                }
            }
            s[size_t(t)] = dot * score_scale;
            mx = std::fmax(mx, s[size_t(t)]);
        }
        double l = 0.0;
        std::vector<double> o(HD, 0.0);
        for (int t = 0; t < n; ++t) {
            const double p = std::exp(s[size_t(t)] - mx);
            l += p;
            for (int d = 0; d < HD; ++d) o[size_t(d)] += p * vd[size_t(t) * HD + d];
        }
        // The warp's unnormalized state against the reference's: o / l at its own max.
        const double gl = got.l[size_t(r)];
        ASSERT_GT(gl, 0.0);
        EXPECT_NEAR(got.m[size_t(r)], mx, 1e-5 * std::fmax(1.0, std::fabs(mx)));
        for (int d = 0; d < HD; ++d) {
            const double want = o[size_t(d)] / l, have = got.o[size_t(r * HD + d)] / gl;
            ASSERT_NEAR(have, want, 2e-5 * vmax) << "head " << r << " dim " << d;
        }
    }
}

template <KvCode KC, KvCode VC>
void check_pair(std::mt19937& rng) {
    for (const int n : {1, 5, 16, 17, 31, 45}) {
        for (const float size : {1e-3f, 1.0f, 1e3f}) {
            check_case<1, KC, VC, 128>(n, size, rng);
            check_case<4, KC, VC, 64>(n, size, rng);
            if (n == 17 || n == 45) {
                check_case<3, KC, VC, 128>(n, size, rng);
                check_case<8, KC, VC, 64>(n, size, rng);
                check_case<8, KC, VC, 128>(n, size, rng);
            }
        }
    }
}

TEST(AttentionTilesSimt, EveryFormatPairEqualsTheScalarReference) {
    const uint32_t seed = test::fresh_seed();
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937 rng(seed);
    check_pair<KvCode::F16, KvCode::F16>(rng);
    check_pair<KvCode::FP8, KvCode::FP8>(rng);
    check_pair<KvCode::Q8_0, KvCode::Q8_0>(rng);
    check_pair<KvCode::Q4_0, KvCode::Q4_0>(rng);
    check_pair<KvCode::Q8_0, KvCode::Q4_0>(rng);
    check_pair<KvCode::Q4_0, KvCode::Q8_0>(rng);
}

// The emulated MMAs against the fragment layouts written out by hand (mma.cuh's comment): A and B
// of distinct small integers, so a swapped register or lane shows in the product.
TEST(AttentionTilesSimt, EmulatedMmaFollowsThePtxFragmentLayouts) {
    float a16[16][16], b16[16][8];
    int a8[16][32], b8[32][8];
    for (int r = 0; r < 16; ++r) {
        for (int k = 0; k < 16; ++k) a16[r][k] = float((r * 16 + k) % 13 - 6);
        for (int k = 0; k < 32; ++k) a8[r][k] = (r * 32 + k) % 29 - 14;
    }
    for (int k = 0; k < 16; ++k) {
        for (int c = 0; c < 8; ++c) b16[k][c] = float((k * 8 + c) % 11 - 5);
    }
    for (int k = 0; k < 32; ++k) {
        for (int c = 0; c < 8; ++c) b8[k][c] = (k * 8 + c) % 23 - 11;
    }
    std::vector<float> cf(32 * 4);
    std::vector<int> ci(32 * 4);
    simt::launch(dim3(1), dim3(32), 0, [&] {
        const int lane = int(threadIdx.x), gid = lane >> 2, tig = lane & 3;
        const auto h2 = [](float lo, float hi) { return cuda::pack_half2(lo, hi); };
        const auto b4 = [](int e0, int e1, int e2, int e3) {
            return unsigned(uint8_t(e0)) | unsigned(uint8_t(e1)) << 8 | unsigned(uint8_t(e2)) << 16 | unsigned(uint8_t(e3)) << 24;
        };
        float c[4] = {};
        cuda::mma_f16(c, h2(a16[gid][2 * tig], a16[gid][2 * tig + 1]), h2(a16[gid + 8][2 * tig], a16[gid + 8][2 * tig + 1]),
                      h2(a16[gid][2 * tig + 8], a16[gid][2 * tig + 9]), h2(a16[gid + 8][2 * tig + 8], a16[gid + 8][2 * tig + 9]),
                      h2(b16[2 * tig][gid], b16[2 * tig + 1][gid]), h2(b16[2 * tig + 8][gid], b16[2 * tig + 9][gid]));
        int d[4] = {};
        const int t4 = 4 * tig;
        const uint4 a = make_uint4(b4(a8[gid][t4], a8[gid][t4 + 1], a8[gid][t4 + 2], a8[gid][t4 + 3]),
                                   b4(a8[gid + 8][t4], a8[gid + 8][t4 + 1], a8[gid + 8][t4 + 2], a8[gid + 8][t4 + 3]),
                                   b4(a8[gid][t4 + 16], a8[gid][t4 + 17], a8[gid][t4 + 18], a8[gid][t4 + 19]),
                                   b4(a8[gid + 8][t4 + 16], a8[gid + 8][t4 + 17], a8[gid + 8][t4 + 18], a8[gid + 8][t4 + 19]));
        cuda::mma_s8(d, a, b4(b8[t4][gid], b8[t4 + 1][gid], b8[t4 + 2][gid], b8[t4 + 3][gid]),
                     b4(b8[t4 + 16][gid], b8[t4 + 17][gid], b8[t4 + 18][gid], b8[t4 + 19][gid]));
        for (int i = 0; i < 4; ++i) cf[size_t(lane * 4 + i)] = c[i], ci[size_t(lane * 4 + i)] = d[i];
    });
    for (int lane = 0; lane < 32; ++lane) {
        const int gid = lane >> 2, tig = lane & 3;
        for (int i = 0; i < 4; ++i) {
            const int row = gid + 8 * (i >> 1), col = 2 * tig + (i & 1);
            float wf = 0.0f;
            int wi = 0;
            for (int k = 0; k < 16; ++k) wf += a16[row][k] * b16[k][col];
            for (int k = 0; k < 32; ++k) wi += a8[row][k] * b8[k][col];
            EXPECT_EQ(cf[size_t(lane * 4 + i)], wf) << "f16 lane " << lane << " c" << i;
            EXPECT_EQ(ci[size_t(lane * 4 + i)], wi) << "s8 lane " << lane << " c" << i;
        }
    }
}

#endif  // VXQ_HAVE_CUDA

}  // namespace
}  // namespace vxq

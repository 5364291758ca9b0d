// Attention over the fp16 cache (kernels/cpu/attention.cpp) in llama.cpp b4748's numerics: the AVX2
// row equals the scalar reference bit for bit, the softmax follows ggml_vec_soft_max_f32 over a
// row padded the way llama.cpp pads it, and the whole stays within a derived bound of a naive
// double-precision softmax attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/fp16.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_impl.h"
#include "support/isa.h"
#include "support/seed.h"
#include "kernels/cpu/ops.h"

#pragma GCC optimize("fp-contract=off")  // the expected values below round every operation

namespace vxq::cpu {
namespace {

using test::fresh_seed;

float hsum8(const float* l) { return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])); }

bool same_bits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

// ---- softmax ----

TEST(AttentionSoftmax, Avx2EqualsReferenceBitForBit) {
    VXQ_REQUIRE_AVX2(detail::cpu_has_avx2());
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    for (const float spread : {1.0f, 4.0f, 60.0f}) {  // 60: most exps flush to zero or go subnormal
        std::normal_distribution<float> nd(0.0f, spread);
        for (const int64_t n : {1, 7, 8, 9, 31, 97, 1000, 4099}) {
            std::vector<float> s(static_cast<size_t>(n));
            for (auto& v : s) v = nd(rng);
            std::vector<float> a = s, b = s;
            detail::attn_softmax_f16_avx2(a.data(), n, 0.125f);
            detail::attn_softmax_f16_ref(b.data(), n, 0.125f);
            for (int64_t t = 0; t < n; ++t) {
                ASSERT_TRUE(same_bits(a[size_t(t)], b[size_t(t)]))
                    << "n=" << n << " t=" << t << ": " << a[size_t(t)] << " vs " << b[size_t(t)] << " seed=" << seed;
            }
        }
    }
}

// llama.cpp (no flash attention) runs ggml_soft_max_ext on rows of n_kv = max(32, round_up(used
// cells, 32)) entries: w = s * scale + mask (0 visible, -inf masked), max, then
// ggml_vec_soft_max_f32: ggml_v_expf(w - max) per group of 8, each group's hsum added in double, and
// p = e * float(1 / sum), converted to fp16 for the V product. Computed here on the padded row.
TEST(AttentionSoftmax, EqualsGgmlOnTheKvPaddedRow) {
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    const float scale = 1.0f / std::sqrt(64.0f);
    for (const int64_t n : {1, 7, 8, 9, 31, 32, 33, 97, 1000}) {
        const int64_t n_kv = std::max<int64_t>(32, (n + 31) / 32 * 32);
        std::vector<float> s(static_cast<size_t>(n_kv));
        for (auto& v : s) v = nd(rng);  // padded cells hold scores too: the mask hides them
        std::vector<float> w(static_cast<size_t>(n_kv));
        for (int64_t t = 0; t < n_kv; ++t) w[size_t(t)] = s[size_t(t)] * scale + (t < n ? 0.0f : -INFINITY);
        float mx = -INFINITY;
        for (const float v : w) mx = std::max(mx, v);
        for (auto& v : w) v -= mx;
        std::vector<float> e(w.size());
        vec_expf(w.data(), e.data(), n_kv);
        double sum = 0.0;
        for (int64_t t = 0; t < n_kv; t += 8) sum += double(hsum8(e.data() + t));
        const float inv = float(1.0 / sum);

        std::vector<float> got(s.begin(), s.begin() + n);
        detail::attn_softmax_f16_ref(got.data(), n, scale);
        for (int64_t t = 0; t < n; ++t) {
            ASSERT_TRUE(same_bits(got[size_t(t)], round_fp16(e[size_t(t)] * inv))) << "n=" << n << " t=" << t;
        }
        for (int64_t t = n; t < n_kv; ++t) ASSERT_EQ(e[size_t(t)], 0.0f);  // masked: exactly nothing
    }
}

// Against softmax in double: the exp approximation (< 2 ulp), the sum and the scaling add ~1e-6
// relative; the fp16 rounding of the result adds 2^-11 relative (normal fp16) or 2^-25 absolute
// (subnormal fp16, p < 2^-14).
TEST(AttentionSoftmax, CloseToExactSoftmax) {
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 8.0f);
    for (const int64_t n : {1, 9, 97, 1000, 4099}) {
        std::vector<float> s(static_cast<size_t>(n));
        for (auto& v : s) v = nd(rng);
        std::vector<float> p = s;
        detail::attn_softmax_f16_ref(p.data(), n, 0.25f);
        double mx = -INFINITY, z = 0.0, total = 0.0;
        for (const float v : s) mx = std::max(mx, double(v * 0.25f));
        for (const float v : s) z += std::exp(double(v * 0.25f) - mx);
        for (int64_t t = 0; t < n; ++t) {
            const double want = std::exp(double(s[size_t(t)] * 0.25f) - mx) / z;
            ASSERT_LE(std::fabs(double(p[size_t(t)]) - want), want * (0x1p-11 + 1e-6) + 0x1p-25)
                << "n=" << n << " t=" << t << " seed=" << seed;
            total += p[size_t(t)];
        }
        EXPECT_NEAR(total, 1.0, double(n) * 0x1p-25 + 0x1p-10);
    }
}

// ---- the whole row ----

struct Problem {
    int64_t d, n_head_kv, gqa, n_q, pos0, cap;
    std::vector<float> q, out;
    std::vector<f16_t> k, v;
    std::vector<const f16_t*> kp, vp;
    std::vector<KvHeadView> heads;
    int64_t stride_head() const { return cap * d; }
    AttentionF16Args args() {
        kp.clear();
        vp.clear();
        heads.assign(size_t(n_head_kv), KvHeadView{});
        for (int64_t g = 0; g < n_head_kv; ++g) {
            heads[size_t(g)].n_tokens = pos0 + n_q;
            kp.push_back(k.data() + g * stride_head());
            vp.push_back(v.data() + g * stride_head());
        }
        return AttentionF16Args{q.data(), heads.data(), kp.data(), vp.data(), out.data(), n_q, pos0,
                                n_head_kv * gqa, n_head_kv, d, 1.0f / std::sqrt(float(d))};
    }
};

Problem make_problem(int64_t d, int64_t gqa, int64_t kv_len, float q_spread, std::mt19937& rng, int64_t n_q = 2) {
    Problem p;
    p.d = d, p.n_head_kv = 2, p.gqa = gqa;
    p.n_q = std::min<int64_t>(n_q, kv_len);
    p.pos0 = kv_len - p.n_q;  // the last query row sees kv_len keys
    p.cap = kv_len + 3;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    p.q.resize(size_t(p.n_q * p.n_head_kv * gqa * d));
    for (auto& x : p.q) x = q_spread * nd(rng);
    p.k.resize(size_t(p.n_head_kv * p.cap * d));
    p.v.resize(p.k.size());
    for (auto& x : p.k) x = fp32_to_fp16(nd(rng));
    for (auto& x : p.v) x = fp32_to_fp16(nd(rng));
    p.out.assign(size_t(p.n_q * p.n_head_kv * gqa * d), 0.0f);
    return p;
}

TEST(AttentionRow, Avx2EqualsReferenceBitForBit) {
    VXQ_REQUIRE_AVX2(detail::cpu_has_avx2());
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    for (const int64_t d : {8, 20, 64, 72, 128}) {  // 20, 72: the tail paths (d % 8, d % 32)
        for (const int64_t gqa : {1, 3, 4}) {
            for (const int64_t kv_len : {1, 31, 97, 1000}) {
                for (const float q_spread : {1.0f, 6.0f}) {
                    // n_q = 1: a decode step (ggml_vec_dot_f16 order), 3: a batch (tinyBLAS order)
                    Problem p = make_problem(d, gqa, kv_len, q_spread, rng, q_spread == 1.0f ? 1 : 3);
                    const AttentionF16Args a = p.args();
                    std::vector<float> scratch(size_t(p.pos0 + p.n_q));
                    std::vector<float> ref(static_cast<size_t>(d));
                    for (int64_t i = 0; i < p.n_q; ++i) {
                        for (int64_t h = 0; h < a.n_head; ++h) {
                            float* o = p.out.data() + (i * a.n_head + h) * d;
                            attention_f16_row_ref(a, i, h, scratch.data());
                            std::copy(o, o + d, ref.begin());
                            attention_f16_row(a, i, h, scratch.data());
                            for (int64_t c = 0; c < d; ++c) {
                                ASSERT_TRUE(same_bits(o[c], ref[size_t(c)]))
                                    << "d=" << d << " gqa=" << gqa << " kv=" << kv_len << " n_q=" << p.n_q << " i=" << i
                                    << " h=" << h
                                    << " c=" << c << " seed=" << seed;
                            }
                        }
                    }
                }
            }
        }
    }
}

// Against a naive softmax attention in double on the same fp16 K/V, with a per-output bound
// derived from the roundings the engine makes:
//   E = scale * (2^-11 + d 2^-23) * max_t sum_c |q_c k_tc|   bounds every score's error (q rounded
//       to fp16, float accumulation), which moves each probability by a factor within e^(+-2E);
//   each probability also carries 2^-11 + 1e-6 relative (fp16 rounding, exp approximation) or
//   2^-25 absolute (subnormal fp16), and the weighted sum adds n_kv 2^-23 relative.
TEST(AttentionRow, CloseToDoubleSoftmaxAttention) {
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    for (const int64_t d : {8, 64, 128}) {
        for (const int64_t gqa : {1, 3}) {
            for (const int64_t kv_len : {1, 31, 97, 1000}) {
                Problem p = make_problem(d, gqa, kv_len, 2.0f, rng, kv_len % 2 ? 1 : 2);
                const AttentionF16Args a = p.args();
                std::vector<float> scratch(size_t(p.pos0 + p.n_q));
                for (int64_t i = 0; i < p.n_q; ++i) {
                    for (int64_t h = 0; h < a.n_head; ++h) {
                        attention_f16_row(a, i, h, scratch.data());
                        const int64_t g = h / gqa, n = p.pos0 + i + 1;
                        const float* q = p.q.data() + (i * a.n_head + h) * d;
                        const f16_t* k = p.k.data() + g * p.stride_head();
                        const f16_t* v = p.v.data() + g * p.stride_head();
                        std::vector<double> s(static_cast<size_t>(n));
                        double mx = -INFINITY, big = 0.0;
                        for (int64_t t = 0; t < n; ++t) {
                            double dot = 0.0, mag = 0.0;
                            for (int64_t c = 0; c < d; ++c) {
                                dot += double(q[c]) * fp16_to_fp32(k[t * d + c]);
                                mag += std::fabs(double(q[c]) * fp16_to_fp32(k[t * d + c]));
                            }
                            s[size_t(t)] = dot * a.scale;
                            mx = std::max(mx, s[size_t(t)]);
                            big = std::max(big, mag);
                        }
                        double z = 0.0;
                        for (auto& x : s) z += (x = std::exp(x - mx));
                        const double E = a.scale * (0x1p-11 + double(d) * 0x1p-23) * big;
                        const double rel = std::expm1(2.0 * E) + 0x1p-11 + 1e-6;
                        for (int64_t c = 0; c < d; ++c) {
                            double want = 0.0, tol = 0.0;
                            for (int64_t t = 0; t < n; ++t) {
                                const double pt = s[size_t(t)] / z, vt = fp16_to_fp32(v[t * d + c]);
                                want += pt * vt;
                                tol += (pt * (rel + double(n) * 0x1p-23) + 0x1p-25) * std::fabs(vt);
                            }
                            const float got = p.out[size_t((i * a.n_head + h) * d + c)];
                            ASSERT_LE(std::fabs(double(got) - want), tol + 1e-7)
                                << "d=" << d << " gqa=" << gqa << " kv=" << n << " c=" << c << " seed=" << seed;
                        }
                    }
                }
            }
        }
    }
}

// The two dot-product orders of llama.cpp's f16 GGML_OP_MUL_MAT on AVX2, written out on plain arrays:
// tinyBLAS (llamafile_sgemm, taken for batches of n >= 2 columns): lane l % 8 of one accumulator,
// then (l0+l4 + l2+l6) + (l1+l5 + l3+l7).
float tinyblas_dot(const std::vector<float>& x, const std::vector<float>& y) {
    float acc[8] = {};
    for (size_t i = 0; i < x.size(); ++i) acc[i % 8] = std::fma(x[i], y[i], acc[i % 8]);
    return hsum8(acc);
}
// ggml_vec_dot_f16 (every n = 1 product): accumulators sum[j] over 32-element steps, reduced
// sum0+sum2, sum1+sum3, their sum, lo+hi halves, hadd, hadd; leftovers in double.
float vec_dot_f16(const std::vector<float>& x, const std::vector<float>& y) {
    const size_t np = x.size() & ~size_t(31);
    float sum[4][8] = {};
    for (size_t i = 0; i < np; i += 32)
        for (int j = 0; j < 4; ++j)
            for (int l = 0; l < 8; ++l) sum[j][l] = std::fma(x[i + 8 * j + l], y[i + 8 * j + l], sum[j][l]);
    float r[8];
    for (int l = 0; l < 8; ++l) r[l] = (sum[0][l] + sum[2][l]) + (sum[1][l] + sum[3][l]);
    const float t0 = r[0] + r[4], t1 = r[1] + r[5], t2 = r[2] + r[6], t3 = r[3] + r[7];
    double s = (t0 + t1) + (t2 + t3);
    for (size_t i = np; i < x.size(); ++i) s += double(x[i] * y[i]);
    return float(s);
}

// One attention row computed the way llama.cpp's graph does it, over the KV-padded cell range:
// KQ = mul_mat(K, q16) for n_kv = max(32, round_up(kv, 32)) cells, softmax with the -inf mask,
// KQV = mul_mat(V^T, p16), each product in the order that the batch size n_q selects.
TEST(AttentionRow, FollowsLlamaCppGraphOnPaddedCells) {
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    for (const int64_t d : {8, 20, 64, 72, 128}) {
        for (const int64_t n_q : {1, 2}) {
            for (const int64_t kv_len : {2, 31, 97}) {
                Problem p = make_problem(d, 1, kv_len, 2.0f, rng, n_q);
                const AttentionF16Args a = p.args();
                const int64_t i = p.n_q - 1, h = 1, n = p.pos0 + i + 1;  // the last query: n = kv_len keys
                const int64_t n_kv = std::max<int64_t>(32, (n + 31) / 32 * 32);
                // llamafile_sgemm takes a product when n >= 2, k % 8 == 0 and m % 4 == 0:
                // KQ has k = d, m = n_kv (a multiple of 32); KQV has k = n_kv, m = d.
                const bool kq_tinyblas = n_q >= 2 && d % 8 == 0, kqv_tinyblas = n_q >= 2 && d % 4 == 0;
                const auto dot = [](bool tinyblas, const std::vector<float>& x, const std::vector<float>& y) {
                    return tinyblas ? tinyblas_dot(x, y) : vec_dot_f16(x, y);
                };
                std::vector<float> q16(static_cast<size_t>(d));
                for (int64_t c = 0; c < d; ++c) q16[size_t(c)] = round_fp16(p.q[size_t((i * a.n_head + h) * d + c)]);
                const f16_t* k = p.k.data() + (h / p.gqa) * p.stride_head();
                const f16_t* v = p.v.data() + (h / p.gqa) * p.stride_head();
                std::vector<float> kq(static_cast<size_t>(n_kv), 0.0f);  // cells past kv_len hold zeros
                for (int64_t t = 0; t < n; ++t) {
                    std::vector<float> kt(static_cast<size_t>(d));
                    for (int64_t c = 0; c < d; ++c) kt[size_t(c)] = fp16_to_fp32(k[t * d + c]);
                    kq[size_t(t)] = dot(kq_tinyblas, kt, q16);
                }
                std::vector<float> prob(kq.begin(), kq.begin() + n);  // the softmax, as checked above
                detail::attn_softmax_f16_ref(prob.data(), n, a.scale);
                prob.resize(size_t(n_kv), 0.0f);  // masked cells: probability exactly 0
                std::vector<float> want(static_cast<size_t>(d));
                for (int64_t c = 0; c < d; ++c) {
                    std::vector<float> vc(static_cast<size_t>(n_kv), 0.0f);
                    for (int64_t t = 0; t < n; ++t) vc[size_t(t)] = fp16_to_fp32(v[t * d + c]);
                    want[size_t(c)] = dot(kqv_tinyblas, vc, prob);
                }
                std::vector<float> scratch(size_t(p.pos0 + p.n_q));
                for (const bool avx2 : {false, true}) {
                    if (avx2 && !detail::cpu_has_avx2()) continue;
                    (avx2 ? attention_f16_row : attention_f16_row_ref)(a, i, h, scratch.data());
                    for (int64_t c = 0; c < d; ++c) {
                        ASSERT_TRUE(same_bits(p.out[size_t((i * a.n_head + h) * d + c)], want[size_t(c)]))
                            << "avx2=" << avx2 << " d=" << d << " n_q=" << n_q << " kv=" << n << " c=" << c
                            << " seed=" << seed;
                    }
                }
            }
        }
    }
}

}  // namespace
}  // namespace vxq::cpu

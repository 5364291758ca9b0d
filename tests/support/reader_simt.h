// The reader-policy attention (kernels/cuda/reader_attention_kernels.cuh) in the SIMT emulator,
// and its reference: dequantize-then-attend in double. Include after support/simt.h and the
// codec's kernel header (which brings the attention kernel); tests only.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "support/random_weights.h"

namespace vxq::test {

// The attention kernel and its merge as launch_reader_attention launches them.
template <template <int, int> class Reader, int NC, int GM>
void run_reader_attention(const typename Reader<NC, GM>::Params& p) {
    const cuda::AttnSmem L = cuda::attn_smem_of<Reader<NC, GM>>(p.kf, p.vf, GM);
    const int64_t blocks = cuda::reader_query_blocks(p.n_q, p.n_head / p.n_head_kv);
    simt::launch(dim3(unsigned(blocks), unsigned(p.n_head_kv), unsigned(p.splits)), dim3(cuda::kAttnThreads), size_t(L.total),
                 [&] { cuda::reader_attention_kernel<Reader, NC, GM>(p); });
    simt::launch(dim3(unsigned(p.n_q * p.n_head)), dim3(cuda::kAttnThreads), 0, [&] { cuda::reader_merge_kernel<Reader>(p); });
}
template <template <int, int> class Reader>
void run_reader_attention(const typename Reader<1, 1>::Params& p) {
    const auto with_nc = [&]<int NC>() {
        if (p.head_dim != 32 * NC) return false;
        switch (cuda::reader_rows_per_block(p.n_q, p.n_head / p.n_head_kv)) {
            case 1: run_reader_attention<Reader, NC, 1>(p); break;
            case 2: run_reader_attention<Reader, NC, 2>(p); break;
            case 4: run_reader_attention<Reader, NC, 4>(p); break;
            default: run_reader_attention<Reader, NC, 8>(p); break;
        }
        return true;
    };
    const bool ran = [&]<int... NC>(std::integer_sequence<int, NC...>) {
        return (with_nc.template operator()<NC + 1>() || ...);
    }(std::make_integer_sequence<int, 8>{});
    ASSERT_TRUE(ran) << "head_dim " << p.head_dim << " is not 32 to 256 in steps of 32";
}

// out (the kernel's, [n_q, n_head, d]) equals attention over the decoded keys and values
// (kd[g], vd[g]: [n_tokens, d] of KV head g) computed in double, within `tol`: query i sees the
// first n_tokens - n_q + i + 1 tokens.
inline void expect_attention_near(const std::vector<float>& q, const std::vector<float>& out, int64_t n_q, int64_t n_head,
                                  int64_t n_head_kv, int64_t d, float scale, int64_t n_tokens,
                                  const std::vector<std::vector<float>>& kd, const std::vector<std::vector<float>>& vd,
                                  double tol) {
    const int64_t G = n_head / n_head_kv;
    for (int64_t i = 0; i < n_q; ++i) {
        const int64_t limit = n_tokens - n_q + i + 1;
        for (int64_t h = 0; h < n_head; ++h) {
            const int64_t g = h / G;
            const float* qh = &q[size_t((i * n_head + h) * d)];
            std::vector<double> s(static_cast<size_t>(limit));
            double mx = -INFINITY;
            for (int64_t t = 0; t < limit; ++t) {
                double dot = 0.0;
                for (int64_t e = 0; e < d; ++e) dot += double(qh[e]) * kd[size_t(g)][size_t(t * d + e)];
                s[size_t(t)] = dot * double(scale);
                mx = std::max(mx, s[size_t(t)]);
            }
            double sum = 0.0;
            for (double& e : s) sum += e = std::exp(e - mx);
            for (int64_t e = 0; e < d; ++e) {
                double o = 0.0;
                for (int64_t t = 0; t < limit; ++t) o += s[size_t(t)] * vd[size_t(g)][size_t(t * d + e)];
                ASSERT_NEAR(out[size_t((i * n_head + h) * d + e)], o / sum, tol) << "query " << i << ", head " << h << ", channel " << e;
            }
        }
    }
}

// p.n_q random queries over `heads` (p's formats, shape and splits set by the caller) through
// the emulated attention and merge, against dequantize-then-attend over kd / vd (decoded keys and
// values per KV head, n_tokens each) within 2e-5 on outputs of size ~1: f32 sums in other orders.
template <template <int, int> class Reader>
void expect_reader_attention(typename Reader<1, 1>::Params p, const std::vector<typename Reader<1, 1>::Head>& heads,
                             int64_t n_tokens, const std::vector<std::vector<float>>& kd,
                             const std::vector<std::vector<float>>& vd, std::mt19937& rng) {
    const int64_t d = p.head_dim;
    const std::vector<float> q = random_floats(size_t(p.n_q * p.n_head * d), rng);
    std::vector<float> partial(cuda::reader_attention_scratch_floats(p.n_q, p.n_head, d, p.splits)), out(q.size(), NAN);
    p.q = q.data();
    p.heads = heads.data();
    p.partial = partial.data();
    p.out = out.data();
    p.scale = 1.0f / std::sqrt(float(d));
    run_reader_attention<Reader>(p);
    expect_attention_near(q, out, p.n_q, p.n_head, p.n_head_kv, d, p.scale, n_tokens, kd, vd, 2e-5);
}

}  // namespace vxq::test

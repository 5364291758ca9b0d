// The test backends of tests/support/forwarding_backend.h: what the device tests' noise bound
// rests on must itself be checked.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "support/forwarding_backend.h"
#include "support/seed.h"

namespace vxq {
namespace {

// LastBitNoiseBackend's matmul outputs are the CPU backend's moved by at most one unit in the last
// place, about half of them by exactly one (u uniform in [-1, 1): |u| 2^-24 y rounds to a whole
// ulp when |u| > 1/2, roughly), and its other ops are the CPU backend's.
TEST(ForwardingBackend, LastBitNoiseMovesMatmulOutputsByAtMostOneUlp) {
    std::mt19937 rng(test::fresh_seed());
    std::normal_distribution<float> g;
    const int64_t rows = 96, cols = 64, n = 5;
    std::vector<float> w(size_t(rows * cols)), x(size_t(n * cols));
    for (float& v : w) v = g(rng);
    for (float& v : x) v = g(rng);
    const WeightView wv{GgmlType::F32, w.data(), rows, cols, size_t(cols) * sizeof(float)};
    auto cpu = make_backend("cpu", 2);
    test::LastBitNoiseBackend noisy(2, 1);
    std::vector<float> ref(size_t(n * rows)), got(ref.size());
    cpu->matmul(wv, x.data(), n, ref.data());
    noisy.matmul(wv, x.data(), n, got.data());
    int moved = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        const float ulp = std::nextafter(std::fabs(ref[i]), INFINITY) - std::fabs(ref[i]);
        EXPECT_LE(std::fabs(got[i] - ref[i]), ulp) << "output " << i;
        moved += got[i] != ref[i];
    }
    EXPECT_GT(moved, int(ref.size()) / 5);
    EXPECT_LT(moved, int(ref.size()) * 4 / 5);
    std::vector<float> a(x), b(x);
    cpu->rms_norm(x.data(), w.data(), n, cols, 1e-5f, a.data());
    noisy.rms_norm(x.data(), w.data(), n, cols, 1e-5f, b.data());
    EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace vxq

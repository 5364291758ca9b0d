#include "core/eigen.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace vxq {

SymmetricEigen symmetric_eigen(std::vector<double> a, int64_t d) {
    const auto at = [&](std::vector<double>& m, int64_t i, int64_t j) -> double& { return m[size_t(i * d + j)]; };
    std::vector<double> v(size_t(d * d), 0.0);  // columns: the eigenvectors
    for (int64_t i = 0; i < d; ++i) at(v, i, i) = 1.0;
    double start = 0.0;
    for (int64_t i = 0; i < d; ++i) {
        for (int64_t j = i + 1; j < d; ++j) start += at(a, i, j) * at(a, i, j);
    }
    for (int sweep = 0; sweep < 100; ++sweep) {
        double off = 0.0;
        for (int64_t i = 0; i < d; ++i) {
            for (int64_t j = i + 1; j < d; ++j) off += at(a, i, j) * at(a, i, j);
        }
        if (off <= 1e-24 * start || off == 0.0) break;
        for (int64_t p = 0; p < d; ++p) {
            for (int64_t q = p + 1; q < d; ++q) {
                const double apq = at(a, p, q);
                if (apq == 0.0) continue;
                const double theta = (at(a, q, q) - at(a, p, p)) / (2 * apq);
                const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
                const double c = 1 / std::sqrt(t * t + 1), s = t * c;
                for (int64_t k = 0; k < d; ++k) {  // A <- A J (columns p, q)
                    const double kp = at(a, k, p), kq = at(a, k, q);
                    at(a, k, p) = c * kp - s * kq;
                    at(a, k, q) = s * kp + c * kq;
                }
                for (int64_t k = 0; k < d; ++k) {  // A <- J^T A (rows p, q)
                    const double pk = at(a, p, k), qk = at(a, q, k);
                    at(a, p, k) = c * pk - s * qk;
                    at(a, q, k) = s * pk + c * qk;
                }
                for (int64_t k = 0; k < d; ++k) {  // V <- V J
                    const double kp = at(v, k, p), kq = at(v, k, q);
                    at(v, k, p) = c * kp - s * kq;
                    at(v, k, q) = s * kp + c * kq;
                }
            }
        }
    }
    std::vector<int64_t> order(static_cast<size_t>(d));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return at(a, x, x) > at(a, y, y); });
    SymmetricEigen e;
    e.values.resize(size_t(d));
    e.vectors.resize(size_t(d * d));
    for (int64_t i = 0; i < d; ++i) {
        const int64_t src = order[size_t(i)];
        e.values[size_t(i)] = at(a, src, src);
        for (int64_t k = 0; k < d; ++k) e.vectors[size_t(i * d + k)] = at(v, k, src);
    }
    return e;
}

}  // namespace vxq

// Eigen-decomposition of a small symmetric matrix (cyclic Jacobi, in double): the K/V spectra
// (bench/analysis/kv_spectrum.cpp) and TurboQuant's calibrated eigenbasis (runtime/calibrate.cpp).
#pragma once

#include <cstdint>
#include <vector>

namespace vxq {

struct SymmetricEigen {
    std::vector<double> values;   // [d], descending
    std::vector<double> vectors;  // [d, d] row-major, row i the unit eigenvector of values[i]
};

// a: [d, d] symmetric, row-major. Sweeps until the off-diagonal mass is below 1e-24 of its start
// (or 100 sweeps).
SymmetricEigen symmetric_eigen(std::vector<double> a, int64_t d);

}  // namespace vxq

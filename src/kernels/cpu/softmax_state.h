// The running state of an online softmax (max, sum of exponentials, weighted accumulator), and a
// NaN-safe merge of two partial states. Plain inline code so a CUDA kernel can share it.
#pragma once

#include <cmath>
#include <cstdint>

namespace vxq {

struct SoftmaxState {
    float m = -INFINITY;  // largest score seen
    float l = 0.0f;       // sum of exp(score - m)

    // Rescale factor for values accumulated under `old_m` when the max becomes `new_m`. Empty
    // states (m = -inf) scale by 0, never by exp(-inf - -inf) = NaN.
    static float rescale(float old_m, float new_m) { return old_m == -INFINITY ? 0.0f : std::exp(old_m - new_m); }
};

// Merges partial state (b, acc_b) into (a, acc_a).   acc_*: [d]
inline void merge_softmax(SoftmaxState& a, float* acc_a, const SoftmaxState& b, const float* acc_b, int64_t d) {
    if (b.m == -INFINITY) return;
    const float m = a.m > b.m ? a.m : b.m;
    const float sa = SoftmaxState::rescale(a.m, m);
    const float sb = SoftmaxState::rescale(b.m, m);
    for (int64_t c = 0; c < d; ++c) acc_a[c] = acc_a[c] * sa + acc_b[c] * sb;
    a.l = a.l * sa + b.l * sb;
    a.m = m;
}

}  // namespace vxq

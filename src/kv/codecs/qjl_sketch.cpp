// The QJL sketch primitives of kv/formats/qjl_sketch.h (used by the qjl and turbo-prod codecs and
// their readers).
#include "kv/formats/qjl_sketch.h"

#include "core/splitmix.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <numbers>
#include <random>

namespace vxq::codecs::qjl {

namespace {
std::atomic<uint64_t> g_projection_calls{0};
}  // namespace

uint64_t mix_seed(uint64_t seed, int64_t layer, KvRole role, uint64_t purpose) {
    return splitmix64_mix(seed * 0x9E3779B97F4A7C15ull + uint64_t(layer) * 4 + (role == KvRole::Key ? 0 : 2) + purpose);
}

Sketch::Sketch(int64_t m, int64_t d, uint64_t seed)
    : m_(m), d_(d), scale_(float(std::sqrt(std::numbers::pi / 2) / double(m))), s_(size_t(m * d)) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd;
    for (auto& v : s_) v = nd(rng);
}

void Sketch::signs(const float* x, uint8_t* bits) const {
    std::memset(bits, 0, size_t((m_ + 7) / 8));
    for (int64_t i = 0; i < m_; ++i) {
        const float* r = row(i);
        float dot = 0;
        for (int64_t c = 0; c < d_; ++c) dot += r[c] * x[c];
        if (dot >= 0) bits[i >> 3] = uint8_t(bits[i >> 3] | (1u << (i & 7)));
    }
}

void Sketch::project(const float* q, float* u) const {
    g_projection_calls.fetch_add(1, std::memory_order_relaxed);
    for (int64_t i = 0; i < m_; ++i) {
        const float* r = row(i);
        float dot = 0;
        for (int64_t c = 0; c < d_; ++c) dot += r[c] * q[c];
        u[i] = dot;
    }
}

void Sketch::add_transposed(const uint8_t* bits, float w, float* x) const {
    for (int64_t i = 0; i < m_; ++i) {
        const float z = sign_bit(bits, i) ? w : -w;
        const float* r = row(i);
        for (int64_t c = 0; c < d_; ++c) x[c] += z * r[c];
    }
}

uint64_t projection_calls() { return g_projection_calls.load(std::memory_order_relaxed); }

}  // namespace vxq::codecs::qjl

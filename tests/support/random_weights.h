// Random weight matrices of every computed type, for kernel tests (CPU and CUDA alike).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/types.h"
#include "core/fp16.h"
#include "formats/ggml_types.h"

namespace vxq::test {

struct Weights {
    GgmlType type;
    int64_t rows = 0, cols = 0;
    std::vector<uint8_t> bytes;
    WeightView view() const {
        return WeightView{type, bytes.data(), rows, cols, ggml_row_bytes(type, cols)};
    }
};

// n values drawn from N(0, sd^2): activations and f32 weights of kernel tests.
inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float sd = 1.0f) {
    std::normal_distribution<float> nd(0.0f, sd);
    std::vector<float> v(n);
    for (float& x : v) x = nd(rng);
    return v;
}

// Random weights of a type; values of the size a trained model has (|w| ~ 0.05).
inline Weights random_weights(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
    Weights w{type, rows, cols, {}};
    const size_t rb = ggml_row_bytes(type, cols);
    w.bytes.resize(rb * size_t(rows));
    std::normal_distribution<float> nd(0.0f, 0.05f);
    std::uniform_real_distribution<float> ud(0.0005f, 0.01f);
    for (int64_t r = 0; r < rows; ++r) {
        uint8_t* row = w.bytes.data() + size_t(r) * rb;
        switch (type) {
            case GgmlType::F32:
                for (int64_t c = 0; c < cols; ++c) {
                    const float v = nd(rng);
                    std::memcpy(row + 4 * c, &v, 4);
                }
                break;
            case GgmlType::F16:
                for (int64_t c = 0; c < cols; ++c) {
                    const f16_t h = fp32_to_fp16(nd(rng));
                    std::memcpy(row + 2 * c, &h, 2);
                }
                break;
            case GgmlType::BF16:
                for (int64_t c = 0; c < cols; ++c) {
                    const bf16_t h = fp32_to_bf16(nd(rng));
                    std::memcpy(row + 2 * c, &h, 2);
                }
                break;
            case GgmlType::Q8_0: {
                auto* b = reinterpret_cast<BlockQ8_0*>(row);
                std::uniform_int_distribution<int> q(-127, 127);
                for (int64_t i = 0; i < cols / 32; ++i) {
                    b[i].d = fp32_to_fp16(ud(rng));
                    for (int j = 0; j < 32; ++j) b[i].qs[j] = int8_t(q(rng));
                }
                break;
            }
            case GgmlType::Q4_0: {
                auto* b = reinterpret_cast<BlockQ4_0*>(row);
                std::uniform_int_distribution<int> q(0, 255);
                for (int64_t i = 0; i < cols / 32; ++i) {
                    b[i].d = fp32_to_fp16(ud(rng) * 4.0f);
                    for (int j = 0; j < 16; ++j) b[i].qs[j] = uint8_t(q(rng));
                }
                break;
            }
            case GgmlType::Q6_K: {
                auto* b = reinterpret_cast<BlockQ6_K*>(row);
                std::uniform_int_distribution<int> byte(0, 255), sc(-128, 127);
                for (int64_t i = 0; i < cols / kQK_K; ++i) {
                    for (auto& v : b[i].ql) v = uint8_t(byte(rng));
                    for (auto& v : b[i].qh) v = uint8_t(byte(rng));
                    for (auto& v : b[i].scales) v = int8_t(sc(rng));
                    b[i].d = fp32_to_fp16(ud(rng) * 0.02f);
                }
                break;
            }
            case GgmlType::TQ1_0: {  // bytes that encode 5 (qs) or 4 (qh) digits, as tq1_0 writes them
                auto* b = reinterpret_cast<BlockTQ1_0*>(row);
                std::uniform_int_distribution<int> trits5(0, 242), trits4(0, 80);
                const auto pack = [](int v, int n) {  // ceil(v * 256 / 3^n): the top digit first
                    const int p = n == 5 ? 243 : 81;
                    return uint8_t((v * 256 + p - 1) / p);
                };
                for (int64_t i = 0; i < cols / kQK_K; ++i) {
                    for (auto& v : b[i].qs) v = pack(trits5(rng), 5);
                    for (auto& v : b[i].qh) v = pack(trits4(rng), 4);
                    b[i].d = fp32_to_fp16(ud(rng) * 4.0f);
                }
                break;
            }
            case GgmlType::TQ2_0:
            case GgmlType::TQ2_G128: {  // 2-bit digits (0, 1, 2) four to a byte, then the fp16 scale
                const bool g128 = type == GgmlType::TQ2_G128;
                const size_t block = g128 ? sizeof(BlockTQ2_G128) : sizeof(BlockTQ2_0), n_qs = block - sizeof(f16_t);
                std::uniform_int_distribution<int> t(0, 2);
                for (int64_t i = 0; i < cols / (g128 ? kQK_G128 : kQK_K); ++i) {
                    uint8_t* b = row + size_t(i) * block;
                    for (size_t j = 0; j < n_qs; ++j) b[j] = uint8_t(t(rng) | t(rng) << 2 | t(rng) << 4 | t(rng) << 6);
                    const f16_t d = fp32_to_fp16(ud(rng) * 4.0f);
                    std::memcpy(b + n_qs, &d, sizeof d);
                }
                break;
            }
            default:
                break;  // other types: no kernel to test, bytes stay zero
        }
    }
    return w;
}

}  // namespace vxq::test

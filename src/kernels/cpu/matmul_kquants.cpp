#include "kernels/cpu/matmul_kquants.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"

namespace vxq::cpu {

namespace {

// ggml's nearest_int: round half to even through the float magic number (|v| <= 4194303).
int nearest_int(float v) {
    const float m = v + 12582912.f;
    int32_t i;
    std::memcpy(&i, &m, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

constexpr uint8_t kPow3[6] = {1, 3, 9, 27, 81, 243};

// Base-3 digit n of a tq1_0 byte: ((q * 3^n mod 256) * 3) >> 8.
int tq1_digit(uint8_t q, int n) {
    const uint8_t s = uint8_t(q * kPow3[n]);
    return (int(s) * 3) >> 8;
}

// The stored digits t (0, 1, 2) of a block's 256 values, in value order.
void tq1_digits(const BlockTQ1_0& b, int8_t* t) {
    for (int n = 0; n < 5; ++n) {
        for (int m = 0; m < 32; ++m) t[32 * n + m] = int8_t(tq1_digit(b.qs[m], n));
    }
    for (int n = 0; n < 5; ++n) {
        for (int m = 0; m < 16; ++m) t[160 + 16 * n + m] = int8_t(tq1_digit(b.qs[32 + m], n));
    }
    for (int n = 0; n < 4; ++n) {
        for (int j = 0; j < 4; ++j) t[240 + 4 * n + j] = int8_t(tq1_digit(b.qh[j], n));
    }
}

// The 2-bit digits of 32 bytes, 128 values: byte m holds value 32 l + m in bits 2 l (a TQ2_0 half,
// a TQ2_G128 block).
void two_bit_digits(const uint8_t* qs, int8_t* t) {
    for (int l = 0; l < 4; ++l) {
        for (int m = 0; m < 32; ++m) t[32 * l + m] = int8_t((qs[m] >> (2 * l)) & 3);
    }
}

void tq2_digits(const BlockTQ2_0& b, int8_t* t) {
    for (int h = 0; h < 2; ++h) two_bit_digits(b.qs + 32 * h, t + 128 * h);
}

// A q6_K block's values q - 32 (-32 .. 31), in value order; the scale of value e is scales[e / 16].
void q6_values(const BlockQ6_K& b, int8_t* q) {
    for (int half = 0; half < 2; ++half) {
        const uint8_t* ql = b.ql + 64 * half;
        const uint8_t* qh = b.qh + 32 * half;
        int8_t* out = q + 128 * half;
        for (int l = 0; l < 32; ++l) {
            out[l] = int8_t(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
            out[l + 32] = int8_t(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
            out[l + 64] = int8_t(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            out[l + 96] = int8_t(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
}

// hsum_float_8's order.
float hsum8(const float* a) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

}  // namespace

bool is_kquant_weight(GgmlType t) {
    return t == GgmlType::Q6_K || t == GgmlType::TQ1_0 || t == GgmlType::TQ2_0 || t == GgmlType::TQ2_G128;
}

void quantize_row_q8_K(const float* x, BlockQ8_K* y, int64_t n) {
    VXQ_ASSERT(n % kQK_K == 0);
    for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
        float max = 0.0f, amax = 0.0f;
        for (int j = 0; j < kQK_K; ++j) {
            const float ax = std::fabs(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        BlockQ8_K& b = y[i];
        if (amax == 0.0f) {
            b.d = 0.0f;
            std::memset(b.qs, 0, sizeof b.qs);
            std::memset(b.bsums, 0, sizeof b.bsums);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < kQK_K; ++j) b.qs[j] = int8_t(std::min(127, nearest_int(iscale * x[j])));
        for (int g = 0; g < kQK_K / 16; ++g) {
            int sum = 0;
            for (int j = 0; j < 16; ++j) sum += b.qs[16 * g + j];
            b.bsums[g] = int16_t(sum);
        }
        b.d = 1 / iscale;
    }
}

// Block i of a row of type t: its values v (Q6_K: q - 32, scales in sc; TQ: the digits t) and d.
static float decode_block(GgmlType t, const uint8_t* row, int64_t i, int8_t* v, int8_t* sc) {
    if (t == GgmlType::Q6_K) {
        BlockQ6_K b;
        std::memcpy(&b, row + i * sizeof b, sizeof b);
        q6_values(b, v);
        std::memcpy(sc, b.scales, sizeof b.scales);
        return fp16_to_fp32(b.d);
    }
    if (t == GgmlType::TQ1_0) {
        BlockTQ1_0 b;
        std::memcpy(&b, row + i * sizeof b, sizeof b);
        tq1_digits(b, v);
        return fp16_to_fp32(b.d);
    }
    BlockTQ2_0 b;
    std::memcpy(&b, row + i * sizeof b, sizeof b);
    tq2_digits(b, v);
    return fp16_to_fp32(b.d);
}

void dequantize_row_kquant(GgmlType t, const uint8_t* row, int64_t n, float* out) {
    VXQ_ASSERT(n % kQK_K == 0 && is_kquant_weight(t));
    if (t == GgmlType::TQ2_G128) {
        int8_t u[kQK_G128];
        for (int64_t i = 0; i < n / kQK_G128; ++i, out += kQK_G128) {
            BlockTQ2_G128 b;
            std::memcpy(&b, row + i * sizeof b, sizeof b);
            two_bit_digits(b.qs, u);
            const float d = fp16_to_fp32(b.d);
            for (int e = 0; e < kQK_G128; ++e) out[e] = float(u[e] - 1) * d;
        }
        return;
    }
    int8_t v[kQK_K], sc[kQK_K / 16];
    for (int64_t i = 0; i < n / kQK_K; ++i, out += kQK_K) {
        const float d = decode_block(t, row, i, v, sc);
        for (int e = 0; e < kQK_K; ++e) {
            out[e] = t == GgmlType::Q6_K ? d * float(sc[e / 16]) * float(v[e]) : float(v[e] - 1) * d;
        }
    }
}

void q6_K_row_unpacked(const uint8_t* row, int64_t n, int8_t* q, int8_t* scales, uint16_t* d) {
    VXQ_ASSERT(n % kQK_K == 0);
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        BlockQ6_K b;
        std::memcpy(&b, row + i * sizeof b, sizeof b);
        q6_values(b, q + i * kQK_K);
        std::memcpy(scales + i * (kQK_K / 16), b.scales, sizeof b.scales);
        d[i] = b.d;
    }
}

void tq1_0_row_as_tq2_0(const uint8_t* row, int64_t n, uint8_t* out) {
    const auto* in = reinterpret_cast<const BlockTQ1_0*>(row);
    auto* o = reinterpret_cast<BlockTQ2_0*>(out);
    int8_t t[kQK_K];
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        tq1_digits(in[b], t);
        std::memset(o[b].qs, 0, sizeof o[b].qs);
        for (int v = 0; v < kQK_K; ++v) {  // value 128 h + 32 l + m: bits 2 l of qs[32 h + m]
            const int h = v / 128, l = (v % 128) / 32, m = v % 32;
            o[b].qs[32 * h + m] = uint8_t(o[b].qs[32 * h + m] | (t[v] << (2 * l)));
        }
        o[b].d = in[b].d;
    }
}

float dot_kquant_q8_K(GgmlType t, const uint8_t* row, const BlockQ8_K* x, int64_t nb) {
    VXQ_ASSERT(is_kquant_weight(t));
    float acc[8] = {};
    int8_t v[kQK_K], sc[kQK_K / 16];
    for (int64_t i = 0; i < nb; ++i) {
        const BlockQ8_K& xb = x[i];
        if (t == GgmlType::TQ2_G128) {  // two blocks per super-block, each its own scale and fma
            for (int h = 0; h < 2; ++h) {
                BlockTQ2_G128 b;
                std::memcpy(&b, row + (2 * i + h) * sizeof b, sizeof b);
                two_bit_digits(b.qs, v);
                int32_t lane[8] = {};
                for (int e = 0; e < kQK_G128; ++e) lane[(e % 32) / 4] += int32_t(v[e]) * xb.qs[kQK_G128 * h + e];
                for (int k = 0; k < 4; ++k) lane[k] -= int32_t(xb.bsums[8 * h + 2 * k]) + xb.bsums[8 * h + 2 * k + 1];
                const float d = xb.d * fp16_to_fp32(b.d);
                for (int k = 0; k < 8; ++k) acc[k] = std::fma(float(lane[k]), d, acc[k]);
            }
            continue;
        }
        const float dw = decode_block(t, row, i, v, sc);
        int32_t lane[8] = {};
        if (t == GgmlType::Q6_K) {
            for (int e = 0; e < kQK_K; ++e) lane[(e % 32) / 4] += int32_t(sc[e / 16]) * v[e] * xb.qs[e];
        } else {
            for (int e = 0; e < kQK_K; ++e) lane[(e % 32) / 4] += int32_t(v[e]) * xb.qs[e];
            for (int k = 0; k < 8; ++k) lane[k] -= int32_t(xb.bsums[2 * k]) + xb.bsums[2 * k + 1];
        }
        const float d = xb.d * dw;
        for (int k = 0; k < 8; ++k) acc[k] = std::fma(float(lane[k]), d, acc[k]);
    }
    return hsum8(acc);
}

}  // namespace vxq::cpu

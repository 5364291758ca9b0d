#include "formats/ggml_quants.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace vxq {

namespace {

// (int8_t)(v) as GCC's x86 code computes it: cvttss2si (truncation; INT32_MIN for NaN and out of
// range), then the low byte. Keeps degenerate blocks (1/d = inf) well defined, as on x86.
int8_t int8_trunc_x86(float v) {
    const int32_t i = std::fabs(v) < 2147483648.0f ? int32_t(v) : std::numeric_limits<int32_t>::min();
    return int8_t(uint8_t(uint32_t(i) & 0xffu));
}

}  // namespace

void quantize_row_q8_0_ref(const float* x, BlockQ8_0* y, int64_t n) {
    VXQ_ASSERT(n % kQK8_0 == 0);
    for (int64_t b = 0; b < n / kQK8_0; ++b) {
        const float* xb = x + b * kQK8_0;
        float amax = 0.0f;
        for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(xb[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = fp32_to_fp16(d);
        for (int j = 0; j < kQK8_0; ++j) y[b].qs[j] = int8_trunc_x86(std::round(xb[j] * id));
    }
}

void quantize_row_q4_0_ref(const float* x, BlockQ4_0* y, int64_t n) {
    VXQ_ASSERT(n % kQK4_0 == 0);
    for (int64_t b = 0; b < n / kQK4_0; ++b) {
        const float* xb = x + b * kQK4_0;
        float amax = 0.0f, m = 0.0f;
        for (int j = 0; j < kQK4_0; ++j) {
            if (amax < std::fabs(xb[j])) {
                amax = std::fabs(xb[j]);
                m = xb[j];
            }
        }
        const float d = m / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = fp32_to_fp16(d);
        for (int j = 0; j < kQK4_0 / 2; ++j) {
            const int lo = std::min<int>(15, int8_trunc_x86(xb[j] * id + 8.5f));
            const int hi = std::min<int>(15, int8_trunc_x86(xb[j + kQK4_0 / 2] * id + 8.5f));
            y[b].qs[j] = uint8_t((lo & 0x0f) | ((hi & 0x0f) << 4));
        }
    }
}

double ternary_absmean(const float* x, int64_t n) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += std::fabs(double(x[i]));
    return n > 0 ? sum / double(n) : 0.0;
}

namespace {

// One block's digits u = t + 1 (0, 1, 2) in value order, and its scale, by `rule`; n values.
float ternary_block(TernaryRule rule, double gamma, const float* x, int n, uint8_t* u) {
    if (rule == TernaryRule::Amax) {
        float amax = 0.0f;
        for (int j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float id = amax != 0.0f ? 1.0f / amax : 0.0f;
        for (int j = 0; j < n; ++j) u[j] = uint8_t(std::lround(x[j] * id) + 1);
        return amax;
    }
    double sum = 0.0;  // |x| of the non-zero digits: exact for a ternary block (<= 256 equal values)
    int nonzero = 0;
    for (int j = 0; j < n; ++j) {
        const long t = gamma > 0.0 ? std::clamp(std::lround(double(x[j]) / gamma), -1L, 1L) : 0L;
        u[j] = uint8_t(t + 1);
        if (t != 0) {
            sum += std::fabs(double(x[j]));
            ++nonzero;
        }
    }
    return nonzero > 0 ? float(sum / nonzero) : 0.0f;
}

// 128 digits into 32 bytes: byte m holds, in bits 2 l, the digit of value 32 l + m (a TQ2_G128
// block; TQ2_0 is two of them, byte 32 h + m holding value 128 h + 32 l + m).
void pack_two_bit(const uint8_t* u, uint8_t* qs) {
    for (int m = 0; m < 32; ++m) {
        qs[m] = uint8_t(u[m] | u[32 + m] << 2 | u[64 + m] << 4 | u[96 + m] << 6);
    }
}

// TQ1_0: a byte holds k base-3 digits (k = 5; 4 in qh) as the fraction sum u_n 3^-(n+1), rounded
// up to 1/256: byte = ceil(256 * v / 243) with v = sum u_n 3^(4 - n), so that digit n reads back
// as ((byte * 3^n mod 256) * 3) >> 8. qs[m] (m < 32): values 32 n + m; qs[32 + m] (m < 16): 160 +
// 16 n + m; qh[j]: 240 + 4 n + j.
uint8_t tq1_byte(const uint8_t* digits, int k, int stride) {
    int v = 0;
    for (int n = 0; n < 5; ++n) v = 3 * v + (n < k ? digits[n * stride] : 0);
    return uint8_t((v * 256 + 242) / 243);
}
void pack_tq1_0(const uint8_t* u, float d, BlockTQ1_0& b) {
    for (int m = 0; m < 32; ++m) b.qs[m] = tq1_byte(u + m, 5, 32);
    for (int m = 0; m < 16; ++m) b.qs[32 + m] = tq1_byte(u + 160 + m, 5, 16);
    for (int j = 0; j < 4; ++j) b.qh[j] = tq1_byte(u + 240 + j, 4, 4);
    b.d = fp32_to_fp16(d);
}

}  // namespace

void quantize_row_ternary(GgmlType t, TernaryRule rule, double gamma, const float* x, int64_t n, uint8_t* out) {
    VXQ_ASSERT(n % kQK_K == 0 && (t == GgmlType::TQ1_0 || t == GgmlType::TQ2_0 || t == GgmlType::TQ2_G128));
    uint8_t u[kQK_K];
    if (t == GgmlType::TQ2_G128) {  // TQ2_0's packing of one half per 128-value block
        for (int64_t i = 0; i < n / kQK_G128; ++i) {
            BlockTQ2_G128 b;
            b.d = fp32_to_fp16(ternary_block(rule, gamma, x + i * kQK_G128, kQK_G128, u));
            pack_two_bit(u, b.qs);
            std::memcpy(out + i * sizeof b, &b, sizeof b);
        }
        return;
    }
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        const float d = ternary_block(rule, gamma, x + i * kQK_K, kQK_K, u);
        if (t == GgmlType::TQ2_0) {
            BlockTQ2_0 b;
            pack_two_bit(u, b.qs);
            pack_two_bit(u + 128, b.qs + 32);
            b.d = fp32_to_fp16(d);
            std::memcpy(out + i * sizeof b, &b, sizeof b);
        } else {
            BlockTQ1_0 b;
            pack_tq1_0(u, d, b);
            std::memcpy(out + i * sizeof b, &b, sizeof b);
        }
    }
}

bool can_quantize_ref(GgmlType t) {
    switch (t) {
        case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q8_0: case GgmlType::Q4_0:
            return true;
        default:
            return false;
    }
}

void quantize_row_ref(GgmlType t, const float* x, int64_t n, uint8_t* out) {
    switch (t) {
        case GgmlType::F32:
            std::memcpy(out, x, size_t(n) * sizeof(float));
            return;
        case GgmlType::F16:
        case GgmlType::BF16:
            for (int64_t i = 0; i < n; ++i) {
                const uint16_t h = t == GgmlType::F16 ? fp32_to_fp16(x[i]) : fp32_to_bf16(x[i]);
                std::memcpy(out + 2 * i, &h, 2);
            }
            return;
        case GgmlType::Q8_0:
            quantize_row_q8_0_ref(x, reinterpret_cast<BlockQ8_0*>(out), n);
            return;
        case GgmlType::Q4_0:
            quantize_row_q4_0_ref(x, reinterpret_cast<BlockQ4_0*>(out), n);
            return;
        default:
            VXQ_ASSERT(can_quantize_ref(t));
    }
}

}  // namespace vxq

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

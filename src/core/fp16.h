// IEEE binary16 and bfloat16 conversions, bit-exact with the hardware (F16C) and with ggml:
// fp32 -> fp16 rounds to nearest even, NaN stays NaN, overflow goes to infinity.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace vxq {

using f16_t = uint16_t;
using bf16_t = uint16_t;

inline float fp16_to_fp32(f16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {  // subnormal: value = man * 2^-24, exactly representable in fp32
        const float v = float(man) * 0x1p-24f;
        return sign ? -v : v;
    }
    return std::bit_cast<float>(bits);
}

inline f16_t fp32_to_fp16(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {  // inf or NaN (NaN keeps a quiet payload bit)
        return f16_t(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0u));
    }
    if (ax >= 0x477ff000u) return f16_t(sign | 0x7c00u);  // rounds to >= 65520: infinity
    if (ax < 0x38800000u) {                               // below the smallest normal fp16
        if (ax < 0x33000000u) return f16_t(sign);         // < 2^-25: rounds to zero
        const uint32_t e = ax >> 23;
        const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126u - e;  // 14..24 bits
        uint32_t q = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u);
        const uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) ++q;
        return f16_t(sign | q);
    }
    uint32_t r = ax - 0x38000000u;  // rebias exponent 127 -> 15
    const uint32_t rem = r & 0x1fffu;
    r >>= 13;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
    return f16_t(sign | r);
}

inline float bf16_to_fp32(bf16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

inline bf16_t fp32_to_bf16(float f) {  // round to nearest even, as ggml's GGML_FP32_TO_BF16
    const uint32_t u = std::bit_cast<uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t((u >> 16) | 64u);  // quiet NaN
    return bf16_t((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

// Round-trip through fp16: what a value becomes when stored in an f16 cache or f16 activation.
inline float round_fp16(float f) { return fp16_to_fp32(fp32_to_fp16(f)); }

// An fp16 value at a byte address (packed KV blocks: any alignment).
inline float load_fp16(const uint8_t* p) {
    f16_t h;
    std::memcpy(&h, p, sizeof h);
    return fp16_to_fp32(h);
}
inline void store_fp16(uint8_t* p, float f) {
    const f16_t h = fp32_to_fp16(f);
    std::memcpy(p, &h, sizeof h);
}

}  // namespace vxq

// The CPU codecs (kv/formats/baseline.h) of the device's token-wise KV formats (cuda::KvCode), for
// the tests that compare the device kernels' bytes or results with them (the emulator tests).
// Include after the header that defines cuda::KvCode (kernels/cuda/kv_codes.cuh).
#pragma once

#include <cstdint>

#include "kv/formats/baseline.h"

namespace vxq::test {

inline const char* kv_code_name(cuda::KvCode c) {
    return c == cuda::KvCode::F16 ? "f16" : c == cuda::KvCode::Q8_0 ? "q8_0" : c == cuda::KvCode::Q4_0 ? "q4_0" : "fp8";
}
// A row of hd values into format c's bytes, as the CPU cache stores it.
inline void kv_encode_cpu(cuda::KvCode c, const float* x, int64_t hd, uint8_t* out, float scale) {
    switch (c) {
        case cuda::KvCode::F16: kvfmt::F16::encode(x, hd, out, scale); break;
        case cuda::KvCode::Q8_0: kvfmt::Q8_0::encode(x, hd, out, scale); break;
        case cuda::KvCode::Q4_0: kvfmt::Q4_0::encode(x, hd, out, scale); break;
        case cuda::KvCode::FP8: kvfmt::FP8::encode(x, hd, out, scale); break;
    }
}
// ... and back (hd a multiple of 32; the block formats decode a 32-block a call).
inline void kv_decode_cpu(cuda::KvCode c, const uint8_t* tok, int64_t hd, float* x, float scale) {
    for (int64_t c0 = 0; c0 < hd; c0 += 32) {
        switch (c) {
            case cuda::KvCode::F16: kvfmt::F16::decode_range(tok, c0, 32, x + c0, scale); break;
            case cuda::KvCode::Q8_0: kvfmt::Q8_0::decode_range(tok, c0, 32, x + c0, scale); break;
            case cuda::KvCode::Q4_0: kvfmt::Q4_0::decode_range(tok, c0, 32, x + c0, scale); break;
            case cuda::KvCode::FP8: kvfmt::FP8::decode_range(tok, c0, 32, x + c0, scale); break;
        }
    }
}

}  // namespace vxq::test

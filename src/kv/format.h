// What a kernel needs to read one KV stream's packed blocks, as plain data: no virtual calls, no
// host-only types, so the same struct travels to any backend (CPU readers, CUDA kernels). A codec
// (kv/codec.h) describes its blocks with one of these; a backend picks its reader by `kind`.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vxq {

enum class KvFormatKind : uint8_t {
    F32,        // head_dim fp32 per token
    F16,        // head_dim IEEE binary16 per token
    BF16,       // head_dim bfloat16 per token
    Q8_0,       // head_dim/32 ggml q8_0 blocks per token
    Q4_0,       // head_dim/32 ggml q4_0 blocks per token
    FP8,        // head_dim e4m3fn codes per token, one fp32 scale per stream (`scale`)
    KiviKey,    // KIVI keys: G tokens x head_dim, per-channel groups (kv/formats/kivi.h)
    KiviValue,  // KIVI values: one token, per-token groups of G channels
    TurboMse,   // TurboQuant_mse: one token, fp16 norm + rotated Lloyd-Max indices (kv/formats/turbo.h)
    TurboProd,  // TurboQuant_prod keys: TurboMse at b-1 bits + fp16 residual norm + QJL sign bits
    TurboRvq,   // TurboQuant_rvq: two Lloyd-Max stages, the second on the first one's residual
    VecInfer,   // VecInfer: one token, d/n product-quantizer indices of m bits (kv/formats/vecinfer.h)
    Qjl,        // QJL keys: 32 tokens, sign(S k) sketches + norms, outlier channels apart (kv/formats/qjl.h)
};
constexpr int kKvFormatKinds = 12;

const char* kv_format_kind_name(KvFormatKind k);

struct KvFormatParams {
    KvFormatKind kind = KvFormatKind::F32;
    int64_t block_tokens = 1;     // tokens per packed block
    size_t block_bytes = 0;       // bytes per packed block at this head_dim
    int32_t bits = 0;             // KIVI: bits per code; TurboQuant: first-stage index bits; VecInfer: m
    int32_t group = 0;            // KIVI: G; VecInfer: n
    int64_t rows = 0;             // KIVI: quantization rows per block
    float scale = 1.0f;           // fp8: x = e4m3(code) * scale
    const void* layer_state = nullptr;  // per-layer state shared by the heads (rotations, codebooks)
};

}  // namespace vxq

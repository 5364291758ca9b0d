// Quantizing a model file's weights (`vxq quantize`): a GGUF of f32/f16/bf16 weights in, the same
// model with its matrices in TQ2_0, TQ1_0, TQ2_G128 (veloxquant's Bonsai-style 128-value blocks,
// which llama.cpp cannot load), Q8_0 or Q4_0 out, every other tensor and every metadata key
// copied (general.file_type set to llama.cpp's value for the type; none for TQ2_G128).
//
// Which tensors change: every two-dimensional "*.weight" tensor whose rows are whole blocks of
// the type, except token_embd.weight (llama-quantize turns it into Q6_K for the ternary types,
// which veloxquant does not write yet: it keeps its source type). A matrix of another quantized
// type is refused (quantize from the f32/f16/bf16 file); one whose rows are not whole blocks is
// kept, and the report says so.
//
// Ternary types use formats/ggml_quants.h's TernaryRule: Absmean (BitNet b1.58's
// round-clip(w / mean|w|) per tensor, a least-squares scale per block) or Amax (llama.cpp's
// quantize_row_tq*_ref). Q8_0/Q4_0 use llama.cpp's reference quantizers. For a ternary-trained
// model (three values per tensor) both rules store the weights without loss and give the bytes
// llama-quantize gives (tests/test_quantize.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/ggml_quants.h"
#include "formats/ggml_types.h"

namespace vxq {

struct QuantizeOptions {
    std::string input, output;
    GgmlType type = GgmlType::TQ2_0;  // TQ2_0, TQ1_0, TQ2_G128, Q8_0 or Q4_0
    TernaryRule rule = TernaryRule::Absmean;
};

struct QuantizedTensor {
    std::string name;
    std::vector<int64_t> ne;
    GgmlType from = GgmlType::F32, to = GgmlType::F32;
    std::string note;  // why a matrix was kept, or empty
};

struct QuantizeReport {
    std::vector<QuantizedTensor> tensors;  // in file order
    uint64_t bytes_in = 0, bytes_out = 0;  // file sizes
};

// The types quantize_model writes, by name: tq2_0, tq1_0, tq2_g128, q8_0, q4_0; nullopt otherwise.
std::optional<GgmlType> quantize_target_type(std::string_view name);

// Reads o.input, writes o.output atomically (nothing is left under that name on an error).
// vxq::Error for an unreadable or malformed input, a quantized matrix in it, an output that cannot
// be written. progress(done, total) in bytes of tensor data written.
QuantizeReport quantize_model(const QuantizeOptions& o, const std::function<void(uint64_t, uint64_t)>& progress = {});

}  // namespace vxq

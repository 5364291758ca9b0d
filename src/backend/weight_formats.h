// The weight types the engine computes with, one row each: the storage layout (from
// formats/ggml_types.h), the type activations are converted to before the dot product, and the
// backends that have kernels for it (matmul and embedding row). A new weight type is one row in
// weight_formats.cpp plus its kernels in each backend named there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/ggml_types.h"

namespace vxq {

struct WeightFormat {
    GgmlType type;
    int64_t block_size;      // elements per block (ggml_type_traits)
    size_t block_bytes;      // bytes per block (ggml_type_traits)
    // What activations become before the dot product with this weight, as ggml's vec_dot_type:
    // F32 -> f32, F16 -> f16, BF16 -> bf16, Q8_0 and Q4_0 -> q8_0 blocks, Q6_K / TQ1_0 / TQ2_0 /
    // TQ2_G128 -> q8_K blocks. A matrix's rows are whole blocks of it (model/weights.cpp checks).
    GgmlType dot_type;
    std::vector<std::string_view> backends;  // backend names (make_backend) with kernels for it

    bool runs_on(std::string_view backend) const;
};

// Every row, in ggml type id order.
std::span<const WeightFormat> weight_formats();

// The row of `type`; nullptr for a type no backend computes.
const WeightFormat* find_weight_format(GgmlType type);

// Throws vxq::Error unless `backend` has kernels for weights of `type`, naming `what` (a file and
// tensor, e.g. "model.gguf: tensor 'blk.0.attn_q.weight'").
void check_weight_computable(GgmlType type, std::string_view backend, std::string_view what);

}  // namespace vxq

// Plain data the Backend ops take (backend/backend.h). Nothing here computes: the model layer
// builds these, and every backend (kernels/cpu, kernels/cuda) reads them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "formats/ggml_types.h"

namespace vxq {

// A weight matrix as stored in GGUF: `rows` output rows of `cols` input elements; row r starts
// at data + r * row_bytes. The data is host memory (the mapped file) that stays unchanged while a
// backend uses it: the CPU backend reads it in place, the CUDA backend uploads it once per data
// pointer.
struct WeightView {
    GgmlType type = GgmlType::F32;
    const void* data = nullptr;
    int64_t rows = 0;
    int64_t cols = 0;
    size_t row_bytes = 0;
};

struct RopeParams {
    int64_t n_rot;       // rotated dimensions (the rest pass through)
    float freq_base;
    bool neox;           // rotate (i, i + n_rot/2) instead of (2i, 2i+1)
};

}  // namespace vxq

// Weight upload of the CUDA backend (host code): the file's blocks regrouped into the device
// layout gemv.cuh describes, then copied once.
#include <cstring>
#include <vector>

#include "core/error.h"
#include "formats/ggml_types.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cpu/matmul_kquants.h"
#include "kernels/cuda/gemv.cuh"

namespace vxq::cuda {

namespace {

const uint8_t* row_of(const WeightView& w, int64_t r) { return static_cast<const uint8_t*>(w.data) + size_t(r) * w.row_bytes; }

// A weight's device copy: `data_bytes` of quants (or values) and n_scales fp16 scales, copied once.
void copy_to_device(DeviceWeight& d, const void* data, size_t data_bytes, const uint16_t* scales, size_t n_scales) {
    d.bytes = data_bytes + n_scales * 2;
    VXQ_CUDA_CHECK(cudaMalloc(&d.data, data_bytes));
    VXQ_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d.scales), n_scales * 2));
    VXQ_CUDA_CHECK(cudaMemcpy(d.data, data, data_bytes, cudaMemcpyHostToDevice));
    VXQ_CUDA_CHECK(cudaMemcpy(d.scales, scales, n_scales * 2, cudaMemcpyHostToDevice));
    VXQ_CUDA_CHECK(cudaDeviceSynchronize());  // the kernels run on another stream
}

// The weight's blocks of type B ({qs, d}), nb a row (row r's first at row(r)), on the device as
// gemv.cuh lays them out: the quant bytes row after row, then the fp16 scales (d.data, d.scales,
// d.bytes).
template <class B, class Row>
void upload_blocks(DeviceWeight& d, const WeightView& w, int64_t nb, Row row) {
    std::vector<uint8_t> quants(size_t(w.rows * nb) * sizeof(B::qs));
    std::vector<uint16_t> scales(size_t(w.rows * nb));
    for (int64_t r = 0; r < w.rows; ++r) {
        const auto* blk = reinterpret_cast<const B*>(row(r));
        for (int64_t b = 0; b < nb; ++b) {
            scales[size_t(r * nb + b)] = blk[b].d;
            std::memcpy(&quants[size_t(r * nb + b) * sizeof blk[b].qs], blk[b].qs, sizeof blk[b].qs);
        }
    }
    copy_to_device(d, quants.data(), quants.size(), scales.data(), scales.size());
}

}  // namespace

DeviceWeight upload_weight(const WeightView& w) {
    DeviceWeight d;
    d.type = w.type;
    d.file_type = w.type;
    d.rows = w.rows;
    d.cols = w.cols;
    const size_t n = size_t(w.rows * w.cols);
    switch (w.type) {
        case GgmlType::F32:
        case GgmlType::F16:
        case GgmlType::BF16: {
            const size_t elem = w.type == GgmlType::F32 ? 4 : 2;
            VXQ_ASSERT(w.row_bytes == size_t(w.cols) * elem);
            d.bytes = n * elem;
            VXQ_CUDA_CHECK(cudaMalloc(&d.data, d.bytes));
            VXQ_CUDA_CHECK(cudaMemcpy(d.data, w.data, d.bytes, cudaMemcpyHostToDevice));
            VXQ_CUDA_CHECK(cudaDeviceSynchronize());  // the kernels run on another stream
            return d;
        }
        case GgmlType::Q8_0:
            if (w.cols % kQBlock != 0) fail("Q8_0 weight with {} columns: not whole blocks", w.cols);
            upload_blocks<BlockQ8_0>(d, w, w.cols / kQBlock, [&](int64_t r) { return row_of(w, r); });
            return d;
        case GgmlType::Q4_0:
            if (w.cols % kQBlock != 0) fail("Q4_0 weight with {} columns: not whole blocks", w.cols);
            upload_blocks<BlockQ4_0>(d, w, w.cols / kQBlock, [&](int64_t r) { return row_of(w, r); });
            return d;
        // TQ2_0: 66-byte blocks split into 64 quant bytes and the fp16 scale. TQ1_0: each row first
        // rewritten as TQ2_0 blocks with the same digits and scales (cpu::tq1_0_row_as_tq2_0: every
        // value bit for bit), so the TQ2_0 GEMV reads it: 66 bytes a block on the device where the
        // file has 54 (no base-3 kernel yet).
        case GgmlType::TQ1_0:
        case GgmlType::TQ2_0: {
            if (w.cols % kQK_K != 0) fail("{} weight with {} columns: not whole blocks", ggml_type_display_name(w.type), w.cols);
            const int64_t nb = w.cols / kQK_K;
            std::vector<uint8_t> repacked(w.type == GgmlType::TQ1_0 ? size_t(nb) * sizeof(BlockTQ2_0) : 0);
            d.type = GgmlType::TQ2_0;
            upload_blocks<BlockTQ2_0>(d, w, nb, [&](int64_t r) {
                if (w.type == GgmlType::TQ2_0) return row_of(w, r);
                cpu::tq1_0_row_as_tq2_0(row_of(w, r), w.cols, repacked.data());
                return static_cast<const uint8_t*>(repacked.data());
            });
            return d;
        }
        case GgmlType::Q6_K: {  // unpacked: the values q - 32 as int8, then the int8 scale of each 16; d per 256
            if (w.cols % kQK_K != 0) fail("Q6_K weight with {} columns: not whole blocks", w.cols);
            std::vector<int8_t> values(size_t(n + n / 16));
            std::vector<uint16_t> d16(size_t(n / kQK_K));
            for (int64_t r = 0; r < w.rows; ++r) {
                cpu::q6_K_row_unpacked(row_of(w, r), w.cols, &values[size_t(r * w.cols)], &values[size_t(n + r * (w.cols / 16))],
                                       &d16[size_t(r * (w.cols / kQK_K))]);
            }
            copy_to_device(d, values.data(), values.size(), d16.data(), d16.size());
            return d;
        }
        case GgmlType::TQ2_G128:  // 34-byte blocks split into 32 quant bytes and the fp16 scale
            if (w.cols % kQK_K != 0) fail("TQ2_G128 weight with {} columns: not whole 256-value super-blocks", w.cols);
            upload_blocks<BlockTQ2_G128>(d, w, w.cols / kQK_G128, [&](int64_t r) { return row_of(w, r); });
            return d;
        default:
            fail("weight type {} has no CUDA kernel yet", ggml_type_display_name(w.type));
    }
}

void free_weight(DeviceWeight& w) {
    cudaFree(w.data);
    cudaFree(w.scales);
    w = DeviceWeight{};
}

}  // namespace vxq::cuda

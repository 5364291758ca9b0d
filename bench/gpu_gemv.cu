// GEMV bandwidth on the GPU: the CUDA backend's batch-1 matmul (activation conversion + GEMV,
// as a decode step runs it) for F16, Q8_0 and Q4_0 weights of Llama-3-8B FFN shapes, against a
// device-to-device copy measured in the same run. Bytes per call are the weight bytes on the
// device (the x and y vectors are < 0.1 % of them). Weight copies are rotated so the set read
// is > 4x the L2 (60 MB on an H200) and the numbers are HBM, not cache.
//
//   vxq_gpu_gemv            prints one table row per case, the copy first
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "backend/types.h"
#include "formats/ggml_types.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/gemv.cuh"

namespace {

constexpr int kRepeats = 7;        // timed repetitions; the median is reported
constexpr int kCallsPerRepeat = 100;
constexpr size_t kMinWorkingSet = size_t(512) << 20;

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Milliseconds per call of f (enqueued on `st`), median over kRepeats runs of kCallsPerRepeat.
template <class F>
double time_calls(cudaStream_t st, F&& f) {
    cudaEvent_t a, b;
    VXQ_CUDA_CHECK(cudaEventCreate(&a));
    VXQ_CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 10; ++i) f(i);  // warm-up
    VXQ_CUDA_CHECK(cudaStreamSynchronize(st));
    std::vector<double> ms;
    for (int r = 0; r < kRepeats; ++r) {
        VXQ_CUDA_CHECK(cudaEventRecord(a, st));
        for (int i = 0; i < kCallsPerRepeat; ++i) f(i);
        VXQ_CUDA_CHECK(cudaEventRecord(b, st));
        VXQ_CUDA_CHECK(cudaEventSynchronize(b));
        float t = 0;
        VXQ_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
        ms.push_back(double(t) / kCallsPerRepeat);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return median(ms);
}

// Random weights as a file would hold them (finite, |w| ~ 0.05; random quants and scales).
std::vector<uint8_t> random_weights(vxq::GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
    const size_t rb = vxq::ggml_row_bytes(type, cols);
    std::vector<uint8_t> bytes(rb * size_t(rows));
    std::uniform_int_distribution<uint32_t> u32;
    for (size_t i = 0; i + 4 <= bytes.size(); i += 4) {
        const uint32_t r = u32(rng);
        std::memcpy(&bytes[i], &r, 4);
    }
    // Keep fp16 values and block scales finite and small: exponent bits of 0x2800 ~ 0.03.
    auto fix_half = [](uint8_t* p) {
        uint16_t h;
        std::memcpy(&h, p, 2);
        h = uint16_t((h & 0x83ffu) | 0x2800u);
        std::memcpy(p, &h, 2);
    };
    if (type == vxq::GgmlType::F16) {
        for (size_t i = 0; i < bytes.size(); i += 2) fix_half(&bytes[i]);
    } else {
        const size_t block = type == vxq::GgmlType::Q8_0 ? 34 : 18;
        for (size_t i = 0; i < bytes.size(); i += block) fix_half(&bytes[i]);
    }
    return bytes;
}

}  // namespace

int main() {
    using namespace vxq;
    using namespace vxq::cuda;
    try {
        cudaDeviceProp prop{};
        VXQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        cudaStream_t st;
        VXQ_CUDA_CHECK(cudaStreamCreate(&st));
        std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

        // Device-to-device copy of 2 GiB: bytes read + bytes written per call.
        const size_t copy_bytes = size_t(2) << 30;
        void *src, *dst;
        VXQ_CUDA_CHECK(cudaMalloc(&src, copy_bytes));
        VXQ_CUDA_CHECK(cudaMalloc(&dst, copy_bytes));
        VXQ_CUDA_CHECK(cudaMemset(src, 0x5a, copy_bytes));
        const double copy_ms = time_calls(st, [&](int) {
            VXQ_CUDA_CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, st));
        });
        const double copy_gbs = 2.0 * double(copy_bytes) / (copy_ms * 1e-3) / 1e9;
        VXQ_CUDA_CHECK(cudaFree(src));
        VXQ_CUDA_CHECK(cudaFree(dst));

        struct Row { std::string type; int64_t rows, cols; size_t bytes; double us, gbs; };
        std::vector<Row> table;
        std::mt19937 rng(12345);
        const GgmlType types[] = {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0};
        const int64_t shapes[][2] = {{14336, 4096}, {4096, 14336}};  // (rows, cols): ffn_up/gate, ffn_down
        for (GgmlType type : types) {
            for (const auto& shape : shapes) {
                const int64_t rows = shape[0], cols = shape[1];
                const std::vector<uint8_t> host = random_weights(type, rows, cols, rng);
                const WeightView view{type, host.data(), rows, cols, ggml_row_bytes(type, cols)};
                std::vector<DeviceWeight> copies;
                size_t set = 0;
                while (set < kMinWorkingSet) {
                    copies.push_back(upload_weight(view));
                    set += copies.back().bytes;
                }
                float *x, *y;
                VXQ_CUDA_CHECK(cudaMalloc(&x, size_t(cols) * 4));
                VXQ_CUDA_CHECK(cudaMalloc(&y, size_t(rows) * 4));
                std::vector<float> xh(static_cast<size_t>(cols));
                std::normal_distribution<float> nd;
                for (float& v : xh) v = nd(rng);
                VXQ_CUDA_CHECK(cudaMemcpy(x, xh.data(), xh.size() * 4, cudaMemcpyHostToDevice));
                GemvScratch scratch;
                const double ms = time_calls(st, [&](int i) { gemv(copies[size_t(i) % copies.size()], x, 1, y, scratch, st); });
                std::vector<float> yh(static_cast<size_t>(rows));
                VXQ_CUDA_CHECK(cudaMemcpy(yh.data(), y, yh.size() * 4, cudaMemcpyDeviceToHost));
                for (float v : yh) {
                    if (!std::isfinite(v)) {
                        std::fprintf(stderr, "non-finite GEMV output for %s\n", std::string(ggml_type_name(type)).c_str());
                        return 1;
                    }
                }
                const size_t bytes = copies.front().bytes;
                table.push_back({std::string(ggml_type_name(type)), rows, cols, bytes, ms * 1e3, double(bytes) / (ms * 1e-3) / 1e9});
                for (DeviceWeight& w : copies) free_weight(w);
                VXQ_CUDA_CHECK(cudaFree(x));
                VXQ_CUDA_CHECK(cudaFree(y));
            }
        }

        std::printf("\n| case | rows x cols | MB/call | us/call | GB/s | of copy |\n");
        std::printf("| --- | --- | ---: | ---: | ---: | ---: |\n");
        std::printf("| d2d copy (read+write) | 2 GiB | %.0f | %.1f | %.0f | 100%% |\n", 2.0 * copy_bytes / 1e6,
                    copy_ms * 1e3, copy_gbs);
        for (const Row& r : table) {
            std::printf("| gemv %s n=1 | %lld x %lld | %.1f | %.1f | %.0f | %.0f%% |\n", r.type.c_str(), (long long)r.rows,
                        (long long)r.cols, double(r.bytes) / 1e6, r.us, r.gbs, 100.0 * r.gbs / copy_gbs);
        }
        cudaStreamDestroy(st);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "vxq_gpu_gemv: %s\n", e.what());
        return 1;
    }
    return 0;
}

// The CUDA backend's matmul (kernels/cuda/gemv.cuh: activation conversion + GEMV or GEMM, as a
// forward pass runs it) for F16, Q8_0 and Q4_0 weights of Llama-3-8B shapes: q/o 4096x4096,
// k/v 1024x4096, ffn up/gate 14336x4096, ffn down 4096x14336, output head 128256x4096.
//
//   GEMV, n = 1 (decode) and n = 4 (speculative verification): GB/s of weight bytes on the
//     device (x and y are < 0.1 % of them) against a device-to-device copy measured in the same
//     run. Weight copies are rotated so the set read is > 8x the L2 (60 MB on an H200) and the
//     numbers are HBM, not cache.
//   GEMM, n = 512 (prefill): TFLOP/s, counting 2 * rows * cols * n per call.
//   Crossover, ffn up/gate shape, n = 8, 16, 32, 64 with each path forced: where the GEMM starts
//     to win (kGemmMinTokensDense / kGemmMinTokensQuant in gemv.cuh).
//   Boundary, F16 and Q4_0 at n = 1: 8 back-to-back GEMVs of 8 distinct matrices against one
//     GEMV of all their rows (same bytes): what each kernel boundary of a decode step costs.
//   Ternary, issue 14's shapes (5120 x 512, 5120 x 17408, 17408 x 5120): TQ2_0 at n = 1 (every
//     kernel) and 4 (the group kernel; the tensor-core kernel at 4 and 8), TQ2_G128 at 1 against
//     F16 through the batch-1 kernel and through cuBLAS (GemmEx, n = 1), GB/s of the weight bytes
//     against the copy; beside them the read floor (a kernel that only reads the same bytes: the
//     best any kernel launched this way can do at that size) and the TQ2_0 kernels with x given as
//     q8_K (no quantize in the timed calls: what they would take if the kernel before wrote it).
// Every line names the kernels that ran (gemv_describe).
//
//   vxq_gpu_gemv            prints four markdown tables, the copy first
//   vxq_gpu_gemv --ternary [ROWSxCOLS]  the copy and the ternary table only (of one shape: for a
//                           profiler)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "backend/types.h"
#include "formats/ggml_types.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/launch.cuh"
#include "gpu_timing.cuh"

namespace {

using vxq::GgmlType;
using vxq::cuda::MatmulPath;

constexpr size_t kMinWorkingSet = size_t(512) << 20;
constexpr int64_t kPrefillTokens = 512;
using vxq::bench::time_calls;

// Random weights as a file would hold them (finite, |w| ~ 0.05; random quants and scales).
std::vector<uint8_t> random_weights(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
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
    if (type == GgmlType::F16) {
        for (size_t i = 0; i < bytes.size(); i += 2) fix_half(&bytes[i]);
    } else if (type == GgmlType::TQ2_0) {  // 64 quant bytes (any digits), then the fp16 scale
        for (size_t i = 0; i < bytes.size(); i += sizeof(vxq::BlockTQ2_0)) fix_half(&bytes[i + 64]);
    } else if (type == GgmlType::TQ2_G128) {  // 32 quant bytes, then the fp16 scale
        for (size_t i = 0; i < bytes.size(); i += sizeof(vxq::BlockTQ2_G128)) fix_half(&bytes[i + 32]);
    } else {
        const size_t block = type == GgmlType::Q8_0 ? 34 : 18;
        for (size_t i = 0; i < bytes.size(); i += block) fix_half(&bytes[i]);
    }
    return bytes;
}

struct Shape {
    const char* name;
    int64_t rows, cols;
    bool crossover;  // also time both paths at n = 8..64
};

struct GemvRow { std::string type, shape, kernels; int64_t rows, cols, n; size_t bytes; double us; };
struct BoundaryRow { std::string type; int64_t rows, cols, k; double one_us, k_us; };
struct GemmRow { std::string type, shape, kernels; int64_t rows, cols, n; double us; };
struct CrossRow { std::string type; int64_t rows, cols, n; double gemv_us, gemm_us; MatmulPath picked; };

// Copies the first rows of y back and fails on a non-finite value.
void check_finite(const float* y, size_t n, const char* what) {
    std::vector<float> h(n);
    VXQ_CUDA_CHECK(cudaMemcpy(h.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (float v : h) {
        if (!std::isfinite(v)) {
            std::fprintf(stderr, "non-finite matmul output (%s)\n", what);
            std::exit(1);
        }
    }
}

// The cost of a kernel boundary in a decode step: k back-to-back GEMVs of rows x cols (k distinct
// matrices) against one GEMV of the same k * rows rows (the same bytes, one kernel). Both read
// the weights from HBM (k * rows * cols > 8x the L2); the difference over k - 1 is what a
// boundary costs beyond the bytes, PDL included.
BoundaryRow time_boundary(GgmlType type, int64_t rows, int64_t cols, int k, cudaStream_t st, std::mt19937& rng,
                          const float* x, float* y) {
    using namespace vxq::cuda;
    const std::vector<uint8_t> host = random_weights(type, k * rows, cols, rng);
    const size_t rb = vxq::ggml_row_bytes(type, cols);
    DeviceWeight big = upload_weight(vxq::WeightView{type, host.data(), k * rows, cols, rb});
    std::vector<DeviceWeight> parts;
    for (int j = 0; j < k; ++j) {
        parts.push_back(upload_weight(vxq::WeightView{type, host.data() + size_t(j) * size_t(rows) * rb, rows, cols, rb}));
    }
    GemvScratch scratch;
    scratch.reserve(std::max(gemv_scratch_bytes(big, 1), gemv_scratch_bytes(parts[0], 1)));
    const double one = time_calls(st, 20, [&](int) { gemv(big, x, 1, y, scratch, st); });
    const double many = time_calls(st, 20, [&](int) {
        for (int j = 0; j < k; ++j) gemv(parts[size_t(j)], x, 1, y, scratch, st);
    });
    free_weight(big);
    for (DeviceWeight& w : parts) free_weight(w);
    return BoundaryRow{std::string(vxq::ggml_type_name(type)), rows, cols, k, one * 1e3, many * 1e3};
}

// The floor under any kernel that reads a matrix once: every byte of a copy read by 16-byte
// loads, U of them in flight a thread, nothing computed but an xor of the words (written where it
// equals a constant, so that the loads stay). Launched as the GEMVs are (PDL, the next launch
// allowed at once, the write after pdl_wait), rotated over copies as the weights are.
template <int U>
__global__ void read_floor_kernel(const uint4* __restrict__ src, int64_t n16, unsigned* out) {
    vxq::cuda::pdl_launch_dependents();
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (; i + (U - 1) * stride < n16; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) v[u] = __ldcs(src + i + u * stride);
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n16; i += stride) {
        const uint4 v = __ldcs(src + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    vxq::cuda::pdl_wait();
    if (acc == 0x9e3779b9u) *out = acc;
}

// The fastest of the read floor's launch forms (blocks an SM 1 / 2 / 4 / 8 of 512 threads, 4 or 8
// loads in flight a thread) for `bytes` a call, in us; `form` names it. pdl: launched as the GEMVs
// are (a call's blocks may start while the previous call's drain), else one call after the other.
double read_floor_us(size_t bytes, cudaStream_t st, bool pdl, std::string& form) {
    using namespace vxq::cuda;
    const size_t stride = (bytes + 255) / 256 * 256;
    const size_t copies = std::max<size_t>(1, (kMinWorkingSet + stride - 1) / stride);
    uint8_t* buf;
    unsigned* out;
    VXQ_CUDA_CHECK(cudaMalloc(&buf, copies * stride));
    VXQ_CUDA_CHECK(cudaMalloc(&out, sizeof(unsigned)));
    VXQ_CUDA_CHECK(cudaMemset(buf, 0x5a, copies * stride));
    const int64_t n16 = int64_t(bytes / 16);
    double best = 1e30;
    for (int per_sm : {1, 2, 4, 8}) {
        for (int u : {4, 8}) {
            const dim3 grid(unsigned(per_sm * sm_count()));
            const auto kernel = u == 4 ? read_floor_kernel<4> : read_floor_kernel<8>;
            const double ms = time_calls(st, 100, [&](int i) {
                const auto* src = reinterpret_cast<const uint4*>(buf + size_t(i) % copies * stride);
                if (pdl) {
                    launch_pdl(kernel, grid, dim3(512), 0, st, src, n16, out);
                } else {
                    kernel<<<grid, 512, 0, st>>>(src, n16, out);
                }
            });
            if (ms * 1e3 < best) {
                best = ms * 1e3;
                form = "read floor: 16-byte loads, " + std::to_string(per_sm) + " blocks of 512 an SM, " + std::to_string(u) +
                       " in flight a thread (fastest of 8 forms), " + (pdl ? "PDL on" : "no PDL: calls one after the other");
            }
        }
    }
    VXQ_CUDA_CHECK(cudaFree(buf));
    VXQ_CUDA_CHECK(cudaFree(out));
    return best;
}

}  // namespace

int main(int argc, char** argv) {
    using namespace vxq;
    using namespace vxq::cuda;
    try {
        cudaDeviceProp prop{};
        VXQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        cudaStream_t st;
        VXQ_CUDA_CHECK(cudaStreamCreate(&st));
        std::printf("device: %s, %d SMs, L2 %d MB; GEMM from n >= %lld (f32/f16/bf16), >= %lld (q8_0/q4_0)\n", prop.name,
                    prop.multiProcessorCount, prop.l2CacheSize >> 20, (long long)kGemmMinTokensDense,
                    (long long)kGemmMinTokensQuant);

        // Device-to-device copy of 2 GiB: bytes read + bytes written per call.
        const size_t copy_bytes = size_t(2) << 30;
        const double copy_gbs = bench::copy_bandwidth_gbs(st);
        const double copy_ms = 2.0 * double(copy_bytes) / (copy_gbs * 1e9) * 1e3;
        const bool ternary_only = argc > 1 && std::string(argv[1]) == "--ternary";

        std::vector<GemvRow> gemv_rows;
        std::vector<GemmRow> gemm_rows;
        std::vector<CrossRow> cross_rows;
        std::mt19937 rng(12345);
        const GgmlType types[] = {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0};
        const Shape shapes[] = {{"ffn up/gate", 14336, 4096, true},
                                {"ffn down", 4096, 14336, false},
                                {"attn q/o", 4096, 4096, false},
                                {"attn k/v", 1024, 4096, false},
                                {"output", 128256, 4096, false}};
        for (GgmlType type : types) {
            if (ternary_only) break;
            const std::string tname(ggml_type_name(type));
            for (const Shape& shape : shapes) {
                const int64_t rows = shape.rows, cols = shape.cols;
                std::vector<DeviceWeight> copies;
                {
                    const std::vector<uint8_t> host = random_weights(type, rows, cols, rng);
                    const WeightView view{type, host.data(), rows, cols, ggml_row_bytes(type, cols)};
                    size_t set = 0;
                    while (set < kMinWorkingSet) {
                        copies.push_back(upload_weight(view));
                        set += copies.back().bytes;
                    }
                }
                float *x, *y;
                VXQ_CUDA_CHECK(cudaMalloc(&x, size_t(kPrefillTokens * cols) * sizeof(float)));
                VXQ_CUDA_CHECK(cudaMalloc(&y, size_t(kPrefillTokens * rows) * sizeof(float)));
                {
                    std::vector<float> xh(size_t(kPrefillTokens * cols));
                    std::normal_distribution<float> nd;
                    for (float& v : xh) v = nd(rng);
                    VXQ_CUDA_CHECK(cudaMemcpy(x, xh.data(), xh.size() * sizeof(float), cudaMemcpyHostToDevice));
                }
                GemvScratch scratch;
                auto time_path = [&](int64_t n, MatmulPath path, int calls) {
                    scratch.reserve(gemv_scratch_bytes(copies.front(), n, path));
                    const double ms = time_calls(st, calls, [&](int i) {
                        gemv(copies[size_t(i) % copies.size()], x, n, y, scratch, st, path);
                    });
                    check_finite(y, size_t(std::min<int64_t>(n, 4) * rows), tname.c_str());
                    return ms * 1e3;
                };
                const size_t bytes = copies.front().bytes;
                for (int64_t n : {1, 4}) {
                    const double us = time_path(n, MatmulPath::Auto, 100);
                    gemv_rows.push_back({tname, shape.name, gemv_describe(copies.front(), n), rows, cols, n, bytes, us});
                }
                {
                    const double us = time_path(kPrefillTokens, MatmulPath::Auto, 10);
                    gemm_rows.push_back(
                        {tname, shape.name, gemv_describe(copies.front(), kPrefillTokens), rows, cols, kPrefillTokens, us});
                }
                if (shape.crossover) {
                    for (int64_t n : {8, 16, 32, 64}) {
                        const double g = time_path(n, MatmulPath::Gemv, 50);
                        const double m = time_path(n, MatmulPath::Gemm, 50);
                        cross_rows.push_back({tname, rows, cols, n, g, m, gemv_path(copies.front(), n)});
                    }
                }
                for (DeviceWeight& w : copies) free_weight(w);
                VXQ_CUDA_CHECK(cudaFree(x));
                VXQ_CUDA_CHECK(cudaFree(y));
            }
        }

        std::printf("\n| case | rows x cols | n | MB/call | us/call | GB/s | of copy | kernels |\n");
        std::printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |\n");
        std::printf("| d2d copy (read+write) | 2 GiB | | %.0f | %.1f | %.0f | 100%% | cudaMemcpyAsync |\n",
                    2.0 * double(copy_bytes) / 1e6, copy_ms * 1e3, copy_gbs);
        for (const GemvRow& r : gemv_rows) {
            const double gbs = double(r.bytes) / (r.us * 1e-6) / 1e9;
            std::printf("| gemv %s %s | %lld x %lld | %lld | %.1f | %.1f | %.0f | %.0f%% | %s |\n", r.type.c_str(),
                        r.shape.c_str(), (long long)r.rows, (long long)r.cols, (long long)r.n, double(r.bytes) / 1e6, r.us,
                        gbs, 100.0 * gbs / copy_gbs, r.kernels.c_str());
        }

        std::vector<BoundaryRow> boundary_rows;
        if (!ternary_only) {
            float *x, *y;
            VXQ_CUDA_CHECK(cudaMalloc(&x, size_t(14336) * sizeof(float)));
            VXQ_CUDA_CHECK(cudaMalloc(&y, size_t(8 * 14336) * sizeof(float)));
            std::vector<float> xh(14336);
            std::normal_distribution<float> nd;
            for (float& v : xh) v = nd(rng);
            VXQ_CUDA_CHECK(cudaMemcpy(x, xh.data(), xh.size() * sizeof(float), cudaMemcpyHostToDevice));
            for (GgmlType type : {GgmlType::F16, GgmlType::Q4_0}) {
                for (const Shape& shape : {shapes[2], shapes[0], shapes[1]}) {
                    boundary_rows.push_back(time_boundary(type, shape.rows, shape.cols, 8, st, rng, x, y));
                }
            }
            VXQ_CUDA_CHECK(cudaFree(x));
            VXQ_CUDA_CHECK(cudaFree(y));
        }
        std::printf("\n| boundary | k x (rows x cols) | one kernel of k*rows rows, us | k kernels, us | per boundary, us |\n");
        std::printf("| --- | --- | ---: | ---: | ---: |\n");
        for (const BoundaryRow& r : boundary_rows) {
            std::printf("| gemv %s n=1 | %lld x (%lld x %lld) | %.1f | %.1f | %.2f |\n", r.type.c_str(), (long long)r.k,
                        (long long)r.rows, (long long)r.cols, r.one_us, r.k_us, (r.k_us - r.one_us) / double(r.k - 1));
        }

        // Ternary against F16 (issue 14's shapes): one matrix of each, copies rotated as above.
        struct TernaryRow { std::string what, kernels; int64_t rows, cols, n; size_t bytes; double us; };
        std::vector<TernaryRow> ternary_rows;
        std::vector<std::pair<int64_t, int64_t>> ternary_shapes{{5120, 512}, {5120, 17408}, {17408, 5120}};
        if (ternary_only && argc > 2) {
            long long r = 0, c = 0;
            if (std::sscanf(argv[2], "%lldx%lld", &r, &c) != 2 || r <= 0 || c <= 0 || c % 256 != 0) {
                std::fprintf(stderr, "vxq_gpu_gemv: error: --ternary ROWSxCOLS (cols a multiple of 256), got '%s'\n", argv[2]);
                return 2;
            }
            ternary_shapes = {{r, c}};
        }
        for (const auto& [rows, cols] : ternary_shapes) {
            float *x, *y;
            VXQ_CUDA_CHECK(cudaMalloc(&x, size_t(8 * cols) * sizeof(float)));
            VXQ_CUDA_CHECK(cudaMalloc(&y, size_t(8 * rows) * sizeof(float)));
            {
                std::vector<float> xh(size_t(8 * cols));
                std::normal_distribution<float> nd;
                for (float& v : xh) v = nd(rng);
                VXQ_CUDA_CHECK(cudaMemcpy(x, xh.data(), xh.size() * sizeof(float), cudaMemcpyHostToDevice));
            }
            for (GgmlType type : {GgmlType::TQ2_0, GgmlType::TQ2_G128, GgmlType::F16}) {
                std::vector<DeviceWeight> copies;
                const std::vector<uint8_t> host = random_weights(type, rows, cols, rng);
                const WeightView view{type, host.data(), rows, cols, ggml_row_bytes(type, cols)};
                for (size_t set = 0; set < kMinWorkingSet; set += copies.back().bytes) copies.push_back(upload_weight(view));
                GemvScratch scratch;
                const auto run = [&](const char* what, int64_t n, MatmulPath path) {
                    scratch.reserve(gemv_scratch_bytes(copies.front(), n, path));
                    const double ms = time_calls(st, 100, [&](int i) {
                        gemv(copies[size_t(i) % copies.size()], x, n, y, scratch, st, path);
                    });
                    check_finite(y, size_t(n * rows), what);
                    ternary_rows.push_back({what, gemv_describe(copies.front(), n, path), rows, cols, n, copies.front().bytes, ms * 1e3});
                };
                // n = 1: the default kernel (x quantized in it), the same after the quantize
                // kernel, the tensor-core kernel (TQ2_0: with and without the quantize kernel), the
                // stream kernel, the half-SM forms, the lane-piece kernel at 1 and 2 pieces a lane,
                // the stream kernel's 32-warp plan, and the group kernel, in the same process.
                // The lane-piece kernel at `pieces` a lane, then the stream kernel again.
                const auto run_lanes = [&](const std::string& what, int pieces) {
                    set_gemv_ternary_lanes(true);
                    set_gemv_ternary_lanes_pieces(pieces);
                    run(what.c_str(), 1, MatmulPath::Auto);
                    set_gemv_ternary_lanes_pieces(1);
                    set_gemv_ternary_lanes(false);
                };
                const auto forms = [&](const std::string& t) {
                    run(t.c_str(), 1, MatmulPath::Auto);
                    set_gemv_ternary_quantize_in_kernel(false);
                    run((t + " quantize kernel").c_str(), 1, MatmulPath::Auto);
                    set_gemv_ternary_quantize_in_kernel(true);
                    if (type == GgmlType::TQ2_0) {  // the tensor-core kernel, on and off whatever the default
                        set_gemv_ternary_mma(true);
                        run((t + " mma").c_str(), 1, MatmulPath::Auto);
                        set_gemv_ternary_quantize_in_kernel(false);
                        run((t + " mma quantize kernel").c_str(), 1, MatmulPath::Auto);
                        set_gemv_ternary_x_given(true);  // x's q8_K as the last call left it in the scratch
                        run((t + " mma x given as q8_K").c_str(), 1, MatmulPath::Auto);
                        set_gemv_ternary_mma(false);
                        run((t + " stream x given as q8_K").c_str(), 1, MatmulPath::Auto);
                        set_gemv_ternary_mma(true);
                        set_gemv_ternary_x_given(false);
                        set_gemv_ternary_quantize_in_kernel(true);
                        set_gemv_ternary_mma_depth(2);
                        run((t + " mma depth 2").c_str(), 1, MatmulPath::Auto);
                        set_gemv_ternary_mma_depth(4);
                        set_gemv_ternary_mma(false);  // (and for the stream kernel's arms below)
                        run((t + " stream").c_str(), 1, MatmulPath::Auto);
                    }
                    // The half-SM form (room on every SM for the next call's blocks beside this
                    // call's): the stream kernel at 16 and 8 warps, after the quantize kernel and
                    // with x given, and the lane-piece kernel at half its blocks an SM.
                    set_gemv_ternary_half(true);
                    run((t + " half-SM").c_str(), 1, MatmulPath::Auto);
                    set_gemv_ternary_stream_warps(8);
                    run((t + " half-SM 8 warps").c_str(), 1, MatmulPath::Auto);
                    set_gemv_ternary_stream_warps(16);
                    set_gemv_ternary_quantize_in_kernel(false);
                    run((t + " half-SM quantize kernel").c_str(), 1, MatmulPath::Auto);
                    set_gemv_ternary_x_given(true);  // x's q8_K as the call before left it in the scratch
                    run((t + " half-SM x given as q8_K").c_str(), 1, MatmulPath::Auto);
                    set_gemv_ternary_x_given(false);
                    set_gemv_ternary_quantize_in_kernel(true);
                    run_lanes(t + " lanes x2 half-SM", 2);
                    set_gemv_ternary_half(false);
                    run_lanes(t + " lanes", 1);
                    run_lanes(t + " lanes x2", 2);
                    set_gemv_ternary_stream_warps(32);
                    run((t + " 32 warps").c_str(), 1, MatmulPath::Auto);
                    set_gemv_ternary_stream_warps(16);
                    set_gemv_ternary_stream(false);
                    run((t + " group").c_str(), 1, MatmulPath::Auto);
                    set_gemv_ternary_stream(true);
                };
                if (type == GgmlType::TQ2_0) {
                    for (const bool pdl : {true, false}) {
                        std::string form;
                        const double us = read_floor_us(copies.front().bytes, st, pdl, form);
                        ternary_rows.push_back({pdl ? "read floor" : "read floor, no PDL", form, rows, cols, 1, copies.front().bytes, us});
                    }
                    forms("tq2_0");
                    set_gemv_ternary_mma_batch(false);
                    run("tq2_0 group", 4, MatmulPath::Auto);
                    set_gemv_ternary_mma_batch(true);  // the tensor-core kernel's batch form (the default)
                    run("tq2_0 mma", 4, MatmulPath::Auto);
                    run("tq2_0 mma", 8, MatmulPath::Auto);
                } else if (type == GgmlType::TQ2_G128) {
                    forms("tq2_g128");
                } else {
                    run("f16", 1, MatmulPath::Auto);
                    run("f16 cuBLAS", 1, MatmulPath::Gemm);
                }
                for (DeviceWeight& w : copies) free_weight(w);
            }
            VXQ_CUDA_CHECK(cudaFree(x));
            VXQ_CUDA_CHECK(cudaFree(y));
        }
        std::printf("\n| ternary | rows x cols | n | MB/call | us/call | GB/s | of copy | kernels |\n");
        std::printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |\n");
        for (const TernaryRow& r : ternary_rows) {
            const double gbs = double(r.bytes) / (r.us * 1e-6) / 1e9;
            std::printf("| %s | %lld x %lld | %lld | %.1f | %.1f | %.0f | %.0f%% | %s |\n", r.what.c_str(), (long long)r.rows,
                        (long long)r.cols, (long long)r.n, double(r.bytes) / 1e6, r.us, gbs, 100.0 * gbs / copy_gbs,
                        r.kernels.c_str());
        }

        std::printf("\n| case | rows x cols | n | us/call | TFLOP/s | kernels |\n");
        std::printf("| --- | --- | ---: | ---: | ---: | --- |\n");
        for (const GemmRow& r : gemm_rows) {
            const double tflops = 2.0 * double(r.rows) * double(r.cols) * double(r.n) / (r.us * 1e-6) / 1e12;
            std::printf("| gemm %s %s | %lld x %lld | %lld | %.1f | %.1f | %s |\n", r.type.c_str(), r.shape.c_str(),
                        (long long)r.rows, (long long)r.cols, (long long)r.n, r.us, tflops, r.kernels.c_str());
        }

        std::printf("\n| crossover | rows x cols | n | GEMV us | GEMM us | faster | Auto takes |\n");
        std::printf("| --- | --- | ---: | ---: | ---: | --- | --- |\n");
        for (const CrossRow& r : cross_rows) {
            std::printf("| %s | %lld x %lld | %lld | %.1f | %.1f | %s | %s |\n", r.type.c_str(), (long long)r.rows,
                        (long long)r.cols, (long long)r.n, r.gemv_us, r.gemm_us, r.gemv_us <= r.gemm_us ? "GEMV" : "GEMM",
                        r.picked == MatmulPath::Gemm ? "GEMM" : "GEMV");
        }
        cudaStreamDestroy(st);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "vxq_gpu_gemv: %s\n", e.what());
        return 1;
    }
    return 0;
}

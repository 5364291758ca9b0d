// Weight matmul microbenchmarks: GEMV (1 token, decode) and GEMM (512 tokens, prompt) for every
// weight type at the shapes of vxq-llama-h64 (d_model 384, ffn 1024, vocab 4096).
//
// Each benchmark cycles through a pool of distinct weight matrices that together exceed the
// 32 MiB L3 (64 MiB or more), so a GEMV streams its weights from DRAM as a real decode of a large
// model would.  (The 11M-parameter model itself fits in L3; numbers for that case are higher.)
// Counters: bytes_per_second = weight bytes read, items_per_second = FLOPs (2 * rows * cols * n),
// plus GB/s and GFLOP/s for convenience; the label names the summation order (code path) that ran
// and the context prints the ISA and the machine load.  BM_ReadBandwidth gives the DRAM ceiling
// for the GEMV numbers on the same machine.  Per docs/MEASURE.md run with repetitions, e.g.
//   vxq_microbench --benchmark_filter=Matmul --benchmark_min_time=0.2
//                  --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// (median, min and max are reported).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "formats/ggml_types.h"
#include "kernels/cpu/matmul.h"

namespace {

using vxq::GgmlType;

constexpr size_t kPoolBytes = size_t(64) << 20;

using vxq::bench::next;
using vxq::bench::unit;

void fill_weights(GgmlType type, uint8_t* p, int64_t rows, int64_t cols, uint64_t seed) {
    const size_t rb = vxq::ggml_row_bytes(type, cols);
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t r = 0; r < rows; ++r) {
        uint8_t* row = p + size_t(r) * rb;
        switch (type) {
            case GgmlType::F32:
                for (int64_t c = 0; c < cols; ++c) {
                    const float v = 0.05f * unit(s);
                    std::memcpy(row + 4 * c, &v, 4);
                }
                break;
            case GgmlType::F16:
            case GgmlType::BF16:
                for (int64_t c = 0; c < cols; ++c) {
                    const float v = 0.05f * unit(s);
                    const uint16_t h =
                        type == GgmlType::F16 ? vxq::fp32_to_fp16(v) : vxq::fp32_to_bf16(v);
                    std::memcpy(row + 2 * c, &h, 2);
                }
                break;
            case GgmlType::Q8_0:
            case GgmlType::Q4_0: {
                const size_t bb =
                    type == GgmlType::Q8_0 ? sizeof(vxq::BlockQ8_0) : sizeof(vxq::BlockQ4_0);
                for (int64_t b = 0; b < cols / 32; ++b) {
                    uint8_t* blk = row + size_t(b) * bb;
                    const uint16_t d = vxq::fp32_to_fp16(0.002f + 0.001f * unit(s));
                    std::memcpy(blk, &d, 2);
                    for (size_t j = 2; j < bb; ++j) {
                        uint8_t v = uint8_t(next(s) >> 56);
                        if (type == GgmlType::Q8_0 && v == 0x80) v = 0x81;  // codes in [-127, 127]
                        blk[j] = v;
                    }
                }
                break;
            }
            default:
                throw std::invalid_argument("no benchmark input for this weight type");
        }
    }
}

// One pool of matrices kept alive across the benchmarks that share (type, rows, cols).
struct WeightPool {
    GgmlType type{};
    int64_t rows = 0, cols = 0;
    size_t matrix_bytes = 0;
    int count = 0;
    std::vector<uint8_t> data;
};

WeightPool& weight_pool(GgmlType type, int64_t rows, int64_t cols) {
    static WeightPool pool;
    if (pool.type != type || pool.rows != rows || pool.cols != cols || pool.data.empty()) {
        pool.type = type;
        pool.rows = rows;
        pool.cols = cols;
        pool.matrix_bytes = vxq::ggml_row_bytes(type, cols) * size_t(rows);
        pool.count = int((kPoolBytes + pool.matrix_bytes - 1) / pool.matrix_bytes);
        if (pool.count < 2) pool.count = 2;
        pool.data.assign(pool.matrix_bytes * size_t(pool.count), 0);
        for (int i = 0; i < pool.count; ++i)
            fill_weights(type, pool.data.data() + size_t(i) * pool.matrix_bytes, rows, cols,
                         uint64_t(i + 1));
    }
    return pool;
}

vxq::ThreadPool& thread_pool(int n) {
    static std::unique_ptr<vxq::ThreadPool> pools[3];
    if (!pools[n]) pools[n] = std::make_unique<vxq::ThreadPool>(n);
    return *pools[n];
}

void BM_Matmul(benchmark::State& state) {
    const auto type = GgmlType(state.range(0));
    const int64_t rows = state.range(1), cols = state.range(2), n = state.range(3);
    const int threads = int(state.range(4));
    WeightPool& wp = weight_pool(type, rows, cols);
    vxq::ThreadPool& tp = thread_pool(threads);

    std::vector<float> x(size_t(n * cols)), y(size_t(n * rows));
    uint64_t s = 42;
    for (auto& v : x) v = unit(s);

    const size_t rb = vxq::ggml_row_bytes(type, cols);
    int i = 0;
    for (auto _ : state) {
        const vxq::WeightView w{type, wp.data.data() + size_t(i) * wp.matrix_bytes, rows, cols,
                                     rb};
        vxq::cpu::matmul(w, x.data(), n, y.data(), tp);
        benchmark::DoNotOptimize(y.data());
        benchmark::ClobberMemory();
        if (++i == wp.count) i = 0;
    }
    const double flops = 2.0 * double(rows) * double(cols) * double(n);
    state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(wp.matrix_bytes));
    state.SetItemsProcessed(int64_t(double(state.iterations()) * flops));
    state.counters["GB/s"] = benchmark::Counter(double(wp.matrix_bytes) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
    state.counters["GFLOP/s"] =
        benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    state.SetLabel(std::string(vxq::ggml_type_name(type)) + " " +
                   vxq::cpu::dot_order_name(vxq::cpu::dot_order(
                       vxq::WeightView{type, nullptr, rows, cols, rb}, n)));
}

// Sum of a buffer larger than the L3, 1 or 2 threads: the DRAM read bandwidth a GEMV can reach.
void BM_ReadBandwidth(benchmark::State& state) {
    const int threads = int(state.range(0));
    static std::vector<float> buf(kPoolBytes / sizeof(float), 1.0f);
    vxq::ThreadPool& tp = thread_pool(threads);
    float sink[2] = {};
    for (auto _ : state) {
        tp.run([&](int ith, int nth) {
            const size_t b = buf.size() * size_t(ith) / size_t(nth);
            const size_t e = buf.size() * size_t(ith + 1) / size_t(nth);
            float acc[8] = {};
            for (size_t i = b; i + 8 <= e; i += 8)
                for (int l = 0; l < 8; ++l) acc[l] += buf[i + size_t(l)];
            sink[ith] = acc[0] + acc[7];
        });
        benchmark::DoNotOptimize(sink);
    }
    state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(kPoolBytes));
    state.counters["GB/s"] = benchmark::Counter(double(kPoolBytes) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_ReadBandwidth)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void args(benchmark::internal::Benchmark* b) {
    b->ArgNames({"type", "rows", "cols", "n", "thr"});
    const GgmlType types[] = {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::F32,
                              GgmlType::BF16};
    const int64_t shapes[][2] = {{384, 384}, {1024, 384}, {384, 1024}, {4096, 384}};
    for (GgmlType t : types)
        for (const auto& sh : shapes)
            for (int64_t n : {1, 512})
                for (int thr : {1, 2}) b->Args({int64_t(t), sh[0], sh[1], n, thr});
    vxq::bench::with_min_max(b);
}

BENCHMARK(BM_Matmul)->Apply(args);

// The machine state every result depends on, printed in the benchmark context.
const bool kContext = [] {
    benchmark::AddCustomContext("matmul_isa", vxq::cpu::matmul_isa());
    benchmark::AddCustomContext("loadavg_at_start", vxq::bench::loadavg());
    return true;
}();

}  // namespace

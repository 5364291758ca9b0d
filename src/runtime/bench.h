// Throughput benchmark with the protocol of ../shared/docs/MEASURE.md: every (configuration, test)
// pair runs once per repetition round, interleaved in one process in an order that rotates from
// round to round, each round on a different prompt from a rotating pool; warm-up outside timing,
// an A/A copy of the baseline as the noise floor, and median / min / max / mean +- sd per pair.
// A test is pp or tg at one depth, so several depths are measured side by side in one run.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/memory_check.h"

namespace vxq {

class Model;
class TpGroup;

struct BenchConfig {
    std::string label;          // e.g. "vxq-llama-h64-f16 kv=f16"
    const Model* model = nullptr;
    std::string kv = "f16";     // a KV spec: "q4_0" or "q4_0/f16" (K/V)
    bool flash_attn = false;
};

struct BenchParams {
    int64_t n_prompt = 512;     // pp test: tokens in one batch (0: skip)
    int64_t n_gen = 128;        // tg test: decode steps (0: skip)
    std::vector<int64_t> depths{0};  // tokens already in the cache before a test (untimed); one test per depth
    int reps = 5;
    int threads = 2;            // host threads
    std::string device = "cpu"; // the backend (make_backend name)
    int pool = 8;               // distinct prompts in the rotation
    uint64_t seed = 42;
    bool add_aa = true;         // add an A/A copy of the first configuration
    // How a test's depth prefix enters the cache (untimed): through the model (llama-bench's -d),
    // or, fill_kv, by Runner::fill_kv (each layer's keys and values of the tokens' embeddings,
    // two matmuls a layer): a decode test then reads as many cached tokens of the same shape, for
    // caches whose prefill is slow (the reader codecs at 32K and beyond).
    bool fill_kv = false;
    // Tensor parallelism: every configuration runs on this group (its model must be every
    // configuration's model, group->model()) instead of on a backend made from `device`.
    TpGroup* group = nullptr;
};

struct BenchStats {
    double median = 0, min = 0, max = 0, mean = 0, sd = 0;  // tokens/s
    std::vector<double> samples;
};

struct BenchRow {
    std::string label;
    std::string test;           // "pp512", "tg128", "pp512@d1024", ...
    int64_t depth = 0;          // tokens in the cache before the timed part
    int64_t n_prompt = 0;       // prompt tokens timed in one batch (pp tests; 0 for tg)
    int64_t n_gen = 0;          // decode steps timed (tg tests; 0 for pp)
    std::string code_path;      // backend and kernels that ran
    std::string kv_format;
    size_t kv_bytes = 0;
    double kv_bits_per_element = 0;
    bool is_aa = false;
    BenchStats tps;
};

struct BenchReport {
    std::vector<BenchRow> rows;
    double loadavg_1m = -1;
    std::string machine;
    std::string backend;        // Backend::describe() after the runs
    BackendMemory memory;       // what the backend holds after the runs (KV bytes are per row)
    std::vector<BackendMemory> rank_memory;  // with a group: each rank's (memory is rank 0's)
};

// trace(line) gets one line per timed run (order of runs, which prompt) when set.
BenchReport run_bench(const std::vector<BenchConfig>& configs, const BenchParams& p,
                      const std::function<void(const std::string&)>& trace = {},
                      const std::function<void(int, int)>& progress = {});

BenchStats summarize(std::vector<double> samples);

}  // namespace vxq

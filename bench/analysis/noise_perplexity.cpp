// vxq_noise_ppl: how far one-ulp noise in the matmuls alone moves a KV cache's perplexity on the
// CPU (issue 11 item 1's yardstick: the CUDA backend's perplexity against the CPU's).
//
// Runs `vxq perplexity`'s computation (runtime/perplexity.h, -fa, one cache of --kv) on the CPU
// backend, with --seed S > 0 on test::LastBitNoiseBackend (tests/support/forwarding_backend.h:
// every matmul output y becomes y (1 + u 2^-24), u uniform in [-1, 1) from seed S), the noise a
// different summation order puts on the same numbers. --seed 0 is the plain CPU backend. The
// spread of the noisy runs' PPL around the plain one is what the CPU's own last bits do to a
// codec; a second backend that matches the CPU's cache byte for byte on equal inputs cannot be
// held closer than that.
//
//   vxq_noise_ppl MODEL TEXT --kv SPEC [--ctx N] [--chunks N] [--mode prefill|stream]
//                 [--seed S] [--threads T]
// Prints one line: kv, mode, seed, chunks, PPL.
#include <unistd.h>

#include <charconv>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <fmt/core.h>

#include "analysis_tool.h"
#include "backend/backend.h"
#include "core/error.h"
#include "kv/kv_cache.h"
#include "kv/spec.h"
#include "model/model.h"
#include "runtime/perplexity.h"
#include "support/forwarding_backend.h"

namespace {

using namespace vxq;
using analysis::read_text;

// A whole decimal integer in [lo, hi], or vxq::Error naming the flag.
template <class T>
T parse_int(std::string_view flag, std::string_view v, T lo, T hi) {
    T x{};
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec != std::errc{} || end != v.data() + v.size() || x < lo || x > hi) {
        fail("{} '{}': an integer from {} to {}", flag, v, lo, hi);
    }
    return x;
}

int run(int argc, char** argv) {
    constexpr const char* kUsage =
        "usage: vxq_noise_ppl MODEL TEXT --kv SPEC [--ctx N] [--chunks N] [--mode prefill|stream] [--seed S] [--threads T]";
    if (argc < 3) fail("{}", kUsage);
    std::string kv = "f16", mode_name = "prefill";
    int64_t n_ctx = 1024, n_chunks = -1;  // -1: every chunk of the text
    uint32_t seed = 0;
    int threads = 2;
    for (int i = 3; i < argc; i += 2) {
        const std::string_view flag = argv[i];
        if (i + 1 >= argc) fail("{} needs a value; {}", flag, kUsage);
        const char* v = argv[i + 1];
        if (flag == "--kv") kv = v;
        else if (flag == "--ctx") n_ctx = parse_int<int64_t>(flag, v, 2, int64_t(1) << 24);
        else if (flag == "--chunks") n_chunks = parse_int<int64_t>(flag, v, 1, INT64_MAX);
        else if (flag == "--mode") mode_name = v;
        else if (flag == "--seed") seed = parse_int<uint32_t>(flag, v, 0, UINT32_MAX);
        else if (flag == "--threads") threads = parse_int<int>(flag, v, 1, 256);
        else fail("unknown option '{}'; {}", flag, kUsage);
    }
    if (mode_name != "prefill" && mode_name != "stream") fail("--mode '{}': prefill or stream", mode_name);
    const PplMode mode = mode_name == "stream" ? PplMode::Stream : PplMode::Prefill;

    const KvSpec spec = KvSpec::parse(kv);
    const auto model = Model::load(argv[1], "cpu");
    const std::string text = read_text(argv[2]);
    std::unique_ptr<Backend> be = seed == 0 ? make_backend("cpu", threads)
                                            : std::make_unique<test::LastBitNoiseBackend>(threads, seed);
    const ModelConfig& c = model->config();
    KvCacheOptions opts;
    opts.flash_attn = true;
    opts.memory = be->kv_memory();
    auto cache = make_kv_cache(KvShape{c.n_layer, c.n_head, c.n_head_kv, c.head_dim, n_ctx}, spec, opts);
    const bool tty = isatty(STDERR_FILENO) != 0;  // progress on a terminal only
    const PerplexityResult r =
        perplexity(*model, *be, *cache, text, PerplexityParams{n_ctx, n_chunks, mode}, [&](int64_t i, int64_t n, double ppl) {
            if (tty) fmt::print(stderr, "\r[{}/{}] PPL {:.4f}   ", i + 1, n, ppl);
        });
    if (tty) fmt::print(stderr, "\n");
    fmt::print("kv {} | mode {} | seed {} | {} chunks x {} | PPL {:.4f} +/- {:.5f}\n", kv, mode_name, seed, r.n_chunks,
               n_ctx, r.ppl, r.ppl_err);
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return vxq::analysis::tool_main(argc, argv, run); }

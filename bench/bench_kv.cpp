// KV-cache microbenchmarks at head_dim 128 and 8 KV heads for the codecs f16, bf16, q8_0, q4_0,
// fp8 and kivi:bits=8/4/2, decode also turbo:bits=3/4, turbo-rvq:bits=2 and vecinfer:n=4,m=8 (the benchmark name
// carries the spec string):
//
//   BM_KvEncode/<codec>[/key|/value]  The codec's scalar reference encoder (Codec::encode, the one
//       the paged cache calls), block by block, 256 tokens per iteration, rotating through a 64 MiB
//       pool of f32 rows. KIVI runs for both roles (key blocks: G tokens x head_dim grouped per
//       channel; value blocks: one token), the token-wise formats for one (they have one encoder).
//       bytes_per_second / GB/s = f32 input read; tokens/s; bits/elem = packed size.
//   BM_KvAppend/<codec>  The cache's real write path: write(layer 0, pos, k, v, 1) + commit(pos + 1)
//       of one token (K and V of 8 KV heads) into a make_kv_cache cache (1 layer, n_ctx 8192),
//       residual-window flushes and page allocation included, inputs rotating through a 64 MiB pool.
//       A full cache is truncate(0)-ed with the timer paused. Pausing in every iteration would add
//       clock reads to every few-microsecond append; this pause comes once per 8192 appends
//       (negligible), while the truncate is not negligible: it frees every page, 3.4 ms for bf16
//       (~5 % of its 8192 appends) and 0.1-1 % for q8_0 and KIVI on the 2-core dev machine.
//       Refilling the freed pages (allocation, and page faults where the allocator returned the
//       memory) stays timed: a fresh cache pays it too. A warm-up pass outside the timing (a
//       512-token prompt, which also sets fp8's scale, single tokens to the end, truncate(0))
//       makes every timed pass start from the same state.
//       bytes_per_second / GB/s = f32 K+V bytes in (8 KiB per token); tokens/s.
//   BM_KvDecodeAttention/<codec>/ctx:<N>  One decode step: attend(layer 0, q, n_q 1, pos0 N - 1),
//       32 query heads over 8 KV heads (GQA 4), on a cache holding N tokens of random K/V. Each
//       step attends the next cache of a pool of independent caches: at least 8 and as many as
//       resident_bytes() says reach 64 MiB in all, capped at 64 (at these shapes the cap never binds;
//       16384 tokens need only the 8, e.g. 512 MiB for f16, and the pool builds in seconds).
//       bytes_per_second / GB/s = resident_bytes() of the cache attended, i.e. what the kernel must
//       read (for the paged cache an upper bound: it counts the fp16 residual ring's capacity and
//       page slack); steps/s; bits/elem = resident bits per cached K/V element. Threads: the
//       environment variable VXQ_BENCH_THREADS (default 1), printed in the context as kv_threads.
//
// make_kv_cache("f16", "f16") is the llama.cpp-parity f16 cache (full-capacity fp16 arrays,
// llama.cpp's attention numerics), any other spec the paged cache with the fused attention kernel.
// The label names what ran (cache->format(), cache kind, attention kernel); the context prints
// kv_isa, the AVX2+FMA+F16C check on which every KV reader and the parity attention dispatch
// (with VXQ_KV_ISA=scalar the fused kernel reads every format with its scalar reader, and kv_isa
// says so: the A/B of an AVX2 reader against its reference), and kv_loadavg_at_start. Caches are built and filled (write batches of 512 tokens) outside the timed
// loop and kept until a benchmark of another configuration runs, so with random interleaving every
// switch rebuilds a pool (1-4 s for a decode pool on the 2-core dev machine): the numbers stay
// right, the run takes minutes (all Kv benchmarks, min_time 0.05, 2 repetitions: 113 s
// interleaved vs 60 s for one plain pass).
// Per docs/MEASURE.md run with repetitions, interleaved, and read median, min and max:
//   VXQ_BENCH_THREADS=1 vxq_microbench --benchmark_filter=Kv --benchmark_min_time=0.2
//       --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true
//       --benchmark_report_aggregates_only=true
// (Google Benchmark 1.7.1 takes --benchmark_min_time as plain seconds; "0.2s" is rejected.)
#include <benchmark/benchmark.h>

#include <cpuid.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "core/thread_pool.h"
#include "kv/codec.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kv_reader.h"
#include "kv/kv_cache.h"
#include "backend/backend.h"

namespace {

using vxq::KvCache;
using vxq::KvRole;

constexpr size_t kPoolBytes = size_t(64) << 20;
constexpr int64_t kHeadDim = 128;
constexpr int64_t kHeadsKv = 8;
constexpr int64_t kRow = kHeadsKv * kHeadDim;  // floats of one token's K (or V)
constexpr int64_t kFillBatch = 512;            // tokens per write() when filling a cache
constexpr int64_t kEncodeTokens = 256;         // per BM_KvEncode iteration: whole KIVI key blocks (G <= 256)
constexpr int64_t kAppendCtx = 8192;
constexpr int kMinCaches = 8;   // MEASURE.md: >= 8 distinct inputs, while they fit kMaxPoolBytes
constexpr size_t kMaxPoolBytes = size_t(1) << 30;  // 128K-token f16 caches are 512 MiB each: 2 of them
constexpr int kMaxCaches = 64;  // bounds setup time should a cache ever be tiny
constexpr int kQueries = 8;     // distinct decode queries, rotated with the caches

const char* const kCodecs[] = {"f16",         "bf16",        "q8_0",        "q4_0",
                               "fp8",         "kivi:bits=8", "kivi:bits=4", "kivi:bits=2"};

// Decode adds the f16 cache read by the fused kernel (--flash-attn), the fastest f16 path of the
// kernel family every compressed codec uses, TurboQuant (turbo at 3 and 4 bits, turbo-rvq at
// 2 x 2 bits: about q4_0's bits/element) and VecInfer at 2 bits (seeded random codebooks: the
// reader's work does not depend on their values).
const char* const kDecodeCodecs[] = {"f16",          "f16+fa",       "bf16",           "q8_0",
                                     "q4_0",         "fp8",          "kivi:bits=8",    "kivi:bits=4",
                                     "kivi:bits=2",  "turbo:bits=3", "turbo:bits=4",   "turbo-rvq:bits=2",
                                     "vecinfer:n=4,m=8,calib=random"};

using vxq::bench::next;
using vxq::bench::unit;

void fill_random(std::vector<float>& x, uint64_t& s) {
    for (auto& v : x) v = 2.0f * unit(s);
}

// 64 MiB of f32 in [-2, 2): [tokens, head_dim] rows for the encoder; for append, token t is
// K = [n_head_kv, head_dim] at t * 2 * kRow followed by V.
const std::vector<float>& input_pool() {
    static const std::vector<float> pool = [] {
        std::vector<float> p(kPoolBytes / sizeof(float));
        uint64_t s = 0x1234567;
        fill_random(p, s);
        return p;
    }();
    return pool;
}

bool is_kivi(const std::string& spec) { return spec.rfind("kivi", 0) == 0; }

// A decode configuration: a KV spec, "+fa" for --flash-attn (an f16 cache through the fused kernel).
struct DecodeConfig {
    std::string spec;
    bool flash_attn;
    static DecodeConfig parse(const std::string& s) {
        const size_t fa = s.find("+fa");
        return {s.substr(0, fa), fa != std::string::npos};
    }
};

// What the CPU backend runs for a layer: llama.cpp's non-flash f16 attention, or the fused kernel.
std::string attention_kernel(const KvCache& c) {
    return vxq::cpu::attention_f16_applies(c.view(0)) ? "attention_f16 (llama.cpp non-FA order)" : "attention_fused";
}

// The check behind the KV read paths (baseline and KIVI readers, the parity f16 attention): their
// AVX2 kernels run when the CPU has AVX2, FMA and F16C, the scalar ones otherwise. The encoders
// are scalar everywhere.
const char* kv_isa() {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    bool scalar_forced = false;
    try {
        scalar_forced = vxq::cpu::kv_scalar_forced();
    } catch (const std::exception& e) {  // a bad VXQ_KV_ISA: say so and stop, before any benchmark
        std::fprintf(stderr, "vxq_microbench: %s\n", e.what());
        std::exit(2);
    }
    if (scalar_forced) return avx2 ? "scalar (VXQ_KV_ISA=scalar; the parity f16 attention: avx2+fma+f16c)" : "scalar";
    return avx2 ? "avx2+fma+f16c" : "scalar";
}

int bench_threads() {
    static const int n = [] {
        const char* env = std::getenv("VXQ_BENCH_THREADS");
        const long v = env ? std::strtol(env, nullptr, 10) : 1;
        return int(std::clamp(v, 1L, 256L));
    }();
    return n;
}

std::string mib(double bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / double(1 << 20));
    return buf;
}

// ---- encode ----------------------------------------------------------------------------------

void BM_KvEncode(benchmark::State& state, const std::string& spec, KvRole role) {
    std::unique_ptr<vxq::Codec> codec;
    try {
        codec = vxq::make_codec(vxq::CodecSpec::parse(spec), role, kHeadDim);
    } catch (const std::exception& e) {
        state.SkipWithError(e.what());
        return;
    }
    const int64_t bt = codec->block_tokens();
    const size_t bb = codec->block_bytes(kHeadDim);
    if (kEncodeTokens % bt != 0) {
        state.SkipWithError("block_tokens does not divide the batch");
        return;
    }
    const std::vector<float>& in = input_pool();  // [pool tokens, head_dim]
    const int64_t n_batches = int64_t(in.size()) / (kEncodeTokens * kHeadDim);
    const size_t batch_bytes = size_t(kEncodeTokens / bt) * bb;
    static std::vector<uint8_t> out;  // the packed pool, reused by every codec; faulted in here
    if (out.size() < batch_bytes * size_t(n_batches)) out.assign(batch_bytes * size_t(n_batches), 0);
    codec->observe_first_batch(in.data(), kFillBatch, kHeadDim);  // fp8's scale, as from a prompt

    int64_t b = 0;
    for (auto _ : state) {
        const float* x = in.data() + b * kEncodeTokens * kHeadDim;
        uint8_t* o = out.data() + size_t(b) * batch_bytes;
        for (int64_t t = 0; t < kEncodeTokens; t += bt, o += bb) codec->encode(x + t * kHeadDim, kHeadDim, o);
        benchmark::DoNotOptimize(o);
        benchmark::ClobberMemory();
        if (++b == n_batches) b = 0;
    }
    const double in_bytes = double(kEncodeTokens * kHeadDim) * sizeof(float);
    state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(in_bytes));
    state.counters["GB/s"] =
        benchmark::Counter(in_bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["tokens/s"] =
        benchmark::Counter(double(kEncodeTokens), benchmark::Counter::kIsIterationInvariantRate);
    state.counters["bits/elem"] = codec->bits_per_element(kHeadDim);
    const std::string role_name = !is_kivi(spec) ? "" : role == KvRole::Key ? " key" : " value";
    state.SetLabel(codec->spec() + role_name + ", scalar reference encode");
}

// ---- append ----------------------------------------------------------------------------------

struct AppendSlot {
    std::string spec;
    std::unique_ptr<KvCache> cache;
    int64_t next_input = 0;  // token of the input pool the next append reads
};

void BM_KvAppend(benchmark::State& state, const std::string& spec) {
    static AppendSlot slot;
    const std::vector<float>& in = input_pool();
    const int64_t pool_tokens = int64_t(in.size()) / (2 * kRow);
    if (slot.spec != spec || !slot.cache) {
        slot.cache.reset();
        slot.spec.clear();
        try {
            slot.cache = vxq::make_kv_cache({1, 24, kHeadsKv, kHeadDim, kAppendCtx}, spec, spec);
        } catch (const std::exception& e) {
            state.SkipWithError(e.what());
            return;
        }
        slot.spec = spec;
        // Warm-up pass: a prompt (fp8 takes its scale from it), then single tokens to the end.
        KvCache& c = *slot.cache;
        std::vector<float> k(size_t(kFillBatch * kRow)), v(size_t(kFillBatch * kRow));
        uint64_t s = 99;
        fill_random(k, s);
        fill_random(v, s);
        c.write(0, 0, k.data(), v.data(), kFillBatch);
        c.commit(kFillBatch);
        for (int64_t pos = kFillBatch; pos < kAppendCtx; ++pos) {
            const float* kv = in.data() + (pos % pool_tokens) * 2 * kRow;
            c.write(0, pos, kv, kv + kRow, 1);
            c.commit(pos + 1);
        }
        c.truncate(0);
    }

    KvCache& c = *slot.cache;
    int64_t t = slot.next_input;
    for (auto _ : state) {
        int64_t pos = c.size();
        if (pos == kAppendCtx) {  // once per kAppendCtx iterations (see the top)
            state.PauseTiming();
            c.truncate(0);
            state.ResumeTiming();
            pos = 0;
        }
        const float* kv = in.data() + t * 2 * kRow;  // K [n_head_kv, head_dim], then V
        c.write(0, pos, kv, kv + kRow, 1);
        c.commit(pos + 1);
        benchmark::ClobberMemory();
        if (++t == pool_tokens) t = 0;
    }
    slot.next_input = t;
    const double in_bytes = double(2 * kRow) * sizeof(float);
    state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(in_bytes));
    state.counters["GB/s"] =
        benchmark::Counter(in_bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["tokens/s"] = benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
    state.SetLabel(c.format() + ", paged cache, 1 token per write");
}

// ---- decode attention ------------------------------------------------------------------------

struct DecodePool {
    std::string spec;
    int64_t ctx = 0;
    std::vector<std::unique_ptr<KvCache>> caches;
    std::vector<size_t> bytes;  // resident_bytes() of each cache
    size_t total_bytes = 0;
    std::vector<float> q;  // [kQueries, n_head, head_dim]
    int next = 0;          // cache the next step attends
};

constexpr int64_t kDecodeHeads = 32;

// One decode step over layer 0 through the CPU backend (parity f16 or fused, as it dispatches).
void attend(const KvCache& c, const float* q, int64_t ctx, float* out) {
    static const auto backend = vxq::make_backend("cpu", bench_threads());
    backend->attention(c.view(0), q, 1, ctx - 1, out);
}

// N tokens of fresh random K/V, written in batches as a prompt would be.
void fill_cache(KvCache& c, int64_t n, uint64_t& s) {
    // [batch, n_head_kv, head_dim]
    std::vector<float> k(size_t(kFillBatch * kRow)), v(size_t(kFillBatch * kRow));
    for (int64_t pos = 0; pos < n; pos += kFillBatch) {
        const int64_t m = std::min(kFillBatch, n - pos);
        fill_random(k, s);
        fill_random(v, s);
        c.write(0, pos, k.data(), v.data(), m);
        c.commit(pos + m);
    }
}

// Builds caches until they hold >= 64 MiB (and at least kMinCaches), then attends each once so
// page faults and thread start-up stay out of the timing.
void build_decode_pool(DecodePool& p, const std::string& spec, int64_t ctx) {
    p = DecodePool{};  // frees the previous pool before allocating the next
    const vxq::KvShape shape{1, kDecodeHeads, kHeadsKv, kHeadDim, ctx};
    uint64_t s = 0xC0FFEE ^ uint64_t(ctx);
    const auto need_more = [&p] {
        const int n = int(p.caches.size());
        return n == 0 || (n < kMaxCaches && p.total_bytes < kPoolBytes) ||
               (n < kMinCaches && p.total_bytes < kMaxPoolBytes);
    };
    while (need_more()) {
        const DecodeConfig cfg = DecodeConfig::parse(spec);
        auto c = vxq::make_kv_cache(shape, vxq::KvSpec::parse(cfg.spec), vxq::KvCacheOptions{false, cfg.flash_attn});
        fill_cache(*c, ctx, s);
        p.bytes.push_back(c->resident_bytes());
        p.total_bytes += p.bytes.back();
        p.caches.push_back(std::move(c));
    }
    p.q.resize(size_t(kQueries * kDecodeHeads * kHeadDim));
    fill_random(p.q, s);
    std::vector<float> out(size_t(kDecodeHeads * kHeadDim));
    for (const auto& c : p.caches) attend(*c, p.q.data(), ctx, out.data());
    p.spec = spec;
    p.ctx = ctx;
}

void BM_KvDecodeAttention(benchmark::State& state, const std::string& spec, int64_t ctx) {
    static DecodePool pool;
    if (pool.spec != spec || pool.ctx != ctx) {
        try {
            build_decode_pool(pool, spec, ctx);
        } catch (const std::exception& e) {
            pool = DecodePool{};
            state.SkipWithError(e.what());
            return;
        }
    }
    std::vector<float> out(size_t(kDecodeHeads * kHeadDim));  // [n_q 1, n_head, head_dim]
    const int n = int(pool.caches.size());
    const size_t q_floats = size_t(kDecodeHeads * kHeadDim);
    int i = pool.next;
    size_t bytes = 0;
    for (auto _ : state) {
        const float* q = pool.q.data() + size_t(i % kQueries) * q_floats;
        attend(*pool.caches[size_t(i)], q, ctx, out.data());
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
        bytes += pool.bytes[size_t(i)];
        if (++i == n) i = 0;
    }
    pool.next = i;
    state.SetBytesProcessed(int64_t(bytes));
    state.counters["GB/s"] = benchmark::Counter(double(bytes) * 1e-9, benchmark::Counter::kIsRate);
    state.counters["steps/s"] = benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["bits/elem"] = vxq::resident_bits_per_element(*pool.caches[0], ctx);
    state.SetLabel(pool.caches[0]->format() + ", " + attention_kernel(*pool.caches[0]) + ", " +
                   std::to_string(n) + " caches x " + mib(double(pool.total_bytes) / n));
}

// ---- registration ----------------------------------------------------------------------------

// Real time (the decode step's workers too), with min and max.
void common(benchmark::internal::Benchmark* b) { vxq::bench::with_min_max(b); }

const bool kRegistered = [] {
    for (const std::string spec : kCodecs) {
        if (is_kivi(spec)) {
            common(benchmark::RegisterBenchmark(("BM_KvEncode/" + spec + "/key").c_str(), BM_KvEncode, spec,
                                                KvRole::Key));
            common(benchmark::RegisterBenchmark(("BM_KvEncode/" + spec + "/value").c_str(), BM_KvEncode, spec,
                                                KvRole::Value));
        } else {
            common(benchmark::RegisterBenchmark(("BM_KvEncode/" + spec).c_str(), BM_KvEncode, spec,
                                                KvRole::Key));
        }
    }
    for (const std::string spec : kCodecs)
        common(benchmark::RegisterBenchmark(("BM_KvAppend/" + spec).c_str(), BM_KvAppend, spec));
    for (const int64_t ctx : {1024, 4096, 16384, 131072})
        for (const std::string spec : kDecodeCodecs)
            common(benchmark::RegisterBenchmark(
                ("BM_KvDecodeAttention/" + spec + "/ctx:" + std::to_string(ctx)).c_str(),
                BM_KvDecodeAttention, spec, ctx));
    return true;
}();

// The machine state the KV results depend on, in the benchmark context (bench_matmul.cpp adds
// the load average at start; AddCustomContext rejects a key twice).
const bool kContext = [] {
    benchmark::AddCustomContext("kv_isa", kv_isa());
    benchmark::AddCustomContext("kv_threads", std::to_string(bench_threads()) + " (VXQ_BENCH_THREADS)");
    return true;
}();


}  // namespace

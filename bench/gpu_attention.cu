// Decode attention alone (issue 11): one query token of a Llama-3-8B layer (32 query heads over 8
// KV heads of 128) against a device KV cache of 1K..128K tokens in each format the CUDA backend
// reads (f16, q8_0, q4_0, fp8), through the split-K kernel (attention.cuh: attention_split) as a
// decode step launches it. Bandwidth counts every byte the kernel must read: keys and values with
// their block scales (q, the partials and the output are < 0.1 % of them), against a
// device-to-device copy measured in the same run. Layers are rotated so the bytes read between
// two reads of the same layer are >= kMinWorkingSet (8x the H200's L2): HBM, not cache; except
// where the layers would hold more than kMaxCacheBytes of device memory (whole 2 MiB chunks per
// stream: contexts of a few hundred tokens), so those rows may be served partly from L2.
//
//   vxq_gpu_attention [--formats f16,q8_0,q4_0,fp8,kivi4,kivi2,turbo4,turbo3,turbo2,vecinfer,qjl] [--splits N,..] [--tile N,..]
//                     [--stages N,..] [--stream N,..] [--mma N,..] [--tma N,..] [--kivi-splits N,..]
//                     [--turbo-splits N,..] [--encode N,..] [CONTEXTS...]
//                     (contexts default 1024 4096 16384 32768 65536 131072)
// prints a markdown table and, last, one JSON line per case (for plots and docs). The lists time
// the kernel with every combination of those split counts, tiles, stages and forms (--stream: 0 the
// tensor-core form, 1..4 the stream form's ring depth; --mma: 1 the stream form on tensor cores
// where it fits, 0 its ring; --tma: 1..4 the bulk-copy stream form's ring depth; attention.cuh) (the backend's
// choice is always included and marked "*"; a tiling that does not fit is skipped). The layouts
// of one case are timed interleaved (kGpuRepeats rounds of every layout in turn, median, min and
// max), the backend's layout twice: its second arm, "A/A", is the noise floor of that case.
// kivi4 / kivi2: a KIVI cache (kivi:bits=4 / 2, G 32, R 128: kivi.cuh) filled through the backend's
// store, timed with the KIVI attention and its merge at its default split count and each of
// --kivi-splits, the tensor-core form at 5 blocks an SM with its own splits (KiviAttentionParams::
// blocks_per_sm; JSON "stream": -5, the default tensor-core form -2, SIMT -3), and the SIMT form
// beside the tensor-core form (with the largest difference of their outputs on stderr); bytes =
// packed keys and values with their zeros and scales + the fp16 windows.
// turbo4 / turbo3 / turbo2 / vecinfer / qjl (not in the default list): a TurboQuant cache
// (turbo:bits=4 / 3 / 2, Hadamard rotation), a VecInfer one (vecinfer:n=4,m=8 with seeded random
// codebooks: 2 bits/element; rotated_kv.cuh) or a QJL one (qjl's defaults: qjl_kv.cuh) filled
// through the backend's store, timed with the reader-policy attention and its merge (the way back
// from the rotated domain) at its default split count and each of --turbo-splits; bytes = the
// packed blocks (fp16 norms and indices or signs) of keys and values and QJL's fp16 windows.
// --encode N,..: also the encoder (store_kv, attention.cuh) writing N tokens' keys and values of
// the 8 KV heads in each format (a prefill chunk, or KIVI's flush size 2048 in issue 11's bar),
// bytes = the f32 rows read + the codes and scales written, inputs rotated as the caches are,
// each call enqueued by itself and the same calls replayed from a CUDA graph (0 contexts: only
// this table).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>

#include "backend/backend.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/kivi.cuh"
#include "kernels/cuda/qjl_kv.cuh"
#include "kernels/cuda/rotated_kv.cuh"
#include "kv/codec.h"
#include "kv/formats/qjl.h"
#include "kv/formats/turbo.h"
#include "kv/formats/vecinfer.h"
#include "kv/kv_cache.h"
#include "kv/memory.h"
#include "gpu_timing.cuh"

namespace {

constexpr int64_t kHeads = 32, kHeadsKv = 8, kHeadDim = 128;
constexpr size_t kMinWorkingSet = size_t(512) << 20;
constexpr size_t kMaxCacheBytes = size_t(24) << 30;
constexpr int64_t kFillChunk = 4096;  // tokens per kv_write while filling

struct Config {
    int64_t splits;
    int tile, stages;
    int stream;  // stages of the stream form's ring (0: the tensor-core form; -1: the backend's default)
    int mma;     // the stream form on tensor cores where it fits (1), its ring form (0), the backend's choice (-1)
    int tma;     // > 0: the bulk-copy stream form with this ring depth (the other fields but splits unused); 0: not
};

struct Row {
    std::string kv;
    int64_t ctx, layers, splits;
    int tile, stages, stream, mma, tma;
    size_t bytes;  // read per call
    double us, us_min, us_max;  // median, min, max over the interleaved repetitions
    bool aa;                    // the default layout's second arm (A/A: the noise floor)
    bool dflt;                  // the backend's layout (either arm)
    bool graph = false;         // the backend's layout again, its 40 calls replayed from a CUDA graph
};

// The backend's layout's 40 calls (f(i): call i) captured into a CUDA graph and replayed, as a
// decode step runs it (no host launch cost, PDL edges kept), alternating with plain enqueues: a
// row like `like` with the graph's timing.
template <class F>
Row graph_row(Row like, cudaStream_t st, F&& f) {
    const vxq::bench::Timing t = vxq::bench::time_plain_and_graph(st, 40, f).second;
    like.us = t.median * 1e3, like.us_min = t.min * 1e3, like.us_max = t.max * 1e3;
    like.aa = false, like.graph = true;
    return like;
}

// The formats timed: the --kv name and its device format (kv_codes.cuh), K and V alike.
struct Format {
    const char* kv;
    vxq::cuda::KvCode code;
};
constexpr Format kFormats[] = {{"f16", vxq::cuda::KvCode::F16},
                               {"q8_0", vxq::cuda::KvCode::Q8_0},
                               {"q4_0", vxq::cuda::KvCode::Q4_0},
                               {"fp8", vxq::cuda::KvCode::FP8}};

// Random keys and values (|x| < 1, one chunk of them reused), written chunk by chunk into every
// layer of `cache` through the backend's store kernels. Returns the chunk (its first floats are
// the timed query).
std::vector<float> fill_cache(vxq::Backend& be, vxq::KvCache& cache, int64_t layers, int64_t ctx, uint32_t seed) {
    const int64_t chunk = std::min(kFillChunk, ctx);
    const size_t chunk_floats = size_t(chunk * kHeadsKv * kHeadDim);
    std::vector<float> host(chunk_floats);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& x : host) x = u(rng);
    float* k = be.activation_buffer(0, chunk_floats);
    float* v = be.activation_buffer(1, chunk_floats);
    VXQ_CUDA_CHECK(cudaMemcpy(k, host.data(), chunk_floats * 4, cudaMemcpyHostToDevice));
    VXQ_CUDA_CHECK(cudaMemcpy(v, host.data(), chunk_floats * 4, cudaMemcpyHostToDevice));
    for (int64_t l = 0; l < layers; ++l) {
        for (int64_t t0 = 0; t0 < ctx; t0 += chunk) be.kv_write(cache, l, t0, k, v, std::min(chunk, ctx - t0));
        be.to_host(k, 1, 0);  // runs what is recorded
    }
    cache.commit(ctx);
    return host;
}

// Exits when the last call's output (device, kHeads x kHeadDim) holds a non-finite value.
void require_finite_output(const float* out, const std::string& kv, int64_t ctx) {
    std::vector<float> o(size_t(kHeads * kHeadDim));
    VXQ_CUDA_CHECK(cudaMemcpy(o.data(), out, o.size() * 4, cudaMemcpyDeviceToHost));
    for (float x : o) {
        if (!std::isfinite(x)) {
            std::fprintf(stderr, "vxq_gpu_attention: non-finite attention output (%s, %lld tokens)\n", kv.c_str(),
                         (long long)ctx);
            std::exit(1);
        }
    }
}

std::vector<Row> run_case(const Format& f, int64_t ctx, const std::vector<Config>& configs, cudaStream_t st) {
    const std::string kv = f.kv;
    using namespace vxq;
    const size_t stream_bytes = size_t(ctx * cuda::kv_token_bytes(f.code, kHeadDim));
    const size_t layer_bytes = stream_bytes * kHeadsKv * 2;
    auto be = make_backend("cuda", 1);
    // Device memory is committed per stream in whole chunks (2 MiB): a short context holds far more
    // than its bytes, so the cap counts what the layers hold, not what they store.
    const size_t g = be->kv_memory()->commit_granularity();
    const size_t layer_held = (stream_bytes + g - 1) / g * g * kHeadsKv * 2;
    const int64_t layers = std::max<int64_t>(1, std::min<int64_t>((kMinWorkingSet + layer_bytes - 1) / layer_bytes,
                                                                  int64_t(kMaxCacheBytes / layer_held)));
    KvCacheOptions opts;
    opts.memory = be->kv_memory();
    opts.flash_attn = true;
    const KvShape shape{layers, kHeads, kHeadsKv, kHeadDim, ctx};
    auto cache = make_kv_cache(shape, KvSpec::parse(kv), opts);
    const std::vector<float> host = fill_cache(*be, *cache, layers, ctx, uint32_t(ctx) * 7 + uint32_t(kv.size()));

    // The kernel's arguments, one heads table per layer; the same q, scratch and output.
    cuda::SplitAttentionParams p{};
    p.n_q = 1;
    p.n_head = kHeads;
    p.n_head_kv = kHeadsKv;
    p.head_dim = kHeadDim;
    int64_t most = 0;
    for (const Config& c : configs) most = std::max(most, c.splits);
    p.scale = 1.0f / std::sqrt(float(kHeadDim));
    p.k_code = p.v_code = f.code;
    float *q, *out, *partial;
    int64_t* pos0;
    unsigned* arrivals;
    cuda::KvHeadDev* tables;
    VXQ_CUDA_CHECK(cudaMalloc(&q, size_t(kHeads * kHeadDim) * 4));
    VXQ_CUDA_CHECK(cudaMalloc(&out, size_t(kHeads * kHeadDim) * 4));
    VXQ_CUDA_CHECK(cudaMalloc(&partial, cuda::attention_split_scratch_floats(1, kHeads, kHeadDim, most) * 4));
    VXQ_CUDA_CHECK(cudaMalloc(&pos0, sizeof(int64_t)));
    VXQ_CUDA_CHECK(cudaMalloc(&arrivals, size_t(kHeadsKv) * sizeof(unsigned)));
    VXQ_CUDA_CHECK(cudaMalloc(&tables, size_t(layers * kHeadsKv) * sizeof(cuda::KvHeadDev)));
    VXQ_CUDA_CHECK(cudaMemset(arrivals, 0, size_t(kHeadsKv) * sizeof(unsigned)));
    VXQ_CUDA_CHECK(cudaMemcpy(q, host.data(), size_t(kHeads * kHeadDim) * 4, cudaMemcpyHostToDevice));
    const int64_t last = ctx - 1;
    VXQ_CUDA_CHECK(cudaMemcpy(pos0, &last, sizeof last, cudaMemcpyHostToDevice));
    std::vector<cuda::KvHeadDev> table(size_t(layers * kHeadsKv));
    for (int64_t l = 0; l < layers; ++l) {
        const KvLayerView view = cache->view(l);
        for (int64_t g = 0; g < kHeadsKv; ++g) {
            const KvHeadView& h = view.heads[g];
            table[size_t(l * kHeadsKv + g)] = {uint64_t(reinterpret_cast<uintptr_t>(kv_packed_blocks(h.k))),
                                               uint64_t(reinterpret_cast<uintptr_t>(kv_packed_blocks(h.v))), h.n_tokens, 0,
                                               h.k.fmt.scale, h.v.fmt.scale};
        }
    }
    VXQ_CUDA_CHECK(cudaMemcpy(tables, table.data(), table.size() * sizeof(cuda::KvHeadDev), cudaMemcpyHostToDevice));
    p.q = q;
    p.out = out;
    p.partial = partial;
    p.pos0 = pos0;
    p.arrivals = arrivals;
    // The layouts that fit, and the default one again as an A/A arm; all timed interleaved.
    std::vector<cuda::SplitAttentionParams> arms;
    std::vector<bool> aa, dflts;
    const auto add_arm = [&](const cuda::SplitAttentionParams& a, bool dflt) {  // the default twice: its A/A arm
        arms.push_back(a);
        aa.push_back(false);
        dflts.push_back(dflt);
        if (dflt) {
            arms.push_back(a);
            aa.push_back(true);
            dflts.push_back(true);
        }
    };
    // The backend's form for this format past the short form's context: the bulk-copy stream form where it fits.
    const int64_t tma_splits = cuda::attention_stream_tma_splits(kHeadsKv, f.code);
    const int tma_stages = cuda::attention_stream_tma_stages(f.code);
    p.splits = tma_splits;
    p.tma_stages = tma_stages;
    const bool tma_default = cuda::attention_stream_tma_fits(p);
    for (const Config& c : configs) {
        p.splits = c.splits;
        p.tile = c.tile;
        p.stages = c.stages;
        p.tma_stages = c.tma;
        if (c.tma > 0) {  // its own kernel: one arm per split count and ring depth
            if (!cuda::attention_stream_tma_fits(p)) continue;
            add_arm(p, c.splits == tma_splits && c.tma == tma_stages);
            continue;
        }
        p.stream_stages = 0;
        const int32_t stream_default = cuda::attention_stream_stages(p);
        p.stream_stages = c.stream < 0 ? stream_default : c.stream;
        if (!cuda::attention_split_tiling_fits(p) || (p.stream_stages > 0 && !cuda::attention_stream_fits(p))) continue;
        const bool mma_fits = p.stream_stages > 0 && cuda::attention_stream_mma_fits(p);
        if (c.mma == 1 && !mma_fits) continue;  // the ring form's arm already times it
        const int mma_default = p.stream_stages > 0 && cuda::attention_stream_mma_default(p) ? 1 : 0;
        p.stream_mma = c.mma < 0 ? mma_default : c.mma;
        const bool dflt = !tma_default && c.splits == cuda::attention_splits(1, kHeadsKv, f.code) && c.tile == cuda::kAttnSplitTile &&
                          c.stages == cuda::kAttnSplitStages && p.stream_stages == stream_default && p.stream_mma == mma_default;
        if ((c.stream < 0 || c.mma < 0) && std::any_of(configs.begin(), configs.end(), [&](const Config& o) {
                return o.splits == c.splits && o.tile == c.tile && o.stages == c.stages && &o != &c && o.tma == 0 &&
                       (c.stream < 0 ? o.stream == stream_default : o.stream == c.stream) &&
                       (c.mma < 0 ? o.mma == mma_default : o.mma == c.mma);
            })) {
            continue;  // the default is listed by its numbers too
        }
        add_arm(p, dflt);
    }
    const std::vector<bench::Timing> ms = bench::time_interleaved(st, 40, int(arms.size()), [&](int arm, int i) {
        cuda::SplitAttentionParams pl = arms[size_t(arm)];
        pl.heads = tables + (i % layers) * kHeadsKv;
        cuda::attention_split(pl, st);
    });
    require_finite_output(out, kv, ctx);
    std::vector<Row> rows;
    for (size_t a = 0; a < arms.size(); ++a) {
        const auto& c = arms[a];
        rows.push_back(Row{kv, ctx, layers, c.splits, c.tile, c.stages, c.stream_stages, c.stream_mma, c.tma_stages, layer_bytes,
                           ms[a].median * 1e3, ms[a].min * 1e3,
                           ms[a].max * 1e3, aa[a], dflts[a]});
    }
    for (size_t a = 0; a < arms.size(); ++a) {
        if (!dflts[a] || aa[a]) continue;
        rows.push_back(graph_row(rows[a], st, [&](int i) {
            cuda::SplitAttentionParams pl = arms[a];
            pl.heads = tables + (i % layers) * kHeadsKv;
            cuda::attention_split(pl, st);
        }));
    }
    for (void* ptr : {static_cast<void*>(q), static_cast<void*>(out), static_cast<void*>(partial),
                      static_cast<void*>(pos0), static_cast<void*>(arrivals), static_cast<void*>(tables)}) {
        VXQ_CUDA_CHECK(cudaFree(ptr));
    }
    return rows;
}

// A device cache of `kv` with layers enough for the working set (by the format's bits per
// element; a KIVI layer holds little more: its windows), every layer filled with ctx tokens
// (fill_cache), on a backend of its own; host: the chunk written (its first floats, the query).
struct FilledCache {
    std::unique_ptr<vxq::Backend> be;
    std::unique_ptr<vxq::KvCache> cache;
    int64_t layers = 0;
    std::vector<float> host;
};
FilledCache filled_cache(const std::string& kv, int64_t ctx, uint32_t seed) {
    using namespace vxq;
    FilledCache fc;
    fc.be = make_backend("cuda", 1);
    KvCacheOptions opts;
    opts.memory = fc.be->kv_memory();
    opts.flash_attn = true;
    const KvSpec spec = KvSpec::parse(kv);
    const double bpe = make_codec(spec.k, KvRole::Key, kHeadDim)->bits_per_element(kHeadDim);
    const size_t approx = size_t(double(ctx) * kHeadsKv * kHeadDim * 2 * bpe / 8);
    fc.layers = std::max<int64_t>(1, std::min<int64_t>(int64_t((kMinWorkingSet + approx - 1) / approx), 64));
    fc.cache = make_kv_cache(KvShape{fc.layers, kHeads, kHeadsKv, kHeadDim, ctx}, spec, opts);
    fc.host = fill_cache(*fc.be, *fc.cache, fc.layers, ctx, seed);
    return fc;
}

// The bytes one query's attention reads from a layer: every head's packed key blocks and value
// tokens (codes, scales, norms) and its fp16 window tokens.
size_t attended_bytes(const vxq::KvLayerView& view) {
    size_t bytes = 0;
    for (int64_t g = 0; g < kHeadsKv; ++g) {
        const vxq::KvHeadView& h = view.heads[g];
        bytes += size_t(h.k.n_packed / h.k.fmt.block_tokens) * h.k.fmt.block_bytes + size_t(h.v.n_packed) * h.v.fmt.block_bytes;
        bytes += size_t(2 * h.n_tokens - h.k.n_packed - h.v.n_packed) * kHeadDim * 2;
    }
    return bytes;
}

// A KIVI cache of ctx tokens (kivi:bits=bits) per layer, the KIVI attention of one query timed at
// its default split count (twice: A/A) and at each of `splits`.
std::vector<Row> run_kivi_case(int bits, int64_t ctx, const std::vector<int64_t>& splits, cudaStream_t st) {
    using namespace vxq;
    const std::string kv = "kivi:bits=" + std::to_string(bits);
    const FilledCache fc = filled_cache(kv, ctx, uint32_t(ctx) * 11 + uint32_t(bits));
    const std::vector<float>& host = fc.host;
    KvCache* cache = fc.cache.get();
    const int64_t layers = fc.layers;
    const KvLayerView view0 = cache->view(0);
    const size_t layer_bytes = attended_bytes(view0);  // packed keys and values with their zeros and scales, the windows
    cuda::KiviAttentionParams p{};
    p.n_q = 1;
    p.n_head = kHeads;
    p.n_head_kv = kHeadsKv;
    p.head_dim = kHeadDim;
    p.scale = 1.0f / std::sqrt(float(kHeadDim));
    p.kf = cuda::kivi_format(view0.heads[0].k);
    p.vf = cuda::kivi_format(view0.heads[0].v);
    const int64_t dflt = cuda::kivi_attention_splits(p);
    cuda::KiviAttentionParams p5 = p;  // the tensor-core form at 5 blocks an SM, where it takes them
    p5.blocks_per_sm = 5;
    const bool five = cuda::kivi_blocks_per_sm(p5) == 5;
    const int64_t dflt5 = cuda::kivi_attention_splits(p5);
    int64_t most = std::max(dflt, five ? dflt5 : 0);
    for (int64_t s : splits) most = std::max(most, s);
    float *q, *out, *partial;
    cuda::KiviHeadDev* tables;
    VXQ_CUDA_CHECK(cudaMalloc(&q, size_t(kHeads * kHeadDim) * 4));
    VXQ_CUDA_CHECK(cudaMalloc(&out, size_t(kHeads * kHeadDim) * 4));
    p.splits = most;
    VXQ_CUDA_CHECK(cudaMalloc(&partial, cuda::kivi_attention_scratch_floats(p) * 4));
    VXQ_CUDA_CHECK(cudaMalloc(&tables, size_t(layers * kHeadsKv) * sizeof(cuda::KiviHeadDev)));
    VXQ_CUDA_CHECK(cudaMemcpy(q, host.data(), size_t(kHeads * kHeadDim) * 4, cudaMemcpyHostToDevice));
    std::vector<cuda::KiviHeadDev> table(size_t(layers * kHeadsKv));
    for (int64_t l = 0; l < layers; ++l) {
        const KvLayerView view = cache->view(l);
        for (int64_t g = 0; g < kHeadsKv; ++g) table[size_t(l * kHeadsKv + g)] = cuda::kivi_head(view.heads[g]);
    }
    VXQ_CUDA_CHECK(cudaMemcpy(tables, table.data(), table.size() * sizeof(cuda::KiviHeadDev), cudaMemcpyHostToDevice));
    p.q = q;
    p.out = out;
    p.partial = partial;
    // Arms: the default form and splits (twice), the other splits, the tensor-core form at 5
    // blocks an SM with its splits, then the SIMT form at the default splits where the default is
    // the tensor-core form.
    struct Arm {
        int64_t splits, blocks;
        bool simt;
    };
    std::vector<Arm> arms = {{dflt, 0, false}, {dflt, 0, false}};
    for (int64_t s : splits) {
        if (s != dflt) arms.push_back({s, 0, false});
    }
    const bool tc = cuda::kivi_tensor_cores(p);
    const size_t n_auto = arms.size();
    if (five) arms.push_back({dflt5, 5, false});
    if (tc) arms.push_back({dflt, 0, true});
    const auto params = [&](size_t arm, int64_t layer) {
        cuda::KiviAttentionParams pl = p;
        pl.splits = arms[arm].splits;
        pl.blocks_per_sm = arms[arm].blocks;
        pl.simt = arms[arm].simt;
        pl.heads = tables + layer * kHeadsKv;
        return pl;
    };
    const std::vector<bench::Timing> ms = bench::time_interleaved(st, 40, int(arms.size()), [&](int arm, int i) {
        cuda::kivi_attention(params(size_t(arm), i % layers), st);
    });
    require_finite_output(out, kv, ctx);
    if (tc) {  // the two forms on layer 0: the same attention up to the summation order
        std::vector<float> o_tc(size_t(kHeads * kHeadDim)), o_simt(o_tc.size());
        cuda::kivi_attention(params(0, 0), st);
        VXQ_CUDA_CHECK(cudaMemcpyAsync(o_tc.data(), out, o_tc.size() * 4, cudaMemcpyDeviceToHost, st));
        cuda::kivi_attention(params(arms.size() - 1, 0), st);
        VXQ_CUDA_CHECK(cudaMemcpyAsync(o_simt.data(), out, o_simt.size() * 4, cudaMemcpyDeviceToHost, st));
        VXQ_CUDA_CHECK(cudaStreamSynchronize(st));
        double diff = 0.0, peak = 0.0;
        for (size_t e = 0; e < o_tc.size(); ++e) {
            diff = std::max(diff, double(std::fabs(o_tc[e] - o_simt[e])));
            peak = std::max(peak, double(std::fabs(o_simt[e])));
        }
        std::fprintf(stderr, "%s %lld tokens: tensor-core vs SIMT form, max |diff| %.3g of max |o| %.3g (%.2g relative)\n", kv.c_str(),
                     static_cast<long long>(ctx), diff, peak, diff / std::max(peak, 1e-30));
    }
    std::vector<Row> rows;
    for (size_t a = 0; a < arms.size(); ++a) {
        const int form = arms[a].simt || !tc ? -3 : arms[a].blocks == 5 ? -5 : -2;
        rows.push_back(Row{kv, ctx, layers, arms[a].splits, 32, 1, form, 0, 0, layer_bytes, ms[a].median * 1e3, ms[a].min * 1e3,
                           ms[a].max * 1e3, a == 1, a < n_auto && arms[a].splits == dflt});
    }
    rows.push_back(graph_row(rows[0], st, [&](int i) { cuda::kivi_attention(params(0, i % layers), st); }));
    for (void* ptr : {static_cast<void*>(q), static_cast<void*>(out), static_cast<void*>(partial), static_cast<void*>(tables)}) {
        VXQ_CUDA_CHECK(cudaFree(ptr));
    }
    return rows;
}

// An encoder's timings (ms per call, one by one and replayed in a CUDA graph) and bytes per call.
constexpr int kEncodeCalls = 40;
struct EncodeTiming {
    std::pair<vxq::bench::Timing, vxq::bench::Timing> ms;
    size_t bytes;
};

// An encoder's inputs: `copies` copies of `bytes` of N(0, 1) floats (device memory), rotated by
// the timing loop so more than kMinWorkingSet is read between two reads of the same rows.
float* rotated_inputs(size_t bytes, int64_t copies, uint32_t seed) {
    float* in;
    VXQ_CUDA_CHECK(cudaMalloc(&in, bytes * size_t(copies)));
    std::vector<float> host(bytes / sizeof(float));
    std::mt19937 rng{seed};
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (float& x : host) x = nd(rng);
    for (int64_t c = 0; c < copies; ++c) {
        VXQ_CUDA_CHECK(cudaMemcpy(reinterpret_cast<uint8_t*>(in) + size_t(c) * bytes, host.data(), bytes, cudaMemcpyHostToDevice));
    }
    return in;
}

// The encoder alone: store_kv of n tokens x kHeadsKv heads in format f, keys and values, from
// f32 rows (inputs rotated so > kMinWorkingSet is read between two reads of the same rows) into
// pages of n tokens per head. Returns ms per call and bytes (read + written) per call.
EncodeTiming run_encode(const Format& f, int64_t n, cudaStream_t st) {
    using namespace vxq;
    const size_t in_bytes = size_t(n * kHeadsKv * kHeadDim) * sizeof(float);  // k, and again v
    const size_t page_bytes = size_t(n * cuda::kv_token_bytes(f.code, kHeadDim));
    const int64_t copies = std::max<int64_t>(1, int64_t((kMinWorkingSet + 2 * in_bytes - 1) / (2 * in_bytes)));
    float* in;
    uint8_t* pages;
    cuda::KvHeadDev* heads;
    in = rotated_inputs(2 * in_bytes, copies, uint32_t(n));
    VXQ_CUDA_CHECK(cudaMalloc(&pages, 2 * page_bytes * size_t(kHeadsKv)));
    VXQ_CUDA_CHECK(cudaMalloc(&heads, size_t(kHeadsKv) * sizeof(cuda::KvHeadDev)));
    std::vector<cuda::KvHeadDev> table(static_cast<size_t>(kHeadsKv));
    for (int64_t g = 0; g < kHeadsKv; ++g) {
        uint8_t* k = pages + size_t(2 * g) * page_bytes;
        table[size_t(g)] = {uint64_t(reinterpret_cast<uintptr_t>(k)), uint64_t(reinterpret_cast<uintptr_t>(k + page_bytes)), 0, 0,
                            1.0f / 448.0f, 1.0f / 448.0f};  // fp8: |x| < 1 (the others ignore the scales)
    }
    VXQ_CUDA_CHECK(cudaMemcpy(heads, table.data(), table.size() * sizeof(cuda::KvHeadDev), cudaMemcpyHostToDevice));
    cuda::KvStoreParams p{};
    p.heads = heads;
    p.n = n;
    p.n_head_kv = kHeadsKv;
    p.head_dim = kHeadDim;
    p.k_code = p.v_code = f.code;
    const auto ms = bench::time_plain_and_graph(st, kEncodeCalls, [&](int i) {
        cuda::KvStoreParams pl = p;
        pl.k = reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(in) + size_t(i % copies) * 2 * in_bytes);
        pl.v = pl.k + in_bytes / sizeof(float);
        cuda::store_kv(pl, st);
    });
    for (void* ptr : {static_cast<void*>(in), static_cast<void*>(pages), static_cast<void*>(heads)}) VXQ_CUDA_CHECK(cudaFree(ptr));
    return {ms, 2 * in_bytes + 2 * page_bytes * size_t(kHeadsKv)};
}

// The KIVI store alone (kivi:bits=bits, G 32, R 128) flushing n tokens' keys and values of the
// kHeadsKv heads at once (kivi_store with a plan that encodes all n, nothing left for the
// window): bytes = the f32 rows read + the blocks written.
EncodeTiming run_kivi_encode(int bits, int64_t n, cudaStream_t st) {
    using namespace vxq;
    constexpr int kGroup = 32, kResidual = 128;
    const size_t in_bytes = size_t(n * kHeadsKv * kHeadDim) * sizeof(float);
    const size_t k_bytes = size_t(n / kGroup) * size_t(kHeadDim * (4 + kGroup * bits / 8));
    const size_t v_bytes = size_t(n) * size_t(kHeadDim / kGroup * (4 + kGroup * bits / 8));
    const int64_t copies = std::max<int64_t>(1, int64_t((kMinWorkingSet + 2 * in_bytes - 1) / (2 * in_bytes)));
    float* in;
    uint8_t* pages;
    cuda::KiviHeadDev* heads;
    KvWindowWrite* plan;
    in = rotated_inputs(2 * in_bytes, copies, uint32_t(n) + uint32_t(bits));
    VXQ_CUDA_CHECK(cudaMalloc(&pages, (k_bytes + v_bytes) * size_t(kHeadsKv)));
    VXQ_CUDA_CHECK(cudaMalloc(&heads, size_t(kHeadsKv) * sizeof(cuda::KiviHeadDev)));
    VXQ_CUDA_CHECK(cudaMalloc(&plan, 2 * sizeof(KvWindowWrite)));
    std::vector<cuda::KiviHeadDev> table(static_cast<size_t>(kHeadsKv));
    for (int64_t g = 0; g < kHeadsKv; ++g) {
        uint8_t* k = pages + size_t(g) * (k_bytes + v_bytes);
        table[size_t(g)] = {uint64_t(reinterpret_cast<uintptr_t>(k)), uint64_t(reinterpret_cast<uintptr_t>(k + k_bytes)), 0, 0,
                            0, 0, 0, 0, 0};
    }
    VXQ_CUDA_CHECK(cudaMemcpy(heads, table.data(), table.size() * sizeof(cuda::KiviHeadDev), cudaMemcpyHostToDevice));
    const KvWindowWrite ww[2] = {{0, 0, 0, kResidual, n / kGroup * kGroup}, {0, 0, 0, kResidual + 1, n}};
    VXQ_CUDA_CHECK(cudaMemcpy(plan, ww, sizeof ww, cudaMemcpyHostToDevice));
    cuda::KiviStoreParams p{};
    p.heads = heads;
    p.plan = plan;
    p.n = n;
    p.n_head_kv = kHeadsKv;
    p.head_dim = kHeadDim;
    p.kf = {bits, kGroup, int32_t(kHeadDim), int32_t(kHeadDim * (4 + kGroup * bits / 8)), kResidual};
    p.vf = {bits, kGroup, int32_t(kHeadDim / kGroup), int32_t(kHeadDim / kGroup * (4 + kGroup * bits / 8)), kResidual + 1};
    cuda::kivi_store_bounds(p, ww[0], ww[1]);  // nothing for the windows: no window kernel
    const auto ms = bench::time_plain_and_graph(st, kEncodeCalls, [&](int i) {
        cuda::KiviStoreParams pl = p;
        pl.k = reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(in) + size_t(i % copies) * 2 * in_bytes);
        pl.v = pl.k + in_bytes / sizeof(float);
        cuda::kivi_store(pl, st);
    });
    for (void* ptr : {static_cast<void*>(in), static_cast<void*>(pages), static_cast<void*>(heads), static_cast<void*>(plan)}) {
        VXQ_CUDA_CHECK(cudaFree(ptr));
    }
    return {ms, 2 * in_bytes + (k_bytes + v_bytes) * size_t(kHeadsKv)};
}

// A cache of a reader-policy codec (reader_attention.cuh: TurboQuant, VecInfer, QJL; F its keys'
// device format) of ctx tokens per layer, the attention of one query (and its merge) timed at its
// default split count (twice: A/A) and at each of `splits`; bytes = the packed blocks of keys and
// values and the fp16 windows (QJL's).
template <class F>
using ReaderParams = std::conditional_t<std::is_same_v<F, vxq::cuda::QjlFormatDev>, vxq::cuda::QjlAttentionParams,
                                        vxq::cuda::RotatedAttentionParams<F>>;
template <class F>
std::vector<Row> run_reader_case(const std::string& kv, int64_t ctx, const std::vector<int64_t>& splits, cudaStream_t st) {
    using namespace vxq;
    using P = ReaderParams<F>;
    using Head = std::remove_cvref_t<decltype(*P{}.heads)>;
    constexpr bool kQjl = std::is_same_v<F, vxq::cuda::QjlFormatDev>;
    const FilledCache fc = filled_cache(kv, ctx, uint32_t(ctx) * 13 + uint32_t(kv.size()));
    const std::vector<float>& host = fc.host;
    KvCache* cache = fc.cache.get();
    const int64_t layers = fc.layers;
    const size_t layer_bytes = attended_bytes(cache->view(0));
    const int64_t dflt = cuda::reader_attention_splits(1, kHeads, kHeadsKv);
    int64_t most = dflt;
    for (int64_t s : splits) most = std::max(most, s);
    float *q, *out, *partial;
    Head* tables;
    VXQ_CUDA_CHECK(cudaMalloc(&q, size_t(kHeads * kHeadDim) * 4));
    VXQ_CUDA_CHECK(cudaMalloc(&out, size_t(kHeads * kHeadDim) * 4));
    VXQ_CUDA_CHECK(cudaMalloc(&partial, cuda::reader_attention_scratch_floats(1, kHeads, kHeadDim, most) * 4));
    VXQ_CUDA_CHECK(cudaMalloc(&tables, size_t(layers * kHeadsKv) * sizeof(Head)));
    VXQ_CUDA_CHECK(cudaMemcpy(q, host.data(), size_t(kHeads * kHeadDim) * 4, cudaMemcpyHostToDevice));
    std::vector<Head> table(size_t(layers * kHeadsKv));
    std::vector<cuda::DeviceStateCopy<F>> states;  // per layer: keys, and values (the rotated codecs)
    std::vector<cuda::KiviFormatDev> values;       // per layer (QJL)
    const auto addr = [](const void* p) { return uint64_t(reinterpret_cast<uintptr_t>(p)); };
    for (int64_t l = 0; l < layers; ++l) {
        const KvLayerView view = cache->view(l);
        for (int64_t g = 0; g < kHeadsKv; ++g) {
            const KvHeadView& h = view.heads[g];
            if constexpr (kQjl) {
                table[size_t(l * kHeadsKv + g)] = cuda::kivi_head(h);
            } else {
                table[size_t(l * kHeadsKv + g)] = cuda::KvHeadDev{addr(kv_packed_blocks(h.k)), addr(kv_packed_blocks(h.v)), h.n_tokens, 0};
            }
        }
        const KvStreamView &ks = view.heads[0].k, &vs = view.heads[0].v;
        if constexpr (kQjl) {
            states.push_back(cuda::qjl_state_copy(*static_cast<const codecs::qjl::State*>(ks.fmt.layer_state)));
            states.back().f.slots = int32_t(ks.ring_slots);
            values.push_back(cuda::kivi_format(vs));
        } else {
            for (const KvStreamView* sv : {&ks, &vs}) {
                if constexpr (std::is_same_v<F, cuda::TurboFormatDev>) {
                    states.push_back(cuda::turbo_state_copy(*static_cast<const codecs::turbo::State*>(sv->fmt.layer_state)));
                } else {
                    states.push_back(cuda::vecinfer_state_copy(*static_cast<const codecs::vecinfer::State*>(sv->fmt.layer_state)));
                }
            }
        }
    }
    VXQ_CUDA_CHECK(cudaMemcpy(tables, table.data(), table.size() * sizeof(Head), cudaMemcpyHostToDevice));
    P p{};
    p.q = q;
    p.out = out;
    p.partial = partial;
    p.n_q = 1;
    p.n_head = kHeads;
    p.n_head_kv = kHeadsKv;
    p.head_dim = kHeadDim;
    p.scale = 1.0f / std::sqrt(float(kHeadDim));
    std::vector<int64_t> arms = {dflt, dflt};
    for (int64_t s : splits) {
        if (s != dflt) arms.push_back(s);
    }
    const auto params = [&](size_t arm, int64_t layer) {
        P pl = p;
        pl.splits = arms[arm];
        pl.heads = tables + layer * kHeadsKv;
        if constexpr (kQjl) {
            pl.kf = states[size_t(layer)].f;
            pl.vf = values[size_t(layer)];
        } else {
            pl.kf = states[size_t(2 * layer)].f;
            pl.vf = states[size_t(2 * layer + 1)].f;
        }
        return pl;
    };
    const std::vector<bench::Timing> ms = bench::time_interleaved(st, 40, int(arms.size()), [&](int arm, int i) {
        if constexpr (kQjl) {
            cuda::qjl_attention(params(size_t(arm), i % layers), st);
        } else if constexpr (std::is_same_v<F, cuda::TurboFormatDev>) {
            cuda::turbo_attention(params(size_t(arm), i % layers), st);
        } else {
            cuda::vecinfer_attention(params(size_t(arm), i % layers), st);
        }
    });
    require_finite_output(out, kv, ctx);
    std::vector<Row> rows;
    for (size_t a = 0; a < arms.size(); ++a) {
        rows.push_back(Row{kv, ctx, layers, arms[a], 32, 1, -4, 0, 0, layer_bytes, ms[a].median * 1e3, ms[a].min * 1e3,
                           ms[a].max * 1e3, a == 1, arms[a] == dflt});
    }
    for (cuda::DeviceStateCopy<F>& c : states) cuda::state_free(c);
    for (void* ptr : {static_cast<void*>(q), static_cast<void*>(out), static_cast<void*>(partial), static_cast<void*>(tables)}) {
        VXQ_CUDA_CHECK(cudaFree(ptr));
    }
    return rows;
}

}  // namespace

int main(int argc, char** argv) {
    using namespace vxq;
    try {
        std::vector<int64_t> contexts, split_counts, tiles, stages, streams, mmas, tmas, encode, kivi_splits, turbo_splits;
        std::vector<std::string> formats;
        bool only_encode = false;
        const auto list = [](const char* text, std::vector<int64_t>& out) {
            for (const char* c = text; *c;) {
                char* end = nullptr;
                out.push_back(std::strtoll(c, &end, 10));
                c = *end == ',' ? end + 1 : end;
                if (end == c && *c) break;
            }
        };
        for (int i = 1; i < argc; ++i) {
            const std::string a = argv[i];
            if (a == "--splits" && i + 1 < argc) {
                list(argv[++i], split_counts);
            } else if (a == "--tile" && i + 1 < argc) {
                list(argv[++i], tiles);
            } else if (a == "--stages" && i + 1 < argc) {
                list(argv[++i], stages);
            } else if (a == "--stream" && i + 1 < argc) {
                list(argv[++i], streams);
            } else if (a == "--mma" && i + 1 < argc) {
                list(argv[++i], mmas);
            } else if (a == "--tma" && i + 1 < argc) {
                list(argv[++i], tmas);
            } else if (a == "--kivi-splits" && i + 1 < argc) {
                list(argv[++i], kivi_splits);
            } else if (a == "--turbo-splits" && i + 1 < argc) {
                list(argv[++i], turbo_splits);
            } else if (a == "--formats" && i + 1 < argc) {
                for (const char* c = argv[++i]; *c;) {
                    const char* e = std::strchr(c, ',');
                    formats.emplace_back(c, e ? size_t(e - c) : std::strlen(c));
                    c = e ? e + 1 : c + std::strlen(c);
                }
            } else if (a == "--encode" && i + 1 < argc) {
                list(argv[++i], encode);
            } else if (a == "0") {
                only_encode = true;
            } else {
                contexts.push_back(std::atoll(argv[i]));
            }
        }
        for (int64_t n : encode) {
            if (n < 1 || n > (int64_t(1) << 20)) {
                std::fprintf(stderr, "vxq_gpu_attention: --encode takes token counts 1..1048576\n");
                return 1;
            }
        }
        const auto add = [](std::vector<int64_t>& v, int64_t x) {
            if (std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
        };
        for (const Format& f : kFormats) add(split_counts, cuda::attention_splits(1, kHeadsKv, f.code));
        for (const Format& f : kFormats) add(split_counts, cuda::attention_stream_tma_splits(kHeadsKv, f.code));
        add(tiles, cuda::kAttnSplitTile);
        add(stages, cuda::kAttnSplitStages);
        for (int64_t s : split_counts) {
            if (s < 1 || s > cuda::kAttnSplitMaxSplits) {
                std::fprintf(stderr, "vxq_gpu_attention: --splits takes 1..%d\n", cuda::kAttnSplitMaxSplits);
                return 1;
            }
        }
        std::vector<Config> configs;
        add(streams, -1);  // the backend's default ring
        for (int64_t sm : streams) {
            if (sm < -1 || sm > 4) {
                std::fprintf(stderr, "vxq_gpu_attention: --stream takes 0 (the tensor-core form) or 1..4 stages\n");
                return 1;
            }
        }
        add(mmas, -1);  // the backend's choice
        for (int64_t m : mmas) {
            if (m < -1 || m > 1) {
                std::fprintf(stderr, "vxq_gpu_attention: --mma takes 0 (the stream form's ring) or 1 (on tensor cores)\n");
                return 1;
            }
        }
        for (int64_t t : tiles)
            for (int64_t g : stages)
                for (int64_t s : split_counts)
                    for (int64_t sm : streams)
                        for (int64_t m : mmas) configs.push_back(Config{s, int(t), int(g), int(sm), int(m), 0});
        for (const Format& f : kFormats) add(tmas, cuda::attention_stream_tma_stages(f.code));  // the backend's ring depths
        for (int64_t tm : tmas) {
            if (tm < 0 || tm > 4) {
                std::fprintf(stderr, "vxq_gpu_attention: --tma takes 1..4 (the bulk-copy stream form's ring depth; 0: none)\n");
                return 1;
            }
            for (int64_t s : split_counts) {
                if (tm > 0) configs.push_back(Config{s, cuda::kAttnSplitTile, cuda::kAttnSplitStages, -1, -1, int(tm)});
            }
        }
        if (contexts.empty() && !only_encode) contexts = {1024, 4096, 16384, 32768, 65536, 131072};
        if (formats.empty()) formats = {"f16", "q8_0", "q4_0", "fp8", "kivi4", "kivi2"};
        for (const std::string& f : formats) {
            if (f != "f16" && f != "q8_0" && f != "q4_0" && f != "fp8" && f != "kivi4" && f != "kivi2" && f != "turbo4" &&
                f != "turbo3" && f != "turbo2" && f != "vecinfer" && f != "qjl") {
                std::fprintf(stderr, "vxq_gpu_attention: --formats takes f16, q8_0, q4_0, fp8, kivi4, kivi2, turbo4, turbo3, turbo2, "
                                     "vecinfer, qjl\n");
                return 1;
            }
        }
        cudaDeviceProp prop{};
        VXQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        cudaStream_t st;
        VXQ_CUDA_CHECK(cudaStreamCreate(&st));
        const double copy_gbs = bench::copy_bandwidth_gbs(st);
        std::printf("device: %s, %d SMs, L2 %d MB; d2d copy %.0f GB/s (read + write)\n", prop.name,
                    prop.multiProcessorCount, prop.l2CacheSize >> 20, copy_gbs);
        std::vector<std::string> encode_json;
        if (!encode.empty()) {
            std::printf("\n%d repetitions of %d calls (median, min-max), enqueued one by one and replayed from a CUDA graph (the "
                        "engine's way: no host launch cost), alternating\n",
                        bench::kGpuRepeats, kEncodeCalls);
            std::printf("\n| encode (store_kv) | tokens x 8 heads | MB/call (read + written) | us/call (min-max) | of copy | "
                        "in a graph: us/call (min-max) | of copy |\n");
            std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
            for (const std::string& fname : formats) {
                if (fname.starts_with("turbo") || fname == "vecinfer" || fname == "qjl") continue;  // (their stores have no timing here yet)
                const Format* fp = nullptr;
                for (const Format& f : kFormats) {
                    if (fname == f.kv) fp = &f;
                }
                const Format f = fp ? *fp : Format{fname == "kivi4" ? "kivi:bits=4" : "kivi:bits=2", cuda::KvCode::F16};
                for (int64_t n : encode) {
                    const EncodeTiming e = fp ? run_encode(f, n, st) : run_kivi_encode(fname == "kivi4" ? 4 : 2, n, st);
                    const bench::Timing &t = e.ms.first, &tg = e.ms.second;
                    const auto of_copy = [&](double ms) { return 100.0 * double(e.bytes) / (ms * 1e-3) / 1e9 / copy_gbs; };
                    std::printf("| %s | %lld | %.1f | %.1f (%.1f-%.1f) | %.0f%% | %.1f (%.1f-%.1f) | %.0f%% |\n", f.kv, (long long)n,
                                double(e.bytes) / 1e6, t.median * 1e3, t.min * 1e3, t.max * 1e3, of_copy(t.median), tg.median * 1e3,
                                tg.min * 1e3, tg.max * 1e3, of_copy(tg.median));
                    std::fflush(stdout);
                    char line[320];
                    std::snprintf(line, sizeof line,
                                  "{\"bench\": \"kv_encode\", \"kv\": \"%s\", \"tokens\": %lld, \"us\": %.2f, \"us_min\": %.2f, "
                                  "\"us_max\": %.2f, \"us_graph\": %.2f, \"us_graph_min\": %.2f, \"us_graph_max\": %.2f, "
                                  "\"repeats\": %d, \"bytes\": %zu, \"copy_gbs\": %.0f}",
                                  f.kv, (long long)n, t.median * 1e3, t.min * 1e3, t.max * 1e3, tg.median * 1e3, tg.min * 1e3,
                                  tg.max * 1e3, bench::kGpuRepeats, e.bytes, copy_gbs);
                    encode_json.push_back(line);
                }
            }
        }
        if (contexts.empty()) {
            for (const std::string& j : encode_json) std::printf("%s\n", j.c_str());
            return 0;
        }
        std::printf("\n%d interleaved repetitions of 40 calls per layout (median, min-max); '*' the backend's layout, "
                    "'A/A' the same layout again as a second arm (the noise floor)\n",
                    bench::kGpuRepeats);
        std::printf("\n| kv | context | layers rotated | splits | tile x stages | form | MB/call | us/call (min-max) | GB/s | of copy |\n");
        std::printf("| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |\n");
        std::vector<Row> rows;
        const auto kivi_bits = [](const std::string& f) { return f == "kivi4" ? 4 : f == "kivi2" ? 2 : 0; };
        const auto turbo_bits = [](const std::string& f) { return f.starts_with("turbo") ? f[5] - '0' : 0; };
        for (const std::string& fname : formats) {
            const Format* fmt = nullptr;
            for (const Format& f : kFormats) {
                if (fname == f.kv) fmt = &f;
            }
            for (int64_t ctx : contexts) {
                const std::vector<Row> case_rows =
                    fmt                   ? run_case(*fmt, ctx, configs, st)
                    : turbo_bits(fname)   ? run_reader_case<cuda::TurboFormatDev>("turbo:bits=" + std::to_string(turbo_bits(fname)), ctx,
                                                                                  turbo_splits, st)
                    : fname == "vecinfer" ? run_reader_case<cuda::VecinferFormatDev>("vecinfer:n=4,m=8,calib=random", ctx, turbo_splits, st)
                    : fname == "qjl"      ? run_reader_case<cuda::QjlFormatDev>("qjl", ctx, turbo_splits, st)
                                          : run_kivi_case(kivi_bits(fname), ctx, kivi_splits, st);
                for (const Row& r : case_rows) {
                    const double gbs = double(r.bytes) / (r.us * 1e-6) / 1e9;
                    char form[32];
                    std::snprintf(form, sizeof form,
                                  r.tma > 0         ? "bulk-copy ring x %d"
                                  : r.stream == -2 ? "kivi tensor cores"
                                  : r.stream == -3 ? "kivi SIMT"
                                  : r.stream == -4 ? "reader SIMT"
                                  : r.stream == -5 ? "kivi tensor cores 5/SM"
                                  : r.mma          ? "stream mma"
                                  : r.stream > 0   ? "stream x %d"
                                                   : "tensor cores",
                                  r.tma > 0 ? r.tma : r.stream);
                    std::printf("| %s | %lld | %lld | %lld | %d x %d%s | %s | %.1f | %.1f (%.1f-%.1f) | %.0f | %.0f%% |\n",
                                r.kv.c_str(), (long long)r.ctx, (long long)r.layers, (long long)r.splits, r.tile, r.stages,
                                r.graph ? "* graph" : r.aa ? " A/A" : r.dflt ? "*" : "", form, double(r.bytes) / 1e6, r.us, r.us_min, r.us_max, gbs,
                                100.0 * gbs / copy_gbs);
                    std::fflush(stdout);
                    rows.push_back(r);
                }
            }
        }
        for (const std::string& j : encode_json) std::printf("%s\n", j.c_str());
        for (const Row& r : rows) {
            std::printf("{\"bench\": \"decode_attention\", \"kv\": \"%s\", \"context\": %lld, \"splits\": %lld, "
                        "\"tile\": %d, \"stages\": %d, \"stream\": %d, \"mma\": %d, \"tma\": %d, \"aa\": %s, \"graph\": %s, \"us\": %.2f, \"us_min\": %.2f, \"us_max\": %.2f, "
                        "\"repeats\": %d, \"bytes\": %zu, \"copy_gbs\": %.0f}\n",
                        r.kv.c_str(), (long long)r.ctx, (long long)r.splits, r.tile, r.stages, r.stream, r.mma, r.tma, r.aa ? "true" : "false",
                        r.graph ? "true" : "false", r.us,
                        r.us_min, r.us_max, bench::kGpuRepeats, r.bytes, copy_gbs);
        }
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "vxq_gpu_attention: %s\n", e.what());
        return 1;
    }
}

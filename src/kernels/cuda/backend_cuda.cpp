#include "kernels/cuda/backend_cuda.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_mass.cuh"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/kivi.cuh"
#include "kernels/cuda/kv_memory.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/nccl_api.h"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/qjl_kv.cuh"
#include "kernels/cuda/rotated_kv.cuh"
#include "kv/kv_cache.h"
#include "kv/formats/qjl.h"
#include "kv/formats/turbo.h"
#include "kv/formats/vecinfer.h"
#include "kv/kv_view.h"

namespace vxq::cuda {

namespace {

// A device allocation that grows to the largest size asked for; the old contents are dropped.
template <class T>
struct DeviceArray {
    T* data = nullptr;
    size_t size = 0;  // elements
    T* reserve(size_t n) {
        if (n > size) {
            VXQ_CUDA_CHECK(cudaFree(data));
            data = nullptr;
            size = 0;
            VXQ_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data), std::max<size_t>(n, 1) * sizeof(T)));
            size = n;
        }
        return data;
    }
    void release() {
        cudaFree(data);  // destructor path: nothing useful to do with an error here
        data = nullptr;
        size = 0;
    }
};

// Page-locked host memory that grows (the source of the step's H2D copy and the target of the
// logits' D2H copy: a graph's memcpy nodes need pinned memory).
struct PinnedArray {
    uint8_t* data = nullptr;
    size_t size = 0;  // bytes
    void reserve(size_t n) {
        if (n <= size) return;
        VXQ_CUDA_CHECK(cudaFreeHost(data));
        data = nullptr;
        size = 0;
        VXQ_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&data), n));
        size = n;
    }
    void release() {
        cudaFreeHost(data);
        data = nullptr;
        size = 0;
    }
};

// A float parameter vector (norm weight, bias) on the device and the host contents it was made from.
struct DeviceParam {
    std::vector<float> host;
    DeviceArray<float> dev;
};

// The arguments of one recorded op: all 8-byte fields (no padding), so the bytes of the struct
// are exactly its values and can key a captured graph.
template <class T>
T zeroed() {
    T a;
    std::memset(&a, 0, sizeof a);
    return a;
}

enum class Op : uint64_t {
    Gemv, Embed, RmsNorm, Rope, Swiglu, Add, AddBias, Store, Attention, CopyOut, AttentionGemm, AttentionSplit, RopeStore,
    AttentionMass, KiviStore, KiviAttention, AllReduce, Gather, AttentionPrefill, TurboStore, TurboAttention,
    VecinferStore, VecinferAttention, QjlStore, QjlAttention
};
constexpr const char* kOpNames[] = {"gemv",     "embed",    "rms_norm",  "rope",     "swiglu",
                                    "add",      "add_bias", "kv store",  "attention", "copy out",
                                    "attention gemm", "attention split-K", "rope + kv store", "attention mass",
                                    "kivi store", "kivi attention", "all-reduce (NCCL)", "gather (NCCL)",
                                    "attention prefill", "turbo store", "turbo attention",
                                    "vecinfer store", "vecinfer attention", "qjl key store", "qjl attention"};
static_assert(std::size(kOpNames) == size_t(Op::QjlAttention) + 1);

// Tensor parallelism: a backend is rank `rank` of a group of `size` on GPU `device` (rank 0 of 1
// on GPU 0 alone); a group's ranks meet in NCCL collectives on their streams, recorded like any
// op, so a decode step stays one graph per GPU with its collectives in it.
constexpr int kMaxTp = 8;  // ranks of a group (GPUs of one host)

struct TpPlace {
    int device = 0, rank = 0, size = 1;
#if VXQ_HAVE_NCCL
    ncclComm_t comm = nullptr;  // owned by the backend (destroyed with it)
#endif
};

// The number of CUDA devices; vxq::Error "no CUDA device ..." where there is none.
int cuda_device_count() {
    int count = 0;
    const cudaError_t st = cudaGetDeviceCount(&count);
    if (st != cudaSuccess || count == 0) {
        cudaGetLastError();  // clear the sticky status of a failed probe
        fail("no CUDA device ({})", st != cudaSuccess ? cudaGetErrorString(st) : "the driver reports none");
    }
    return count;
}

// The CUDA backend. Ops are not launched when called: each is recorded (its launch and the bytes
// of its arguments) until something on the host needs a result (an output in host memory, a host
// copy, a buffer that must grow). Then the recorded pass runs: the first time as plain launches;
// when the same sequence of arguments comes again (the next decode step), it is captured once as
// a CUDA graph and from then on launched as one graph. What changes from step to step (token ids,
// positions, KV token counts and addresses, host inputs) is not an argument: each op writes it
// into a pinned "step block" whose copy to the device is the pass's first node, and its kernel
// reads it there. VXQ_CUDA_GRAPHS=0 turns capture off (every pass runs as plain launches).
class CudaBackend final : public Backend {
public:
    explicit CudaBackend(TpPlace tp = {}) : tp_(tp) {
        VXQ_ASSERT(tp_.device < cuda_device_count());
        VXQ_CUDA_CHECK(cudaSetDevice(tp_.device));
        cudaDeviceProp prop{};
        VXQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, tp_.device));
        device_name_ = fmt::format("{} (sm_{}{})", prop.name, prop.major, prop.minor);
        VXQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        for (StepBlock& b : steps_) VXQ_CUDA_CHECK(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming));
        const char* chunk = std::getenv("VXQ_CUDA_CHUNK_OPS");
        chunk_ops_ = chunk ? size_t(std::max(0, std::atoi(chunk))) : kChunkOps;
        const char* grow = std::getenv("VXQ_CUDA_CHUNK_GROW");
        chunk_grow_ = !(grow && std::string_view(grow) == "0");
        chunk_limit_ = chunk_ops_;
        const char* g = std::getenv("VXQ_CUDA_GRAPHS");
        graphs_on_ = !(g && std::string_view(g) == "0");
        const char* q8 = std::getenv("VXQ_CUDA_Q8_HANDOFF");
        q8_handoff_on_ = !(q8 && std::string_view(q8) == "0");
        const char* tile = std::getenv("VXQ_CUDA_ATTN_TILE");
        attn_tile_ = tile ? std::atoi(tile) : kAttnSplitTile;
        const char* stages = std::getenv("VXQ_CUDA_ATTN_STAGES");
        attn_stages_ = stages ? std::atoi(stages) : kAttnSplitStages;
        if (const char* ms = std::getenv("VXQ_CUDA_ATTN_MIN_STRETCH")) {  // split_stretch rounds it to whole granules
            attn_min_stretch_ = std::clamp(std::atoi(ms), kAttnSplitMinTokens, 1 << 20);
        }
        if (const char* l2 = std::getenv("VXQ_CUDA_L2_NEXT_MB")) l2_next_bytes_ = size_t(std::clamp(std::atoi(l2), 0, 1024)) << 20;
        const char* ef = std::getenv("VXQ_CUDA_WEIGHT_EVICT_FIRST");
        set_weight_evict_first(!(ef && std::string_view(ef) == "0"));
        const char* xr = std::getenv("VXQ_GEMV1_X_REGS");
        set_gemv1_x_in_registers(!(xr && std::string_view(xr) == "0"));
        if (const char* sm = std::getenv("VXQ_CUDA_ATTN_STREAM")) attn_stream_ = std::clamp(std::atoi(sm), 0, 4);
        if (const char* sm = std::getenv("VXQ_CUDA_ATTN_STREAM_MMA")) attn_stream_mma_ = std::clamp(std::atoi(sm), 0, 1);
        if (const char* tm = std::getenv("VXQ_CUDA_ATTN_TMA")) attn_tma_ = std::clamp(std::atoi(tm), 0, 4);
        if (const char* kp = std::getenv("VXQ_CUDA_KIVI_PREFILL_MIN")) kivi_prefill_min_ = std::max(1, std::atoi(kp));
        if (const char* kb = std::getenv("VXQ_CUDA_KIVI_BLOCKS")) kivi_blocks_ = std::atoi(kb) == 5 ? 5 : 0;
        if (const char* kf = std::getenv("VXQ_CUDA_KIVI_FUSE")) kivi_fuse_ = std::atoi(kf) != 0;
        if (const char* ke = std::getenv("VXQ_CUDA_KIVI_EARLY")) kivi_early_ = std::atoi(ke) != 0;
        if (const char* ke = std::getenv("VXQ_CUDA_KIVI_EVICT_FIRST")) kivi_evict_first_ = std::atoi(ke) != 0;
        if (const char* km = std::getenv("VXQ_CUDA_KIVI_MERGE_INSIDE")) kivi_merge_inside_ = std::atoi(km) != 0;
        if (const char* ke = std::getenv("VXQ_CUDA_KIVI_MERGE_EARLY")) kivi_merge_early_ = std::atoi(ke) != 0;
        if (const char* kq = std::getenv("VXQ_CUDA_KIVI_Q8_HANDOFF")) kivi_q8_handoff_ = std::atoi(kq) != 0;
        if (const char* ap = std::getenv("VXQ_CUDA_ATTN_PREFILL_MIN")) attn_prefill_min_ = std::max(1, std::atoi(ap));
        if (const char* sh = std::getenv("VXQ_CUDA_ATTN_SHORT")) {  // capped by the layout (attention_split_short_cap)
            attn_short_ = std::clamp(std::atoi(sh), 0, kAttnShortTokens);
        }
        const char* prof = std::getenv("VXQ_CUDA_PROFILE");
        profile_ = prof && std::string_view(prof) == "1";
        if (profile_) graphs_on_ = false;  // per-op events need plain launches
        graph_timing_ = prof && std::string_view(prof) == "graphs";
        if (prof && std::string_view(prof) == "timeline") start_timeline();
        kv_memory_ = make_device_kv_memory(tp_.device, fmt::format("GPU {} ({})", tp_.device, prop.name), [this] { drain(); });
    }
    ~CudaBackend() override {
        try {
            flush();
        } catch (...) {  // a destructor reports nothing; the error surfaced at the op that failed
        }
        cudaStreamSynchronize(stream_);
        print_kivi_fallbacks();
        print_profile();
        print_graph_timing();
        print_timeline();
        drop_graphs();
        for (auto& [ptr, w] : weights_) free_weight(w);
        for (auto& [ptr, p] : params_) p.dev.release();
        for (DeviceArray<float>& b : activations_) b.release();
        out_stage_.release();
        scores_.release();
        split_partial_.release();
        split_arrivals_.release();
        kivi_partial_.release();
        kivi_fallbacks_.release();
        kivi_arrivals_.release();
        reader_partial_.release();
        for (auto& [id, c] : turbo_states_) state_free(c);
        for (auto& [id, c] : vecinfer_states_) state_free(c);
        for (auto& [id, c] : qjl_states_) state_free(c);
        mass_.release();
        mass_stats_.release();
        mass_q8_.release();
        mass_q8_d_.release();
        q8_handoff_buf_.release();
        timeline_.buf.release();
        for (StepBlock& b : steps_) {
            b.dev.release();
            b.host.release();
            cudaEventDestroy(b.done);
        }
        out_host_.release();
        user_out_.release();
        gather_.release();
        cudaStreamDestroy(stream_);
#if VXQ_HAVE_NCCL
        if (tp_.comm && !aborted_) nccl_api().comm_destroy(tp_.comm);  // an aborted one is freed
#endif
    }

    std::string describe() const override {
        const std::string tp = tp_.size > 1 ? fmt::format(", tensor-parallel rank {} of {} (NCCL)", tp_.rank, tp_.size) : "";
        return fmt::format("cuda/{}, weights {:.1f} MiB on device, CUDA graphs {}{}", device_name_,
                           double(weight_bytes_) / (1 << 20), graphs_on_ ? "on" : "off (VXQ_CUDA_GRAPHS=0)", tp);
    }
    MemoryInfo memory_info() const override {
        size_t free = 0, total = 0;
        VXQ_CUDA_CHECK(cudaSetDevice(tp_.device));  // cudaMemGetInfo reports the calling thread's device
        VXQ_CUDA_CHECK(cudaMemGetInfo(&free, &total));
        return {total, free, fmt::format("GPU {} ({})", tp_.device, device_name_)};
    }
    void bind_thread() override { VXQ_CUDA_CHECK(cudaSetDevice(tp_.device)); }
    int tp_rank() const override { return tp_.rank; }
    int tp_size() const override { return tp_.size; }
    // With a communicator, also in a group of one (the tests' NCCL path on a single GPU).
    void all_reduce_sum(const float* send, float* recv, int64_t n) override {
#if VXQ_HAVE_NCCL
        if (!tp_.comm) return Backend::all_reduce_sum(send, recv, n);
        if (aborted_) fail("tensor parallelism: another rank failed");
        VXQ_ASSERT(is_device(send) && is_device(recv));
        struct A {
            const float* send;
            float* recv;
            uint64_t n;
            ncclComm_t comm;
        } a = zeroed<A>();
        a.send = send;
        a.recv = recv;
        a.n = uint64_t(n);
        a.comm = tp_.comm;
        record(Op::AllReduce, a, [](const A& a, cudaStream_t st) {
            nccl_check(nccl_api().all_reduce(a.send, a.recv, a.n, ncclFloat, ncclSum, a.comm, st), "all-reduce");
        });
#else
        Backend::all_reduce_sum(send, recv, n);
#endif
    }
    // Rank 0 receives the other ranks' blocks into gather_ (rank-major), lays them out as rows of
    // the whole width with 2-D copies, and copies that to `out` as its pass's output; the other
    // ranks send theirs and run their pass (nothing of theirs reaches the host).
    void gather_columns(const float* x, int64_t n_rows, std::span<const int64_t> widths, float* out) override {
#if VXQ_HAVE_NCCL
        if (!tp_.comm) return Backend::gather_columns(x, n_rows, widths, out);
        if (aborted_) fail("tensor parallelism: another rank failed");
        VXQ_ASSERT(is_device(x) && int(widths.size()) == tp_.size && tp_.size <= kMaxTp);
        struct A {
            const float* x;
            float* buf;   // [size][n_rows * widths[r]], then the gathered rows
            uint64_t n_rows, rank, size;
            int64_t widths[kMaxTp];
            ncclComm_t comm;
        } a = zeroed<A>();
        int64_t total = 0;
        for (int r = 0; r < tp_.size; ++r) total += (a.widths[r] = widths[size_t(r)]);
        a.x = x;
        a.n_rows = uint64_t(n_rows);
        a.rank = uint64_t(tp_.rank);
        a.size = uint64_t(tp_.size);
        a.comm = tp_.comm;
        a.buf = tp_.rank == 0 ? grow(gather_, size_t(2 * n_rows * total)) : nullptr;
        record(Op::Gather, a, [](const A& a, cudaStream_t st) {
            const auto& nc = nccl_api();
            const size_t rows = a.n_rows;
            if (a.rank != 0) {
                nccl_check(nc.send(a.x, rows * size_t(a.widths[a.rank]), ncclFloat, 0, a.comm, st), "send (gather)");
                return;
            }
            int64_t total = 0;
            for (uint64_t r = 0; r < a.size; ++r) total += a.widths[r];
            float* rows_out = a.buf + rows * size_t(total);  // the gathered [n_rows, total]
            nccl_check(nc.group_start(), "group start");
            size_t at = rows * size_t(a.widths[0]);
            for (uint64_t r = 1; r < a.size; ++r) {
                nccl_check(nc.recv(a.buf + at, rows * size_t(a.widths[r]), ncclFloat, int(r), a.comm, st), "recv (gather)");
                at += rows * size_t(a.widths[r]);
            }
            nccl_check(nc.group_end(), "group end");
            const float* block = a.x;  // rank 0's own block is read in place
            size_t col = 0, next = rows * size_t(a.widths[0]);
            for (uint64_t r = 0; r < a.size; ++r) {
                const size_t w = size_t(a.widths[r]);
                VXQ_CUDA_CHECK(cudaMemcpy2DAsync(rows_out + col, size_t(total) * sizeof(float), block, w * sizeof(float),
                                                 w * sizeof(float), rows, cudaMemcpyDeviceToDevice, st));
                col += w;
                if (r + 1 < a.size) {
                    block = a.buf + next;
                    next += rows * size_t(a.widths[r + 1]);
                }
            }
        });
        if (tp_.rank != 0) {
            // This rank's pass runs now (rank 0's waits for its send). The step ends here without
            // a host wait: start the next one as wait_stream() starts rank 0's, at the first step
            // block with the first pass's size, so every step records the same passes and replays
            // the same graphs (step_put waits for a block still in flight).
            flush();
            step_at_ = 0;
            chunk_limit_ = chunk_ops_;
            return;
        }
        VXQ_ASSERT(out);
        finish(out, gather_.data + n_rows * total, size_t(n_rows * total));
#else
        Backend::gather_columns(x, n_rows, widths, out);
#endif
    }
    // May come from another rank's thread while this one is inside a collective: NCCL's abort
    // makes that collective return an error.
    void tp_abort() override {
#if VXQ_HAVE_NCCL
        if (tp_.comm && !aborted_.exchange(true)) nccl_api().comm_abort(tp_.comm);
#endif
    }
    size_t weight_bytes() const override { return weight_bytes_; }
    size_t copied_weight_bytes(GgmlType type, size_t file_bytes) const override {  // weights.cpp's layouts
        if (type == GgmlType::TQ1_0) return file_bytes / sizeof(BlockTQ1_0) * sizeof(BlockTQ2_0);
        if (type == GgmlType::Q6_K) return file_bytes / sizeof(BlockQ6_K) * (kQK_K + kQK_K / 16 + 2);  // unpacked
        return file_bytes;
    }

    float* activation_buffer(int id, size_t n) override {
        VXQ_ASSERT(id >= 0);
        if (size_t(id) >= activations_.size()) activations_.resize(size_t(id) + 1);
        return grow(activations_[size_t(id)], n);
    }
    size_t activation_bytes() const override {
        size_t bytes = 0;
        for (const DeviceArray<float>& b : activations_) bytes += b.size * sizeof(float);
        return bytes;
    }
    void sync() override { drain(); }
    const float* to_host(const float* x, size_t n, int slot) override {
        if (!is_device(x)) return x;
        VXQ_ASSERT(slot >= 0);
        flush();
        if (size_t(slot) >= host_copies_.size()) host_copies_.resize(size_t(slot) + 1);
        std::vector<float>& h = host_copies_[size_t(slot)];
        h.resize(n);
        VXQ_CUDA_CHECK(cudaMemcpyAsync(h.data(), x, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
        VXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
        return h.data();
    }

    void matmul(const WeightView& w, const float* x, int64_t n, float* y) override {
        const DeviceWeight& dw = weight(w);
        scratch_for(gemv_scratch_bytes(dw, n));
        if (n == 1) q8_handoff_room(dw);
        float* yd = out(y, size_t(n * w.rows));
        step_reserve({host_bytes(x, size_t(n * w.cols))});
        struct A {
            const DeviceWeight* w;
            const float* x;
            int64_t n;
            float* y;
            void* scratch;
        } a = zeroed<A>();
        a.w = &dw;
        a.x = in(x, size_t(n * w.cols));
        a.n = n;
        a.y = yd;
        a.scratch = gemv_scratch_.buf;
        record(Op::Gemv, a, [this](const A& a, cudaStream_t st) { gemv(*a.w, a.x, a.n, a.y, gemv_scratch_, st); });
        group_gemv(dw, a.x, n, a.y, size_t(n * w.cols), size_t(n * w.rows));
        finish(y, a.y, size_t(n * w.rows));
    }
    void embed(const WeightView& table, const int32_t* ids, int64_t n, float* o) override {
        struct A {
            const DeviceWeight* w;
            const int32_t* ids;
            int64_t n;
            float* out;
        } a = zeroed<A>();
        a.w = &weight(table);
        a.out = out(o, size_t(n * table.cols));
        step_reserve({size_t(n) * sizeof(int32_t)});
        a.ids = static_cast<const int32_t*>(step_put(ids, size_t(n) * sizeof(int32_t)));
        a.n = n;
        record(Op::Embed, a, [](const A& a, cudaStream_t st) { embed_rows(*a.w, a.ids, a.n, a.out, st); });
        finish(o, a.out, size_t(n * table.cols));
    }
    void rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps, float* y) override {
        if (chunk_ops_ > 0 && pending_.size() >= chunk_limit_) {  // the GPU starts on what is recorded
            flush();
            if (chunk_grow_) chunk_limit_ *= 2;
        }
        struct A {
            const float* x;
            const float* w;
            int64_t n_rows, dim;
            double eps;
            float* y;
        } a = zeroed<A>();
        a.w = param(weight, size_t(dim));
        a.y = out(y, size_t(n_rows * dim));
        step_reserve({host_bytes(x, size_t(n_rows * dim))});
        a.x = in(x, size_t(n_rows * dim));
        a.n_rows = n_rows;
        a.dim = dim;
        a.eps = eps;
        record(Op::RmsNorm, a, [](const A& a, cudaStream_t st) { cuda::rms_norm(a.x, a.w, a.n_rows, a.dim, float(a.eps), a.y, st); });
        if (n_rows == 1) norm_ = NormArgs{pending_.size() - 1, a.x, a.w, a.y, dim, float(eps)};
        finish(y, a.y, size_t(n_rows * dim));
    }
    void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t pos0, const RopeParams& p) override {
        const size_t n = size_t(n_tokens * n_heads * head_dim);
        struct A {
            float* x;
            int64_t n_tokens, n_heads, head_dim;
            const int64_t* pos0;
            int64_t n_rot, neox;
            double freq_base;
        } a = zeroed<A>();
        step_reserve({host_bytes(x, n), sizeof pos0});
        a.x = inout(x, n);
        a.n_tokens = n_tokens;
        a.n_heads = n_heads;
        a.head_dim = head_dim;
        a.pos0 = static_cast<const int64_t*>(step_put(&pos0, sizeof pos0));
        a.n_rot = p.n_rot;
        a.neox = p.neox;
        a.freq_base = p.freq_base;
        record(Op::Rope, a, [](const A& a, cudaStream_t st) {
            cuda::rope(a.x, a.n_tokens, a.n_heads, a.head_dim, a.pos0, RopeParams{a.n_rot, float(a.freq_base), a.neox != 0}, st);
        });
        ropes_[0] = ropes_[1];
        ropes_[1] = RopeArgs{pending_.size() - 1, a.x, n_tokens, n_heads, head_dim, pos0, p};
        finish(x, a.x, n);
    }
    void swiglu(float* gate, const float* up, int64_t n_rows, int64_t n_ff) override {
        const size_t n = size_t(n_rows * n_ff);
        struct A {
            float* gate;
            const float* up;
            int64_t n;
        } a = zeroed<A>();
        step_reserve({host_bytes(gate, n), host_bytes(up, n)});
        a.gate = inout(gate, n);
        a.up = in(up, n);
        a.n = int64_t(n);
        record(Op::Swiglu, a, [](const A& a, cudaStream_t st) { cuda::swiglu(a.gate, a.up, a.n, st); });
        bool fused = false;
        if (n_rows == 1 && group_just_before() && group_.count == 2 && group_.n == 1 && group_.y[0] == a.gate && group_.y[1] == a.up &&
            group_.w[0]->rows == n_ff && group_.w[1]->rows == n_ff && !group_.fusion.resid) {
            GemvFusion f = group_.fusion;
            f.swiglu = true;
            fused = fuse_into_group(pending_.size() - 1, f, "gemv (swiglu)");
        }
        // Not taken by the gate/up kernel (Q8_0/Q4_0 have no SwiGLU epilogue): a candidate for
        // the next matmul's quantize kernel.
        if (!fused && n_rows == 1) swiglu_ = SwigluArgs{pending_.size() - 1, a.gate, a.up, n_ff};
        finish(gate, a.gate, n);
    }
    void add(float* x, const float* y, int64_t n) override {
        struct A {
            float* x;
            const float* y;
            int64_t n;
        } a = zeroed<A>();
        step_reserve({host_bytes(x, size_t(n)), host_bytes(y, size_t(n))});
        a.x = inout(x, size_t(n));
        a.y = in(y, size_t(n));
        a.n = n;
        record(Op::Add, a, [](const A& a, cudaStream_t st) { cuda::add(a.x, a.y, a.n, st); });
        // The residual add into the matmul's epilogue, unless x is something the kernel reads
        // (every block reads its input, and the norm's, before any adds).
        if (group_just_before() && group_.count == 1 && group_.n == 1 && group_.y[0] == a.y && group_.w[0]->rows == n &&
            !group_.fusion.swiglu && !overlaps(a.x, size_t(n), group_.x, size_t(group_.w[0]->cols)) &&
            !(group_.fusion.norm_in && overlaps(a.x, size_t(n), group_.fusion.norm_in, size_t(group_.w[0]->cols))) &&
            !(group_.fusion.swiglu_up && overlaps(a.x, size_t(n), group_.fusion.swiglu_up, size_t(group_.w[0]->cols)))) {
            GemvFusion f = group_.fusion;
            f.resid = a.x;
            fuse_into_group(pending_.size() - 1, f, "gemv (+ residual)");
        }
        finish(x, a.x, size_t(n));
    }
    void add_bias(float* x, const float* b, int64_t n_rows, int64_t dim) override {
        struct A {
            float* x;
            const float* b;
            int64_t n_rows, dim;
        } a = zeroed<A>();
        a.b = param(b, size_t(dim));
        step_reserve({host_bytes(x, size_t(n_rows * dim))});
        a.x = inout(x, size_t(n_rows * dim));
        a.n_rows = n_rows;
        a.dim = dim;
        record(Op::AddBias, a, [](const A& a, cudaStream_t st) { cuda::add_bias(a.x, a.b, a.n_rows, a.dim, st); });
        finish(x, a.x, size_t(n_rows * dim));
    }

    KvMemory* kv_memory() override { return kv_memory_.get(); }

    // The new tokens' slots are reserved in the cache's device pages (the bookkeeping is host
    // side); the store kernel fills them.
    void kv_write(KvCache& cache, int64_t layer, int64_t pos0, const float* k, const float* v, int64_t n) override {
        const KvShape& s = cache.shape();
        const size_t count = size_t(n * s.n_head_kv * s.head_dim);
        // The batch on the host, once, for an observer and for the codecs that calibrate on their
        // first batch (fp8's scales, as a host cache computes them: once per stream).
        KvObserver* obs = cache.observer();
        const bool calibrate = cache.wants_first_batch(layer, n);
        if (obs || calibrate) {
            const float* hk = to_host(k, count, 0);
            const float* hv = to_host(v, count, 1);
            if (obs) obs->on_write(layer, pos0, hk, hv, n);
            if (calibrate) cache.observe_first_batch(layer, hk, hv, n);
        }
        const KvWritePlan plan = cache.reserve_write(layer, pos0, n);
        const KvLayerView view = cache.view(layer);
        require_device(view);
        if (kivi_layer(view)) {
            kivi_write(view, plan, k, v, n, pos0);
            return;
        }
        if (const std::optional<QjlFormatDev> kf = qjl_layer(view)) {
            qjl_write(view, *kf, plan, k, v, n);
            return;
        }
        if (const Rotated r = rotated_layer(view); r != Rotated::None) {
            rotated_write(view, r, k, v, n);
            return;
        }
        const KvCodes codes = kv_codes(view);
        heads_.resize(size_t(s.n_head_kv));
        for (int64_t g = 0; g < s.n_head_kv; ++g) heads_[size_t(g)] = head_dev(view.heads[g], view.heads[g].n_tokens - n);
        struct A {
            const float* k;
            const float* v;
            const KvHeadDev* heads;
            int64_t n, n_head_kv, head_dim;
            KvCodes codes;
        } a = zeroed<A>();
        store_inputs(a, k, v, count, sizeof pos0);
        a.n = n;
        a.n_head_kv = s.n_head_kv;
        a.head_dim = s.head_dim;
        a.codes = codes;
        record(Op::Store, a, [](const A& a, cudaStream_t st) {
            store_kv(KvStoreParams{a.k, a.v, a.heads, a.n, a.n_head_kv, a.head_dim, a.codes.k, a.codes.v}, st);
        });
        // RoPE of q, RoPE of k, then this store (the model's order): one kernel, the same bits.
        const RopeArgs &rq = ropes_[0], &rk = ropes_[1];
        const size_t at = pending_.size() - 1;
        if (ropes_right_before(at, a.k, a.v, n, s.n_head_kv, s.head_dim, pos0)) {
            RopeStoreParams f{};
            f.q = rq.x;
            f.k = rk.x;
            f.v = a.v;
            f.heads = a.heads;
            f.pos0 = static_cast<const int64_t*>(step_put(&pos0, sizeof pos0));
            f.n = n;
            f.n_head = rq.n_heads;
            f.n_head_kv = s.n_head_kv;
            f.head_dim = s.head_dim;
            f.n_rot = rk.p.n_rot;
            f.theta_scale = std::pow(rk.p.freq_base, -2.0f / float(rk.p.n_rot));  // as cuda::rope computes it
            f.neox = rk.p.neox;
            f.k_code = codes.k;
            f.v_code = codes.v;
            drop_launch(rq.op);
            drop_launch(rk.op);
            pending_.back() = [f](cudaStream_t st) { rope_store_kv(f, st); };
            labels_.back() = kOpNames[size_t(Op::RopeStore)];
            rope_store_ = RopeStoreRec{at, f};
        }
    }

    void attention(const KvLayerView& view, const float* q, int64_t n_q, int64_t pos0, float* o,
                   float* const* token_mass) override {
        attend(view, q, n_q, pos0, o);
        if (token_mass != nullptr) add_attention_mass(view, q, n_q, pos0, token_mass);
    }

    std::string attention_path(const KvLayerView& view) const override {
        if (kivi_layer(view)) {
            const bool tc = kivi_tensor_cores(view.head_dim, kivi_format(view.heads[0].k), kivi_format(view.heads[0].v));
            return std::string("cuda kivi pages on the device: split-K KIVI kernel reading the packed codes and the fp16 window in "
                               "place, ") +
                   (tc ? "tensor cores on the packed tiles (codes as fp16 MMA operands against q * scale "
                                           "and p * scale split hi + lo), SIMT on the windows"
                                         : "SIMT (keys: q * scale per channel against the codes, values fma(code, s, z))") +
                   fmt::format(", f32 softmax; batches of >= {} queries (head_dim <= 128): the prefill form (64 query-head rows a "
                               "block on tensor cores, each tile dequantized once into hi/lo fp16)",
                               kivi_prefill_min_);
        }
        if (qjl_keys(view)) {
            return "cuda qjl pages on the device: split-K kernel reading the packed sign bits and the fp16 windows in place "
                   "(the query sketched once per block, a key block's outlier corrections once per tile, a token per lane "
                   "scored against the sketched query, KIVI-2 values a channel per lane), f32 softmax";
        }
        if (const Rotated r = rotated_layer(view); r != Rotated::None) {
            return fmt::format("cuda {} pages on the device: split-K kernel reading the packed indices in place (the query "
                               "{} once per block, scores a token per lane against the codebooks' centroids, values summed "
                               "in the rotated domain a channel per lane), f32 softmax; the merge {} once per (query, head)",
                               r == Rotated::Turbo ? "TurboQuant" : "VecInfer",
                               r == Rotated::Turbo ? "rotated (and for turbo-prod keys sketched)" : "smoothed and transformed",
                               r == Rotated::Turbo ? "un-rotates" : "transforms back");
        }
        for (int64_t g = 0; g < view.n_head_kv; ++g) {
            for (const KvStreamView* s : {&view.heads[g].k, &view.heads[g].v}) {
                if (!kv_code_of(s->fmt.kind)) {
                    return fmt::format("none: KV format {} has no CUDA reader", kv_format_kind_name(s->fmt.kind));
                }
            }
        }
        const KvCodes codes = kv_codes(view);
        // Past the short form, one query over f16 / fp8 or q8_0 / q4_0 pages (both sides of one kind) at head_dim 64 / 128:
        // the bulk-copy stream form.
        const auto tma_path = [&](KvCodes c) -> std::string_view {
            const bool takes = attn_tma_ != 0 && attention_stream_tma_formats(c.k, c.v, view.head_dim);
            return takes ? "; more: per-warp rings of TMA bulk copies on tensor cores, a kernel of its own" : "";
        };
        if (codes.k != KvCode::F16 || codes.v != KvCode::F16) {
            return fmt::format("cuda {} / {} pages on the device read in place by the split-K tensor-core kernel "
                               "(keys {}; one query over <= {} tokens: its short form, f32 FMAs{}), f32 softmax; batches of "
                               ">= {} queries (head_dim 64 / 128): the flash-style prefill kernel",
                               kv_format_kind_name(view.heads[0].k.fmt.kind), kv_format_kind_name(view.heads[0].v.fmt.kind),
                               codes.k == KvCode::F16   ? "against hi/lo fp16 splits of q"
                               : codes.k == KvCode::FP8 ? "as fp16 numbers (e4m3 exact) against hi/lo fp16 splits of q"
                                                        : "against the query quantized to q8_0, int8 MMA",
                               attn_short_, tma_path(codes), attn_prefill_min_);
        }
        return view.flash_attn
                   ? fmt::format("cuda f16 pages on the device, f32 softmax (-fa): split-K tensor-core kernel (one query "
                                 "over <= {} tokens: its short form, f32 FMAs{}); >= {} queries (head_dim 64 / 128): the "
                                 "flash-style prefill kernel; other batches of >= 16 queries: cuBLAS batched fp16 GEMMs "
                                 "on hi/lo fp16 splits of q and the probabilities",
                                 attn_short_, tma_path(codes), attn_prefill_min_)
                   : "cuda f16 pages on the device, fp16-rounded q and probabilities (llama.cpp non-flash); >= 16 "
                     "queries: cuBLAS batched fp16 GEMMs";
    }

private:
    // The attention itself: the prefill GEMMs, the split-K decode kernel or the one-block-per-row
    // kernel (attention.cuh says which takes what).
    void attend(const KvLayerView& view, const float* q, int64_t n_q, int64_t pos0, float* o) {
        require_device(view);
        if (kivi_layer(view)) {
            kivi_attend(view, q, n_q, pos0, o);
            return;
        }
        if (const std::optional<QjlFormatDev> kf = qjl_layer(view)) {
            qjl_attend(view, *kf, q, n_q, pos0, o);
            return;
        }
        if (const Rotated r = rotated_layer(view); r != Rotated::None) {
            rotated_attend(view, r, q, n_q, pos0, o);
            return;
        }
        const KvCodes codes = kv_codes(view);
        const bool f16 = codes.k == KvCode::F16 && codes.v == KvCode::F16;
        heads_.resize(size_t(view.n_head_kv));
        int64_t max_tokens = 1, min_tokens = INT64_MAX;
        for (int64_t g = 0; g < view.n_head_kv; ++g) {
            const KvHeadView& h = view.heads[g];
            heads_[size_t(g)] = head_dev(h, h.n_tokens);
            heads_[size_t(g)].evicted = evicted_before(h, n_q, pos0);
            max_tokens = std::max(max_tokens, h.n_tokens);
            min_tokens = std::min(min_tokens, h.n_tokens);
        }
        // The score rows' stride grows in steps, so a decode step's graph stays valid for
        // thousands of steps (a new stride is a new argument, hence one new capture).
        const int64_t step = n_q == 1 ? 4096 : 256;
        if (scores_stride_ < max_tokens || (n_q > 1 && scores_stride_ > max_tokens + step)) {
            scores_stride_ = (max_tokens + step - 1) / step * step;
        }
        const size_t n_out = size_t(n_q * view.n_head * view.head_dim);
        float* dev_out = out(o, n_out);
        // Prefill with flash-attention numerics (-fa, and every q8_0 / q4_0 / fp8 cache): the
        // flash-style kernel, one pass over the cache per 64 (query, head) rows.
        if ((view.flash_attn || !f16) && n_q >= attn_prefill_min_ &&
            attention_prefill_fits(view.n_head, view.n_head_kv, view.head_dim, codes.k, codes.v)) {
            SplitAttentionParams p = zeroed<SplitAttentionParams>();
            p.k_code = codes.k;
            p.v_code = codes.v;
            attention_inputs(p, view, q, n_q, pos0, dev_out);
            record(Op::AttentionPrefill, p, [](const SplitAttentionParams& p, cudaStream_t st) { attention_prefill(p, st); });
            finish(o, p.out, n_out);
            return;
        }
        // Other prefills of f16 pages (without -fa, or a shape the flash kernel does not take): the
        // batched GEMMs, which cover the same n_kv tokens in every head (a head with fewer would
        // have its keys read past its last mapped page).
        if (f16 && min_tokens == max_tokens &&
            attention_gemm_fits(n_q, view.n_head, view.head_dim, max_tokens, scores_stride_, dev_out)) {
            attention_gemm(view, q, n_q, pos0, o, dev_out, max_tokens);
            return;
        }
        // Decode with -fa, and every call on a q8_0 / q4_0 cache (the CPU reads those with its
        // fused kernel too, -fa or not): split-K over the tokens.
        const bool split = attention_split_fits(view.n_head, view.n_head_kv, view.head_dim, codes.k, codes.v);
        if (!f16 && !split) {
            fail("KV format {} / {} has no CUDA attention for {} query heads over {} KV heads of {} (GQA groups 1, 2, 3, "
                 "4, 8, head_dim a multiple of 32 up to {}); use --device cpu",
                 kv_format_kind_name(view.heads[0].k.fmt.kind), kv_format_kind_name(view.heads[0].v.fmt.kind),
                 view.n_head, view.n_head_kv, view.head_dim, kAttnSplitMaxHeadDim);
        }
        if ((view.flash_attn || !f16) && split) {
            SplitAttentionParams p = zeroed<SplitAttentionParams>();
            p.k_code = codes.k;
            p.v_code = codes.v;
            p.splits = attention_splits(n_q, view.n_head_kv, codes.k);
            // The splits' partials, sized once and before any step input is put (a reallocation
            // drains the pass): room for the bulk-copy kernel's own plan too, where it may be taken below.
            const int64_t most_splits =
                n_q == 1 && attn_tma_ != 0 ? std::max(p.splits, attention_stream_tma_splits(view.n_head_kv, codes.k)) : p.splits;
            p.partial = grow(split_partial_, attention_split_scratch_floats(n_q, view.n_head, view.head_dim, most_splits));
            p.arrivals = grow_zeroed(split_arrivals_, size_t(n_q * view.n_head_kv));
            attention_inputs(p, view, q, n_q, pos0, dev_out);
            p.tile = attn_tile_;
            p.stages = attn_stages_;
            p.min_stretch = attn_min_stretch_;
            if (!attention_split_tiling_fits(p)) {  // an override the layout (head_dim) does not fit: the default
                p.tile = kAttnSplitTile;
                p.stages = kAttnSplitStages;
            }
            p.short_tokens = std::min(attn_short_, attention_split_short_cap(p));
            if (n_q == 1 && attn_stream_ != 0) {  // the stream form (attention.cuh): a forced ring depth, else the default
                p.stream_stages = attn_stream_ > 0 ? attn_stream_ : 0;
                if (p.stream_stages == 0 || !attention_stream_fits(p)) p.stream_stages = attention_stream_stages(p);
                const bool mma = attn_stream_mma_ < 0 ? attention_stream_mma_default(p) : attn_stream_mma_ == 1 && attention_stream_mma_fits(p);
                p.stream_mma = mma ? 1 : 0;
            }
            // Past the short form's context, one query over f16 / fp8 or q8_0 / q4_0 pages: the bulk-copy stream
            // form (its own kernel, no short form: the graph changes once, at that depth).
            if (n_q == 1 && attn_tma_ != 0 && max_tokens > p.short_tokens) {
                SplitAttentionParams t = p;
                t.short_tokens = 0;
                t.tma_stages = attn_tma_ > 0 ? attn_tma_ : attention_stream_tma_stages(codes.k);
                t.splits = attention_stream_tma_splits(view.n_head_kv, codes.k);
                if (attention_stream_tma_fits(t)) p = t;  // (its partials: room made above)
            }
            // The step's RoPE + KV store, recorded right before for this layer: into this kernel.
            const RopeStoreRec& rs = rope_store_;
            const bool fuse_rope = rs.op != SIZE_MAX && rs.op + 1 == pending_.size() && attention_split_rope_fits(p, rs.f) &&
                                   std::equal(heads_.begin(), heads_.end(), step_host(rs.f.heads),
                                              [](const KvHeadDev& a, const KvHeadDev& b) { return a.k == b.k && a.v == b.v; });
            if (fuse_rope) {
                std::memcpy(&p.rope, &rs.f, sizeof p.rope);  // padding bytes too: they are part of the graph key
                drop_launch(pending_.size() - 1);
            }
            record(Op::AttentionSplit, p, [](const SplitAttentionParams& p, cudaStream_t st) { attention_split(p, st); });
            if (fuse_rope) labels_.back() = "attention split-K (rope + kv store)";
            attn_split_ = AttnSplitRec{pending_.size() - 1, p};
            finish(o, p.out, n_out);
            return;
        }
        F16AttentionParams p = zeroed<F16AttentionParams>();
        p.scores = grow(scores_, size_t(n_q * view.n_head * scores_stride_));
        attention_inputs(p, view, q, n_q, pos0, dev_out);
        p.max_tokens = scores_stride_;
        p.round_f16 = !view.flash_attn;  // the CPU backend's (llama.cpp's) non-flash numerics
        record(Op::Attention, p, [](const F16AttentionParams& p, cudaStream_t st) { attention_f16(p, st); });
        finish(o, p.out, n_out);
    }

    // The fields the decode attention kernels and the mass kernels take: inputs (q, the step's
    // position and heads table in the step block), shape and score scale. Called after every
    // grow of the call.
    template <class P>
    void attention_step_inputs(P& p, const KvLayerView& view, const float* q, int64_t n_q, int64_t pos0) {
        const size_t n_q_floats = size_t(n_q * view.n_head * view.head_dim);
        step_reserve({host_bytes(q, n_q_floats), sizeof pos0, heads_.size() * sizeof(KvHeadDev)});
        p.q = in(q, n_q_floats);
        p.pos0 = static_cast<const int64_t*>(step_put(&pos0, sizeof pos0));
        p.heads = static_cast<const KvHeadDev*>(step_put(heads_.data(), heads_.size() * sizeof(KvHeadDev)));
        p.n_q = n_q;
        p.n_head = view.n_head;
        p.n_head_kv = view.n_head_kv;
        p.head_dim = view.head_dim;
        p.scale = 1.0f / std::sqrt(float(view.head_dim));
    }
    // ... and the attention's output.
    template <class P>
    void attention_inputs(P& p, const KvLayerView& view, const float* q, int64_t n_q, int64_t pos0, float* dev_out) {
        p.out = dev_out;
        attention_step_inputs(p, view, q, n_q, pos0);
    }
    // A store's inputs: k and v (count floats each; host ones through the step block) and the
    // heads table heads_, with room kept for `extra` bytes the caller puts after them.
    template <class A>
    void store_inputs(A& a, const float* k, const float* v, size_t count, size_t extra = 0) {
        step_reserve({host_bytes(k, count), host_bytes(v, count), heads_.size() * sizeof(KvHeadDev), extra});
        a.k = in(k, count);
        a.v = in(v, count);
        a.heads = static_cast<const KvHeadDev*>(step_put(heads_.data(), heads_.size() * sizeof(KvHeadDev)));
    }

    // token_mass (backend.h): the mass kernels (attention_mass.cuh) are recorded after the
    // attention, over the same heads table, and the pass runs at once: the caller's arrays are
    // host memory, so the mass is copied back and added there, as finish() returns an output.
    void add_attention_mass(const KvLayerView& view, const float* q, int64_t n_q, int64_t pos0,
                            float* const* token_mass) {
        if (kivi_layer(view) || qjl_keys(view)) {
            fail("the attention mass (eviction scores, attention observers) over a KIVI or QJL cache has no CUDA kernel; use "
                 "--device cpu");
        }
        if (rotated_layer(view) != Rotated::None) {
            fail("the attention mass (eviction scores, attention observers) over a TurboQuant or VecInfer cache has no CUDA "
                 "kernel; use --device cpu");
        }
        const KvCodes codes = kv_codes(view);
        if (codes.k == KvCode::FP8) {
            fail("the attention mass (eviction scores, attention observers) over fp8 keys has no CUDA kernel; use --device "
                 "cpu");
        }
        int64_t max_tokens = 0;
        for (int64_t g = 0; g < view.n_head_kv; ++g) max_tokens = std::max(max_tokens, view.heads[g].n_tokens);
        if (n_q == 0 || max_tokens == 0) return;
        // The stride grows in steps, as the scores' does, so a decode step's pass keeps its
        // arguments (its graph) while the heads grow.
        if (mass_stride_ < max_tokens) mass_stride_ = (max_tokens + 1023) / 1024 * 1024;
        const size_t rows = size_t(n_q * view.n_head), n_q_floats = rows * size_t(view.head_dim);
        AttentionMassParams p = zeroed<AttentionMassParams>();
        p.mass = grow(mass_, size_t(view.n_head_kv * mass_stride_));
        p.stats = grow(mass_stats_, 2 * rows);
        if (codes.k != KvCode::F16) {
            p.q8 = grow(mass_q8_, n_q_floats);
            p.q8_d = grow(mass_q8_d_, rows * size_t(view.head_dim / kQBlock));
        }
        attention_step_inputs(p, view, q, n_q, pos0);
        p.stride = mass_stride_;
        p.k_code = codes.k;
        // The probabilities the CPU backend reports: fp16-rounded where its attention rounds them
        // (an f16/f16 cache without -fa, attention_f16_applies), f32 otherwise.
        p.round_f16 = !view.flash_attn && codes.k == KvCode::F16 && codes.v == KvCode::F16;
        record(Op::AttentionMass, p, [](const AttentionMassParams& p, cudaStream_t st) { attention_mass(p, st); });
        flush();
        mass_host_.resize(size_t(view.n_head_kv * max_tokens));
        VXQ_CUDA_CHECK(cudaMemcpy2DAsync(mass_host_.data(), size_t(max_tokens) * sizeof(float), p.mass,
                                         size_t(mass_stride_) * sizeof(float), size_t(max_tokens) * sizeof(float),
                                         size_t(view.n_head_kv), cudaMemcpyDeviceToHost, stream_));
        wait_stream();
        for (int64_t g = 0; g < view.n_head_kv; ++g) {
            const float* m = mass_host_.data() + g * max_tokens;
            for (int64_t t = 0; t < view.heads[g].n_tokens; ++t) token_mass[g][t] += m[t];
        }
    }

    // The prefill path (attention.cuh): split q, batched score GEMMs, softmax, batched P V GEMMs.
    // The scratch, the cuBLAS handle and the operand pointers are made here, at record time, so
    // the launch allocates nothing and can be captured. The operand pointers (page addresses,
    // scratch, out) travel in the step block like the heads table.
    void attention_gemm(const KvLayerView& view, const float* q, int64_t n_q, int64_t pos0, float* o, float* dev_out,
                        int64_t n_kv) {
        const size_t n_out = size_t(n_q * view.n_head * view.head_dim);
        F16AttentionGemmParams p = zeroed<F16AttentionGemmParams>();
        p.out = dev_out;
        p.n_q = n_q;
        p.n_head = view.n_head;
        p.n_head_kv = view.n_head_kv;
        p.head_dim = view.head_dim;
        p.n_kv = n_kv;
        p.stride = scores_stride_;
        p.scale = 1.0f / std::sqrt(float(view.head_dim));
        p.round_f16 = !view.flash_attn;
        const size_t need = attn_gemm_layout(p).total;
        if (need > attn_scratch_.bytes || !attn_scratch_.cublas) {
            drain();  // queued or recorded work may use the old allocation
            attn_scratch_.reserve(need);
        }
        p.scratch = attn_scratch_.buf;
        attn_operands_.resize(size_t(kAttnGemmOperands * view.n_head));
        attn_gemm_operands(p, heads_.data(), attn_operands_.data());
        const size_t operand_bytes = attn_operands_.size() * sizeof(const void*);
        step_reserve({host_bytes(q, n_out), sizeof pos0, heads_.size() * sizeof(KvHeadDev), operand_bytes});
        p.q = in(q, n_out);
        p.pos0 = static_cast<const int64_t*>(step_put(&pos0, sizeof pos0));
        p.heads = static_cast<const KvHeadDev*>(step_put(heads_.data(), heads_.size() * sizeof(KvHeadDev)));
        p.operands = static_cast<const void* const*>(step_put(attn_operands_.data(), operand_bytes));
        record(Op::AttentionGemm, p,
               [this](const F16AttentionGemmParams& p, cudaStream_t st) { attention_f16_gemm(p, attn_scratch_, st); });
        finish(o, p.out, n_out);
    }

    static constexpr const char* kHostCache =
        "this KV cache is in host memory; a cache that the CUDA backend reads is made with "
        "KvCacheOptions::memory = Backend::kv_memory()";

    void require_device(const KvLayerView& view) const {
        if (view.memory != kv_memory_.get()) fail("{}", kHostCache);
    }
    // A head's page addresses (its streams are contiguous) and a token count, as the kernels read them.
    static KvHeadDev head_dev(const KvHeadView& h, int64_t n_tokens) {
        return KvHeadDev{uint64_t(reinterpret_cast<uintptr_t>(kv_packed_blocks(h.k))),
                         uint64_t(reinterpret_cast<uintptr_t>(kv_packed_blocks(h.v))), n_tokens, 0, h.k.fmt.scale, h.v.fmt.scale};
    }
    // Positions before the batch that a head with its own positions (eviction) no longer holds:
    // the kernels assume the batch's n_q queries are the head's last stored tokens, at positions
    // pos0 .. pos0 + n_q - 1 (what a forward pass writes right before its attention), and every
    // earlier stored token before pos0; anything else is refused.
    static int64_t evicted_before(const KvHeadView& h, int64_t n_q, int64_t pos0) {
        if (h.pos == nullptr) return 0;
        const int64_t before = h.n_tokens - n_q;
        bool ok = before >= 0 && (before == 0 || h.pos[before - 1] < pos0);
        for (int64_t i = 0; ok && i < n_q; ++i) ok = h.pos[before + i] == pos0 + i;
        if (!ok) {
            fail("CUDA attention over evicted heads needs the {} queries (positions {}..) as each head's last stored "
                 "tokens; use --device cpu",
                 n_q, pos0);
        }
        return pos0 - before;
    }
    // The device format of a KV format kind, if the CUDA backend stores and reads it.
    static std::optional<KvCode> kv_code_of(KvFormatKind kind) {
        switch (kind) {
            case KvFormatKind::F16: return KvCode::F16;
            case KvFormatKind::Q8_0: return KvCode::Q8_0;
            case KvFormatKind::Q4_0: return KvCode::Q4_0;
            case KvFormatKind::FP8: return KvCode::FP8;
            default: return std::nullopt;
        }
    }
    static KvCode require_code(const KvStreamView& s, int64_t head_dim, const char* what) {
        const std::optional<KvCode> c = kv_code_of(s.fmt.kind);
        if (!c) {
            fail("KV format {} ({}) has no CUDA reader yet; the CUDA backend reads f16, q8_0, q4_0, fp8, KIVI, "
                 "TurboQuant, VecInfer and QJL caches; use --device cpu",
                 kv_format_kind_name(s.fmt.kind), what);
        }
        if (!kv_code_fits(*c, head_dim)) {
            fail("KV format {} needs head_dim % {} == 0, not {}", kv_format_kind_name(s.fmt.kind), kv_row_multiple(*c), head_dim);
        }
        return *c;
    }
    // Whether a layer is a KIVI cache (keys and values: the KIVI kernels read no other format),
    // refusing what they cannot read.
    static bool kivi_layer(const KvLayerView& view) {
        const bool k = view.heads[0].k.fmt.kind == KvFormatKind::KiviKey;
        const bool v = view.heads[0].v.fmt.kind == KvFormatKind::KiviValue;
        if ((!k && !v) || qjl_keys(view)) return false;  // (QJL's values are KIVI-2: qjl_layer)
        if (k != v) {
            fail("KV format {} / {}: the CUDA backend reads KIVI keys with KIVI values only; use --device cpu",
                 kv_format_kind_name(view.heads[0].k.fmt.kind), kv_format_kind_name(view.heads[0].v.fmt.kind));
        }
        if (!kivi_attention_fits(view.n_head, view.n_head_kv, view.head_dim)) {
            fail("KIVI on CUDA needs a GQA group of at most 8 and head_dim a multiple of 32 up to 256, not {} / {} heads "
                 "of {}; use --device cpu",
                 view.n_head, view.n_head_kv, view.head_dim);
        }
        return true;
    }
    void kivi_heads(const KvLayerView& view) {
        kivi_heads_.resize(size_t(view.n_head_kv));
        for (int64_t g = 0; g < view.n_head_kv; ++g) {
            if (view.heads[g].pos != nullptr) fail("KIVI and QJL on CUDA: a cache with evicted tokens; use --device cpu");
            kivi_heads_[size_t(g)] = kivi_head(view.heads[g]);
        }
    }

    // Whether the last two ops recorded before op `at` are the RoPE of q and the RoPE of k (the
    // model's order) with the same arguments and positions, k the store's input of n tokens of s's
    // shape at pos0 (device pointers), q apart from k and v: what a store may take on.
    bool ropes_right_before(size_t at, const float* k, const float* v, int64_t n, int64_t n_head_kv, int64_t head_dim,
                            int64_t pos0) const {
        const RopeArgs &rq = ropes_[0], &rk = ropes_[1];
        const size_t count = size_t(n * n_head_kv * head_dim), q_count = size_t(n * rq.n_heads * head_dim);
        return rq.op != SIZE_MAX && rq.op + 2 == at && rk.op + 1 == at && rk.x == k && rk.n_tokens == n &&
               rk.n_heads == n_head_kv && rk.head_dim == head_dim && rq.n_tokens == n && rq.head_dim == head_dim &&
               rq.pos0 == pos0 && rk.pos0 == pos0 && rq.p.n_rot == rk.p.n_rot && rq.p.freq_base == rk.p.freq_base &&
               rq.p.neox == rk.p.neox && !overlaps(rq.x, q_count, k, count) && !overlaps(rq.x, q_count, v, count) &&
               !overlaps(v, count, k, count);
    }

    // The store's parameters for a layer with KIVI's windows (KIVI, QJL): the inputs, the heads
    // and the plan in the step block (room for `extra` bytes more).
    KiviStoreParams kivi_store_params(const KvLayerView& view, const KvWritePlan& plan, const float* k, const float* v, int64_t n,
                                      size_t extra) {
        const size_t count = size_t(n * view.n_head_kv * view.head_dim);
        kivi_heads(view);
        const KvWindowWrite ww[2] = {plan.k, plan.v};
        KiviStoreParams a = zeroed<KiviStoreParams>();
        step_reserve({host_bytes(k, count), host_bytes(v, count), kivi_heads_.size() * sizeof(KiviHeadDev), sizeof ww, extra});
        a.k = in(k, count);
        a.v = in(v, count);
        a.heads = static_cast<const KiviHeadDev*>(step_put(kivi_heads_.data(), kivi_heads_.size() * sizeof(KiviHeadDev)));
        a.plan = static_cast<const KvWindowWrite*>(step_put(ww, sizeof ww));
        a.n = n;
        a.n_head_kv = view.n_head_kv;
        a.head_dim = view.head_dim;
        a.kf = kivi_format(view.heads[0].k);
        a.vf = kivi_format(view.heads[0].v);
        kivi_store_bounds(a, plan.k, plan.v);
        return a;
    }

    // A KIVI layer's write: the encoders and the window write (kivi.cuh) as the cache's plan says;
    // a decode step's RoPE of q and k, recorded right before, goes into the store's kernel.
    void kivi_write(const KvLayerView& view, const KvWritePlan& plan, const float* k, const float* v, int64_t n, int64_t pos0) {
        KiviStoreParams a = kivi_store_params(view, plan, k, v, n, sizeof pos0);
        const RopeArgs &rq = ropes_[0], &rk = ropes_[1];
        const bool rope = n == 1 && ropes_right_before(pending_.size(), a.k, a.v, n, view.n_head_kv, view.head_dim, pos0) &&
                          rq.n_heads == view.n_head && rk.p.n_rot > 0 && rk.p.n_rot % 2 == 0 && rk.p.n_rot <= view.head_dim;
        if (rope) {
            a.rope.q = rq.x;
            a.rope.k = rk.x;
            a.rope.pos0 = static_cast<const int64_t*>(step_put(&pos0, sizeof pos0));
            a.rope.n_head = rq.n_heads;
            a.rope.n_rot = rk.p.n_rot;
            a.rope.theta_scale = std::pow(rk.p.freq_base, -2.0f / float(rk.p.n_rot));  // as cuda::rope computes it
            a.rope.neox = rk.p.neox;
            drop_launch(rq.op);
            drop_launch(rk.op);
        }
        // The stored tokens before this write; whether the step before encoded ahead the values'
        // token this write encodes (then, for the attention's fused store, nothing is left to encode).
        const int64_t before = plan.v.packed + plan.v.pending;
        const auto ahead = kivi_ahead_.find(kivi_heads_[0].vw);
        const bool was_ahead = ahead != kivi_ahead_.end() && ahead->second == before;
        kivi_ahead_[kivi_heads_[0].vw] = -1;
        record(Op::KiviStore, a, [](const KiviStoreParams& a, cudaStream_t st) { kivi_store(a, st); });
        if (rope) labels_.back() = "kivi store (rope q, k)";
        if (rope && plan.k.encoded == 0 && (plan.v.encoded == 0 || (plan.v.encoded == 1 && was_ahead))) {
            kivi_store_ = KiviStoreRec{pending_.size() - 1, a, kivi_heads_[0].vw};
        }
    }

    // A KIVI layer's attention: the queries are the last n_q stored tokens of every head.
    void kivi_attend(const KvLayerView& view, const float* q, int64_t n_q, int64_t pos0, float* o) {
        attention_kivi_heads(view, n_q, pos0, "KIVI");
        const size_t n_out = size_t(n_q * view.n_head * view.head_dim);
        KiviAttentionParams p = zeroed<KiviAttentionParams>();
        p.prefill_min = kivi_prefill_min_;
        p.blocks_per_sm = kivi_blocks_;
        p.n_q = n_q;
        p.n_head = view.n_head;
        p.n_head_kv = view.n_head_kv;
        p.head_dim = view.head_dim;
        p.scale = 1.0f / std::sqrt(float(view.head_dim));
        p.kf = kivi_format(view.heads[0].k);
        p.vf = kivi_format(view.heads[0].v);
        p.splits = kivi_attention_splits(p);
        p.partial = grow(kivi_partial_, kivi_attention_scratch_floats(p));
        p.fallbacks = grow_zeroed(kivi_fallbacks_, 1);
        p.tiles_evict_first = kivi_evict_first_ ? 1 : 0;
        p.merge_launch_early = kivi_merge_early_ ? 1 : 0;
        if (kivi_merge_inside_ && !kivi_prefill(p)) p.arrivals = grow_zeroed(kivi_arrivals_, size_t(n_q * view.n_head_kv));
        p.out = out(o, n_out);
        step_reserve({host_bytes(q, n_out), kivi_heads_.size() * sizeof(KiviHeadDev)});
        p.q = in(q, n_out);
        p.heads = static_cast<const KiviHeadDev*>(step_put(kivi_heads_.data(), kivi_heads_.size() * sizeof(KiviHeadDev)));
        // A decode step: its merge encodes the values' next token ahead, and the store recorded
        // right before (this layer's, its short path, q and k rotated there) runs inside this
        // kernel instead (KiviFresh): one kernel and its boundary fewer a layer.
        const bool fuse = kivi_fuse_ && kivi_fused_store_fits(p);
        const KiviStoreRec& ks = kivi_store_;
        if (fuse && ks.op + 1 == pending_.size() && ks.ring == kivi_heads_[0].vw && ks.a.rope.q == p.q && ks.a.n == 1 &&
            ks.a.n_head_kv == p.n_head_kv && ks.a.head_dim == p.head_dim && ks.a.rope.n_rot / 2 <= kKiviMaxRopePairs) {
            p.fresh.q = ks.a.rope.q;
            p.fresh.k = ks.a.rope.k;
            p.fresh.v = ks.a.v;
            p.fresh.pos0 = ks.a.rope.pos0;
            p.fresh.n_rot = ks.a.rope.n_rot;
            p.fresh.theta_scale = ks.a.rope.theta_scale;
            p.fresh.neox = ks.a.rope.neox;
            p.fresh.early = kivi_early_ ? 1 : 0;
            drop_launch(ks.op);
        }
        p.pack_ahead = fuse ? 1 : 0;
        // (No packed block yet, so no address to encode into: the merge encodes nothing ahead.)
        if (fuse) kivi_ahead_[kivi_heads_[0].vw] = kivi_heads_[0].v != 0 ? kivi_heads_[0].n_tokens : -1;
        kivi_store_ = KiviStoreRec{};
        record(Op::KiviAttention, p, [](const KiviAttentionParams& p, cudaStream_t st) { kivi_attention(p, st); });
        if (p.fresh.k) labels_.back() = "kivi attention (rope q, k; store)";
        kivi_attn_ = KiviAttnRec{pending_.size() - 1, p};
        finish(o, p.out, n_out);
    }

    // The heads table of a layer with KIVI's windows for its attention, whose queries are the last
    // n_q stored tokens of every head (`what` names the codec when they are not).
    void attention_kivi_heads(const KvLayerView& view, int64_t n_q, int64_t pos0, const char* what) {
        kivi_heads(view);
        for (const KiviHeadDev& h : kivi_heads_) {
            if (h.n_tokens - n_q != pos0) {
                fail("{} on CUDA attends with the {} queries at positions {}.. as the last stored tokens; use --device cpu", what,
                     n_q, pos0);
            }
        }
    }

    // A reader-policy attention's parameters (reader_attention.cuh) for n_q queries into o, with
    // the formats (fetched first: a state copy's lookup may run and free what was recorded): the
    // shape, the splits, the partials' scratch and the output; q and the heads are the caller's.
    template <class P>
    P reader_attention_params(const KvLayerView& view, int64_t n_q, float* o, const decltype(P::kf)& kf,
                              const decltype(P::vf)& vf) {
        P p = zeroed<P>();
        p.n_q = n_q;
        p.n_head = view.n_head;
        p.n_head_kv = view.n_head_kv;
        p.head_dim = view.head_dim;
        p.splits = reader_attention_splits(n_q, view.n_head, view.n_head_kv);
        p.scale = 1.0f / std::sqrt(float(view.head_dim));
        p.kf = kf;
        p.vf = vf;
        p.partial = grow(reader_partial_, reader_attention_scratch_floats(n_q, view.n_head, view.head_dim, p.splits));
        p.out = out(o, size_t(n_q * view.n_head * view.head_dim));
        return p;
    }

    // Whether a layer is a cache of a rotated-domain codec (rotated_kv.cuh: TurboQuant keys and
    // values, or VecInfer keys and values: these kernels read no other format) and which, refusing
    // what they cannot read.
    enum class Rotated { None, Turbo, Vecinfer };
    static Rotated rotated_layer(const KvLayerView& view) {
        const auto family = [](KvFormatKind k) {
            return k == KvFormatKind::TurboMse || k == KvFormatKind::TurboRvq || k == KvFormatKind::TurboProd ? Rotated::Turbo
                   : k == KvFormatKind::VecInfer                                                           ? Rotated::Vecinfer
                                                                                                           : Rotated::None;
        };
        const KvFormatKind kk = view.heads[0].k.fmt.kind, vk = view.heads[0].v.fmt.kind;
        const Rotated k = family(kk), v = family(vk);
        if (k == Rotated::None && v == Rotated::None) return Rotated::None;
        if (k != v) {
            fail("KV format {} / {}: the CUDA backend reads TurboQuant keys with TurboQuant values and VecInfer keys with "
                 "VecInfer values only; use --device cpu",
                 kv_format_kind_name(kk), kv_format_kind_name(vk));
        }
        if (!reader_attention_fits(view.n_head, view.n_head_kv, view.head_dim)) {
            fail("{} on CUDA needs a GQA group of at most 8 and head_dim a multiple of 32 up to {}, not {} / {} heads of {}; "
                 "use --device cpu",
                 k == Rotated::Turbo ? "TurboQuant" : "VecInfer", kTurboMaxHeadDim, view.n_head, view.n_head_kv, view.head_dim);
        }
        return k;
    }
    // The heads table of such a layer with `n_new` tokens before the write (0: the attention's;
    // no eviction on the device: every head holds positions 0 .. n_tokens - 1).
    void rotated_heads(const KvLayerView& view, int64_t n_new) {
        heads_.resize(size_t(view.n_head_kv));
        for (int64_t g = 0; g < view.n_head_kv; ++g) {
            if (view.heads[g].pos != nullptr) fail("TurboQuant and VecInfer on CUDA: a cache with evicted tokens; use --device cpu");
            heads_[size_t(g)] = head_dev(view.heads[g], view.heads[g].n_tokens - n_new);
        }
    }
    // Each layer state (rotation, codebooks) is copied to the device once (rotated_kv.cuh:
    // DeviceStateCopy). Caches come and go (eval makes one per chunk, each with its own states):
    // past kStateCopyBudget bytes of copies, the recorded and queued work is run and every copy
    // freed before new ones are made (before any of a call's lookups).
    static constexpr size_t kStateCopyBudget = size_t(64) << 20;
    void state_copies_within_budget() {
        if (state_copy_bytes_ <= kStateCopyBudget) return;
        drain();
        drop_graphs();
        for (auto& [id, c] : turbo_states_) state_free(c);
        for (auto& [id, c] : vecinfer_states_) state_free(c);
        for (auto& [id, c] : qjl_states_) state_free(c);
        turbo_states_.clear();
        vecinfer_states_.clear();
        qjl_states_.clear();
        state_copy_bytes_ = 0;
    }
    template <class State, class Copy>
    auto device_format(const KvStreamView& s, std::unordered_map<uint64_t, Copy>& copies, Copy (*copy)(const State&)) {
        const auto* st = static_cast<const State*>(s.fmt.layer_state);
        VXQ_ASSERT(st != nullptr);
        if (const auto it = copies.find(st->id()); it != copies.end()) return it->second.f;
        const Copy& c = copies[st->id()] = copy(*st);
        state_copy_bytes_ += c.bytes;
        return c.f;
    }
    template <class F>
    std::pair<F, F> rotated_formats(const KvLayerView& view) {
        state_copies_within_budget();
        if constexpr (std::is_same_v<F, TurboFormatDev>) {
            return {device_format(view.heads[0].k, turbo_states_, turbo_state_copy),
                    device_format(view.heads[0].v, turbo_states_, turbo_state_copy)};
        } else {
            return {device_format(view.heads[0].k, vecinfer_states_, vecinfer_state_copy),
                    device_format(view.heads[0].v, vecinfer_states_, vecinfer_state_copy)};
        }
    }
    // Such a layer's write: a warp per (token, KV head, role) encodes into the new slots.
    void rotated_write(const KvLayerView& view, Rotated r, const float* k, const float* v, int64_t n) {
        if (r == Rotated::Turbo) {
            rotated_store<TurboFormatDev>(Op::TurboStore, view, k, v, n, turbo_store);
        } else {
            rotated_store<VecinferFormatDev>(Op::VecinferStore, view, k, v, n, vecinfer_store);
        }
    }
    template <class F>
    void rotated_store(Op op, const KvLayerView& view, const float* k, const float* v, int64_t n,
                       void (*store)(const RotatedStoreParams<F>&, cudaStream_t)) {
        const size_t count = size_t(n * view.n_head_kv * view.head_dim);
        rotated_heads(view, n);
        RotatedStoreParams<F> a = zeroed<RotatedStoreParams<F>>();
        std::tie(a.kf, a.vf) = rotated_formats<F>(view);
        store_inputs(a, k, v, count);
        a.n = n;
        a.n_head_kv = view.n_head_kv;
        a.head_dim = view.head_dim;
        record(op, a, [store](const RotatedStoreParams<F>& a, cudaStream_t st) { store(a, st); });
    }
    // Such a layer's attention: the queries are the last n_q stored tokens of every head.
    void rotated_attend(const KvLayerView& view, Rotated r, const float* q, int64_t n_q, int64_t pos0, float* o) {
        if (r == Rotated::Turbo) {
            rotated_attention<TurboFormatDev>(Op::TurboAttention, view, q, n_q, pos0, o, turbo_attention);
        } else {
            rotated_attention<VecinferFormatDev>(Op::VecinferAttention, view, q, n_q, pos0, o, vecinfer_attention);
        }
    }
    template <class F>
    void rotated_attention(Op op, const KvLayerView& view, const float* q, int64_t n_q, int64_t pos0, float* o,
                           void (*attention)(const RotatedAttentionParams<F>&, cudaStream_t)) {
        rotated_heads(view, 0);
        for (const KvHeadDev& h : heads_) {
            if (h.n_tokens - n_q != pos0) {
                fail("TurboQuant and VecInfer on CUDA attend with the {} queries at positions {}.. as the last stored "
                     "tokens; use --device cpu",
                     n_q, pos0);
            }
        }
        const auto [kf, vf] = rotated_formats<F>(view);
        RotatedAttentionParams<F> p = reader_attention_params<RotatedAttentionParams<F>>(view, n_q, o, kf, vf);
        const size_t n_out = size_t(n_q * view.n_head * view.head_dim);
        step_reserve({host_bytes(q, n_out), heads_.size() * sizeof(KvHeadDev)});
        p.q = in(q, n_out);
        p.heads = static_cast<const KvHeadDev*>(step_put(heads_.data(), heads_.size() * sizeof(KvHeadDev)));
        record(op, p, [attention](const RotatedAttentionParams<F>& p, cudaStream_t st) { attention(p, st); });
        finish(o, p.out, n_out);
    }

    // The keys' device format if a layer is a QJL cache (qjl_kv.cuh: QJL keys with their KIVI-2
    // values; the layer state's copy and the window's ring), refusing what the kernels cannot read.
    static bool qjl_keys(const KvLayerView& view) { return view.heads[0].k.fmt.kind == KvFormatKind::Qjl; }
    std::optional<QjlFormatDev> qjl_layer(const KvLayerView& view) {
        if (!qjl_keys(view)) return std::nullopt;
        if (view.heads[0].v.fmt.kind != KvFormatKind::KiviValue) {
            fail("KV format qjl / {}: the CUDA backend reads QJL keys with their KIVI-2 values only; use --device cpu",
                 kv_format_kind_name(view.heads[0].v.fmt.kind));
        }
        state_copies_within_budget();
        QjlFormatDev kf = device_format(view.heads[0].k, qjl_states_, qjl_state_copy);
        kf.slots = int32_t(view.heads[0].k.ring_slots);
        if (!qjl_attention_fits(kf, kivi_format(view.heads[0].v), view.n_head, view.n_head_kv, view.head_dim)) {
            fail("QJL on CUDA needs a GQA group of at most 8, head_dim a multiple of 32 up to 256, KIVI-2 values and sketches "
                 "whose rows (m {} + m_o {} per query row) fit the GPU's shared memory, not {} / {} heads of {}; use --device cpu",
                 kf.m, kf.mo, view.n_head, view.n_head_kv, view.head_dim);
        }
        return kf;
    }
    // A QJL layer's write: the key blocks it flushes (qjl_key_store), then the values and both
    // windows (kivi_store with the keys encoded elsewhere). The model's RoPE kernels stay: the key
    // store reads the rotated keys.
    void qjl_write(const KvLayerView& view, const QjlFormatDev& kf, const KvWritePlan& plan, const float* k, const float* v,
                   int64_t n) {
        KiviStoreParams a = kivi_store_params(view, plan, k, v, n, 0);
        QjlKeyStoreParams s = zeroed<QjlKeyStoreParams>();
        s.k = a.k;
        s.heads = a.heads;
        s.plan = a.plan;  // the keys' plan first
        s.n = n;
        s.n_head_kv = a.n_head_kv;
        s.head_dim = a.head_dim;
        s.kf = kf;
        record(Op::QjlStore, s, [](const QjlKeyStoreParams& s, cudaStream_t st) { qjl_key_store(s, st); });
        a.kf.bits = 0;
        a.kf.group = 32;
        record(Op::KiviStore, a, [](const KiviStoreParams& a, cudaStream_t st) { kivi_store(a, st); });
    }
    // A QJL layer's attention (the reader-policy kernel with QjlReader).
    void qjl_attend(const KvLayerView& view, const QjlFormatDev& kf, const float* q, int64_t n_q, int64_t pos0, float* o) {
        attention_kivi_heads(view, n_q, pos0, "QJL");
        QjlAttentionParams p = reader_attention_params<QjlAttentionParams>(view, n_q, o, kf, kivi_format(view.heads[0].v));
        const size_t n_out = size_t(n_q * view.n_head * view.head_dim);
        step_reserve({host_bytes(q, n_out), kivi_heads_.size() * sizeof(KiviHeadDev)});
        p.q = in(q, n_out);
        p.heads = static_cast<const KiviHeadDev*>(step_put(kivi_heads_.data(), kivi_heads_.size() * sizeof(KiviHeadDev)));
        record(Op::QjlAttention, p, [](const QjlAttentionParams& p, cudaStream_t st) { qjl_attention(p, st); });
        finish(o, p.out, n_out);
    }

    // The formats of a layer's keys and values (the same in every head).
    static KvCodes kv_codes(const KvLayerView& view) {
        return KvCodes{require_code(view.heads[0].k, view.head_dim, "keys"), require_code(view.heads[0].v, view.head_dim, "values")};
    }

    // ---- the recorded pass -------------------------------------------------------------------
    struct Graph {
        std::vector<uint8_t> key;
        cudaGraphExec_t exec = nullptr;  // captured the second time the key is seen
    };

    template <class A, class F>
    void record(Op op, const A& a, F f) {
        static_assert(std::is_trivially_copyable_v<A>);
        const auto* kind = reinterpret_cast<const uint8_t*>(&op);
        key_.insert(key_.end(), kind, kind + sizeof op);
        const auto* bytes = reinterpret_cast<const uint8_t*>(&a);
        key_.insert(key_.end(), bytes, bytes + sizeof a);
        pending_.push_back([a, f](cudaStream_t st) { f(a, st); });
        labels_.push_back(kOpNames[size_t(op)]);
    }

    // Runs the recorded ops (see the class comment) and starts a new pass. Returns without waiting.
    void flush() {
        if (pending_.empty()) {
            step_used_ = 0;
            return;
        }
        const uintptr_t tail[3] = {reinterpret_cast<uintptr_t>(sb().host.data), reinterpret_cast<uintptr_t>(sb().dev.data),
                                   step_used_};
        const auto* tb = reinterpret_cast<const uint8_t*>(tail);
        key_.insert(key_.end(), tb, tb + sizeof tail);
        Graph* g = nullptr;
        if (graphs_on_) {
            const size_t h = std::hash<std::string_view>{}(
                std::string_view(reinterpret_cast<const char*>(key_.data()), key_.size()));
            auto it = graphs_.find(h);
            if (it != graphs_.end() && it->second.key == key_) {
                g = &it->second;
            } else {
                if (graphs_.size() >= kMaxGraphs) drop_graphs();
                graphs_[h] = Graph{key_, nullptr};  // seen once: run as plain launches this time
            }
        }
        try {
            if (g && !g->exec) capture(*g);
            if (timeline_.count) VXQ_CUDA_CHECK(cudaMemsetAsync(timeline_.count, 0, sizeof(unsigned), stream_));
            if (g) {
                cudaEvent_t* ev = graph_timing_ ? graph_event_pair() : nullptr;
                if (ev) VXQ_CUDA_CHECK(cudaEventRecord(ev[0], stream_));
                VXQ_CUDA_CHECK(cudaGraphLaunch(g->exec, stream_));
                if (ev) VXQ_CUDA_CHECK(cudaEventRecord(ev[1], stream_));
            } else {
                run_pending();
            }
        } catch (...) {
            clear_pass();
            throw;
        }
        if (timeline_.count) read_timeline();
        VXQ_CUDA_CHECK(cudaEventRecord(sb().done, stream_));
        sb().in_flight = true;
        step_at_ = (step_at_ + 1) % kStepBlocks;  // the next pass puts into the next block
        clear_pass();
    }
    void run_pending() {
        if (step_used_ > 0) {
            VXQ_CUDA_CHECK(cudaMemcpyAsync(sb().dev.data, sb().host.data, step_used_, cudaMemcpyHostToDevice, stream_));
        }
        if (!profile_) {
            for (const auto& launch : pending_) launch(stream_);
            return;
        }
        while (prof_events_.size() < 2 * pending_.size()) {
            cudaEvent_t e = nullptr;
            VXQ_CUDA_CHECK(cudaEventCreate(&e));
            prof_events_.push_back(e);
        }
        for (size_t i = 0; i < pending_.size(); ++i) {
            if (labels_[i]) VXQ_CUDA_CHECK(cudaEventRecord(prof_events_[2 * i], stream_));
            pending_[i](stream_);
            if (labels_[i]) VXQ_CUDA_CHECK(cudaEventRecord(prof_events_[2 * i + 1], stream_));
        }
        VXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
        for (size_t i = 0; i < pending_.size(); ++i) {
            if (!labels_[i]) continue;
            float ms = 0.0f;
            VXQ_CUDA_CHECK(cudaEventElapsedTime(&ms, prof_events_[2 * i], prof_events_[2 * i + 1]));
            auto& [calls, total] = profile_by_op_[labels_[i]];
            ++calls;
            total += ms;
        }
    }
    // No silent slow path: where KIVI's tensor-core attention met keys or values whose fp16 parts
    // overflow and redid those stretches in the SIMT form, say so at the end.
    void print_kivi_fallbacks() {
        int n = 0;
        if (kivi_fallbacks_.size == 0 || cudaMemcpy(&n, kivi_fallbacks_.data, sizeof n, cudaMemcpyDeviceToHost) != cudaSuccess || n == 0) return;
        std::fprintf(stderr,
                     "vxq: note: KIVI's tensor-core attention met keys or values past its fp16 parts' range (|q s| or |p s| > 255.9) "
                     "and redid %d warps' stretches in the slower SIMT form\n",
                     n);
    }
    // VXQ_CUDA_PROFILE=1: GPU time per op kind (events around each launch, plain launches;
    // VXQ_CUDA_PDL=0 keeps kernels from overlapping across the events), on stderr at the end.
    void print_profile() {
        if (!profile_) return;
        double all = 0.0;
        for (const auto& [name, ct] : profile_by_op_) all += ct.second;
        std::fprintf(stderr, "vxq: CUDA profile (VXQ_CUDA_PROFILE=1), %.3f ms of GPU time in ops:\n", all);
        for (const auto& [name, ct] : profile_by_op_) {
            std::fprintf(stderr, "vxq:   %-28s %8lld calls %10.3f ms %5.1f %% %9.2f us/call\n", name.c_str(),
                         (long long)ct.first, ct.second, 100.0 * ct.second / std::max(all, 1e-9),
                         1e3 * ct.second / double(std::max<int64_t>(ct.first, 1)));
        }
        if (l2_next_bytes_) std::fprintf(stderr, "vxq:   L2 next (VXQ_CUDA_L2_NEXT_MB): %lld matmul groups linked\n", (long long)l2_links_);
        for (cudaEvent_t e : prof_events_) cudaEventDestroy(e);
        prof_events_.clear();
    }
    // VXQ_CUDA_PROFILE=graphs (graphs and PDL as in a normal run): the GPU time of every graph
    // launch (events around it) against the host's wall time over the same launches, and where
    // the host's time goes between two outputs it waits for (finish): recording the ops, the
    // flush (key, lookup, launch), waiting for the GPU, the copy into the caller's buffer. At exit.
    cudaEvent_t* graph_event_pair() {
        if (graph_events_.empty()) graph_wall0_ = std::chrono::steady_clock::now();
        graph_events_.emplace_back();
        for (cudaEvent_t& e : graph_events_.back()) VXQ_CUDA_CHECK(cudaEventCreate(&e));
        return graph_events_.back().data();
    }
    void print_graph_timing() {
        if (graph_events_.empty()) return;
        const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - graph_wall0_).count();
        double gpu_ms = 0.0;
        for (auto& [a, b] : graph_events_) {
            float ms = 0.0f;
            if (cudaEventElapsedTime(&ms, a, b) == cudaSuccess) gpu_ms += ms;
            cudaEventDestroy(a);
            cudaEventDestroy(b);
        }
        const double n = double(graph_events_.size());
        std::fprintf(stderr,
                     "vxq: CUDA graphs (VXQ_CUDA_PROFILE=graphs): %zu launches, GPU %.1f us per launch, host wall %.1f us "
                     "per launch (from the first launch on)\n",
                     graph_events_.size(), 1e3 * gpu_ms / n, 1e3 * wall_ms / n);
        graph_events_.clear();
        if (host_outputs_ > 0) {
            const double k = 1.0 / double(host_outputs_);
            std::fprintf(stderr, "vxq: per host output (%lld): recording %.1f us, flush %.1f us, waiting %.1f us, copy %.1f us\n",
                         (long long)host_outputs_, host_us_.record * k, host_us_.flush * k, host_us_.wait * k, host_us_.copy * k);
        }
    }
    // VXQ_CUDA_PROFILE=timeline (launch.cuh's PdlTrace; a build with -DVXQ_CUDA_TRACE=ON): after
    // every pass (waited for), the time from each kernel's stamp to the next, summed by the
    // kernel's grid, and the first kernels of the last pass in order. At exit.
    void start_timeline() {
#ifndef VXQ_CUDA_TRACE
        fail("VXQ_CUDA_PROFILE=timeline needs a build configured with -DVXQ_CUDA_TRACE=ON");
#endif
        timeline_.buf.reserve(sizeof(unsigned) + kTimelineCap * sizeof(PdlStamp) + 16);
        timeline_.count = reinterpret_cast<unsigned*>(timeline_.buf.data);
        timeline_.stamps = reinterpret_cast<PdlStamp*>(timeline_.buf.data + 16);
        pdl_trace_bind(PdlTrace{timeline_.stamps, timeline_.count, unsigned(kTimelineCap)});
    }
    void read_timeline() {
        unsigned n = 0;
        VXQ_CUDA_CHECK(cudaMemcpyAsync(&n, timeline_.count, sizeof n, cudaMemcpyDeviceToHost, stream_));
        VXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
        timeline_.dropped += n > kTimelineCap ? n - kTimelineCap : 0;
        n = std::min<unsigned>(n, unsigned(kTimelineCap));
        std::vector<PdlStamp> st(n);
        if (n) VXQ_CUDA_CHECK(cudaMemcpy(st.data(), timeline_.stamps, n * sizeof(PdlStamp), cudaMemcpyDeviceToHost));
        timeline_.last.clear();
        for (unsigned i = 0; i + 1 < n; ++i) {
            const std::string sig = st[i].threads ? fmt::format("grid {}x{}x{} of {}", st[i].grid[0], st[i].grid[1], st[i].grid[2], st[i].threads)
                                                  : fmt::format("  mark {}", st[i].grid[0]);  // pdl_trace_mark
            const double us = 1e-3 * double(st[i + 1].ns - st[i].ns);
            auto& [calls, total] = timeline_.by_grid[sig];
            ++calls;
            total += us;
            if (timeline_.last.size() < kTimelineShown) timeline_.last.emplace_back(sig, us);
        }
        if (n > 1) {
            timeline_.span_us += 1e-3 * double(st[n - 1].ns - st[0].ns);
            ++timeline_.passes;
        }
    }
    void print_timeline() {
        if (!timeline_.passes) return;
        std::fprintf(stderr, "vxq: CUDA timeline (VXQ_CUDA_PROFILE=timeline): %lld passes, %.1f us from first to last stamp per pass%s\n",
                     (long long)timeline_.passes, timeline_.span_us / double(timeline_.passes),
                     timeline_.dropped ? " (stamps dropped: passes longer than the buffer)" : "");
        std::vector<std::pair<std::string, std::pair<int64_t, double>>> rows(timeline_.by_grid.begin(), timeline_.by_grid.end());
        std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
        for (const auto& [sig, ct] : rows) {
            std::fprintf(stderr, "vxq:   %-34s %8.1f per pass %9.2f us/call %9.1f us per pass\n", sig.c_str(),
                         double(ct.first) / double(timeline_.passes), ct.second / double(ct.first),
                         ct.second / double(timeline_.passes));
        }
        std::fprintf(stderr, "vxq: the last pass's first kernels (us until the next one's stamp):\n");
        for (const auto& [sig, us] : timeline_.last) std::fprintf(stderr, "vxq:   %-34s %8.2f\n", sig.c_str(), us);
    }
    void capture(Graph& g) {
        VXQ_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
        cudaGraph_t graph = nullptr;
        try {
            run_pending();
        } catch (...) {
            cudaStreamEndCapture(stream_, &graph);
            if (graph) cudaGraphDestroy(graph);
            throw;
        }
        VXQ_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
        const cudaError_t st = cudaGraphInstantiate(&g.exec, graph, 0);
        cudaGraphDestroy(graph);
        VXQ_CUDA_CHECK(st);
    }
    // Consecutive matmuls of one input (Q, K and V; gate and up) run as one gemv_group launch:
    // the op just recorded joins the group recorded right before it when gemv_groupable allows
    // and no output of the group overlaps the input. At n = 1 the group also takes in the
    // RMSNorm recorded right before it (its output is the group's input), and later the SwiGLU
    // or residual add recorded right after it (swiglu(), add()): gemv_group's GemvFusion, the
    // same bits as the separate kernels; the fused op stays in the key, its launch is dropped.
    // Deterministic in the recorded sequence, so a replayed graph has the same groups.
    void group_gemv(const DeviceWeight& w, const float* x, int64_t n, float* y, size_t x_len, size_t y_len) {
        bool extend = group_op_ != SIZE_MAX && group_op_ + 2 == pending_.size() && group_.x == x && group_.n == n &&
                      group_.count < kGemvGroupMax && gemv_groupable(*group_.w[0], w, n) && !group_.fusion.swiglu &&
                      !group_.fusion.resid && !group_.fusion.swiglu_up;
        for (int64_t i = 0; extend && i < group_.count; ++i) {
            extend = !overlaps(group_.y[i], size_t(n * group_.w[i]->rows), x, x_len);
        }
        extend = extend && !overlaps(y, y_len, x, x_len);
        if (extend && (group_.fusion.norm_in || group_.fusion.x_q8.qs)) {  // the fused kernel must take the larger group too
            const DeviceWeight* ws[kGemvGroupMax + 1];
            for (int64_t i = 0; i < group_.count; ++i) ws[i] = group_.w[i];
            ws[group_.count] = &w;
            extend = gemv_fusable(ws, int(group_.count) + 1, group_.fusion);
        }
        if (!extend) {
            link_l2_next(w, n);
            const Q8Act handoff = q8_handoff(w, x, n);  // the attention before may quantize x
            group_ = GemvGroupArgs{};
            group_.w[0] = &w;
            group_.y[0] = y;
            group_.count = 1;
            group_.x = x;
            group_.n = n;
            group_op_ = pending_.size() - 1;
            if (handoff.qs) {
                group_.fusion.x_q8 = handoff;
                set_group_launch("gemv (q8_0 in)");
                return;
            }
            // The RMSNorm right before, whose output this reads, runs in the kernel's prologue.
            if (n == 1 && norm_.op != SIZE_MAX && norm_.op + 2 == pending_.size() && norm_.y == x && norm_.dim == w.cols &&
                !overlaps(norm_.x, size_t(norm_.dim), norm_.y, size_t(norm_.dim))) {
                GemvFusion f;
                f.norm_in = norm_.x;
                f.norm_weight = norm_.w;
                f.norm_eps = norm_.eps;
                fuse_into_group(norm_.op, f, "gemv (rms_norm)");
            }
            // The SwiGLU right before, whose output (gate) this reads: Q8_0/Q4_0 quantize it on the way.
            if (n == 1 && swiglu_.op != SIZE_MAX && swiglu_.op + 2 == pending_.size() && swiglu_.gate == x &&
                swiglu_.n == w.cols && !overlaps(swiglu_.up, size_t(swiglu_.n), x, size_t(swiglu_.n))) {
                GemvFusion f;
                f.swiglu_up = swiglu_.up;
                fuse_into_group(swiglu_.op, f, "gemv (swiglu before)");
            }
            return;
        }
        pending_.pop_back();
        labels_.pop_back();
        group_.w[group_.count] = &w;
        group_.y[group_.count] = y;
        ++group_.count;
        set_group_launch(group_.fusion.norm_in ? "gemv group (rms_norm)" : group_.fusion.x_q8.qs ? "gemv group (q8_0 in)" : "gemv group");
    }
    // The q8_0 handoff (GemvFusion::x_q8): a Q8_0/Q4_0 matmul at n = 1 that reads the output of
    // the split attention recorded right before it (the O projection) gets that output quantized
    // to q8_0 by the attention's merge, and runs no quantize kernel of its own. Same bits as the
    // quantize kernel (Cuda.Q8HandoffEqualsQuantizeKernels); VXQ_CUDA_Q8_HANDOFF=0 turns it off.
    // Returns the quantized input, or {} (the matmul quantizes as before).
    // Measured and not kept (docs/gpu.md): the same handoff from the O/down matmuls' last block
    // (the RMSNorm after the residual add) and from the gate/up group's last block per 32 rows
    // (the SwiGLU), which made the matmuls slower than the quantize kernels they removed.
    // A KIVI layer's merge kernel quantizes the same way (KiviAttentionParams::out_q8), a block
    // of 32 channels each, where VXQ_CUDA_KIVI_Q8_HANDOFF=1 (off by default: not yet run on a GPU).
    Q8Act q8_handoff(const DeviceWeight& w, const float* x, int64_t n) {
        if (!q8_handoff_on_ || n != 1 || w.cols > q8_handoff_cols_) return {};
        GemvFusion consumer;
        consumer.x_q8 = q8_handoff_act();
        const DeviceWeight* wp = &w;
        if (!gemv_fusable(&wp, 1, consumer)) return {};
        AttnSplitRec& a = attn_split_;
        if (a.op != SIZE_MAX && a.op + 2 == pending_.size() && a.p.out == x && attention_split_q8_fits(a.p) &&
            a.p.n_head * a.p.head_dim == w.cols) {
            a.p.out_q8 = consumer.x_q8;
            pending_[a.op] = [p = a.p](cudaStream_t st) { attention_split(p, st); };
            labels_[a.op] = a.p.rope.q ? "attention split-K (rope + kv store, q8_0 out)" : "attention split-K (q8_0 out)";
            return a.p.out_q8;
        }
        KiviAttnRec& k = kivi_attn_;
        if (kivi_q8_handoff_ && k.op != SIZE_MAX && k.op + 2 == pending_.size() && k.p.out == x && k.p.n_q == 1 && !kivi_prefill(k.p) &&
            k.p.head_dim % kQBlock == 0 && k.p.n_head * k.p.head_dim == w.cols) {
            k.p.out_q8 = consumer.x_q8;
            pending_[k.op] = [p = k.p](cudaStream_t st) { kivi_attention(p, st); };
            labels_[k.op] = k.p.fresh.k ? "kivi attention (rope q, k; store; q8_0 out)" : "kivi attention (q8_0 out)";
            return k.p.out_q8;
        }
        return {};
    }
    // The handoff's buffer: quants, then (256-byte aligned) scales, for q8_handoff_cols_ columns.
    // Sized before a matmul is recorded: growing drains and drops the graphs, which hold the old
    // address.
    void q8_handoff_room(const DeviceWeight& w) {
        const bool quant = w.type == GgmlType::Q8_0 || w.type == GgmlType::Q4_0;
        if (!q8_handoff_on_ || !quant || w.cols <= q8_handoff_cols_ || w.cols % kQBlock != 0) return;
        drain();
        drop_graphs();
        q8_handoff_cols_ = w.cols;
        q8_handoff_buf_.reserve(align256(size_t(w.cols)) + size_t(w.cols / kQBlock) * sizeof(Q8Scale));
    }
    Q8Act q8_handoff_act() {
        uint8_t* base = q8_handoff_buf_.data;
        return Q8Act{reinterpret_cast<int8_t*>(base), reinterpret_cast<Q8Scale*>(base + align256(size_t(q8_handoff_cols_)))};
    }
    static size_t align256(size_t b) { return (b + 255) / 256 * 256; }
    // VXQ_CUDA_L2_NEXT_MB=N (an A/B knob, off by default: on the H200 F16 8B decode +0.3-0.8 % at
    // 4-8 MiB, within twice the A/A spread, slower from 16 MiB; docs/gpu.md): at n = 1 the matmul
    // group recorded before w's (in this pass; any ops between them) asks L2 for w's first N MiB as
    // its blocks run out of work (GemvFusion::l2_next), so that the memory streams through the
    // boundary between the two kernels. Dense batch-1 groups only; no value changes
    // (Cuda.L2NextEqualsNone).
    void link_l2_next(const DeviceWeight& w, int64_t n) {
        if (l2_next_bytes_ == 0 || n != 1 || group_op_ == SIZE_MAX || group_.n != 1 || group_.fusion.x_q8.qs) return;
        const bool dense = w.type == GgmlType::F32 || w.type == GgmlType::F16 || w.type == GgmlType::BF16;
        if (!dense || gemv_path(w, 1) != MatmulPath::Gemv) return;
        GemvFusion f = group_.fusion;
        f.l2_next = w.data;
        f.l2_next_bytes = std::min(l2_next_bytes_, w.bytes);
        if (!gemv_fusable(group_.w, int(group_.count), f)) return;
        group_.fusion = f;
        set_group_launch(labels_[group_op_]);
        ++l2_links_;
    }
    // Whether the op just recorded comes right after the matmul group.
    bool group_just_before() const { return group_op_ != SIZE_MAX && group_op_ + 2 == pending_.size(); }
    // Recorded op `op` (right before or after the group) runs inside the group's kernel with
    // fusion f, gemv_fusable permitting: its launch is dropped. Returns whether it was.
    bool fuse_into_group(size_t op, const GemvFusion& f, const char* label) {
        if (!gemv_fusable(group_.w, int(group_.count), f)) return false;
        drop_launch(op);
        group_.fusion = f;
        set_group_launch(label);
        return true;
    }
    // An op fused into another's kernel: it stays in the pass (and the graph key), unlaunched.
    void drop_launch(size_t op) {
        pending_[op] = [](cudaStream_t) {};
        labels_[op] = nullptr;
    }
    void set_group_launch(const char* label) {
        labels_[group_op_] = label;
        const bool fused = group_.fusion.norm_in || group_.fusion.resid || group_.fusion.swiglu || group_.fusion.swiglu_up ||
                           group_.fusion.x_q8.qs || group_.fusion.l2_next;
        pending_[group_op_] = [g = group_, fused, this](cudaStream_t st) {
            if (fused) {
                gemv_group(g.w, g.y, int(g.count), const_cast<float*>(g.x), gemv_scratch_, st, g.fusion);
            } else {
                gemv_group(g.w, g.y, int(g.count), g.x, g.n, gemv_scratch_, st);
            }
        };
    }
    static bool overlaps(const float* a, size_t na, const float* b, size_t nb) { return a < b + nb && b < a + na; }

    void clear_pass() {
        group_op_ = SIZE_MAX;
        norm_ = NormArgs{};
        swiglu_ = SwigluArgs{};
        ropes_[0] = ropes_[1] = RopeArgs{};
        rope_store_ = RopeStoreRec{};
        kivi_store_ = KiviStoreRec{};
        attn_split_ = AttnSplitRec{};
        kivi_attn_ = KiviAttnRec{};
        labels_.clear();
        pending_.clear();
        key_.clear();
        step_used_ = 0;
    }
    void drop_graphs() {
        for (auto& [h, g] : graphs_) {
            if (g.exec) cudaGraphExecDestroy(g.exec);
        }
        graphs_.clear();
    }
    // Runs what is recorded and waits for the device (before memory that queued work may use is
    // freed or overwritten).
    void drain() {
        flush();
        wait_stream();
    }
    void wait_stream() {
        VXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
        for (StepBlock& b : steps_) b.in_flight = false;
        step_at_ = 0;  // each step's passes take the same blocks and ops, hence the same graphs
        chunk_limit_ = chunk_ops_;
    }

    // Bytes a host input of n floats takes in the step block (0 for device memory).
    size_t host_bytes(const float* x, size_t n) const { return is_device(x) ? 0 : n * sizeof(float); }
    // Makes room in the step block for an op's puts (each padded to 16 bytes). Called by every op
    // before its first put and after anything that may drain: growing the block runs the
    // recorded ops first, so no put of the op being built may come before it.
    void step_reserve(std::initializer_list<size_t> puts) {
        size_t need = (step_used_ + 15) / 16 * 16;
        for (const size_t b : puts) need += (b + 15) / 16 * 16;
        if (need <= sb().host.size) return;
        drain();
        drop_graphs();  // they copy from and read the old blocks
        const size_t cap = std::max<size_t>({size_t(64) << 10, 2 * sb().host.size, need});
        for (StepBlock& b : steps_) {
            b.host.reserve(cap);
            b.dev.reserve(cap);
        }
    }
    // What step_put copied to `dev` (a pointer into this pass's step block), on the host.
    template <class T>
    const T* step_host(const T* dev) const {
        return reinterpret_cast<const T*>(sb().host.data + (reinterpret_cast<const uint8_t*>(dev) - sb().dev.data));
    }
    // Copies bytes into the step block (room made by step_reserve); returns where the kernels of
    // this pass find them.
    void* step_put(const void* src, size_t bytes) {
        if (sb().in_flight) {  // the pass that used this block kStepBlocks passes ago may still copy from it
            VXQ_CUDA_CHECK(cudaEventSynchronize(sb().done));
            sb().in_flight = false;
        }
        const size_t at = (step_used_ + 15) / 16 * 16;
        VXQ_ASSERT(at + bytes <= sb().host.size);
        if (bytes > 0) std::memcpy(sb().host.data + at, src, bytes);
        step_used_ = at + bytes;
        return sb().dev.data + at;
    }

    template <class T>
    T* grow(DeviceArray<T>& a, size_t n) {
        if (n > a.size) {
            drain();  // queued or recorded work may use the old allocation
            a.reserve(n);
        }
        return a.data;
    }
    // Counters on the device, zeroed when allocated (kernels leave or keep them as they use them:
    // the split attention's arrivals return to 0, the KIVI attention's fallbacks accumulate).
    template <class T>
    T* grow_zeroed(DeviceArray<T>& a, size_t n) {
        if (n > a.size) {
            grow(a, n);
            VXQ_CUDA_CHECK(cudaMemset(a.data, 0, n * sizeof(T)));
        }
        return a.data;
    }
    void scratch_for(size_t bytes) {
        if (bytes > gemv_scratch_.bytes) {
            drain();
            gemv_scratch_.reserve(bytes);
        }
    }

    bool is_device(const void* p) const {
        const auto* c = static_cast<const char*>(p);
        for (const DeviceArray<float>& b : activations_) {
            const auto* s = reinterpret_cast<const char*>(b.data);
            if (b.data && c >= s && c < s + b.size * sizeof(float)) return true;
        }
        return false;
    }
    // Host inputs travel in the step block; host outputs are written to a device staging buffer
    // and copied back by finish().
    const float* in(const float* x, size_t n) {
        return is_device(x) ? x : static_cast<const float*>(step_put(x, n * sizeof(float)));
    }
    float* out(float* y, size_t n) { return is_device(y) ? y : grow(out_stage_, n); }
    float* inout(float* x, size_t n) {
        return is_device(x) ? x : static_cast<float*>(step_put(x, n * sizeof(float)));
    }
    float* output_buffer(size_t n) override {
        if (n * sizeof(float) > user_out_.size) {
            drain();
            drop_graphs();  // they may copy into the old buffer
            user_out_.reserve(n * sizeof(float));
        }
        return reinterpret_cast<float*>(user_out_.data);
    }
    // An output in host memory: the copy back is the last op of the pass, which runs now. Into
    // output_buffer's memory directly; elsewhere through out_host_ and a host copy.
    void finish(float* host, const float* dev, size_t n) {
        if (host == dev) return;
        const auto* u = reinterpret_cast<const float*>(user_out_.data);
        const bool direct = u && host >= u && host + n <= u + user_out_.size / sizeof(float);
        if (!direct && n * sizeof(float) > out_host_.size) {
            drain();
            drop_graphs();  // they copy into the old buffer
            out_host_.reserve(n * sizeof(float));
        }
        struct A {
            void* dst;
            const void* src;
            uint64_t bytes;
        } a = zeroed<A>();
        a.dst = direct ? static_cast<void*>(host) : out_host_.data;
        a.src = dev;
        a.bytes = n * sizeof(float);
        record(Op::CopyOut, a, [](const A& a, cudaStream_t st) {
            VXQ_CUDA_CHECK(cudaMemcpyAsync(a.dst, a.src, a.bytes, cudaMemcpyDeviceToHost, st));
        });
        using clk = std::chrono::steady_clock;
        const auto t0 = clk::now();
        flush();
        const auto t1 = clk::now();
        wait_stream();
        const auto t2 = clk::now();
        if (!direct) std::memcpy(host, out_host_.data, n * sizeof(float));
        if (graph_timing_) {
            const auto t3 = clk::now();
            const auto us = [](auto a, auto b) { return std::chrono::duration<double, std::micro>(b - a).count(); };
            if (host_outputs_ > 0) host_us_.record += us(host_mark_, t0);  // since the last output
            host_us_.flush += us(t0, t1);
            host_us_.wait += us(t1, t2);
            host_us_.copy += us(t2, t3);
            ++host_outputs_;
            host_mark_ = clk::now();
        }
    }

    const DeviceWeight& weight(const WeightView& w) {
        auto it = weights_.find(w.data);
        if (it == weights_.end()) {
            it = weights_.emplace(w.data, upload_weight(w)).first;
            weight_bytes_ += it->second.bytes;
        }
        VXQ_ASSERT(it->second.file_type == w.type && it->second.rows == w.rows && it->second.cols == w.cols);
        return it->second;
    }
    const float* param(const float* p, size_t n) {
        if (is_device(p)) return p;
        DeviceParam& dp = params_[p];
        if (dp.host.size() != n || std::memcmp(dp.host.data(), p, n * sizeof(float)) != 0) {
            drain();  // recorded and queued kernels read the previous upload
            dp.host.assign(p, p + n);
            VXQ_CUDA_CHECK(cudaMemcpyAsync(dp.dev.reserve(n), p, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
        }
        return dp.dev.data;
    }

    static constexpr size_t kMaxGraphs = 128;
    TpPlace tp_;
    std::atomic<bool> aborted_{false};  // tp_abort: the communicator is gone
    DeviceArray<float> gather_;  // rank 0's receive buffer and gathered rows (gather_columns)

    std::string device_name_;
    cudaStream_t stream_ = nullptr;
    bool graphs_on_ = true;
    bool profile_ = false;
    bool graph_timing_ = false;  // VXQ_CUDA_PROFILE=graphs
    std::vector<std::array<cudaEvent_t, 2>> graph_events_;
    std::chrono::steady_clock::time_point graph_wall0_, host_mark_;
    struct {
        double record = 0, flush = 0, wait = 0, copy = 0;  // host microseconds per phase (print_graph_timing)
    } host_us_;
    int64_t host_outputs_ = 0;
    static constexpr size_t kTimelineCap = 16384, kTimelineShown = 64;
    struct {
        DeviceArray<uint8_t> buf;
        unsigned* count = nullptr;  // null: no timeline
        PdlStamp* stamps = nullptr;
        std::map<std::string, std::pair<int64_t, double>> by_grid;  // calls, us
        std::vector<std::pair<std::string, double>> last;
        double span_us = 0.0;
        int64_t passes = 0, dropped = 0;
    } timeline_;
    std::vector<cudaEvent_t> prof_events_;
    std::map<std::string, std::pair<int64_t, double>> profile_by_op_;  // calls, ms
    std::unique_ptr<KvMemory> kv_memory_;
    std::vector<DeviceArray<float>> activations_;  // by id
    DeviceArray<float> out_stage_;                 // device side of outputs in host memory
    PinnedArray out_host_;                         // host side of the same
    PinnedArray user_out_;                         // output_buffer(): outputs copied there with no host copy
    std::vector<std::vector<float>> host_copies_;  // to_host, by slot
    std::unordered_map<const void*, DeviceWeight> weights_;
    size_t weight_bytes_ = 0;
    std::unordered_map<const float*, DeviceParam> params_;
    GemvScratch gemv_scratch_;
    DeviceArray<float> scores_;
    DeviceArray<float> split_partial_;  // the split-K decode attention's partials
    DeviceArray<unsigned> split_arrivals_;  // and its arrival counters
    DeviceArray<float> kivi_partial_;       // the KIVI attention's partials
    DeviceArray<int> kivi_fallbacks_;       // its count of warps redone in the SIMT form (reported at exit)
    DeviceArray<unsigned> kivi_arrivals_;   // its arrival counters where it merges inside
    std::vector<KiviHeadDev> kivi_heads_;   // a KIVI layer's heads table (host side)
    DeviceArray<float> reader_partial_;     // the TurboQuant / VecInfer / QJL attention's partials
    std::unordered_map<uint64_t, TurboStateCopy> turbo_states_;        // by KvLayerState::id()
    std::unordered_map<uint64_t, VecinferStateCopy> vecinfer_states_;  // by KvLayerState::id()
    std::unordered_map<uint64_t, QjlStateCopy> qjl_states_;            // by KvLayerState::id()
    size_t state_copy_bytes_ = 0;
    DeviceArray<float> mass_;               // the attention mass: [n_head_kv, mass_stride_]
    DeviceArray<float> mass_stats_;         // its rows' max and 1 / sum
    DeviceArray<int8_t> mass_q8_;           // and q as q8_0 (q8_0 / q4_0 keys)
    DeviceArray<float> mass_q8_d_;
    int64_t mass_stride_ = 0;
    std::vector<float> mass_host_;          // the mass copied back, [n_head_kv, max_tokens]
    bool q8_handoff_on_ = true;             // VXQ_CUDA_Q8_HANDOFF=0: off
    size_t l2_next_bytes_ = 0;              // VXQ_CUDA_L2_NEXT_MB (link_l2_next)
    int64_t l2_links_ = 0;                  // groups linked so far (VXQ_CUDA_PROFILE=1 prints it)
    int attn_tile_ = kAttnSplitTile, attn_stages_ = kAttnSplitStages;  // VXQ_CUDA_ATTN_TILE / _STAGES
    int attn_min_stretch_ = kAttnSplitMinStretch;                      // VXQ_CUDA_ATTN_MIN_STRETCH
    int32_t attn_short_ = kAttnShortTokens;                            // VXQ_CUDA_ATTN_SHORT
    int32_t kivi_prefill_min_ = kKiviPrefillMinQueries;               // VXQ_CUDA_KIVI_PREFILL_MIN
    int32_t kivi_blocks_ = 0;                                         // VXQ_CUDA_KIVI_BLOCKS=5: KiviAttentionParams::blocks_per_sm
    // A decode step's KIVI store inside the attention kernel (kivi_attend; kivi-2 +4-7 % end to end
    // at 32K on an H100, its device tests and memcheck clean: docs/gpu.md, fifth session of
    // 2026-12-07); VXQ_CUDA_KIVI_FUSE=0 runs the store kernel.
    bool kivi_fuse_ = true;
    // Off by default since the only GPU run of them (docs/gpu.md, session of 2026-12-08) met "an
    // illegal instruction" in every KIVI attention of a build with the first three on, and no
    // machine was left to find which one raises it (each alone: =1). The KIVI kernels then run as
    // last checked on a GPU (0788743: plain tile copies, the merge kernel).
    bool kivi_evict_first_ = false;   // VXQ_CUDA_KIVI_EVICT_FIRST=1: KiviAttentionParams::tiles_evict_first
    bool kivi_merge_early_ = false;   // VXQ_CUDA_KIVI_MERGE_EARLY=1: KiviAttentionParams::merge_launch_early
    bool kivi_q8_handoff_ = false;    // VXQ_CUDA_KIVI_Q8_HANDOFF=1: KIVI's merge writes the O projection's q8_0 input
    bool kivi_merge_inside_ = false;  // VXQ_CUDA_KIVI_MERGE_INSIDE=1: KiviAttentionParams::arrivals (no merge kernel)
    bool kivi_early_ = true;  // VXQ_CUDA_KIVI_EARLY=0: KiviFresh::early off (a fused step's first tiles after the wait)
    int64_t attn_prefill_min_ = kAttnPrefillMinQueries;               // VXQ_CUDA_ATTN_PREFILL_MIN
    int attn_stream_ = -1;  // VXQ_CUDA_ATTN_STREAM: stages of the stream form's ring; -1 the default, 0 off
    // VXQ_CUDA_ATTN_STREAM_MMA: the stream form on tensor cores where it fits (1), never (0), or by
    // default (-1) where a side is fp8 (on the H200 1.4-1.6x faster than the ring at 32K-128K; an
    // f16 cache 3 % slower than the ring: docs/gpu.md, 2026-12-04, fifth session).
    int attn_stream_mma_ = -1;
    int attn_tma_ = -1;  // VXQ_CUDA_ATTN_TMA: the bulk-copy stream form's ring depth (0: off; -1: the format's plan)
    DeviceArray<uint8_t> q8_handoff_buf_;   // q8_handoff's buffer
    int64_t q8_handoff_cols_ = 0;
    int64_t scores_stride_ = 0;
    std::vector<KvHeadDev> heads_;
    AttnGemmScratch attn_scratch_;            // the prefill attention's scratch and cuBLAS handle
    std::vector<const void*> attn_operands_;  // its GEMMs' operand pointers, host side
    struct GemvGroupArgs {
        const DeviceWeight* w[kGemvGroupMax];
        float* y[kGemvGroupMax];
        int64_t count;
        const float* x;
        int64_t n;
        GemvFusion fusion;
    };
    struct NormArgs {  // the last one-row RMSNorm recorded (a candidate for the next matmul's prologue)
        size_t op = SIZE_MAX;  // its index in pending_
        const float* x = nullptr;
        const float* w = nullptr;
        float* y = nullptr;
        int64_t dim = 0;
        float eps = 0.0f;
    };
    NormArgs norm_;
    struct AttnSplitRec {  // the last split attention recorded (a candidate q8_0 producer)
        size_t op = SIZE_MAX;
        SplitAttentionParams p;
    };
    AttnSplitRec attn_split_;
    struct KiviAttnRec {  // the last KIVI attention recorded (its merge: a candidate q8_0 producer)
        size_t op = SIZE_MAX;
        KiviAttentionParams p;
    };
    KiviAttnRec kivi_attn_;
    struct SwigluArgs {  // the last one-row SwiGLU recorded unfused (a candidate for a Q8_0/Q4_0 matmul's quantize)
        size_t op = SIZE_MAX;
        float* gate = nullptr;
        const float* up = nullptr;
        int64_t n = 0;
    };
    SwigluArgs swiglu_;
    struct RopeArgs {  // a recorded RoPE (the last two are candidates for the KV store's kernel)
        size_t op = SIZE_MAX;
        float* x = nullptr;
        int64_t n_tokens = 0, n_heads = 0, head_dim = 0, pos0 = 0;
        RopeParams p{};
    };
    RopeArgs ropes_[2];
    struct RopeStoreRec {  // the last RoPE + KV store kernel recorded (a candidate for the split attention's kernel)
        size_t op = SIZE_MAX;
        RopeStoreParams f{};   // f.heads: the store's table in the step block (which layer's pages)
    };
    RopeStoreRec rope_store_;
    struct KiviStoreRec {  // the last KIVI store recorded (a decode step's: a candidate for the attention's kernel)
        size_t op = SIZE_MAX;
        KiviStoreParams a{};
        uint64_t ring = 0;   // its layer's values' ring (kivi_ahead_'s key)
    };
    KiviStoreRec kivi_store_;
    // Per KIVI layer (its values' ring, which no other layer shares): the stored tokens after the
    // last recorded decode step whose merge encoded the values' next token ahead (pack_ahead); -1
    // after any other write.
    std::unordered_map<uint64_t, int64_t> kivi_ahead_;
    GemvGroupArgs group_{};         // the matmul group being recorded (see group_gemv)
    size_t group_op_ = SIZE_MAX;    // its index in pending_
    // The pass being recorded.
    std::vector<std::function<void(cudaStream_t)>> pending_;
    std::vector<const char*> labels_;  // per pending op, for VXQ_CUDA_PROFILE (nullptr: fused into another)
    std::vector<uint8_t> key_;
    // A pass's step block: pinned host bytes, their device copy (the pass's first node), and an
    // event after the pass. Passes take the blocks in turn, so the host records (and launches) the
    // next passes while the GPU still runs earlier ones; it waits only for the pass that used a
    // block kStepBlocks passes before.
    struct StepBlock {
        PinnedArray host;
        DeviceArray<uint8_t> dev;
        cudaEvent_t done = nullptr;
        bool in_flight = false;
    };
    static constexpr size_t kStepBlocks = 4;
    std::array<StepBlock, kStepBlocks> steps_;
    size_t step_at_ = 0;   // the block this pass puts into
    size_t step_used_ = 0;
    StepBlock& sb() { return steps_[step_at_]; }
    const StepBlock& sb() const { return steps_[step_at_]; }
    // A pass is flushed (launched) before an RMSNorm once it holds chunk_limit_ ops: chunk_ops_
    // for a step's first pass, twice as many for each next one with chunk_grow_ (0: only when the
    // host needs a result), so the GPU starts on the first layer of a step while the host records
    // the rest, in few graphs. At a norm: every fusion of the recorder lies within a layer's halves.
    static constexpr size_t kChunkOps = 8;
    size_t chunk_ops_ = kChunkOps;
    bool chunk_grow_ = true;   // each pass of a step may hold twice as many ops as the one before
    size_t chunk_limit_ = kChunkOps;
    std::unordered_map<size_t, Graph> graphs_;  // by the hash of their key
};

}  // namespace

std::unique_ptr<Backend> make_backend(int /*n_threads*/) { return std::make_unique<CudaBackend>(); }

std::vector<std::unique_ptr<Backend>> make_backend_group(int /*n_threads*/, int size) {
    VXQ_ASSERT(size >= 1);
#if VXQ_HAVE_NCCL
    const int count = cuda_device_count();
    if (size > count) fail("--tp {} needs {} GPUs; this machine has {}", size, size, count);
    if (size > kMaxTp) fail("--tp {}: at most {} GPUs of one host", size, kMaxTp);
    const NcclApi& nc = nccl_api();
    std::vector<ncclComm_t> comms(static_cast<size_t>(size), nullptr);
    std::vector<int> devices(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) devices[size_t(r)] = r;
    int caller_device = 0;  // each backend's constructor selects its GPU; the caller keeps its own
    VXQ_CUDA_CHECK(cudaGetDevice(&caller_device));
    nccl_check(nc.comm_init_all(comms.data(), size, devices.data()), "communicator init (ncclCommInitAll)");
    std::vector<std::unique_ptr<Backend>> ranks;
    for (int r = 0; r < size; ++r) {
        TpPlace place{r, r, size, comms[size_t(r)]};
        comms[size_t(r)] = nullptr;  // the backend owns it from here
        std::unique_ptr<Backend> be;
        try {
            be = std::make_unique<CudaBackend>(place);
        } catch (...) {  // this rank's communicator and the ranks' not yet given out
            nc.comm_destroy(place.comm);
            for (ncclComm_t c : comms) {
                if (c) nc.comm_destroy(c);
            }
            throw;
        }
        ranks.push_back(std::move(be));
    }
    VXQ_CUDA_CHECK(cudaSetDevice(caller_device));
    return ranks;
#else
    fail("--tp {} on the CUDA backend: this build has no NCCL (nccl.h was not found when it was configured)", size);
#endif
}

}  // namespace vxq::cuda

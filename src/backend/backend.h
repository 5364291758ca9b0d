// The ops a forward pass needs. The forward pass (model/model.cpp) is written once against this
// interface; the CPU backend implements it with kernels/cpu, the CUDA backend with kernels/cuda.
// Buffers are the backend's own memory (host memory for the CPU backend, device memory for CUDA).
// An op may also be given host memory (the caller's logits, the token ids, norm weights from the
// mapped file): a device backend copies such arguments in, and outputs back, itself.
// This header and backend/types.h are all the model, runtime and tools layers see of a backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/types.h"

namespace vxq {

struct KvLayerView;
class KvCache;
class KvMemory;

// The memory a backend computes in: host RAM for the CPU backend, the GPU's for a device backend.
struct MemoryInfo {
    size_t total = 0, free = 0;  // bytes
    std::string where;           // e.g. "host RAM", "GPU 0 (NVIDIA H200 (sm_90))"
};

class Backend {
public:
    virtual ~Backend() = default;
    // Names what actually runs, e.g. "cpu/avx2 x2 threads".
    virtual std::string describe() const = 0;

    // The backend's memory now: what a run must fit in (checked before anything large is allocated).
    virtual MemoryInfo memory_info() const = 0;
    // Bytes this backend holds for weights in its own memory (device copies); 0 when it reads the mapped file.
    virtual size_t weight_bytes() const { return 0; }
    // Whether a run's weights end up in this backend's memory (a device backend uploads them on
    // first use), so the memory check counts them before they are; false where the backend reads
    // the mapped file.
    virtual bool copies_weights() const { return true; }
    // The bytes such a copy of a weight of `type` takes, the file holding `file_bytes` of it (the
    // CUDA backend stores TQ1_0 as TQ2_0 blocks: 66 bytes a block where the file has 54).
    virtual size_t copied_weight_bytes(GgmlType type, size_t file_bytes) const { return file_bytes; }

    // Activation scratch of the forward pass, in this backend's memory. Buffer `id` (the caller's
    // numbering: 0, 1, ...) holds at least n floats. It grows to the largest n ever asked for and
    // is reused after that, so a context's forward passes allocate nothing once its largest batch
    // has run. The contents are unspecified; asking for an id again may move that buffer (the
    // pointers of the other ids stay valid).
    virtual float* activation_buffer(int id, size_t n) = 0;
    // Bytes held by the activation buffers.
    virtual size_t activation_bytes() const = 0;
    // Host memory for n floats of output (the forward pass's logits) that this backend fills
    // without a host-side copy: the CUDA backend's page-locked buffer, which the logits reach by
    // DMA as the step's last op (a copy into pageable memory costs ~37 us a step for 128K floats).
    // Valid until the next call or the backend's end; nullptr where there is none (pass your own).
    virtual float* output_buffer(size_t /*n*/) { return nullptr; }
    // n floats of x (an activation buffer, or host memory) where host code can read them: x itself
    // if it is host memory; otherwise a host copy, valid until the next call with the same `slot`
    // (0, 1, ...). The forward pass hands the KV cache (host storage) its new keys and values, and
    // the observers their queries and outputs, through this.
    virtual const float* to_host(const float* x, size_t n, int slot) = 0;
    // Runs what the backend has recorded and not yet run, and waits for it: the ops of a pass that
    // reads nothing back (Model::fill_kv) are done when it returns. A no-op where ops run as called.
    virtual void sync() {}

    // y = x W^T.  x: [n, w.cols]; y: [n, w.rows]
    virtual void matmul(const WeightView& w, const float* x, int64_t n, float* y) = 0;
    // out[i] = row ids[i] of table.  out: [n, table.cols]
    virtual void embed(const WeightView& table, const int32_t* ids, int64_t n, float* out) = 0;
    virtual void rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps, float* y) = 0;
    virtual void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t pos0, const RopeParams& p) = 0;
    // gate[r][i] = silu(gate[r][i]) * up[r][i] for n_rows rows of n_ff.
    virtual void swiglu(float* gate, const float* up, int64_t n_rows, int64_t n_ff) = 0;
    virtual void add(float* x, const float* y, int64_t n) = 0;
    virtual void add_bias(float* x, const float* b, int64_t n_rows, int64_t dim) = 0;
    // Where KV caches run by this backend keep their pages (KvCacheOptions::memory): nullptr for
    // host RAM. A cache must live where its backend's attention reads it.
    virtual KvMemory* kv_memory() { return nullptr; }
    // Stores the keys and values of n tokens at positions [pos0, pos0 + n) in one layer of the
    // cache (k, v in this backend's memory).   k, v: [n, n_head_kv, head_dim], k after RoPE
    // The default hands host copies to KvCache::write (host-memory caches).
    virtual void kv_write(KvCache& cache, int64_t layer, int64_t pos0, const float* k, const float* v, int64_t n);

    // Causal attention of n_q query tokens at positions [pos0, pos0 + n_q) over one layer of the KV
    // cache: query i sees the stored tokens of its KV head at positions <= pos0 + i; scores are
    // scaled by 1/sqrt(head_dim). The backend reads every codec in place through its readers.
    //   q, out: [n_q, n_head, head_dim], q after RoPE
    // token_mass: nullptr, or per KV head g an array [view.heads[g].n_tokens] to which the
    // attention probability each stored token receives is added, summed over the query tokens and
    // the group's query heads (what H2O accumulates and SnapKV votes with).
    virtual void attention(const KvLayerView& view, const float* q, int64_t n_q, int64_t pos0, float* out,
                           float* const* token_mass = nullptr) = 0;
    // Which attention kernel and readers run for such a layer, e.g. "fused, K q4_0 / V f16 readers
    // avx2" (benchmarks print it with every line).
    virtual std::string attention_path(const KvLayerView& view) const = 0;

    // ---- tensor parallelism (model/tensor_parallel.h) ----------------------------------------
    // The backends of a group (make_backend_group) run one model's slices, each on a host thread
    // of its own, and meet in these collectives, which every rank calls in the same order. A
    // backend made alone is rank 0 of 1, whose collectives change nothing.
    virtual int tp_rank() const { return 0; }
    virtual int tp_size() const { return 1; }
    // Makes the calling thread ready to run this backend's ops (a GPU backend selects its device);
    // a group's thread calls it once before its first op.
    virtual void bind_thread() {}
    // recv (n floats, this backend's memory) becomes the elementwise sum of every rank's send
    // (n floats, this backend's memory; send == recv: in place). Ranks may differ in which.
    virtual void all_reduce_sum(const float* send, float* recv, int64_t n);
    // Each rank passes its block x [n_rows, widths[rank]] (its memory); rank 0's out (host memory,
    // [n_rows, sum of widths]) gets rank r's block at column widths[0] + ... + widths[r - 1].
    // The other ranks pass out = nullptr.
    virtual void gather_columns(const float* x, int64_t n_rows, std::span<const int64_t> widths, float* out);
    // A rank of this backend's group failed: this backend's collectives, in progress or to come,
    // fail instead of waiting for it forever (called on every rank, from the failing rank's thread).
    virtual void tp_abort() {}
};

// The backends this build has, by name ("cpu"): the names make_backend accepts.
std::vector<std::string> backend_names();

// vxq::Error unless make_backend accepts `name`: an unknown name lists this build's backends, and
// "cuda" in a build without CUDA says so. Makes nothing (no device is opened).
void check_backend_name(const std::string& name);

// The backend called `name`, using n_threads host threads; vxq::Error listing the available
// backends for an unknown name. Defined beside the kernels (kernels/backends.cpp).
std::unique_ptr<Backend> make_backend(const std::string& name, int n_threads);

// A tensor-parallel group of `size` backends called `name`, rank r at index r (size 1: one
// make_backend). "cuda": GPUs 0 .. size-1 of this machine in one process, joined by NCCL
// communicators (vxq::Error where the build has no NCCL or the machine has fewer GPUs). "cpu":
// the reference group, ranks sharing host memory and n_threads between them, whose collectives
// sum in rank order (what tests and CI run tensor parallelism with).
std::vector<std::unique_ptr<Backend>> make_backend_group(const std::string& name, int n_threads, int size);

}  // namespace vxq

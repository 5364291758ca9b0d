// The CPU implementation of the Backend ops: matmuls and attention spread over a thread pool,
// the cheap element-wise ops run on the calling thread.
#include "kernels/cpu/backend_cpu.h"

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_fused.h"
#include "kernels/cpu/host_group.h"
#include "kernels/cpu/kv_reader.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kv/kv_view.h"

namespace vxq::cpu {

namespace {

// MemTotal and MemAvailable of /proc/meminfo: "available" counts the page cache the kernel can
// drop (a mapped model file's pages among them), which sysconf's free pages leave out.
MemoryInfo host_memory() {
    MemoryInfo m{0, 0, "host RAM"};
    std::ifstream in("/proc/meminfo");
    std::string key;
    size_t kib = 0;
    while (in >> key >> kib) {
        if (key == "MemTotal:") m.total = kib << 10;
        if (key == "MemAvailable:") m.free = kib << 10;
        in.ignore(64, '\n');
    }
    if (m.total == 0) {  // no /proc/meminfo (not Linux)
        m.total = size_t(sysconf(_SC_PHYS_PAGES)) * size_t(sysconf(_SC_PAGE_SIZE));
        m.free = size_t(sysconf(_SC_AVPHYS_PAGES)) * size_t(sysconf(_SC_PAGE_SIZE));
    }
    return m;
}

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(int n_threads, std::shared_ptr<HostGroup> group = nullptr, int rank = 0)
        : pool_(n_threads), group_(std::move(group)), rank_(rank) {}

    std::string describe() const override {
        const std::string tp = group_ ? fmt::format(", tensor-parallel rank {} of {} (host reference collectives)", rank_, group_->size()) : "";
        return fmt::format("cpu/{} x{} threads{}", cpu::matmul_isa(), pool_.size(), tp);
    }
    MemoryInfo memory_info() const override { return host_memory(); }
    bool copies_weights() const override { return false; }  // matmuls read the mapped file
    float* activation_buffer(int id, size_t n) override {
        VXQ_ASSERT(id >= 0);
        if (size_t(id) >= activations_.size()) activations_.resize(size_t(id) + 1);
        Buffer& b = activations_[size_t(id)];
        if (b.size < n) {
            b.data = std::make_unique<float[]>(n);  // no copy of the old contents: they are scratch
            b.size = n;
        }
        return b.data.get();
    }
    size_t activation_bytes() const override {
        size_t bytes = 0;
        for (const Buffer& b : activations_) bytes += b.size * sizeof(float);
        return bytes;
    }
    const float* to_host(const float* x, size_t n, int slot) override { return x; }
    void matmul(const WeightView& w, const float* x, int64_t n, float* y) override {
        cpu::matmul(w, x, n, y, pool_);
    }
    void embed(const WeightView& table, const int32_t* ids, int64_t n, float* out) override {
        for (int64_t i = 0; i < n; ++i) cpu::dequantize_row(table, ids[i], out + i * table.cols);
    }
    void rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps, float* y) override {
        pool_.parallel_for(n_rows, [&](int64_t b, int64_t e) {
            cpu::rms_norm(x + b * dim, weight, e - b, dim, eps, y + b * dim);
        });
    }
    void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t pos0, const RopeParams& p) override {
        pool_.parallel_for(n_tokens, [&](int64_t b, int64_t e) {
            cpu::rope(x + b * n_heads * head_dim, e - b, n_heads, head_dim, pos0 + b, p);
        });
    }
    void swiglu(float* gate, const float* up, int64_t n_rows, int64_t n_ff) override {
        // ggml applies SiLU row by row: groups of 8 from each row start through its vector exp,
        // the n_ff % 8 last ones through libm expf (see swiglu_rows).
        pool_.parallel_for(n_rows, [&](int64_t b, int64_t e) {
            cpu::swiglu_rows(gate + b * n_ff, up + b * n_ff, e - b, n_ff);
        });
    }
    void add(float* x, const float* y, int64_t n) override { cpu::add(x, y, n); }
    void add_bias(float* x, const float* b, int64_t n_rows, int64_t dim) override { cpu::add_bias(x, b, n_rows, dim); }
    std::string attention_path(const KvLayerView& view) const override {
        if (cpu::attention_f16_applies(view)) return "f16 llama.cpp non-flash order";
        if (view.n_head_kv == 0) return "fused";
        const KvHeadView& h = view.heads[0];
        const auto isa = [](const KvFormatParams& f, bool key) {
            return cpu::kv_reader_isa(f, key) == cpu::KvIsa::Avx2 ? "avx2" : "scalar";
        };
        return fmt::format("fused, K {} reader {} / V {} reader {}", kv_format_kind_name(h.k.fmt.kind), isa(h.k.fmt, true),
                           kv_format_kind_name(h.v.fmt.kind), isa(h.v.fmt, false));
    }
    void attention(const KvLayerView& view, const float* q, int64_t n_q, int64_t pos0, float* out,
                   float* const* token_mass) override {
        const float scale = 1.0f / std::sqrt(float(view.head_dim));
        if (cpu::attention_f16_applies(view)) {
            cpu::attention_f16(view, q, n_q, pos0, scale, out, pool_, token_mass);
        } else {
            cpu::attention_fused(view, q, n_q, pos0, scale, out, pool_, token_mass);
        }
    }

    int tp_rank() const override { return rank_; }
    int tp_size() const override { return group_ ? group_->size() : 1; }
    void all_reduce_sum(const float* send, float* recv, int64_t n) override {
        if (!group_) return Backend::all_reduce_sum(send, recv, n);
        group_->all_reduce_sum(rank_, send, recv, n);
    }
    void gather_columns(const float* x, int64_t n_rows, std::span<const int64_t> widths, float* out) override {
        if (!group_) return Backend::gather_columns(x, n_rows, widths, out);
        group_->gather_columns(rank_, x, n_rows, widths, out);
    }
    void tp_abort() override {
        if (group_) group_->abort();
    }

private:
    struct Buffer {
        std::unique_ptr<float[]> data;
        size_t size = 0;  // floats
    };
    ThreadPool pool_;
    std::vector<Buffer> activations_;  // by id
    std::shared_ptr<HostGroup> group_;  // null outside a tensor-parallel group
    int rank_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_backend(int n_threads) { return std::make_unique<CpuBackend>(n_threads); }

std::vector<std::unique_ptr<Backend>> make_backend_group(int n_threads, int size) {
    auto group = std::make_shared<HostGroup>(size);
    std::vector<std::unique_ptr<Backend>> ranks;
    for (int r = 0; r < size; ++r) ranks.push_back(std::make_unique<CpuBackend>(std::max(1, n_threads / size), group, r));
    return ranks;
}

}  // namespace vxq::cpu

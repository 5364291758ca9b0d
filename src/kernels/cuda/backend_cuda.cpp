#include "kernels/cuda/backend_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/ops.cuh"
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

// A float parameter vector (norm weight, bias) on the device and the host contents it was made from.
struct DeviceParam {
    std::vector<float> host;
    DeviceArray<float> dev;
};

// Staging slots for host-memory arguments of one op (at most two inputs and one output).
enum Slot : int { kIn0, kIn1, kOut, kSlots };

class CudaBackend final : public Backend {
public:
    CudaBackend() {
        int count = 0;
        const cudaError_t st = cudaGetDeviceCount(&count);
        if (st != cudaSuccess || count == 0) {
            cudaGetLastError();  // clear the sticky status of a failed probe
            fail("no CUDA device ({})", st != cudaSuccess ? cudaGetErrorString(st) : "the driver reports none");
        }
        VXQ_CUDA_CHECK(cudaSetDevice(0));
        cudaDeviceProp prop{};
        VXQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        device_name_ = fmt::format("{} (sm_{}{})", prop.name, prop.major, prop.minor);
        VXQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    }
    ~CudaBackend() override {
        cudaStreamSynchronize(stream_);
        for (auto& [ptr, w] : weights_) free_weight(w);
        for (auto& [ptr, p] : params_) p.dev.release();
        for (DeviceArray<float>& b : activations_) b.release();
        for (DeviceArray<float>& b : staging_) b.release();
        ids_.release();
        kv_k_.release();
        kv_v_.release();
        kv_offset_.release();
        visible_.release();
        scores_.release();
        cudaStreamDestroy(stream_);
    }

    std::string describe() const override {
        return fmt::format("cuda/{}, weights {:.1f} MiB on device", device_name_, double(weight_bytes_) / (1 << 20));
    }
    MemoryInfo memory_info() const override {
        size_t free = 0, total = 0;
        VXQ_CUDA_CHECK(cudaMemGetInfo(&free, &total));
        return {total, free, fmt::format("GPU 0 ({})", device_name_)};  // the constructor chose device 0
    }
    size_t weight_bytes() const override { return weight_bytes_; }

    float* activation_buffer(int id, size_t n) override {
        VXQ_ASSERT(id >= 0);
        if (size_t(id) >= activations_.size()) activations_.resize(size_t(id) + 1);
        return activations_[size_t(id)].reserve(n);
    }
    size_t activation_bytes() const override {
        size_t bytes = 0;
        for (const DeviceArray<float>& b : activations_) bytes += b.size * sizeof(float);
        return bytes;
    }
    const float* to_host(const float* x, size_t n, int slot) override {
        if (!is_device(x)) return x;
        VXQ_ASSERT(slot >= 0);
        if (size_t(slot) >= host_copies_.size()) host_copies_.resize(size_t(slot) + 1);
        std::vector<float>& h = host_copies_[size_t(slot)];
        h.resize(n);
        VXQ_CUDA_CHECK(cudaMemcpyAsync(h.data(), x, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
        VXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
        return h.data();
    }

    void matmul(const WeightView& w, const float* x, int64_t n, float* y) override {
        const DeviceWeight& dw = weight(w);
        const float* xd = in(x, size_t(n * w.cols), kIn0);
        float* yd = out(y, size_t(n * w.rows));
        gemv(dw, xd, n, yd, gemv_scratch_, stream_);
        finish(y, yd, size_t(n * w.rows));
    }
    void embed(const WeightView& table, const int32_t* ids, int64_t n, float* o) override {
        const DeviceWeight& dw = weight(table);
        int32_t* idd = ids_.reserve(size_t(n));
        VXQ_CUDA_CHECK(cudaMemcpyAsync(idd, ids, size_t(n) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
        float* od = out(o, size_t(n * table.cols));
        embed_rows(dw, idd, n, od, stream_);
        finish(o, od, size_t(n * table.cols));
    }
    void rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps, float* y) override {
        const float* xd = in(x, size_t(n_rows * dim), kIn0);
        const float* wd = param(weight, size_t(dim));
        float* yd = out(y, size_t(n_rows * dim));
        cuda::rms_norm(xd, wd, n_rows, dim, eps, yd, stream_);
        finish(y, yd, size_t(n_rows * dim));
    }
    void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t pos0, const RopeParams& p) override {
        const size_t n = size_t(n_tokens * n_heads * head_dim);
        float* xd = inout(x, n);
        cuda::rope(xd, n_tokens, n_heads, head_dim, pos0, p, stream_);
        finish(x, xd, n);
    }
    void swiglu(float* gate, const float* up, int64_t n_rows, int64_t n_ff) override {
        const size_t n = size_t(n_rows * n_ff);
        float* gd = inout(gate, n);
        const float* ud = in(up, n, kIn1);
        cuda::swiglu(gd, ud, int64_t(n), stream_);
        finish(gate, gd, n);
    }
    void add(float* x, const float* y, int64_t n) override {
        float* xd = inout(x, size_t(n));
        const float* yd = in(y, size_t(n), kIn1);
        cuda::add(xd, yd, n, stream_);
        finish(x, xd, size_t(n));
    }
    void add_bias(float* x, const float* b, int64_t n_rows, int64_t dim) override {
        float* xd = inout(x, size_t(n_rows * dim));
        cuda::add_bias(xd, param(b, size_t(dim)), n_rows, dim, stream_);
        finish(x, xd, size_t(n_rows * dim));
    }

    // The KV cache lives in host memory (kv/ page arena). For now every call copies the pages of
    // the tokens the queries see to a device mirror, all heads of the layer, then runs the f16
    // kernel: correct, but it moves O(context) bytes over PCIe per layer and step. A device-side
    // page arena (or an incremental mirror per layer and head) is the next step.
    void attention(const KvLayerView& view, const float* q, int64_t n_q, int64_t pos0, float* o,
                   float* const* token_mass) override {
        if (token_mass != nullptr) {
            fail("attention mass (the score observers H2O/SnapKV) has no CUDA kernel yet; use --device cpu");
        }
        const int64_t hd = view.head_dim;
        std::vector<int64_t> offset(size_t(view.n_head_kv));
        std::vector<int32_t> visible(size_t(n_q * view.n_head_kv));
        int64_t total = 0, max_tokens = 1;
        for (int64_t g = 0; g < view.n_head_kv; ++g) {
            const KvHeadView& h = view.heads[g];
            check_f16(h.k, hd, "keys");
            check_f16(h.v, hd, "values");
            const int64_t n_vis = kv_visible(h, pos0 + n_q - 1);  // the last query sees the most
            for (int64_t i = 0; i < n_q; ++i) visible[size_t(i * view.n_head_kv + g)] = int32_t(kv_visible(h, pos0 + i));
            offset[size_t(g)] = total * hd;
            total += n_vis;
            max_tokens = std::max(max_tokens, n_vis);
        }
        kv_host_k_.resize(size_t(total * hd));
        kv_host_v_.resize(size_t(total * hd));
        for (int64_t g = 0; g < view.n_head_kv; ++g) {
            const KvHeadView& h = view.heads[g];
            const int64_t n_vis = kv_visible(h, pos0 + n_q - 1);
            gather_f16(h.k, n_vis, hd, kv_host_k_.data() + offset[size_t(g)]);
            gather_f16(h.v, n_vis, hd, kv_host_v_.data() + offset[size_t(g)]);
        }
        __half* kd = kv_k_.reserve(size_t(total * hd));
        __half* vd = kv_v_.reserve(size_t(total * hd));
        int64_t* od = kv_offset_.reserve(offset.size());
        int32_t* visd = visible_.reserve(visible.size());
        VXQ_CUDA_CHECK(cudaMemcpyAsync(kd, kv_host_k_.data(), size_t(total * hd) * 2, cudaMemcpyHostToDevice, stream_));
        VXQ_CUDA_CHECK(cudaMemcpyAsync(vd, kv_host_v_.data(), size_t(total * hd) * 2, cudaMemcpyHostToDevice, stream_));
        VXQ_CUDA_CHECK(cudaMemcpyAsync(od, offset.data(), offset.size() * sizeof(int64_t), cudaMemcpyHostToDevice, stream_));
        VXQ_CUDA_CHECK(cudaMemcpyAsync(visd, visible.data(), visible.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));

        const size_t n_out = size_t(n_q * view.n_head * hd);
        F16AttentionParams p;
        p.q = in(q, n_out, kIn0);
        p.k = kd;
        p.v = vd;
        p.offset = od;
        p.visible = visd;
        p.scores = scores_.reserve(size_t(n_q * view.n_head * max_tokens));
        p.out = out(o, n_out);
        p.n_q = n_q;
        p.n_head = view.n_head;
        p.n_head_kv = view.n_head_kv;
        p.head_dim = hd;
        p.max_tokens = max_tokens;
        p.scale = 1.0f / std::sqrt(float(hd));
        p.round_f16 = !view.flash_attn;  // the CPU backend's (llama.cpp's) non-flash numerics
        attention_f16(p, stream_);
        finish(o, p.out, n_out);
        // The host staging vectors are reused by the next call: wait until the copies are done.
        VXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }

    // The attention kernel that runs for such a layer, for benchmark lines (Backend::attention_path
    // on main since 619393c; this becomes its override when the branches meet).
    std::string attention_path(const KvLayerView& view) const {
        for (int64_t g = 0; g < view.n_head_kv; ++g) {
            for (const KvStreamView* s : {&view.heads[g].k, &view.heads[g].v}) {
                for (int64_t i = 0; i < s->n_segs; ++i) {
                    const KvFormatParams& f = s->segs[i].window ? s->window_fmt : s->fmt;
                    if (f.kind != KvFormatKind::F16) {
                        return fmt::format("none: KV format {} has no CUDA reader", kv_format_kind_name(f.kind));
                    }
                }
            }
        }
        return view.flash_attn ? "cuda f16, f32 softmax (-fa), host pages mirrored per call"
                               : "cuda f16, fp16-rounded q and probabilities (llama.cpp non-flash), host pages mirrored per call";
    }

private:
    bool is_device(const void* p) const {
        const auto* c = static_cast<const char*>(p);
        for (const DeviceArray<float>& b : activations_) {
            const auto* s = reinterpret_cast<const char*>(b.data);
            if (b.data && c >= s && c < s + b.size * sizeof(float)) return true;
        }
        return false;
    }
    const float* in(const float* x, size_t n, int slot) {
        if (is_device(x)) return x;
        float* d = staging_[slot].reserve(n);
        VXQ_CUDA_CHECK(cudaMemcpyAsync(d, x, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
        return d;
    }
    float* out(float* y, size_t n) { return is_device(y) ? y : staging_[kOut].reserve(n); }
    float* inout(float* x, size_t n) {
        if (is_device(x)) return x;
        float* d = staging_[kOut].reserve(n);
        VXQ_CUDA_CHECK(cudaMemcpyAsync(d, x, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
        return d;
    }
    // Copies a staged output back to the caller's host memory and waits for it.
    void finish(float* host, const float* dev, size_t n) {
        if (host == dev) return;
        VXQ_CUDA_CHECK(cudaMemcpyAsync(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
        VXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }

    const DeviceWeight& weight(const WeightView& w) {
        auto it = weights_.find(w.data);
        if (it == weights_.end()) {
            it = weights_.emplace(w.data, upload_weight(w)).first;
            weight_bytes_ += it->second.bytes;
        }
        VXQ_ASSERT(it->second.type == w.type && it->second.rows == w.rows && it->second.cols == w.cols);
        return it->second;
    }
    const float* param(const float* p, size_t n) {
        if (is_device(p)) return p;
        DeviceParam& dp = params_[p];
        if (dp.host.size() != n || std::memcmp(dp.host.data(), p, n * sizeof(float)) != 0) {
            // The previous upload may still be read by queued kernels.
            VXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
            dp.host.assign(p, p + n);
            VXQ_CUDA_CHECK(cudaMemcpyAsync(dp.dev.reserve(n), p, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
        }
        return dp.dev.data;
    }

    static void check_f16(const KvStreamView& s, int64_t head_dim, const char* what) {
        for (int64_t i = 0; i < s.n_segs; ++i) {
            const KvFormatParams& f = s.segs[i].window ? s.window_fmt : s.fmt;
            if (f.kind != KvFormatKind::F16) {
                fail("KV format {} ({}) has no CUDA reader yet; the CUDA backend reads f16 caches only",
                     kv_format_kind_name(f.kind), what);
            }
            VXQ_ASSERT(f.block_bytes == size_t(f.block_tokens * head_dim) * 2);
        }
    }
    // The first n stored tokens of a stream, packed as [n, head_dim] fp16.
    static void gather_f16(const KvStreamView& s, int64_t n, int64_t head_dim, uint16_t* dst) {
        for (int64_t i = 0; i < s.n_segs; ++i) {
            const KvSegment& seg = s.segs[i];
            if (seg.first >= n) break;
            const int64_t cnt = std::min(seg.n_tokens, n - seg.first);
            std::memcpy(dst + seg.first * head_dim, seg.data, size_t(cnt * head_dim) * 2);
        }
    }

    std::string device_name_;
    cudaStream_t stream_ = nullptr;
    std::vector<DeviceArray<float>> activations_;  // by id
    DeviceArray<float> staging_[kSlots];
    std::vector<std::vector<float>> host_copies_;  // to_host, by slot
    std::unordered_map<const void*, DeviceWeight> weights_;
    size_t weight_bytes_ = 0;
    std::unordered_map<const float*, DeviceParam> params_;
    GemvScratch gemv_scratch_;
    DeviceArray<int32_t> ids_;
    std::vector<uint16_t> kv_host_k_, kv_host_v_;  // [tokens of all heads, head_dim] staging
    DeviceArray<__half> kv_k_, kv_v_;
    DeviceArray<int64_t> kv_offset_;
    DeviceArray<int32_t> visible_;
    DeviceArray<float> scores_;
};

}  // namespace

std::unique_ptr<Backend> make_backend(int /*n_threads*/) { return std::make_unique<CudaBackend>(); }

}  // namespace vxq::cuda

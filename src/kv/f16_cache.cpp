// The plain fp16 cache. Per layer, K and V are [n_head_kv, n_ctx, head_dim] fp16, head-major so
// that one head's keys are contiguous for the attention loops.
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/attention.h"
#include "kv/codec.h"
#include "kv/kv_cache.h"

namespace vxq {

namespace {

class F16Cache final : public KvCache {
public:
    explicit F16Cache(const KvShape& s) : shape_(s) {
        VXQ_ASSERT(s.n_layer > 0 && s.n_head_kv > 0 && s.head_dim > 0 && s.n_ctx > 0);
        const size_t per_layer = size_t(s.n_head_kv * s.n_ctx * s.head_dim);
        k_.assign(size_t(s.n_layer), std::vector<f16_t>(per_layer, 0));
        v_.assign(size_t(s.n_layer), std::vector<f16_t>(per_layer, 0));
    }

    const KvShape& shape() const override { return shape_; }
    int64_t size() const override { return size_; }

    void write(int64_t layer, int64_t pos0, const float* k, const float* v, int64_t n) override {
        VXQ_ASSERT(layer >= 0 && layer < shape_.n_layer && pos0 >= 0 && pos0 <= size_);
        VXQ_ASSERT(pos0 + n <= shape_.n_ctx);
        const int64_t d = shape_.head_dim;
        for (int64_t t = 0; t < n; ++t) {
            for (int64_t g = 0; g < shape_.n_head_kv; ++g) {
                const float* ks = k + (t * shape_.n_head_kv + g) * d;
                const float* vs = v + (t * shape_.n_head_kv + g) * d;
                f16_t* kd = k_[layer].data() + (g * shape_.n_ctx + pos0 + t) * d;
                f16_t* vd = v_[layer].data() + (g * shape_.n_ctx + pos0 + t) * d;
                for (int64_t c = 0; c < d; ++c) {
                    kd[c] = fp32_to_fp16(ks[c]);
                    vd[c] = fp32_to_fp16(vs[c]);
                }
            }
        }
    }

    void commit(int64_t n) override {
        VXQ_ASSERT(n >= 0 && n <= shape_.n_ctx);
        size_ = n;
    }

    void attend(int64_t layer, const float* q, int64_t n_q, int64_t pos0, float* out,
                ThreadPool& pool) const override {
        VXQ_ASSERT(pos0 + n_q <= shape_.n_ctx);
        const cpu::AttentionF16Args a{q, k_[layer].data(), v_[layer].data(), shape_.n_ctx * shape_.head_dim,
                                      out, n_q, pos0, shape_.n_head, shape_.n_head_kv, shape_.head_dim,
                                      1.0f / std::sqrt(float(shape_.head_dim))};
        const int64_t units = n_q * shape_.n_head;
        pool.run([&](int ith, int nth) {
            std::vector<float> scratch(size_t(pos0 + n_q));
            // Interleaved split: causal rows grow with i, so contiguous chunks would be unbalanced.
            for (int64_t u = ith; u < units; u += nth) {
                cpu::attention_f16_row(a, u / shape_.n_head, u % shape_.n_head, scratch.data());
            }
        });
    }

    void truncate(int64_t n) override {
        VXQ_ASSERT(n >= 0);
        if (n < size_) size_ = n;
    }

    size_t resident_bytes() const override {
        size_t b = 0;
        for (const auto& x : k_) b += x.size() * sizeof(f16_t);
        for (const auto& x : v_) b += x.size() * sizeof(f16_t);
        return b;
    }

    std::string format() const override { return "f16"; }

    void dequantize(int64_t layer, int64_t head, int64_t n, std::vector<float>& k, std::vector<float>& v) const override {
        VXQ_ASSERT(n >= 0 && n <= shape_.n_ctx);
        const int64_t d = shape_.head_dim;
        k.resize(size_t(n * d));
        v.resize(size_t(n * d));
        const f16_t* ks = k_[size_t(layer)].data() + head * shape_.n_ctx * d;
        const f16_t* vs = v_[size_t(layer)].data() + head * shape_.n_ctx * d;
        for (int64_t i = 0; i < n * d; ++i) {
            k[size_t(i)] = fp16_to_fp32(ks[i]);
            v[size_t(i)] = fp16_to_fp32(vs[i]);
        }
    }

private:
    KvShape shape_;
    std::vector<std::vector<f16_t>> k_, v_;
    int64_t size_ = 0;
};

}  // namespace

std::unique_ptr<KvCache> make_f16_cache(const KvShape& shape) { return std::make_unique<F16Cache>(shape); }

std::unique_ptr<KvCache> make_kv_cache(const KvShape& shape, const std::string& k_spec, const std::string& v_spec,
                                       bool prefill_exact) {
    const CodecSpec k = CodecSpec::parse(k_spec), v = CodecSpec::parse(v_spec);
    if (k.name == "f16" && v.name == "f16" && k.options.empty() && v.options.empty()) return make_f16_cache(shape);
    return make_paged_cache(shape, k, v, prefill_exact);
}

double resident_bits_per_element(const KvCache& c, int64_t tokens) {
    const KvShape& s = c.shape();
    if (tokens <= 0) return 0.0;
    return 8.0 * double(c.resident_bytes()) / double(2 * s.n_layer * s.n_head_kv * s.head_dim * tokens);
}

}  // namespace vxq

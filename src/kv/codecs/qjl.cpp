// QJL codec (METHODS.md "QJL"): the per-layer state and the scalar reference of the key format in
// kv/formats/qjl.h, the key codec, and the value codec (KIVI-2 per token, G = 32, with the same
// fp16 window), both under the one method name `qjl`.
#include "kv/formats/qjl.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "kv/codecs/codecs.h"
#include "kv/codecs/option_parse.h"

namespace vxq::codecs {

namespace qjl {

// The default sketch sizes, 2d and d, rounded up to whole sign bytes.
int64_t default_rows(int64_t n) { return (n + 7) / 8 * 8; }

Params parse_params(const CodecSpec& spec, int64_t d) {
    check_known_options(spec, {"m", "mo", "outliers", "residual", "seed"});
    if (d < 1 || d > 256) fail("KV method '{}': head_dim {} is out of range [1, 256]", spec.name, d);
    Params p;
    p.m = int_option(spec, "m", default_rows(2 * d), 8, 8192);
    p.mo = int_option(spec, "mo", default_rows(d), 8, 8192);
    for (const auto& [name, v] : {std::pair{"m", p.m}, std::pair{"mo", p.mo}}) {
        if (v % 8 != 0) fail("KV method '{}': {}={} is not a multiple of 8", spec.name, name, v);
    }
    p.outliers = int(int_option(spec, "outliers", std::min<int64_t>(8, d), 0, std::min<int64_t>(d, 64)));
    p.residual = int_option(spec, "residual", kBlockTokens, kBlockTokens, int64_t(1) << 20);
    if (p.residual % kBlockTokens != 0) {
        fail("KV method '{}': residual={} is not a multiple of the {}-token block", spec.name, p.residual, kBlockTokens);
    }
    p.seed = uint64_t(int_option(spec, "seed", 0, 0, INT64_MAX));
    return p;
}

Layout layout_of(const Params& p, int64_t d) { return {d, p.m, p.outliers > 0 ? p.mo : 0, p.outliers}; }

State::State(const Params& p, int64_t d, int64_t layer)
    : params(p), layout(layout_of(p, d)), inliers(p.m, d, mix_seed(p.seed, layer, KvRole::Key, 0)) {
    if (p.outliers > 0) outliers = Sketch(p.mo, d, mix_seed(p.seed, layer, KvRole::Key, 1));
}

void encode(const State& s, const float* x, uint8_t* block) {
    const Layout& l = s.layout;
    const int64_t d = l.d, B = kBlockTokens;
    std::memset(block, 0, l.block_bytes());
    // Outliers: the O channels of largest norm over the block (a NaN channel counts as largest,
    // so it stays visible; ties to the lower channel), stored in ascending order.
    std::vector<double> norm2(size_t(d), 0.0);
    for (int64_t t = 0; t < B; ++t)
        for (int64_t c = 0; c < d; ++c) norm2[size_t(c)] += double(x[t * d + c]) * x[t * d + c];
    for (auto& v : norm2) if (std::isnan(v)) v = INFINITY;
    std::vector<int> order(static_cast<size_t>(d));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return norm2[size_t(a)] > norm2[size_t(b)]; });
    std::sort(order.begin(), order.begin() + l.outliers);
    std::vector<uint8_t> is_out(size_t(d), 0);
    for (int j = 0; j < l.outliers; ++j) {
        block[j] = uint8_t(order[size_t(j)]);
        is_out[size_t(order[size_t(j)])] = 1;
    }
    std::vector<float> kin(static_cast<size_t>(d)), kout(static_cast<size_t>(d));
    for (int64_t t = 0; t < B; ++t) {
        const float* k = x + t * d;
        double nin = 0, nout = 0;
        for (int64_t c = 0; c < d; ++c) {
            const bool o = is_out[size_t(c)];
            kin[size_t(c)] = o ? 0.0f : k[c];
            kout[size_t(c)] = o ? k[c] : 0.0f;
            (o ? nout : nin) += double(k[c]) * k[c];
        }
        store_fp16(block + l.norm_in_offset() + 2 * size_t(t), float(std::sqrt(nin)));
        s.inliers.signs(kin.data(), block + l.signs_in_offset() + size_t(t * l.m / 8));
        if (l.outliers == 0) continue;
        store_fp16(block + l.norm_out_offset() + 2 * size_t(t), float(std::sqrt(nout)));
        s.outliers.signs(kout.data(), block + l.signs_out_offset() + size_t(t * l.mo / 8));
    }
}

void decode(const State& s, const uint8_t* block, float* x) {
    const Layout& l = s.layout;
    const int64_t d = l.d, B = kBlockTokens;
    for (int64_t t = 0; t < B; ++t) {
        float* xt = x + t * d;
        std::fill(xt, xt + d, 0.0f);
        const float w_in = s.inliers.scale() * load_fp16(block + l.norm_in_offset() + 2 * size_t(t));
        s.inliers.add_transposed(block + l.signs_in_offset() + size_t(t * l.m / 8), w_in, xt);
        if (l.outliers == 0) continue;
        const float w_out = s.outliers.scale() * load_fp16(block + l.norm_out_offset() + 2 * size_t(t));
        const uint8_t* bits = block + l.signs_out_offset() + size_t(t * l.mo / 8);
        for (int j = 0; j < l.outliers; ++j) {
            const int64_t c = block[j];
            float acc = 0;
            for (int64_t i = 0; i < l.mo; ++i) acc += sign_bit(bits, i) ? s.outliers.at(i, c) : -s.outliers.at(i, c);
            xt[c] = w_out * acc;
        }
    }
}

}  // namespace qjl

namespace {

std::string spec_string(const qjl::Params& p, int64_t d) {
    std::string s = "qjl";
    std::vector<std::string> opts;
    if (p.m != qjl::default_rows(2 * d)) opts.push_back(fmt::format("m={}", p.m));
    if (p.outliers > 0 && p.mo != qjl::default_rows(d)) opts.push_back(fmt::format("mo={}", p.mo));
    if (p.outliers != std::min<int64_t>(8, d)) opts.push_back(fmt::format("outliers={}", p.outliers));
    if (p.residual != qjl::kBlockTokens) opts.push_back(fmt::format("residual={}", p.residual));
    if (p.seed != 0) opts.push_back(fmt::format("seed={}", p.seed));
    for (size_t i = 0; i < opts.size(); ++i) s += (i == 0 ? ":" : ",") + opts[i];
    return s;
}

class QjlKeys final : public Codec {
public:
    QjlKeys(const qjl::Params& p, int64_t d, const KvLayerState* state) : p_(p), d_(d), layout_(qjl::layout_of(p, d)) {
        state_ = dynamic_cast<const qjl::State*>(state);
        if (!state_) {  // a probe (registry listing, spec checks): its own layer-0 state
            own_ = std::make_unique<qjl::State>(p, d, 0);
            state_ = own_.get();
        }
        VXQ_ASSERT(state_->layout.block_bytes() == layout_.block_bytes());
    }
    std::string spec() const override { return spec_string(p_, d_); }
    int64_t block_tokens() const override { return qjl::kBlockTokens; }
    size_t block_bytes(int64_t d) const override {
        VXQ_ASSERT(d == d_);
        return layout_.block_bytes();
    }
    int64_t flush_at() const override { return p_.residual; }
    int64_t flush_count() const override { return p_.residual; }
    void encode(const float* x, int64_t d, uint8_t* block) const override {
        VXQ_ASSERT(d == d_);
        qjl::encode(*state_, x, block);
    }
    void decode(const uint8_t* block, int64_t d, float* x) const override {
        VXQ_ASSERT(d == d_);
        qjl::decode(*state_, block, x);
    }
    KvFormatParams params(int64_t d) const override {
        KvFormatParams f;
        f.kind = KvFormatKind::Qjl;
        f.block_tokens = qjl::kBlockTokens;
        f.block_bytes = block_bytes(d);
        f.bits = 1;
        f.layer_state = state_;
        return f;
    }

private:
    qjl::Params p_;
    int64_t d_;
    qjl::Layout layout_;
    const qjl::State* state_ = nullptr;
    std::unique_ptr<qjl::State> own_;
};

// Values: KIVI at b = 2, G = 32 per token, keeping the R newest tokens in fp16 (METHODS.md), under
// the qjl spec (so a cache's format reads "qjl" for both halves).
class QjlValues final : public Codec {
public:
    QjlValues(std::string spec, std::unique_ptr<Codec> kivi) : spec_(std::move(spec)), kivi_(std::move(kivi)) {}
    std::string spec() const override { return spec_; }
    int64_t block_tokens() const override { return kivi_->block_tokens(); }
    size_t block_bytes(int64_t d) const override { return kivi_->block_bytes(d); }
    int64_t flush_at() const override { return kivi_->flush_at(); }
    int64_t flush_count() const override { return kivi_->flush_count(); }
    void encode(const float* x, int64_t d, uint8_t* block) const override { kivi_->encode(x, d, block); }
    void decode(const uint8_t* block, int64_t d, float* x) const override { kivi_->decode(block, d, x); }
    KvFormatParams params(int64_t d) const override { return kivi_->params(d); }

private:
    std::string spec_;
    std::unique_ptr<Codec> kivi_;
};

}  // namespace

std::unique_ptr<Codec> make_qjl(const CodecSpec& spec, KvRole role, int64_t d, const KvLayerState* state) {
    const qjl::Params p = qjl::parse_params(spec, d);
    if (role == KvRole::Key) return std::make_unique<QjlKeys>(p, d, state);
    const CodecSpec kivi{"kivi", {{"bits", "2"}, {"group", "32"}, {"residual", std::to_string(p.residual)}}};
    return std::make_unique<QjlValues>(spec_string(p, d), make_kivi(kivi, KvRole::Value, d, nullptr));
}

std::unique_ptr<KvLayerState> make_qjl_state(const CodecSpec& spec, KvRole role, int64_t d, int64_t layer) {
    const qjl::Params p = qjl::parse_params(spec, d);
    if (role == KvRole::Value) return nullptr;
    return std::make_unique<qjl::State>(p, d, layer);
}

}  // namespace vxq::codecs

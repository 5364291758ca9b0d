// VecInfer codec (METHODS.md "VecInfer"): the transform, the fused argmin, k-means, the scalar
// reference of kv/formats/vecinfer.h, the per-layer state (from a calibration file, or seeded
// random for tests) and the codec.
#include "kv/formats/vecinfer.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "core/error.h"
#include "core/splitmix.h"
#include "kv/calibration.h"
#include "kv/codecs/codecs.h"
#include "kv/codecs/option_parse.h"

namespace vxq::codecs {

namespace vecinfer {

namespace {

std::atomic<uint64_t> g_transform_calls{0};

// One seed per (seed, layer, role, sub-space): splitmix64 of their combination.
uint64_t mix_seed(uint64_t seed, int64_t layer, int role, int64_t j) {
    return splitmix64_mix(seed * 0x9E3779B97F4A7C15ull + uint64_t(layer) * 0x100000001B3ull + uint64_t(role) * 0x5851F42Dull +
                          uint64_t(j) * 0xD1B54A32D192ED03ull);
}

}  // namespace

Params parse_params(const CodecSpec& spec, int64_t d) {
    check_known_options(spec, {"n", "m", "calib"});
    Params p;
    p.n = int(int_option(spec, "n", 4, 1, 64));
    p.m = int(int_option(spec, "m", 8, 1, 8));
    if (!std::has_single_bit(unsigned(p.n))) fail("KV method '{}': n={} must be a power of two", spec.name, p.n);
    if (d < 1 || d > kMaxHeadDim || !std::has_single_bit(uint64_t(d))) {
        fail("KV method '{}': head_dim {} must be a power of two in [1, {}] (Walsh-Hadamard transform)", spec.name, d,
             kMaxHeadDim);
    }
    if (d % p.n != 0) fail("KV method '{}': n={} does not divide head_dim {}", spec.name, p.n, d);
    if (auto it = spec.options.find("calib"); it != spec.options.end()) p.calib = it->second;
    return p;
}

void hadamard(float* y, int64_t d) {
    g_transform_calls.fetch_add(1, std::memory_order_relaxed);
    turbo::fwht(y, d);
    const float inv = 1.0f / std::sqrt(float(d));
    for (int64_t c = 0; c < d; ++c) y[c] *= inv;
}

uint64_t transform_calls() { return g_transform_calls.load(std::memory_order_relaxed); }

void forward_transform(const State& s, const float* x, float* y) {
    const int64_t d = s.layout.d;
    if (s.lambda.empty()) {
        std::copy_n(x, d, y);
    } else {
        for (int64_t c = 0; c < d; ++c) y[c] = x[c] / s.lambda[size_t(c)];
    }
    hadamard(y, d);
}

int nearest(const float* c, int64_t k, int n, const float* v) {
    int best = 0;
    float best_d = std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < k; ++i) {
        const float* ci = c + i * n;
        float dist = 0;
        for (int e = 0; e < n; ++e) {
            const float t = v[e] - ci[e];
            dist += t * t;
        }
        if (dist < best_d) {
            best_d = dist;
            best = int(i);
        }
    }
    return best;
}

void encode(const State& s, const float* x, uint8_t* block) {
    const Layout& l = s.layout;
    std::memset(block, 0, l.block_bytes());
    float y[kMaxHeadDim];
    forward_transform(s, x, y);
    for (int64_t j = 0; j < l.subvectors(); ++j) {
        put_index(block, j, l.m, nearest(s.centroids(j), l.centroids(), l.n, y + j * l.n));
    }
}

void coded_vector(const State& s, const uint8_t* block, float* y) {
    const Layout& l = s.layout;
    for (int64_t j = 0; j < l.subvectors(); ++j) {
        const float* c = s.centroids(j) + index_at(block, j, l.m) * l.n;
        std::copy_n(c, l.n, y + j * l.n);
    }
}

void decode(const State& s, const uint8_t* block, float* x) {
    coded_vector(s, block, x);
    hadamard(x, s.layout.d);
    if (!s.lambda.empty()) {
        for (int64_t c = 0; c < s.layout.d; ++c) x[c] *= s.lambda[size_t(c)];
    }
}

std::vector<float> kmeans(const float* x, int64_t N, int n, int64_t k, int max_iter, uint64_t seed) {
    VXQ_ASSERT(N > 0 && n > 0 && k > 0);
    std::vector<float> c(size_t(k * n));
    // Initialisation: the first k of a seeded permutation of the points (Fisher-Yates, partial).
    std::vector<int64_t> order(static_cast<size_t>(N));
    std::iota(order.begin(), order.end(), 0);
    std::mt19937_64 rng(seed);
    for (int64_t i = 0; i < std::min(N, k); ++i) {
        const int64_t r = i + int64_t(rng() % uint64_t(N - i));
        std::swap(order[size_t(i)], order[size_t(r)]);
    }
    for (int64_t i = 0; i < k; ++i) std::copy_n(x + order[size_t(i % N)] * n, n, &c[size_t(i * n)]);
    std::vector<int32_t> assign(static_cast<size_t>(N), -1);
    std::vector<double> sum(size_t(k * n));
    std::vector<int64_t> count(static_cast<size_t>(k));
    for (int it = 0; it < max_iter; ++it) {
        bool changed = false;
        for (int64_t t = 0; t < N; ++t) {
            const int a = nearest(c.data(), k, n, x + t * n);
            changed |= a != assign[size_t(t)];
            assign[size_t(t)] = a;
        }
        if (!changed) break;
        std::fill(sum.begin(), sum.end(), 0.0);
        std::fill(count.begin(), count.end(), 0);
        for (int64_t t = 0; t < N; ++t) {
            const int64_t a = assign[size_t(t)];
            ++count[size_t(a)];
            for (int e = 0; e < n; ++e) sum[size_t(a * n + e)] += x[t * n + e];
        }
        for (int64_t i = 0; i < k; ++i) {
            if (count[size_t(i)] == 0) continue;
            for (int e = 0; e < n; ++e) c[size_t(i * n + e)] = float(sum[size_t(i * n + e)] / double(count[size_t(i)]));
        }
    }
    return c;
}

std::vector<float> train_codebooks(const Layout& l, const float* y, int64_t N, int max_iter, uint64_t seed) {
    const int64_t J = l.subvectors(), K = l.centroids();
    std::vector<float> books(size_t(J * K * l.n)), pts(size_t(N * l.n));
    for (int64_t j = 0; j < J; ++j) {
        for (int64_t t = 0; t < N; ++t) std::copy_n(y + t * l.d + j * l.n, l.n, &pts[size_t(t * l.n)]);
        const std::vector<float> c = kmeans(pts.data(), N, l.n, K, max_iter, mix_seed(seed, 0, 0, j));
        std::copy(c.begin(), c.end(), books.begin() + j * K * l.n);
    }
    return books;
}

double coding_mse(const Layout& l, const float* codebook, const float* y, int64_t N) {
    const int64_t J = l.subvectors(), K = l.centroids();
    double err = 0;
    for (int64_t t = 0; t < N; ++t) {
        for (int64_t j = 0; j < J; ++j) {
            const float* c = codebook + j * K * l.n;
            const float* v = y + t * l.d + j * l.n;
            const float* ci = c + nearest(c, K, l.n, v) * l.n;
            for (int e = 0; e < l.n; ++e) err += double(v[e] - ci[e]) * double(v[e] - ci[e]);
        }
    }
    return err / double(N * l.d);
}

std::unique_ptr<State> make_random_state(const Layout& l, KvRole role, int64_t layer) {
    auto s = std::make_unique<State>();
    s->layout = l;
    if (role == KvRole::Key) s->lambda.assign(size_t(l.d), 1.0f);
    std::mt19937_64 rng(mix_seed(0x7665637266ull, layer, role == KvRole::Key ? 0 : 1, 0));
    std::normal_distribution<float> nd;
    s->codebook.resize(size_t(l.subvectors() * l.centroids() * l.n));
    for (float& v : s->codebook) v = nd(rng);
    return s;
}

}  // namespace vecinfer

namespace {

std::unique_ptr<vecinfer::State> state_from_file(const vecinfer::Params& p, KvRole role, int64_t d, int64_t layer) {
    const VecinferCalibration c = load_vecinfer_calibration(p.calib);
    if (c.n != p.n || c.m != p.m) {
        fail("{}: calibrated for vecinfer:n={},m={}, not n={},m={}", p.calib, c.n, c.m, p.n, p.m);
    }
    if (c.head_dim != d) fail("{}: calibrated for head_dim {}, not {}", p.calib, c.head_dim, d);
    if (layer >= c.n_layer) fail("{}: calibrated for {} layers, the model has more", p.calib, c.n_layer);
    auto s = std::make_unique<vecinfer::State>();
    s->layout = {d, p.n, p.m};
    const VecinferCalibration::Layer& L = c.layers[size_t(layer)];
    if (role == KvRole::Key) {
        s->lambda = L.key_lambda;
        s->codebook = L.key_codebook;
    } else {
        s->codebook = L.value_codebook;
    }
    return s;
}

std::unique_ptr<vecinfer::State> make_state(const vecinfer::Params& p, KvRole role, int64_t d, int64_t layer) {
    if (p.calib.empty()) {
        fail("KV method 'vecinfer' needs its calibration: calib=FILE from `vxq calibrate --method vecinfer` "
             "(calib=random: seeded random codebooks, for tests only)");
    }
    const vecinfer::Layout l{d, p.n, p.m};
    return p.calib == "random" ? vecinfer::make_random_state(l, role, layer) : state_from_file(p, role, d, layer);
}

class VecinferCodec final : public Codec {
public:
    VecinferCodec(vecinfer::Params p, KvRole role, int64_t d, const KvLayerState* state)
        : p_(std::move(p)), layout_{d, p_.n, p_.m} {
        state_ = dynamic_cast<const vecinfer::State*>(state);
        if (!state_ && p_.calib == "random") {  // a probe: its own layer-0 state
            own_ = vecinfer::make_random_state(layout_, role, 0);
            state_ = own_.get();
        }
        // A probe without a state (registry listing, spec checks) has block sizes, no codes.
        VXQ_ASSERT(!state_ || state_->layout.block_bytes() == layout_.block_bytes());
    }
    std::string spec() const override {
        std::string s = fmt::format("vecinfer:n={},m={}", p_.n, p_.m);
        if (!p_.calib.empty()) s += ",calib=" + p_.calib;
        return s;
    }
    size_t block_bytes(int64_t d) const override {
        VXQ_ASSERT(d == layout_.d);
        return layout_.block_bytes();
    }
    void encode(const float* x, int64_t d, uint8_t* block) const override {
        VXQ_ASSERT(d == layout_.d);
        vecinfer::encode(state(), x, block);
    }
    void decode(const uint8_t* block, int64_t d, float* x) const override {
        VXQ_ASSERT(d == layout_.d);
        vecinfer::decode(state(), block, x);
    }
    KvFormatParams params(int64_t d) const override {
        KvFormatParams f;
        f.kind = KvFormatKind::VecInfer;
        f.block_tokens = 1;
        f.block_bytes = block_bytes(d);
        f.bits = p_.m;
        f.group = p_.n;
        f.layer_state = state_;
        return f;
    }

private:
    const vecinfer::State& state() const {
        if (!state_) fail("vecinfer: this codec has no calibration state (build it through a KV cache)");
        return *state_;
    }
    vecinfer::Params p_;
    vecinfer::Layout layout_;
    const vecinfer::State* state_ = nullptr;
    std::unique_ptr<vecinfer::State> own_;
};

}  // namespace

std::unique_ptr<Codec> make_vecinfer(const CodecSpec& s, KvRole r, int64_t d, const KvLayerState* st) {
    return std::make_unique<VecinferCodec>(vecinfer::parse_params(s, d), r, d, st);
}

std::unique_ptr<KvLayerState> make_vecinfer_state(const CodecSpec& s, KvRole r, int64_t d, int64_t layer) {
    return make_state(vecinfer::parse_params(s, d), r, d, layer);
}

}  // namespace vxq::codecs

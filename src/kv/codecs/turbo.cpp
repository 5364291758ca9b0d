// TurboQuant codecs (METHODS.md "TurboQuant"): the rotations, the Lloyd-Max solver, the per-layer
// state and the scalar reference of the format in kv/formats/turbo.h, and the three codecs.
#include "kv/formats/turbo.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <map>
#include <mutex>
#include <numbers>
#include <random>

#include "core/error.h"
#include "kv/calibration.h"
#include "kv/codecs/codecs.h"
#include "kv/codecs/option_parse.h"

namespace vxq::codecs {

namespace turbo {

namespace {

std::atomic<uint64_t> g_rotation_calls{0};

const char* family_name(Family f) {
    return f == Family::Mse ? "turbo" : f == Family::Prod ? "turbo-prod" : "turbo-rvq";
}

using qjl::mix_seed;

// ---- Lloyd-Max ----------------------------------------------------------------------------
// The solver: a density tabulated on a uniform grid of the line (kGrid points on [-kRange,
// kRange], midpoint rule), prefix sums of w and x*w (linear inside a grid cell), then Lloyd's
// iteration from the density's quantiles: thresholds = midpoints of neighbouring centroids,
// centroid = mean of the density over its cell (prefix-sum lookups), until no centroid moves by
// more than 1e-10 (at most 200000 rounds; b = 4 needs a few thousand). The grid step 2.4e-4 puts the centroids within ~1e-7 of the continuous optimum;
// tests/test_turbo.cpp checks the Gaussian ones against METHODS.md's table to 1e-4.
constexpr int kGrid = 1 << 17;
constexpr double kRange = 16.0;

std::vector<double> lloyd_max(const std::vector<double>& density, int bits) {
    const int levels = 1 << bits;
    const double h = 2 * kRange / kGrid;
    auto x_of = [&](int i) { return -kRange + (i + 0.5) * h; };
    std::vector<double> sw(kGrid + 1, 0.0), sxw(kGrid + 1, 0.0);
    for (int i = 0; i < kGrid; ++i) {
        sw[i + 1] = sw[i] + density[size_t(i)];
        sxw[i + 1] = sxw[i] + density[size_t(i)] * x_of(i);
    }
    // The prefix sums at any x, linear inside a grid cell: the cell masses move continuously
    // with the thresholds, so the iteration never stalls on the grid.
    auto at = [&](const std::vector<double>& sum, double x, bool first_moment) {
        const double u = std::clamp((x + kRange) / h, 0.0, double(kGrid));
        const int i = std::min(int(u), kGrid - 1);
        const double part = (u - i) * density[size_t(i)] * (first_moment ? x_of(i) : 1.0);
        return sum[size_t(i)] + part;
    };
    std::vector<double> c(static_cast<size_t>(levels));
    for (int k = 0, i = 0; k < levels; ++k) {  // start: the centroids of equal-mass cells
        const double target = sw[kGrid] * (k + 0.5) / levels;
        while (i < kGrid && sw[i + 1] < target) ++i;
        c[size_t(k)] = x_of(i);
    }
    for (int round = 0; round < 200000; ++round) {
        double moved = 0, lo = -kRange;
        for (int k = 0; k < levels; ++k) {
            const double hi = k + 1 < levels ? 0.5 * (c[size_t(k)] + c[size_t(k + 1)]) : kRange;
            const double w = at(sw, hi, false) - at(sw, lo, false);
            if (w > 0) {
                const double next = (at(sxw, hi, true) - at(sxw, lo, true)) / w;
                moved = std::max(moved, std::abs(next - c[size_t(k)]));
                c[size_t(k)] = next;
            }
            lo = hi;
        }
        if (moved < 1e-10) break;
    }
    return c;
}

std::vector<double> gaussian_density() {
    std::vector<double> p(kGrid);
    const double h = 2 * kRange / kGrid;
    for (int i = 0; i < kGrid; ++i) {
        const double x = -kRange + (i + 0.5) * h;
        p[size_t(i)] = std::exp(-0.5 * x * x);
    }
    return p;
}

// The Gaussian quantizer of `bits` as a Codebook in N(0, 1) units.
Codebook codebook_of(const std::vector<double>& c, double unit) {
    Codebook cb;
    for (double x : c) cb.centroids.push_back(float(x * unit));
    for (size_t k = 0; k + 1 < c.size(); ++k) cb.thresholds.push_back(float(0.5 * (c[k] + c[k + 1]) * unit));
    return cb;
}

// Solved once per argument set in a process (a cache asks once per layer and role).
template <typename Key, typename Fn>
const std::vector<double>& memo(const Key& key, Fn&& solve) {
    static std::mutex mu;
    static std::map<Key, std::vector<double>> done;
    std::lock_guard<std::mutex> lock(mu);
    auto it = done.find(key);
    if (it == done.end()) it = done.emplace(key, solve()).first;
    return it->second;
}

}  // namespace

std::vector<double> lloyd_max_gaussian(int bits) {
    VXQ_ASSERT(bits >= 0 && bits <= 8);
    return memo(bits, [&] { return lloyd_max(gaussian_density(), bits); });
}

std::vector<double> lloyd_max_residual(int bits1, int bits2) {
    VXQ_ASSERT(bits1 >= 0 && bits1 <= 8 && bits2 >= 0 && bits2 <= 8);
    return memo(std::pair{bits1, bits2}, [&] {
        // Density of r = y - c1[Q1(y)], y ~ N(0, 1): sum over the cells k of the Gaussian at
        // c_k + r, where c_k + r falls in cell k.
        const Codebook q1 = codebook_of(lloyd_max_gaussian(bits1), 1.0);
        const double h = 2 * kRange / kGrid;
        std::vector<double> p(kGrid, 0.0);
        for (int i = 0; i < kGrid; ++i) {
            const double r = -kRange + (i + 0.5) * h;
            for (size_t k = 0; k < q1.centroids.size(); ++k) {
                const double y = q1.centroids[k] + r;
                const bool above = k == 0 || y >= q1.thresholds[k - 1];
                const bool below = k + 1 == q1.centroids.size() || y < q1.thresholds[k];
                if (above && below) p[size_t(i)] += std::exp(-0.5 * y * y);
            }
        }
        return lloyd_max(p, bits2);
    });
}

double lloyd_max_mse(int bits) {
    VXQ_ASSERT(bits >= 0 && bits <= 8);
    if (bits == 0) return 1.0;
    return memo(bits, [&] {
        const std::vector<double>& c = lloyd_max_gaussian(bits);
        const std::vector<double> p = gaussian_density();
        const double h = 2 * kRange / kGrid;
        double sum = 0.0;
        size_t k = 0;
        for (int i = 0; i < kGrid; ++i) {
            const double y = -kRange + (i + 0.5) * h;
            while (k + 1 < c.size() && 0.5 * (c[k] + c[k + 1]) <= y) ++k;
            sum += (y - c[k]) * (y - c[k]) * p[size_t(i)];
        }
        return std::vector<double>{sum * h / std::sqrt(2 * std::numbers::pi)};
    })[0];
}

std::vector<int> allocate_bits(const std::vector<double>& variances, int64_t total) {
    constexpr int kMax = 8;
    double c[kMax + 1];
    for (int b = 0; b <= kMax; ++b) c[b] = lloyd_max_mse(b);
    std::vector<int> bits(variances.size(), 0);
    for (int64_t n = 0; n < total; ++n) {
        size_t best = variances.size();
        double gain = -1.0;
        for (size_t i = 0; i < variances.size(); ++i) {
            if (bits[i] >= kMax) continue;
            const double g = variances[i] * (c[bits[i]] - c[bits[i] + 1]);
            if (g > gain) {
                gain = g;
                best = i;
            }
        }
        if (best == variances.size()) break;  // every coordinate at kMax bits
        ++bits[best];
    }
    return bits;
}

int Codebook::index(float y) const {
    return int(std::upper_bound(thresholds.begin(), thresholds.end(), y) - thresholds.begin());
}

// ---- rotations ------------------------------------------------------------------------------

void fwht(float* x, int64_t d) {
    for (int64_t len = 1; len < d; len <<= 1) {
        for (int64_t i = 0; i < d; i += 2 * len) {
            for (int64_t j = i; j < i + len; ++j) {
                const float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
        }
    }
}

Rotation::Rotation(int64_t d, bool haar, uint64_t seed) : d_(d) {
    std::mt19937_64 rng(seed);
    if (!haar) {
        VXQ_ASSERT(std::has_single_bit(uint64_t(d)));
        signs_.resize(size_t(d));
        for (auto& s : signs_) s = (rng() & 1) ? 1.0f : -1.0f;
        return;
    }
    // Haar: Q of the QR factorization of a Gaussian matrix, columns' signs fixed by diag(R) > 0
    // (modified Gram-Schmidt in double). Stored as Pi = Q^T, rows orthonormal.
    std::normal_distribution<double> nd;
    std::vector<double> a(size_t(d * d));
    for (auto& v : a) v = nd(rng);  // row i = the i-th vector to orthonormalize
    for (int64_t i = 0; i < d; ++i) {
        double* ai = &a[size_t(i * d)];
        for (int64_t j = 0; j < i; ++j) {
            const double* aj = &a[size_t(j * d)];
            double dot = 0;
            for (int64_t c = 0; c < d; ++c) dot += ai[c] * aj[c];
            for (int64_t c = 0; c < d; ++c) ai[c] -= dot * aj[c];
        }
        double nrm = 0;
        for (int64_t c = 0; c < d; ++c) nrm += ai[c] * ai[c];
        nrm = std::sqrt(nrm);
        for (int64_t c = 0; c < d; ++c) ai[c] /= nrm;
    }
    dense_.assign(a.begin(), a.end());
}

Rotation::Rotation(int64_t d, std::vector<float> rows) : d_(d), dense_(std::move(rows)) {
    VXQ_ASSERT(int64_t(dense_.size()) == d * d);
}

void Rotation::apply(float* x) const {
    g_rotation_calls.fetch_add(1, std::memory_order_relaxed);
    if (haar()) {
        float y[1024];
        VXQ_ASSERT(d_ <= 1024);
        // Row i's dot is summed channel after channel; 8 rows go side by side so that 8 such
        // chains of dependent adds overlap (a dot at a time waited on each add: the query's
        // rotation in a rot=calib decode step cost as much as a tenth of the step). Every row's
        // order of operations is unchanged, so is every y[i].
        double xd[1024];
        for (int64_t c = 0; c < d_; ++c) xd[c] = x[c];
        int64_t i = 0;
        for (; i + 8 <= d_; i += 8) {
            const float* r = &dense_[size_t(i * d_)];
            double s[8] = {};
            for (int64_t c = 0; c < d_; ++c)
                for (int k = 0; k < 8; ++k) s[k] += double(r[k * d_ + c]) * xd[c];
            for (int k = 0; k < 8; ++k) y[i + k] = float(s[k]);
        }
        for (; i < d_; ++i) {
            const float* r = &dense_[size_t(i * d_)];
            double s = 0;
            for (int64_t c = 0; c < d_; ++c) s += double(r[c]) * x[c];
            y[i] = float(s);
        }
        std::copy(y, y + d_, x);
        return;
    }
    const float inv = 1.0f / std::sqrt(float(d_));
    for (int64_t c = 0; c < d_; ++c) x[c] *= signs_[size_t(c)];
    fwht(x, d_);
    for (int64_t c = 0; c < d_; ++c) x[c] *= inv;
}

void Rotation::apply_t(float* x) const {
    g_rotation_calls.fetch_add(1, std::memory_order_relaxed);
    if (haar()) {
        double y[1024] = {};
        VXQ_ASSERT(d_ <= 1024);
        for (int64_t i = 0; i < d_; ++i) {
            const float* r = &dense_[size_t(i * d_)];
            for (int64_t c = 0; c < d_; ++c) y[c] += double(r[c]) * x[i];
        }
        for (int64_t c = 0; c < d_; ++c) x[c] = float(y[c]);
        return;
    }
    const float inv = 1.0f / std::sqrt(float(d_));
    fwht(x, d_);  // H is symmetric: Pi^T = diag(s) H / sqrt(d)
    for (int64_t c = 0; c < d_; ++c) x[c] *= signs_[size_t(c)] * inv;
}

uint64_t rotation_calls() { return g_rotation_calls.load(std::memory_order_relaxed); }

// ---- params, layout, state --------------------------------------------------------------------

Params parse_params(const CodecSpec& spec, Family family, int64_t d) {
    check_known_options(spec, {"bits", "rot", "seed", "calib"});
    Params p;
    p.family = family;
    p.bits = int(int_option(spec, "bits", 3, 1, 4));
    p.seed = uint64_t(int_option(spec, "seed", 0, 0, INT64_MAX));
    const bool pow2 = d > 0 && std::has_single_bit(uint64_t(d));
    const auto rot = spec.options.find("rot");
    bool rot_calib = false;
    if (rot == spec.options.end()) {
        p.haar = !pow2;
    } else if (rot->second == "haar") {
        p.haar = true;
    } else if (rot->second == "hadamard") {
        if (!pow2) fail("KV method '{}': rot=hadamard needs a power-of-two head_dim, not {} (use rot=haar)", spec.name, d);
    } else if (rot->second == "calib" && family == Family::Mse) {
        rot_calib = true;
    } else {
        fail("KV method '{}': rot={} (must be hadamard or haar{})", spec.name, rot->second,
             family == Family::Mse ? " or calib" : "");
    }
    if (const auto c = spec.options.find("calib"); c != spec.options.end()) p.calib = c->second;
    if (rot_calib && p.calib.empty()) {
        fail("KV method '{}': rot=calib needs calib=FILE from `vxq calibrate --method turbo` (calib=random: a seeded "
             "basis and spectrum, for tests only)",
             spec.name);
    }
    if (!rot_calib && !p.calib.empty()) fail("KV method '{}': calib=FILE goes with rot=calib", spec.name);
    if (d < 1 || d > 1024) fail("KV method '{}': head_dim {} is out of range [1, 1024]", spec.name, d);
    return p;
}

Layout layout_of(const Params& p, KvRole role, int64_t d) {
    if (p.family == Family::Prod && role == KvRole::Key) return {d, p.bits - 1, 0, true};
    if (p.family == Family::Rvq) return {d, p.bits, p.bits, false};
    return {d, p.bits, 0, false};
}

namespace {

// The layer's basis: a seeded Hadamard or Haar rotation; rot=calib: Pi's rows and the rotated
// coordinates' variances from the calibration file, or (calib=random) a seeded Haar basis with
// variances falling as 0.85^i.
Basis basis_of(const Params& p, KvRole role, int64_t d, int64_t layer) {
    if (!p.calibrated()) return {Rotation(d, p.haar, mix_seed(p.seed, layer, role, 0)), {}, {}};
    if (p.calib == "random") {
        Basis b{Rotation(d, true, mix_seed(p.seed, layer, role, 2)), std::vector<double>(size_t(d)),
                std::vector<double>(size_t(d), 1.0)};
        double sum = 0.0;
        for (int64_t i = 0; i < d; ++i) sum += b.variances[size_t(i)] = std::pow(0.85, double(i));
        for (double& v : b.variances) v /= sum;
        return b;
    }
    const TurboCalibration c = load_turbo_calibration(p.calib);
    if (c.head_dim != d) fail("{}: calibrated for head_dim {}, not {}", p.calib, c.head_dim, d);
    if (layer >= c.n_layer) fail("{}: calibrated for {} layers, the model has more", p.calib, c.n_layer);
    const TurboCalibration::Layer& L = c.layers[size_t(layer)];
    const bool key = role == KvRole::Key;
    const std::vector<float>& var = key ? L.key_variance : L.value_variance;
    return {Rotation(d, key ? L.key_basis : L.value_basis), std::vector<double>(var.begin(), var.end()),
            key ? std::vector<double>(L.key_weight.begin(), L.key_weight.end()) : std::vector<double>(size_t(d), 1.0)};
}

}  // namespace

State::State(const Params& p, KvRole role, int64_t d, int64_t layer) : State(p, role, d, layer, basis_of(p, role, d, layer)) {}

State::State(const Params& p, KvRole role, int64_t d, int64_t layer, Basis basis)
    : params(p), layout(layout_of(p, role, d)), rot(std::move(basis.rot)) {
    const double unit = 1.0 / std::sqrt(double(d));
    if (p.calibrated()) {  // per coordinate: its bits, where they start, its scale; codebooks per bit count
        const std::vector<double>& variances = basis.variances;
        std::vector<double> importance(static_cast<size_t>(d));
        for (int64_t c = 0; c < d; ++c) importance[size_t(c)] = variances[size_t(c)] * basis.weights[size_t(c)];
        const std::vector<int> bits = allocate_bits(importance, int64_t(layout.bits1) * d);
        int32_t offset = 0;
        for (int64_t c = 0; c < d; ++c) {
            coord_bits.push_back(uint8_t(bits[size_t(c)]));
            coord_offset.push_back(offset);
            coord_scale.push_back(float(std::sqrt(std::max(variances[size_t(c)], 0.0))));
            offset += bits[size_t(c)];
        }
        const int top = *std::max_element(bits.begin(), bits.end());
        for (int b = 0; b <= top; ++b) cbk.push_back(codebook_of(b == 0 ? std::vector<double>{0.0} : lloyd_max_gaussian(b), 1.0));
    }
    cb1 = codebook_of(lloyd_max_gaussian(layout.bits1), unit);
    if (layout.bits2 > 0) cb2 = codebook_of(lloyd_max_residual(layout.bits1, layout.bits2), unit);
    if (layout.qjl) {
        sketch = qjl::Sketch(d, d, mix_seed(p.seed, layer, role, 1));
        qjl_scale = sketch.scale();
    }
}

size_t State::bytes() const {
    size_t floats = cb1.centroids.size() + cb1.thresholds.size() + cb2.centroids.size() + cb2.thresholds.size();
    for (const Codebook& c : cbk) floats += c.centroids.size() + c.thresholds.size();
    const size_t coords = coord_bits.size() + coord_offset.size() * sizeof(int32_t) + coord_scale.size() * sizeof(float);
    return rot.bytes() + floats * sizeof(float) + sketch.bytes() + coords;
}

// ---- the scalar reference ---------------------------------------------------------------------


void encode(const State& s, const float* x, uint8_t* block) {
    const Layout& l = s.layout;
    const int64_t d = l.d;
    std::memset(block, 0, l.block_bytes());
    double nn = 0;
    for (int64_t c = 0; c < d; ++c) nn += double(x[c]) * x[c];
    const float n = float(std::sqrt(nn));
    store_fp16(block, n);
    // A zero vector codes as y = 0 (every index at its middle; the norm makes it decode to 0).
    const float inv = n > 0.0f ? 1.0f / n : 0.0f;
    float y[1024], r[1024];
    for (int64_t c = 0; c < d; ++c) y[c] = x[c] * inv;
    s.rot.apply(y);
    if (s.params.calibrated()) {
        for (int64_t c = 0; c < d; ++c) {
            const int b = s.coord_bits[size_t(c)];
            if (b == 0) continue;
            const float sc = s.coord_scale[size_t(c)];
            put_bits(block + l.idx1_offset(), s.coord_offset[size_t(c)], b, s.cbk[size_t(b)].index(sc > 0.0f ? y[c] / sc : 0.0f));
        }
        return;
    }
    double rr = 0;
    for (int64_t c = 0; c < d; ++c) {
        const int i1 = s.cb1.index(y[c]);
        if (l.bits1 > 0) put_index(block + l.idx1_offset(), c, l.bits1, i1);
        r[c] = y[c] - s.cb1.centroids[size_t(i1)];
        if (l.bits2 > 0) {
            const int i2 = s.cb2.index(r[c]);
            put_index(block + l.idx2_offset(), c, l.bits2, i2);
            r[c] -= s.cb2.centroids[size_t(i2)];
        }
        rr += double(r[c]) * r[c];
    }
    if (!l.qjl) return;
    store_fp16(block + l.gamma_offset(), float(std::sqrt(rr)));
    s.sketch.signs(r, block + l.sign_offset());
}

void rotated_codes(const State& s, const uint8_t* block, float* y) {
    const Layout& l = s.layout;
    const uint8_t* a1 = block + l.idx1_offset();
    const uint8_t* a2 = block + l.idx2_offset();
    if (s.params.calibrated()) {
        for (int64_t c = 0; c < l.d; ++c) {
            const int b = s.coord_bits[size_t(c)];
            y[c] = b == 0 ? 0.0f
                          : s.coord_scale[size_t(c)] * s.cbk[size_t(b)].centroids[size_t(bits_at(a1, s.coord_offset[size_t(c)], b))];
        }
        return;
    }
    for (int64_t c = 0; c < l.d; ++c) {
        y[c] = s.cb1.centroids[size_t(l.bits1 > 0 ? index_at(a1, c, l.bits1) : 0)];
        if (l.bits2 > 0) y[c] += s.cb2.centroids[size_t(index_at(a2, c, l.bits2))];
    }
}

void decode(const State& s, const uint8_t* block, float* x) {
    const Layout& l = s.layout;
    rotated_codes(s, block, x);
    if (l.qjl) {
        const float k = s.qjl_scale * load_fp16(block + l.gamma_offset());
        s.sketch.add_transposed(block + l.sign_offset(), k, x);
    }
    s.rot.apply_t(x);
    const float n = load_fp16(block);
    for (int64_t c = 0; c < l.d; ++c) x[c] *= n;
}

}  // namespace turbo

namespace {

using turbo::Family;

class TurboCodec final : public Codec {
public:
    TurboCodec(turbo::Params p, KvRole role, int64_t d, const KvLayerState* state)
        : p_(p), layout_(turbo::layout_of(p, role, d)) {
        state_ = dynamic_cast<const turbo::State*>(state);
        if (!state_) {  // a probe (registry listing, spec checks): its own layer-0 state
            own_ = std::make_unique<turbo::State>(p, role, d, 0);
            state_ = own_.get();
        }
        VXQ_ASSERT(state_->layout.block_bytes() == layout_.block_bytes());
    }
    std::string spec() const override {
        std::string s = fmt::format("{}:bits={}", turbo::family_name(p_.family), p_.bits);
        if (p_.calibrated()) s += ",rot=calib,calib=" + p_.calib;
        if (p_.haar) s += ",rot=haar";
        if (p_.seed != 0) s += fmt::format(",seed={}", p_.seed);
        return s;
    }
    size_t block_bytes(int64_t d) const override {
        VXQ_ASSERT(d == layout_.d);
        return layout_.block_bytes();
    }
    void encode(const float* x, int64_t d, uint8_t* block) const override {
        VXQ_ASSERT(d == layout_.d);
        turbo::encode(*state_, x, block);
    }
    void decode(const uint8_t* block, int64_t d, float* x) const override {
        VXQ_ASSERT(d == layout_.d);
        turbo::decode(*state_, block, x);
    }
    KvFormatParams params(int64_t d) const override {
        KvFormatParams f;
        f.kind = layout_.qjl ? KvFormatKind::TurboProd : layout_.bits2 > 0 ? KvFormatKind::TurboRvq : KvFormatKind::TurboMse;
        f.block_tokens = 1;
        f.block_bytes = block_bytes(d);
        f.bits = layout_.bits1;
        f.layer_state = state_;
        return f;
    }

private:
    turbo::Params p_;
    turbo::Layout layout_;
    const turbo::State* state_ = nullptr;
    std::unique_ptr<turbo::State> own_;
};

template <Family F>
std::unique_ptr<Codec> make_family(const CodecSpec& spec, KvRole role, int64_t d, const KvLayerState* state) {
    return std::make_unique<TurboCodec>(turbo::parse_params(spec, F, d), role, d, state);
}

template <Family F>
std::unique_ptr<KvLayerState> make_family_state(const CodecSpec& spec, KvRole role, int64_t d, int64_t layer) {
    return std::make_unique<turbo::State>(turbo::parse_params(spec, F, d), role, d, layer);
}

}  // namespace

std::unique_ptr<Codec> make_turbo(const CodecSpec& s, KvRole r, int64_t d, const KvLayerState* st) {
    return make_family<Family::Mse>(s, r, d, st);
}
std::unique_ptr<Codec> make_turbo_prod(const CodecSpec& s, KvRole r, int64_t d, const KvLayerState* st) {
    return make_family<Family::Prod>(s, r, d, st);
}
std::unique_ptr<Codec> make_turbo_rvq(const CodecSpec& s, KvRole r, int64_t d, const KvLayerState* st) {
    return make_family<Family::Rvq>(s, r, d, st);
}
std::unique_ptr<KvLayerState> make_turbo_state(const CodecSpec& s, KvRole r, int64_t d, int64_t layer) {
    return make_family_state<Family::Mse>(s, r, d, layer);
}
std::unique_ptr<KvLayerState> make_turbo_prod_state(const CodecSpec& s, KvRole r, int64_t d, int64_t layer) {
    return make_family_state<Family::Prod>(s, r, d, layer);
}
std::unique_ptr<KvLayerState> make_turbo_rvq_state(const CodecSpec& s, KvRole r, int64_t d, int64_t layer) {
    return make_family_state<Family::Rvq>(s, r, d, layer);
}

}  // namespace vxq::codecs

#include "runtime/calibrate.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "core/eigen.h"
#include "core/error.h"
#include "core/sha256.h"
#include "core/thread_pool.h"
#include "kv/formats/vecinfer.h"
#include "kv/kv_cache.h"

namespace vxq {

namespace {

namespace vi = codecs::vecinfer;

// Keeps every K/V the model writes, per layer, in arrival order.   [layer][token, n_head_kv, head_dim]
class KvCollector final : public KvObserver {
public:
    explicit KvCollector(int64_t n_layer) : k(size_t(n_layer)), v(size_t(n_layer)) {}
    void on_write(int64_t layer, int64_t pos0, const float* kk, const float* vv, int64_t n) override {
        const size_t count = size_t(n) * row;
        k[size_t(layer)].insert(k[size_t(layer)].end(), kk, kk + count);
        v[size_t(layer)].insert(v[size_t(layer)].end(), vv, vv + count);
    }
    void on_attention(int64_t, const float*, int64_t, int64_t, const float*) override {}
    size_t row = 0;
    std::vector<std::vector<float>> k, v;
};

// Per layer and query head, the sums of q q^T (upper triangle not exploited: d is small) and of
// q over every post-RoPE query the model attends with.
class QueryMoments final : public KvObserver {
public:
    QueryMoments(int64_t n_layer, int64_t n_head, int64_t d)
        : n_head(n_head), d(d), qq(size_t(n_layer * n_head * d * d), 0.0), qs(size_t(n_layer * n_head * d), 0.0) {}
    void on_write(int64_t, int64_t, const float*, const float*, int64_t) override {}
    void on_attention(int64_t layer, const float* q, int64_t n_q, int64_t, const float*) override {
        for (int64_t t = 0; t < n_q; ++t) {
            for (int64_t h = 0; h < n_head; ++h) {
                const float* x = q + (t * n_head + h) * d;
                double* c = &qq[size_t((layer * n_head + h) * d * d)];
                double* s = &qs[size_t((layer * n_head + h) * d)];
                for (int64_t i = 0; i < d; ++i) {
                    s[i] += x[i];
                    for (int64_t j = 0; j < d; ++j) c[i * d + j] += double(x[i]) * x[j];
                }
            }
        }
        n_queries += n_q;
    }
    int64_t n_head, d, n_queries = 0;
    std::vector<double> qq, qs;
};

// Hands every event to two observers (the keys and values, and the queries, in one run).
class Tee final : public KvObserver {
public:
    Tee(KvObserver& a, KvObserver& b) : a_(a), b_(b) {}
    void on_write(int64_t layer, int64_t pos0, const float* k, const float* v, int64_t n) override {
        a_.on_write(layer, pos0, k, v, n);
        b_.on_write(layer, pos0, k, v, n);
    }
    void on_attention(int64_t layer, const float* q, int64_t n_q, int64_t pos0, const float* out) override {
        a_.on_attention(layer, q, n_q, pos0, out);
        b_.on_attention(layer, q, n_q, pos0, out);
    }

private:
    KvObserver &a_, &b_;
};

// The text's first max_tokens tokens (vxq::Error when it has none).
std::vector<TokenId> calibration_tokens(const Model& model, std::string_view text, int64_t max_tokens) {
    std::vector<TokenId> tokens = model.tokenizer().encode(text, /*add_special=*/true);
    if (int64_t(tokens.size()) > max_tokens) tokens.resize(size_t(max_tokens));
    if (tokens.empty()) fail("calibrate: the text has no tokens");
    return tokens;
}

// Runs the model over `tokens` in fresh contexts of n_ctx tokens, an observer on an f16 cache.
void run_tokens(const Model& model, Backend& be, const std::vector<TokenId>& tokens, int64_t n_ctx, KvObserver& observer,
                const std::function<void(const char*, int64_t, int64_t)>& progress) {
    const ModelConfig& cfg = model.config();
    n_ctx = std::min<int64_t>(n_ctx, int64_t(tokens.size()));
    auto cache = make_kv_cache(KvShape{cfg.n_layer, cfg.n_head, cfg.n_head_kv, cfg.head_dim, n_ctx}, "f16", "f16");
    cache->set_observer(&observer);
    std::vector<float> logits(size_t(cfg.n_vocab));
    const bool add_bos = model.tokenizer().vocab().add_bos;
    const TokenId bos = model.tokenizer().vocab().bos;
    for (int64_t t0 = 0; t0 < int64_t(tokens.size()); t0 += n_ctx) {
        std::vector<TokenId> chunk(tokens.begin() + t0, tokens.begin() + std::min<int64_t>(t0 + n_ctx, tokens.size()));
        if (t0 > 0 && add_bos && bos >= 0) chunk[0] = bos;  // each chunk a fresh context, as perplexity's
        cache->truncate(0);
        model.forward(be, *cache, chunk, int64_t(1), logits.data());
        if (progress) progress("tokens", t0 + int64_t(chunk.size()), int64_t(tokens.size()));
    }
    cache->set_observer(nullptr);
}

// The model a calibration belongs to (sha256 and file name) and the tokens it saw.
template <class C>
void stamp(C& c, const Model& model, int64_t tokens) {
    c.model_sha256 = sha256_file(model.file().path());
    c.model_file = std::filesystem::path(model.file().path()).filename().string();
    c.tokens = tokens;
}

// The top eigenvector of the symmetric positive semi-definite d x d matrix C (power iteration in
// double from a start that is not orthogonal to a generic top vector, to a change below 1e-12),
// into v; returns its eigenvalue.
double top_eigenvector(const double* C, int64_t d, std::vector<double>& v) {
    std::vector<double> w(static_cast<size_t>(d));
    v.resize(static_cast<size_t>(d));
    for (int64_t i = 0; i < d; ++i) v[size_t(i)] = 1.0 + 0.01 * double(i);
    double lambda = 0.0;
    for (int it = 0; it < 1000; ++it) {
        double norm = 0.0;
        for (int64_t i = 0; i < d; ++i) {
            double a = 0.0;
            for (int64_t j = 0; j < d; ++j) a += C[i * d + j] * v[size_t(j)];
            w[size_t(i)] = a;
            norm += a * a;
        }
        norm = std::sqrt(norm);
        if (norm == 0.0) break;
        double change = 0.0;
        for (int64_t i = 0; i < d; ++i) {
            const double x = w[size_t(i)] / norm;
            change = std::max(change, std::abs(x - v[size_t(i)]));
            v[size_t(i)] = x;
        }
        lambda = norm;
        if (change < 1e-12) break;
    }
    return lambda;
}

}  // namespace

QFiltersCalibration calibrate_qfilters(const Model& model, Backend& be, std::string_view text,
                                       const QFiltersCalibrateParams& p, QFiltersCalibrateStats* stats,
                                       const std::function<void(const char*, int64_t, int64_t)>& progress) {
    const ModelConfig& cfg = model.config();
    const int64_t d = cfg.head_dim, L = cfg.n_layer, nh = cfg.n_head, H = cfg.n_head_kv, rep = nh / H;
    if (p.max_tokens < 1 || p.n_ctx < 1) fail("calibrate: tokens and context must be >= 1");
    QueryMoments mom(L, nh, d);
    const std::vector<TokenId> tokens = calibration_tokens(model, text, p.max_tokens);
    run_tokens(model, be, tokens, p.n_ctx, mom, progress);

    QFiltersCalibration c;
    stamp(c, model, int64_t(tokens.size()));
    c.n_layer = L;
    c.n_head_kv = H;
    c.head_dim = d;
    c.filters.assign(size_t(L * H * d), 0.0f);
    if (stats) {
        stats->explained.assign(size_t(L * nh), 0.0);
        stats->mean_proj.assign(size_t(L * nh), 0.0);
    }
    std::vector<double> v;
    for (int64_t l = 0; l < L; ++l) {
        for (int64_t h = 0; h < nh; ++h) {
            const double* C = &mom.qq[size_t((l * nh + h) * d * d)];
            const double* s = &mom.qs[size_t((l * nh + h) * d)];
            const double lambda = top_eigenvector(C, d, v);
            double proj = 0.0;  // sum_i <q_i, v1>: the sign of sum_i u1_i
            for (int64_t i = 0; i < d; ++i) proj += s[i] * v[size_t(i)];
            const double sign = proj < 0.0 ? -1.0 : 1.0;
            float* f = &c.filters[size_t((l * H + h / rep) * d)];
            for (int64_t i = 0; i < d; ++i) f[i] += float(sign * v[size_t(i)] / double(rep));
            if (stats) {
                double trace = 0.0;
                for (int64_t i = 0; i < d; ++i) trace += C[i * d + i];
                stats->explained[size_t(l * nh + h)] = trace > 0.0 ? lambda / trace : 0.0;
                stats->mean_proj[size_t(l * nh + h)] = trace > 0.0 ? std::abs(proj) / std::sqrt(trace * double(mom.n_queries)) : 0.0;
            }
        }
    }
    return c;
}

VecinferCalibration calibrate_vecinfer(const Model& model, Backend& be, std::string_view text,
                                       const VecinferCalibrateParams& p, VecinferCalibrateStats* stats,
                                       const std::function<void(const char*, int64_t, int64_t)>& progress) {
    const ModelConfig& cfg = model.config();
    const int64_t d = cfg.head_dim, H = cfg.n_head_kv, L = cfg.n_layer;
    vi::parse_params(CodecSpec{"vecinfer", {{"n", std::to_string(p.n)}, {"m", std::to_string(p.m)}}}, d);  // n, m, d valid
    const vi::Layout layout{d, p.n, p.m};
    if (p.max_tokens < 1 || p.n_ctx < 1) fail("calibrate: tokens and context must be >= 1");
    if (p.iterations < 1 || p.iterations > 30) fail("calibrate: --iterations {} is out of range [1, 30]", p.iterations);
    const std::vector<TokenId> tokens = calibration_tokens(model, text, p.max_tokens);
    const int64_t N = int64_t(tokens.size()) * H;  // points per sub-space and layer
    if (N < layout.centroids()) {
        fail("calibrate: the text gives {} tokens x {} KV heads = {} vectors, fewer than the 2^{} = {} centroids",
             tokens.size(), H, N, p.m, layout.centroids());
    }

    KvCollector col(L);
    col.row = size_t(H * d);
    run_tokens(model, be, tokens, p.n_ctx, col, progress);

    VecinferCalibration c;
    stamp(c, model, int64_t(tokens.size()));
    c.n = p.n;
    c.m = p.m;
    c.n_layer = L;
    c.n_head_kv = H;
    c.head_dim = d;
    c.iterations = p.iterations;
    c.seed = p.seed;
    c.layers.resize(size_t(L));
    if (stats) {
        stats->key_rel_mse.assign(size_t(L), 0.0);
        stats->value_rel_mse.assign(size_t(L), 0.0);
    }
    for (int64_t l = 0; l < L; ++l) {  // lambda, then both roles into the coded domain in place
        std::vector<float>& K = col.k[size_t(l)];
        VXQ_ASSERT(int64_t(K.size()) == N * d);
        std::vector<float>& lambda = c.layers[size_t(l)].key_lambda;
        lambda.assign(size_t(d), 0.0f);
        for (int64_t t = 0; t < N; ++t)
            for (int64_t i = 0; i < d; ++i) lambda[size_t(i)] = std::max(lambda[size_t(i)], std::abs(K[size_t(t * d + i)]));
        for (float& x : lambda) x = x > 0.0f ? std::sqrt(x) : 1.0f;
        for (int64_t t = 0; t < N; ++t) {
            float* k = &K[size_t(t * d)];
            for (int64_t i = 0; i < d; ++i) k[i] /= lambda[size_t(i)];
            vi::hadamard(k, d);
            vi::hadamard(&col.v[size_t(l)][size_t(t * d)], d);
        }
    }

    // One job per (layer, role), taken in order by whichever worker is free.
    ThreadPool pool(std::max(1, p.threads));
    std::atomic<int64_t> next{0}, done{0};
    std::mutex mu;
    pool.run([&](int, int) {
        for (int64_t job; (job = next.fetch_add(1)) < 2 * L;) {
            const int64_t l = job / 2;
            const bool key = job % 2 == 0;
            const std::vector<float>& y = key ? col.k[size_t(l)] : col.v[size_t(l)];
            const uint64_t seed = p.seed * 0x9E3779B97F4A7C15ull + uint64_t(job);
            std::vector<float> books = vi::train_codebooks(layout, y.data(), N, p.iterations, seed);
            if (stats) {
                double ms = 0;
                for (float x : y) ms += double(x) * x;
                ms /= double(y.size());
                const double rel = ms > 0 ? vi::coding_mse(layout, books.data(), y.data(), N) / ms : 0.0;
                (key ? stats->key_rel_mse : stats->value_rel_mse)[size_t(l)] = rel;
            }
            (key ? c.layers[size_t(l)].key_codebook : c.layers[size_t(l)].value_codebook) = std::move(books);
            const int64_t finished = done.fetch_add(1) + 1;
            if (progress) {
                std::lock_guard<std::mutex> lock(mu);
                progress("k-means", finished, 2 * L);
            }
        }
    });
    return c;
}

KvSamples collect_kv(const Model& model, Backend& be, std::string_view text, int64_t max_tokens, int64_t n_ctx,
                     KvObserver* also, const std::function<void(const char*, int64_t, int64_t)>& progress) {
    const ModelConfig& cfg = model.config();
    if (max_tokens < 1 || n_ctx < 1) fail("calibrate: tokens and context must be >= 1");
    const std::vector<TokenId> tokens = calibration_tokens(model, text, max_tokens);
    KvCollector col(cfg.n_layer);
    col.row = size_t(cfg.n_head_kv * cfg.head_dim);
    if (also) {
        Tee both(col, *also);
        run_tokens(model, be, tokens, n_ctx, both, progress);
    } else {
        run_tokens(model, be, tokens, n_ctx, col, progress);
    }
    return KvSamples{int64_t(tokens.size()), std::move(col.k), std::move(col.v)};
}

std::vector<double> unit_second_moment(const float* x, size_t n, size_t stride, int64_t d, int64_t* used) {
    std::vector<double> m(size_t(d * d), 0.0);
    int64_t count = 0;
    for (size_t t = 0; t < n; ++t) {
        const float* v = x + t * stride;
        double n2 = 0.0;
        for (int64_t i = 0; i < d; ++i) n2 += double(v[i]) * v[i];
        if (n2 <= 0.0) continue;
        ++count;
        for (int64_t i = 0; i < d; ++i) {
            const double vi = v[i] / n2;
            for (int64_t j = 0; j < d; ++j) m[size_t(i * d + j)] += vi * v[j];
        }
    }
    if (count > 0) {
        for (double& e : m) e /= double(count);
    }
    if (used) *used = count;
    return m;
}

TurboCalibration calibrate_turbo(const Model& model, Backend& be, std::string_view text, const TurboCalibrateParams& p,
                                 const std::function<void(const char*, int64_t, int64_t)>& progress) {
    const ModelConfig& cfg = model.config();
    const int64_t d = cfg.head_dim, L = cfg.n_layer;
    if (d > 1024) fail("calibrate: head_dim {} is above turbo's 1024", d);
    QueryMoments queries(L, cfg.n_head, d);
    const KvSamples kv = collect_kv(model, be, text, p.max_tokens, p.n_ctx, &queries, progress);

    TurboCalibration c;
    stamp(c, model, kv.tokens);
    c.n_layer = L;
    c.head_dim = d;
    c.layers.resize(size_t(L));
    for (int64_t l = 0; l < L; ++l) {
        for (const bool key : {true, false}) {
            const std::vector<float>& x = key ? kv.k[size_t(l)] : kv.v[size_t(l)];
            int64_t used = 0;  // every (token, KV head) row
            std::vector<double> m = unit_second_moment(x.data(), x.size() / size_t(d), size_t(d), d, &used);
            // Fewer vectors than dimensions (none: a layer that wrote only zeros) leave directions the
            // text never showed with variance 0, so the basis would give them no bits and code any
            // later key or value along them as 0.
            if (used < d) {
                fail("calibrate: layer {} has {} nonzero {} vectors (tokens x KV heads), fewer than head_dim {}: "
                     "no full eigenbasis (give more text or --tokens)",
                     l, used, key ? "key" : "value", d);
            }
            const SymmetricEigen e = symmetric_eigen(std::move(m), d);
            TurboCalibration::Layer& out = c.layers[size_t(l)];
            std::vector<float>& basis = key ? out.key_basis : out.value_basis;
            std::vector<float>& var = key ? out.key_variance : out.value_variance;
            basis.assign(e.vectors.begin(), e.vectors.end());
            for (double v : e.values) var.push_back(float(std::max(v, 0.0)));
            if (!key) continue;
            // The queries' mean square along each key eigenvector e_i: e_i^T Q e_i with Q the sum
            // over the layer's query heads of q q^T (summed once), relative to its mean over i.
            std::vector<double> q(static_cast<size_t>(d * d), 0.0);
            for (int64_t h = 0; h < cfg.n_head; ++h) {
                const double* qq = &queries.qq[size_t((l * cfg.n_head + h) * d * d)];
                for (int64_t i = 0; i < d * d; ++i) q[size_t(i)] += qq[i];
            }
            std::vector<double> w(static_cast<size_t>(d), 0.0);
            for (int64_t i = 0; i < d; ++i) {
                const double* ei = &e.vectors[size_t(i * d)];
                for (int64_t a = 0; a < d; ++a) {
                    double row = 0.0;
                    for (int64_t b = 0; b < d; ++b) row += q[size_t(a * d + b)] * ei[b];
                    w[size_t(i)] += ei[a] * row;
                }
            }
            double mean = 0.0;
            for (double v : w) mean += v / double(d);
            for (double v : w) out.key_weight.push_back(mean > 0.0 ? float(std::max(v / mean, 1e-6)) : 1.0f);
        }
        if (progress) progress("eigenbasis", l + 1, L);
    }
    return c;
}

}  // namespace vxq

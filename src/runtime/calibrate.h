// `vxq calibrate`: runs a model over a text and computes a KV method's calibration artifact
// (kv/calibration.h): VecInfer's per-layer smoothing factors and product-quantizer codebooks
// (METHODS.md "VecInfer"), Q-Filters' per-head filter directions (METHODS.md "Eviction").
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "kv/calibration.h"
#include "kv/kv_cache.h"
#include "model/model.h"

namespace vxq {

struct VecinferCalibrateParams {
    int n = 4, m = 8;
    int64_t max_tokens = 2048;  // tokens of the text's start run through the model
    int64_t n_ctx = 512;        // tokens per forward pass; each chunk starts a fresh context
    int iterations = 30;        // k-means rounds at most (METHODS.md: <= 30)
    uint64_t seed = 0;          // k-means initialisation
    int threads = 1;            // k-means runs (layer, role) jobs in parallel
};

struct VecinferCalibrateStats {
    // Per layer, the in-sample coding error of the calibration vectors relative to their mean
    // square (in the coded domain, where the transform is orthonormal).   [n_layer]
    std::vector<double> key_rel_mse, value_rel_mse;
};

// Collects the post-RoPE K and V of every layer and KV head (a KvObserver on an f16 cache) over
// the first max_tokens tokens of `text`, then per layer: lambda_i = sqrt(max over tokens and KV
// heads of |K_i|) (1 where that is 0), keys y = H (k / lambda) / sqrt(d), values y = H v / sqrt(d),
// and one k-means per (role, sub-space) over all the layer's tokens and KV heads, seeded with
// (seed, layer, role, sub-space). vxq::Error when the text gives fewer points than centroids.
// progress(stage, done, total): stage "tokens" while the model runs, "k-means" per (layer, role).
VecinferCalibration calibrate_vecinfer(const Model& model, Backend& be, std::string_view text,
                                       const VecinferCalibrateParams& p, VecinferCalibrateStats* stats = nullptr,
                                       const std::function<void(const char*, int64_t, int64_t)>& progress = {});

struct QFiltersCalibrateParams {
    int64_t max_tokens = 2048;  // tokens of the text's start run through the model
    int64_t n_ctx = 512;        // tokens per forward pass; each chunk starts a fresh context
};

struct QFiltersCalibrateStats {
    // Per layer and query head: the share of the queries' second moment along v1
    // (sigma_1^2 / sum sigma^2), and the mean of <q, v1+> over the rms of |q| (>= 0 by the sign).
    std::vector<double> explained, mean_proj;  // [n_layer * n_head]
};

// Q-Filters (METHODS.md "Eviction"): runs the model over the first max_tokens tokens of `text`
// (an f16 cache, an observer on the post-RoPE queries), then per layer and query head the first
// right singular vector v1 of the head's query matrix Q (the top eigenvector of Q^T Q by power
// iteration, in double), its sign fixed so that sum_i <q_i, v1> >= 0 (the sign of sum_i u1_i),
// and per KV head the mean of its query heads' v1+.
QFiltersCalibration calibrate_qfilters(const Model& model, Backend& be, std::string_view text,
                                       const QFiltersCalibrateParams& p, QFiltersCalibrateStats* stats = nullptr,
                                       const std::function<void(const char*, int64_t, int64_t)>& progress = {});

// Every post-RoPE key and value the model writes over the first max_tokens tokens of `text`, in
// fresh contexts of n_ctx tokens on an f16 cache (the run every calibration makes): per layer
// [token, n_head_kv, head_dim]. `also`, when given, observes the same run (the queries).
struct KvSamples {
    int64_t tokens = 0;
    std::vector<std::vector<float>> k, v;  // [n_layer]
};
KvSamples collect_kv(const Model& model, Backend& be, std::string_view text, int64_t max_tokens, int64_t n_ctx,
                     KvObserver* also = nullptr, const std::function<void(const char*, int64_t, int64_t)>& progress = {});

// The second moment of the unit vectors x / |x| (in double): the mean of x x^T / |x|^2 over the n
// vectors of d values at x + i * stride, zero vectors skipped; `used` (optional) gets how many
// counted (0: a zero matrix).   [d, d]
std::vector<double> unit_second_moment(const float* x, size_t n, size_t stride, int64_t d, int64_t* used = nullptr);

struct TurboCalibrateParams {
    int64_t max_tokens = 2048;  // tokens of the text's start run through the model
    int64_t n_ctx = 512;        // tokens per forward pass; each chunk starts a fresh context
};

// TurboQuant's calibrated eigenbasis (turbo:rot=calib; kv/calibration.h): runs the model over the
// first max_tokens tokens of `text` (an f16 cache, an observer on the post-RoPE K and V), then per
// layer and role the second moment of the unit vectors x / |x| over every KV head and token (zero
// vectors skipped), in double, and its eigen-decomposition (core/eigen.h): the basis rows and the
// variances (eigenvalues, negative rounding clamped to 0).
TurboCalibration calibrate_turbo(const Model& model, Backend& be, std::string_view text, const TurboCalibrateParams& p,
                                 const std::function<void(const char*, int64_t, int64_t)>& progress = {});

}  // namespace vxq

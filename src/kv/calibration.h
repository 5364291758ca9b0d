// Calibration artifacts (METHODS.md "Calibration artifacts"): what `vxq calibrate` computes from a
// model and a text, saved as ONE GGUF file that names the model by its sha256, the method and its
// parameters, and holds the tensors: VecInfer's smoothing factors and codebooks, Q-Filters' filters.
//
// File layout (GGUF v3, our own keys; tensors F32, ne[0] contiguous):
//   vxq.calibration.method        string  "vecinfer"
//   vxq.calibration.model_sha256  string  64 lowercase hex digits of the model file
//   vxq.calibration.model_file    string  the model's file name when calibrated (messages only)
//   vxq.calibration.tokens        int64   calibration tokens run through the model
//   vecinfer.n / .m / .layers / .kv_heads / .head_dim / .iterations / .seed   int64
//   blk.L.key_lambda      [head_dim]                       lambda_i > 0
//   blk.L.key_codebook    [n, 2^m, head_dim/n]             C_j[c] of the smoothed, rotated keys
//   blk.L.value_codebook  [n, 2^m, head_dim/n]             of the rotated values
// Loading validates everything (keys, ranges, every tensor's presence, type and shape, no extra
// tensor, finite values) and names the file in its vxq::Error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kv/spec.h"

namespace vxq {

struct VecinferCalibration {
    std::string model_sha256;
    std::string model_file;
    int64_t tokens = 0;
    int n = 4, m = 8;
    int64_t n_layer = 0, n_head_kv = 0, head_dim = 0;
    int iterations = 30;
    uint64_t seed = 0;
    struct Layer {
        std::vector<float> key_lambda;      // [head_dim]
        std::vector<float> key_codebook;    // [head_dim/n, 2^m, n]
        std::vector<float> value_codebook;  // [head_dim/n, 2^m, n]
    };
    std::vector<Layer> layers;  // [n_layer]
};

// Writes the file atomically (a temporary renamed at the end); vxq::Error naming the path.
void save_vecinfer_calibration(const std::string& path, const VecinferCalibration& c);
// Reads and validates a file; vxq::Error naming the file and what is wrong.
VecinferCalibration load_vecinfer_calibration(const std::string& path);

// Q-Filters (kv/evict.h): one unit filter per layer and KV head. Same header keys; then
//   qfilters.layers / .kv_heads / .head_dim   int64
//   qfilters                                  [n_layer, n_head_kv, head_dim] (head_dim contiguous)
struct QFiltersCalibration {
    std::string model_sha256;
    std::string model_file;
    int64_t tokens = 0;
    int64_t n_layer = 0, n_head_kv = 0, head_dim = 0;
    std::vector<float> filters;  // [n_layer][n_head_kv][head_dim]
};
void save_qfilters_calibration(const std::string& path, const QFiltersCalibration& c);
QFiltersCalibration load_qfilters_calibration(const std::string& path);

// TurboQuant's calibrated eigenbasis (turbo:rot=calib, kv/formats/turbo.h): per layer and role
// the eigenvectors and eigenvalues of the second moment of the unit vectors x / |x| over the
// layer's KV heads and the calibration tokens. Same header keys; then
//   turbo.layers / .head_dim                  int64
//   blk.L.key_basis, blk.L.value_basis        [head_dim, head_dim]  row i: eigenvector i (unit)
//   blk.L.key_variance, blk.L.value_variance  [head_dim]            eigenvalue i, descending, >= 0
//   blk.L.key_weight                          [head_dim]            the queries' mean square along key
//       eigenvector i over the layer's query heads, relative to its mean over i (> 0): how much an
//       error in that coordinate moves the scores, so key bits go where variance x weight is largest
struct TurboCalibration {
    std::string model_sha256;
    std::string model_file;
    int64_t tokens = 0;
    int64_t n_layer = 0, head_dim = 0;
    struct Layer {
        std::vector<float> key_basis, value_basis;        // [head_dim * head_dim]
        std::vector<float> key_variance, value_variance;  // [head_dim]
        std::vector<float> key_weight;                    // [head_dim]
    };
    std::vector<Layer> layers;  // [n_layer]
};
void save_turbo_calibration(const std::string& path, const TurboCalibration& c);
TurboCalibration load_turbo_calibration(const std::string& path);

// Refuses (vxq::Error) a K/V spec whose calibration file (`calib=FILE`, any method that takes
// one) was made from another model than the file at model_path (sha256 of the bytes), or is not
// a valid calibration. Nothing is read when no method names a calibration file.
void check_calibration_model(const KvSpec& spec, const std::string& model_path);
// The same for an eviction policy's calibration file (calib=FILE of --evict).
struct EvictSpec;
void check_calibration_model(const EvictSpec& spec, const std::string& model_path);

}  // namespace vxq

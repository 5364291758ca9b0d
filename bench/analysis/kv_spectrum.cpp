// vxq_kv_spectrum: how much a calibrated rotation could buy a TurboQuant-style cache (issue 12's
// "<= 3.25 bits with KL below q4_0's").
//
// Runs a model over a text as `vxq calibrate` does (runtime/calibrate.h's collect_kv: an f16
// cache, contexts of --ctx tokens) and keeps every post-RoPE key and value. Per layer, KV head and role it takes the unit vectors x / |x| (what `turbo` codes
// after its fp16 norm) and their second-moment matrix, and reports:
//   - AM/GM of its eigenvalues and the top eigenvalue's share (a random rotation makes every
//     coordinate carry 1/d; an eigenbasis keeps the spread);
//   - the mean squared error of b-bit Lloyd-Max scalar quantization per coordinate after a random
//     rotation (each coordinate ~ N(0, 1/d): D = c(b), the turbo codec's distortion), and after
//     the eigenbasis with b * d bits given out one at a time to the coordinate whose error falls
//     most (integer bits 0..8, coordinate i ~ N(0, lambda_i): D = sum lambda_i c(b_i));
//   - with --kl-weights A,B (KL ~ A * D_keys + B * D_values, fitted to measured runs), the best
//     split of 2 b d bits between a head's keys and values and the KL it predicts.
// c(b) is the mean squared error of the library's own Lloyd-Max codebook for N(0, 1)
// (codecs::turbo::lloyd_max_mse); the allocation is turbo:rot=calib's (allocate_bits), whose codec
// measures what this estimates (docs/kv-methods.md). Gaussian coordinates and in-sample statistics: an
// estimate of what a calibrated codec could reach, not a codec.
//
//   vxq_kv_spectrum MODEL TEXT [--tokens N] [--ctx N] [--bits B] [--kl-weights A,B]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/core.h>

#include "analysis_tool.h"
#include "backend/backend.h"
#include "core/eigen.h"
#include "core/error.h"
#include "kv/formats/turbo.h"
#include "model/model.h"
#include "runtime/calibrate.h"

namespace {

using namespace vxq;
using analysis::read_text;

constexpr int kMaxBits = 8;

double distortion(const std::vector<double>& lambda, const std::vector<int>& bits, size_t offset,
                  const std::vector<double>& c) {  // c: lloyd_max_mse by bits
    double d = 0.0;
    for (size_t i = 0; i < lambda.size(); ++i) d += lambda[i] * c[size_t(bits[offset + i])];
    return d;
}

int run(int argc, char** argv) {
    if (argc < 3) fail("usage: vxq_kv_spectrum MODEL TEXT [--tokens N] [--ctx N] [--bits B] [--kl-weights A,B]");
    int64_t max_tokens = 4096, n_ctx = 1024;
    int bits = 3;
    double wk = 0.0, wv = 0.0;
    for (int i = 3; i + 1 < argc; i += 2) {
        const std::string_view flag = argv[i];
        if (flag == "--tokens") max_tokens = std::atoll(argv[i + 1]);
        else if (flag == "--ctx") n_ctx = std::atoll(argv[i + 1]);
        else if (flag == "--bits") bits = std::atoi(argv[i + 1]);
        else if (flag == "--kl-weights") {
            if (std::sscanf(argv[i + 1], "%lf,%lf", &wk, &wv) != 2) fail("--kl-weights '{}': expected A,B", argv[i + 1]);
        } else {
            fail("unknown option '{}'", flag);
        }
    }
    if (bits < 1 || bits > 7 || max_tokens < 1 || n_ctx < 1) fail("--bits 1..7, --tokens and --ctx >= 1");

    const auto model = Model::load(argv[1], "cpu");
    const auto be = make_backend("cpu", 2);
    const ModelConfig& cfg = model->config();
    const KvSamples kv = collect_kv(*model, *be, read_text(argv[2]), max_tokens, n_ctx);  // vxq calibrate's run
    const size_t row = size_t(cfg.n_head_kv * cfg.head_dim);
    n_ctx = std::min<int64_t>(n_ctx, kv.tokens);

    std::vector<double> c(kMaxBits + 1);
    for (int b = 0; b <= kMaxBits; ++b) c[size_t(b)] = codecs::turbo::lloyd_max_mse(b);
    const int d = int(cfg.head_dim);
    fmt::print("{}: {} tokens, contexts of {}; Lloyd-Max N(0,1) MSE c(1..4) = {:.4f} {:.4f} {:.5f} {:.6f}\n", argv[1],
               kv.tokens, n_ctx, c[1], c[2], c[3], c[4]);
    fmt::print("| layer | head | role | AM/GM | top eigenvalue | rotation @{0} | eigenbasis @{0} | eigenbasis @{1} |\n", bits,
               bits + 1);
    fmt::print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n");
    double sum[2][2] = {}, joint_kl = 0.0, joint_bits = 0.0;
    int heads = 0;
    for (int64_t l = 0; l < cfg.n_layer; ++l) {
        for (int64_t h = 0; h < cfg.n_head_kv; ++h) {
            std::vector<double> lam[2];
            for (int role = 0; role < 2; ++role) {
                const std::vector<float>& x = role ? kv.v[size_t(l)] : kv.k[size_t(l)];
                lam[role] = symmetric_eigen(unit_second_moment(x.data() + h * d, x.size() / row, row, d), d).values;
                double am = 0.0, log_gm = 0.0;
                for (double e : lam[role]) {
                    am += e / d;
                    log_gm += std::log(std::max(e, 1e-300)) / d;
                }
                const double at_b = distortion(lam[role], codecs::turbo::allocate_bits(lam[role], bits * d), 0, c);
                const double at_b1 = distortion(lam[role], codecs::turbo::allocate_bits(lam[role], (bits + 1) * d), 0, c);
                sum[role][0] += at_b;
                sum[role][1] += at_b1;
                fmt::print("| {} | {} | {} | {:.2f} | {:.3f} | {:.4f} | {:.4f} | {:.5f} |\n", l, h, role ? "V" : "K",
                           am / std::exp(log_gm), lam[role][0], c[size_t(bits)], at_b, at_b1);
            }
            ++heads;
            if (wk > 0.0 && wv > 0.0) {  // one allocation over the head's keys and values
                std::vector<double> w;
                for (double e : lam[0]) w.push_back(wk * e);
                for (double e : lam[1]) w.push_back(wv * e);
                const std::vector<int> b = codecs::turbo::allocate_bits(w, 2 * bits * d);
                joint_kl += wk * distortion(lam[0], b, 0, c) + wv * distortion(lam[1], b, size_t(d), c);
                for (int i = 0; i < d; ++i) joint_bits += b[size_t(i)];
            }
        }
    }
    fmt::print("mean MSE over heads: keys {:.4f} @{} / {:.5f} @{}, values {:.4f} / {:.5f} (a random rotation: {:.4f} / {:.5f})\n",
               sum[0][0] / heads, bits, sum[0][1] / heads, bits + 1, sum[1][0] / heads, sum[1][1] / heads, c[size_t(bits)],
               c[size_t(bits + 1)]);
    if (wk > 0.0 && wv > 0.0) {
        fmt::print("joint K/V allocation of {} bits per coordinate pair: keys get {:.2f} bits on average; predicted KL "
                   "{:.4f} (KL ~ {} D_keys + {} D_values)\n",
                   2 * bits, joint_bits / (heads * d), joint_kl / heads, wk, wv);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return vxq::analysis::tool_main(argc, argv, run); }

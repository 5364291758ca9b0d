// vxq calibrate -m MODEL -f TEXT --method vecinfer[:n=4,m=8]|qfilters -o FILE: a KV method's calibration
// artifact (kv/calibration.h) from a model run over a text, on the CPU backend.
#include <functional>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "backend/backend.h"
#include "core/error.h"
#include "kv/codecs/option_parse.h"
#include "model/model.h"
#include "runtime/calibrate.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace vxq::tools {

namespace {

struct CalibrateOptions {
    std::string model, file, method, out;
    int64_t tokens = 2048;
    int64_t n_ctx = 0;  // 0: the method's default (context_or)
    int iterations = 30;
    uint64_t seed = 0;
    int threads = 0;
};

// -c, or the method's default when it was not given: kDefaultContext for VecInfer and Q-Filters,
// the model's training context for TurboQuant.
constexpr int64_t kDefaultContext = 512;
int64_t context_or(const CalibrateOptions& o, int64_t fallback) { return o.n_ctx > 0 ? o.n_ctx : fallback; }

// "calibrate: STAGE done/total" on a terminal (nothing otherwise); end_progress closes the line.
std::function<void(const char*, int64_t, int64_t)> stage_progress(bool tty) {
    return [tty](const char* stage, int64_t done, int64_t total) {
        if (tty) fmt::print(stderr, "\rcalibrate: {} {}/{}   ", stage, done, total);
    };
}
void end_progress(bool tty) {
    if (tty) fmt::print(stderr, "\n");
}

void run_calibrate_qfilters(const CalibrateOptions& o, const CodecSpec& spec) {
    codecs::check_known_options(spec, {});
    QFiltersCalibrateParams p;
    p.max_tokens = o.tokens;
    p.n_ctx = context_or(o, kDefaultContext);
    check_writable(o.out);
    const std::string text = read_file(o.file);
    const auto model = Model::load(o.model, "cpu");
    const auto be = make_backend("cpu", resolve_threads(o.threads));
    const bool tty = stderr_is_tty();
    QFiltersCalibrateStats stats;
    const QFiltersCalibration c = calibrate_qfilters(*model, *be, text, p, &stats, stage_progress(tty));
    end_progress(tty);
    save_qfilters_calibration(o.out, c);
    fmt::print("calibrate: qfilters | model {} (sha256 {}) | {} tokens, {} layers x {} KV heads, head_dim {}\n",
               c.model_file, c.model_sha256, c.tokens, c.n_layer, c.n_head_kv, c.head_dim);
    const int64_t nh = int64_t(stats.explained.size()) / c.n_layer;
    for (int64_t l = 0; l < c.n_layer; ++l) {
        std::string line;
        for (int64_t h = 0; h < nh; ++h) {
            line += fmt::format(" {:.2f}/{:.2f}", stats.explained[size_t(l * nh + h)], stats.mean_proj[size_t(l * nh + h)]);
        }
        fmt::print("layer {}: per query head, queries' second moment along v1 / mean projection on v1+:{}\n", l, line);
    }
    fmt::print("wrote {}: use --evict qfilters:budget=N,calib={}\n", o.out, o.out);
}

void run_calibrate_turbo(const CalibrateOptions& o, const CodecSpec& spec) {
    codecs::check_known_options(spec, {});
    TurboCalibrateParams p;
    p.max_tokens = o.tokens;
    check_writable(o.out);
    const std::string text = read_file(o.file);
    const auto model = Model::load(o.model, "cpu");
    // Post-RoPE keys turn with the position: a basis fitted on positions below 512 codes the
    // others badly (vxq-llama-h64 at -c 1024: 4x the error), so by default every position.
    const int64_t train = model->config().n_ctx_train;
    p.n_ctx = context_or(o, train > 0 ? train : kDefaultContext);
    if (p.max_tokens < p.n_ctx) {
        fmt::print(stderr, "vxq: note: --tokens {} is below the context {}: positions from {} on are not calibrated\n",
                   p.max_tokens, p.n_ctx, p.max_tokens);
    }
    const auto be = make_backend("cpu", resolve_threads(o.threads));
    const bool tty = stderr_is_tty();
    const TurboCalibration c = calibrate_turbo(*model, *be, text, p, stage_progress(tty));
    end_progress(tty);
    save_turbo_calibration(o.out, c);
    fmt::print("calibrate: turbo (eigenbasis) | model {} (sha256 {}) | {} tokens in contexts of {}, {} layers, head_dim {}\n",
               c.model_file, c.model_sha256, c.tokens, p.n_ctx, c.n_layer, c.head_dim);
    for (int64_t l = 0; l < c.n_layer; ++l) {
        const TurboCalibration::Layer& L = c.layers[size_t(l)];
        fmt::print("layer {}: top variance keys {:.3f}, values {:.3f} (a random rotation: {:.3f})\n", l, L.key_variance[0],
                   L.value_variance[0], 1.0 / double(c.head_dim));
    }
    fmt::print("wrote {}: use --kv turbo:bits=B,rot=calib,calib={}\n", o.out, o.out);
}

void run_calibrate(const CalibrateOptions& o) {
    const CodecSpec spec = CodecSpec::parse(o.method);
    if (spec.name == "qfilters") return run_calibrate_qfilters(o, spec);
    if (spec.name == "turbo") return run_calibrate_turbo(o, spec);
    if (spec.name != "vecinfer") fail("calibrate: method '{}' has no calibration (vecinfer, turbo and qfilters have)", spec.name);
    codecs::check_known_options(spec, {"n", "m"});
    VecinferCalibrateParams p;
    p.n = int(codecs::int_option(spec, "n", 4, 1, 64));
    p.m = int(codecs::int_option(spec, "m", 8, 1, 8));
    p.max_tokens = o.tokens;
    p.n_ctx = context_or(o, kDefaultContext);
    p.iterations = o.iterations;
    p.seed = o.seed;
    p.threads = resolve_threads(o.threads);
    check_writable(o.out);  // before the run: a typo in the path does not cost it
    const std::string text = read_file(o.file);
    const auto model = Model::load(o.model, "cpu");
    const auto be = make_backend("cpu", p.threads);
    const bool tty = stderr_is_tty();
    VecinferCalibrateStats stats;
    const VecinferCalibration c = calibrate_vecinfer(*model, *be, text, p, &stats, stage_progress(tty));
    end_progress(tty);
    save_vecinfer_calibration(o.out, c);
    const std::string method = fmt::format("vecinfer:n={},m={}", c.n, c.m);
    fmt::print("calibrate: {} | model {} (sha256 {}) | {} tokens x {} KV heads, {} layers, head_dim {} | k-means <= {} "
               "rounds, seed {}\n",
               method, c.model_file, c.model_sha256, c.tokens, c.n_head_kv, c.n_layer, c.head_dim, c.iterations, c.seed);
    for (int64_t l = 0; l < c.n_layer; ++l) {
        fmt::print("layer {}: relative MSE (in-sample) keys {:.4f}, values {:.4f}\n", l, stats.key_rel_mse[size_t(l)],
                   stats.value_rel_mse[size_t(l)]);
    }
    fmt::print("wrote {}: use --kv {},calib={}\n", o.out, method, o.out);
}

}  // namespace

void add_calibrate(CLI::App& app, int& rc) {
    auto* sub = app.add_subcommand("calibrate",
                                   "Calibrate a KV method on a model and a text (CPU): VecInfer's smoothing factors and "
                                   "codebooks, or Q-Filters' filters (--evict qfilters), saved as one GGUF file that "
                                   "names the model by its sha256");
    auto o = std::make_shared<CalibrateOptions>();
    sub->add_option("-m,--model", o->model, "model GGUF file")->required();
    sub->add_option("-f,--file", o->file, "calibration text file")->required();
    sub->add_option("--method", o->method, "method and its options: vecinfer[:n=N,m=M] (n=4, m=8), turbo (the eigenbasis of turbo:rot=calib), or qfilters")->required();
    sub->add_option("-o,--output", o->out, "calibration file to write (atomically)")->required();
    sub->add_option("--tokens", o->tokens, "tokens of the text run through the model (default 2048)")
        ->check(CLI::Range(int64_t(1), int64_t(1) << 24));
    sub->add_option("-c,--ctx-size", o->n_ctx, "tokens per forward pass, each a fresh context (default 512; turbo: the model's training context, so the "
                    "eigenbasis sees the RoPE of every position)")
        ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
    sub->add_option("--iterations", o->iterations, "k-means rounds at most (default 30)")->check(CLI::Range(1, 30));
    sub->add_option("--seed", o->seed, "k-means initialisation seed (default 0)");
    sub->add_option("-t,--threads", o->threads, "threads (default: all)");
    sub->callback([o, &rc] {
        run_calibrate(*o);
        rc = 0;
    });
}

}  // namespace vxq::tools

// vxq synth --shape NAME --type f16|q8_0|q4_0|tq2_0|tq2_g128 -o FILE: a random-weight GGUF of a real model shape.
#include <memory>
#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "model/synth.h"
#include "model/tensor_parallel.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace vxq::tools {

namespace {

struct SynthCliOptions {
    std::string shape;
    std::string type = "f16";
    std::string out;
    uint64_t seed = 1;
    int64_t layers = 0;
    int64_t vocab = 0;
    int threads = 0;
    int tp = 1;
};

std::string shape_list() {
    std::string s;
    for (const ModelShape& m : model_shapes()) {
        s += fmt::format("\n  {:<12} {} dim {}, {} layers, {}/{} heads, ff {}, vocab {}{}{}", m.name, m.arch, m.n_embd,
                         m.n_layer, m.n_head, m.n_head_kv, m.n_ff, m.n_vocab, m.tied_embeddings ? ", tied" : "",
                         m.qkv_bias ? ", qkv bias" : "");
    }
    return s;
}

void run_synth(const SynthCliOptions& o) {
    const auto type = synth_weight_type(o.type);
    if (!type) fail("unknown --type '{}' (synth writes f16, q8_0, q4_0, tq2_0 or tq2_g128)", o.type);
    const SynthModel m(SynthOptions{o.shape, *type, o.seed, o.layers, o.vocab, o.threads});
    // Before writing tens of GB that --tp N would then refuse.
    if (o.tp > 1) check_tp_split(m.dims(), *type, o.tp, fmt::format("--shape {}", m.shape().name));
    const bool tty = stderr_is_tty();
    const double total_mib = double(m.file().file_bytes()) / (1 << 20);
    m.write(o.out, [&](uint64_t done, uint64_t total) {
        if (tty) fmt::print(stderr, "\rsynth: tensor data {:.0f} / {:.0f} MiB ({:.0f} %)   ", double(done) / (1 << 20),
                            double(total) / (1 << 20), 100.0 * double(done) / double(total));
    });
    if (tty) fmt::print(stderr, "\n");
    const ModelShape& s = m.shape();
    fmt::print("{}: {} {}, {} layers, vocab {}, seed {}: {} tensors, {} bytes ({:.1f} MiB)\n", o.out, s.name,
               ggml_type_name(*type), s.n_layer, s.n_vocab, o.seed, m.file().tensors().size(), m.file().file_bytes(),
               total_mib);
}

}  // namespace

void add_synth(CLI::App& app, int& rc) {
    auto* sub = app.add_subcommand(
        "synth",
        "Write a random-weight GGUF of a real model's shape (llama.cpp loads it too). Matrices, "
        "token_embd and output.weight included, have --type (llama-quantize would write output.weight as "
        "Q6_K in a q4_0 model; synth has no Q6_K quantizer). Shapes:" + shape_list());
    auto o = std::make_shared<SynthCliOptions>();
    sub->add_option("--shape", o->shape, "model shape (list above)")->required();
    sub->add_option("--type", o->type, "weight type: f16, q8_0, q4_0, tq2_0 or tq2_g128 (ternary: every matrix, token_embd and output included; default f16)");
    sub->add_option("-o,--output", o->out, "GGUF file to write (atomically: complete or absent)")->required();
    sub->add_option("--seed", o->seed, "random seed (default 1)");
    sub->add_option("--layers", o->layers, "number of layers instead of the shape's (quick runs, tests)");
    sub->add_option("--vocab", o->vocab, "vocabulary size instead of the shape's (>= 320; small test files)");
    sub->add_option("-t,--threads", o->threads, "threads generating weights (default: all)");
    sub->add_option("--tp", o->tp, "check first that the model splits over N tensor-parallel ranks (vxq ... --tp N)")
        ->check(CLI::Range(1, 64));
    sub->callback([o, &rc] {
        run_synth(*o);
        rc = 0;
    });
}

}  // namespace vxq::tools

// vxq quantize -m IN.gguf -o OUT.gguf --type tq2_0|tq1_0|q8_0|q4_0: the model with its matrices
// quantized (model/quantize.h).
#include <map>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "model/quantize.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace vxq::tools {

namespace {

struct QuantizeCliOptions {
    std::string in, out, type, ternary = "absmean";
};

void run_quantize(const QuantizeCliOptions& o) {
    QuantizeOptions q;
    const auto type = quantize_target_type(o.type);
    if (!type) fail("unknown --type '{}' (quantize writes tq2_0, tq1_0, tq2_g128, q8_0 or q4_0)", o.type);
    if (o.ternary != "absmean" && o.ternary != "amax") fail("unknown --ternary '{}' (absmean or amax)", o.ternary);
    q.input = o.in;
    q.output = o.out;
    q.type = *type;
    q.rule = o.ternary == "amax" ? TernaryRule::Amax : TernaryRule::Absmean;
    check_writable(o.out);
    const bool tty = stderr_is_tty();
    const QuantizeReport r = quantize_model(q, [&](uint64_t done, uint64_t total) {
        if (tty) fmt::print(stderr, "\rquantize: tensor data {:.0f} / {:.0f} MiB ({:.0f} %)   ", double(done) / (1 << 20),
                            double(total) / (1 << 20), 100.0 * double(done) / double(total));
    });
    if (tty) fmt::print(stderr, "\n");
    std::map<std::string, int> counts;  // "from -> to": tensors
    for (const QuantizedTensor& t : r.tensors) {
        counts[fmt::format("{} -> {}", ggml_type_name(t.from), ggml_type_name(t.to))] += 1;
        if (!t.note.empty()) fmt::print("{}: {}\n", t.name, t.note);
    }
    const bool ternary = q.type == GgmlType::TQ1_0 || q.type == GgmlType::TQ2_0 || q.type == GgmlType::TQ2_G128;
    fmt::print("{}: {} ({}{}), {} tensors, {} -> {} bytes ({:.2f}x smaller)\n", o.out, ggml_type_name(q.type),
               ternary ? (o.ternary == "amax" ? "amax ternarization" : "absmean ternarization") : "llama.cpp's reference quantizer",
               ternary ? "; token_embd kept" : "", r.tensors.size(), r.bytes_in, r.bytes_out,
               double(r.bytes_in) / double(std::max<uint64_t>(r.bytes_out, 1)));
    for (const auto& [what, n] : counts) fmt::print("  {:>4} x {}\n", n, what);
}

}  // namespace

void add_quantize(CLI::App& app, int& rc) {
    auto* sub = app.add_subcommand(
        "quantize",
        "Write a GGUF model with its matrices (every 2-D *.weight but token_embd) quantized; other tensors and the "
        "metadata are copied");
    auto o = std::make_shared<QuantizeCliOptions>();
    sub->add_option("-m,--model", o->in, "GGUF model of f32/f16/bf16 weights")->required();
    sub->add_option("-o,--output", o->out, "GGUF file to write (atomically: complete or absent)")->required();
    sub->add_option("--type", o->type,
                    "tq2_0, tq1_0 (ternary, llama.cpp's), tq2_g128 (ternary, a scale per 128 weights as Bonsai's; "
                    "veloxquant only), q8_0 or q4_0")
        ->required();
    sub->add_option("--ternary", o->ternary,
                    "absmean (default: BitNet b1.58's round-clip(w / mean|w|) per tensor, a least-squares scale per "
                    "block) or amax (llama.cpp's: scale = the block's max |w|)");
    sub->callback([o, &rc] {
        run_quantize(*o);
        rc = 0;
    });
}

}  // namespace vxq::tools

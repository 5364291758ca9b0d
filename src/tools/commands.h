// The vxq subcommands. Each add_* registers one subcommand whose callback runs it and writes
// its exit status to rc; errors are thrown as vxq::Error and reported by main.
#pragma once

#include <CLI/CLI.hpp>

namespace vxq::tools {

void add_inspect(CLI::App& app, int& rc);
void add_tokenize(CLI::App& app, int& rc);
void add_generate(CLI::App& app, int& rc);
void add_perplexity(CLI::App& app, int& rc);
void add_bench(CLI::App& app, int& rc);
void add_methods(CLI::App& app, int& rc);
void add_plot(CLI::App& app, int& rc);
void add_eval(CLI::App& app, int& rc);
void add_synth(CLI::App& app, int& rc);
void add_quantize(CLI::App& app, int& rc);
void add_passkey(CLI::App& app, int& rc);
void add_calibrate(CLI::App& app, int& rc);

inline void add_commands(CLI::App& app, int& rc) {
    add_inspect(app, rc);
    add_tokenize(app, rc);
    add_generate(app, rc);
    add_perplexity(app, rc);
    add_bench(app, rc);
    add_methods(app, rc);
    add_eval(app, rc);
    add_passkey(app, rc);
    add_plot(app, rc);
    add_synth(app, rc);
    add_quantize(app, rc);
    add_calibrate(app, rc);
}

}  // namespace vxq::tools

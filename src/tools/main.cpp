// vxq: command-line frontend. Each subcommand is a thin layer over the library; it runs from
// its CLI11 callback and stores its exit status in `rc`.
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
    CLI::App app{"veloxquant: LLM inference with a really compressed KV cache"};
    app.require_subcommand(1);
    app.set_version_flag("--version", "vxq 0.1.0");
    int rc = 0;
    vxq::tools::add_commands(app, rc);
    // llama.cpp's single-dash long flags, which CLI11 would read as clusters of short flags.
    std::vector<std::string> args(argv, argv + argc);
    for (auto& a : args) {
        if (a == "-ctk") a = "--cache-type-k";
        if (a == "-ctv") a = "--cache-type-v";
        if (a == "-fa") a = "--flash-attn";
    }
    std::vector<char*> av;
    for (auto& a : args) av.push_back(a.data());
    argv = av.data();
    if (argc > 1 && argv[1][0] != '-') {
        bool known = false;
        for (const CLI::App* sub : app.get_subcommands({})) known |= sub->get_name() == argv[1];
        if (!known) {
            std::fprintf(stderr, "vxq: error: unknown subcommand '%s' (run vxq --help for the list)\n", argv[1]);
            return 2;
        }
    }
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int code = app.exit(e);
        return code == 0 ? 0 : 2;
    } catch (const vxq::Error& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "vxq: error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "vxq: error: out of memory\n");
        return 1;
    }
    return rc;
}

// vxq: command-line frontend. Each subcommand is a thin layer over the library; it runs from
// its CLI11 callback and stores its exit status in `rc`.
//
// The error contract (tests/test_cli.cpp checks it): any failure is exactly one line on stderr,
// "vxq: error: ...", a non-zero exit and nothing more; CLI11's two-line messages are reworded
// into that form and every exception is caught here.
#include <cstdio>
#include <exception>
#include <new>
#include <regex>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "tools/commands.h"

namespace {

// The subcommand named on the command line ("" when none), for the --help hint.
std::string subcommand_of(const CLI::App& app, int argc, char** argv) {
    if (argc < 2) return "";
    for (const CLI::App* sub : app.get_subcommands({})) {
        if (sub->get_name() == argv[1]) return argv[1];
    }
    return "";
}

// One line, no newline inside (a hostile argument may carry one).
std::string one_line(std::string s) {
    for (char& c : s) {
        if (c == '\n' || c == '\r') c = ' ';
    }
    return s;
}

// CLI11's message as one sentence of ours: what was wrong and where to look for the options.
std::string reword(const CLI::ParseError& e, const CLI::App& app, const std::string& sub) {
    std::string msg = e.what();
    std::smatch m;
    if (dynamic_cast<const CLI::ConversionError*>(&e) &&
        std::regex_match(msg, m, std::regex("Could not convert: (\\S+) = ([\\s\\S]*)"))) {
        msg = m[1].str() + ": '" + m[2].str() + "' is not a valid value";
    } else if (dynamic_cast<const CLI::RequiredError*>(&e) && sub.empty() && msg.find("subcommand") != std::string::npos) {
        msg = "a subcommand is required:";
        for (const CLI::App* s : app.get_subcommands({})) msg += " " + s->get_name();
    } else if (msg.rfind("The following", 0) == 0) {
        msg[0] = 't';
    }
    return one_line(msg) + (sub.empty() ? " (run vxq --help)" : " (run vxq " + sub + " --help)");
}

int report(const std::string& what, int code) {
    std::fflush(stdout);
    std::fprintf(stderr, "vxq: error: %s\n", one_line(what).c_str());
    return code;
}

}  // namespace

int main(int argc, char** argv) {
    try {
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
        const std::string sub = subcommand_of(app, argc, argv);
        if (argc > 1 && argv[1][0] != '-' && sub.empty()) {
            return report(std::string("unknown subcommand '") + argv[1] + "' (run vxq --help for the list)", 2);
        }
        try {
            app.parse(argc, argv);
        } catch (const CLI::ParseError& e) {
            if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version: printed on stdout
            return report(reword(e, app, sub), 2);
        }
        return rc;
    } catch (const vxq::Error& e) {
        return report(e.what(), 1);
    } catch (const std::bad_alloc&) {
        return report("out of memory", 1);
    } catch (const std::exception& e) {
        return report(std::string("internal error: ") + e.what(), 1);
    } catch (...) {
        return report("internal error: unknown exception", 1);
    }
}

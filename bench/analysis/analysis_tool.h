// What the bench/analysis tools share: a text file read whole, and main's frame (a vxq::Error or
// any other exception: one `vxq: error: ...` line on stderr and exit status 1, as the CLI does).
#pragma once

#include <cstdio>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"

namespace vxq::analysis {

inline std::string read_text(const char* path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail("cannot open '{}'", path);
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
}

// main's body: run(argc, argv), its exceptions as one error line.
template <class Run>
int tool_main(int argc, char** argv, Run run) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "vxq: error: %s\n", e.what());
        return 1;
    }
}

}  // namespace vxq::analysis

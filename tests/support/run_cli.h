// Runs the vxq CLI binary as a child process and captures its exit status and output.
#pragma once

#include <string>
#include <vector>

namespace vxq::test {

struct CliResult {
    int exit_code = -1;    // -1 when killed by a signal
    int signal = 0;        // the signal that killed it, if any
    std::string out;
    std::string err;
};

CliResult run_cli(const std::vector<std::string>& args);

}  // namespace vxq::test

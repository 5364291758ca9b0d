#include "support/run_cli.h"
#include "support/text.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

extern char** environ;

namespace vxq::test {

CliResult run_cli(const std::vector<std::string>& args) {
    char out_tmpl[] = "/tmp/vxq_cli_out_XXXXXX";
    char err_tmpl[] = "/tmp/vxq_cli_err_XXXXXX";
    const int out_fd = mkstemp(out_tmpl);
    const int err_fd = mkstemp(err_tmpl);
    // The binary this build made, or $VXQ_CLI where the tests run elsewhere (a GPU machine that
    // got vxq_tests and vxq packed by scripts/device_pack.sh, not the build tree).
    const char* cli = std::getenv("VXQ_CLI");
    std::vector<std::string> all{cli && *cli ? cli : VXQ_CLI_PATH};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    pid_t pid = 0;
    CliResult r;
    if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) == 0) {
        int status = 0;
        waitpid(pid, &status, 0);
        if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
    }
    posix_spawn_file_actions_destroy(&fa);
    close(out_fd);
    close(err_fd);
    r.out = read_file(out_tmpl);
    r.err = read_file(err_tmpl);
    std::remove(out_tmpl);
    std::remove(err_tmpl);
    return r;
}

}  // namespace vxq::test

#include "tools/common.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace vxq::tools {

void RuntimeOptions::add_to(CLI::App* sub, bool with_ctx) {
    sub->add_option("-m,--model", model, "GGUF model file")->required();
    sub->add_option("-t,--threads", threads, "CPU threads (default: all cores)")->check(CLI::Range(0, 1024));
    if (with_ctx) {
        sub->add_option("-c,--ctx-size", n_ctx, "context size in tokens (default: the model's)")
            ->check(CLI::Range(int64_t(0), int64_t(1) << 24));
    }
}

Engine make_engine(const RuntimeOptions& o) {
    Engine e;
    e.model = Model::load(o.model);
    const ModelConfig& c = e.model->config();
    e.n_ctx = o.n_ctx > 0 ? o.n_ctx : c.n_ctx_train;
    const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
    e.backend = make_cpu_backend(threads);
    const KvShape shape{c.n_layer, c.n_head, c.n_head_kv, c.head_dim, e.n_ctx};
    const double kv_bytes = 2.0 * double(c.n_layer * c.n_head_kv * c.head_dim) * double(e.n_ctx) * 2.0;
    const double mem_bytes = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
    if (kv_bytes > 0.8 * mem_bytes) {
        fail("a KV cache for a context of {} tokens needs {:.1f} GiB, more than this machine's memory allows "
             "({:.1f} GiB): lower -c", e.n_ctx, kv_bytes / (1 << 30), mem_bytes / (1 << 30));
    }
    e.cache = make_f16_cache(shape);

    return e;
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot open '{}': {}", path, std::strerror(errno));
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) fail("cannot read '{}'", path);
    return ss.str();
}

bool stderr_is_tty() { return isatty(STDERR_FILENO) == 1; }

}  // namespace vxq::tools

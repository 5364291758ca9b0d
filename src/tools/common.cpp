#include "tools/common.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "kv/calibration.h"
#include "kv/codec.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace vxq::tools {

void RuntimeOptions::add_to(CLI::App* sub, bool with_ctx) {
    sub->add_option("-m,--model", model, "GGUF model file")->required();
    add_device_option(sub, device);
    sub->add_option("-t,--threads", threads, "CPU threads (default: all cores)")->check(CLI::Range(0, 1024));
    kv_opt = sub->add_option("--kv", kv, "KV cache method for K and V, or a K/V pair: f16, q8_0, q4_0, fp8, "
                                         "kivi:bits=2,group=32,residual=128, q4_0/f16 (vxq methods lists them)");
    sub->add_option("--cache-type-k", kv_k, "KV method for keys (-ctk)");
    sub->add_option("--cache-type-v", kv_v, "KV method for values (-ctv)");
    sub->add_flag("--prefill-exact", prefill_exact,
                  "a batch starting at position 0 attends to its own exact K/V (KIVI's recipe); later queries read the codes");
    sub->add_flag("--flash-attn", flash_attn,
                  "-fa: read an f16 cache with the fused kernel, like every compressed one (default: llama.cpp's "
                  "non-flash-attention numerics for f16)");
    sub->add_option("--evict", evict,
                    "evict KV tokens per layer and KV head: streaming|knorm|h2o|snapkv|qfilters, with budget=N or ratio=R "
                    "[,sink=4,window=64,every=1,obs=64,calib=FILE] (qfilters: calib= from vxq calibrate --method qfilters)");
    if (with_ctx) {
        sub->add_option("-c,--ctx-size", n_ctx,
                        fmt::format("context size in tokens (default {}, or the model's if smaller; 0: the model's)",
                                    kDefaultCtx))
            ->check(CLI::Range(int64_t(0), kMaxCtx));
    }
}

KvSpec RuntimeOptions::kv_spec() const {
    if (kv_opt && kv_opt->count() > 0 && kv.empty()) KvSpec::parse(kv);  // --kv "" is an error, not f16
    return KvSpec::from_flags(kv, kv_k, kv_v);
}

KvCacheOptions RuntimeOptions::cache_options() const {
    KvCacheOptions o;
    o.prefill_exact = prefill_exact;
    o.flash_attn = flash_attn;
    o.evict = EvictSpec::parse(evict);
    return o;
}

int64_t RuntimeOptions::context(int64_t n_ctx_train) const {
    if (n_ctx == 0) return n_ctx_train;
    if (n_ctx < 0) return std::min(kDefaultCtx, n_ctx_train);
    return n_ctx;
}

CLI::Validator finite_in(double lo, double hi) {
    const bool bounded = hi < std::numeric_limits<double>::infinity();
    const std::string range = bounded ? fmt::format("in [{}, {}]", lo, hi) : fmt::format(">= {}", lo);
    return CLI::Validator(
        [lo, hi, range](std::string& s) -> std::string {
            char* end = nullptr;
            const double v = std::strtod(s.c_str(), &end);
            if (end == s.c_str() || *end != '\0') return fmt::format("'{}' is not a number", s);
            if (!std::isfinite(v) || v < lo || v > hi) return fmt::format("must be a finite number {}, got {}", range, s);
            return "";
        },
        "NUMBER " + range);
}

int resolve_threads(int requested) {
    const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
    if (requested <= 0) return cores;
    if (requested > 4 * cores) {
        fail("-t/--threads {} is more than 4x this machine's {} hardware threads (at most {})", requested, cores, 4 * cores);
    }
    if (requested > cores) {
        fmt::print(stderr, "vxq: warning: -t/--threads {} is more than this machine's {} hardware threads: expect it to run slower\n",
                   requested, cores);
    }
    return requested;
}

bool is_f16_cache(const KvSpec& spec) { return spec.k.is_plain("f16") && spec.v.is_plain("f16"); }

void check_prefill_exact(bool has_prefill_mode, bool has_compressed_cache) {
    if (!has_prefill_mode) {
        fail("--prefill-exact changes nothing in stream mode (every token is written and attended alone): drop it, "
             "or use --mode prefill");
    }
    if (!has_compressed_cache) {
        fail("--prefill-exact changes nothing with the f16 cache (it holds every K/V exactly): drop it, or choose a "
             "compressed method with --kv");
    }
}

void add_tp_option(CLI::App* sub, int& tp) {
    sub->add_option("--tp", tp,
                    "tensor parallelism: split the model over N ranks of --device (cuda: GPUs 0..N-1 over NCCL; cpu: a "
                    "reference group in host memory); each rank holds its KV heads' cache (default 1)")
        ->check(CLI::Range(1, 64));
}

void add_device_option(CLI::App* sub, std::string& device) {
    sub->add_option("--device", device,
                    fmt::format("backend to run on: {} (default cpu); -t stays the host threads", fmt::join(backend_names(), ", ")));
}

void check_device(const std::string& device, std::span<const KvSpec> specs, bool prefill_exact) {
    check_backend_name(device);
    for (const KvSpec& spec : specs) {
        for (const auto& [half, what] : {std::pair{&spec.k, "keys"}, std::pair{&spec.v, "values"}}) {
            if (!codec_has_reader(half->name, device)) {
                fail("--device {}: KV method {} ({}) has no {} reader yet; use --device cpu", device, half->name, what, device);
            }
        }
    }
    // The batch that --prefill-exact keeps exact is read as f32 blocks (kv_cache.cpp).
    if (prefill_exact && !codec_has_reader("f32", device)) {
        fail("--device {}: --prefill-exact reads its exact batch as f32, which has no {} reader yet; use --device cpu",
             device, device);
    }
}

Engine make_engine(const RuntimeOptions& o, int64_t max_batch, int64_t logit_rows) {
    Engine e;
    const KvSpec spec = o.kv_spec();  // a bad method or device fails before the model loads
    check_device(o.device, std::span(&spec, 1), o.prefill_exact);
    KvCacheOptions cache_opts = o.cache_options();
    if (o.tp > 1) {
        if (cache_opts.evict.active() && cache_opts.evict.policy == EvictPolicy::QFilters) {
            fail("--evict qfilters with --tp {}: its filters are calibrated per KV head of the whole model, and a rank's "
                 "cache numbers its own heads from 0; use another policy (streaming, knorm, h2o, snapkv)", o.tp);
        }
        check_calibration_model(spec, o.model);
        e.group = TpGroup::create(o.model, o.device, resolve_threads(o.threads), o.tp);
        e.n_ctx = o.context(e.group->model().config().n_ctx_train);
        e.tp = e.group->make_runner(spec, cache_opts, e.n_ctx);
        const TpRunner* runners[] = {e.tp.get()};
        e.longest_context = e.group->check_fits(runners, max_batch, logit_rows, o.device);
        e.runner = e.tp.get();
        return e;
    }
    e.model = Model::load(o.model, o.device);
    check_calibration_model(spec, o.model);
    check_calibration_model(cache_opts.evict, o.model);
    const ModelConfig& c = e.model->config();
    e.n_ctx = o.context(c.n_ctx_train);
    e.backend = make_backend(o.device, resolve_threads(o.threads));
    const KvShape shape{c.n_layer, c.n_head, c.n_head_kv, c.head_dim, e.n_ctx};
    cache_opts.memory = e.backend->kv_memory();  // where the backend's attention reads it
    e.cache = make_kv_cache(shape, spec, cache_opts);  // allocates nothing until tokens arrive
    const Model* models[] = {e.model.get()};
    const KvCache* caches[] = {e.cache.get()};
    const MemoryNeed need = memory_need(*e.backend, models, caches, std::min(max_batch, e.n_ctx), std::min(logit_rows, e.n_ctx));
    const MemoryInfo info = e.backend->memory_info();
    check_fits(need, info, o.device);
    e.longest_context = longest_context(need, caches, info.free, RuntimeOptions::kMaxCtx);
    e.single = std::make_unique<SingleRunner>(*e.model, *e.backend, *e.cache);
    e.runner = e.single.get();
    return e;
}

std::vector<std::pair<Backend*, const KvCache*>> Engine::ranks() const {
    if (!group) return {{backend.get(), cache.get()}};
    std::vector<std::pair<Backend*, const KvCache*>> r;
    for (int i = 0; i < group->ranks(); ++i) r.emplace_back(&group->backend(i), &tp->cache(i));
    return r;
}

std::string Engine::describe() const {
    std::vector<std::string> d;
    for (const auto& [be, kv] : ranks()) d.push_back(be->describe());
    return fmt::format("{}", fmt::join(d, " | "));
}

std::string memory_summary(const Engine& e) {
    if (!e.group) return memory_summary(BackendMemory::of(*e.backend));
    std::vector<std::string> lines;
    for (const auto& [be, kv] : e.ranks()) {
        lines.push_back(fmt::format("rank {}: {}, KV cache {:.1f} MiB", be->tp_rank(), memory_summary(BackendMemory::of(*be)),
                                    double(kv->resident_bytes()) / (1 << 20)));
    }
    return fmt::format("{}", fmt::join(lines, "\n"));
}

nlohmann::json tp_json(const Engine& e) {
    nlohmann::json ranks = nlohmann::json::array();
    for (const auto& [be, kv] : e.ranks()) {
        ranks.push_back({{"backend", be->describe()}, {"memory", memory_json(BackendMemory::of(*be))},
                         {"kv_resident_bytes", kv->resident_bytes()}});
    }
    return {{"size", ranks.size()}, {"ranks", ranks}};
}

nlohmann::json memory_json(const BackendMemory& m) {
    return {{"where", m.where}, {"weight_bytes", m.weight_bytes}, {"activation_bytes", m.activation_bytes}};
}

std::string memory_summary(const BackendMemory& m) {
    return fmt::format("backend memory ({}): weights {:.1f} MiB, activations {:.1f} MiB", m.where,
                       double(m.weight_bytes) / (1 << 20), double(m.activation_bytes) / (1 << 20));
}

std::vector<std::string> split_methods(const std::vector<std::string>& args) {
    std::vector<std::string> out;
    for (const auto& a : args) {
        size_t pos = 0;
        while (pos <= a.size()) {
            const size_t comma = std::min(a.find(',', pos), a.size());
            const std::string item = a.substr(pos, comma - pos);
            if (!out.empty() && item.find('=') != std::string::npos && item.find(':') == std::string::npos) {
                out.back() += "," + item;
            } else if (!item.empty()) {
                out.push_back(item);
            }
            pos = comma + 1;
        }
    }
    return out;
}

std::string read_file(const std::string& path) {
    // A directory opens as a stream that reads nothing: an empty prompt or text, not an error.
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) fail("'{}' is a directory, not a file", path);
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot open '{}': {}", path, std::strerror(errno));
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) fail("cannot read '{}'", path);
    return ss.str();
}

void write_file_atomically(const std::string& path, const std::string& data) {
    const std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary);
        out << data;
        if (!out) {
            std::remove(tmp.c_str());
            fail("cannot write '{}'", tmp);
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        fail("cannot write '{}': {}", path, std::strerror(errno));
    }
}

void check_writable(const std::string& path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) fail("cannot write '{}': it is a directory", path);
    const std::string tmp = path + ".tmp";
    const bool existed = std::filesystem::exists(tmp, ec);
    if (!std::ofstream(tmp, std::ios::binary | std::ios::app)) fail("cannot write '{}': {}", path, std::strerror(errno));
    if (!existed) std::remove(tmp.c_str());
}

std::string dump_json(nlohmann::json j, int indent) {
    try {
        return j.dump(indent);
    } catch (const nlohmann::json::type_error&) {  // 316: a string is not valid UTF-8
        if (j.is_object()) j["invalid_utf8_replaced"] = true;
        return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
    }
}

std::string kv_summary(const Engine& e, int64_t tokens) {
    const KvCache& c = *e.ranks()[0].second;
    const KvShape& s = c.shape();
    const std::string split = e.group ? fmt::format(" over {} ranks", e.group->ranks()) : "";
    return fmt::format("kv cache: {}, ctx {} | resident {} bytes{} for {} tokens ({:.3f} bits/element) | f16 would be {} "
                       "bytes (16 bits/element)",
                       c.format(), s.n_ctx, e.runner->kv_bytes(), split, tokens, e.runner->kv_bits_per_element(tokens),
                       2 * e.runner->kv_elements(tokens));
}

bool stderr_is_tty() { return isatty(STDERR_FILENO) == 1; }

}  // namespace vxq::tools

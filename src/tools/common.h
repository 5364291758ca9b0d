// Pieces shared by the vxq subcommands: model/runtime options and their validation.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "runtime/memory_check.h"
#include "runtime/runner.h"
#include "runtime/tensor_parallel.h"

namespace vxq::tools {

struct RuntimeOptions {
    std::string model;
    std::string device = "cpu";  // --device: the backend (make_backend name)
    int threads = 0;      // 0: all hardware threads
    int64_t n_ctx = -1;   // -c: 0 means the model's training context; -1: not given
    std::string kv;       // --kv: "M" (K and V) or "MK/MV"
    std::string kv_k;     // -ctk / --cache-type-k
    std::string kv_v;     // -ctv / --cache-type-v
    bool prefill_exact = false;
    bool flash_attn = false;  // -fa
    std::string evict;        // --evict POLICY:budget=N,... (kv/evict.h); empty: none
    int tp = 1;               // --tp N (add_tp_option): tensor-parallel ranks
    CLI::Option* kv_opt = nullptr;

    static constexpr int64_t kDefaultCtx = 4096;  // as llama.cpp; capped at the model's
    static constexpr int64_t kMaxCtx = int64_t(1) << 24;  // -c's largest value

    void add_to(CLI::App* sub, bool with_ctx = true);
    // The K/V pair from --kv, -ctk, -ctv (vxq::Error on a bad or empty method).
    KvSpec kv_spec() const;
    // vxq::Error on a bad --evict.
    KvCacheOptions cache_options() const;
    // The context size: -c, or the default capped at the model's; -c 0 is the model's.
    int64_t context(int64_t n_ctx_train) const;
};

// "--kv" lists: comma-separated methods, where an option keeps its comma with its method
// ("f16,kivi:bits=2,group=32,q4_0" -> f16 | kivi:bits=2,group=32 | q4_0). Repeated flags add up.
std::vector<std::string> split_methods(const std::vector<std::string>& args);

// --device NAME (default cpu) on a subcommand that runs a model.
void add_device_option(CLI::App* sub, std::string& device);
// --tp N on a subcommand that runs through a Runner (generate, perplexity).
void add_tp_option(CLI::App* sub, int& tp);

// vxq::Error, before any work, unless `device` is a backend of this build that can run what was
// asked: every K and V method of `specs` needs a reader there (the KV codec registry says which
// backends have one), and --prefill-exact needs one for the exact batch's f32 blocks.
void check_device(const std::string& device, std::span<const KvSpec> specs, bool prefill_exact);

// The model, a backend and a KV cache sized for n_ctx, built from validated options, after
// checking that the run fits in the backend's memory (runtime/memory_check.h) with a largest
// forward pass of `max_batch` tokens (capped at n_ctx) and `logit_rows` rows of logits.
// With --tp N > 1 the model runs on a tensor-parallel group (runtime/tensor_parallel.h) instead.
struct Engine {
    std::unique_ptr<Model> model;      // --tp 1
    std::unique_ptr<Backend> backend;  // --tp 1
    std::unique_ptr<KvCache> cache;    // --tp 1
    std::unique_ptr<SingleRunner> single;  // --tp 1: over the three above
    std::unique_ptr<TpGroup> group;    // --tp N > 1 (model, backend and cache stay null) ...
    std::unique_ptr<TpRunner> tp;      // ... and its caches (destroyed before the group)
    Runner* runner = nullptr;          // what runs: single or tp
    int64_t n_ctx = 0;
    int64_t longest_context = 0;       // the most tokens the cache could hold in the free memory (memory_check.h)

    // Each backend with its cache: the one pair, or the group's ranks in rank order.
    std::vector<std::pair<Backend*, const KvCache*>> ranks() const;
    // Backend::describe of each, joined by " | ".
    std::string describe() const;
};
Engine make_engine(const RuntimeOptions& o, int64_t max_batch, int64_t logit_rows);

// Resident KV bytes (every rank's), bits per element and the f16 figure for the same tokens, one line.
std::string kv_summary(const Engine& e, int64_t tokens);

// What a backend holds in its own memory after a run (runtime/memory_check.h), as JSON and as
// one line of text; the KV cache's resident bytes are kv_summary's.
nlohmann::json memory_json(const BackendMemory& m);
std::string memory_summary(const BackendMemory& m);
// The same for every backend of an engine (a group: one line per rank, with its KV bytes).
std::string memory_summary(const Engine& e);
// {"size": N, "ranks": [{"backend", "memory", "kv_resident_bytes"}, ...]}: a group's ranks.
nlohmann::json tp_json(const Engine& e);

// Flag check for a real-valued option: a finite number in [lo, hi] ("nan", "inf" and values
// outside are refused with the range); hi = infinity means no upper bound.
CLI::Validator finite_in(double lo, double hi);

// The thread count to run with, from -t: 0 means every hardware thread. More than 4x the
// hardware threads is refused (it only slows a run down); more than 1x runs, with a warning.
int resolve_threads(int requested);

// True when K and V are both plain f16: a cache that holds every K/V exactly (to fp16).
bool is_f16_cache(const KvSpec& spec);

// vxq::Error when --prefill-exact would change nothing: without a prefill-mode run (stream mode
// writes and attends one token at a time) or without a compressed cache (only the f16 cache).
void check_prefill_exact(bool has_prefill_mode, bool has_compressed_cache);

// Reads a whole file; vxq::Error naming it if it cannot be read or is a directory.
std::string read_file(const std::string& path);

// Writes a whole file through a temporary and a rename: never half-written. vxq::Error naming it.
void write_file_atomically(const std::string& path, const std::string& data);

// vxq::Error unless write_file_atomically(path, ...) can create its file: checked before a long
// run, so a typo in an output path does not cost the run.
void check_writable(const std::string& path);

// JSON text of j that never throws: a string that is not valid UTF-8 (sampled bytes, a file
// name) has each invalid sequence replaced by U+FFFD, and then j carries
// "invalid_utf8_replaced": true so a reader knows those strings are not the original bytes.
std::string dump_json(nlohmann::json j, int indent = -1);

// True when standard error is a terminal (progress is shown only then).
bool stderr_is_tty();

}  // namespace vxq::tools

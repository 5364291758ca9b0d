// What a run needs in its backend's memory, and the check that it fits, made before anything
// large is allocated (weights uploaded, KV pages committed): every command that runs a model
// calls check_fits once, so a model that does not fit is one clear error, not a failure halfway.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "backend/backend.h"

namespace vxq {

class KvCache;
class Model;

struct MemoryNeed {
    size_t weights = 0;       // weight copies in the backend's memory (0 where it reads the mapped file)
    size_t kv = 0;            // the KV caches, each full to its context
    int64_t kv_tokens = 0;    // the largest of those contexts
    size_t activations = 0;   // the forward pass's buffers for the largest batch, plus its logits
    size_t total() const { return weights + kv + activations; }
};

// The need of running `models` on `be` over `caches` (all alive at once), the largest forward
// pass being `max_batch` tokens with `logit_rows` rows of logits.
//   weights: where be.copies_weights(), the tensor data of every model (Model::weight_bytes: a
//     tensor-parallel rank's slice) as the file stores it — a
//     close estimate of the device copies, which hold the same blocks (Q8_0/Q4_0 split into a
//     quant plane and a scale plane of the same bytes) with the file's alignment padding dropped;
//   kv: KvCache::bytes_for_tokens of each cache's context;
//   activations: Model::activation_bytes(max_batch) of the largest model plus logit_rows rows of
//     n_vocab floats (the caller's buffer; a device backend stages it in its memory too). A
//     backend's own scratch (the CUDA attention's score rows) comes on top and is not counted.
MemoryNeed memory_need(const Backend& be, std::span<const Model* const> models, std::span<const KvCache* const> caches,
                       int64_t max_batch, int64_t logit_rows);

// The most tokens `caches` (all filled alike) could hold in `free` bytes beside the rest of
// `need` (weights, activations): the largest n <= cap with need.weights + need.activations +
// the caches' bytes_for_tokens(n) <= free; 0 when not even an empty cache fits. What the fit
// check would admit as a context, for the reports (issue 20: the longest context a
// configuration holds).
int64_t longest_context(const MemoryNeed& need, std::span<const KvCache* const> caches, size_t free,
                        int64_t cap = int64_t(1) << 24);

// What a backend holds in its own memory once a run is done, for the reports (the KV cache's
// resident bytes are the cache's).
struct BackendMemory {
    std::string where;  // MemoryInfo::where
    size_t weight_bytes = 0;
    size_t activation_bytes = 0;
    static BackendMemory of(const Backend& be);
};

// vxq::Error when need.total() exceeds mem.free, one line naming the device flag and each part:
// "--device cuda: this run needs 17.2 GiB (weights 16.1 GiB + KV cache 1.0 GiB for 8192 tokens +
// activations 0.1 GiB) but GPU 0 (...) has 12.0 GiB free".
void check_fits(const MemoryNeed& need, const MemoryInfo& mem, std::string_view device);

}  // namespace vxq

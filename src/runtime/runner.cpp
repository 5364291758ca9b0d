#include "runtime/runner.h"

#include "kv/kv_cache.h"
#include "model/model.h"

namespace vxq {

void SingleRunner::forward(std::span<const TokenId> tokens, int64_t n_out, float* logits) {
    m_.forward(be_, cache_, tokens, n_out, logits);
}
void SingleRunner::fill_kv(std::span<const TokenId> tokens) { m_.fill_kv(be_, cache_, tokens); }
void SingleRunner::truncate(int64_t n) { cache_.truncate(n); }
int64_t SingleRunner::size() const { return cache_.size(); }
int64_t SingleRunner::n_ctx() const { return cache_.shape().n_ctx; }
size_t SingleRunner::kv_bytes() const { return cache_.resident_bytes(); }
float* SingleRunner::output_buffer(size_t n) { return be_.output_buffer(n); }

int64_t Runner::kv_elements(int64_t tokens) const {
    const ModelConfig& m = model().config();
    return 2 * m.n_layer * m.kv_dim() * tokens;
}

double Runner::kv_bits_per_element(int64_t tokens) const {
    return tokens > 0 ? 8.0 * double(kv_bytes()) / double(kv_elements(tokens)) : 0.0;
}

}  // namespace vxq

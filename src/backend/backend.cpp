#include "backend/backend.h"

#include <cstring>

#include "core/error.h"
#include "kv/kv_cache.h"

namespace vxq {

void Backend::kv_write(KvCache& cache, int64_t layer, int64_t pos0, const float* k, const float* v, int64_t n) {
    const size_t count = size_t(n * cache.shape().n_head_kv * cache.shape().head_dim);
    cache.write(layer, pos0, to_host(k, count, 0), to_host(v, count, 1), n);
}

void Backend::all_reduce_sum(const float* send, float* recv, int64_t n) {
    VXQ_ASSERT(tp_size() == 1);  // a group's backends override it
    if (send != recv) std::memcpy(recv, send, size_t(n) * sizeof(float));
}

void Backend::gather_columns(const float* x, int64_t n_rows, std::span<const int64_t> widths, float* out) {
    VXQ_ASSERT(tp_size() == 1 && widths.size() == 1 && out);
    const size_t n = size_t(n_rows * widths[0]);
    std::memcpy(out, to_host(x, n, 0), n * sizeof(float));
}

}  // namespace vxq

#include "backend/backend.h"

#include "kv/kv_cache.h"

namespace vxq {

void Backend::kv_write(KvCache& cache, int64_t layer, int64_t pos0, const float* k, const float* v, int64_t n) {
    const size_t count = size_t(n * cache.shape().n_head_kv * cache.shape().head_dim);
    cache.write(layer, pos0, to_host(k, count, 0), to_host(v, count, 1), n);
}

}  // namespace vxq

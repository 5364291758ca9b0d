// The reader-policy attention's plan (reader_attention.cuh), host side.
#include "kernels/cuda/reader_attention.cuh"

#include <algorithm>

#include "kernels/cuda/launch.cuh"

namespace vxq::cuda {

bool reader_attention_fits(int64_t n_head, int64_t n_head_kv, int64_t head_dim) {
    return n_head_kv > 0 && n_head % n_head_kv == 0 && n_head / n_head_kv <= 8 && head_dim % 32 == 0 && head_dim > 0 &&
           head_dim <= kReaderMaxHeadDim;
}

int64_t reader_attention_splits(int64_t n_q, int64_t n_head, int64_t n_head_kv) {
    const int64_t blocks = reader_query_blocks(n_q, n_head / std::max<int64_t>(1, n_head_kv)) * n_head_kv;
    const int64_t want = std::max<int64_t>(1, 4 * sm_count() / std::max<int64_t>(1, blocks));
    int64_t s = 1;
    while (s * 2 <= want && s < kReaderMaxSplits) s *= 2;
    return s;
}

}  // namespace vxq::cuda

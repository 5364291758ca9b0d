// TurboQuant caches on the device: the store and the split-K attention (turbo.cuh says what
// each computes and why the store's bytes are the CPU codec's).
#include "kernels/cuda/turbo.cuh"

#include <algorithm>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/turbo_kernels.cuh"

namespace vxq::cuda {
namespace {

template <int NC, int GM>
void launch_attention(const TurboAttentionParams& p, cudaStream_t st) {
    static PerDevice configured;
    const size_t smem = size_t(AttnSmem(NC * 32, GM, p.kf.block_bytes, p.vf.block_bytes).total);
    allow_smem(turbo_attention_kernel<NC, GM>, smem, configured);
    launch_pdl(turbo_attention_kernel<NC, GM>, dim3(unsigned(p.n_q), unsigned(p.n_head_kv), unsigned(p.splits)),
               dim3(kAttnThreads), smem, st, p);
}

template <int NC>
void launch_attention_nc(const TurboAttentionParams& p, cudaStream_t st) {
    const int64_t g = p.n_head / p.n_head_kv;
    if (g <= 1) launch_attention<NC, 1>(p, st);
    else if (g <= 2) launch_attention<NC, 2>(p, st);
    else if (g <= 4) launch_attention<NC, 4>(p, st);
    else launch_attention<NC, 8>(p, st);
}

}  // namespace

void turbo_store(const TurboStoreParams& p, cudaStream_t stream) {
    if (p.n == 0) return;
    if (p.head_dim % 32 != 0 || p.head_dim > kTurboMaxHeadDim || p.kf.d != p.head_dim || p.vf.d != p.head_dim) {
        throw_cuda_error(cudaErrorInvalidValue, "turbo_store: head_dim a multiple of 32 up to 256, the formats' d", __FILE__,
                         __LINE__);
    }
    const int64_t warps = 2 * p.n * p.n_head_kv;
    launch_pdl(turbo_store_kernel, dim3(unsigned((warps + kStoreWarps - 1) / kStoreWarps)), dim3(kStoreWarps * 32), 0,
               stream, p);
}

bool turbo_attention_fits(int64_t n_head, int64_t n_head_kv, int64_t head_dim) {
    return n_head_kv > 0 && n_head % n_head_kv == 0 && n_head / n_head_kv <= 8 && head_dim % 32 == 0 && head_dim > 0 &&
           head_dim <= kTurboMaxHeadDim;
}

int64_t turbo_attention_splits(int64_t n_q, int64_t n_head_kv) {
    const int64_t want = std::max<int64_t>(1, 4 * sm_count() / std::max<int64_t>(1, n_head_kv * n_q));
    int64_t s = 1;
    while (s * 2 <= want && s < kMaxSplits) s *= 2;
    return s;
}

void turbo_attention(const TurboAttentionParams& p, cudaStream_t stream) {
    if (p.n_q == 0) return;
    if (!turbo_attention_fits(p.n_head, p.n_head_kv, p.head_dim) || p.kf.d != p.head_dim || p.vf.d != p.head_dim ||
        p.splits < 1 || p.splits > kMaxSplits) {
        throw_cuda_error(cudaErrorInvalidValue, "turbo_attention: GQA <= 8, head_dim a multiple of 32 up to 256, splits 1..128",
                         __FILE__, __LINE__);
    }
    switch (p.head_dim / 32) {
        case 1: launch_attention_nc<1>(p, stream); break;
        case 2: launch_attention_nc<2>(p, stream); break;
        case 3: launch_attention_nc<3>(p, stream); break;
        case 4: launch_attention_nc<4>(p, stream); break;
        case 5: launch_attention_nc<5>(p, stream); break;
        case 6: launch_attention_nc<6>(p, stream); break;
        case 7: launch_attention_nc<7>(p, stream); break;
        default: launch_attention_nc<8>(p, stream); break;
    }
    launch_pdl(turbo_merge_kernel, dim3(unsigned(p.n_q * p.n_head)), dim3(kAttnThreads), 0, stream, p);
}

}  // namespace vxq::cuda

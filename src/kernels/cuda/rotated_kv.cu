// The rotated-domain KV codecs on the device (TurboQuant, VecInfer): the launchers of the stores
// and of the split-K attention (rotated_kv.cuh says what each computes and why the stores' bytes
// are the CPU codecs'; the kernels are rotated_kv_kernels.cuh).
#include "kernels/cuda/rotated_kv.cuh"

#include <algorithm>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/rotated_kv_kernels.cuh"

namespace vxq::cuda {
namespace {

template <template <int, int> class Reader, int NC, int GM>
void launch_attention(const RotatedAttentionParams<typename Reader<NC, GM>::Format>& p, cudaStream_t st) {
    static PerDevice configured;
    const size_t smem = size_t(attn_smem_of<Reader<NC, GM>>(p.kf, p.vf, GM).total);
    allow_smem(rotated_attention_kernel<Reader, NC, GM>, smem, configured);
    const int64_t blocks = rotated_query_blocks(p.n_q, p.n_head / p.n_head_kv);
    launch_pdl(rotated_attention_kernel<Reader, NC, GM>, dim3(unsigned(blocks), unsigned(p.n_head_kv), unsigned(p.splits)),
               dim3(kAttnThreads), smem, st, p);
}

template <template <int, int> class Reader, int NC>
void launch_attention_nc(const RotatedAttentionParams<typename Reader<NC, 1>::Format>& p, cudaStream_t st) {
    switch (rotated_rows_per_block(p.n_q, p.n_head / p.n_head_kv)) {
        case 1: launch_attention<Reader, NC, 1>(p, st); break;
        case 2: launch_attention<Reader, NC, 2>(p, st); break;
        case 4: launch_attention<Reader, NC, 4>(p, st); break;
        default: launch_attention<Reader, NC, 8>(p, st); break;
    }
}

template <class F>
void check_attention(const RotatedAttentionParams<F>& p, const char* what) {
    if (!rotated_attention_fits(p.n_head, p.n_head_kv, p.head_dim) || p.kf.d != p.head_dim || p.vf.d != p.head_dim ||
        p.splits < 1 || p.splits > kMaxSplits) {
        throw_cuda_error(cudaErrorInvalidValue, what, __FILE__, __LINE__);
    }
}

template <class F>
void check_store(const RotatedStoreParams<F>& p, const char* what) {
    if (p.head_dim % 32 != 0 || p.head_dim > kTurboMaxHeadDim || p.kf.d != p.head_dim || p.vf.d != p.head_dim) {
        throw_cuda_error(cudaErrorInvalidValue, what, __FILE__, __LINE__);
    }
}

dim3 store_grid(int64_t n, int64_t n_head_kv) {
    const int64_t warps = 2 * n * n_head_kv;
    return dim3(unsigned((warps + kStoreWarps - 1) / kStoreWarps));
}

}  // namespace

void turbo_store(const TurboStoreParams& p, cudaStream_t stream) {
    if (p.n == 0) return;
    check_store(p, "turbo_store: head_dim a multiple of 32 up to 256, the formats' d");
    launch_pdl(turbo_store_kernel, store_grid(p.n, p.n_head_kv), dim3(kStoreWarps * 32), 0, stream, p);
}

void vecinfer_store(const VecinferStoreParams& p, cudaStream_t stream) {
    if (p.n == 0) return;
    check_store(p, "vecinfer_store: head_dim a power of two, 32 to 256, the formats' d");
    launch_pdl(vecinfer_store_kernel, store_grid(p.n, p.n_head_kv), dim3(kStoreWarps * 32), 0, stream, p);
}

bool rotated_attention_fits(int64_t n_head, int64_t n_head_kv, int64_t head_dim) {
    return n_head_kv > 0 && n_head % n_head_kv == 0 && n_head / n_head_kv <= 8 && head_dim % 32 == 0 && head_dim > 0 &&
           head_dim <= kTurboMaxHeadDim;
}

int64_t rotated_attention_splits(int64_t n_q, int64_t n_head, int64_t n_head_kv) {
    const int64_t blocks = rotated_query_blocks(n_q, n_head / std::max<int64_t>(1, n_head_kv)) * n_head_kv;
    const int64_t want = std::max<int64_t>(1, 4 * sm_count() / std::max<int64_t>(1, blocks));
    int64_t s = 1;
    while (s * 2 <= want && s < kMaxSplits) s *= 2;
    return s;
}

void turbo_attention(const TurboAttentionParams& p, cudaStream_t stream) {
    if (p.n_q == 0) return;
    check_attention(p, "turbo_attention: GQA <= 8, head_dim a multiple of 32 up to 256, splits 1..128");
    switch (p.head_dim / 32) {
        case 1: launch_attention_nc<TurboReader, 1>(p, stream); break;
        case 2: launch_attention_nc<TurboReader, 2>(p, stream); break;
        case 3: launch_attention_nc<TurboReader, 3>(p, stream); break;
        case 4: launch_attention_nc<TurboReader, 4>(p, stream); break;
        case 5: launch_attention_nc<TurboReader, 5>(p, stream); break;
        case 6: launch_attention_nc<TurboReader, 6>(p, stream); break;
        case 7: launch_attention_nc<TurboReader, 7>(p, stream); break;
        default: launch_attention_nc<TurboReader, 8>(p, stream); break;
    }
    launch_pdl(rotated_merge_kernel<TurboReader>, dim3(unsigned(p.n_q * p.n_head)), dim3(kAttnThreads), 0, stream, p);
}

void vecinfer_attention(const VecinferAttentionParams& p, cudaStream_t stream) {
    if (p.n_q == 0) return;
    check_attention(p, "vecinfer_attention: GQA <= 8, head_dim a power of two 32..256, splits 1..128");
    switch (p.head_dim) {  // a power of two (the Walsh-Hadamard transform)
        case 32: launch_attention_nc<VecinferReader, 1>(p, stream); break;
        case 64: launch_attention_nc<VecinferReader, 2>(p, stream); break;
        case 128: launch_attention_nc<VecinferReader, 4>(p, stream); break;
        case 256: launch_attention_nc<VecinferReader, 8>(p, stream); break;
        default: throw_cuda_error(cudaErrorInvalidValue, "vecinfer_attention: head_dim 32, 64, 128 or 256", __FILE__, __LINE__);
    }
    launch_pdl(rotated_merge_kernel<VecinferReader>, dim3(unsigned(p.n_q * p.n_head)), dim3(kAttnThreads), 0, stream, p);
}

}  // namespace vxq::cuda

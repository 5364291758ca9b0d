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

template <class F>
void check_attention(const RotatedAttentionParams<F>& p, const char* what) {
    check_reader_attention(p, what);
    if (p.vf.d != p.head_dim) throw_cuda_error(cudaErrorInvalidValue, what, __FILE__, __LINE__);
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

void turbo_attention(const TurboAttentionParams& p, cudaStream_t stream) {
    if (p.n_q == 0) return;
    check_attention(p, "turbo_attention: GQA <= 8, head_dim a multiple of 32 up to 256, splits 1..128");
    launch_reader_attention<TurboReader, 1, 2, 3, 4, 5, 6, 7, 8>(p, stream);
}

void vecinfer_attention(const VecinferAttentionParams& p, cudaStream_t stream) {
    if (p.n_q == 0) return;
    check_attention(p, "vecinfer_attention: GQA <= 8, head_dim a power of two 32..256, splits 1..128");
    launch_reader_attention<VecinferReader, 1, 2, 4, 8>(p, stream);  // a power of two (the Walsh-Hadamard transform)
}

}  // namespace vxq::cuda

// QJL caches on the device: the launchers of the key store and of the attention (qjl_kv.cuh says
// what each computes; the kernels are qjl_kv_kernels.cuh).
#include "kernels/cuda/qjl_kv.cuh"

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/qjl_kv_kernels.cuh"

namespace vxq::cuda {

void qjl_key_store(const QjlKeyStoreParams& p, cudaStream_t stream) {
    const int64_t blocks = qjl_store_max_blocks(p.n, p.kf.slots);
    if (p.n == 0 || blocks == 0) return;
    if (p.head_dim % 32 != 0 || p.head_dim > kReaderMaxHeadDim || p.kf.d != p.head_dim || p.kf.slots < kQjlBlock) {
        throw_cuda_error(cudaErrorInvalidValue, "qjl_key_store: head_dim a multiple of 32 up to 256, the format's d, a ring",
                         __FILE__, __LINE__);
    }
    launch_pdl(qjl_key_store_kernel, dim3(unsigned(blocks), unsigned(p.n_head_kv)), dim3(kQjlStoreThreads), 0, stream, p);
}

bool qjl_attention_fits(const QjlFormatDev& kf, const KiviFormatDev& vf, int64_t n_head, int64_t n_head_kv, int64_t head_dim) {
    if (!reader_attention_fits(n_head, n_head_kv, head_dim) || kf.d != head_dim || vf.bits != 2 || vf.group != 32 ||
        vf.rows != head_dim / 32) {
        return false;
    }
    using R = QjlReader<1, 8>;  // the most rows a block takes (a batch)
    const AttnSmem L(int(head_dim), 8, R::key_tile_bytes(kf), R::value_tile_bytes(vf), R::warp_scratch_bytes(kf), R::extra_bytes(kf));
    return L.total <= smem_optin();  // asked once per device (this runs at every QJL layer's write and attention)
}

void qjl_attention(const QjlAttentionParams& p, cudaStream_t stream) {
    if (p.n_q == 0) return;
    check_reader_attention(p, "qjl_attention: GQA <= 8, head_dim a multiple of 32 up to 256, splits 1..128");
    launch_reader_attention<QjlReader, 1, 2, 3, 4, 5, 6, 7, 8>(p, stream);
}

}  // namespace vxq::cuda

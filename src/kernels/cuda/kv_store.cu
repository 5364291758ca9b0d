// store_kv (attention.cuh): a batch's keys and values into the pages, in their formats.
#include <cstdint>
#include <cstdlib>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/kv_codes.cuh"
#include "kernels/cuda/kv_store_kernels.cuh"
#include "kernels/cuda/launch.cuh"

namespace vxq::cuda {

namespace {

// Block (token t, head g): its key and value rows into the new slot (any head_dim, any alignment).
__global__ void store_kv_kernel(KvStoreParams p) {
    const int64_t t = blockIdx.x / p.n_head_kv, g = blockIdx.x % p.n_head_kv;
    const KvHeadDev h = p.heads[g];
    const int hd = int(p.head_dim);
    const int64_t slot = h.n_tokens + t, row = (t * p.n_head_kv + g) * p.head_dim;
    kv_store_row(p.k_code, p.k + row, reinterpret_cast<uint8_t*>(h.k) + slot * kv_token_bytes(p.k_code, hd), hd,
                 threadIdx.x, blockDim.x, h.k_scale);
    kv_store_row(p.v_code, p.v + row, reinterpret_cast<uint8_t*>(h.v) + slot * kv_token_bytes(p.v_code, hd), hd,
                 threadIdx.x, blockDim.x, h.v_scale);
}

bool g_hw_convert = [] {
    const char* e = std::getenv("VXQ_CUDA_KV_STORE_CVT");
    return !(e && std::atoi(e) == 0);
}();

}  // namespace

bool set_kv_store_hw_convert(bool on) {
    const bool was = g_hw_convert;
    g_hw_convert = on;
    return was;
}

void store_kv(const KvStoreParams& p, cudaStream_t st) {
    const int64_t pairs = p.n * p.n_head_kv;
    if (pairs == 0) return;
    const auto aligned16 = [](const void* a) { return reinterpret_cast<uintptr_t>(a) % 16 == 0; };
    // The pages: whole 16-byte granules (attention.cuh); the rows kernel's indices are 32-bit.
    if (p.head_dim % 4 == 0 && aligned16(p.k) && aligned16(p.v) && pairs < (int64_t(1) << 29)) {
        constexpr int64_t per_block = int64_t(kKvStoreWarps) * kKvStorePairs;
        const dim3 grid(unsigned((pairs + per_block - 1) / per_block));
        with_kv_codes(p.k_code, p.v_code, [&]<KvCode KC, KvCode VC>() {
            // (the conversions are q8_0's and fp8's: other pairs have one instance)
            constexpr bool converts = KC == KvCode::Q8_0 || KC == KvCode::FP8 || VC == KvCode::Q8_0 || VC == KvCode::FP8;
            if constexpr (converts) {
                if (g_hw_convert) return launch_pdl(kv_store_rows_kernel<KC, VC, true>, grid, dim3(kKvStoreWarps * 32), 0, st, p);
            }
            launch_pdl(kv_store_rows_kernel<KC, VC, false>, grid, dim3(kKvStoreWarps * 32), 0, st, p);
        });
    } else {
        store_kv_kernel<<<unsigned(pairs), kv_row_threads(p.head_dim), 0, st>>>(p);
    }
    VXQ_CUDA_CHECK_LAUNCH();
}

}  // namespace vxq::cuda

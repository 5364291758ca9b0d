#include "kernels/cuda/kv_memory.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda/check.cuh"

namespace vxq::cuda {

namespace {

// The driver entry points used here, resolved once.
struct Driver {
    decltype(&cuMemCreate) create = nullptr;
    decltype(&cuMemRelease) release = nullptr;
    decltype(&cuMemAddressReserve) reserve = nullptr;
    decltype(&cuMemAddressFree) address_free = nullptr;
    decltype(&cuMemMap) map = nullptr;
    decltype(&cuMemUnmap) unmap = nullptr;
    decltype(&cuMemSetAccess) set_access = nullptr;
    decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
};

template <class F>
void resolve(const char* name, F& fn) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || p == nullptr) {
        cudaGetLastError();
        fail("the CUDA driver has no {} (virtual memory management, needed for the device KV cache)", name);
    }
    fn = reinterpret_cast<F>(p);
}

void check(CUresult r, const char* what) {
    if (r != CUDA_SUCCESS) fail("CUDA driver call {} failed (CUresult {})", what, int(r));
}

class DevicePages final : public KvPages {
public:
    DevicePages(const Driver& drv, const CUmemAllocationProp& prop, const CUmemAccessDesc& access, size_t chunk,
                const std::function<void()>& drain, size_t page_bytes, int64_t max_pages)
        : drv_(drv), prop_(prop), access_(access), chunk_(chunk), drain_(drain), page_bytes_(page_bytes),
          max_pages_(max_pages) {
        reserved_ = std::max<size_t>(chunk_, (page_bytes * size_t(max_pages) + chunk_ - 1) / chunk_ * chunk_);
        check(drv_.reserve(&base_, reserved_, chunk_, 0, 0), "cuMemAddressReserve");
    }
    ~DevicePages() override {
        try {
            unmap_from(0);
        } catch (...) {  // a destructor reports nothing: the failed op reported it
        }
        drv_.address_free(base_, reserved_);
    }

    uint8_t* base() const override { return reinterpret_cast<uint8_t*>(base_); }
    int64_t pages() const override { return n_pages_; }
    void grow_to(int64_t n) override {
        VXQ_ASSERT(n <= max_pages_);
        if (n <= n_pages_) return;
        const size_t need = (size_t(n) * page_bytes_ + chunk_ - 1) / chunk_;
        while (handles_.size() < need) {
            CUmemGenericAllocationHandle h{};
            const CUresult r = drv_.create(&h, chunk_, &prop_, 0);
            if (r == CUDA_ERROR_OUT_OF_MEMORY) fail("out of GPU memory for the KV cache");
            check(r, "cuMemCreate");
            const CUdeviceptr at = base_ + handles_.size() * chunk_;
            check(drv_.map(at, chunk_, 0, h, 0), "cuMemMap");
            check(drv_.set_access(at, chunk_, &access_, 1), "cuMemSetAccess");
            handles_.push_back(h);
        }
        n_pages_ = n;
    }
    void shrink_to(int64_t n) override {
        if (n >= n_pages_) return;
        n_pages_ = n;
        unmap_from((size_t(n) * page_bytes_ + chunk_ - 1) / chunk_);
    }
    size_t resident_bytes() const override { return handles_.size() * chunk_; }

private:
    void unmap_from(size_t keep) {
        if (handles_.size() <= keep) return;
        drain_();  // recorded or queued kernels may still use the chunks
        while (handles_.size() > keep) {
            const CUdeviceptr at = base_ + (handles_.size() - 1) * chunk_;
            drv_.unmap(at, chunk_);
            drv_.release(handles_.back());
            handles_.pop_back();
        }
    }

    const Driver& drv_;
    CUmemAllocationProp prop_;
    CUmemAccessDesc access_;
    size_t chunk_;
    const std::function<void()>& drain_;
    size_t page_bytes_;
    int64_t max_pages_, n_pages_ = 0;
    CUdeviceptr base_ = 0;
    size_t reserved_ = 0;
    std::vector<CUmemGenericAllocationHandle> handles_;  // chunk c maps [base + c * chunk, ...)
};

class DeviceMemory final : public KvMemory {
public:
    DeviceMemory(int device, std::string name, std::function<void()> drain)
        : name_(std::move(name)), drain_(std::move(drain)) {
        resolve("cuMemCreate", drv_.create);
        resolve("cuMemRelease", drv_.release);
        resolve("cuMemAddressReserve", drv_.reserve);
        resolve("cuMemAddressFree", drv_.address_free);
        resolve("cuMemMap", drv_.map);
        resolve("cuMemUnmap", drv_.unmap);
        resolve("cuMemSetAccess", drv_.set_access);
        resolve("cuMemGetAllocationGranularity", drv_.granularity);
        prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop_.location.id = device;
        access_.location = prop_.location;
        access_.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        check(drv_.granularity(&chunk_, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity");
    }

    std::unique_ptr<KvPages> reserve(size_t page_bytes, int64_t max_pages) override {
        return std::make_unique<DevicePages>(drv_, prop_, access_, chunk_, drain_, page_bytes, max_pages);
    }
    bool host_accessible() const override { return false; }
    void copy_to_host(void* dst, const void* src, size_t bytes) const override {
        drain_();
        VXQ_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    }
    // After the backend's queued work (which may read the pages); synchronized, so the kernels of
    // the backend's non-blocking stream that come after see the bytes.
    void copy_from_host(void* dst, const void* src, size_t bytes) const override {
        drain_();
        VXQ_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
        VXQ_CUDA_CHECK(cudaDeviceSynchronize());
    }
    std::string name() const override { return name_; }
    size_t commit_granularity() const override { return chunk_; }

private:
    std::string name_;
    std::function<void()> drain_;
    Driver drv_;
    CUmemAllocationProp prop_{};
    CUmemAccessDesc access_{};
    size_t chunk_ = 0;
};

}  // namespace

std::unique_ptr<KvMemory> make_device_kv_memory(int device, const std::string& device_name,
                                                std::function<void()> drain) {
    return std::make_unique<DeviceMemory>(device, device_name, std::move(drain));
}

}  // namespace vxq::cuda

// KV pages in GPU memory (kv/memory.h) through CUDA's virtual memory management: each stream
// reserves device address space for its whole context and maps physical memory in chunks of the
// allocation granularity (2 MiB on the H200) as tokens arrive, so a stream is contiguous (a
// kernel needs its base address only) and nothing is held for tokens that never came. The cost:
// a stream holds at least one chunk (a model with 512 streams holds >= 1 GiB once every stream has
// a token), and resident bytes are whole chunks — that is what resident_bytes() reports.
//
// The driver's cuMem* functions are looked up at run time (cudaGetDriverEntryPointByVersion), so
// the binary does not link libcuda and starts on machines without a driver.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "kv/memory.h"

namespace vxq::cuda {

// Memory on `device`; vxq::Error when the driver lacks virtual memory management. `drain` is
// called before host code reads pages and before chunks are unmapped: it must run and wait for
// every recorded or queued kernel that may touch them (the owning backend's). The memory must
// outlive the caches made with it.
std::unique_ptr<KvMemory> make_device_kv_memory(int device, const std::string& device_name,
                                                std::function<void()> drain);

}  // namespace vxq::cuda

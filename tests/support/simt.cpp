// The SIMT emulator's fibers and barriers (simt.h).
#if VXQ_HAVE_CUDA
#include "support/simt.h"

#include <ucontext.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

#include <array>
#include <stdexcept>
#include <string>
#include <vector>

namespace vxq::simt {
namespace {

constexpr size_t kStackBytes = size_t(256) << 10;

// AddressSanitizer follows a switch of stacks when told (its fiber interface); no-ops otherwise.
// start: before a switch to the stack [bottom, bottom + size) (save: where this context's fake
// stack is kept, null when this context ends); finish: once running again.
void switch_start([[maybe_unused]] void** save, [[maybe_unused]] const void* bottom, [[maybe_unused]] size_t size) {
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_start_switch_fiber(save, bottom, size);
#endif
}
void switch_finish([[maybe_unused]] void* save, [[maybe_unused]] const void** bottom_old, [[maybe_unused]] size_t* size_old) {
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(save, bottom_old, size_old);
#endif
}

enum class Wait { None, Warp, Block };

struct Fiber {
    ucontext_t ctx{};
    std::vector<char> stack;
    Dims dims{};
    bool done = false;
    Wait wait = Wait::None;
};

struct Block {
    std::vector<Fiber> fibers;
    ucontext_t scheduler{};
    int current = -1;
    std::vector<int> warp_arrived, warp_live;  // per warp: threads at its barrier, threads not done
    int block_arrived = 0, block_live = 0;
    std::vector<std::array<uint64_t, 32>> slots;
    std::vector<std::array<uint8_t, 32 * 64>> gathered;  // per warp: warp_gather's bytes
    std::vector<uint8_t> smem;
    const std::function<void()>* body = nullptr;
    const void* sched_bottom = nullptr;  // the scheduler's stack, as a fiber learns it (AddressSanitizer)
    size_t sched_size = 0;
};

Block g;  // one launch at a time (the tests are single-threaded)

Fiber& current() { return g.fibers[size_t(g.current)]; }

// Releases the warp barrier of warp w and the block barrier when every live thread has arrived.
void try_release(int w) {
    if (g.warp_arrived[size_t(w)] > 0 && g.warp_arrived[size_t(w)] == g.warp_live[size_t(w)]) {
        g.warp_arrived[size_t(w)] = 0;
        for (size_t i = size_t(w) * 32; i < size_t(w + 1) * 32 && i < g.fibers.size(); ++i) {
            if (g.fibers[i].wait == Wait::Warp) g.fibers[i].wait = Wait::None;
        }
    }
    if (g.block_arrived > 0 && g.block_arrived == g.block_live) {
        g.block_arrived = 0;
        for (Fiber& f : g.fibers) {
            if (f.wait == Wait::Block) f.wait = Wait::None;
        }
    }
}

void yield() {
    void* fake = nullptr;
    switch_start(&fake, g.sched_bottom, g.sched_size);
    swapcontext(&current().ctx, &g.scheduler);
    switch_finish(fake, &g.sched_bottom, &g.sched_size);
}

void arrive(Wait kind) {
    Fiber& f = current();
    const int w = g.current / 32;
    f.wait = kind;
    if (kind == Wait::Warp) {
        ++g.warp_arrived[size_t(w)];
    } else {
        ++g.block_arrived;
    }
    try_release(w);
    while (current().wait != Wait::None) yield();
}

void entry() {
    switch_finish(nullptr, &g.sched_bottom, &g.sched_size);
    (*g.body)();
    current().done = true;
    --g.warp_live[size_t(g.current / 32)];
    --g.block_live;
    try_release(g.current / 32);  // its warp's barrier, and the block's
    switch_start(nullptr, g.sched_bottom, g.sched_size);  // this fiber ends: never resumed
    swapcontext(&current().ctx, &g.scheduler);
}

}  // namespace

const Dims& dims() { return current().dims; }
void sync_warp() { arrive(Wait::Warp); }
void sync_threads() { arrive(Wait::Block); }
uint8_t* dynamic_smem() { return g.smem.data(); }

uint64_t exchange(uint64_t bits, int src) {
    const int w = g.current / 32, lane = g.current % 32;
    g.slots[size_t(w)][size_t(lane)] = bits;
    sync_warp();
    const uint64_t r = g.slots[size_t(w)][size_t(src)];
    sync_warp();  // nobody writes its slot again before every lane has read
    return r;
}

void warp_gather(const void* mine, size_t bytes, void* all) {
    if (bytes > 64) throw std::runtime_error("simt: warp_gather takes at most 64 bytes a lane");
    const int w = g.current / 32, lane = g.current % 32;
    std::memcpy(g.gathered[size_t(w)].data() + lane * bytes, mine, bytes);
    sync_warp();
    std::memcpy(all, g.gathered[size_t(w)].data(), 32 * bytes);
    sync_warp();  // nobody writes again before every lane has read
}

void launch(dim3 grid, dim3 block, size_t smem, const std::function<void()>& body) {
    const unsigned n = block.x * block.y * block.z;
    if (n == 0 || n % 32 != 0 || block.y != 1 || block.z != 1) throw std::runtime_error("simt: 1-D blocks of a multiple of 32 threads");
    g.fibers.resize(n);
    g.warp_arrived.assign(n / 32, 0);
    g.warp_live.assign(n / 32, 32);
    g.slots.assign(n / 32, {});
    g.gathered.assign(n / 32, {});
    g.body = &body;
    for (unsigned bz = 0; bz < grid.z; ++bz) {
        for (unsigned by = 0; by < grid.y; ++by) {
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                g.smem.assign(smem, 0);
                g.block_arrived = 0;
                g.block_live = int(n);
                std::fill(g.warp_arrived.begin(), g.warp_arrived.end(), 0);
                std::fill(g.warp_live.begin(), g.warp_live.end(), 32);
                for (unsigned t = 0; t < n; ++t) {
                    Fiber& f = g.fibers[t];
                    f.stack.resize(kStackBytes);
                    f.done = false;
                    f.wait = Wait::None;
                    f.dims = Dims{uint3{t, 0, 0}, uint3{bx, by, bz}, block, grid};
                    getcontext(&f.ctx);
                    f.ctx.uc_stack.ss_sp = f.stack.data();
                    f.ctx.uc_stack.ss_size = f.stack.size();
                    f.ctx.uc_link = nullptr;
                    makecontext(&f.ctx, entry, 0);
                }
                for (;;) {
                    bool ran = false, all_done = true;
                    for (unsigned t = 0; t < n; ++t) {
                        Fiber& f = g.fibers[t];
                        if (f.done) continue;
                        all_done = false;
                        if (f.wait != Wait::None) continue;
                        g.current = int(t);
                                            void* fake = nullptr;
                        switch_start(&fake, f.stack.data(), f.stack.size());
                        swapcontext(&g.scheduler, &f.ctx);
                        switch_finish(fake, nullptr, nullptr);
                        ran = true;
                    }
                    if (all_done) break;
                    if (!ran) {
                        throw std::runtime_error("simt: block (" + std::to_string(bx) + ", " + std::to_string(by) + ", " +
                                                 std::to_string(bz) + ") deadlocked: a barrier that a live thread never reaches");
                    }
                }
            }
        }
    }
    g.current = -1;
}

}  // namespace vxq::simt
#endif

// The seed of a randomized test: a new one per run, or VXQ_TEST_SEED's (to rerun a failure:
// every randomized test prints its seed).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>

namespace vxq::test {

inline uint32_t fresh_seed() {
    const char* e = std::getenv("VXQ_TEST_SEED");
    return e ? uint32_t(std::strtoul(e, nullptr, 10)) : std::random_device{}();
}

}  // namespace vxq::test

// Where the shared test assets are, and a loud skip when they are absent.
#pragma once

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace vxq::test {

inline std::string shared_path(const std::string& rel) { return std::string(VXQ_SHARED_DIR) + "/" + rel; }

}  // namespace vxq::test

// Skips the current test, loudly, when a shared asset is missing.
#define VXQ_REQUIRE_ASSET(rel)                                                                   \
    do {                                                                                         \
        if (!std::filesystem::exists(::vxq::test::shared_path(rel))) {                           \
            GTEST_SKIP() << "\n*** SKIPPED: shared asset missing: " << ::vxq::test::shared_path(rel) \
                         << " (set VXQ_SHARED_DIR) ***";                                         \
        }                                                                                        \
    } while (0)

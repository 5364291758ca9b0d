// Where the shared test assets are, and what a test does when one is missing: a loud skip on a
// developer's machine, a failure under CI=true (what CI systems set), so that a CI run without
// ../shared cannot pass with the parity, golden, perplexity and CLI tests not run.
#pragma once

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace vxq::test {

// The CMake cache variable VXQ_SHARED_DIR, unless the environment variable of that name is set (a
// test binary built here and run on another machine, scripts/device_pack.sh).
inline std::string shared_dir() {
    const char* env = std::getenv("VXQ_SHARED_DIR");
    return env && *env ? std::string(env) : std::string(VXQ_SHARED_DIR);
}
inline std::string shared_path(const std::string& rel) { return shared_dir() + "/" + rel; }

// A gtest parameter name from a model file name: "vxq-llama-h64-f16.gguf" -> "vxq_llama_h64_f16".
inline std::string model_param_name(std::string file) {
    file = file.substr(0, file.find(".gguf"));
    for (char& ch : file) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    }
    return file;
}

// CI=true (any value but "", "0" and "false"): missing assets fail the test.
inline bool assets_required() {
    const char* ci = std::getenv("CI");
    if (!ci) return false;
    const std::string v = ci;
    return !v.empty() && v != "0" && v != "false";
}

}  // namespace vxq::test

// Skips the current test, loudly, when `path` (an absolute path to an asset) is missing; fails
// it under CI=true.
#define VXQ_REQUIRE_PATH(path)                                                                     \
    do {                                                                                           \
        const std::string vxq_asset_path_ = (path);                                                \
        if (!std::filesystem::exists(vxq_asset_path_)) {                                           \
            if (::vxq::test::assets_required()) {                                                  \
                GTEST_FAIL() << "shared asset missing under CI=true: " << vxq_asset_path_          \
                             << " (set VXQ_SHARED_DIR)";                                           \
            }                                                                                      \
            GTEST_SKIP() << "\n*** SKIPPED: shared asset missing: " << vxq_asset_path_             \
                         << " (set VXQ_SHARED_DIR; under CI=true this fails) ***";                 \
        }                                                                                          \
    } while (0)

// The same for a path relative to VXQ_SHARED_DIR.
#define VXQ_REQUIRE_ASSET(rel) VXQ_REQUIRE_PATH(::vxq::test::shared_path(rel))

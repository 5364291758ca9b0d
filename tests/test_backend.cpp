// The backend interface seen from the model layer: the backend registry (make_backend).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"

namespace vxq {
namespace {

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(BackendRegistry, MakesTheCpuBackend) {
    EXPECT_EQ(backend_names(), std::vector<std::string>{"cpu"});
    const auto be = make_backend("cpu", 1);
    ASSERT_NE(be, nullptr);
    EXPECT_EQ(be->describe().rfind("cpu/", 0), 0u) << be->describe();
}

TEST(BackendRegistry, UnknownNameIsAnErrorListingTheBackends) {
    const std::string msg = error_of([] { make_backend("cuda", 1); });
    EXPECT_NE(msg.find("unknown backend 'cuda'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("available: cpu"), std::string::npos) << msg;
}

}  // namespace
}  // namespace vxq

// One error type for everything that comes from outside the program: files, flags, requests.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace vxq {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
    throw Error(fmt::format(f, std::forward<Args>(args)...));
}

// Programmer errors (broken invariants), always on: cheap compared to the work they guard.
#define VXQ_ASSERT(cond)                                                                      \
    do {                                                                                      \
        if (!(cond)) ::vxq::assert_failed(#cond, __FILE__, __LINE__);                         \
    } while (0)

[[noreturn]] void assert_failed(const char* cond, const char* file, int line);

}  // namespace vxq

#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace vxq {

void assert_failed(const char* cond, const char* file, int line) {
    std::fprintf(stderr, "vxq: internal error: assertion `%s` failed at %s:%d\n", cond, file, line);
    std::abort();
}

}  // namespace vxq

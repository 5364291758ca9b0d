// The instruction sets a test needs, and the project's loud skip where the CPU lacks them.
#pragma once

#include <gtest/gtest.h>

// Skips the current test, loudly, on a CPU without AVX2+FMA+F16C: the AVX2 kernels cannot run
// there, and such a CPU runs the scalar references, which the other tests cover. CI's machine has
// them. `available` is the detection of the kernels under test (cpu_has_avx2(), matmul_isa(),
// kv_avx2_available()).
#define VXQ_REQUIRE_AVX2(available)                                                                  \
    do {                                                                                             \
        if (!(available)) {                                                                          \
            GTEST_SKIP() << "\n*** SKIPPED: this CPU has no AVX2+FMA+F16C, so the AVX2 kernel was " \
                            "not tested (the scalar reference was) ***";                             \
        }                                                                                            \
    } while (0)

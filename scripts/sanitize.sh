#!/usr/bin/env bash
# Builds the project with gcc AddressSanitizer + UndefinedBehaviorSanitizer (-DVXQ_SANITIZE=ON,
# RelWithDebInfo, build-asan/) and runs the test suite under ctest. Arguments go to ctest:
#   scripts/sanitize.sh            # everything
#   scripts/sanitize.sh -R Gguf    # only the GGUF tests
# Benchmarks are not built (ctest does not run them). VXQ_JOBS sets build parallelism (2).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build-asan"
JOBS="${VXQ_JOBS:-2}"

cmake -S "$ROOT" -B "$BUILD" -G Ninja -DVXQ_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DVXQ_BUILD_TESTS=ON -DVXQ_BUILD_BENCH=OFF >/dev/null
ninja -C "$BUILD" -j"$JOBS"

# Any report fails the test that triggered it.
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1:check_initialization_order=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
ctest --test-dir "$BUILD" --output-on-failure -j2 "$@"

#!/usr/bin/env bash
# One run on a GPU machine: configure + build with CUDA, the CUDA tests (tests/test_cuda.cpp),
# compute-sanitizer memcheck on the op-level CUDA tests (GEMV and GEMM included), and the matmul
# benchmark (bench/gpu_gemv.cu: GEMV GB/s against a device-to-device copy measured in the same
# run, GEMM TFLOP/s, the GEMV/GEMM crossover). Its tables come last. Never changes the GPU's
# clocks or settings.
#
#   bench/gpu.sh [BUILD_DIR]            (default build-gpu)
#
# Environment:
#   VXQ_SHARED_DIR   shared assets (models, golden files); default ../shared
#   VXQ_DEPS_PREFIX  a folder where the Debian -dev packages this project needs were unpacked
#                    with `dpkg -x` (for a machine that has CUDA but not those packages)
#   OUT              if set, full logs are written there
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build-gpu}"
SHARED="${VXQ_SHARED_DIR:-$(pwd)/../shared}"
LOGS="${OUT:-$BUILD}"
mkdir -p "$LOGS"
JOBS="$(nproc)"

if [ -n "${VXQ_DEPS_PREFIX:-}" ]; then
  P="$VXQ_DEPS_PREFIX"
  export CMAKE_PREFIX_PATH="$P/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LD_LIBRARY_PATH="$P/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The .pc files say prefix=/usr: the sysroot maps their paths into the unpacked prefix.
  export PKG_CONFIG_LIBDIR="$P/usr/lib/x86_64-linux-gnu/pkgconfig:$P/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$P"
  if ! command -v pkg-config >/dev/null && [ -x "$P/usr/bin/pkgconf" ]; then
    export PKG_CONFIG_EXECUTABLE="$P/usr/bin/pkgconf"
  fi
fi

step() { printf '\n===== %s =====\n' "$*"; }
status_build=FAIL status_tests=FAIL status_sanitizer="not run" status_bench=FAIL

step "machine"
date -u +"%Y-%m-%d %H:%M UTC"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader || true
nvcc --version | tail -1 || true
git log -1 --format='commit %H %s' 2>/dev/null || cat COMMIT 2>/dev/null || true

step "configure + build (CUDA on)"
if cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DVXQ_CUDA=ON -DVXQ_BUILD_BENCH=OFF \
      -DVXQ_SHARED_DIR="$SHARED" ${PKG_CONFIG_EXECUTABLE:+-DPKG_CONFIG_EXECUTABLE=$PKG_CONFIG_EXECUTABLE} \
      >"$LOGS/configure.log" 2>&1 &&
   cmake --build "$BUILD" -j "$JOBS" --target vxq_tests vxq vxq_gpu_gemv >"$LOGS/build.log" 2>&1; then
  status_build=ok
else
  tail -40 "$LOGS/configure.log" "$LOGS/build.log"
fi

if [ "$status_build" = ok ]; then
  step "CUDA tests"
  "$BUILD/tests/vxq_tests" --gtest_filter='Cuda*:*Cuda*' 2>&1 | tee "$LOGS/cuda_tests.log" | grep -E '^\[ *(OK|FAILED|SKIPPED|PASSED) *\]|Failure|Expected|Which is|error|SKIPPED' | head -80
  if [ "${PIPESTATUS[0]}" -eq 0 ]; then status_tests=ok; fi
  summary_tests="$(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \] [0-9]' "$LOGS/cuda_tests.log" | tr '\n' ' ')"

  if command -v compute-sanitizer >/dev/null; then
    step "compute-sanitizer memcheck (op-level CUDA tests)"
    if timeout 480 compute-sanitizer --tool memcheck --error-exitcode 3 "$BUILD/tests/vxq_tests" \
         --gtest_filter='Cuda.*:Types/CudaGemv.*:Types/CudaGemm.*' >"$LOGS/sanitizer.log" 2>&1; then
      status_sanitizer=clean
    else
      status_sanitizer="FAIL (rc $?)"
      tail -30 "$LOGS/sanitizer.log"
    fi
  fi

  step "matmul benchmark (GEMV, GEMM)"
  if "$BUILD/bench/vxq_gpu_gemv" | tee "$LOGS/gemv.log"; then status_bench=ok; fi
fi

step "summary"
echo "build: $status_build"
echo "CUDA tests: $status_tests  ${summary_tests:-}"
echo "compute-sanitizer: $status_sanitizer"
echo "matmul bench: $status_bench"
[ -f "$LOGS/gemv.log" ] && grep '^|' "$LOGS/gemv.log"
[ "$status_build" = ok ] && [ "$status_tests" = ok ] && [ "$status_bench" = ok ]

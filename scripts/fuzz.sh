#!/usr/bin/env bash
# Builds the libFuzzer target for the GGUF reader with clang (ASan + UBSan, library instrumented
# too) and fuzzes it for ${1:-60} seconds on a scratch copy of fuzz/corpus. Exits non-zero on
# any finding (crash, sanitizer report, exception other than vxq::Error, leak, timeout, OOM);
# the reproducer is left in build-fuzz/findings/. Extra arguments after the first go to libFuzzer.
#   scripts/fuzz.sh            # 60 s
#   scripts/fuzz.sh 600 -jobs=2 -workers=2
set -euo pipefail

SECONDS_TO_RUN="${1:-60}"
shift || true
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build-fuzz"
JOBS="${VXQ_JOBS:-2}"

CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" -G Ninja -DVXQ_FUZZ=ON -DVXQ_BUILD_TESTS=OFF \
    -DVXQ_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C "$BUILD" -j"$JOBS" fuzz_gguf

WORK="$BUILD/corpus-run"     # the fuzzer adds inputs here; fuzz/corpus is left untouched
FINDINGS="$BUILD/findings"
rm -rf "$WORK"
mkdir -p "$WORK" "$FINDINGS"
cp "$ROOT"/fuzz/corpus/* "$WORK"/

export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

set +e
"$BUILD/fuzz/fuzz_gguf" "$WORK" -max_total_time="$SECONDS_TO_RUN" -max_len=65536 -timeout=10 \
    -rss_limit_mb=2048 -artifact_prefix="$FINDINGS/" -print_final_stats=1 "$@"
rc=$?
set -e

shopt -s nullglob
artifacts=("$FINDINGS"/crash-* "$FINDINGS"/leak-* "$FINDINGS"/timeout-* "$FINDINGS"/oom-* "$FINDINGS"/slow-unit-*)
if [[ $rc -ne 0 || ${#artifacts[@]} -gt 0 ]]; then
    echo "fuzz.sh: FINDING (libFuzzer exit $rc); reproducers:" >&2
    for a in "${artifacts[@]}"; do echo "  $a   (rerun: $BUILD/fuzz/fuzz_gguf $a)" >&2; done
    exit 1
fi
echo "fuzz.sh: clean after ${SECONDS_TO_RUN}s ($(ls "$WORK" | wc -l) corpus inputs)"

#!/usr/bin/env bash
# Builds a libFuzzer target with clang (ASan + UBSan, library instrumented too) and fuzzes it for
# ${1:-60} seconds on a scratch copy of its seed corpus. Exits non-zero on any finding (crash,
# sanitizer report, exception other than vxq::Error, leak, timeout, OOM); the reproducer is left
# in build-fuzz/findings/TARGET/. Extra arguments after the first go to libFuzzer.
# VXQ_FUZZ_TARGET picks the target: fuzz_gguf (default; the GGUF reader, corpus fuzz/corpus) or
# fuzz_tokenizer (random bytes through the tokenizers, corpus fuzz/corpus_tokenizer).
#   scripts/fuzz.sh            # 60 s on the GGUF reader
#   scripts/fuzz.sh 600 -jobs=2 -workers=2
#   VXQ_FUZZ_TARGET=fuzz_tokenizer scripts/fuzz.sh 300
set -euo pipefail

SECONDS_TO_RUN="${1:-60}"
shift || true
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build-fuzz"
JOBS="${VXQ_JOBS:-2}"
TARGET="${VXQ_FUZZ_TARGET:-fuzz_gguf}"
case "$TARGET" in
  fuzz_gguf) SEEDS="$ROOT/fuzz/corpus"; MAX_LEN=65536 ;;
  fuzz_tokenizer) SEEDS="$ROOT/fuzz/corpus_tokenizer"; MAX_LEN=4096 ;;
  *) echo "fuzz.sh: unknown target '$TARGET' (fuzz_gguf, fuzz_tokenizer)" >&2; exit 2 ;;
esac

CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" -G Ninja -DVXQ_FUZZ=ON -DVXQ_BUILD_TESTS=OFF \
    -DVXQ_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C "$BUILD" -j"$JOBS" "$TARGET"

WORK="$BUILD/corpus-run-$TARGET"   # the fuzzer adds inputs here; the seed corpus is left untouched
FINDINGS="$BUILD/findings/$TARGET"
rm -rf "$WORK"
mkdir -p "$WORK" "$FINDINGS"
cp "$SEEDS"/* "$WORK"/

export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

set +e
"$BUILD/fuzz/$TARGET" "$WORK" -max_total_time="$SECONDS_TO_RUN" -max_len="$MAX_LEN" -timeout=10 \
    -rss_limit_mb=2048 -artifact_prefix="$FINDINGS/" -print_final_stats=1 "$@"
rc=$?
set -e

shopt -s nullglob
artifacts=("$FINDINGS"/crash-* "$FINDINGS"/leak-* "$FINDINGS"/timeout-* "$FINDINGS"/oom-* "$FINDINGS"/slow-unit-*)
if [[ $rc -ne 0 || ${#artifacts[@]} -gt 0 ]]; then
    echo "fuzz.sh: FINDING (libFuzzer exit $rc); reproducers:" >&2
    for a in "${artifacts[@]}"; do echo "  $a   (rerun: $BUILD/fuzz/$TARGET $a)" >&2; done
    exit 1
fi
echo "fuzz.sh: $TARGET clean after ${SECONDS_TO_RUN}s ($(ls "$WORK" | wc -l) corpus inputs)"

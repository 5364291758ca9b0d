#!/usr/bin/env bash
# The fused KIVI store (kernels/cuda/kivi.cuh: KiviFresh, pack_ahead; VXQ_CUDA_KIVI_FUSE) on a GPU
# machine, in one call, from binaries built elsewhere: its tests with every backend fusing, the
# SASS of the fused instance (spills in the loop), end to end with VXQ_CUDA_KIVI_FUSE=0 / 1 in
# alternating processes (synthetic Llama-3-8B Q4_0, f16 and kivi-2 caches, 1K and 32K), and
# compute-sanitizer memcheck of the fused-against-separate test. Logs go to $OUT (one file per
# part, written as it runs, so a call cut short keeps what it did); the tables to stdout.
#
#   bench/gpu_kivi_fuse.sh BIN_DIR      (BIN_DIR holds vxq and vxq_tests)
#
# VXQ_SHARED_DIR: the shared assets (the h64 models for the model-level tests).
set -uo pipefail
B="${1:?usage: bench/gpu_kivi_fuse.sh BIN_DIR}"
OUT="${OUT:-/tmp/kivi_fuse}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== tests $(date +%T)"
VXQ_CUDA_KIVI_FUSE=1 timeout 150 "$B/vxq_tests" --gtest_filter='KiviSimt.Fused*:Cuda.Kivi*:Cuda.RopeStoreAndAttentionFuseBitExact:Cuda.CompressedKv*' > "$OUT/tests.txt" 2>&1
echo "rc $?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|FAILED  \]|^\[       OK \] Cuda.KiviFused" "$OUT/tests.txt" | head -20
echo "== end to end $(date +%T)"
S="${VXQ_SYNTH_DIR:-/tmp/synth}"; mkdir -p "$S"
[ -f "$S/q4.gguf" ] || "$B/vxq" synth --shape llama3-8b --type q4_0 -o "$S/q4.gguf" > "$OUT/synth.txt" 2>&1 || { echo "synth failed"; tail -3 "$OUT/synth.txt"; }
VXQ_CUDA_KIVI_FUSE=1 VXQ_CUDA_PROFILE=1 timeout 60 "$B/vxq" bench -m "$S/q4.gguf" --device cuda --flash-attn -p 0 -n 8 -d 1024 -r 1 \
  --depth-fill kv --kv kivi:bits=2 --no-aa > "$OUT/profile.txt" 2>&1
echo "fused attention in the profile: $(grep -c 'rope q, k; store' "$OUT/profile.txt") lines"
for r in 1 2; do for f in 0 1; do
  echo "### VXQ_CUDA_KIVI_FUSE=$f round $r" >> "$OUT/e2e.txt"
  VXQ_CUDA_KIVI_FUSE=$f timeout 110 "$B/vxq" bench -m "$S/q4.gguf" --device cuda --flash-attn -p 0 -n 32 -d 1024,32768 -r 2 \
    --depth-fill kv --kv f16,kivi:bits=2 --no-aa >> "$OUT/e2e.txt" 2>&1
done; done
grep -E "^###|^\| " "$OUT/e2e.txt" | cut -c1-170
echo "== SASS $(date +%T)"
for k in ILi128ELi2ELi1ELi32ELi4ELb0E ILi128ELi2ELi1ELi32ELi4ELb1E ILi128ELi4ELi1ELi32ELi4ELb1E; do
  echo "## $k" >> "$OUT/sass.txt"
  timeout 200 python3 "$(dirname "$0")/gpu_sass_loops.py" "$B/vxq" "kivi_attention_kernel$k" >> "$OUT/sass.txt" 2>&1 ||
    echo "(exit $?: 124 is the timeout; cuobjdump reads the whole binary, 40 s were too few on 2026-12-07)" >> "$OUT/sass.txt"
done
grep -A3 "^## " "$OUT/sass.txt" | cut -c1-250
echo "== memcheck $(date +%T)"
timeout 90 compute-sanitizer --tool memcheck "$B/vxq_tests" --gtest_filter='Cuda.KiviFusedStoreEqualsStoreKernel' > "$OUT/memcheck.txt" 2>&1
echo "rc $?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck.txt" | head -5

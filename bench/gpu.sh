#!/usr/bin/env bash
# One run on a GPU machine: configure + build with CUDA, the CUDA tests (tests/test_cuda.cpp),
# compute-sanitizer memcheck on the op-level CUDA tests (GEMV and GEMM included), the matmul
# benchmark (bench/gpu_gemv.cu: GEMV GB/s against a device-to-device copy measured in the same
# run, GEMM TFLOP/s, the GEMV/GEMM crossover), perplexity on --device cuda vs cpu, and end-to-end
# prefill/decode (`vxq bench --device cuda`) on random-weight GGUFs of the Llama-3-8B shape
# (`vxq synth`, F16 and Q4_0), beside llama.cpp's llama-bench on the same files when
# LLAMA_CPP_BIN names a llama.cpp CUDA build. Short tables come last. Never changes the GPU's
# clocks or settings, and never builds llama.cpp.
#
#   bench/gpu.sh [BUILD_DIR]            (default build-gpu)
#
# Environment:
#   VXQ_SHARED_DIR   shared assets (models, golden files); default ../shared
#   VXQ_DEPS_PREFIX  a folder where the Debian -dev packages this project needs were unpacked
#                    with `dpkg -x` (for a machine that has CUDA but not those packages)
#   VXQ_DEPS_DEBS    a folder of those packages as .deb files (scripts/device_prepare.sh makes it):
#                    unpacked into a temporary VXQ_DEPS_PREFIX first
#   OUT              if set, full logs are written there
#   VXQ_SYNTH_DIR    where the synthetic GGUFs are written (default BUILD_DIR/synth; ~21 GB)
#   VXQ_E2E_TYPES    weight types of the end-to-end runs (default "f16 q4_0"; empty: skip them)
#   VXQ_GPU_E2E_ARMS the end-to-end arms (default "graphs1 graphs1_pass1 graphs1_pdl0 graphs0";
#                    "graphs1" alone: the default path, for a run that must stay short)
#   LLAMA_CPP_BIN    a llama.cpp build's bin/ folder (llama-bench, llama-batched-bench): run on the same files
#   VXQ_GPU_BENCH_ONLY=1  skip the tests, compute-sanitizer and the perplexity comparison (a
#                    benchmark-only rerun)
#   VXQ_GPU_BPS_SWEEP  e.g. "2 3": the end-to-end bench also with that many batch-1 GEMV blocks per SM
#   VXQ_GPU_AB_ARMS  e.g. "VXQ_GEMV_Q4_ROWS=2;VXQ_CUDA_PDL=0": decode tg64 per arm (its environment),
#                    interleaved over VXQ_GPU_AB_ROUNDS rounds (3) with the default first and last
#                    (an A/A arm), at depths VXQ_GPU_AB_DEPTHS (0,4096); table ab.md
#   VXQ_GPU_PPL_STREAM_CHUNKS  chunks of the stream-mode perplexity (default 24)
#   VXQ_GPU_PPL_PREFILL_CHUNKS chunks of the prefill-mode perplexity (default 0: the whole file, 614
#                    chunks: over 24, last-bit differences flipping 4-bit codes moved a q4_0 cache by
#                    up to 0.2 %, over the file by 0.001 %; docs/gpu.md, fifth session of 2026-12-06)
#   VXQ_GPU_SKIP_PPL=1  skip the perplexity comparison; VXQ_GPU_SKIP_SANITIZER=1 the memcheck
#   VXQ_GPU_PPL_KV   KV caches of the perplexity comparison on f16 weights (default "q8_0 q4_0 fp8
#                    kivi:bits=2 kivi:bits=4 turbo-rvq")
#   VXQ_GPU_ATTN_CONTEXTS  contexts of the decode-attention benchmark (default 1K..128K)
#   VXQ_GPU_ROTATED_CONTEXTS  contexts of its TurboQuant / VecInfer cases (default 32768 131072)
#   VXQ_GPU_ATTN_ARGS  its layouts (default "--splits 32,64 --stream 0,2 --mma 0,1": the stream form's
#                    ring, the stream form on tensor cores (f16, fp8) and the tensor-core form at 32 and 64 splits)
#   VXQ_GPU_NCU_STEP=1  also each decode-step kernel alone under Nsight Compute (time, DRAM bytes)
#   VXQ_GPU_TIMELINE=1  also a second build with -DVXQ_CUDA_TRACE=ON (BUILD_DIR-trace) and, per
#                    weight type, each decode-step kernel's time inside the graph from an empty
#                    cache (VXQ_CUDA_PROFILE=timeline; launch.cuh)
#   VXQ_GPU_KV_DEPTHS  depths of the decode-vs-context sweep per KV format (default
#                    1024,4096,16384,32768: each depth is filled three times per format, ~1 min
#                    per 128K fill with the flash prefill, more for KIVI's: docs/gpu.md)
#   VXQ_GPU_KV_METHODS  the sweep's --kv list (default f16,q8_0,q4_0,fp8,kivi:bits=4,kivi:bits=2)
#   VXQ_GPU_READER_DEPTHS  depths of the reader codecs' decode (TurboQuant, VecInfer, QJL next to
#                    f16; default 4096,32768; the depth stored by `vxq bench --depth-fill kv`); "" skips it
#   VXQ_GPU_TP       tensor parallelism on a machine with 2+ GPUs (default: every power of two up to
#                    the GPU count, from 2): vxq-llama-h64 perplexity and greedy text with --tp N
#                    against --tp 1, and decode at VXQ_GPU_TP_DEPTH (32768) on a synthetic
#                    Llama-3-70B Q4_0 (f16 cache vs kivi-2, beside llama.cpp --split-mode row when
#                    LLAMA_CPP_BIN is set), and the longest context of each (VXQ_GPU_TP_LONGEST=1:
#                    also decoded at 95 % of it); "" skips it. One GPU: the section says it did not run.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build-gpu}"
SHARED="${VXQ_SHARED_DIR:-$(pwd)/../shared}"
LOGS="${OUT:-$BUILD}"
mkdir -p "$LOGS"
JOBS="$(nproc)"

if [ -n "${VXQ_DEPS_DEBS:-}" ]; then
  VXQ_DEPS_PREFIX="$(mktemp -d)"
  for f in "$VXQ_DEPS_DEBS"/*.deb; do dpkg -x "$f" "$VXQ_DEPS_PREFIX"; done
fi
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
status_build=FAIL status_tests=FAIL status_sanitizer="not run" status_bench=FAIL status_e2e="not run" status_ppl="not run"
[ "${VXQ_GPU_BENCH_ONLY:-}" = 1 ] && status_tests=skipped

step "machine"
date -u +"%Y-%m-%d %H:%M UTC"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader || true
nvcc --version | tail -1 || true
git log -1 --format='commit %H %s' 2>/dev/null || cat COMMIT 2>/dev/null || true

step "configure + build (CUDA on)"
if cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DVXQ_CUDA=ON -DVXQ_BUILD_BENCH=OFF \
      -DVXQ_SHARED_DIR="$SHARED" ${PKG_CONFIG_EXECUTABLE:+-DPKG_CONFIG_EXECUTABLE=$PKG_CONFIG_EXECUTABLE} \
      >"$LOGS/configure.log" 2>&1 &&
   cmake --build "$BUILD" -j "$JOBS" --target vxq vxq_gpu_gemv vxq_gpu_attention $([ "${VXQ_GPU_BENCH_ONLY:-}" = 1 ] || echo vxq_tests) \
     >"$LOGS/build.log" 2>&1; then
  status_build=ok
else
  tail -40 "$LOGS/configure.log" "$LOGS/build.log"
fi

# The timeline build (VXQ_GPU_TIMELINE=1): vxq alone, every kernel stamping its start.
TRACE_BUILD="$BUILD-trace"
if [ "$status_build" = ok ] && [ "${VXQ_GPU_TIMELINE:-}" = 1 ]; then
  cmake -S . -B "$TRACE_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DVXQ_CUDA=ON -DVXQ_CUDA_TRACE=ON -DVXQ_BUILD_TESTS=OFF \
        -DVXQ_BUILD_BENCH=OFF -DVXQ_SHARED_DIR="$SHARED" ${PKG_CONFIG_EXECUTABLE:+-DPKG_CONFIG_EXECUTABLE=$PKG_CONFIG_EXECUTABLE} \
        >"$LOGS/configure_trace.log" 2>&1 && cmake --build "$TRACE_BUILD" -j "$JOBS" --target vxq >"$LOGS/build_trace.log" 2>&1 ||
    { echo "timeline build failed:"; tail -20 "$LOGS/build_trace.log"; }
fi

if [ "$status_build" = ok ]; then
  if [ "${VXQ_GPU_BENCH_ONLY:-}" != 1 ]; then
    step "CUDA tests"
    "$BUILD/tests/vxq_tests" --gtest_filter='Cuda*:*Cuda*' 2>&1 | tee "$LOGS/cuda_tests.log" | grep -E '^\[ *(OK|FAILED|SKIPPED|PASSED) *\]|Failure|Expected|Which is|error|SKIPPED' | head -80
    if [ "${PIPESTATUS[0]}" -eq 0 ]; then status_tests=ok; fi
    summary_tests="$(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \] [0-9]' "$LOGS/cuda_tests.log" | tr '\n' ' ')"

    if [ "${VXQ_GPU_SKIP_SANITIZER:-}" != 1 ] && command -v compute-sanitizer >/dev/null; then
      step "compute-sanitizer memcheck (op-level CUDA tests)"
      if timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$BUILD/tests/vxq_tests" \
           --gtest_filter='Cuda.*:Types/CudaGemv.*:Types/CudaGemm.*' >"$LOGS/sanitizer.log" 2>&1; then
        status_sanitizer=clean
      else
        status_sanitizer="FAIL (rc $?)"
        tail -30 "$LOGS/sanitizer.log"
      fi
    fi
  fi

  step "matmul benchmark (GEMV, GEMM)"
  if "$BUILD/bench/vxq_gpu_gemv" | tee "$LOGS/gemv.log"; then status_bench=ok; fi

  if [ "${VXQ_GPU_BENCH_ONLY:-}" != 1 ] && [ "${VXQ_GPU_SKIP_PPL:-}" != 1 ]; then
    STREAM_CHUNKS="${VXQ_GPU_PPL_STREAM_CHUNKS:-24}"
    PREFILL_CHUNKS="${VXQ_GPU_PPL_PREFILL_CHUNKS:-0}"
    step "perplexity: --device cuda vs --device cpu (vxq-llama-h64, WikiText-2, -c 1024; prefill $([ "$PREFILL_CHUNKS" = 0 ] && echo all || echo "$PREFILL_CHUNKS") chunks, stream $STREAM_CHUNKS)"
    status_ppl=ok
    TEXT="$SHARED/assets/text/wikitext2_test.raw.crlf.txt"
    # ppl_pair LABEL MODEL CHUNKS ARGS...: perplexity on the CPU and on CUDA (CHUNKS 0: the whole file), one line with both
    # and their relative difference (flagged beyond 0.1 %) into ppl.md.
    ppl_pair() {
      local line="$1" m="$2" chunks="$3" cargs=()
      shift 3
      [ "$chunks" != 0 ] && cargs=(--chunks "$chunks")  # 0: the whole file
      for dev in cpu cuda; do
        "$BUILD/src/vxq" perplexity -m "$m" -f "$TEXT" -c 1024 "${cargs[@]}" "$@" --device "$dev" \
          >"$LOGS/ppl.out" 2>"$LOGS/ppl.err" || { echo "perplexity $line $dev failed:"; tail -2 "$LOGS/ppl.err"; status_ppl=FAIL; }
        line="$line $dev $(grep -oE 'PPL = [0-9.]+' "$LOGS/ppl.out" | tail -1 | cut -d' ' -f3)"
      done
      echo "$line" | awk '{ d = ($NF - $(NF-2)) / $(NF-2); printf "%s  rel.diff %+.5f%%%s\n", $0, 100 * d, (d > 0.001 || d < -0.001) ? "  > 0.1 %!" : "" }' |
        tee -a "$LOGS/ppl.md"
    }
    for w in f16 q8_0 q4_0; do
      m="$SHARED/assets/models/vxq-llama-h64-$w.gguf"
      if [ ! -f "$m" ] || [ ! -f "$TEXT" ]; then echo "skipped: $m or $TEXT missing"; status_ppl="not run"; continue; fi
      for mode in prefill stream; do
        chunks=$PREFILL_CHUNKS; [ "$mode" = stream ] && chunks=$STREAM_CHUNKS
        for fa in "" "--flash-attn"; do
          ppl_pair "$w $mode ${fa:-(no -fa)}" "$m" $chunks --mode "$mode" $fa
        done
      done
    done
    # Compressed caches on the device (issue 11): f16 weights, -fa (the fused kernel on both backends).
    m="$SHARED/assets/models/vxq-llama-h64-f16.gguf"
    for kv in ${VXQ_GPU_PPL_KV-q8_0 q4_0 fp8 kivi:bits=2 kivi:bits=4 turbo-rvq}; do
      [ -f "$m" ] && [ -f "$TEXT" ] || break
      for mode in prefill stream; do
        chunks=$PREFILL_CHUNKS; [ "$mode" = stream ] && chunks=$STREAM_CHUNKS
        ppl_pair "f16 --kv $kv $mode -fa" "$m" $chunks --mode "$mode" --flash-attn --kv "$kv"
      done
    done
    grep -q '0.1 %!' "$LOGS/ppl.md" 2>/dev/null && status_ppl=FAIL
  fi

  step "decode attention alone (bench/gpu_attention.cu)"
  # The stream form (the decode default; its ring and, for f16 / fp8, its form on tensor cores) at
  # 32 and 64 splits beside the tensor-core form (--stream 0); VXQ_GPU_ATTN_ARGS="--tile 32,64
  # --stages 2,3 ..." sweeps the latter's tiling.
  "$BUILD/bench/vxq_gpu_attention" ${VXQ_GPU_ATTN_ARGS:---splits 32,64 --stream 0,2 --mma 0,1} ${VXQ_GPU_ATTN_CONTEXTS:-1024 4096 16384 32768 65536 131072} |
    tee "$LOGS/attention.log" | grep -v '^{' || status_bench=FAIL
  # The reader-policy codecs (TurboQuant 3 / 2 bits, VecInfer n=4,m=8: rotated_kv.cuh; QJL: qjl_kv.cuh)
  # at their default splits and 32 / 128 splits, at VXQ_GPU_ROTATED_CONTEXTS (default 32K and 128K).
  "$BUILD/bench/vxq_gpu_attention" --formats turbo3,turbo2,vecinfer,qjl --turbo-splits 32,128 \
    ${VXQ_GPU_ROTATED_CONTEXTS:-32768 131072} | tee "$LOGS/attention_rotated.log" | grep -v '^{' || status_bench=FAIL
  # The encoders (issue 11 item 3: >= 70 % of the copy at 2048 tokens): the token-wise store and
  # KIVI's flush, the store's q8_0 / fp8 codes by the conversion instructions (the default) and
  # by the scalar steps (VXQ_CUDA_KV_STORE_CVT=0, kv_store_kernels.cuh), alternating twice.
  for round in 1 2; do
    for cvt in 1 0; do
      echo "encoders, round $round, VXQ_CUDA_KV_STORE_CVT=$cvt"
      VXQ_CUDA_KV_STORE_CVT=$cvt "$BUILD/bench/vxq_gpu_attention" --formats f16,q8_0,q4_0,fp8,kivi4,kivi2 --encode 512,2048,8192 0 |
        tee "$LOGS/encode_cvt${cvt}_$round.log" | grep -v '^{' || status_bench=FAIL
    done
  done
  # The same shape through PyTorch's scaled_dot_product_attention (issue 11 compares f16 with it),
  # where the machine's Python has torch with CUDA.
  if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    python3 bench/gpu_sdpa_torch.py ${VXQ_GPU_ATTN_CONTEXTS:-1024 4096 16384 32768 65536 131072} 2>/dev/null |
      tee "$LOGS/sdpa_torch.log" | grep -v '^{' || status_bench=FAIL
  else
    echo "skipped: PyTorch with CUDA not importable (the SDPA comparison)"
  fi

  E2E_TYPES="${VXQ_E2E_TYPES-f16 q4_0}"
  if [ -n "$E2E_TYPES" ]; then
    step "end to end: synthetic Llama-3-8B shape, batch 1"
    SYNTH="${VXQ_SYNTH_DIR:-$BUILD/synth}"
    mkdir -p "$SYNTH"
    status_e2e=ok
    if [ -n "${LLAMA_CPP_BIN:-}" ]; then
      echo "llama.cpp: $LLAMA_CPP_BIN"
      "$LLAMA_CPP_BIN/llama-cli" --version 2>&1 | grep -E 'version|built' || true
    fi
    for t in $E2E_TYPES; do
      m="$SYNTH/llama3-8b-$t.gguf"
      [ -f "$m" ] || "$BUILD/src/vxq" synth --shape llama3-8b --type "$t" -o "$m" >"$LOGS/synth_$t.log" 2>&1 ||
        { echo "synth $t failed"; tail -5 "$LOGS/synth_$t.log"; status_e2e=FAIL; continue; }
      # llama.cpp's system-info line (its build's backends and CPU features), once, from a one-token run on this file.
      if [ -n "${LLAMA_CPP_BIN:-}" ] && [ -z "${llama_info:-}" ]; then
        llama_info="$(timeout 120 "$LLAMA_CPP_BIN/llama-cli" -m "$m" -ngl 99 -n 1 -p hi -no-cnv --temp 0 </dev/null 2>&1 |
          grep -m1 'system_info')"
        echo "llama.cpp ${llama_info:-system_info: (not printed)}"
      fi
      # Arms: CUDA graphs with PDL and the step in passes (the default; also at depth 4096), one
      # pass per step, graphs without PDL, plain launches.
      for arm in ${VXQ_GPU_E2E_ARMS:-graphs1 graphs1_pass1 graphs1_pdl0 graphs0}; do
        g=1; pdl=1; chunk=8; depth=0
        [ "$arm" = graphs1 ] && depth=0,4096
        [ "$arm" = graphs0 ] && g=0
        [ "$arm" = graphs1_pdl0 ] && pdl=0
        [ "$arm" = graphs1_pass1 ] && chunk=0
        VXQ_CUDA_GRAPHS=$g VXQ_CUDA_PDL=$pdl VXQ_CUDA_CHUNK_OPS=$chunk "$BUILD/src/vxq" bench -m "$m" --device cuda --flash-attn \
          -p 512 -n 128 -d $depth -r 5 --no-aa --json \
          >"$LOGS/e2e_${t}_$arm.json" 2>"$LOGS/e2e_${t}_$arm.err" ||
          { echo "vxq bench $t ($arm) failed:"; tail -3 "$LOGS/e2e_${t}_$arm.err"; status_e2e=FAIL; }
      done
      # Where the time goes: GPU time per op kind (plain launches, no PDL), decode and prefill apart.
      for pr in "tg -p 0 -n 64" "pp -p 512 -n 0"; do
        set -- $pr
        VXQ_CUDA_PROFILE=1 VXQ_CUDA_PDL=0 "$BUILD/src/vxq" bench -m "$m" --device cuda --flash-attn "${@:2}" -r 1 --no-aa \
          >/dev/null 2>"$LOGS/profile_${t}_$1.txt" || true
        echo "profile $t $1 ($*, one repetition):"; grep 'vxq:' "$LOGS/profile_${t}_$1.txt" | head -20
      done
      # The host's share of a decode step: GPU time per graph launch against wall time, by phase.
      VXQ_CUDA_PROFILE=graphs "$BUILD/src/vxq" bench -m "$m" --device cuda --flash-attn -p 0 -n 128 -r 3 --no-aa \
        >/dev/null 2>"$LOGS/profile_${t}_graphs.txt" || true
      echo "host time $t (tg128, VXQ_CUDA_PROFILE=graphs):"; grep 'vxq:' "$LOGS/profile_${t}_graphs.txt"
      # Each kernel of a decode step alone (VXQ_GPU_NCU_STEP=1, where Nsight Compute is installed;
      # --clock-control none: the card's clocks stay as found, as for every other timing here):
      # its duration and DRAM bytes, grouped by kernel (bench/gpu_ncu_step.py), ~2 steps of kernels
      # after 2000 launches of warm-up.
      NCU="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
      if [ "${VXQ_GPU_NCU_STEP:-}" = 1 ] && [ -x "$NCU" ]; then
        "$NCU" --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
          --launch-skip 2000 --launch-count 600 "$BUILD/src/vxq" bench -m "$m" --device cuda --flash-attn -p 0 -n 32 -r 1 \
          --no-aa >"$LOGS/ncu_step_$t.csv" 2>"$LOGS/ncu_step_$t.err" || { echo "ncu $t failed:"; tail -3 "$LOGS/ncu_step_$t.err"; }
        copy_gbs="$(awk -F'|' '/d2d copy/ { gsub(/ /, "", $7); print $7; exit }' "$LOGS/gemv.log" 2>/dev/null)"
        echo "decode step kernel by kernel, $t (ncu; % of the copy bandwidth ${copy_gbs:-4270} GB/s):"
        python3 bench/gpu_ncu_step.py "$LOGS/ncu_step_$t.csv" "${copy_gbs:-4270}" | tee "$LOGS/ncu_step_$t.md" || true
      fi
      # Each kernel's time inside the decode step's graph (VXQ_GPU_TIMELINE=1): from its wait
      # returning to the next kernel's, by grid, and the first kernels of a step in order.
      if [ "${VXQ_GPU_TIMELINE:-}" = 1 ] && [ -x "$TRACE_BUILD/src/vxq" ]; then
        VXQ_CUDA_PROFILE=timeline "$TRACE_BUILD/src/vxq" bench -m "$m" --device cuda --flash-attn -p 0 -n 32 -r 1 --no-aa \
          >/dev/null 2>"$LOGS/timeline_$t.txt" || true
        echo "decode step inside the graph, $t (timeline build):"; grep 'vxq:' "$LOGS/timeline_$t.txt" | head -30
      fi
      # A/B arms (VXQ_GPU_AB_ARMS="VXQ_X=1;VXQ_Y=0 VXQ_Z=2"): decode with each arm's environment,
      # arms interleaved round by round, the default first and last (its second run is the A/A arm:
      # the noise floor, MEASURE.md).
      if [ -n "${VXQ_GPU_AB_ARMS:-}" ]; then
        IFS=';' read -ra arms <<<"default;${VXQ_GPU_AB_ARMS};default"
        for round in $(seq 1 "${VXQ_GPU_AB_ROUNDS:-3}"); do
          for arm in "${arms[@]}"; do
            envs=(); [ "$arm" = default ] || read -ra envs <<<"$arm"
            env "${envs[@]}" "$BUILD/src/vxq" bench -m "$m" --device cuda --flash-attn -p 0 -n 64 -d "${VXQ_GPU_AB_DEPTHS:-0,4096}" \
              -r 3 --no-aa --json >"$LOGS/ab.json" 2>"$LOGS/ab.err" || { echo "A/B arm '$arm' failed:"; tail -2 "$LOGS/ab.err"; continue; }
            echo "| $t | $round | $arm | $(python3 -c "import json,sys; print(' | '.join(f\"{r['depth']}: {r['tps_median']:.1f}\" for r in json.load(open(sys.argv[1]))['rows']))" "$LOGS/ab.json") |" |
              tee -a "$LOGS/ab.md"
          done
        done
      fi
      # Batch-1 GEMV blocks per SM (default 2).
      for bps in ${VXQ_GPU_BPS_SWEEP:-}; do
        VXQ_GEMV1_BLOCKS_PER_SM=$bps "$BUILD/src/vxq" bench -m "$m" --device cuda --flash-attn -p 512 -n 128 -r 3 --no-aa --json \
          >"$LOGS/e2e_${t}_bps$bps.json" 2>/dev/null &&
          echo "$t blocks/SM $bps: tg128 $(python3 -c "import json,sys; print([r['tps_median'] for r in json.load(open(sys.argv[1]))['rows']])" "$LOGS/e2e_${t}_bps$bps.json")"
      done
      if [ -n "${LLAMA_CPP_BIN:-}" ]; then
        "$LLAMA_CPP_BIN/llama-bench" -m "$m" -ngl 99 -fa 1 -p 512 -n 128 -r 5 -o json >"$LOGS/llama_$t.json" \
          2>"$LOGS/llama_$t.err" || { echo "llama-bench $t failed:"; tail -3 "$LOGS/llama_$t.err"; status_e2e=FAIL; }
      fi
    done
    python3 "bench/gpu_e2e_table.py" "$LOGS" "$SYNTH" $E2E_TYPES | tee "$LOGS/e2e.md" || status_e2e=FAIL

    # Decode vs context per KV cache format (issue 11; VXQ_GPU_KV_METHODS, KIVI-4 and KIVI-2 included),
    # Q4_0 weights; with LLAMA_CPP_BIN, bench/gpu_kv_vs_llamacpp.sh at the longest depth (llama.cpp's
    # llama-batched-bench -fa with its f16 / q8_0 / q4_0 caches on the same file).
    m="$SYNTH/llama3-8b-q4_0.gguf"
    DEPTHS="${VXQ_GPU_KV_DEPTHS:-1024,4096,16384,32768}"
    if [ -f "$m" ]; then
      step "decode vs context per KV cache format (depths $DEPTHS)"
      "$BUILD/src/vxq" bench -m "$m" --device cuda --flash-attn -p 0 -n 64 -d "$DEPTHS" -r 2 --kv "${VXQ_GPU_KV_METHODS:-f16,q8_0,q4_0,fp8,kivi:bits=4,kivi:bits=2}" \
        --json >"$LOGS/kv_sweep.json" 2>"$LOGS/kv_sweep.err" || { echo "kv sweep failed:"; tail -3 "$LOGS/kv_sweep.err"; status_e2e=FAIL; }
      python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    print(f\"| vxq | {r['kv_format']} | {r['depth']} | {r['tps_median']:.1f} | {r['kv_bytes'] / 1e9:.2f} GB |\")" "$LOGS/kv_sweep.json" |
        tee "$LOGS/kv_sweep.md"
      "$BUILD/src/vxq" plot "$LOGS/kv_sweep.json" -o "$LOGS/gpu_decode_vs_context.svg" \
        --title "H200, synthetic Llama-3-8B Q4_0, tg64 vs depth per KV cache" >/dev/null 2>&1 || true
      # The reader codecs (issue 12 item 5: decode at 32K per codec next to f16), their depth
      # stored by --depth-fill kv (their prefill would read the cache hundreds of times; the
      # timed decode is the same); VXQ_GPU_READER_DEPTHS (default 4096,32768), "" skips it.
      RDEPTHS="${VXQ_GPU_READER_DEPTHS-4096,32768}"
      if [ -n "$RDEPTHS" ]; then
        step "decode per reader codec, depth stored by --depth-fill kv (depths $RDEPTHS)"
        "$BUILD/src/vxq" bench -m "$m" --device cuda --flash-attn -p 0 -n 32 -d "$RDEPTHS" -r 2 --depth-fill kv \
          --kv f16,turbo:bits=3,turbo:bits=2,turbo-prod:bits=3,vecinfer:calib=random,qjl --json >"$LOGS/reader_sweep.json" \
          2>"$LOGS/reader_sweep.err" || { echo "reader sweep failed:"; tail -3 "$LOGS/reader_sweep.err"; status_e2e=FAIL; }
        python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    print(f\"| vxq | {r['kv_format']} | {r['depth']} | {r['tps_median']:.1f} | {r['ratio_median']:.3f} | {r['kv_bytes'] / 1e9:.2f} GB |\")" \
          "$LOGS/reader_sweep.json" | tee "$LOGS/reader_sweep.md"
      fi
      if [ -n "${LLAMA_CPP_BIN:-}" ]; then
        # Both engines on the same file at the longest depth, in one script (rounds alternate them).
        VXQ="$BUILD/src/vxq" VXQ_KV_DEPTHS="${DEPTHS##*,}" VXQ_KV_METHODS="${VXQ_GPU_KV_METHODS:-f16,q8_0,q4_0,fp8,kivi:bits=4,kivi:bits=2}" \
          bench/gpu_kv_vs_llamacpp.sh "$m" "$LOGS/kv_vs_llamacpp" | tee "$LOGS/kv_vs_llamacpp.md"
      fi
    fi
  fi
fi

status_tp="not run"
NGPU="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')"
TP_LIST="${VXQ_GPU_TP-$(n=2; while [ "$n" -le "$NGPU" ]; do printf '%s ' "$n"; n=$((n * 2)); done)}"
if [ "$status_build" = ok ] && [ "${VXQ_GPU_BENCH_ONLY:-}" != 1 ]; then
  step "tensor parallelism (GPUs: $NGPU; --tp ${TP_LIST:-none})"
  if [ -z "${TP_LIST// /}" ]; then
    echo "NOT RUN: $NGPU GPU(s); --tp N > 1 needs N GPUs (Cuda.TensorParallelNcclPathOnOneGpu ran NCCL on one)"
  else
    status_tp=ok
    m="$SHARED/assets/models/vxq-llama-h64-f16.gguf"
    TEXT="$SHARED/assets/text/wikitext2_test.raw.crlf.txt"
    for tp in 1 $TP_LIST; do
      [ "$tp" -gt 1 ] && [ $((2 % tp)) -ne 0 ] && { echo "h64 has 2 KV heads: --tp $tp skipped"; continue; }
      for kv in f16 q4_0 kivi:bits=2; do
        for mode in prefill stream; do
          r="$("$BUILD/src/vxq" perplexity -m "$m" -f "$TEXT" -c 1024 --chunks 8 --mode "$mode" --kv "$kv" --flash-attn \
                --device cuda --tp "$tp" 2>"$LOGS/tp.err" | grep -oE 'PPL = [0-9.]+' | cut -d' ' -f3)"
          [ -n "$r" ] || { echo "tp $tp $kv $mode failed:"; tail -2 "$LOGS/tp.err"; status_tp=FAIL; }
          echo "| $tp | $kv | $mode | $r |" | tee -a "$LOGS/tp_ppl.md"
        done
      done
      "$BUILD/src/vxq" generate -m "$m" -p "Once upon a time" -n 64 --temp 0 --json --device cuda --tp "$tp" 2>/dev/null |
        python3 -c 'import json,sys; j=json.load(sys.stdin); print(" ".join(map(str, j["ids"])))' >"$LOGS/tp_greedy_$tp.txt" ||
        status_tp=FAIL
      cmp -s "$LOGS/tp_greedy_1.txt" "$LOGS/tp_greedy_$tp.txt" || { echo "greedy text of --tp $tp differs from --tp 1"; status_tp=FAIL; }
    done
    SYN="${VXQ_SYNTH_DIR:-$BUILD/synth}/llama3-70b-q4_0.gguf"
    mkdir -p "$(dirname "$SYN")"
    [ -f "$SYN" ] || "$BUILD/src/vxq" synth --shape llama3-70b --type q4_0 -o "$SYN" >"$LOGS/synth70b.log" 2>&1 ||
      { echo "synth llama3-70b failed:"; tail -3 "$LOGS/synth70b.log"; }
    # The longest context per configuration: the fit check's figure from a one-token run (each
    # rank's device memory in the same JSON), then, with VXQ_GPU_TP_LONGEST=1, a decode at 95 %
    # of it to show that it holds (a fill of that many tokens: minutes per configuration).
    for tp in 1 $TP_LIST; do
      [ -f "$SYN" ] || break
      for kv in f16 kivi:bits=2; do
        L="$("$BUILD/src/vxq" generate -m "$SYN" -p x -n 1 -c 1024 --kv "$kv" --flash-attn --json --device cuda --tp "$tp" 2>"$LOGS/tp.err" |
              python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["kv_cache"]["longest_context"]); print(json.dumps(j.get("tp", j["backend_memory"])), file=sys.stderr)' 2>>"$LOGS/tp_memory.log")"
        held="not measured"
        if [ -n "$L" ] && [ "${VXQ_GPU_TP_LONGEST:-}" = 1 ]; then
          "$BUILD/src/vxq" bench -m "$SYN" --device cuda --tp "$tp" --flash-attn -p 0 -n 4 -r 1 --no-aa -d $((L * 95 / 100)) --kv "$kv" \
            >"$LOGS/tp_longest.log" 2>&1 && held="held $((L * 95 / 100))" || held="FAILED at $((L * 95 / 100))"
        fi
        echo "| 70B Q4_0 | --tp $tp | $kv | longest context ${L:-?} | $held |" | tee -a "$LOGS/tp_longest.md"
      done
    done
    for tp in 1 $TP_LIST; do  # --tp 1 too: the scaling is against one GPU
      [ -f "$SYN" ] || break
      VXQ="$BUILD/src/vxq" VXQ_TP="$tp" VXQ_KV_DEPTHS="${VXQ_GPU_TP_DEPTH:-32768}" VXQ_KV_METHODS="f16,kivi:bits=2" \
        LLAMA_CPP_KV="f16" bench/gpu_kv_vs_llamacpp.sh "$SYN" "$LOGS/tp$tp" | tee "$LOGS/tp${tp}_70b.md"
    done
  fi
fi

step "summary"
echo "build: $status_build"
echo "CUDA tests: $status_tests  ${summary_tests:-}"
echo "compute-sanitizer: $status_sanitizer"
echo "matmul bench: $status_bench"
echo "perplexity cuda vs cpu: $status_ppl"
echo "tensor parallelism: $status_tp"
[ -f "$LOGS/tp_ppl.md" ] && { echo "| tp | kv | mode | PPL |"; cat "$LOGS/tp_ppl.md"; }
[ -f "$LOGS/tp_longest.md" ] && cat "$LOGS/tp_longest.md"
[ -f "$LOGS/ppl.md" ] && cat "$LOGS/ppl.md"
echo "end to end: $status_e2e"
[ -f "$LOGS/gemv.log" ] && grep '^|' "$LOGS/gemv.log"
[ -f "$LOGS/e2e.md" ] && grep '^|' "$LOGS/e2e.md"
[ -f "$LOGS/ab.md" ] && { echo "| weights | round | arm | tg64 t/s by depth |"; cat "$LOGS/ab.md"; }
[ -f "$LOGS/attention.log" ] && grep '^|' "$LOGS/attention.log"
[ -f "$LOGS/kv_sweep.md" ] && { echo "| engine | kv | depth | tg64 t/s | KV bytes |"; cat "$LOGS/kv_sweep.md"; }
[ -f "$LOGS/reader_sweep.md" ] && { echo "| engine | kv (--depth-fill kv) | depth | tg32 t/s | vs f16 | KV bytes |"; cat "$LOGS/reader_sweep.md"; }
[ -f "$LOGS/kv_vs_llamacpp.md" ] && grep -A12 '^### tg64' "$LOGS/kv_vs_llamacpp.md"
[ "$status_build" = ok ] && { [ "$status_tests" = ok ] || [ "$status_tests" = skipped ]; } && [ "$status_bench" = ok ]

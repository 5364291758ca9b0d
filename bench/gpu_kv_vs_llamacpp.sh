#!/usr/bin/env bash
# Decode speed per KV cache at long context: this engine and an existing llama.cpp CUDA build on
# the same GGUF, in one run (issue 11, item 4). Each round runs `vxq bench` over our caches (one
# repetition; its A/A arm is the first cache again) and llama.cpp's llama-batched-bench -fa with
# its caches, the two engines' order alternating between rounds; the table gives per engine and
# cache the median tg t/s over the rounds with min-max, our f16 cache as the reference, and the
# A/A ratio (a ratio inside its spread is no measurable difference). Never builds llama.cpp.
#
#   VXQ=build/src/vxq LLAMA_CPP_BIN=DIR bench/gpu_kv_vs_llamacpp.sh MODEL.gguf [OUT_DIR]
#
# Environment:
#   VXQ            our binary (default build/src/vxq)
#   LLAMA_CPP_BIN  a llama.cpp build's bin/ folder (llama-batched-bench, llama-bench); unset: ours alone
#   VXQ_KV_DEPTHS  context depths, comma-separated (default 32768)
#   VXQ_KV_METHODS our caches (default f16,q8_0,q4_0,kivi:bits=4,kivi:bits=2)
#   LLAMA_CPP_KV   llama.cpp's caches (default "f16 q8_0 q4_0")
#   VXQ_KV_ROUNDS  rounds (default 3)
#   VXQ_TP         tensor-parallel GPUs (default 1): ours with --tp N, llama.cpp with --split-mode row
#                  over the same N GPUs (CUDA_VISIBLE_DEVICES=0..N-1)
set -uo pipefail
MODEL="${1:?usage: bench/gpu_kv_vs_llamacpp.sh MODEL.gguf [OUT_DIR]}"
OUTD="${2:-.}"
VXQ="${VXQ:-build/src/vxq}"
DEPTHS="${VXQ_KV_DEPTHS:-32768}"
METHODS="${VXQ_KV_METHODS:-f16,q8_0,q4_0,kivi:bits=4,kivi:bits=2}"
LKV="${LLAMA_CPP_KV-f16 q8_0 q4_0}"
ROUNDS="${VXQ_KV_ROUNDS:-3}"
TP="${VXQ_TP:-1}"
LSPLIT=()
if [ "$TP" -gt 1 ]; then
  LSPLIT=(--split-mode row)
  export CUDA_VISIBLE_DEVICES="$(seq -s, 0 $((TP - 1)))"
fi
echo "tensor parallelism: $TP GPU(s)"
mkdir -p "$OUTD"
[ -f "$MODEL" ] || { echo "vxq: error: no model file $MODEL" >&2; exit 2; }

echo "model: $MODEL ($(du -h "$MODEL" | cut -f1))"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null || true
if [ -n "${LLAMA_CPP_BIN:-}" ]; then
  # llama.cpp's build and system line: from llama-bench's JSON of a one-token run on the same file
  # where the build has llama-bench, else from llama-batched-bench's log (its version line and the
  # devices it found), after the runs.
  if [ -x "$LLAMA_CPP_BIN/llama-bench" ]; then
    "$LLAMA_CPP_BIN/llama-bench" -m "$MODEL" -ngl 99 -p 0 -n 1 -r 1 -o json 2>/dev/null | python3 -c '
import json, sys
r = json.load(sys.stdin)[0]
print("llama.cpp: build {build_number} ({build_commit}), backends {backends}, gpu {gpu_info}, cpu {cpu_info}".format(**r))' ||
      echo "llama.cpp: llama-bench did not run on $MODEL"
  fi
else
  LKV=""
fi

ours() {  # round, depth
  "$VXQ" bench -m "$MODEL" --device cuda --tp "$TP" --flash-attn -p 0 -n 64 -d "$2" -r 1 --kv "$METHODS" --json \
    >"$OUTD/ours_d$2_r$1.json" 2>"$OUTD/ours_d$2_r$1.err" || { echo "vxq bench failed (round $1, depth $2):"; tail -3 "$OUTD/ours_d$2_r$1.err"; }
}
theirs() {  # round, depth
  for kv in $LKV; do
    "$LLAMA_CPP_BIN/llama-batched-bench" -m "$MODEL" -ngl 99 "${LSPLIT[@]}" -fa -ctk "$kv" -ctv "$kv" -c $(($2 + 128)) -b 2048 -ub 512 \
      -npp "$2" -ntg 64 -npl 1 >"$OUTD/llama_${kv}_d$2_r$1.log" 2>&1 || echo "llama-batched-bench $kv failed (round $1, depth $2)"
  done
}
for d in ${DEPTHS//,/ }; do
  for r in $(seq 1 "$ROUNDS"); do
    printf 'depth %s, round %s of %s (%s)\n' "$d" "$r" "$ROUNDS" "$(date -u +%H:%M:%S)" >&2
    if [ $((r % 2)) -eq 1 ]; then ours "$r" "$d"; theirs "$r" "$d"; else theirs "$r" "$d"; ours "$r" "$d"; fi
  done
done

if [ -n "$LKV" ] && [ ! -x "$LLAMA_CPP_BIN/llama-bench" ]; then
  grep -hE '^build:|^ *Device [0-9]+:' "$OUTD"/llama_*_r1.log 2>/dev/null | awk '!seen[$0]++' | sed 's/^ */llama.cpp: /'
fi
python3 - "$OUTD" "$DEPTHS" "$ROUNDS" "$LKV" <<'EOF'
import glob, json, os, statistics, sys
outd, depths, rounds, lkv = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), sys.argv[4].split()

def med(xs):
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})" if xs else "-"

for d in depths:
    ours, aa = {}, []  # kv -> t/s per round; A/A ratios per round
    for r in range(1, rounds + 1):
        try:
            rows = json.load(open(f"{outd}/ours_d{d}_r{r}.json"))["rows"]
        except (OSError, ValueError, KeyError):
            continue
        first = None
        for row in rows:
            if row.get("aa"):
                if first:
                    aa.append(row["tps_median"] / first)
                continue
            ours.setdefault(row["kv_format"], []).append(row["tps_median"])
            first = first or row["tps_median"]
    theirs = {}
    for kv in lkv:
        for r in range(1, rounds + 1):
            try:
                for line in open(f"{outd}/llama_{kv}_d{d}_r{r}.log"):
                    f = [x.strip() for x in line.split("|")]
                    if len(f) > 9 and f[1].isdigit():
                        theirs.setdefault(kv, []).append(float(f[8]))
            except OSError:
                pass
    ref = statistics.median(ours["f16"]) if ours.get("f16") else None
    print(f"\n### tg64 at depth {d}: t/s, median (min-max) over {rounds} rounds\n")
    print("| engine | KV cache | t/s | vs our f16 |")
    print("| --- | --- | ---: | ---: |")
    for engine, runs in (("vxq", ours), ("llama.cpp", theirs)):
        for kv, xs in runs.items():
            ratio = f"{statistics.median(xs) / ref:.2f}x " if ref else ""
            print(f"| {engine} | {kv} | {med(xs)} | {ratio}|")
    if aa:
        print(f"\nA/A (our first cache run twice per round): ratio {statistics.median(aa):.3f} ({min(aa):.3f}-{max(aa):.3f})")
    for kv, xs in ours.items():
        if kv.startswith("kivi") and theirs.get("q4_0"):
            print(f"{kv} vs llama.cpp's q4_0 cache: {statistics.median(xs) / statistics.median(theirs['q4_0']):.2f}x")
EOF

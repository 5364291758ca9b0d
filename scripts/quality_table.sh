#!/usr/bin/env bash
# Perplexity of every KV method on vxq-llama-h64-f16 (WikiText-2, -c 1024, 24 chunks), both modes.
# Writes out/quality.tsv: method, mode, ppl, err, bits/element, resident bytes.
# Env: MODES, METHODS (space-separated --kv specs; "K/V" gives -ctk K -ctv V), THREADS per run,
# JOBS runs at once (perplexity does not depend on the machine's load), VXQ (the binary),
# VXQ_SHARED_DIR or MODEL/TEXT.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED="${VXQ_SHARED_DIR:-$(pwd)/../shared}"
MODEL="${MODEL:-$SHARED/assets/models/vxq-llama-h64-f16.gguf}"
TEXT="${TEXT:-$SHARED/assets/text/wikitext2_test.raw.crlf.txt}"
VXQ="${VXQ:-build/src/vxq}"
MODES="${MODES:-prefill stream}"
METHODS="${METHODS:-f16 q8_0 q4_0 q4_0/f16 fp8 kivi:bits=8 kivi:bits=4 kivi:bits=2}"
JOBS="${JOBS:-1}"
mkdir -p out
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
run_one() {  # mode method -> one TSV row
  local mode=$1 m=$2 kv
  if [[ $m == */* ]]; then kv=(-ctk "${m%/*}" -ctv "${m#*/}"); else kv=(--kv "$m"); fi
  local o; o=$($VXQ perplexity -m "$MODEL" -f "$TEXT" -c 1024 --chunks 24 -t "${THREADS:-2}" "${kv[@]}" --mode "$mode" 2>/dev/null)
  local ppl kvb
  ppl=$(echo "$o" | sed -n 's/^Final estimate: PPL = \([0-9.]*\) +\/- \([0-9.]*\)/\1\t\2/p')
  kvb=$(echo "$o" | sed -n 's/.*resident \([0-9]*\) bytes for \([0-9]*\) tokens (\([0-9.]*\) bits.*/\3\t\1/p')
  printf '%s\t%s\t%s\t%s\n' "$m" "$mode" "$ppl" "$kvb"
}
i=0
for mode in $MODES; do
  for m in $METHODS; do
    run_one "$mode" "$m" > "$tmp/$(printf %03d $i)" &
    i=$((i + 1))
    while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n; done
  done
done
wait
cat "$tmp"/* | tee -a out/quality.tsv

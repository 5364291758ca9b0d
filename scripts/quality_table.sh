#!/usr/bin/env bash
# Perplexity of every KV method on vxq-llama-h64-f16 (WikiText-2, -c 1024, 24 chunks), both modes.
# Writes out/quality.tsv: method, mode, ppl, err, bits/element, resident bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED="${VXQ_SHARED_DIR:-$(pwd)/../shared}"
MODEL="$SHARED/assets/models/vxq-llama-h64-f16.gguf"
TEXT="$SHARED/assets/text/wikitext2_test.raw.crlf.txt"
MODES="${MODES:-prefill stream}"
METHODS="${METHODS:-f16 q8_0 q4_0 fp8 kivi:bits=8 kivi:bits=4 kivi:bits=2}"
mkdir -p out
for mode in $MODES; do
  for m in $METHODS; do
    o=$(build/src/vxq perplexity -m "$MODEL" -f "$TEXT" -c 1024 --chunks 24 -t "${THREADS:-2}" --kv "$m" --mode "$mode" 2>/dev/null)
    ppl=$(echo "$o" | sed -n 's/^Final estimate: PPL = \([0-9.]*\) +\/- \([0-9.]*\)/\1\t\2/p')
    kv=$(echo "$o" | sed -n 's/.*resident \([0-9]*\) bytes for \([0-9]*\) tokens (\([0-9.]*\) bits.*/\3\t\1/p')
    printf '%s\t%s\t%s\t%s\n' "$m" "$mode" "$ppl" "$kv" | tee -a out/quality.tsv
  done
done

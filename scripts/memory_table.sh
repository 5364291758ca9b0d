#!/usr/bin/env bash
# Peak RSS and resident KV bytes of `vxq perplexity --mode stream -c 2048` per KV method
# (vxq-llama-h64-f16, one 2048-token chunk of WikiText-2). Writes out/memory.tsv.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED="${VXQ_SHARED_DIR:-$(pwd)/../shared}"
MODEL="$SHARED/assets/models/vxq-llama-h64-f16.gguf"
TEXT="$SHARED/assets/text/wikitext2_test.raw.crlf.txt"
mkdir -p out
: > out/memory.tsv
for m in ${METHODS:-f16 q8_0 q4_0 kivi:bits=4 kivi:bits=2}; do
  o=$(build/src/vxq perplexity -m "$MODEL" -f "$TEXT" -c 2048 --chunks 1 -t 2 --kv "$m" --mode stream 2>/dev/null)
  rss=$(echo "$o" | sed -n 's/^peak RSS: \([0-9]*\) KiB/\1/p')
  kv=$(echo "$o" | sed -n 's/.*resident \([0-9]*\) bytes for \([0-9]*\) tokens (\([0-9.]*\) bits.*/\1\t\3/p')
  printf '%s\t%s\t%s\n' "$m" "$rss" "$kv" | tee -a out/memory.tsv
done

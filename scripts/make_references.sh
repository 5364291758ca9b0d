#!/usr/bin/env bash
# Regenerates every llama.cpp-derived reference file the tests compare against, from a llama.cpp
# build given by path. It never builds llama.cpp (the repository holds no llama.cpp code and no
# recipe for it); it prints the build's version and system-info line so the result can be traced.
#
#   LLAMA_CPP_BIN=/path/to/llama.cpp/build/bin scripts/make_references.sh
#
# Writes (then `git diff tests/data` shows what changed):
#   tests/data/llamacpp_avx2_greedy.json   64-token greedy continuations (llama-cli --temp 0) of the
#                                          shared golden prompts on stories260K and vxq-llama-h64
#                                          f16/q8_0/q4_0 (tests/test_golden.cpp);
#   tests/data/llamacpp_perplexity.json    llama-perplexity on stories260K (-c 512, all chunks) and
#                                          vxq-llama-h64-f16 (-c 1024 --chunks 24)
#                                          (tests/test_perplexity.cpp).
# The checked-in files were made by llama.cpp b4748 (commit c392e509, `llama-cli --version`:
# "version: 4748 (c392e5094)"), a CPU build whose system-info line reports AVX2, FMA and F16C and
# no AVX-512, run with 2 threads, f16 KV cache and no flash
# attention on this project's 2-core AMD EPYC (Zen 3). The ISA matters for Q8_0/Q4_0 weights:
# activations are quantized to int8 per block, so a last-bit difference between the AVX2 and
# AVX-512 kernels can flip a code and the greedy text (tests/test_golden.cpp explains). The script
# refuses a build whose system-info line shows AVX-512.
#
# Not made here: ../shared/golden/*.llamacpp.json (tokenization and greedy text, given with the
# shared assets: llama.cpp b4748, CPU, 2 threads, --temp 0; see ../shared/assets/README.md; two
# of its Q8_0/Q4_0 texts differ from the AVX2 build's, and an earlier AVX-512
# build of the same version reproduced them) and tests/data/gate/*.json (vxq's own quality-gate
# limits, measured with `vxq eval` on main; each file says how).
#
# Needs python3 (Debian package) to write the JSON. Env: VXQ_SHARED_DIR (../shared), THREADS (2).
set -euo pipefail
cd "$(dirname "$0")/.."

: "${LLAMA_CPP_BIN:?set LLAMA_CPP_BIN to the directory holding llama-cli and llama-perplexity}"
SHARED="${VXQ_SHARED_DIR:-$(pwd)/../shared}"
THREADS="${THREADS:-2}"
CLI="$LLAMA_CPP_BIN/llama-cli"
PPL="$LLAMA_CPP_BIN/llama-perplexity"
for exe in "$CLI" "$PPL"; do
    [[ -x $exe ]] || { echo "make_references.sh: $exe is not an executable" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "make_references.sh: needs python3" >&2; exit 1; }
[[ -d $SHARED/golden ]] || { echo "make_references.sh: no $SHARED/golden (set VXQ_SHARED_DIR)" >&2; exit 1; }
SHARED=$(cd "$SHARED" && pwd)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# llama.cpp b4748 scans its working directory for backend libraries and aborts on a file name that
# is not UTF-8, so its programs run from the (clean) scratch directory.
run_llama() { (cd "$work" && "$@"); }

run_llama "$CLI" --version > "$work/version.txt" 2>&1 || true
version=$(sed -n 's/^version: //p' "$work/version.txt")
built_with=$(sed -n 's/^built with //p' "$work/version.txt")
echo "llama.cpp: version $version, built with $built_with"

# Greedy continuations: llama-cli prints only the generated text on stdout (--no-display-prompt),
# then " [end of text]\n" if it stopped at EOS, then "\n\n"; the rest of its talk is on stderr.
models=(stories260K.gguf vxq-llama-h64-f16.gguf vxq-llama-h64-q8_0.gguf vxq-llama-h64-q4_0.gguf)
goldens=(stories260K.llamacpp.json vxq-llama-h64.llamacpp.json vxq-llama-h64-q8_0.llamacpp.json vxq-llama-h64-q4_0.llamacpp.json)
for i in "${!models[@]}"; do
    model="$SHARED/assets/models/${models[$i]}"
    golden="$SHARED/golden/${goldens[$i]}"
    n=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["greedy"]))' "$golden")
    for ((k = 0; k < n; ++k)); do
        python3 -c 'import json,sys; g=json.load(open(sys.argv[1]))["greedy"][int(sys.argv[2])]; open(sys.argv[3],"w").write(g["prompt"]); print(g["n_predict"])' \
            "$golden" "$k" "$work/prompt" > "$work/n_predict"
        out="$work/greedy_${i}_${k}"
        run_llama "$CLI" -m "$model" -p "$(cat "$work/prompt")" -n "$(cat "$work/n_predict")" --temp 0 -no-cnv --no-display-prompt \
            --no-escape --no-warmup -t "$THREADS" < /dev/null > "$out.stdout" 2> "$out.stderr"
        echo "  greedy: ${models[$i]} prompt $k"
    done
done
system_info=$(grep -m1 '^system_info:' "$work/greedy_0_0.stderr" || true)
echo "$system_info"
if [[ $system_info != *"AVX2 = 1"* || $system_info == *"AVX512"*"= 1"* ]]; then
    echo "make_references.sh: the reference is for an AVX2 build without AVX-512; this build's system info says otherwise" >&2
    exit 1
fi

# Perplexity, as ../shared/assets/README.md quotes it.
run_llama "$PPL" -m "$SHARED/assets/models/stories260K.gguf" -f "$SHARED/assets/text/tinystories_valid_head.txt" -c 512 \
    -t "$THREADS" > "$work/ppl_0.log" 2>&1
echo "  perplexity: stories260K"
run_llama "$PPL" -m "$SHARED/assets/models/vxq-llama-h64-f16.gguf" -f "$SHARED/assets/text/wikitext2_test.raw.crlf.txt" -c 1024 \
    --chunks 24 -t "$THREADS" > "$work/ppl_1.log" 2>&1
echo "  perplexity: vxq-llama-h64-f16"

python3 - "$work" "$SHARED" "$version" "$built_with" "$system_info" "$THREADS" "${models[*]}" "${goldens[*]}" <<'PY'
import json, re, sys
work, shared, version, built_with, system_info, threads, models, goldens = sys.argv[1:]
models, goldens = models.split(), goldens.split()
build = (f"llama.cpp version {version}, built with {built_with}; {threads} threads, f16 KV cache, "
         f"no flash attention. {system_info}")

def continuation(path):
    raw = open(path, "rb").read()
    if not raw.endswith(b"\n\n"):
        sys.exit(f"{path}: llama-cli output does not end with its final blank line")
    raw = raw[:-2]
    if raw.endswith(b" [end of text]\n"):
        raw = raw[: -len(b" [end of text]\n")]
    return raw.decode("utf-8")

greedy = {}
for i, (m, g) in enumerate(zip(models, goldens)):
    golden = json.load(open(f"{shared}/golden/{g}"))["greedy"]
    rows = []
    for k, case in enumerate(golden):
        text = continuation(f"{work}/greedy_{i}_{k}.stdout")
        rows.append({"prompt": case["prompt"], "n_predict": case["n_predict"], "continuation": text,
                     "same_as_shared_golden": text == case["continuation"]})
    greedy[m] = rows
with open("tests/data/llamacpp_avx2_greedy.json", "w", encoding="utf-8") as f:
    json.dump({"reference": "llama-cli -n N --temp 0 -no-cnv --no-display-prompt on the shared golden prompts; " + build,
               "greedy": greedy,
               "provenance": "Made by scripts/make_references.sh (its header names the build flags and the machine). "
                             "Where a text differs from ../shared/golden, an earlier AVX-512 build of the "
                             "same version reproduced the shared golden's text. "
                             "Output text only; no llama.cpp code is stored."},
              f, indent=1, ensure_ascii=False)
    f.write("\n")

runs = [("stories260K.gguf", "tinystories_valid_head.txt", 512, -1), ("vxq-llama-h64-f16.gguf", "wikitext2_test.raw.crlf.txt", 1024, 24)]
ppl = []
for i, (m, t, ctx, chunks) in enumerate(runs):
    log = open(f"{work}/ppl_{i}.log", encoding="utf-8", errors="replace").read()
    est = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
    n = re.search(r"calculating perplexity over (\d+) chunks", log)
    if not est or not n:
        sys.exit(f"llama-perplexity on {m}: no final estimate in its output")
    ppl.append({"model": m, "text": t, "ctx": ctx, "chunks": chunks, "n_chunks": int(n.group(1)),
                "ppl": float(est.group(1)), "ppl_err": float(est.group(2))})
with open("tests/data/llamacpp_perplexity.json", "w", encoding="utf-8") as f:
    json.dump({"reference": "llama-perplexity -m MODEL -f TEXT -c CTX [--chunks N]; " + build, "perplexity": ppl,
               "provenance": "Made by scripts/make_references.sh from the shared assets."}, f, indent=1, ensure_ascii=False)
    f.write("\n")
PY
echo "wrote tests/data/llamacpp_avx2_greedy.json and tests/data/llamacpp_perplexity.json"
git --no-pager diff --stat -- tests/data || true

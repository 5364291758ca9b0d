#!/usr/bin/env python3
"""Prefill and decode speed of vxq and an existing llama.cpp build on the same GGUF files, in one run.

  LLAMA_CPP_BIN=DIR scripts/bench_vs_llamacpp.py VXQ MODEL.gguf [MODEL2.gguf ...] [--rounds 7] [-p 128] [-n 64] [-t 2]

DIR is a llama.cpp build's bin/ folder holding llama-bench (built by hand; this project never builds
llama.cpp). Each round runs, per model, `vxq bench -r 1 --no-aa --json`, `llama-bench -r 1 -o json`
and vxq again (the A/A arm: the noise floor), in an order that rotates across rounds so drift and
warm-up hit every arm alike (docs/MEASURE.md, ../shared/docs/MEASURE.md). Prints llama.cpp's build
and CPU line, the load average before each round, then per model and test the median tokens/s of
each arm over the rounds with min-max, the median of the per-round ratios vxq/llama.cpp and the A/A
ratio with its spread: a ratio inside the A/A spread is no measurable difference. --json writes
the raw samples.
"""
import argparse, json, os, statistics, subprocess, sys


def vxq_bench(vxq, model, a):
    cmd = [vxq, "bench", "-m", model, "-p", str(a.p), "-n", str(a.n), "-t", str(a.t), "-r", "1", "--no-aa", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"vxq bench failed on {model}: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return {row["test"]: row["tps_median"] for row in json.loads(r.stdout)["rows"]}


def llama_bench(binary, model, a, info):
    cmd = [binary, "-m", model, "-p", str(a.p), "-n", str(a.n), "-t", str(a.t), "-r", "1", "-o", "json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"llama-bench failed on {model}: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    out = {}
    for row in json.loads(r.stdout):
        test = f"pp{row['n_prompt']}" if row["n_prompt"] > 0 else f"tg{row['n_gen']}"
        out[test] = row["avg_ts"]
        info.setdefault("llama.cpp", f"build {row.get('build_commit', '?')} ({row.get('build_number', '?')}), "
                                     f"cpu {row.get('cpu_info', '?')}, backends {row.get('backends', '?')}")
    return out


def spread(values, digits=1):
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("vxq")
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    bin_dir = os.environ.get("LLAMA_CPP_BIN")
    if not bin_dir:
        sys.exit("set LLAMA_CPP_BIN to the bin/ folder of an existing llama.cpp build (with llama-bench)")
    llama = os.path.join(bin_dir, "llama-bench")
    if not os.access(llama, os.X_OK):
        sys.exit(f"no llama-bench in {bin_dir}")
    info = {}
    arms = ["vxq", "llama.cpp", "vxq (A/A)"]
    samples = {m: {arm: {} for arm in arms} for m in a.models}  # model -> arm -> test -> [t/s per round]
    for rnd in range(a.rounds):
        load = os.getloadavg()
        print(f"round {rnd + 1}/{a.rounds}: load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", file=sys.stderr)
        order = arms[rnd % 3:] + arms[:rnd % 3]
        for m in a.models:
            for arm in order:
                res = llama_bench(llama, m, a, info) if arm == "llama.cpp" else vxq_bench(a.vxq, m, a)
                for test, tps in res.items():
                    samples[m][arm].setdefault(test, []).append(tps)
    print(f"llama.cpp: {info.get('llama.cpp', '?')}")
    print(f"vxq: {a.vxq}; {a.rounds} rounds, -p {a.p} -n {a.n} -t {a.t}, each arm -r 1 per round, order rotating\n")
    print("| model | test | vxq t/s median (min-max) | llama.cpp t/s | vxq (A/A) t/s | vxq / llama.cpp median (min-max) | A/A ratio (min-max) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for m in a.models:
        for test in samples[m]["vxq"]:
            v, l, aa = samples[m]["vxq"][test], samples[m]["llama.cpp"].get(test), samples[m]["vxq (A/A)"][test]
            ratio = [x / y for x, y in zip(v, l)] if l else []
            aar = [x / y for x, y in zip(aa, v)]
            print(f"| {os.path.basename(m)} | {test} | {spread(v)} | {spread(l) if l else '-'} | {spread(aa)} | "
                  f"{spread(ratio, 3) if ratio else '-'} | {spread(aar, 3)} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"info": info, "args": vars(a), "samples": samples}, f, indent=1)


if __name__ == "__main__":
    main()

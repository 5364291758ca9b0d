#!/usr/bin/env python3
"""Prefill and decode speed of two vxq builds on every model they can run, in one run.

  scripts/bench_before_after.py OLD/vxq NEW/vxq [--rounds 7] [-p 512] [-n 128] [-t 2] [--kv f16] [--models DIR]

Each round runs `vxq bench -r 1 --no-aa --json` once per (model, arm): the old build, the new
build and the old build again (the A/A arm, the noise floor), in an order that rotates across
rounds so drift and warm-up hit every arm alike (docs/MEASURE.md). Prints, per model and test,
the median tokens/s of each build over the rounds, min-max, the median of the per-round ratios
NEW/OLD and the A/A ratio OLD'/OLD with its spread: a NEW/OLD ratio inside the A/A spread is no
measurable difference. A model a build refuses (a weight type it cannot
compute) is listed as skipped with its one-line error. Writes the raw samples as JSON with --json.
"""
import argparse, glob, json, os, statistics, subprocess, sys


def bench(vxq, model, a):
    cmd = [vxq, "bench", "-m", model, "-p", str(a.p), "-n", str(a.n), "-t", str(a.t), "-r", "1", "--no-aa", "--json",
           "--kv", a.kv]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["failed"])[-1]
    return {row["test"]: row["tps_median"] for row in json.loads(r.stdout)["rows"]}, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--kv", default="f16")
    ap.add_argument("--models", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "assets", "models"))
    ap.add_argument("--json")
    a = ap.parse_args()
    models = sorted(glob.glob(os.path.join(a.models, "*.gguf")))
    builds = {"old": a.old, "new": a.new, "aa": a.old}
    for k, v in builds.items():
        ver = subprocess.run([v, "--version"], capture_output=True, text=True).stdout.strip()
        print(f"{k}: {v} ({ver})", file=sys.stderr)
    samples, skipped = {}, {}
    for rnd in range(a.rounds):
        arms = ["old", "new", "aa"]
        order = arms[rnd % 3:] + arms[:rnd % 3]
        for m in models:
            name = os.path.basename(m)
            if name in skipped:
                continue
            for b in order:
                res, err = bench(builds[b], m, a)
                if res is None:
                    skipped[name] = f"{b}: {err}"
                    break
                for test, tps in res.items():
                    samples.setdefault((name, test), {"old": [], "new": [], "aa": []})[b].append(tps)
            if sys.stderr.isatty():
                print(f"\rround {rnd + 1}/{a.rounds} {name:40s}", end="", file=sys.stderr)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    print(f"| model | test | old t/s (min-max) | new t/s (min-max) | new/old (median of {a.rounds} paired rounds) | A/A (min-max) |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    out = []
    for (name, test), s in samples.items():
        if not (len(s["old"]) == len(s["new"]) == len(s["aa"])) or not s["old"]:
            continue
        ratios = [n / o for o, n in zip(s["old"], s["new"])]
        aa = [x / o for o, x in zip(s["old"], s["aa"])]
        fmt = lambda x: f"{statistics.median(x):.0f} ({min(x):.0f}-{max(x):.0f})"
        print(f"| {name} | {test} | {fmt(s['old'])} | {fmt(s['new'])} | {statistics.median(ratios):.3f} "
              f"({min(ratios):.2f}-{max(ratios):.2f}) | {statistics.median(aa):.3f} ({min(aa):.2f}-{max(aa):.2f}) |")
        out.append({"model": name, "test": test, **s, "ratios": ratios, "aa_ratios": aa})
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "rows": out, "skipped": skipped}, f, indent=1)


if __name__ == "__main__":
    main()

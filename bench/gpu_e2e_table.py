#!/usr/bin/env python3
"""The end-to-end table of bench/gpu.sh: prefill and decode tokens/s of vxq (CUDA graphs on and
off, PDL on and off) and, when its JSON is there, llama.cpp's llama-bench, on the same synthetic GGUFs, with the
decode's achieved weight bandwidth (weight bytes per token x tokens/s) next to the copy bandwidth
measured in the same run (the d2d line of gemv.log).

  gpu_e2e_table.py LOGS SYNTH_DIR TYPE...
"""
import json, os, sys


def weight_bytes(path):
    """Bytes a decode step streams: the file's size (its header, vocabulary and metadata, is
    under 0.1 % of the 4.6+ GB of tensor data)."""
    return os.path.getsize(path)


def copy_bw(logs):
    """The d2d copy line's GB/s (the column is found by its header)."""
    col = None
    try:
        for line in open(os.path.join(logs, "gemv.log")):
            cells = [c.strip() for c in line.split("|")]
            if "GB/s" in cells:
                col = cells.index("GB/s")
            elif line.startswith("| d2d copy") and col is not None:
                return float(cells[col]) * 1e9
    except (OSError, ValueError):
        pass
    return None


def vxq_rows(path):
    try:
        d = json.load(open(path))
    except (OSError, ValueError):
        return {}
    return {r["test"]: r["tps_median"] for r in d["rows"]}


def llama_rows(path):
    try:
        d = json.load(open(path))
    except (OSError, ValueError):
        return {}, ""
    out, build = {}, ""
    for r in d:
        test = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
        out[test] = r["avg_ts"]
        build = f"llama.cpp {r.get('build_commit', '?')} ({r.get('build_number', '?')}), {r.get('gpu_info', '')}"
    return out, build


def main():
    logs, synth, types = sys.argv[1], sys.argv[2], sys.argv[3:]
    bw = copy_bw(logs)
    print(f"copy bandwidth measured in this run: {bw / 1e9:.0f} GB/s" if bw else "copy bandwidth: not measured")
    print()
    print("| weights | engine | pp512 t/s | tg128 t/s | decode GB/s (weights) | of copy | tg128 at depth 4096 |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    builds = set()
    for t in types:
        wb = weight_bytes(os.path.join(synth, f"llama3-8b-{t}.gguf"))
        arms = [("vxq, CUDA graphs + PDL, step in passes", vxq_rows(os.path.join(logs, f"e2e_{t}_graphs1.json"))),
                ("vxq, CUDA graphs + PDL, one pass per step", vxq_rows(os.path.join(logs, f"e2e_{t}_graphs1_pass1.json"))),
                ("vxq, CUDA graphs, no PDL", vxq_rows(os.path.join(logs, f"e2e_{t}_graphs1_pdl0.json"))),
                ("vxq, no graphs", vxq_rows(os.path.join(logs, f"e2e_{t}_graphs0.json")))]
        lrows, build = llama_rows(os.path.join(logs, f"llama_{t}.json"))
        if lrows:
            arms.append(("llama.cpp -fa 1", lrows))
            builds.add(build)
        for name, rows in arms:
            if not rows:
                continue
            pp, tg = rows.get("pp512"), rows.get("tg128")
            got = wb * tg if tg else None
            deep = rows.get("tg128@d4096")
            print(f"| {t.upper()} ({wb / 1e9:.2f} GB) | {name} | {pp or 0:.0f} | {tg or 0:.1f} | "
                  f"{(got or 0) / 1e9:.0f} | {100 * got / bw if got and bw else 0:.0f}% | "
                  f"{f'{deep:.1f}' if deep else '-'} |")
    for b in sorted(builds):
        print(f"\n{b}")


if __name__ == "__main__":
    main()

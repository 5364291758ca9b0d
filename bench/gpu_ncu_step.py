#!/usr/bin/env python3
"""Where a decode step's GPU time goes, kernel by kernel, from Nsight Compute's CSV output.

bench/gpu.sh (VXQ_GPU_NCU_STEP=1) runs `ncu --csv --metrics gpu__time_duration.sum,
dram__bytes_read.sum,dram__bytes_write.sum --launch-skip S --launch-count C vxq bench ...` on a
decode run (CUDA graphs: ncu profiles each kernel node alone, so PDL overlap and the gaps between
kernels are not in these times: this is each kernel's own duration and traffic; ncu also flushes
the caches before each kernel, so a small kernel's inputs come from DRAM, not L2). This script
groups the profiled kernels by name and grid (one kernel function serves several matrices) and
prints, per group: calls, mean us, mean MB read + written from DRAM, GB/s and % of the copy
bandwidth given, and its share of the profiled time.

Usage: python3 bench/gpu_ncu_step.py NCU_CSV COPY_GBS
"""
import csv
import sys
from collections import defaultdict


def short(name):
    for prefix in ("(anonymous namespace)::", "<unnamed>::", "void ", "vxq::cuda::"):
        name = name.replace(prefix, "")
    return name.split("(")[0][:90]  # without the parameter list


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: gpu_ncu_step.py NCU_CSV COPY_GBS")
    copy = float(sys.argv[2])
    kernels = defaultdict(dict)  # (id, name) -> metric -> value
    with open(sys.argv[1], newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own "==PROF==" lines are not CSV
    for row in csv.DictReader(lines):
        try:
            value = float(row["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            continue
        unit = row.get("Metric Unit", "")
        scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "byte": 1.0,
                 "Kbyte": 1e3, "KB": 1e3, "Mbyte": 1e6, "MB": 1e6, "Gbyte": 1e9, "GB": 1e9}.get(unit)
        if scale is None:
            sys.exit(f"gpu_ncu_step.py: unknown unit '{unit}' of {row['Metric Name']}")
        # One kernel function serves several matrices: its grid tells them apart.
        name = f"{short(row['Kernel Name'])} grid {row.get('Grid Size', '?').replace(' ', '')}"
        kernels[(row["ID"], name)][row["Metric Name"]] = value * scale
    by_name = defaultdict(lambda: [0, 0.0, 0.0])
    for (_, name), m in kernels.items():
        agg = by_name[name]
        agg[0] += 1
        agg[1] += m.get("gpu__time_duration.sum", 0.0)
        agg[2] += m.get("dram__bytes_read.sum", 0.0) + m.get("dram__bytes_write.sum", 0.0)
    total = sum(a[1] for a in by_name.values()) or 1.0
    print(f"{len(kernels)} kernels profiled, {total:.0f} us in all (each kernel alone: no overlap, no gaps)\n")
    print("| kernel | calls | us/call | MB/call (DRAM r+w) | GB/s | of copy | share of time |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, (n, us, b) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
        gbs = b / (us * 1e-6) / 1e9 if us > 0 else 0.0
        print(f"| {name} | {n} | {us / n:.1f} | {b / n / 1e6:.2f} | {gbs:.0f} | {100 * gbs / copy:.0f}% | "
              f"{100 * us / total:.1f}% |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on vxq_gpu_attention's decode shape, timed the same way.

One query, 32 query heads over 8 KV heads of 128 (Llama-3-8B), fp16 keys and values of CONTEXT
tokens; layers rotated so that more than 512 MB are read between two reads of one layer (the GPU's
L2 is 60 MB); CUDA events around 40 back-to-back calls, median of 7 runs, 5 warm-up calls; bytes =
keys + values; GB/s against a 2 GiB device-to-device copy in the same run (read + write), as
bench/gpu_attention.cu reports; the 40 calls are captured in a CUDA graph, so the GPU's time is
timed, not Python's launches. Each backend PyTorch offers for the shape is timed alone
(torch.nn.attention.sdpa_kernel), then its default choice; GQA through `enable_gqa=True`
(PyTorch >= 2.5: K/V read as stored, 8 heads); a backend that refuses the shape is listed as such.

Usage: python3 bench/gpu_sdpa_torch.py [CONTEXTS...]   (default 1024 4096 32768 131072)
Needs PyTorch with CUDA (the H200 machine has it); prints a markdown table and one JSON line per row.
"""
import json
import statistics
import sys

import torch
import torch.nn.functional as F

HEADS, HEADS_KV, HEAD_DIM = 32, 8, 128
MIN_WORKING_SET = 512 << 20
MAX_CACHE = 48 << 30
CALLS, REPEATS, WARMUP = 40, 7, 5


def time_calls(fn, calls=CALLS):
    for i in range(WARMUP):
        fn(i)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(REPEATS):
        a.record()
        for i in range(calls):
            fn(i)
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b) / calls)
    return statistics.median(ms)


def copy_gbs():
    n = 2 << 30
    src = torch.full((n,), 0x5A, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_calls(lambda i: dst.copy_(src))
    del src, dst
    return 2.0 * n / (ms * 1e-3) / 1e9


def backends():
    from torch.nn.attention import SDPBackend

    return [("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
            ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH)]


def run(ctx, copy):
    from torch.nn.attention import sdpa_kernel

    layer_bytes = ctx * HEADS_KV * 2 * HEAD_DIM * 2
    layers = max(1, min(-(-MIN_WORKING_SET // layer_bytes), MAX_CACHE // layer_bytes))
    g = torch.Generator(device="cuda").manual_seed(ctx)
    ks = [torch.randn(1, HEADS_KV, ctx, HEAD_DIM, device="cuda", dtype=torch.float16, generator=g) for _ in range(layers)]
    vs = [torch.randn(1, HEADS_KV, ctx, HEAD_DIM, device="cuda", dtype=torch.float16, generator=g) for _ in range(layers)]
    q = torch.randn(1, HEADS, 1, HEAD_DIM, device="cuda", dtype=torch.float16, generator=g)
    rows = []
    for name, be in backends() + [("default", None)]:
        if name == "math" and ctx > 32768:
            continue  # materializes the scores in fp32 through several kernels: seconds, not a contender
        chosen = [be] if be is not None else list(dict(backends()).values())
        try:
            with sdpa_kernel(chosen):
                F.scaled_dot_product_attention(q, ks[0], vs[0], enable_gqa=True)
                torch.cuda.synchronize()
                # The calls captured in a CUDA graph: what is timed is the GPU's work, not Python's
                # launch overhead (the C++ benchmark launches back to back from C++).
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for i in range(CALLS):
                        F.scaled_dot_product_attention(q, ks[i % layers], vs[i % layers], enable_gqa=True)
        except (RuntimeError, TypeError) as e:
            print(f"| sdpa {name} | {ctx} | - | not available for this shape: {str(e).splitlines()[0][:100]} |", flush=True)
            continue
        ms = time_calls(lambda i: graph.replay(), calls=2) / CALLS
        del graph
        gbs = layer_bytes / (ms * 1e-3) / 1e9
        rows.append(dict(engine="torch", backend=name, context=ctx, layers=layers, us=ms * 1e3, kv_bytes=layer_bytes,
                         gbs=gbs, of_copy=gbs / copy))
        print(f"| sdpa {name} | {ctx} | {layers} | {layer_bytes / 1e6:.1f} | {ms * 1e3:.1f} | {gbs:.0f} | "
              f"{100 * gbs / copy:.0f}% |", flush=True)
    del ks, vs
    torch.cuda.empty_cache()
    return rows


def main():
    contexts = [int(a) for a in sys.argv[1:]] or [1024, 4096, 32768, 131072]
    prop = torch.cuda.get_device_properties(0)
    copy = copy_gbs()
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {prop.name}; d2d copy {copy:.0f} GB/s (read + write)")
    print("\n| engine | context | layers rotated | KV MB/call | us/call | GB/s (KV bytes) | of copy |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for ctx in contexts:
        rows += run(ctx, copy)
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()

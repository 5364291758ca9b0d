#!/usr/bin/env python3
"""The hot loop of each matching kernel in a CUDA binary, from its SASS (run where cuobjdump is:
the device machines have it; this workstation has no disassembler).

For every kernel whose (mangled) name contains PATTERN: its instruction count, local-memory loads
and stores (LDL / STL: spills) in the whole kernel, and the loop (the span of a backward branch)
that holds the most tensor-core MMAs (HMMA / IMMA), with its instruction count, its LDL / STL (a
spill inside the loop costs every iteration; one outside it does not) and its instruction mix.
Written for the KIVI attention's tile (docs/gpu.md, second session of 2026-12-07): `nvcc -cubin`
of kivi.cu here, carried, then on the device

    python3 bench/gpu_sass_loops.py kivi.cubin kivi_attention_kernelILi128ELi2ELi1ELi32

Usage: python3 bench/gpu_sass_loops.py BINARY PATTERN [--dump]
(--dump: also each loop's instructions, one a line)
"""
import re
import subprocess
import sys
from collections import Counter

USAGE = 'usage: python3 bench/gpu_sass_loops.py BINARY PATTERN [--dump]'


def opcode(text):
    text = re.sub(r'^@!?U?P\w+\s+', '', text)  # a predicate guard
    return text.split()[0].split('.')[0]


def main():
    dump = sys.argv[3:] == ['--dump']
    if len(sys.argv) != 3 and not dump:
        sys.exit(USAGE)
    sass = subprocess.run(['cuobjdump', '--dump-sass', sys.argv[1]], capture_output=True, text=True, check=True).stdout
    for func in re.split(r'\n\s+Function : ', sass)[1:]:
        name = func.split('\n', 1)[0].strip()
        if sys.argv[2] not in name:
            continue
        ins = [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r'/\*([0-9a-f]{4,})\*/\s+([^;]*);', func)]
        index = {addr: k for k, (addr, _) in enumerate(ins)}
        best = None  # (mmas, length, first, last)
        for k, (addr, text) in enumerate(ins):
            m = re.search(r'\bBRA\b.*?(0x[0-9a-f]+)', text)
            if not m or int(m.group(1), 16) > addr or int(m.group(1), 16) not in index:
                continue
            first = index[int(m.group(1), 16)]
            mmas = sum(opcode(t) in ('HMMA', 'IMMA') for _, t in ins[first:k + 1])
            if best is None or (mmas, -(k + 1 - first)) > (best[0], -best[1]):
                best = (mmas, k + 1 - first, first, k)
        whole = Counter(opcode(t) for _, t in ins)
        print(f'{name}: {len(ins)} instructions, LDL {whole["LDL"]}, STL {whole["STL"]}')
        if best and best[0] > 0:
            loop = Counter(opcode(t) for _, t in ins[best[2]:best[3] + 1])
            mix = ', '.join(f'{op} {n}' for op, n in loop.most_common(24))
            print(f'  loop: {best[1]} instructions, {best[0]} MMAs, LDL {loop["LDL"]}, STL {loop["STL"]} | {mix}')
            if dump:
                for addr, text in ins[best[2]:best[3] + 1]:
                    print(f'    {addr:05x}  {text}')


if __name__ == '__main__':
    main()

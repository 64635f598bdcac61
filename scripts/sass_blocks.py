#!/usr/bin/env python3
"""A kernel's SASS in basic blocks, with each block's instruction count and its exponentials,
matmuls, shared-memory and barrier instructions: the static counts a change's prediction starts
from (instructions a step, where the loop's back edges go), read without a GPU.

  usage: scripts/sass_blocks.py FILE [--kernel REGEX] [--sum A-B ... | --against OTHER]
    FILE      a cubin, or a Hopper instantiation (.cu), compiled here for sm_90a as
              tools/check_wgmma_async.sh compiles it
    --kernel  the functions whose demangled name matches REGEX (default: every function)
    --sum     instead of the blocks, the instructions in each address range A-B (hex, both ends
              in), and their total: a path through the blocks, e.g. a loop's common case
    --against instead of the blocks, how each opcode's count differs from OTHER's (a cubin or
              .cu, e.g. main's build of the same instantiation), function by function
  Needs cuobjdump (CUOBJDUMP, PATH or CUDA's bin; without a GPU driver the PyPI wheel
  nvidia-cuda-cuobjdump has it) and c++filt for the names.
"""
import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Columns: the opcode classes a step's cost is counted in (perf/log.md's SASS readings).
CLASSES = [
    ('MUFU', re.compile(r'^MUFU\.')),
    ('MMA', re.compile(r'^(HGMMA|HMMA)\.')),
    ('LDS', re.compile(r'^(LDS|LDSM)\b')),
    ('STS', re.compile(r'^(STS|STSM)\b')),
    ('SYNC', re.compile(r'^(SYNCS|BAR|WARPGROUP|MEMBAR|FENCE)\b')),
]
INSTR = re.compile(r'/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;')
BRANCH = re.compile(r'\b(BRA|BRX|JMP|CALL)\b.*?(0x[0-9a-f]+)')


def find_cuobjdump():
    for c in (os.environ.get('CUOBJDUMP'), shutil.which('cuobjdump'), '/usr/local/cuda/bin/cuobjdump'):
        if c and os.path.exists(c):
            return c
    sys.exit('sass_blocks: no cuobjdump (set CUOBJDUMP; pip install nvidia-cuda-cuobjdump has one)')


def cubin_of(path, tmp):
    if not path.endswith('.cu'):
        return path
    os.makedirs(tmp, exist_ok=True)
    out = os.path.join(tmp, 'k.cubin')
    subprocess.run([os.environ.get('NVCC', 'nvcc'), '-std=c++17', '-O3', '-I', os.path.join(ROOT, 'include'), '-I',
                    os.path.join(ROOT, 'src'), '--generate-code=arch=compute_90a,code=[sm_90a]', '-cubin', '-o', out,
                    path], check=True)
    return out


def functions(cubin):
    """(demangled name, [(address, instruction text)]) for each function of the cubin."""
    text = subprocess.run([find_cuobjdump(), '-sass', cubin], check=True, capture_output=True, text=True).stdout
    funcs, name, body = [], None, []
    for line in text.splitlines():
        m = re.match(r'\s*Function : (\S+)', line)
        if m:
            if name:
                funcs.append((name, body))
            name, body = m.group(1), []
            continue
        m = INSTR.search(line)
        if m and name:
            body.append((int(m.group(1), 16), m.group(2)))
    if name:
        funcs.append((name, body))
    names = subprocess.run(['c++filt'], input='\n'.join(n for n, _ in funcs), capture_output=True, text=True).stdout
    return [(d or n, b) for (n, b), d in zip(funcs, names.splitlines() + [''] * len(funcs))]


def opcode(text):
    return re.sub(r'^@!?U?P\w+\s+', '', text).split()[0]


def blocks(body):
    """Basic blocks as (first, last, instructions, branch targets) in address order."""
    leaders = {body[0][0]} if body else set()
    for i, (addr, text) in enumerate(body):
        m = BRANCH.search(text)
        if m:
            leaders.add(int(m.group(2), 16))
        if m or opcode(text) in ('EXIT', 'RET'):
            if i + 1 < len(body):
                leaders.add(body[i + 1][0])
    out, cur = [], []
    for addr, text in body:
        if addr in leaders and cur:
            out.append(cur)
            cur = []
        cur.append((addr, text))
    if cur:
        out.append(cur)
    def targets(b):
        return [int(m.group(2), 16) for m in (BRANCH.search(t) for _, t in b) if m]
    return [(b[0][0], b[-1][0], b, targets(b)) for b in out]


def counts(instrs):
    row = [len(instrs)]
    for _, pattern in CLASSES:
        row.append(sum(1 for _, t in instrs if pattern.match(opcode(t))))
    return row


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under `| head`
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('file')
    ap.add_argument('--kernel', default='')
    ap.add_argument('--sum', nargs='+', default=[])
    ap.add_argument('--against')
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        funcs = functions(cubin_of(args.file, tmp))
        others = dict(functions(cubin_of(args.against, os.path.join(tmp, 'o')))) if args.against else {}
    for name, body in funcs:
        if not re.search(args.kernel, name) or not body:
            continue
        print(f'{name}: {len(body)} instructions')
        if args.against:
            other = others.get(name, [])
            mine, theirs = (collections.Counter(opcode(t) for _, t in b) for b in (body, other))
            print(f'  against {len(other)}: ' + ', '.join(f'{op} {mine[op] - theirs[op]:+d}'
                  for op in sorted(set(mine) | set(theirs), key=lambda o: -abs(mine[o] - theirs[o]))
                  if mine[op] != theirs[op]))
            continue
        if args.sum:
            total = 0
            for r in args.sum:
                a, b = (int(x, 16) for x in r.split('-'))
                n = sum(1 for addr, _ in body if a <= addr <= b)
                total += n
                print(f'  {r}: {n}')
            print(f'  total: {total}')
            continue
        print('  first-last      n ' + ' '.join(f'{c:>5}' for c, _ in CLASSES) + '  -> branches (loop: back edge)')
        for first, last, instrs, targets in blocks(body):
            tags = ' '.join(f'{t:x}' + (' (loop)' if t <= first else '') for t in targets)
            print(f'  {first:04x}-{last:04x} ' + ' '.join(f'{c:>5}' for c in counts(instrs)) + (f'  -> {tags}' if tags else ''))


if __name__ == '__main__':
    main()

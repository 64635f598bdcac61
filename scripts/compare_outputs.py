#!/usr/bin/env python3
"""Bitwise comparison of two evoattn CLIs on the GPU: o, lse and every gradient.

Writes random bf16 inputs (mask bias with -1e9 keys, or a boolean mask; a pair bias; dO) for
each shape, runs `CLI run DIR --dtype bf16 --backend cuda` with both CLIs, and reports, per
output, whether the two results are the same bits. Used to check that a performance change
leaves every result unchanged. Exit status 1 on any difference or failure.

  usage: scripts/compare_outputs.py CLI_A CLI_B
  env:   SHAPES="N:L[:m] ..." (B = 1, H = 8; ":m" = boolean mask), CMP_D (head dim, default 64),
         BACKEND (default cuda)
"""
import os
import subprocess
import sys
import tempfile

import numpy as np


def write_inputs(d, N, L, H, D, mask, rng):
    for name in ("q", "k", "v", "do"):
        np.save(f"{d}/{name}.npy", rng.standard_normal((1, N, L, H, D)).astype(np.float32))
    np.save(f"{d}/pair_bias.npy", rng.standard_normal((1, 1, H, L, L)).astype(np.float32))
    if mask:
        np.save(f"{d}/mask.npy", rng.random((1, N, L)) > 0.2)
    else:
        keep = rng.random((1, N, 1, 1, L)) > 0.2
        np.save(f"{d}/mask_bias.npy", np.where(keep, 0.0, -1e9).astype(np.float32))


def main():
    cli_a, cli_b = sys.argv[1], sys.argv[2]
    shapes = os.environ.get("SHAPES", "32:256 40:200 24:96 32:384:m 64:256").split()
    D, H = int(os.environ.get("CMP_D", "64")), 8
    backend = os.environ.get("BACKEND", "cuda")
    bad = 0
    for shape in shapes:
        parts = shape.split(":")
        N, L, mask = int(parts[0]), int(parts[1]), len(parts) > 2
        d = tempfile.mkdtemp()
        write_inputs(d, N, L, H, D, mask, np.random.default_rng(N * 1000 + L))
        outs = []
        for cli in (cli_a, cli_b):
            o = tempfile.mkdtemp()
            r = subprocess.run([cli, "run", d, "--out", o, "--dtype", "bf16", "--backend", backend],
                               capture_output=True, text=True)
            if r.returncode:
                print(cli, "failed:", r.stderr[-500:])
                bad += 1
            outs.append(o)
        results = []
        for f in sorted(os.listdir(outs[0])):
            x, y = np.load(f"{outs[0]}/{f}"), np.load(f"{outs[1]}/{f}")
            same = np.array_equal(x, y, equal_nan=True)
            bad += not same
            results.append(f"{f[:-4]}={'same' if same else 'DIFF %.3g' % np.nanmax(np.abs(x - y))}")
        print(f"N{N} L{L} D{D}{' mask' if mask else ''}:", " ".join(results), flush=True)
    print("all identical" if bad == 0 else f"{bad} differences or failures")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""One rank of the evoattn.distributed checks, started by torchrun (test_distributed.py):

    python -m torch.distributed.run --nproc_per_node=2 distributed_worker.py --device cpu --out DIR

Every rank draws the same whole problem, runs the single-device call on it (the reference),
then its own rows through evoattn.distributed twice, and writes DIR/rank<r>.json with:
  errors            relative error of each output against the single-device call
  bitwise_runs      the two sharded runs gave identical bytes (every output and gradient)
  same_across_ranks the pair bias's gradient has identical bytes on every rank
  row_to_col        col_to_row(row_to_col(x)) == x, and the all-to-all's gradient is the
                    reverse all-to-all of the upstream gradient, exactly
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

from evoattn import distributed as ed
from evoattn.torch import evoformer_attention

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def rel(a, b):
    a, b = a.double(), b.double()
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)).item()


def problem(B, N, L, H, D, dtype, device):
    g = torch.Generator().manual_seed(1234)

    def u(*shape):
        return (torch.rand(shape, generator=g) * 4 - 2).to(device=device, dtype=dtype)

    return dict(q=u(B, N, L, H, D), k=u(B, N, L, H, D), v=u(B, N, L, H, D),
                mask_bias=u(B, N, 1, 1, L), pair_bias=u(B, 1, H, L, L), d_o=u(B, N, L, H, D))


def grads_of(fn, leaves, d_o):
    leaves = {name: t.detach().clone().requires_grad_(True) for name, t in leaves.items()}
    o = fn(**leaves)
    o.backward(d_o)
    return {"o": o.detach(), **{"d_" + n: t.grad for n, t in leaves.items()}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(args.device, rank) if args.device == "cuda" else torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(device)
    dtype = DTYPES[args.dtype]
    B, N, L, H, D = 1, 2 * world, 8 * world, 2, 16
    full = problem(B, N, L, H, D, dtype, device)
    rows = slice(rank * N // world, (rank + 1) * N // world)
    qrows = slice(rank * L // world, (rank + 1) * L // world)

    ref = grads_of(lambda q, k, v, mask_bias, pair_bias: evoformer_attention(q, k, v, mask_bias, pair_bias),
                   {n: full[n] for n in ("q", "k", "v", "mask_bias", "pair_bias")}, full["d_o"])

    mine = {n: full[n][:, rows] for n in ("q", "k", "v", "mask_bias")}
    report = {"rank": rank, "world": world, "backend": backend, "dtype": args.dtype, "errors": {}}
    runs = {}
    for mode in ("replicated", "sharded"):
        pb = full["pair_bias"] if mode == "replicated" else full["pair_bias"][:, :, :, qrows]
        for run in range(2):
            runs[mode, run] = grads_of(
                lambda q, k, v, mask_bias, pair_bias: ed.row_sharded_attention(
                    q, k, v, mask_bias, pair_bias, pair_bias_sharded=(mode == "sharded")),
                {**mine, "pair_bias": pb}, full["d_o"][:, rows])
        got = runs[mode, 0]
        want_pb = ref["d_pair_bias"] if mode == "replicated" else ref["d_pair_bias"][:, :, :, qrows]
        report["errors"][mode] = {
            "o": rel(got["o"], ref["o"][:, rows]), "d_q": rel(got["d_q"], ref["d_q"][:, rows]),
            "d_k": rel(got["d_k"], ref["d_k"][:, rows]), "d_v": rel(got["d_v"], ref["d_v"][:, rows]),
            "d_mask_bias": rel(got["d_mask_bias"], ref["d_mask_bias"][:, rows]),
            "d_pair_bias": rel(got["d_pair_bias"], want_pb)}
    report["bitwise_runs"] = all(torch.equal(runs[m, 0][n], runs[m, 1][n])
                                 for m in ("replicated", "sharded") for n in runs[m, 0])
    dpb = runs["replicated", 0]["d_pair_bias"].contiguous()
    everyone = [torch.empty_like(dpb) for _ in range(world)]
    dist.all_gather(everyone, dpb)
    report["same_across_ranks"] = all(torch.equal(t, dpb) for t in everyone)

    x = full["q"][:, rows].detach().float().clone().requires_grad_(True)  # [B, N/P, L, H, D]
    cols = ed.row_to_col(x)
    upstream = torch.arange(cols.numel(), device=device, dtype=torch.float32).reshape(cols.shape)
    cols.backward(upstream)
    want_cols = full["q"].float()[:, :, rank * L // world:(rank + 1) * L // world]
    report["row_to_col"] = (list(cols.shape) == [B, N, L // world, H, D] and torch.equal(cols, want_cols)
                            and torch.equal(ed.col_to_row(cols.detach()), x.detach())
                            and torch.equal(x.grad, ed.col_to_row(upstream)))

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return backend


if __name__ == "__main__":
    if main() == "gloo":
        # As examples/distributed_triangle_attention.py: gloo's worker threads can abort the
        # interpreter's finalization (docs/DISTRIBUTED.md); the report is written, leave without it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

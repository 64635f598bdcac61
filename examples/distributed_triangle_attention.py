#!/usr/bin/env python3
"""Triangle attention (starting node, then ending node) trained on several GPUs with the pair
representation sharded over its rows (Dynamic Axial Parallelism):

    torchrun --nproc_per_node=2 examples/distributed_triangle_attention.py [--length 64] [--cpu]

Each rank holds rows i of z [B, L/P, L, c_z]. The starting-node attention runs on those rows
with evoattn.distributed.row_sharded_attention: the pair bias is projected from each rank's own
rows and all-gathered (pair_bias_sharded=True), so the forward moves only the bias. The
ending-node attention attends along the other axis: row_to_col swaps the sharded axis (z
becomes [B, L, L/P, c_z]), the transpose makes the columns rows, and col_to_row swaps back.
Parameters are replicated; their gradients are summed over ranks with all_reduce_ordered, so
every rank takes the same step. --cpu runs on gloo with CPU tensors.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

from evoattn.distributed import all_reduce_ordered, col_to_row, row_sharded_attention, row_to_col


class TriangleAttention(nn.Module):
    """One triangle attention over the rows this rank holds: z [B, L/P, L, c_z] -> update."""

    def __init__(self, c_z: int = 64, c_hidden: int = 16, num_heads: int = 4):
        super().__init__()
        self.num_heads, self.c_hidden = num_heads, c_hidden
        self.layer_norm = nn.LayerNorm(c_z)
        self.linear_qkv = nn.Linear(c_z, 3 * num_heads * c_hidden, bias=False)
        self.linear_bias = nn.Linear(c_z, num_heads, bias=False)
        self.linear_gate = nn.Linear(c_z, num_heads * c_hidden)
        self.linear_out = nn.Linear(num_heads * c_hidden, c_z)

    def forward(self, z: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        B, n, L, _ = z.shape  # n = L / P rows on this rank
        H, D = self.num_heads, self.c_hidden
        z = self.layer_norm(z)
        q, k, v = self.linear_qkv(z).view(B, n, L, 3, H, D).unbind(dim=3)
        mask_bias = (1e9 * (pair_mask.to(z.dtype) - 1.0))[:, :, None, None, :]  # [B, n, 1, 1, L]
        # This rank's query rows of the pair bias, [B, 1, H, n, L]: gathered inside.
        pair_bias_rows = self.linear_bias(z).permute(0, 3, 1, 2).unsqueeze(1)
        o = row_sharded_attention(q, k, v, mask_bias, pair_bias_rows, pair_bias_sharded=True)
        o = o.reshape(B, n, L, H * D) * torch.sigmoid(self.linear_gate(z))
        return self.linear_out(o)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=64, help="residues L (a multiple of the ranks)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--cpu", action="store_true", help="gloo and CPU tensors")
    args = ap.parse_args()

    use_cuda = not args.cpu and torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    device = torch.device("cuda" if use_cuda else "cpu")
    dtype = torch.bfloat16 if use_cuda else torch.float32
    B, L, c_z, n = 1, args.length, 64, args.length // world

    torch.manual_seed(0)  # the same parameters and data on every rank, then each keeps its rows
    start, end = TriangleAttention(c_z).to(device, dtype), TriangleAttention(c_z).to(device, dtype)
    params = list(start.parameters()) + list(end.parameters())
    opt = torch.optim.SGD(params, lr=0.5)
    z_all = torch.randn(B, L, L, c_z, device=device, dtype=dtype)
    target_all = torch.randn(B, L, L, c_z, device=device, dtype=dtype)
    mask_all = torch.ones(B, L, L, device=device)
    rows = slice(rank * n, (rank + 1) * n)
    z, target, mask = z_all[:, rows], target_all[:, rows], mask_all[:, rows]

    for step in range(args.steps):
        opt.zero_grad()
        z1 = z + start(z, mask)                                   # rows i of z, attention along j
        cols = row_to_col(z1).transpose(1, 2)                     # [B, n, L, c_z]: columns as rows
        cols_mask = row_to_col(mask[..., None]).transpose(1, 2)[..., 0]
        z2 = col_to_row((cols + end(cols, cols_mask)).transpose(1, 2))  # back to [B, n, L, c_z]
        loss = ((z2.float() - target.float()) ** 2).mean()
        loss.backward()
        for p in params:  # every rank's rows contribute: the same summed gradient everywhere
            p.grad = all_reduce_ordered(p.grad) / world
        opt.step()
        total = all_reduce_ordered(loss.detach().reshape(1)) / world
        if rank == 0:
            print(f"step {step}: loss {total.item():.5f}")
    dist.barrier()
    backend = dist.get_backend()
    dist.destroy_process_group()
    return backend


if __name__ == "__main__":
    if main() == "gloo":
        # torch 2.11's gloo worker threads drop a finished collective's tensors a moment after the
        # call returns; one that does so while the interpreter is finalizing aborts the process
        # (docs/DISTRIBUTED.md). The work and its output are done: leave without finalizing.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

#!/usr/bin/env python3
"""Row-sharded triangle attention on 1 or more GPUs of one host, one command per GPU count:

    torchrun --nproc_per_node=P bench/distributed.py [--L 2048] [--H 4] [--D 32] [--json FILE]

A triangle attention over the pair representation: B = 1, N = Lq = Lk = L, H heads of D, bf16,
a mask bias [1, N, 1, 1, L] and a pair bias [1, 1, H, L, L]. Each rank holds N/P rows of q, k,
v, the mask bias and dO; the pair bias is either replicated (its gradient summed over ranks in
rank order) or sharded over its query rows and all-gathered ("sharded"). Reports per GPU the
median time of forward + backward (gradients of q, k, v and both biases) over --iters steps
after --warmup, timed with CUDA events and a barrier around each step, and the peak device
memory of one step beyond the inputs (torch.cuda.max_memory_allocated). Rank 0 prints the
table and, with --json, writes it.
"""

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist

from evoattn.distributed import row_sharded_attention


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--L", type=int, default=2048)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--D", type=int, default=32)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev, bf16 = torch.device("cuda", local), torch.bfloat16
    L, H, D = args.L, args.H, args.D
    n = L // world
    g = torch.Generator(device=dev).manual_seed(rank)

    def rnd(*shape):
        return torch.randn(shape, device=dev, dtype=bf16, generator=g)

    q, k, v, d_o = (rnd(1, n, L, H, D) for _ in range(4))
    mask_bias = rnd(1, n, 1, 1, L)
    rows = {}
    for mode in ("replicated", "sharded"):
        pair_bias = rnd(1, 1, H, L, L) if mode == "replicated" else rnd(1, 1, H, L // world, L)
        leaves = [x.requires_grad_(True) for x in (q, k, v, mask_bias, pair_bias)]
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for it in range(args.warmup + args.iters):
            for x in leaves:
                x.grad = None
            dist.barrier()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            o = row_sharded_attention(*leaves, pair_bias_sharded=(mode == "sharded"))
            o.backward(d_o)
            end.record()
            torch.cuda.synchronize()
            if it >= args.warmup:
                times.append(start.elapsed_time(end))
            del o
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        ms = torch.tensor([statistics.median(times), peak], device=dev)
        everyone = [torch.empty_like(ms) for _ in range(world)]
        dist.all_gather(everyone, ms)
        rows[mode] = dict(gpus=world, ms_max_over_ranks=max(t[0].item() for t in everyone),
                          peak_extra_mib_max_over_ranks=max(t[1].item() for t in everyone))
        for x in leaves:
            x.requires_grad_(False)
            x.grad = None
        del leaves, pair_bias
    if rank == 0:
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, L={L} H={H} D={D} bf16, "
              f"{world} GPU(s), median of {args.iters}")
        for mode, r in rows.items():
            print(f"  pair bias {mode:<10}  f+b {r['ms_max_over_ranks']:8.2f} ms per step  "
                  f"peak extra {r['peak_extra_mib_max_over_ranks']:8.0f} MiB per GPU")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(L=L, H=H, D=D, gpus=world, gpu=torch.cuda.get_device_name(), rows=rows), f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

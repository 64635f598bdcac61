#!/usr/bin/env python3
"""float32 gradients at large logits, evoattn beside PyTorch's own backends:

    python bench/extreme_logits.py [--device cuda|cpu] [--seeds 3] [--json FILE]

For q ~ U(-s, s), k, v, dO ~ U(-1, 1) (B1 N2 L33 H2 D32, no bias) and logit scales
s = 1, 30, 100, 1e4, each attention is run forward and backward in float32 and its dq, dk, dv
compared with a float64 computation on the same inputs, by relative error ||x - ref|| / ||ref||:

  evoattn        evoattn.torch.evoformer_attention (skipped when evoattn is not importable)
  naive          matmul, softmax, matmul in float32 through autograd (what the rule compares to)
  sdpa_math      torch SDPA, math backend
  sdpa_efficient torch SDPA, memory-efficient backend (CUDA only; float32 capable)

Each row is the worst over the seeds. As the scale grows each row's softmax nears one-hot and
dS = P (dP - sum_j P dP) becomes a difference of nearly equal numbers: docs/perf/
fp32-extreme-logits.md records what each computation keeps of it.
"""

import argparse
import json

import torch
import torch.nn.functional as F

SCALES = (1.0, 30.0, 100.0, 1e4)
SHAPE = dict(B=1, N=2, L=33, H=2, D=32)


def inputs(scale, seed, device):
    g = torch.Generator().manual_seed(seed)
    B, N, L, H, D = (SHAPE[k] for k in "BNLHD")

    def u(lo, hi):
        return (torch.rand((B, N, L, H, D), generator=g, dtype=torch.float64) * (hi - lo) + lo).to(device)

    return u(-scale, scale), u(-1, 1), u(-1, 1), u(-1, 1)


def naive(q, k, v):  # [B, N, L, H, D], scale 1/sqrt(D)
    qh, kh, vh = (x.transpose(-2, -3) for x in (q, k, v))
    s = qh @ kh.transpose(-1, -2) / q.shape[-1] ** 0.5
    return (torch.softmax(s, dim=-1) @ vh).transpose(-2, -3)


def sdpa(backend):
    def run(q, k, v):
        B, N, L, H, D = q.shape
        qh, kh, vh = (x.transpose(-2, -3).reshape(B * N, H, L, D) for x in (q, k, v))
        with torch.nn.attention.sdpa_kernel(backend):
            o = F.scaled_dot_product_attention(qh, kh, vh)
        return o.reshape(B, N, H, L, D).transpose(-2, -3)

    return run


def evoattn_fn():
    try:
        import evoattn.torch as et
    except Exception as e:  # noqa: BLE001 - report why and go on
        print(f"evoattn: skipped ({type(e).__name__}: {e})")
        return None
    return lambda q, k, v: et.evoformer_attention(q, k, v)


def grads(fn, q, k, v, d_o, dtype):
    leaves = [x.detach().to(dtype).requires_grad_(True) for x in (q, k, v)]
    fn(*leaves).backward(d_o.to(dtype))
    return [x.grad.double() for x in leaves]


def rel(x, ref):
    return (torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref)).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--json", help="also write the table to this file")
    args = ap.parse_args()

    fns = {"naive": naive, "sdpa_math": sdpa(torch.nn.attention.SDPBackend.MATH)}
    if args.device == "cuda":
        fns["sdpa_efficient"] = sdpa(torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION)
    evo = evoattn_fn()
    if evo is not None:
        fns = {"evoattn": evo, **fns}

    rows = []
    print(f"device {args.device}, {torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}, "
          f"torch {torch.__version__}, shape {SHAPE}, worst of {args.seeds} seeds")
    print(f"{'scale':>7} {'computation':<15} {'dq':>10} {'dk':>10} {'dv':>10}")
    for scale in SCALES:
        worst = {name: [0.0, 0.0, 0.0] for name in fns}
        for seed in range(args.seeds):
            q, k, v, d_o = inputs(scale, seed, args.device)
            q32, k32, v32 = (x.float().double() for x in (q, k, v))  # the float32-rounded inputs
            ref = grads(naive, q32, k32, v32, d_o.float().double(), torch.float64)
            for name, fn in fns.items():
                try:
                    got = grads(fn, q32, k32, v32, d_o.float().double(), torch.float32)
                    errs = [rel(g, r) for g, r in zip(got, ref)]
                except RuntimeError as e:
                    errs = [float("nan")] * 3
                    print(f"{name}: {e}")
                worst[name] = [max(a, b) for a, b in zip(worst[name], errs)]
        for name, (dq, dk, dv) in worst.items():
            print(f"{scale:>7g} {name:<15} {dq:>10.3g} {dk:>10.3g} {dv:>10.3g}")
            rows.append(dict(scale=scale, computation=name, dq=dq, dk=dk, dv=dv))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=args.device, shape=SHAPE, seeds=args.seeds, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()

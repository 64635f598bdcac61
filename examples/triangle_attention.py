#!/usr/bin/env python3
"""Triangle attention around the starting node (AlphaFold 2, Algorithm 13) with evoattn.

For every row i of the pair representation z [B, L, L, c_z], the entries z[i, j] attend over
z[i, k], biased by a per-head projection of z[j, k] and masked by the pair mask. In evoattn's
terms the rows are N, j and k are Lq and Lk, and the two biases are exactly DeepSpeed's forms:

    q, k, v     [B, N=L, L, H, D]   linear projections of z, viewed (no copy)
    pair_bias   [B, 1, H, L, L]     linear(z) -> [B, L, L, H], permuted (a strided view)
    mask_bias   [B, N=L, 1, 1, L]   -1e9 where pair_mask is 0

Runs a few training steps on random data and prints the loss (CPU, or a GPU with bfloat16
autocast when one is available and evoattn has its CUDA backend):

    python examples/triangle_attention.py [--steps 20] [--length 48]
"""

import argparse
import time

import torch
from torch import nn

import evoattn
from evoattn.torch import evoformer_attention


class TriangleAttentionStartingNode(nn.Module):
    def __init__(self, c_z: int = 64, c_hidden: int = 16, num_heads: int = 4, inf: float = 1e9):
        super().__init__()
        self.num_heads, self.c_hidden, self.inf = num_heads, c_hidden, inf
        self.layer_norm = nn.LayerNorm(c_z)
        self.linear_qkv = nn.Linear(c_z, 3 * num_heads * c_hidden, bias=False)
        self.linear_bias = nn.Linear(c_z, num_heads, bias=False)  # the pair bias, per head
        self.linear_gate = nn.Linear(c_z, num_heads * c_hidden)
        self.linear_out = nn.Linear(num_heads * c_hidden, c_z)
        nn.init.zeros_(self.linear_gate.weight)
        nn.init.ones_(self.linear_gate.bias)

    def biases(self, z, pair_mask):
        mask_bias = (self.inf * (pair_mask.float() - 1.0))[:, :, None, None, :]  # [B, L, 1, 1, L]
        pair_bias = self.linear_bias(z).permute(0, 3, 1, 2).unsqueeze(1)  # [B, 1, H, L, L] view
        return mask_bias, pair_bias

    def forward(self, z: torch.Tensor, pair_mask: torch.Tensor, attention=None) -> torch.Tensor:
        """z [B, L, L, c_z], pair_mask [B, L, L] (1 = valid) -> update of z, [B, L, L, c_z]."""
        B, L, _, _ = z.shape
        H, D = self.num_heads, self.c_hidden
        z = self.layer_norm(z)
        q, k, v = self.linear_qkv(z).view(B, L, L, 3, H, D).unbind(dim=3)  # strided views
        mask_bias, pair_bias = self.biases(z, pair_mask)
        attention = attention or evoformer_attention
        o = attention(q, k, v, mask_bias=mask_bias, pair_bias=pair_bias)  # [B, L, L, H, D]
        o = o.reshape(B, L, L, H * D) * torch.sigmoid(self.linear_gate(z))
        return self.linear_out(o)


def naive_attention(q, k, v, mask_bias, pair_bias):
    """What OpenFold does without kernels: the Lq x Lk scores materialised per row and head."""
    s = torch.einsum("bnihd,bnjhd->bnhij", q.float(), k.float()) * q.shape[-1] ** -0.5
    p = torch.softmax(s + mask_bias.float() + pair_bias.float(), dim=-1)
    return torch.einsum("bnhij,bnjhd->bnihd", p, v.float()).to(q.dtype)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--length", type=int, default=48, help="residues L (pair rep is L x L)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--cpu", action="store_true", help="stay on the CPU even with a GPU")
    args = p.parse_args()
    torch.manual_seed(0)

    use_cuda = not args.cpu and torch.cuda.is_available() and evoattn.cuda_available()
    device = torch.device("cuda" if use_cuda else "cpu")
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_cuda)
    B, L, c_z = args.batch, args.length, 64
    model = TriangleAttentionStartingNode(c_z=c_z).to(device)
    z = torch.randn(B, L, L, c_z, device=device)
    pair_mask = torch.ones(B, L, L, device=device)
    pair_mask[:, :, L - L // 8:] = 0  # padding residues at the end
    target = torch.randn(B, L, L, c_z, device=device)

    with torch.no_grad(), autocast:  # the fused op against the naive one, same module
        fused, naive = model(z, pair_mask), model(z, pair_mask, attention=naive_attention)
    print(f"evoattn {evoattn.__version__} on {device}; |fused - naive| / |naive| = "
          f"{float((fused.float() - naive.float()).norm() / naive.float().norm()):.2e}")

    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    start = time.time()
    for step in range(args.steps):
        with autocast:
            update = model(z, pair_mask)
            loss = torch.nn.functional.mse_loss((z + update).float(), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        print(f"step {step:3d}  loss {loss.item():.5f}")
    print(f"{args.steps} steps in {time.time() - start:.2f} s")


if __name__ == "__main__":
    main()

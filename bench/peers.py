#!/usr/bin/env python3
"""Peer comparison on one GPU, one command, no network:

    python bench/peers.py OUT_DIR [--peers evoattn,naive,sdpa,flex,deepspeed] [--shapes tri256,...]

For every docs/CONTRACT.md suite shape and every peer, in the same run on the same GPU:
forward alone (no_grad) and forward + backward (gradients for q, k, v and the pair bias) timed
with triton.testing.do_bench (median, L2 flushed before every run), TFLOP/s (forward 4·E·D,
backward 10·E·D, E = B·N·H·Lq·Lk), the ratio of the time to docs/CONTRACT.md's floor, the peak extra
device memory of one call, and the forward's relative error against a float32 computation on
the same inputs where that fits. A peer that fails on a shape (OOM, unsupported head dim,
missing package, compile error) is recorded as "fails" with the reason. Writes OUT_DIR/peers.csv
and plots OUT_DIR/{time_fwd,time_fb,memory}.png.

Peers: evoattn; naive PyTorch (matmul, softmax, matmul: what OpenFold does without kernels);
SDPA with the summed bias materialised as [B·N, H, L, L]; FlexAttention (torch.compile) with
both biases in a score_mod; DeepSpeed's DS4Sci_EvoformerAttention when importable.
Floor (docs/CONTRACT.md): max(FLOPs at the dense bf16 rate, exponentials (E forward, 2E f+b) at 16 per
clock per SM, the fewest bytes at the copy bandwidth), with docs/CONTRACT.md's H100 ceilings by default
(729 TFLOP/s, 3.02 TB/s, 1980 MHz) and the SM count read from the device.
"""

import argparse
import csv
import math
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from suite import SUITE  # noqa: E402

PEERS = ("evoattn", "naive", "sdpa", "flex", "deepspeed")
MODES = ("fwd", "fb")


# --- the floor ------------------------------------------------------------------------------


def work(shape, mode, elem_bytes=2):
    """(flops, exponentials, bytes) as tools/cli/floor.cpp counts them."""
    B, N, L, H, D, has_mb, has_pb = shape
    E = float(B * N * H * L * L)
    seq = elem_bytes * B * N * L * H * D
    pair = elem_bytes * B * H * L * L if has_pb else 0.0
    biases = (elem_bytes * B * N * L if has_mb else 0.0) + pair
    lse = 4.0 * B * N * H * L
    fwd = (4 * E * D, E, 4 * seq + biases + lse)
    if mode == "fwd":
        return fwd
    bwd_bytes = (5 * seq + lse + biases) + (3 * seq + pair)
    return (fwd[0] + 10 * E * D, 2 * E, fwd[2] + bwd_bytes)


def floor_ms(shape, mode, rates):
    flops, exps, nbytes = work(shape, mode)
    return 1e3 * max(flops / (rates["tflops"] * 1e12),
                     exps / (16.0 * rates["sms"] * rates["clock_mhz"] * 1e6),
                     nbytes / (rates["tbps"] * 1e12))


# --- peers: each builds a closure over fixed inputs that returns O [B, N, L, H, D] --------------


def make_evoattn(q, k, v, mb, pb):
    import evoattn.torch as et

    if not torch.cuda.is_available() or not __import__("evoattn").cuda_available():
        raise RuntimeError("evoattn has no CUDA backend in this build")
    return lambda: et.evoformer_attention(q, k, v, mask_bias=mb, pair_bias=pb)


def _scores(q, k, mb, pb):
    s = torch.matmul(q.permute(0, 1, 3, 2, 4), k.permute(0, 1, 3, 4, 2)) * q.shape[-1] ** -0.5
    if mb is not None:
        s = s + mb
    if pb is not None:
        s = s + pb
    return s


def make_naive(q, k, v, mb, pb):
    def run():
        p = torch.softmax(_scores(q, k, mb, pb), dim=-1)
        return torch.matmul(p, v.permute(0, 1, 3, 2, 4)).permute(0, 1, 3, 2, 4)

    return run


def _heads_first(x):  # [B, N, L, H, D] -> [B*N, H, L, D], a view
    B, N, L, H, D = x.shape
    return x.reshape(B * N, L, H, D).transpose(1, 2)


def make_sdpa(q, k, v, mb, pb):
    import torch.nn.functional as F

    B, N, L, H, D = q.shape

    def run():
        bias = (mb if mb is not None else 0) + (pb if pb is not None else 0)
        bias = bias.expand(B, N, H, L, L).reshape(B * N, H, L, L)  # materialised
        o = F.scaled_dot_product_attention(_heads_first(q), _heads_first(k), _heads_first(v),
                                           attn_mask=bias)
        return o.transpose(1, 2).unflatten(0, (B, N))

    return run


_FLEX = None


def make_flex(q, k, v, mb, pb):
    global _FLEX
    from torch.nn.attention.flex_attention import flex_attention

    # Each shape brings a new score_mod closure, so dynamo recompiles; past its recompile limit
    # it silently runs flex_attention unfused (materialising the scores). Start each shape from
    # a fresh compile so every shape measures the fused kernel.
    torch._dynamo.reset()
    _FLEX = torch.compile(flex_attention)
    B, N, L, H, D = q.shape
    mbf = mb.reshape(B * N, L) if mb is not None else None
    pbf = pb.reshape(B, H, L, L) if pb is not None else None

    def score_mod(score, b, h, q_idx, kv_idx):
        if mbf is not None:
            score = score + mbf[b, kv_idx]
        if pbf is not None:
            score = score + pbf[b // N, h, q_idx, kv_idx]
        return score

    def run():
        o = _FLEX(_heads_first(q), _heads_first(k), _heads_first(v), score_mod=score_mod)
        return o.transpose(1, 2).unflatten(0, (B, N))

    return run


def make_deepspeed(q, k, v, mb, pb):
    from deepspeed.ops.deepspeed4science import DS4Sci_EvoformerAttention

    return lambda: DS4Sci_EvoformerAttention(q, k, v, [mb, pb])


MAKERS = {"evoattn": make_evoattn, "naive": make_naive, "sdpa": make_sdpa, "flex": make_flex,
          "deepspeed": make_deepspeed}


# --- measurement -----------------------------------------------------------------------------


def inputs(shape, dtype, device="cuda"):
    B, N, L, H, D, has_mb, has_pb = shape
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(B, N, L, H, D, device=device, dtype=dtype, generator=g)
               for _ in range(3))
    mb = (torch.randn(B, N, 1, 1, L, device=device, dtype=dtype, generator=g)
          if has_mb else None)
    pb = (torch.randn(B, 1, H, L, L, device=device, dtype=dtype, generator=g)
          if has_pb else None)
    return q, k, v, mb, pb


def timed_call(fn):
    """One call's time in ms (events), after a warm-up call; used to size do_bench's budget."""
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def measure(fn, runs):
    """Median ms over about `runs` runs (do_bench flushes L2 before each), and peak extra MB."""
    from triton.testing import do_bench

    estimate = timed_call(fn)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    peak_mb = (torch.cuda.max_memory_allocated() - base) / 2**20
    rep = min(max(runs * estimate, 20.0), 4000.0)
    ms = do_bench(fn, warmup=min(max(5 * estimate, 5.0), 200.0), rep=rep, return_mode="median")
    return ms, peak_mb


def reference_error(o, q, k, v, mb, pb):
    """‖o − ref‖/‖ref‖ against float32 naive attention on the same inputs (None if too big)."""
    B, N, L, H, D = q.shape
    if B * N * H * L * L > 2**29:
        return None
    f = lambda t: None if t is None else t.float()  # noqa: E731
    with torch.no_grad():
        p = torch.softmax(_scores(f(q), f(k), f(mb), f(pb)), dim=-1)
        ref = torch.matmul(p, f(v).permute(0, 1, 3, 2, 4)).permute(0, 1, 3, 2, 4)
        return float((o.float() - ref).norm() / ref.norm())


def run_one(peer, name, shape, args, rates):
    rows = []
    q, k, v, mb, pb = inputs(shape, args.dtype)
    err = None
    for mode in MODES:
        row = dict(shape=name, B=shape[0], N=shape[1], L=shape[2], H=shape[3], D=shape[4],
                   biases="+".join(b for b, on in (("mask", shape[5]), ("pair", shape[6])) if on),
                   peer=peer, mode=mode, status="ok", ms="", tflops="", floor_ms="",
                   ratio_to_floor="", peak_mb="", fwd_rel_err="", error="")
        row["floor_ms"] = f"{floor_ms(shape, mode, rates):.4f}"
        try:
            if mode == "fwd":
                fn0 = MAKERS[peer](q, k, v, mb, pb)

                def fn():
                    with torch.no_grad():
                        return fn0()

                err = reference_error(fn(), q, k, v, mb, pb)
            else:
                leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                pbg = pb.detach().requires_grad_() if pb is not None else None
                fn0 = MAKERS[peer](*leaves, mb, pbg)
                wrt = leaves + ([pbg] if pbg is not None else [])
                d_o = torch.randn_like(q)

                def fn():
                    o = fn0()
                    return torch.autograd.grad(o, wrt, d_o)

            runs = args.runs if peer == "evoattn" else args.peer_runs
            ms, peak = measure(fn, runs)
            flops = work(shape, mode)[0]
            row.update(ms=f"{ms:.4f}", tflops=f"{flops / ms / 1e9:.1f}",
                       ratio_to_floor=f"{ms / float(row['floor_ms']):.2f}", peak_mb=f"{peak:.1f}")
            if err is not None:
                row["fwd_rel_err"] = f"{err:.2e}"
        except Exception as e:  # OOM, unsupported shape, compile failure, missing package
            row["status"] = "fails"
            row["error"] = (f"{type(e).__name__}: {e}".splitlines() or ["?"])[0][:200]
            if args.verbose:
                traceback.print_exc()
        finally:
            fn0 = fn = None  # noqa: F841
            torch.cuda.empty_cache()
        rows.append(row)
        print(f"{name:10s} {peer:9s} {mode:3s} " + (
            f"{row['ms']:>9s} ms {row['tflops']:>7s} TFLOP/s  x{row['ratio_to_floor']:>6s} floor "
            f"{row['peak_mb']:>8s} MB  err {row['fwd_rel_err'] or '-'}" if row["status"] == "ok"
            else f"fails: {row['error']}"), flush=True)
    return rows


# --- output ----------------------------------------------------------------------------------


def plot(rows, shapes, peers, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.transforms import blended_transform_factory

    def value(shape, peer, mode, key):
        for r in rows:
            if (r["shape"], r["peer"], r["mode"]) == (shape, peer, mode) and r["status"] == "ok":
                return float(r[key])
        return math.nan

    def floor_of(shape, mode):
        return next(float(r["floor_ms"]) for r in rows if (r["shape"], r["mode"]) == (shape, mode))

    width = 0.8 / max(len(peers), 1)
    centers = [i + 0.4 - width / 2 for i in range(len(shapes))]
    for key, mode, fname, label in (("ms", "fwd", "time_fwd.png", "forward time (ms)"),
                                    ("ms", "fb", "time_fb.png", "forward + backward time (ms)"),
                                    ("peak_mb", "fb", "memory.png",
                                     "peak extra memory of one f+b (MB)")):
        fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(shapes)), 4.5))
        marks = blended_transform_factory(ax.transData, ax.transAxes)
        for i, peer in enumerate(peers):
            xs = [j + i * width for j in range(len(shapes))]
            ys = [value(s, peer, mode, key) for s in shapes]
            ax.bar(xs, ys, width, label=peer)
            for x, y in zip(xs, ys):
                if math.isnan(y):  # the peer failed on this shape
                    ax.text(x, 0.01, "x", ha="center", va="bottom", fontsize=8, transform=marks)
        if key == "ms":
            ax.scatter(centers, [floor_of(s, mode) for s in shapes], marker="_", s=600,
                       color="k", label="floor", zorder=3)
        ax.set_yscale("log")
        ax.set_xlim(-width, len(shapes) - 1 + len(peers) * width)
        ax.set_xticks(centers)
        ax.set_xticklabels(shapes, rotation=20)
        ax.set_ylabel(label + ", log scale")
        ax.set_title(label + " (x = fails)")
        ax.legend(fontsize=8, ncol=3)
        ax.grid(axis="y", which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, fname), dpi=120)
        plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--peers", default=",".join(PEERS), help="comma-separated subset of " + ",".join(PEERS))
    p.add_argument("--shapes", default=",".join(SUITE), help="comma-separated subset of the suite")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--runs", type=int, default=100, help="timed runs for evoattn (median)")
    p.add_argument("--peer-runs", type=int, default=30, help="timed runs for the other peers")
    p.add_argument("--tflops", type=float, default=729.0, help="dense bf16 rate (docs/CONTRACT.md)")
    p.add_argument("--tbps", type=float, default=3.02, help="copy bandwidth, TB/s (docs/CONTRACT.md)")
    p.add_argument("--clock-mhz", type=float, default=1980.0, help="SM clock (docs/CONTRACT.md)")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failures")
    args = p.parse_args(argv)
    args.dtype = getattr(torch, args.dtype)
    if not torch.cuda.is_available():
        sys.exit("bench/peers.py needs a CUDA GPU")
    peers = [s for s in args.peers.split(",") if s]
    shapes = [s for s in args.shapes.split(",") if s]
    for s in peers:
        if s not in MAKERS:
            sys.exit(f"unknown peer {s!r}; choose from {PEERS}")
    for s in shapes:
        if s not in SUITE:
            sys.exit(f"unknown shape {s!r}; choose from {tuple(SUITE)}")
    os.makedirs(args.out_dir, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    rates = dict(tflops=args.tflops, tbps=args.tbps, clock_mhz=args.clock_mhz,
                 sms=props.multi_processor_count)
    print(f"{props.name}, {rates['sms']} SMs; torch {torch.__version__}; dtype {args.dtype}; "
          f"ceilings {rates}", flush=True)
    t0 = time.time()
    rows = []
    for name in shapes:
        for peer in peers:
            rows += run_one(peer, name, SUITE[name], args, rates)
    path = os.path.join(args.out_dir, "peers.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plot(rows, shapes, peers, args.out_dir)
    print(f"wrote {path} and plots in {args.out_dir} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()

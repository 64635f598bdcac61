#!/usr/bin/env python3
"""Host overhead of the Python front ends, and PyTorch eager against CUDA-graph replay.

    python bench/host_overhead.py [--framework torch|jax] [--shapes tri256,...] [--json FILE]

PyTorch (--framework torch, the default):
  1. Host time per call, in microseconds: the GPU is kept busy by torch.cuda._sleep while the
     host issues a round of calls, so the time measured is the host's alone (no call waits on
     the GPU). Median of rounds, per call: the eager forward + backward through autograd, the
     forward alone (with and without autograd), each bare operator (torch.ops.evoattn.*), the
     DeepSpeed drop-in, and the C API under them (evoattn._C with prebuilt views).
  2. Per suite shape, the same forward + backward (gradients of q, k, v and both biases) timed
     with CUDA events over back-to-back eager steps, and the same step captured once in a CUDA
     graph and replayed: their ratio is the cost of the host on the GPU's time.
JAX (--framework jax): host dispatch time of a jitted forward and forward + backward, the same
rounds of calls without waiting, and per suite shape the wall time per jitted call.

Inputs are bf16 on the GPU, fresh random values; the tri256 suite shape sets the host timings
(they hardly depend on the shape, whose kernels the GPU runs behind the sleep).
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from suite import SUITE  # noqa: E402


def shapes_of(shape):
    B, N, L, H, D, has_mb, has_pb = shape
    return ((B, N, L, H, D), (B, N, 1, 1, L) if has_mb else None, (B, 1, H, L, L) if has_pb else None)


# --- PyTorch --------------------------------------------------------------------------------------


def torch_inputs(torch, shape, requires_grad):
    seq, mb_shape, pb_shape = shapes_of(shape)

    def rand(s):
        if s is None:
            return None
        return torch.randn(s, device="cuda", dtype=torch.bfloat16).requires_grad_(requires_grad)

    return [rand(seq), rand(seq), rand(seq), rand(mb_shape), rand(pb_shape)]


def torch_host_us(torch, step, iters=40, rounds=9):
    """Median host microseconds per call of step(), the GPU held busy behind a sleep."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    estimate = time.perf_counter() - t0
    torch.cuda.synchronize()
    # Sleep (in GPU clock cycles, at most ~2 GHz) for three times the round's host time.
    cycles = int(max(estimate, 1e-3) * 3 * 2.0e9)
    per_call = []
    for _ in range(rounds):
        torch.cuda._sleep(cycles)
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        per_call.append((time.perf_counter() - t0) / iters * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per_call)


def torch_event_ms(torch, run, iters, rounds=5):
    """Median of rounds of GPU milliseconds per iteration of run(), by CUDA events."""
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return statistics.median(times)


def bench_torch(args):
    import torch

    import evoattn
    import evoattn.torch as et
    from evoattn import _C

    if not (torch.cuda.is_available() and evoattn.cuda_available()):
        sys.exit("host_overhead.py: needs a CUDA GPU and evoattn built with its CUDA backend")
    torch.manual_seed(0)
    result = {"framework": "torch", "torch": torch.__version__, "evoattn": evoattn.__version__,
              "gpu": torch.cuda.get_device_name(), "host_us": {}, "suite": {}}

    q, k, v, mb, pb = torch_inputs(torch, SUITE["tri256"], True)
    d_o = torch.randn_like(q)
    leaves = (q, k, v, mb, pb)
    qd, kd, vd, mbd, pbd = (t.detach() for t in leaves)
    with torch.no_grad():
        o, lse = torch.ops.evoattn.forward(qd, kd, vd, mbd, pbd, None, None, True, False)

    def fwd_bwd():
        out = et.evoformer_attention(q, k, v, mb, pb)
        torch.autograd.grad(out, leaves, d_o)

    def fwd_autograd():
        et.evoformer_attention(q, k, v, mb, pb)

    def fwd_no_grad():
        with torch.no_grad():
            et.evoformer_attention(q, k, v, mb, pb)

    def op_forward():
        torch.ops.evoattn.forward(qd, kd, vd, mbd, pbd, None, None, True, False)

    def op_backward():
        torch.ops.evoattn.backward(d_o, qd, kd, vd, o, lse, mbd, pbd, None, None, True, False,
                                   True, True)

    def ds4sci_fwd_bwd():
        out = et.DS4Sci_EvoformerAttention(q, k, v, [mb, pb])
        torch.autograd.grad(out, leaves, d_o)

    # The C API under the bindings: evoattn_forward through _C with views built once.
    def view(t, code):
        return (t.data_ptr(), code, _C.DEVICE_CUDA, t.get_device(), tuple(t.shape), t.stride())

    bf16 = _C.BFLOAT16
    fwd_views = [view(t, bf16) for t in (qd, kd, vd, mbd, pbd)] + [None]
    o_view, lse_view = view(torch.empty_like(qd), bf16), view(torch.empty_like(lse), _C.FLOAT32)
    stream = torch.cuda.current_stream().cuda_stream

    def c_api_forward():
        _C.forward(*fwd_views, o_view, lse_view, None, True, False, 0, stream)

    grads = [torch.empty_like(t) for t in (qd, kd, vd, mbd, pbd)]
    bwd_views = ([view(d_o, bf16)] + fwd_views[:3] + [view(o, bf16), view(lse, _C.FLOAT32)] +
                 fwd_views[3:] + [view(g, bf16) for g in grads])
    ws_bytes = _C.backward_workspace_size(*fwd_views, *bwd_views[-2:], None, True, False)[2]
    workspace = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device="cuda")

    def c_api_backward():
        _C.backward(*bwd_views, workspace.data_ptr(), ws_bytes, None, True, False, 0, stream)

    # Eight calls on their own inputs, one backward: the engine's fixed cost per backward (a
    # hand-off to its CUDA thread and back) shared as in a model with many attention layers.
    layers = [torch_inputs(torch, SUITE["tri256"], True) for _ in range(8)]

    def fwd_bwd_in_8():
        outs = [et.evoformer_attention(*xs) for xs in layers]
        torch.autograd.grad(outs, [t for xs in layers for t in xs], [d_o] * len(outs))

    # PyTorch's own costs on this machine, for scale: a bare ATen operator, a one-kernel op
    # forward + backward through C++ autograd, and SDPA (its fused attention) forward + backward.
    a, b = (torch.randn(64, device="cuda", requires_grad=True) for _ in range(2))
    g = torch.randn(64, device="cuda")
    ad, bd = a.detach(), b.detach()
    sq, sk, sv = (t.detach().flatten(0, 1).transpose(1, 2).requires_grad_() for t in (q, k, v))
    sdo = d_o.flatten(0, 1).transpose(1, 2)

    def aten_mul():
        torch.ops.aten.mul.Tensor(ad, bd)

    def mul_fwd_bwd():
        torch.autograd.grad(torch.mul(a, b), (a, b), g)

    def sdpa_fwd_bwd():
        out = torch.nn.functional.scaled_dot_product_attention(sq, sk, sv)
        torch.autograd.grad(out, (sq, sk, sv), sdo)

    steps = {"fwd+bwd (autograd)": fwd_bwd, "fwd+bwd per call, 8 in one backward": fwd_bwd_in_8,
             "fwd (autograd graph built)": fwd_autograd, "fwd (no_grad)": fwd_no_grad,
             "op forward": op_forward, "op backward": op_backward,
             "DS4Sci fwd+bwd": ds4sci_fwd_bwd, "C API forward (via _C)": c_api_forward,
             "C API backward (via _C)": c_api_backward,
             "ref: torch.ops.aten.mul.Tensor": aten_mul, "ref: torch.mul fwd+bwd": mul_fwd_bwd,
             "ref: SDPA fwd+bwd (no bias)": sdpa_fwd_bwd}
    for name, step in steps.items():
        per_call = 8 if "8 in one" in name else 1
        result["host_us"][name] = torch_host_us(torch, step, iters=40 // per_call) / per_call
        print(f"host  {name:28s} {result['host_us'][name]:8.1f} us", flush=True)

    for name in args.shapes:
        q, k, v, mb, pb = torch_inputs(torch, SUITE[name], True)
        leaves = tuple(t for t in (q, k, v, mb, pb) if t is not None)
        d_o = torch.randn_like(q)

        def step():
            out = et.evoformer_attention(q, k, v, mb, pb)
            return torch.autograd.grad(out, leaves, d_o)

        iters = 20
        eager = torch_event_ms(torch, step, iters)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        replay = torch_event_ms(torch, graph.replay, iters)
        result["suite"][name] = {"eager_ms": eager, "graph_ms": replay, "ratio": eager / replay}
        print(f"suite {name:10s} f+b eager {eager:8.4f} ms  graph {replay:8.4f} ms  "
              f"eager/graph {eager / replay:6.3f}", flush=True)
        del graph
    return result


# --- JAX ------------------------------------------------------------------------------------------


def bench_jax(args):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp
    import numpy as np

    import evoattn
    import evoattn.jax as ej

    gpu = jax.devices("gpu")[0]
    result = {"framework": "jax", "jax": jax.__version__, "evoattn": evoattn.__version__,
              "gpu": gpu.device_kind, "host_us": {}, "suite": {}}
    rng = np.random.default_rng(0)

    def inputs(shape):
        seq, mb_shape, pb_shape = shapes_of(shape)
        return [None if s is None else jax.device_put(jnp.asarray(rng.standard_normal(s), jnp.bfloat16), gpu)
                for s in (seq, seq, seq, mb_shape, pb_shape)]

    fwd = jax.jit(ej.evoformer_attention)

    @jax.jit
    def fwd_bwd(q, k, v, mb, pb, d_o):
        o, vjp = jax.vjp(ej.evoformer_attention, q, k, v, mb, pb)
        return vjp(d_o)

    def host_us(fn, *xs, iters=200, rounds=7, wait=False):
        """Median microseconds per call over rounds of back-to-back calls: the host's dispatch
        alone, or with wait=True until the last call's results are ready (the wall time)."""
        jax.block_until_ready(fn(*xs))
        per_call = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(iters):
                out = fn(*xs)
            if wait:
                jax.block_until_ready(out)
            per_call.append((time.perf_counter() - t0) / iters * 1e6)
            jax.block_until_ready(out)
        return statistics.median(per_call)

    # Dispatch alone: a shape whose kernels take a few microseconds, so the GPU never holds the
    # host back (JAX dispatches asynchronously).
    tiny = (1, 1, 16, 1, 32, True, True)
    q, k, v, mb, pb = inputs(tiny)
    d_o = jnp.ones_like(q)
    result["host_us"]["jit fwd dispatch (tiny)"] = host_us(fwd, q, k, v, mb, pb)
    result["host_us"]["jit fwd+bwd dispatch (tiny)"] = host_us(fwd_bwd, q, k, v, mb, pb, d_o)
    # JAX's own dispatch of a jitted one-kernel function on this machine, for scale.
    result["host_us"]["ref: jit x * 2 dispatch"] = host_us(jax.jit(lambda x: x * 2), q)
    for name, us in result["host_us"].items():
        print(f"host  {name:28s} {us:8.1f} us", flush=True)
    for name in args.shapes:
        q, k, v, mb, pb = inputs(SUITE[name])
        d_o = jnp.ones_like(q)
        wall = host_us(fwd_bwd, q, k, v, mb, pb, d_o, iters=20, rounds=5, wait=True) / 1e3
        result["suite"][name] = {"jit_fwd_bwd_wall_ms": wall}
        print(f"suite {name:10s} jit f+b {wall:8.4f} ms per call (wall, back to back)", flush=True)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=("torch", "jax"), default="torch")
    parser.add_argument("--shapes", default=",".join(SUITE),
                        help="comma-separated suite shapes for the per-shape timings ('' for none)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    args.shapes = [s for s in args.shapes.split(",") if s]
    for s in args.shapes:
        if s not in SUITE:
            parser.error(f"unknown shape {s!r}; expected one of {', '.join(SUITE)}")
    result = bench_torch(args) if args.framework == "torch" else bench_jax(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

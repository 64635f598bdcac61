"""PyTorch front end of evoattn.

    evoformer_attention(q, k, v, mask_bias=None, pair_bias=None, mask=None, scale=None,
                        layout="BNLHD")
    DS4Sci_EvoformerAttention(Q, K, V, biases)       # drop-in for DeepSpeed's function

Both go through two custom operators, ``torch.ops.evoattn.forward`` and
``torch.ops.evoattn.backward`` (torch.library.custom_op, with fake/meta implementations and an
autograd registration), so they work under torch.compile(fullgraph=True), pass
torch.library.opcheck and can be captured in a CUDA graph: every buffer (outputs, LSE, the
backward workspace) comes from PyTorch's allocator, every call runs on
torch.cuda.current_stream(), and nothing synchronises. CPU tensors run on the CPU backend
(with torch.get_num_threads() threads).

Tensors are passed to the C library as strided views: any strides, no copies. Inside the
operators q, k, v are always [B, N, L, H, D] (the "BNHLD" layout is a transposed view of the
same memory) and each bias is a 5-D view broadcastable to [B, N, H, Lq, Lk].
"""

from typing import Optional, Sequence

import torch
from torch import Tensor

from . import _C
from ._core import call

__all__ = ["evoformer_attention", "DS4Sci_EvoformerAttention"]

_DTYPE_CODES = {
    torch.float16: _C.FLOAT16,
    torch.bfloat16: _C.BFLOAT16,
    torch.float32: _C.FLOAT32,
    torch.bool: _C.BOOL,
}
_LAYOUTS = ("BNLHD", "BNHLD")


def _view(t: Optional[Tensor], name: str):
    """The C API's view of a tensor: (data_ptr, dtype, device, ordinal, sizes, strides)."""
    if t is None:
        return None
    code = _DTYPE_CODES.get(t.dtype)
    if code is None:
        raise TypeError(
            f"evoattn: argument '{name}': dtype {t.dtype} is not supported; expected "
            "torch.float16, torch.bfloat16 or torch.float32 (torch.bool for 'mask')"
        )
    if t.is_cuda:
        device, ordinal = _C.DEVICE_CUDA, t.get_device()
    elif t.is_cpu:
        device, ordinal = _C.DEVICE_CPU, 0
    else:
        raise ValueError(
            f"evoattn: argument '{name}': tensors on '{t.device}' are not supported (cpu or cuda)"
        )
    return (t.data_ptr(), code, device, ordinal, t.shape, t.stride())


def _stream_and_threads(device: torch.device):
    """The caller's stream (CUDA) or thread count (CPU) for a call on `device`."""
    if device.type == "cuda":
        return torch.cuda.current_stream(device).cuda_stream, 0
    return 0, torch.get_num_threads()


# ---------------------------------------------------------------------------------------------
# The operators. Outputs are allocated the same way by the real and the fake implementations.
# ---------------------------------------------------------------------------------------------


def _forward_outputs(q: Tensor):
    if q.dim() != 5:
        raise ValueError(f"evoattn: argument 'q': expected [B, N, Lq, H, D], got shape {tuple(q.shape)}")
    B, N, Lq, H, _ = q.shape
    o = torch.empty_like(q)  # keeps q's dense stride order, so "BNHLD" outputs stay head-major
    lse = torch.empty((B, N, H, Lq), dtype=torch.float32, device=q.device)
    return o, lse


def _backward_outputs(q, k, v, mask_bias, pair_bias, need_d_mask_bias, need_d_pair_bias):
    def bias_grad(bias, needed):
        if not needed:
            return q.new_empty((0,))
        return torch.empty(bias.shape, dtype=bias.dtype, device=bias.device)

    return (
        torch.empty_like(q),
        torch.empty_like(k),
        torch.empty_like(v),
        bias_grad(mask_bias, need_d_mask_bias),
        bias_grad(pair_bias, need_d_pair_bias),
    )


@torch.library.custom_op("evoattn::forward", mutates_args=())
def _forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask_bias: Optional[Tensor],
    pair_bias: Optional[Tensor],
    mask: Optional[Tensor],
    scale: Optional[float],
    deterministic: bool,
    allow_tf32: bool,
) -> tuple[Tensor, Tensor]:
    """O [B, N, Lq, H, D] (dtype and stride order of q) and LSE [B, N, H, Lq] (float32)."""
    views = [_view(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v"), (mask_bias, "mask_bias"),
                                      (pair_bias, "pair_bias"), (mask, "mask"))]
    o, lse = _forward_outputs(q)
    if lse.numel() == 0:  # B, N, H or Lq is 0: nothing to compute
        return o, lse
    stream, threads = _stream_and_threads(q.device)
    call(_C.forward, *views, _view(o, "o"), _view(lse, "lse"), scale, deterministic, allow_tf32,
               threads, stream)
    return o, lse


@_forward.register_fake
def _forward_fake(q, k, v, mask_bias, pair_bias, mask, scale, deterministic, allow_tf32):
    return _forward_outputs(q)


@torch.library.custom_op("evoattn::backward", mutates_args=())
def _backward(
    d_o: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
    mask_bias: Optional[Tensor],
    pair_bias: Optional[Tensor],
    mask: Optional[Tensor],
    scale: Optional[float],
    deterministic: bool,
    allow_tf32: bool,
    need_d_mask_bias: bool,
    need_d_pair_bias: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """dQ, dK, dV and the two bias gradients (each an empty tensor when not asked for).

    A bias gradient has the bias's shape and dtype; its broadcast dimensions are summed.
    """
    dq, dk, dv, dmb, dpb = _backward_outputs(q, k, v, mask_bias, pair_bias, need_d_mask_bias,
                                             need_d_pair_bias)
    if lse.numel() == 0:  # no query rows: every gradient is zero
        for g in (dq, dk, dv, dmb, dpb):
            g.zero_()
        return dq, dk, dv, dmb, dpb
    dmb_view = _view(dmb, "d_mask_bias") if need_d_mask_bias else None
    dpb_view = _view(dpb, "d_pair_bias") if need_d_pair_bias else None
    inputs = [_view(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v"))]
    biases = [_view(t, n) for t, n in ((mask_bias, "mask_bias"), (pair_bias, "pair_bias"),
                                       (mask, "mask"))]
    nbytes = call(_C.backward_workspace_size, *inputs, *biases, dmb_view, dpb_view, scale,
                                        deterministic, allow_tf32)
    # From the caching allocator, on the current stream: ordered after this call's kernels.
    workspace = torch.empty((nbytes,), dtype=torch.uint8, device=q.device)
    stream, threads = _stream_and_threads(q.device)
    call(_C.backward, _view(d_o, "d_o"), *inputs, _view(o, "o"), _view(lse, "lse"), *biases,
                _view(dq, "dq"), _view(dk, "dk"), _view(dv, "dv"), dmb_view, dpb_view,
                workspace.data_ptr(), nbytes, scale, deterministic, allow_tf32, threads, stream)
    return dq, dk, dv, dmb, dpb


@_backward.register_fake
def _backward_fake(d_o, q, k, v, o, lse, mask_bias, pair_bias, mask, scale, deterministic,
                   allow_tf32, need_d_mask_bias, need_d_pair_bias):
    return _backward_outputs(q, k, v, mask_bias, pair_bias, need_d_mask_bias, need_d_pair_bias)


def _setup_context(ctx, inputs, output):
    q, k, v, mask_bias, pair_bias, mask, scale, deterministic, allow_tf32 = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, mask_bias, pair_bias, mask)
    ctx.scale = scale
    ctx.deterministic = deterministic
    ctx.allow_tf32 = allow_tf32
    ctx.mark_non_differentiable(lse)
    # No zero-filled gradient for the LSE output (it is never used): one kernel launch and
    # allocation less per backward.
    ctx.set_materialize_grads(False)


def _autograd_backward(ctx, d_o, d_lse):
    q, k, v, o, lse, mask_bias, pair_bias, mask = ctx.saved_tensors
    if d_o is None:  # o took no part in the loss (possible without materialised gradients)
        d_o = torch.zeros_like(o)
    need_d_mask_bias = mask_bias is not None and ctx.needs_input_grad[3]
    need_d_pair_bias = pair_bias is not None and ctx.needs_input_grad[4]
    dq, dk, dv, dmb, dpb = torch.ops.evoattn.backward(
        d_o, q, k, v, o, lse, mask_bias, pair_bias, mask, ctx.scale, ctx.deterministic,
        ctx.allow_tf32, need_d_mask_bias, need_d_pair_bias)
    return (dq, dk, dv, dmb if need_d_mask_bias else None, dpb if need_d_pair_bias else None,
            None, None, None, None)


_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


# ---------------------------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------------------------


def _bias_5d(bias: Optional[Tensor], name: str) -> Optional[Tensor]:
    """A bias as a 5-D view over [B, N, H, Lq, Lk]: missing leading dims become size 1."""
    if bias is None:
        return None
    if not isinstance(bias, Tensor):
        raise TypeError(f"evoattn: argument '{name}': expected a torch.Tensor or None")
    if bias.dim() > 5:
        raise ValueError(
            f"evoattn: argument '{name}': expected at most 5 dims broadcastable to "
            f"[B, N, H, Lq, Lk], got shape {tuple(bias.shape)}")
    return bias.reshape((1,) * (5 - bias.dim()) + tuple(bias.shape))


def evoformer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask_bias: Optional[Tensor] = None,
    pair_bias: Optional[Tensor] = None,
    mask: Optional[Tensor] = None,
    scale: Optional[float] = None,
    layout: str = "BNLHD",
    *,
    deterministic: bool = True,
    allow_tf32: bool = False,
    return_lse: bool = False,
):
    """softmax(scale · q kᵀ + mask_bias + pair_bias, masked by `mask`) v, fused.

    q: [B, N, Lq, H, D] for layout "BNLHD" (DeepSpeed's) or [B, N, H, Lq, D] for "BNHLD"
    (cuEquivariance's); k, v likewise with Lk keys. float16, bfloat16 or float32; any strides
    (no copies are made).
    mask_bias, pair_bias: optional additive biases, each broadcastable to [B, N, H, Lq, Lk]
    whatever the layout (fewer than 5 dims are padded on the left, as in broadcasting). The
    Evoformer forms are mask_bias [B, N, 1, 1, Lk] and pair_bias [B, 1, H, Lq, Lk]. dtype of q
    or float32. Gradients flow to each bias that requires grad, in its dtype and shape.
    mask: optional torch.bool, [B, N, Lk] or 5-D broadcastable; False = key masked out (a bias
    of -inf, no tensor is built from it). No gradient.
    scale: multiplies q·k; default 1/sqrt(D).
    deterministic / allow_tf32: the C library's options (bitwise reproducible by default;
    float32 computes in IEEE float32 unless allow_tf32).

    Returns O in q's layout (and the float32 LSE [B, N, H, Lq] when return_lse=True).
    Bad input raises TypeError (dtype), ValueError (shapes, strides, layout) or RuntimeError
    (no backend for the device), with the C library's message.
    """
    if layout not in _LAYOUTS:
        raise ValueError(f"evoattn: argument 'layout': expected one of {_LAYOUTS}, got {layout!r}")
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        if not isinstance(t, Tensor):
            raise TypeError(f"evoattn: argument '{name}': expected a torch.Tensor")
        if t.dim() != 5:
            raise ValueError(
                f"evoattn: argument '{name}': expected 5 dims ([B, N, L, H, D] or [B, N, H, L, D] "
                f"by layout), got shape {tuple(t.shape)}")
    if mask is not None and (not isinstance(mask, Tensor) or mask.dtype != torch.bool):
        raise TypeError("evoattn: argument 'mask': expected a torch.bool tensor "
                        "(use mask_bias for an additive float mask)")
    if scale is not None:
        scale = float(scale)
    if layout == "BNHLD":
        q, k, v = (t.transpose(2, 3) for t in (q, k, v))
    o, lse = torch.ops.evoattn.forward(q, k, v, _bias_5d(mask_bias, "mask_bias"),
                                       _bias_5d(pair_bias, "pair_bias"), mask, scale,
                                       bool(deterministic), bool(allow_tf32))
    if layout == "BNHLD":
        o = o.transpose(2, 3)
    return (o, lse) if return_lse else o


def DS4Sci_EvoformerAttention(Q: Tensor, K: Tensor, V: Tensor, biases: Sequence[Optional[Tensor]]):
    """Drop-in replacement for deepspeed.ops.deepspeed4science.DS4Sci_EvoformerAttention.

    Q, K, V: [*, L, H, D]; DeepSpeed's layout is [B, N, L, H, D]. Other leading dims are folded
    into the batch (as DeepSpeed's kernel does), but biases need the 5-D form.
    biases: a list of at most two tensors (or None): biases[0] = mask bias [B, N, 1, 1, L],
    biases[1] = pair bias [B, 1, H, L, L], with exactly those shapes (DeepSpeed asserts them).
    Gradients flow to Q, K, V and to each bias that requires grad, in the bias's dtype.

    Unlike DeepSpeed's, this neither appends to the caller's `biases` list nor makes contiguous
    copies, runs on CPU tensors too, and has no L > 16 or D <= 64 limit.
    """
    biases = list(biases)
    if len(biases) > 2:
        raise ValueError(f"evoattn: DS4Sci_EvoformerAttention takes at most 2 biases, got {len(biases)}")
    biases += [None] * (2 - len(biases))
    for t, name in ((Q, "Q"), (K, "K"), (V, "V")):
        if not isinstance(t, Tensor) or t.dim() < 3:
            raise ValueError(f"evoattn: argument '{name}': expected a tensor [*, L, H, D]")
    if Q.dim() == 5:
        B, N, L, H, _ = Q.shape
        expected = ((B, N, 1, 1, L), (B, 1, H, L, L))
        for i, (bias, shape) in enumerate(zip(biases, expected)):
            if bias is not None and tuple(bias.shape) != shape:
                raise ValueError(f"evoattn: bias{i + 1} shape is incorrect: expected {shape}, "
                                 f"got {tuple(bias.shape)}")
        return evoformer_attention(Q, K, V, mask_bias=biases[0], pair_bias=biases[1])
    if any(b is not None for b in biases):
        raise ValueError("evoattn: DS4Sci_EvoformerAttention with biases needs 5-D Q, K, V "
                         f"[B, N, L, H, D], got Q of shape {tuple(Q.shape)}")
    lead = Q.shape[:-3]
    q, k, v = (t.reshape((1, -1) + tuple(t.shape[-3:])) for t in (Q, K, V))
    return evoformer_attention(q, k, v).reshape(tuple(lead) + tuple(Q.shape[-3:]))

"""PyTorch front end of evoattn.

    evoformer_attention(q, k, v, mask_bias=None, pair_bias=None, mask=None, scale=None,
                        layout="BNLHD", *, deterministic=True, allow_tf32=False, return_lse=False)
    DS4Sci_EvoformerAttention(Q, K, V, biases)       # drop-in for DeepSpeed's function

Both run two operators, ``torch.ops.evoattn.forward`` and ``torch.ops.evoattn.backward``,
implemented in C++ on LibTorch's stable ABI (``_torch_ops.so``: one build serves PyTorch 2.10
and later), with fake kernels registered here for torch.compile, and an autograd.Function that
joins them. Every buffer (outputs, LSE, the backward workspace) comes from PyTorch's allocator,
every call runs on PyTorch's current CUDA stream, and nothing synchronises, so the calls work
under torch.compile(fullgraph=True) and inside CUDA graphs. CPU tensors run on the CPU backend
with torch.get_num_threads() threads.

The operators themselves are not differentiable (an autograd formula registered from Python would
put Python on the path of every call): differentiate through evoformer_attention or
DS4Sci_EvoformerAttention.
"""

import os
from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from . import _core

__all__ = ["evoformer_attention", "DS4Sci_EvoformerAttention"]


def _load_operators() -> None:
    if torch.__version__ < "2.10":
        raise ImportError(f"evoattn.torch needs PyTorch 2.10 or later (its stable ABI); this is "
                          f"PyTorch {torch.__version__}")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torch_ops.so")
    if not os.path.exists(path):
        raise ImportError("evoattn was built without its PyTorch operators (_torch_ops.so): torch "
                          "was not importable at build time. Reinstall with `pip install .`, which "
                          "builds them against torch's headers")
    torch.ops.load_library(path)


_load_operators()
_forward_op = torch.ops.evoattn.forward.default
_backward_op = torch.ops.evoattn.backward.default

# The operators are non-differentiable building blocks: their Autograd kernels fall through (a
# marker in the dispatcher, no Python on the call), so a direct call with inputs that require
# grad returns outputs that do not, and autograd goes through _EvoformerAttention below.
_autograd_fallthrough = torch.library.Library("evoattn", "IMPL")
for _op in ("forward", "backward"):
    _autograd_fallthrough.impl(_op, torch.library.fallthrough_kernel, "Autograd")
_LAYOUTS = ("BNLHD", "BNHLD")


# ---------------------------------------------------------------------------------------------
# Fake kernels: the outputs' metadata, exactly as python/src/torch_ops.cpp allocates them.
# ---------------------------------------------------------------------------------------------


def _dense_strides_like(t: Tensor) -> List[int]:
    """Dense strides in the order of t's strides (outermost first, ties by dimension)."""
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    strides = [0] * t.dim()
    step = 1
    for d in reversed(order):
        strides[d] = step
        step = step * torch.sym_max(t.size(d), 1)
    return strides


def _empty_like(t: Tensor) -> Tensor:
    return t.new_empty_strided(t.shape, _dense_strides_like(t))


@torch.library.register_fake("evoattn::forward")
def _forward_fake(q, k, v, mask_bias, pair_bias, mask, scale, deterministic, allow_tf32):
    B, N, Lq, H, _ = q.shape
    return _empty_like(q), q.new_empty((B, N, H, Lq), dtype=torch.float32)


@torch.library.register_fake("evoattn::backward")
def _backward_fake(d_o, q, k, v, o, lse, mask_bias, pair_bias, mask, scale, deterministic,
                   allow_tf32, need_d_mask_bias, need_d_pair_bias):
    def bias_grad(bias, needed):
        return bias.new_empty(bias.shape) if needed else q.new_empty((0,))

    return (_empty_like(q), _empty_like(k), _empty_like(v), bias_grad(mask_bias, need_d_mask_bias),
            bias_grad(pair_bias, need_d_pair_bias))


# ---------------------------------------------------------------------------------------------
# Errors: the operators raise RuntimeError("[kind] evoattn_forward: argument 'x': ..."); the
# user sees the call they made and an exception by kind.
# ---------------------------------------------------------------------------------------------


def _user_error(e: RuntimeError, call: str) -> Exception:
    text = str(e)
    if not text.startswith("[") or "] " not in text:
        return e  # not one of ours (an allocator's out-of-memory, say): unchanged
    kind, message = text[1:].split("] ", 1)
    return _core.error(call, kind, message)


# ---------------------------------------------------------------------------------------------
# Autograd
# ---------------------------------------------------------------------------------------------


class _EvoformerAttention(torch.autograd.Function):
    """O and LSE from the forward operator; dQ, dK, dV and the asked-for bias gradients from
    the backward operator (the boolean mask, scale and options get none)."""

    @staticmethod
    def forward(ctx, q, k, v, mask_bias, pair_bias, mask, scale, deterministic, allow_tf32):
        o, lse = _forward_op(q, k, v, mask_bias, pair_bias, mask, scale, deterministic, allow_tf32)
        ctx.save_for_backward(q, k, v, o, lse, mask_bias, pair_bias, mask)
        ctx.scale, ctx.deterministic, ctx.allow_tf32 = scale, deterministic, allow_tf32
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # no zero-filled gradient for the unused LSE
        return o, lse

    @staticmethod
    def backward(ctx, d_o, d_lse):
        if d_o is None:  # O took no part in the loss: every gradient is zero
            return (None,) * 9
        q, k, v, o, lse, mask_bias, pair_bias, mask = ctx.saved_tensors
        need_mb, need_pb = ctx.needs_input_grad[3], ctx.needs_input_grad[4]
        try:
            dq, dk, dv, dmb, dpb = _backward_op(d_o, q, k, v, o, lse, mask_bias, pair_bias, mask,
                                                ctx.scale, ctx.deterministic, ctx.allow_tf32,
                                                need_mb, need_pb)
        except RuntimeError as e:
            raise _user_error(e, "evoattn.torch.evoformer_attention (backward)") from None
        return (dq, dk, dv, dmb if need_mb else None, dpb if need_pb else None, None, None, None,
                None)


def _attention(call: str, q, k, v, mask_bias, pair_bias, mask, scale, deterministic, allow_tf32):
    """(O, LSE), through autograd where a gradient is wanted."""
    if scale is not None:
        scale = float(scale)
    args = (q, k, v, mask_bias, pair_bias, mask, scale, bool(deterministic), bool(allow_tf32))
    try:
        if torch.is_grad_enabled() and (
                q.requires_grad or k.requires_grad or v.requires_grad
                or (mask_bias is not None and mask_bias.requires_grad)
                or (pair_bias is not None and pair_bias.requires_grad)):
            return _EvoformerAttention.apply(*args)
        return _forward_op(*args)
    except RuntimeError as e:
        raise _user_error(e, call) from None


# ---------------------------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------------------------


def _check_tensor(t, name: str, call: str, ndim: Optional[int] = None) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{call}: argument '{name}': expected a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{call}: argument '{name}': expected {ndim} dimensions, got shape "
                         f"{tuple(t.shape)}")


def _bias_5d(bias: Optional[Tensor], name: str, call: str) -> Optional[Tensor]:
    """A bias as a view over [B, N, H, Lq, Lk]: missing leading dims become size 1."""
    if bias is None or (isinstance(bias, Tensor) and bias.dim() == 5):
        return bias
    _check_tensor(bias, name, call)
    if bias.dim() > 5:
        raise ValueError(f"{call}: argument '{name}': expected at most 5 dimensions broadcastable "
                         f"to [B, N, H, Lq, Lk], got shape {tuple(bias.shape)}")
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
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Fused Evoformer attention: ``softmax(scale · q kᵀ + mask_bias + pair_bias) v``.

    For every batch b, row n, head h and query i, over the keys j::

        s[j] = scale · q[b,n,i,h,:]·k[b,n,j,h,:] + mask_bias[b,n,h,i,j] + pair_bias[b,n,h,i,j]
        o[b,n,i,h,:] = Σ_j softmax_j(s)[j] · v[b,n,j,h,:]

    No Lq × Lk matrix is ever stored. Differentiable in q, k, v and both biases (autograd,
    torch.compile, CUDA graphs); the gradients are bitwise reproducible by default.

    Args:
        q: queries, ``[B, N, Lq, H, D]`` for layout "BNLHD" (DeepSpeed's) or ``[B, N, H, Lq, D]``
            for "BNHLD" (head-major). float16, bfloat16 or float32, on the CPU or a CUDA GPU,
            any strides (no copy is made). D from 1 to 128.
        k: keys, ``[B, N, Lk, H, D]`` (or ``[B, N, H, Lk, D]``), q's dtype and device.
        v: values, shaped like k.
        mask_bias: optional additive bias broadcastable to ``[B, N, H, Lq, Lk]`` whatever the
            layout (fewer than 5 dims are padded on the left); the Evoformer form is
            ``[B, N, 1, 1, Lk]``. q's dtype or float32.
        pair_bias: optional additive bias, broadcastable the same way; the Evoformer form is
            ``[B, 1, H, Lq, Lk]``. q's dtype or float32.
        mask: optional ``torch.bool`` tensor, ``[B, N, Lk]`` or 5-D broadcastable; False masks
            the key out (a bias of -inf, with no tensor built from it). Not differentiable.
        scale: multiplies q·k; default ``1/sqrt(D)``. Any finite value.
        layout: "BNLHD" or "BNHLD", the order of q, k, v and the output.
        deterministic: bitwise-identical gradients on every run (the default; the library has
            no faster nondeterministic path today).
        allow_tf32: float32 inputs may use TF32 tensor cores (forward, CUDA); IEEE float32
            otherwise.
        return_lse: also return the float32 log-sum-exp of the scores, ``[B, N, H, Lq]``.

    Returns:
        O in q's layout, dtype and device (and the LSE when return_lse). A row whose keys are
        all masked has O = 0 and LSE = -inf. Empty dimensions are allowed: with Lk = 0 every
        row has no keys (O = 0, LSE = -inf); all gradients of an empty problem are 0.

    Raises:
        TypeError: an argument is not a tensor, or has an unsupported or mismatched dtype.
        ValueError: shapes, strides, broadcasts, head dim, layout or scale are invalid; the
            message names the argument and what was expected.
        RuntimeError: no backend for the tensors' device, or a CUDA error.

    Example:
        >>> import torch, evoattn.torch as et
        >>> B, N, L, H, D = 1, 8, 64, 4, 32
        >>> q, k, v = (torch.randn(B, N, L, H, D, requires_grad=True) for _ in range(3))
        >>> mask_bias = torch.zeros(B, N, 1, 1, L)
        >>> pair_bias = torch.randn(B, 1, H, L, L, requires_grad=True)
        >>> o = et.evoformer_attention(q, k, v, mask_bias, pair_bias)
        >>> o.sum().backward()
        >>> tuple(o.shape), tuple(pair_bias.grad.shape)
        ((1, 8, 64, 4, 32), (1, 1, 4, 64, 64))
    """
    call = "evoattn.torch.evoformer_attention"
    if not (isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)
            and q.dim() == 5 and k.dim() == 5 and v.dim() == 5):
        for t, name in ((q, "q"), (k, "k"), (v, "v")):
            _check_tensor(t, name, call, 5)
    if layout == "BNHLD":
        q, k, v = q.transpose(2, 3), k.transpose(2, 3), v.transpose(2, 3)
    elif layout != "BNLHD":
        raise ValueError(f"{call}: argument 'layout': expected one of {_LAYOUTS}, got {layout!r}")
    if mask is not None:
        _check_tensor(mask, "mask", call)
        if mask.dtype is not torch.bool:
            raise TypeError(f"{call}: argument 'mask': expected a torch.bool tensor, got "
                            f"{mask.dtype} (use mask_bias for an additive float mask)")
    o, lse = _attention(call, q, k, v, _bias_5d(mask_bias, "mask_bias", call),
                        _bias_5d(pair_bias, "pair_bias", call), mask, scale, deterministic,
                        allow_tf32)
    if layout == "BNHLD":
        o = o.transpose(2, 3)
    return (o, lse) if return_lse else o


def DS4Sci_EvoformerAttention(Q: Tensor, K: Tensor, V: Tensor,
                              biases: Sequence[Optional[Tensor]]) -> Tensor:
    """Drop-in replacement for ``deepspeed.ops.deepspeed4science.DS4Sci_EvoformerAttention``.

    Args:
        Q: queries ``[*, L, H, D]``; DeepSpeed's layout is ``[B, N, L, H, D]``. Other leading
            dims are folded into the batch, as DeepSpeed's kernel does, but biases need 5-D Q.
        K: keys, shaped like Q.
        V: values, shaped like Q.
        biases: at most two tensors (or None): ``biases[0]`` the mask bias ``[B, N, 1, 1, L]``,
            ``biases[1]`` the pair bias ``[B, 1, H, L, L]``, with exactly those shapes
            (DeepSpeed asserts them).

    Returns:
        O, shaped like Q. Gradients flow to Q, K, V and to each bias that requires grad, in the
        bias's dtype.

    Raises:
        ValueError: more than two biases, a bias of another shape, or biases with Q not 5-D;
            and whatever :func:`evoformer_attention` raises.
        TypeError: as :func:`evoformer_attention`.

    Unlike DeepSpeed's, this neither appends to the caller's ``biases`` list nor makes
    contiguous copies, runs on CPU tensors too, and has no L > 16 or D <= 64 limit.

    Example:
        >>> import torch, evoattn.torch as et
        >>> Q = K = V = torch.randn(1, 4, 32, 2, 16)
        >>> mask_bias, pair_bias = torch.zeros(1, 4, 1, 1, 32), torch.zeros(1, 1, 2, 32, 32)
        >>> et.DS4Sci_EvoformerAttention(Q, K, V, [mask_bias, pair_bias]).shape
        torch.Size([1, 4, 32, 2, 16])
    """
    call = "evoattn.torch.DS4Sci_EvoformerAttention"
    biases = list(biases)
    if len(biases) > 2:
        raise ValueError(f"{call}: takes at most 2 biases, got {len(biases)}")
    biases += [None] * (2 - len(biases))
    for t, name in ((Q, "Q"), (K, "K"), (V, "V")):
        _check_tensor(t, name, call)
        if t.dim() < 3:
            raise ValueError(f"{call}: argument '{name}': expected [*, L, H, D], got shape "
                             f"{tuple(t.shape)}")
    if Q.dim() == 5:
        B, N, L, H, _ = Q.shape
        expected = ((B, N, 1, 1, L), (B, 1, H, L, L))
        for i, (bias, shape) in enumerate(zip(biases, expected)):
            if bias is not None and tuple(bias.shape) != shape:
                raise ValueError(f"{call}: bias{i + 1} shape is incorrect: expected {shape}, got "
                                 f"{tuple(bias.shape)}")
        return _attention(call, Q, K, V, biases[0], biases[1], None, None, True, False)[0]
    if any(b is not None for b in biases):
        raise ValueError(f"{call}: biases need 5-D Q, K, V [B, N, L, H, D], got Q of shape "
                         f"{tuple(Q.shape)}")
    lead = Q.shape[:-3]
    q, k, v = (t.reshape((1, -1) + tuple(t.shape[-3:])) for t in (Q, K, V))
    o = _attention(call, q, k, v, None, None, None, None, True, False)[0]
    return o.reshape(tuple(lead) + tuple(Q.shape[-3:]))

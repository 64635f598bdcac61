"""JAX front end of evoattn, through XLA's FFI.

    evoformer_attention(q, k, v, mask_bias=None, pair_bias=None, mask=None, scale=None,
                        layout="BNLHD")

The forward and backward are typed XLA custom calls ("evoattn_forward", "evoattn_backward")
whose C++ handlers live in the evoattn._C extension, registered here for the platforms "cpu"
and "CUDA" (jax.ffi.register_ffi_target). They run on XLA's stream; the backward workspace
is an extra uint8 result buffer sized at trace time, so XLA owns every byte.

- Gradients: jax.custom_vjp for q, k, v and each bias, in the bias's dtype and shape (its
  broadcast dims summed). With symbolic zeros, a bias gradient is only computed when the bias
  is differentiated. The boolean mask gets none.
- jit: shapes are static, so arguments are validated at trace time by the C library's own
  checks (ValueError / TypeError with its message).
- vmap: the custom calls use vmap_method="expand_dims": under vmap every operand gets a leading
  dim (size 1 if unbatched) and the handler folds the vmapped dims into B, calling the library
  once, whenever the memory allows it (every operand batched, or B = 1); otherwise it loops
  over the vmapped index, one library call per index on the same stream. Either way nothing is
  copied and results are exact; nested vmaps work the same way.

Arrays are XLA's dense row-major buffers: layout "BNLHD" means q is [B, N, Lq, H, D], "BNHLD"
means [B, N, H, Lq, D] (the same call with permuted strides, no transpose).
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from . import _C
from ._core import call

if not _C.has_xla_ffi:
    raise ImportError(
        "evoattn was built without its XLA FFI handlers (jax was not importable at build time). "
        "Rebuild with jax installed: `pip install --no-build-isolation .`, or "
        "`pip install . -Ccmake.define.EVOATTN_XLA_FFI_INCLUDE_DIR=$(python -c "
        "'import jax.ffi; print(jax.ffi.include_dir())')`")

__all__ = ["evoformer_attention"]

_LAYOUTS = {"BNLHD": 0, "BNHLD": 1}
_DTYPE_CODES = {
    np.dtype(jnp.float16): _C.FLOAT16,
    np.dtype(jnp.bfloat16): _C.BFLOAT16,
    np.dtype(jnp.float32): _C.FLOAT32,
    np.dtype(jnp.bool_): _C.BOOL,
}


def _register_targets():
    for name, capsule in _C.xla_ffi_handlers("cpu").items():
        jax.ffi.register_ffi_target(name, capsule, platform="cpu")
    for name, capsule in _C.xla_ffi_handlers("CUDA").items():
        jax.ffi.register_ffi_target(name, capsule, platform="CUDA")


_register_targets()


# ---------------------------------------------------------------------------------------------
# Trace-time validation: the C library's checks on data-less views of the abstract arrays.
# ---------------------------------------------------------------------------------------------


def _row_major_strides(shape):
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


def _abstract_view(x, name, seq_layout=None, device=None):
    if x is None:
        return None
    code = _DTYPE_CODES.get(np.dtype(x.dtype))
    if code is None:
        raise TypeError(f"evoattn: argument '{name}': dtype {x.dtype} is not supported; expected "
                        "float16, bfloat16 or float32 (bool for 'mask')")
    sizes, strides = list(x.shape), list(_row_major_strides(x.shape))
    if seq_layout == 1 and len(sizes) == 5:  # memory [B, N, H, L, D] seen as [B, N, L, H, D]
        sizes[2], sizes[3] = sizes[3], sizes[2]
        strides[2], strides[3] = strides[3], strides[2]
    return (0, code, _C.DEVICE_CPU if device is None else device, 0, tuple(sizes), tuple(strides))


def _validate(q, k, v, mask_bias, pair_bias, mask, static):
    layout, scale, deterministic, allow_tf32 = static
    seq = [_abstract_view(t, n, layout) for t, n in ((q, "q"), (k, "k"), (v, "v"))]
    call(_C.backward_workspace_size, *seq, _abstract_view(mask_bias, "mask_bias"),
                               _abstract_view(pair_bias, "pair_bias"), _abstract_view(mask, "mask"),
                               None, None, scale, deterministic, allow_tf32)


# ---------------------------------------------------------------------------------------------
# The custom calls
# ---------------------------------------------------------------------------------------------


def _attrs(static, mask_bias, pair_bias, mask, need_d_mask_bias=False, need_d_pair_bias=False):
    layout, scale, deterministic, allow_tf32 = static
    return dict(
        layout=np.int64(layout),
        has_mask_bias=np.int64(mask_bias is not None),
        has_pair_bias=np.int64(pair_bias is not None),
        has_mask=np.int64(mask is not None),
        mask_rank=np.int64(mask.ndim if mask is not None else 5),
        has_scale=np.int64(scale is not None),
        scale=np.float64(scale if scale is not None else 0.0),
        deterministic=np.int64(deterministic),
        allow_tf32=np.int64(allow_tf32),
        need_d_mask_bias=np.int64(need_d_mask_bias),
        need_d_pair_bias=np.int64(need_d_pair_bias),
    )


def _operands(*xs):
    return [x for x in xs if x is not None]


def _ffi_forward(q, k, v, mask_bias, pair_bias, mask, static):
    layout = static[0]
    if layout == 0:
        B, N, Lq, H, _ = q.shape
    else:
        B, N, H, Lq, _ = q.shape
    call = jax.ffi.ffi_call(
        "evoattn_forward",
        (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((B, N, H, Lq), jnp.float32)),
        vmap_method="expand_dims")
    return call(*_operands(q, k, v, mask_bias, pair_bias, mask),
                **_attrs(static, mask_bias, pair_bias, mask))


def _workspace_bytes(q, k, v, mask_bias, pair_bias, mask, static, need_d_mask_bias,
                     need_d_pair_bias):
    """Backward workspace of one library call (the trailing 5 dims; leading ones are looped or
    folded by the handler). Asked as for CUDA tensors: never less than the CPU backend needs."""
    layout, scale, deterministic, allow_tf32 = static
    extra = q.ndim - 5

    def view(x, name, rank, seq=False):
        if x is None:
            return None
        trailing = jax.ShapeDtypeStruct(x.shape[x.ndim - rank:], x.dtype)
        return _abstract_view(trailing, name, layout if seq else None, _C.DEVICE_CUDA)

    return call(_C.backward_workspace_size,
        view(q, "q", 5, True), view(k, "k", 5, True), view(v, "v", 5, True),
        view(mask_bias, "mask_bias", 5), view(pair_bias, "pair_bias", 5),
        view(mask, "mask", mask.ndim - extra if mask is not None else 0),
        view(mask_bias if need_d_mask_bias else None, "d_mask_bias", 5),
        view(pair_bias if need_d_pair_bias else None, "d_pair_bias", 5),
        scale, deterministic, allow_tf32)


def _ffi_backward(d_o, q, k, v, o, lse, mask_bias, pair_bias, mask, static, need_d_mask_bias,
                  need_d_pair_bias):
    results = [jax.ShapeDtypeStruct(t.shape, t.dtype) for t in (q, k, v)]
    if need_d_mask_bias:
        results.append(jax.ShapeDtypeStruct(mask_bias.shape, mask_bias.dtype))
    if need_d_pair_bias:
        results.append(jax.ShapeDtypeStruct(pair_bias.shape, pair_bias.dtype))
    # The workspace is one more result buffer, sized at trace time: XLA owns it, so the handler
    # allocates nothing (and nothing depends on a scratch allocator's limits).
    ws = _workspace_bytes(q, k, v, mask_bias, pair_bias, mask, static, need_d_mask_bias,
                          need_d_pair_bias)
    results.append(jax.ShapeDtypeStruct((max(ws, 1),), jnp.uint8))
    call = jax.ffi.ffi_call("evoattn_backward", tuple(results), vmap_method="expand_dims")
    out = list(call(*_operands(d_o, q, k, v, o, lse, mask_bias, pair_bias, mask),
                    **_attrs(static, mask_bias, pair_bias, mask, need_d_mask_bias,
                             need_d_pair_bias)))[:-1]
    dq, dk, dv = out[:3]
    d_mask_bias = out.pop(3) if need_d_mask_bias else None
    d_pair_bias = out.pop(3) if need_d_pair_bias else None
    return dq, dk, dv, d_mask_bias, d_pair_bias


# ---------------------------------------------------------------------------------------------
# Differentiation: custom_vjp with symbolic zeros, so unused bias gradients are not computed.
# ---------------------------------------------------------------------------------------------


class _GradFlags:
    """Which bias gradients the backward computes; static (pytree aux data, no leaves)."""

    def __init__(self, mask_bias: bool, pair_bias: bool):
        self.mask_bias, self.pair_bias = mask_bias, pair_bias


jax.tree_util.register_pytree_node(
    _GradFlags, lambda f: ((), (f.mask_bias, f.pair_bias)), lambda aux, _: _GradFlags(*aux))


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _attention(q, k, v, mask_bias, pair_bias, mask, static):
    return _ffi_forward(q, k, v, mask_bias, pair_bias, mask, static)[0]


def _attention_fwd(q, k, v, mask_bias, pair_bias, mask, static):
    values = [None if x is None else x.value for x in (q, k, v, mask_bias, pair_bias, mask)]
    flags = _GradFlags(mask_bias is not None and mask_bias.perturbed,
                       pair_bias is not None and pair_bias.perturbed)
    o, lse = _ffi_forward(*values, static)
    return o, (*values, o, lse, flags)


def _attention_bwd(static, residuals, d_o):
    q, k, v, mask_bias, pair_bias, mask, o, lse, flags = residuals
    if isinstance(d_o, jax.custom_derivatives.SymbolicZero):
        d_o = jnp.zeros(d_o.shape, d_o.dtype)
    dq, dk, dv, dmb, dpb = _ffi_backward(d_o, q, k, v, o, lse, mask_bias, pair_bias, mask, static,
                                         flags.mask_bias, flags.pair_bias)
    if mask_bias is not None and dmb is None:
        dmb = jnp.zeros_like(mask_bias)  # not differentiated: XLA drops it
    if pair_bias is not None and dpb is None:
        dpb = jnp.zeros_like(pair_bias)
    return dq, dk, dv, dmb, dpb, None


_attention.defvjp(_attention_fwd, _attention_bwd, symbolic_zeros=True)


# ---------------------------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------------------------


def _bias_5d(bias, name):
    if bias is None:
        return None
    bias = jnp.asarray(bias)
    if bias.ndim > 5:
        raise ValueError(f"evoattn: argument '{name}': expected at most 5 dims broadcastable to "
                         f"[B, N, H, Lq, Lk], got shape {bias.shape}")
    return bias.reshape((1,) * (5 - bias.ndim) + tuple(bias.shape))


def evoformer_attention(q, k, v, mask_bias=None, pair_bias=None, mask=None,
                        scale: Optional[float] = None, layout: str = "BNLHD", *,
                        deterministic: bool = True, allow_tf32: bool = False):
    """softmax(scale · q kᵀ + mask_bias + pair_bias, masked by `mask`) v, fused.

    q: [B, N, Lq, H, D] for layout "BNLHD" or [B, N, H, Lq, D] for "BNHLD"; k, v likewise
    with Lk keys; float16, bfloat16 or float32.
    mask_bias, pair_bias: optional, each broadcastable to [B, N, H, Lq, Lk] whatever the layout
    (fewer than 5 dims are padded on the left); Evoformer forms [B, N, 1, 1, Lk] and
    [B, 1, H, Lq, Lk]; dtype of q or float32; differentiable.
    mask: optional bool, [B, N, Lk] or 5-D broadcastable; False = masked out; no gradient.
    scale: default 1/sqrt(D). Returns O in q's layout and dtype.
    """
    if layout not in _LAYOUTS:
        raise ValueError(f"evoattn: argument 'layout': expected one of {tuple(_LAYOUTS)}, "
                         f"got {layout!r}")
    q, k, v = (jnp.asarray(t) for t in (q, k, v))
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        if t.ndim != 5:
            raise ValueError(f"evoattn: argument '{name}': expected 5 dims ({layout}), "
                             f"got shape {t.shape}")
    mask_bias, pair_bias = _bias_5d(mask_bias, "mask_bias"), _bias_5d(pair_bias, "pair_bias")
    if mask is not None:
        mask = jnp.asarray(mask)
        if mask.dtype != jnp.bool_:
            raise TypeError("evoattn: argument 'mask': expected a bool array "
                            "(use mask_bias for an additive float mask)")
    static = (_LAYOUTS[layout], None if scale is None else float(scale), bool(deterministic),
              bool(allow_tf32))
    _validate(q, k, v, mask_bias, pair_bias, mask, static)
    return _attention(q, k, v, mask_bias, pair_bias, mask, static)

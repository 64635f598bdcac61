"""JAX front end of evoattn, through XLA's FFI.

    evoformer_attention(q, k, v, mask_bias=None, pair_bias=None, mask=None, scale=None,
                        layout="BNLHD", *, deterministic=True, allow_tf32=False, return_lse=False)

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
from typing import Optional, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from . import _C
from ._core import call

_CALL = "evoattn.jax.evoformer_attention"

if not _C.has_xla_ffi:
    raise ImportError(
        "evoattn was built without its XLA FFI handlers (-Ccmake.define.EVOATTN_PYTHON_JAX=OFF, "
        "or a plain CMake build without jaxlib). Reinstall with `pip install .`, whose build "
        "requirements include jaxlib's FFI headers")

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


def _abstract_view(x, name, seq_layout=None, device=None, empty_as_one=False):
    """A data-less C API view of an abstract array (row-major strides; "BNHLD" seen as
    [B, N, L, H, D]); with empty_as_one, sizes of 0 read as 1 (validating an empty problem)."""
    if x is None:
        return None
    code = _DTYPE_CODES.get(np.dtype(x.dtype))
    if code is None:
        raise TypeError(f"{_CALL}: argument '{name}': dtype {x.dtype} is not supported; expected "
                        "float16, bfloat16 or float32 (bool for 'mask')")
    shape = tuple(max(s, 1) for s in x.shape) if empty_as_one else tuple(x.shape)
    sizes, strides = list(shape), list(_row_major_strides(shape))
    if seq_layout == 1 and len(sizes) == 5:  # memory [B, N, H, L, D] seen as [B, N, L, H, D]
        sizes[2], sizes[3] = sizes[3], sizes[2]
        strides[2], strides[3] = strides[3], strides[2]
    return (0, code, _C.DEVICE_CPU if device is None else device, 0, tuple(sizes), tuple(strides))


def _validate(q, k, v, mask_bias, pair_bias, mask, static, empty):
    """The C library's checks on the arguments, at trace time."""
    layout, scale, deterministic, allow_tf32 = static

    def view(x, name, seq=False):
        return _abstract_view(x, name, layout if seq else None, empty_as_one=empty)

    call(_CALL, _C.backward_workspace_size, view(q, "q", True), view(k, "k", True),
         view(v, "v", True), view(mask_bias, "mask_bias"), view(pair_bias, "pair_bias"),
         view(mask, "mask"), None, None, scale, deterministic, allow_tf32)


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

    return call(_CALL, _C.backward_workspace_size,
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
    """(O, LSE); the LSE is not differentiable (its cotangent is ignored)."""
    return _ffi_forward(q, k, v, mask_bias, pair_bias, mask, static)


def _attention_fwd(q, k, v, mask_bias, pair_bias, mask, static):
    values = [None if x is None else x.value for x in (q, k, v, mask_bias, pair_bias, mask)]
    flags = _GradFlags(mask_bias is not None and mask_bias.perturbed,
                       pair_bias is not None and pair_bias.perturbed)
    o, lse = _ffi_forward(*values, static)
    return (o, lse), (*values, o, lse, flags)


def _attention_bwd(static, residuals, cotangents):
    q, k, v, mask_bias, pair_bias, mask, o, lse, flags = residuals
    d_o = cotangents[0]
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
        raise ValueError(f"{_CALL}: argument '{name}': expected at most 5 dimensions "
                         f"broadcastable to [B, N, H, Lq, Lk], got shape {bias.shape}")
    return bias.reshape((1,) * (5 - bias.ndim) + tuple(bias.shape))


def _empty_result(q, layout):
    """O and LSE of a problem with no rows or no keys: no keys is every row fully masked (O = 0,
    LSE = -inf). Constants, so every gradient is 0."""
    if layout == 0:
        B, N, Lq, H, _ = q.shape
    else:
        B, N, H, Lq, _ = q.shape
    return jnp.zeros(q.shape, q.dtype), jnp.full((B, N, H, Lq), -jnp.inf, jnp.float32)


def evoformer_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                        mask_bias: Optional[jax.Array] = None,
                        pair_bias: Optional[jax.Array] = None, mask: Optional[jax.Array] = None,
                        scale: Optional[float] = None, layout: str = "BNLHD", *,
                        deterministic: bool = True, allow_tf32: bool = False,
                        return_lse: bool = False) -> Union[jax.Array, Tuple[jax.Array, jax.Array]]:
    """Fused Evoformer attention: ``softmax(scale · q kᵀ + mask_bias + pair_bias) v``.

    The same operation and arguments as ``evoattn.torch.evoformer_attention``, as typed XLA
    custom calls: works under jit, grad (q, k, v and both biases, through a custom VJP whose
    bias gradients are computed only for the biases differentiated) and vmap, on the "cpu" and
    CUDA platforms, on XLA's stream, with every buffer (the backward workspace too) owned by
    XLA. Arguments are checked at trace time by the C library's own validation.

    Args:
        q: queries, ``[B, N, Lq, H, D]`` for layout "BNLHD" or ``[B, N, H, Lq, D]`` for
            "BNHLD"; float16, bfloat16 or float32. D from 1 to 128.
        k: keys, ``[B, N, Lk, H, D]`` (or ``[B, N, H, Lk, D]``), q's dtype.
        v: values, shaped like k.
        mask_bias: optional additive bias broadcastable to ``[B, N, H, Lq, Lk]`` whatever the
            layout (fewer than 5 dims are padded on the left); the Evoformer form is
            ``[B, N, 1, 1, Lk]``. q's dtype or float32. Differentiable.
        pair_bias: optional additive bias broadcastable the same way; the Evoformer form is
            ``[B, 1, H, Lq, Lk]``. q's dtype or float32. Differentiable.
        mask: optional bool array, ``[B, N, Lk]`` or 5-D broadcastable; False masks the key
            out. Not differentiable.
        scale: multiplies q·k; default ``1/sqrt(D)``. Any finite value.
        layout: "BNLHD" or "BNHLD", the order of q, k, v and the output.
        deterministic: bitwise-identical gradients on every run (the default).
        allow_tf32: float32 inputs may use TF32 tensor cores (forward, CUDA).
        return_lse: also return the float32 log-sum-exp of the scores, ``[B, N, H, Lq]``
            (not differentiable: its cotangent is ignored).

    Returns:
        O in q's layout and dtype (and the LSE when return_lse). A row whose keys are all
        masked has O = 0 and LSE = -inf. Empty dimensions are allowed: with Lk = 0 every row
        has no keys (O = 0, LSE = -inf); all gradients of an empty problem are 0.

    Raises:
        TypeError: an unsupported or mismatched dtype.
        ValueError: shapes, broadcasts, head dim, layout or scale are invalid; the message
            names the argument and what was expected.

    Example:
        >>> import jax, jax.numpy as jnp, evoattn.jax as ej
        >>> B, N, L, H, D = 1, 8, 64, 4, 32
        >>> q = k = v = jnp.ones((B, N, L, H, D), jnp.bfloat16)
        >>> pair_bias = jnp.zeros((B, 1, H, L, L), jnp.float32)
        >>> loss = lambda q, pb: ej.evoformer_attention(q, k, v, pair_bias=pb).sum()
        >>> dq, dpb = jax.jit(jax.grad(loss, argnums=(0, 1)))(q, pair_bias)
        >>> dq.shape, dpb.shape
        ((1, 8, 64, 4, 32), (1, 1, 4, 64, 64))
    """
    if layout not in _LAYOUTS:
        raise ValueError(f"{_CALL}: argument 'layout': expected one of {tuple(_LAYOUTS)}, "
                         f"got {layout!r}")
    q, k, v = (jnp.asarray(t) for t in (q, k, v))
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        if t.ndim != 5:
            raise ValueError(f"{_CALL}: argument '{name}': expected 5 dimensions ({layout}), "
                             f"got shape {t.shape}")
    mask_bias, pair_bias = _bias_5d(mask_bias, "mask_bias"), _bias_5d(pair_bias, "pair_bias")
    if mask is not None:
        mask = jnp.asarray(mask)
        if mask.dtype != jnp.bool_:
            raise TypeError(f"{_CALL}: argument 'mask': expected a bool array, got {mask.dtype} "
                            "(use mask_bias for an additive float mask)")
    static = (_LAYOUTS[layout], None if scale is None else float(scale), bool(deterministic),
              bool(allow_tf32))
    seq_len = 2 if static[0] == 0 else 3
    empty = q.shape[4] > 0 and (0 in q.shape[:4] or k.shape[seq_len] == 0)
    _validate(q, k, v, mask_bias, pair_bias, mask, static, empty)
    if empty:
        o, lse = _empty_result(q, static[0])
    else:
        o, lse = _attention(q, k, v, mask_bias, pair_bias, mask, static)
    return (o, lse) if return_lse else o

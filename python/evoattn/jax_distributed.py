"""Evoformer attention sharded over devices in JAX (Dynamic Axial Parallelism, shard_map).

The same scheme as ``evoattn.distributed`` for PyTorch: q, k, v and the mask bias sharded over
their N rows along one mesh axis, the forward without communication (bar gathering a sharded
pair bias), the pair bias's gradient summed over the axis with psum. Works under jit and grad.

    mesh = jax.make_mesh((jax.device_count(),), ("rows",))
    o = row_sharded_attention(q, k, v, mask_bias, pair_bias, mesh=mesh, axis="rows")
"""

from typing import Optional

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .jax import evoformer_attention

__all__ = ["row_sharded_attention", "row_to_col", "col_to_row"]



def row_sharded_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                          mask_bias: Optional[jax.Array] = None,
                          pair_bias: Optional[jax.Array] = None, *, mesh: Mesh, axis: str,
                          pair_bias_sharded: bool = False, scale: Optional[float] = None,
                          deterministic: bool = True) -> jax.Array:
    """Evoformer row attention with the N rows sharded over one mesh axis.

    Args:
        q, k, v: [B, N, L, H, D] global arrays, sharded (or to be sharded) over N along ``axis``.
        mask_bias: [B, N, 1, 1, L], sharded like q (or None).
        pair_bias: [B, 1, H, L, L]: replicated over ``axis``, its gradient summed over the
            axis with psum; or with ``pair_bias_sharded=True`` sharded over its query rows
            (dimension 3) along ``axis``, all-gathered for the attention, each shard getting
            its own rows' gradient.
        mesh: the device mesh.
        axis: the mesh axis the rows are sharded over.
        pair_bias_sharded: see pair_bias.
        scale: as in ``evoattn.jax.evoformer_attention`` (default 1/sqrt(D)).
        deterministic: passed to ``evoattn.jax.evoformer_attention``.

    Returns:
        o: [B, N, L, H, D], sharded over N along ``axis``.

    Raises:
        ValueError: N (or a sharded pair bias's query rows) not a multiple of the axis size;
            and as ``evoattn.jax.evoformer_attention`` for bad arguments.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from evoattn.jax_distributed import row_sharded_attention
        >>> mesh = jax.make_mesh((1,), ("rows",))
        >>> q = jnp.ones((1, 2, 8, 2, 16), jnp.float32)
        >>> row_sharded_attention(q, q, q, mesh=mesh, axis="rows").shape
        (1, 2, 8, 2, 16)
    """
    rows = P(None, axis)
    pb_spec = P(None, None, None, axis) if pair_bias_sharded else P()

    def body(q, k, v, mask_bias, pair_bias):
        if pair_bias is not None:
            # Replicated (P()): shard_map's transpose psums its cotangent over the axis.
            if pair_bias_sharded:
                pair_bias = jax.lax.all_gather(pair_bias, axis, axis=3, tiled=True)
        return evoformer_attention(q, k, v, mask_bias, pair_bias, scale=scale,
                                   deterministic=deterministic)

    specs = (rows, rows, rows, None if mask_bias is None else rows,
             None if pair_bias is None else pb_spec)
    args = _placed((q, k, v, mask_bias, pair_bias), specs, mesh)
    # Under jit even when called eagerly: eager shard_map cannot run the custom VJP of
    # evoformer_attention (its symbolic zeros); inside an outer jit this one is inlined.
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=rows, check_vma=False))(*args)


def _placed(args, specs, mesh):
    """Each array resharded to its spec (a no-op where it already is; shard_map wants them so)."""
    return tuple(None if x is None else jax.reshard(x, NamedSharding(mesh, spec))
                 for x, spec in zip(args, specs))


def _swap_sharded_dim(x, mesh, axis, sharded_dim, new_dim):
    """The same global array, its sharding along ``axis`` moved from sharded_dim to new_dim."""
    src, dst = [None] * x.ndim, [None] * x.ndim
    src[sharded_dim], dst[new_dim] = axis, axis
    return jax.shard_map(
        lambda s: jax.lax.all_to_all(s, axis, split_axis=new_dim, concat_axis=sharded_dim, tiled=True),
        mesh=mesh, in_specs=P(*src), out_specs=P(*dst))(*_placed((x,), (P(*src),), mesh))


def row_to_col(x: jax.Array, *, mesh: Mesh, axis: str, row_dim: int = 1,
               col_dim: int = 2) -> jax.Array:
    """Row-sharded to column-sharded (DAP's all-to-all); differentiable.

    Args:
        x: an array sharded over ``row_dim`` along ``axis``.
        mesh, axis: the mesh and its axis.
        row_dim, col_dim: the sharded dimension and the one to shard instead.

    Returns:
        The same global array, sharded over ``col_dim`` along ``axis``.

    Raises:
        ValueError: x.shape[col_dim] not a multiple of the axis size.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> mesh = jax.make_mesh((1,), ("rows",))
        >>> row_to_col(jnp.zeros((1, 4, 8, 16)), mesh=mesh, axis="rows").shape
        (1, 4, 8, 16)
    """
    return _swap_sharded_dim(x, mesh, axis, row_dim, col_dim)


def col_to_row(x: jax.Array, *, mesh: Mesh, axis: str, row_dim: int = 1,
               col_dim: int = 2) -> jax.Array:
    """Column-sharded back to row-sharded: the inverse of :func:`row_to_col`.

    Args:
        x: an array sharded over ``col_dim`` along ``axis``.
        mesh, axis: the mesh and its axis.
        row_dim, col_dim: as in :func:`row_to_col`.

    Returns:
        The same global array, sharded over ``row_dim`` along ``axis``.

    Raises:
        ValueError: x.shape[row_dim] not a multiple of the axis size.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> mesh = jax.make_mesh((1,), ("rows",))
        >>> col_to_row(jnp.zeros((1, 4, 8, 16)), mesh=mesh, axis="rows").shape
        (1, 4, 8, 16)
    """
    return _swap_sharded_dim(x, mesh, axis, col_dim, row_dim)

"""Evoformer attention sharded over GPUs with torch.distributed (Dynamic Axial Parallelism).

The pair and MSA tensors are sharded over their N rows: each rank holds N/P rows of q, k, v
and of the mask bias. Row attention then needs no communication in the forward; the pair bias
is shared by every row, so its gradient is a sum over all ranks' rows. Column attention needs
the other axis sharded: :func:`row_to_col` and :func:`col_to_row` are the differentiable
all-to-alls that swap the sharded axis between the two.

Every reduction here sums the ranks' contributions in rank order, in float32, after one
all-to-all: the result is bitwise identical on every rank and from run to run, whichever rank
finishes first (NCCL's own all-reduce does not promise that). Works with any process group
whose backend has ``all_to_all_single`` and ``all_gather`` (NCCL for CUDA tensors, gloo for
CPU tensors).

    import torch.distributed as dist
    from evoattn.distributed import row_sharded_attention, row_to_col

    o = row_sharded_attention(q, k, v, mask_bias, pair_bias)       # q: [B, N/P, L, H, D]
    z_cols = row_to_col(z)                                          # [B, N/P, L, C] -> [B, N, L/P, C]
"""

from typing import List, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from . import torch as _evo_torch

__all__ = ["row_sharded_attention", "gather_rows", "row_to_col", "col_to_row",
           "all_reduce_ordered"]

_CALL = "evoattn.distributed"


def _world(group) -> int:
    return dist.get_world_size(group)


def _check_divisible(size: int, parts: int, what: str, call: str) -> None:
    if size % parts != 0:
        raise ValueError(f"{call}: {what} is {size}, not a multiple of the group's {parts} ranks")


def _all_to_all_chunks(x: Tensor, dim: int, group) -> Tensor:
    """Splits x into P chunks along dim and sends chunk r to rank r; returns the chunks received,
    stacked in rank order: [P, *chunk shape]."""
    parts = _world(group)
    send = torch.stack(x.chunk(parts, dim=dim)).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv


def _sum_in_rank_order(chunks: Tensor, dtype: torch.dtype) -> Tensor:
    acc = chunks[0].float()
    for r in range(1, chunks.shape[0]):
        acc = acc + chunks[r].float()
    return acc.to(dtype)


def _reduce_scatter_ordered(x: Tensor, dim: int, group) -> Tensor:
    """Sum over ranks of x, scattered along dim: this rank's 1/P of it, summed in rank order."""
    return _sum_in_rank_order(_all_to_all_chunks(x, dim, group), x.dtype)


def _all_gather_cat(x: Tensor, dim: int, group) -> Tensor:
    parts: List[Tensor] = [torch.empty_like(x) for _ in range(_world(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def all_reduce_ordered(x: Tensor, group=None) -> Tensor:
    """The sum of x over the group's ranks, bitwise identical on every rank and every run.

    One all-to-all of P slices (each rank sums its slice over the ranks in rank order, in
    float32) and one all-gather: the bytes of a ring all-reduce, 2·(P−1)/P of x per rank.

    Args:
        x: the same shape and dtype on every rank.
        group: the process group (default: the world).

    Returns:
        A new tensor with the sum.

    Raises:
        RuntimeError: from torch.distributed (no process group, a backend without
            all_to_all_single).

    Example:
        >>> import tempfile, torch, torch.distributed as dist
        >>> if not dist.is_initialized():
        ...     dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(),
        ...                             rank=0, world_size=1)
        >>> all_reduce_ordered(torch.ones(3))
        tensor([1., 1., 1.])
    """
    parts = _world(group)
    flat = x.reshape(-1)
    pad = (-flat.numel()) % parts
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    mine = _reduce_scatter_ordered(flat, 0, group)
    total = _all_gather_cat(mine, 0, group)
    return total[: x.numel()].reshape(x.shape)


class _SumGradOverRanks(torch.autograd.Function):
    """Identity forward; the backward sums the gradient over the ranks (rank order)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce_ordered(grad, ctx.group), None


class _GatherRows(torch.autograd.Function):
    """All-gather along dim; the backward reduce-scatters the gradient back (rank order)."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return _all_gather_cat(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_ordered(grad, ctx.dim, ctx.group), None, None


class _AllToAll(torch.autograd.Function):
    """Scatter along scatter_dim, gather along gather_dim; the backward is the reverse swap."""

    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return torch.cat(list(_all_to_all_chunks(x, scatter_dim, group)), dim=gather_dim)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _AllToAll.apply(grad, gather_dim, scatter_dim, ctx.group), None, None, None


def gather_rows(pair_bias_rows: Tensor, group=None) -> Tensor:
    """The whole pair bias from each rank's query rows of it, differentiably.

    Args:
        pair_bias_rows: [B, 1, H, Lq/P, Lk], rank r holding query rows r·Lq/P to (r+1)·Lq/P − 1
            (as each rank computes them from its own rows of the pair representation).
        group: the process group (default: the world).

    Returns:
        [B, 1, H, Lq, Lk] on every rank. Its gradient goes back to each rank's rows, summed over
        the ranks in rank order.

    Raises:
        ValueError: pair_bias_rows is not 5-D.

    Example:
        >>> import tempfile, torch, torch.distributed as dist
        >>> if not dist.is_initialized():
        ...     dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(),
        ...                             rank=0, world_size=1)
        >>> gather_rows(torch.zeros(1, 1, 4, 8, 8)).shape
        torch.Size([1, 1, 4, 8, 8])
    """
    if pair_bias_rows.dim() != 5:
        raise ValueError(f"{_CALL}.gather_rows: argument 'pair_bias_rows': expected 5 dimensions "
                         f"[B, 1, H, Lq/P, Lk], got {list(pair_bias_rows.shape)}")
    return _GatherRows.apply(pair_bias_rows, 3, group)


def row_to_col(x: Tensor, group=None, row_dim: int = 1, col_dim: int = 2) -> Tensor:
    """Row-sharded to column-sharded, differentiably (DAP's all-to-all).

    Args:
        x: [..., N/P (row_dim), L (col_dim), ...], this rank's rows.
        group: the process group (default: the world).
        row_dim, col_dim: the sharded and the to-be-sharded dimension (default 1 and 2, as in
            [B, N, L, C] and [B, N, L, H, D]).

    Returns:
        [..., N, L/P, ...]: every row, this rank's columns (rank r: columns r·L/P onwards).

    Raises:
        ValueError: x.shape[col_dim] is not a multiple of the group's size.

    Example:
        >>> import tempfile, torch, torch.distributed as dist
        >>> if not dist.is_initialized():
        ...     dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(),
        ...                             rank=0, world_size=1)
        >>> row_to_col(torch.zeros(1, 4, 8, 16)).shape    # [B, N/P, L, C] -> [B, N, L/P, C]
        torch.Size([1, 4, 8, 16])
    """
    _check_divisible(x.shape[col_dim], _world(group), f"dimension {col_dim}", f"{_CALL}.row_to_col")
    return _AllToAll.apply(x, col_dim, row_dim, group)


def col_to_row(x: Tensor, group=None, row_dim: int = 1, col_dim: int = 2) -> Tensor:
    """Column-sharded back to row-sharded, differentiably: the inverse of :func:`row_to_col`.

    Args:
        x: [..., N (row_dim), L/P (col_dim), ...], this rank's columns.
        group: the process group (default: the world).
        row_dim, col_dim: as in :func:`row_to_col`.

    Returns:
        [..., N/P, L, ...]: this rank's rows, every column.

    Raises:
        ValueError: x.shape[row_dim] is not a multiple of the group's size.

    Example:
        >>> import tempfile, torch, torch.distributed as dist
        >>> if not dist.is_initialized():
        ...     dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(),
        ...                             rank=0, world_size=1)
        >>> col_to_row(torch.zeros(1, 4, 8, 16)).shape
        torch.Size([1, 4, 8, 16])
    """
    _check_divisible(x.shape[row_dim], _world(group), f"dimension {row_dim}", f"{_CALL}.col_to_row")
    return _AllToAll.apply(x, row_dim, col_dim, group)


def row_sharded_attention(q: Tensor, k: Tensor, v: Tensor, mask_bias: Optional[Tensor] = None,
                          pair_bias: Optional[Tensor] = None, mask: Optional[Tensor] = None,
                          scale: Optional[float] = None, *, group=None,
                          pair_bias_sharded: bool = False, deterministic: bool = True) -> Tensor:
    """Evoformer row attention with the N rows sharded over a process group.

    Each rank calls it with its own rows; the forward communicates only to gather a sharded
    pair bias. The backward sums the pair bias's gradient over the ranks in rank order, so it
    is bitwise identical on every rank and from run to run.

    Args:
        q, k, v: [B, N/P, L, H, D], this rank's rows.
        mask_bias: [B, N/P, 1, 1, L], this rank's rows (or None).
        pair_bias: with ``pair_bias_sharded=False``, [B, 1, H, L, L], the same on every rank;
            its gradient is the sum over every rank's rows (do not all-reduce it again). With
            ``pair_bias_sharded=True``, [B, 1, H, L/P, L], this rank's query rows of it: it is
            all-gathered, and each rank gets the gradient of its own rows.
        mask: boolean [B, N/P, L] (or None).
        scale: as in ``evoattn.torch.evoformer_attention`` (default 1/sqrt(D)).
        group: the process group (default: the world).
        pair_bias_sharded: see pair_bias.
        deterministic: passed to ``evoattn.torch.evoformer_attention``.

    Returns:
        o: [B, N/P, L, H, D], this rank's rows.

    Raises:
        ValueError: a sharded pair bias that is not 5-D; and as
            ``evoattn.torch.evoformer_attention`` for bad arguments.

    Example:
        >>> import tempfile, torch, torch.distributed as dist
        >>> if not dist.is_initialized():
        ...     dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(),
        ...                             rank=0, world_size=1)
        >>> q = torch.randn(1, 2, 8, 4, 16, requires_grad=True)   # this rank's 2 rows
        >>> pair_bias = torch.randn(1, 1, 4, 8, 8, requires_grad=True)
        >>> o = row_sharded_attention(q, q, q, None, pair_bias)
        >>> o.sum().backward()
        >>> o.shape, pair_bias.grad.shape
        (torch.Size([1, 2, 8, 4, 16]), torch.Size([1, 1, 4, 8, 8]))
    """
    if pair_bias is not None:
        if pair_bias_sharded:
            pair_bias = gather_rows(pair_bias, group)
        elif pair_bias.requires_grad:
            pair_bias = _SumGradOverRanks.apply(pair_bias, group)
    return _evo_torch.evoformer_attention(q, k, v, mask_bias, pair_bias, mask, scale,
                                          deterministic=deterministic)

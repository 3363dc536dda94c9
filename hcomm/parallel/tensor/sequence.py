"""Sequence parallelism over uneven shards: the norm and residual regions hold only this rank's tokens.

Between tensor-parallel regions, Megatron's sequence parallelism keeps each
rank's slice of the sequence instead of the whole activation: the all-reduce
that leaves a row-parallel layer becomes a reduce-scatter over the sequence,
and the copy that enters a column-parallel layer an all-gather.  The same
bytes move; the norms, residual adds and their saved activations shrink to
the rank's slice.  Slices are uneven here (``split_sizes`` of the sequence by
the TP fractions), so the collectives are hcomm's ``reduce_scatter_v`` /
``all_gather_v`` over the sequence-major layout [S, B, D], where a rank's
tokens are one contiguous block.

The norms' weights then see only their rank's tokens: ``sum_grad_over``
adds their gradients across the group in backward.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from hcomm.parallel.tensor.comm import timed


def _gather(local: torch.Tensor, sizes: Sequence[int], group) -> torch.Tensor:
    """[B, s_r, D] -> [B, S, D]."""
    import hcomm

    batch, _, dim = local.shape
    out = torch.empty(sum(sizes) * batch * dim, dtype=local.dtype)
    mine = local.transpose(0, 1).contiguous().view(-1)
    with timed():   # a member's wait for its partners is not its own work (the straggler watch)
        hcomm.all_gather_v(out, mine, [s * batch * dim for s in sizes], group=group)
    return out.view(sum(sizes), batch, dim).transpose(0, 1)


def _scatter(full: torch.Tensor, sizes: Sequence[int], rank: int, group) -> torch.Tensor:
    """[B, S, D] partial sums -> this rank's [B, s_r, D] of their sum over the group."""
    import hcomm

    batch, _, dim = full.shape
    out = torch.empty(sizes[rank] * batch * dim, dtype=full.dtype)
    whole = full.transpose(0, 1).contiguous().view(-1)
    with timed():
        hcomm.reduce_scatter_v(out, whole, [s * batch * dim for s in sizes], group=group)
    return out.view(sizes[rank], batch, dim).transpose(0, 1)


class _GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local, sizes, rank, group):
        ctx.sizes, ctx.rank, ctx.group = sizes, rank, group
        return _gather(local, sizes, group)

    @staticmethod
    def backward(ctx, grad):
        return _scatter(grad, ctx.sizes, ctx.rank, ctx.group), None, None, None


class _ScatterSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, full, sizes, rank, group):
        ctx.sizes, ctx.group = sizes, group
        return _scatter(full, sizes, rank, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, ctx.sizes, ctx.group), None, None, None


def gather_seq(local: torch.Tensor, sizes: Sequence[int], rank: int, group) -> torch.Tensor:
    """Enter a column-parallel region from a sequence slice (backward: reduce-scatter of the gradient)."""
    return _GatherSeq.apply(local, list(sizes), rank, group)


def scatter_seq(full: torch.Tensor, sizes: Sequence[int], rank: int, group) -> torch.Tensor:
    """Leave a row-parallel region into a sequence slice (backward: all-gather of the gradient)."""
    return _ScatterSeq.apply(full, list(sizes), rank, group)


def sum_grad_over(param: torch.nn.Parameter, group) -> None:
    """In backward, replace ``param``'s gradient by its sum over ``group`` (a weight that saw only this
    rank's tokens).  Every rank runs the same graph, so the hooks' all-reduces pair up in order."""
    def hook(grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=group)
        return grad

    param.register_hook(hook)

"""The two conjugate collectives of tensor parallelism, as autograd functions.

``copy_to(x)`` enters a column-parallel region: identity forward, the
input gradient summed over the TP group backward (every rank's partial
columns contributed to it).  ``reduce_from(x)`` leaves a row-parallel
region: the partial outputs summed forward, identity backward.  Shard sizes
never appear here: both move whole activations, which is why uneven shards
cost no extra communication.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


class _CopyTo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFrom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to(x: torch.Tensor, group) -> torch.Tensor:
    return _CopyTo.apply(x, group)


def reduce_from(x: torch.Tensor, group) -> torch.Tensor:
    return _ReduceFrom.apply(x, group)

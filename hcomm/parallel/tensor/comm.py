"""The two conjugate collectives of tensor parallelism, as autograd functions.

``copy_to(x)`` enters a column-parallel region: identity forward, the
input gradient summed over the TP group backward (every rank's partial
columns contributed to it).  ``reduce_from(x)`` leaves a row-parallel
region: the partial outputs summed forward, identity backward.  Shard sizes
never appear here: both move whole activations, which is why uneven shards
cost no extra communication.

Every TP collective of this package is timed (``all_reduce`` here, sequence parallelism's gathers and
scatters in ``timed()``): ``waited_s()`` is how long this process has spent inside them.  Inside one a rank also waits for its slowest partner to arrive, so a rank's
compute less that time is its own speed (the straggler watch tells the slow member from the partners
that wait for it).
"""
from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist

_waited = [0.0]


def waited_s() -> float:
    """Seconds this process has spent inside TP collectives so far (take differences)."""
    return _waited[0]


@contextlib.contextmanager
def timed():
    """The seconds inside the block count as time inside a TP collective (``waited_s``): every TP
    collective runs in one (sequence parallelism's gathers and scatters too)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        _waited[0] += time.perf_counter() - start


def all_reduce(tensor: torch.Tensor, group, op=dist.ReduceOp.SUM) -> None:
    with timed():
        dist.all_reduce(tensor, op=op, group=group)


class _CopyTo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        all_reduce(grad, ctx.group)
        return grad, None


class _ReduceFrom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        out = x.contiguous().clone()
        all_reduce(out, group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to(x: torch.Tensor, group) -> torch.Tensor:
    return _CopyTo.apply(x, group)


def reduce_from(x: torch.Tensor, group) -> torch.Tensor:
    return _ReduceFrom.apply(x, group)

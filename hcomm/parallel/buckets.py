"""Gradient buckets: parameters packed into flat buffers in backward order.

A bucket owns one flat buffer and every parameter in it gets its ``.grad``
as a view of that buffer (DDP's ``gradient_as_bucket_view``), so autograd
accumulates straight into what is sent: no copy before or after the
collective.  Parameters are packed in reverse registration order, which is
close to the order backward produces their gradients, so the first bucket
fills first and its collective overlaps the rest of backward.

Why our own and not DDP's Reducer: DDP averages over ranks and needs every
rank to run forward and backward; an uneven plan weights each rank by its
sample count and lets a zero-share rank join the reduction without running
the model at all.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Sequence

import torch


@dataclass
class Bucket:
    index: int
    params: List[torch.nn.Parameter]
    buffer: torch.Tensor                      # flat; views of it are the params' .grad
    offsets: List[int] = field(default_factory=list)
    extra: int = 0                            # trailing slots for scalars riding along (the loss)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def view_of(self, i: int) -> torch.Tensor:
        p = self.params[i]
        return self.buffer[self.offsets[i]: self.offsets[i] + p.numel()].view_as(p)

    def extra_slots(self) -> torch.Tensor:
        return self.buffer[self.buffer.numel() - self.extra:]


def unique_trainable(params: Sequence[torch.nn.Parameter]) -> List[torch.nn.Parameter]:
    """Trainable parameters, each once (tied weights appear once)."""
    seen, out = set(), []
    for p in params:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def pack(params: Sequence[torch.nn.Parameter], bucket_bytes: int, extra_slots: int = 0) -> List[Bucket]:
    """Buckets of at most ``bucket_bytes`` (a parameter larger than that gets its own).

    Parameters of different dtypes never share a bucket.  ``extra_slots``
    trailing elements in the last bucket carry scalars with the gradients
    (the step's loss).
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    groups: List[List[torch.nn.Parameter]] = []
    current: List[torch.nn.Parameter] = []
    size = 0
    for p in reversed(list(params)):
        nbytes = p.numel() * p.element_size()
        if current and (size + nbytes > bucket_bytes or p.dtype != current[0].dtype):
            groups.append(current)
            current, size = [], 0
        current.append(p)
        size += nbytes
    if current:
        groups.append(current)
    buckets = []
    for index, members in enumerate(groups):
        extra = extra_slots if index == len(groups) - 1 else 0
        offsets, total = [], 0
        for p in members:
            offsets.append(total)
            total += p.numel()
        buffer = torch.zeros(total + extra, dtype=members[0].dtype, device=members[0].device)
        buckets.append(Bucket(index, members, buffer, offsets, extra))
    return buckets


def attach_grads(buckets: Sequence[Bucket]) -> Dict[int, tuple]:
    """Point every parameter's ``.grad`` at its bucket view; id(param) -> (bucket, slot)."""
    where = {}
    for b in buckets:
        for i, p in enumerate(b.params):
            p.grad = b.view_of(i)
            where[id(p)] = (b.index, i)
    return where

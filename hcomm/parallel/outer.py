"""Island-aware reduced-frequency sync (DiLoCo-style outer steps).

Inside an island ranks synchronise gradients every step (GradSync over the
island's group, weighted by each rank's share of the island's samples).
Across islands, every ``H`` steps, each island's parameter change since the
last outer step ``delta_i = anchor - params_i`` is averaged over islands,
weighted by each island's share of the global batch, and an outer optimizer
(SGD with Nesterov momentum, DiLoCo's choice) applies it to the anchor;
every rank then continues from the new anchor.

Only the outer step crosses the weak link, so the slow tier carries the
parameters once per ``H`` steps instead of the gradients every step.  The
outer all-reduce runs over the global group: every member of an island holds
the same parameters, so each rank contributes ``delta * (N_i / N) / |i|``
and hcomm's hierarchical all-reduce moves one copy of each shard between
islands (optionally compressed on that tier).

With ``H = 1``, outer lr 1 and no momentum the outer step is the weighted
average of the islands' parameters after their inner steps, which for an
inner SGD step equals plain data parallelism over all ranks: the equivalence
test of this module.
"""
from __future__ import annotations

import time
from typing import List, Sequence

import torch
import torch.distributed as dist

from hcomm.parallel.buckets import unique_trainable


class OuterSync:
    def __init__(self, model: torch.nn.Module, group, *, every: int, island_weight: float, island_size: int,
                 lr: float = 0.7, momentum: float = 0.9, bucket_bytes: int = 64 << 20):
        if every < 1:
            raise ValueError(f"sync_every must be >= 1, got {every}")
        if island_size < 1:
            raise ValueError(f"island_size must be >= 1, got {island_size}")
        self.group = group
        self.every = every
        self.scale = float(island_weight) / island_size
        self.params = unique_trainable(list(model.parameters()))
        # The anchor is the last globally agreed parameters; its .grad holds the averaged delta.
        self.anchor = [p.detach().clone() for p in self.params]
        nesterov = momentum > 0
        self.optimizer = torch.optim.SGD(self.anchor, lr=lr, momentum=momentum, nesterov=nesterov)
        self.bucket_bytes = bucket_bytes
        self.outer_steps = 0

    def due(self, step: int) -> bool:
        """Whether the outer step follows inner step ``step`` (0-based)."""
        return (step + 1) % self.every == 0

    def step(self) -> float:
        """Average the islands' deltas, take the outer step, reset every rank to the anchor; seconds."""
        start = time.perf_counter()
        deltas = [(a - p.detach()).mul_(self.scale) for a, p in zip(self.anchor, self.params)]
        for flat, members in _flat_buckets(deltas, self.bucket_bytes):
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
            offset = 0
            for d in members:
                d.copy_(flat[offset: offset + d.numel()].view_as(d))
                offset += d.numel()
        for a, d in zip(self.anchor, deltas):
            a.grad = d
        self.optimizer.step()
        with torch.no_grad():
            for a, p in zip(self.anchor, self.params):
                p.copy_(a)
        self.outer_steps += 1
        return time.perf_counter() - start


def _flat_buckets(tensors: Sequence[torch.Tensor], bucket_bytes: int):
    """(flat copy, members) groups of at most ``bucket_bytes`` each."""
    group: List[torch.Tensor] = []
    size = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if group and size + nbytes > bucket_bytes:
            yield torch.cat([g.reshape(-1) for g in group]), group
            group, size = [], 0
        group.append(t)
        size += nbytes
    if group:
        yield torch.cat([g.reshape(-1) for g in group]), group

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

With ``overlap`` the outer all-reduce is launched and training goes on: the
average arrives while the islands run their next H inner steps and is
applied at the next outer step, keeping each island's progress since the
launch (params = new anchor + (params now - params at launch)), as
Streaming DiLoCo overlaps its outer communication.  The weak link is then
off the critical path, at the price of applying the outer step one period
late; ``finish()`` applies the last one and takes a final synchronous outer
step so every rank ends with the same parameters.

With ``H = 1``, outer lr 1 and no momentum the outer step is the weighted
average of the islands' parameters after their inner steps, which for an
inner SGD step equals plain data parallelism over all ranks: the equivalence
test of this module.
"""
from __future__ import annotations

import time
from typing import List

import torch
import torch.distributed as dist

from hcomm.parallel.buckets import unique_trainable


class OuterSync:
    def __init__(self, model: torch.nn.Module, group, *, every: int, island_weight: float, island_size: int,
                 lr: float = 0.7, momentum: float = 0.9, overlap: bool = False):
        if every < 1:
            raise ValueError(f"sync_every must be >= 1, got {every}")
        if island_size < 1:
            raise ValueError(f"island_size must be >= 1, got {island_size}")
        self.group = group
        self.every = every
        self.scale = float(island_weight) / island_size
        self.overlap = overlap
        self.params = unique_trainable(list(model.parameters()))
        # The anchor (the last globally agreed parameters) lives in one flat tensor: the delta is one
        # all-reduce and the outer optimizer one fused update.  Its .grad holds the averaged delta.
        self.anchor = torch.nn.Parameter(torch.cat([p.detach().reshape(-1) for p in self.params]))
        self.delta = torch.zeros_like(self.anchor)
        self.optimizer = torch.optim.SGD([self.anchor], lr=lr, momentum=momentum, nesterov=momentum > 0)
        self._launched_from = None   # overlap: parameters when the pending all-reduce left
        self._work = None
        self.outer_steps = 0

    def due(self, step: int) -> bool:
        """Whether the outer step follows inner step ``step`` (0-based)."""
        return (step + 1) % self.every == 0

    def step(self) -> float:
        """The outer step (or, overlapped, apply the previous one and launch this one); seconds."""
        start = time.perf_counter()
        if self._work is not None:  # overlapped: the previous average has arrived by now
            self._work.wait()
            self._apply(self._launched_from)
            self._work = None
        self._launched_from = self._flat_params()
        self._launch(self._launched_from)
        if not self.overlap:
            self._work.wait()
            self._apply(None)
            self._work = None
        return time.perf_counter() - start

    def finish(self, steps_done: int) -> float:
        """After the last inner step: apply what is in flight and agree on the parameters; seconds."""
        if not self.overlap and steps_done > 0 and self.due(steps_done - 1):
            return 0.0  # the last step was a synchronous outer step: everyone agrees already
        start = time.perf_counter()
        overlap, self.overlap = self.overlap, False
        try:
            self.step()
        finally:
            self.overlap = overlap
        return time.perf_counter() - start

    def _flat_params(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def _launch(self, flat_params: torch.Tensor) -> None:
        # delta_i * (N_i / N) / |i|: summed over every rank, the island-weighted mean of the deltas
        torch.sub(self.anchor.detach(), flat_params, out=self.delta)
        self.delta.mul_(self.scale)
        self._work = dist.all_reduce(self.delta, op=dist.ReduceOp.SUM, group=self.group, async_op=True)

    def _apply(self, launched_from) -> None:
        """Outer optimizer step on the anchor, then every rank takes the new anchor: exactly (bitwise
        the same everywhere) when nothing ran since the launch, else plus its progress since then."""
        self.anchor.grad = self.delta
        self.optimizer.step()
        self.anchor.grad = None
        with torch.no_grad():
            target = self.anchor.detach()
            if launched_from is not None:
                target = target + (self._flat_params() - launched_from)
            offset = 0
            for p in self.params:
                p.copy_(target[offset: offset + p.numel()].view_as(p))
                offset += p.numel()
        self.outer_steps += 1

"""Heterogeneous data parallelism: uneven batches, exact weighted gradients.

Each rank runs its plan share ``n_r`` of the global batch ``N`` and computes
the mean loss over its own samples.  The global-batch gradient is
``g = sum_r (n_r / N) * g_r``: each bucket is scaled by ``n_r / N`` before
a SUM all-reduce, never a plain mean of per-rank means (which would weight a
rank with 2 samples like one with 20).  A rank with share 0 runs no model at
all and contributes zeros, so a slow card can still hold optimizer work or a
pipeline stage later without slowing data parallelism.

Gradients are reduced in buckets (see buckets.py) launched from
``post_accumulate_grad`` hooks while backward is still running, in bucket
order on every rank so that collectives match.  The group is normally an
hcomm group, so each bucket goes through hcomm's hierarchical all-reduce
(and its weak-tier compression, set per group); any torch group works.

Usage (the trainer does this)::

    sync = GradSync(model, group, weight=n_r / N, bucket_bytes=plan_group.bucket_bytes)
    sync.zero_grad()
    with sync.accumulating():          # micro-batches before the last: no communication
        loss_0.backward()
    loss_last.backward()               # hooks launch buckets as they fill
    sync.wait()                        # every bucket reduced; .grad holds the global gradient
    optimizer.step()
"""
from __future__ import annotations

import contextlib
import time
from typing import List, Optional

import torch
import torch.distributed as dist

from hcomm.parallel.buckets import Bucket, attach_grads, pack, unique_trainable


class GradSync:
    """Hook-driven, bucketed, weighted gradient all-reduce over one group."""

    def __init__(self, model: torch.nn.Module, group, *, weight: float, bucket_bytes: int,
                 carry_loss: bool = True):
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"GradSync weight must be in [0, 1] (n_r / N), got {weight}")
        self.group = group
        self.weight = float(weight)
        self.grad_scale = 1.0   # the loss scale this rank's backward ran with (fp16): unscaled in the reduction
        self.params = unique_trainable(list(model.parameters()))
        if not self.params:
            raise ValueError("GradSync: the model has no trainable parameters")
        self.buckets: List[Bucket] = pack(self.params, bucket_bytes, extra_slots=1 if carry_loss else 0)
        self._where = attach_grads(self.buckets)
        self._ready = [0] * len(self.buckets)
        self._works: List[Optional[object]] = [None] * len(self.buckets)
        self._next = 0              # buckets launch in index order on every rank
        self._accumulating = False
        self._local_loss = 0.0
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for p in self.params]

    # -- the step ---------------------------------------------------------------------------
    def zero_grad(self) -> None:
        """Zero every bucket and re-attach grads (an optimizer's set_to_none may have dropped them)."""
        for b in self.buckets:
            b.buffer.zero_()
        for p in self.params:
            if p.grad is None or not self._is_view(p):
                attach_grads(self.buckets)
                break
        self._ready = [0] * len(self.buckets)
        self._works = [None] * len(self.buckets)
        self._next = 0
        self._local_loss = 0.0

    @contextlib.contextmanager
    def accumulating(self):
        """Backward passes inside only accumulate (DDP's ``no_sync``)."""
        self._accumulating = True
        try:
            yield
        finally:
            self._accumulating = False

    def add_loss(self, local_mean_loss: float) -> None:
        """This rank's mean loss over its samples; ``global_loss()`` returns the weighted sum."""
        self._local_loss += float(local_mean_loss)

    def sync_without_backward(self) -> None:
        """A rank with no samples this step: contribute zeros to every bucket."""
        for index in range(len(self.buckets)):
            self._ready[index] = len(self.buckets[index].params)
        self._launch_ready()

    def wait(self) -> float:
        """Launch what backward did not reach (unused parameters), wait for all; seconds waited."""
        start = time.perf_counter()
        for index, b in enumerate(self.buckets):
            self._ready[index] = len(b.params)
        self._launch_ready()
        for work in self._works:
            work.wait()
        return time.perf_counter() - start

    def global_loss(self) -> float:
        """Mean loss over the global batch (valid after ``wait``; carried in the last bucket)."""
        last = self.buckets[-1]
        if not last.extra:
            raise RuntimeError("GradSync was built with carry_loss=False")
        return float(last.extra_slots()[0])

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    # -- internals --------------------------------------------------------------------------
    def _is_view(self, p: torch.nn.Parameter) -> bool:
        b_index, slot = self._where[id(p)]
        return p.grad.data_ptr() == self.buckets[b_index].view_of(slot).data_ptr()

    def _on_grad(self, p: torch.nn.Parameter) -> None:
        if not self._is_view(p):
            # Someone replaced .grad (set_to_none, a fresh tensor): fold it back into the bucket.
            b_index, slot = self._where[id(p)]
            view = self.buckets[b_index].view_of(slot)
            view.add_(p.grad)
            p.grad = view
        if self._accumulating:
            return
        b_index, _ = self._where[id(p)]
        self._ready[b_index] += 1
        self._launch_ready()

    def _launch_ready(self) -> None:
        while self._next < len(self.buckets) and self._ready[self._next] >= len(self.buckets[self._next].params):
            b = self.buckets[self._next]
            if b.extra:   # pre-scaled so the loss comes out weighted but not unscaled (S is a power of 2: exact)
                b.extra_slots()[0] = self._local_loss * self.grad_scale
            if self.weight == 0.0:
                b.buffer.zero_()  # exact zeros even if a stray NaN was accumulated
            elif self.weight != self.grad_scale:
                b.buffer.mul_(self.weight / self.grad_scale)
            self._works[self._next] = dist.all_reduce(b.buffer, op=dist.ReduceOp.SUM, group=self.group,
                                                      async_op=True)
            self._next += 1

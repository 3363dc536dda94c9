"""Per-device precision: each rank computes in its own dtype, gradients stay consistent.

A mixed cluster has no single right dtype (a V100 has no bf16; an A100 no
fp8), so each rank runs forward and backward under ``torch.autocast`` in the
dtype its plan gives it (``RankPlan.compute_dtype``; ``per_device_dtypes``
picks each device kind's best from ``devices.py``), while everything that
must agree across ranks stays fp32:

- parameters (the master weights) and the optimizer state are fp32; autocast
  only lowers the matmuls' inputs, so gradients land in fp32 ``.grad``;
- an fp16 rank scales its loss by ``S`` (dynamic loss scaling, torch
  ``GradScaler``'s defaults: 2^16, halve on overflow, double after 2000 good
  steps) so small gradients survive fp16, and unscales inside the gradient
  all-reduce: ``GradSync.grad_scale = S`` makes its bucket weight
  ``(n_r / N) / S`` -- no extra pass over the gradients, and the reduced
  gradient is the same fp32 global-batch mean every rank gets;
- an overflow anywhere (a non-finite gradient; a non-finite loss makes its
  gradients non-finite too) skips the optimizer step on every rank: one 1-element MAX all-reduce
  of the flag per step, so ranks never diverge; fp16 ranks then halve S.

fp8 (opt-in on kinds that have it) is bf16 autocast plus fp8 matmuls in the
model's linears (``prepare`` swaps them; hcomm/parallel/fp8.py).

Why not torch's ``GradScaler``: it unscales a rank's own gradients before
its own optimizer and decides overflow per rank; here the unscale belongs
inside the cross-rank reduction (ranks scale differently or not at all) and
the skip must be one decision for all ranks.  The policy and its defaults
are GradScaler's.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence

import torch
import torch.distributed as dist

from hcomm.parallel.devices import best_low_precision, device_kind, supports

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# fp8 is opt-in (a plan's compute_dtype), never a kind's default: its linears' matmuls in fp8 and the
# rest in bf16 (hcomm/parallel/fp8.py)
COMPUTE_DTYPES = (*TORCH_DTYPES, "fp8")
PRECISIONS = ("fp32", "per-device")


def per_device_dtypes(devices: Sequence[str]) -> List[str]:
    """Each device kind's best compute dtype: bf16 where it has it (no loss scaling), else fp16."""
    return [best_low_precision(d) for d in devices]


def check_dtype(rank: int, device: str, dtype: str) -> None:
    """ValueError naming the rank and field when ``device`` cannot compute in ``dtype``."""
    if dtype not in COMPUTE_DTYPES:
        raise ValueError(f"ranks[{rank}].compute_dtype: {dtype!r} is not one of {', '.join(COMPUTE_DTYPES)}")
    if device and not supports(device, dtype):
        kind = device_kind(device)
        raise ValueError(f"ranks[{rank}].compute_dtype: {kind.name} cannot compute in {dtype} ({kind.notes}); "
                         f"it supports {', '.join(kind.dtypes)}")


@dataclass
class LossScale:
    """Dynamic loss scaling with torch GradScaler's defaults (fp16 only; 1.0 otherwise)."""

    scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    good_steps: int = 0

    def update(self, overflow: bool) -> None:
        if overflow:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self.good_steps = 0


class Precision:
    """One rank's compute dtype, its loss scale, and the step-wide overflow agreement."""

    def __init__(self, dtype: str, *, rank: int = 0, device: str = "", device_type: str = "cpu",
                 loss_scaling: Optional[bool] = None):
        """``loss_scaling``: default for fp16 only; a pipeline with any fp16 stage scales on every stage
        (the loss is scaled on the last stage and its gradients flow through all of them), and every
        rank's scale moves in step because the overflow decision is global."""
        check_dtype(rank, device, dtype)
        self.dtype, self.rank = dtype, rank
        self.device_type = device_type
        scaled = dtype == "fp16" if loss_scaling is None else loss_scaling
        self.loss_scale = LossScale() if scaled else None
        self.skipped_steps = 0

    @property
    def scale(self) -> float:
        """What the loss is multiplied by before backward (and the gradients divided by in the reduction)."""
        return self.loss_scale.scale if self.loss_scale is not None else 1.0

    def prepare(self, model: torch.nn.Module) -> None:
        """fp8: swap the model's linears (not the head) to fp8 matmuls, same Parameters; others: nothing."""
        if self.dtype == "fp8":
            from hcomm.parallel.fp8 import enable_fp8_linears

            enable_fp8_linears(model)

    def autocast(self):
        if self.dtype == "fp32":
            return contextlib.nullcontext()
        if self.dtype != "fp8":
            return torch.autocast(self.device_type, dtype=TORCH_DTYPES[self.dtype])
        from hcomm.parallel.fp8 import any_swapped, fp8_active

        if not any_swapped():   # else the rank would silently train in bf16
            raise RuntimeError(f"ranks[{self.rank}].compute_dtype: fp8 needs Precision.prepare(model) "
                               f"before the first forward")
        stack = contextlib.ExitStack()   # everything but the swapped linears' matmuls in bf16
        stack.enter_context(torch.autocast(self.device_type, dtype=torch.bfloat16))
        stack.enter_context(fp8_active())
        return stack

    def overflow(self, grads: Iterable[torch.Tensor], group) -> bool:
        """Whether any rank holds a non-finite gradient this step (collective over ``group``: every
        rank gets the same answer); updates the loss scale and counts the skip."""
        bad = False
        for g in grads:
            if g is not None and not bool(torch.isfinite(g).all()):
                bad = True
                break
        flag = torch.tensor([1.0 if bad else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        overflow = bool(flag.item() > 0)
        if self.loss_scale is not None:
            self.loss_scale.update(overflow)
        if overflow:
            self.skipped_steps += 1
        return overflow

"""Column- and row-parallel linear layers whose shards have any sizes, cut from a full layer.

Each is built from the unsharded ``nn.Linear`` by slicing its weight
(``rows`` = output features for column-parallel, ``cols`` = input features
for row-parallel), so a sharded model starts from exactly the unsharded
model's values and equivalence tests compare like with like.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from hcomm.parallel.tensor.comm import copy_to, reduce_from


def _slice_weight(weight: torch.Tensor, dim: int, start: int, size: int) -> nn.Parameter:
    return nn.Parameter(weight.detach().narrow(dim, start, size).clone())


class ColumnParallelLinear(nn.Module):
    """y_local = x W[start:start+size]^T: this rank's output features; the input enters the TP
    region (gradient summed over the group).  ``enter=False`` when the caller already did it (several
    column layers reading one input share one ``copy_to``)."""

    def __init__(self, full: nn.Linear, start: int, size: int, group, enter: bool = True):
        super().__init__()
        if full.bias is not None:
            raise ValueError("ColumnParallelLinear: layers with a bias are not supported (the reference model has none)")
        self.weight = _slice_weight(full.weight, 0, start, size)
        self.start, self.size, self.group, self.enter = start, size, group, enter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to(x, self.group) if self.enter else x, self.weight)

    def extra_repr(self) -> str:
        return f"out_features [{self.start}, {self.start + self.size})"


class RowParallelLinear(nn.Module):
    """y = sum over the group of x_local W[:, start:start+size]^T: this rank's input features; the
    partial outputs are summed (all-reduce) so every rank leaves with the whole output."""

    def __init__(self, full: nn.Linear, start: int, size: int, group, leave: Optional[Callable] = None):
        super().__init__()
        if full.bias is not None:
            raise ValueError("RowParallelLinear: layers with a bias are not supported (the reference model has none)")
        self.weight = _slice_weight(full.weight, 1, start, size)
        self.start, self.size, self.group = start, size, group
        self.leave = leave   # how partial outputs are summed (sequence parallelism: a reduce-scatter)

    def forward(self, x_local: torch.Tensor) -> torch.Tensor:
        # summed in fp32: ranks of one group may compute in different dtypes (per-device precision)
        partial = F.linear(x_local, self.weight).float()
        return self.leave(partial) if self.leave is not None else reduce_from(partial, self.group)

    def extra_repr(self) -> str:
        return f"in_features [{self.start}, {self.start + self.size})"


def rows_of(sizes: Sequence[int], rank: int):
    """(start, size) of ``rank`` in a split."""
    return sum(sizes[:rank]), sizes[rank]

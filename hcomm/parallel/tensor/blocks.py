"""The reference model's attention and SwiGLU MLP, split unevenly over a TP group.

Attention splits by key/value heads, each with the query heads that read it
(grouped-query attention keeps its groups whole; with plain multi-head
attention a unit is one head): the query, key and value projections are
column-parallel over this rank's heads, the output projection row-parallel.
The MLP's w1 and w3 are column-parallel over its share of the hidden
features, w2 row-parallel.  One ``copy_to`` per block input, one
``reduce_from`` per block output: two all-reduces forward and two backward
per block, whatever the split.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from hcomm.models.llama import Attention, FeedForward
from hcomm.parallel.tensor.comm import copy_to
from hcomm.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear, rows_of


class TPAttention(nn.Module):
    def __init__(self, full: Attention, kv_heads: Sequence[int], rank: int, group, seq=None):
        super().__init__()
        self.seq = seq   # sequence parallelism (parallelize.SequenceSlices) or None
        if sum(kv_heads) != full.n_kv_heads:
            raise ValueError(f"TP attention: kv head split {list(kv_heads)} does not sum to {full.n_kv_heads}")
        per_kv = full.n_heads // full.n_kv_heads
        hd = full.head_dim
        kv_start, kv_size = rows_of(kv_heads, rank)
        self.n_heads, self.n_kv_heads, self.head_dim, self.group = kv_size * per_kv, kv_size, hd, group
        q_start = kv_start * per_kv
        self.wq = ColumnParallelLinear(full.wq, q_start * hd, self.n_heads * hd, group, enter=False)
        self.wk = ColumnParallelLinear(full.wk, kv_start * hd, kv_size * hd, group, enter=False)
        self.wv = ColumnParallelLinear(full.wv, kv_start * hd, kv_size * hd, group, enter=False)
        self.wo = RowParallelLinear(full.wo, q_start * hd, self.n_heads * hd, group,
                                    leave=seq.scatter if seq is not None else None)
        self.max_seq_len = full.max_seq_len
        self.register_buffer("rope_cos", full.rope_cos.clone(), persistent=False)
        self.register_buffer("rope_sin", full.rope_sin.clone(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The reference attention on this rank's heads: its projections here are the shards, and the
        # output projection sums (or reduce-scatters) the partial outputs over the group.
        return Attention.forward(self, self.seq.gather(x) if self.seq is not None else copy_to(x, self.group))


class TPFeedForward(nn.Module):
    def __init__(self, full: FeedForward, hidden: Sequence[int], rank: int, group, seq=None):
        super().__init__()
        self.seq = seq
        total = full.w1.weight.shape[0]
        if sum(hidden) != total:
            raise ValueError(f"TP MLP: hidden split {list(hidden)} does not sum to {total}")
        start, size = rows_of(hidden, rank)
        self.group = group
        self.w1 = ColumnParallelLinear(full.w1, start, size, group, enter=False)
        self.w3 = ColumnParallelLinear(full.w3, start, size, group, enter=False)
        self.w2 = RowParallelLinear(full.w2, start, size, group, leave=seq.scatter if seq is not None else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return FeedForward.forward(self, self.seq.gather(x) if self.seq is not None else copy_to(x, self.group))

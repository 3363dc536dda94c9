"""Vocabulary-parallel embedding and head with uneven vocabulary ranges, and their cross entropy.

Each rank holds rows [start, start + size) of the embedding and of the head.
The embedding looks up the tokens in its range (zeros elsewhere) and the
group sums.  The head's logits stay split: the cross entropy is computed
from three all-reduces over [tokens] vectors (max, sum of exponentials,
the target's logit), never gathering [tokens, vocab] logits, in fp32 as the
reference model's loss is.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hcomm.parallel.tensor.comm import all_reduce, copy_to, reduce_from


class VocabParallelEmbedding(nn.Module):
    def __init__(self, full: nn.Embedding, start: int, size: int, group, seq=None):
        super().__init__()
        self.weight = nn.Parameter(full.weight.detach()[start:start + size].clone())
        self.start, self.size, self.group, self.seq = start, size, group, seq

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        local = tokens - self.start
        outside = (local < 0) | (local >= self.size)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return self.seq.scatter(out) if self.seq is not None else reduce_from(out, self.group)


class VocabParallelHead(nn.Module):
    """Logits of this rank's vocabulary range: [..., size]."""

    def __init__(self, full: nn.Linear, start: int, size: int, group, seq=None):
        super().__init__()
        self.weight = nn.Parameter(full.weight.detach()[start:start + size].clone())
        self.start, self.size, self.group, self.seq = start, size, group, seq

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.seq.gather(x) if self.seq is not None else copy_to(x, self.group), self.weight)


class _ParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, start, group):
        logits = logits.float()
        peak = logits.max(dim=-1).values
        all_reduce(peak, group, op=dist.ReduceOp.MAX)
        exp = torch.exp(logits - peak.unsqueeze(-1))
        total = exp.sum(dim=-1)
        all_reduce(total, group)
        local = targets - start
        mine = (local >= 0) & (local < logits.shape[-1])
        index = local.clamp(0, logits.shape[-1] - 1)
        target_logit = logits.gather(-1, index.unsqueeze(-1)).squeeze(-1) * mine
        all_reduce(target_logit, group)
        ctx.save_for_backward(exp / total.unsqueeze(-1), index, mine)
        return torch.log(total) + peak - target_logit

    @staticmethod
    def backward(ctx, grad):
        softmax, index, mine = ctx.saved_tensors
        g = softmax.clone()
        g.scatter_add_(-1, index.unsqueeze(-1), -mine.to(g.dtype).unsqueeze(-1))
        return g * grad.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, targets: torch.Tensor, start: int, group,
                                 reduction: str = "mean") -> torch.Tensor:
    """Cross entropy of logits split over the group by vocabulary (this rank: from ``start``), in fp32;
    equal on every rank of the group."""
    per_token = _ParallelCrossEntropy.apply(local_logits.reshape(-1, local_logits.shape[-1]), targets.reshape(-1),
                                            start, group)
    return per_token.sum() if reduction == "sum" else per_token.mean()

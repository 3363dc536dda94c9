"""Apply uneven tensor parallelism to the reference Llama: ``tensor_parallelize(model, group, fractions)``.

The per-model plan, in torchtitan's spirit (a new model adds its own
function of this shape): every block's attention is split by KV heads
(``blocks.TPAttention``), its MLP by hidden features (``TPFeedForward``),
the embedding and head by vocabulary (``vocab.py``); norms stay whole on
every rank (their inputs are whole, so their gradients agree without
communication).  ``fractions[r]`` is rank r's share of every split
(rounded to whole units: a KV head, ``mlp_unit`` hidden features,
``vocab_unit`` vocabulary rows).  The result computes the same function as
the model it was cut from; ``loss`` is the reference model's causal-LM loss
through the vocabulary-parallel cross entropy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from hcomm.models.llama import Llama, RMSNorm
from hcomm.parallel.tensor.sequence import gather_seq, scatter_seq, sum_grad_over
from hcomm.parallel.tensor.blocks import TPAttention, TPFeedForward
from hcomm.parallel.tensor.split import check_fractions, split_sizes
from hcomm.parallel.tensor.vocab import VocabParallelEmbedding, VocabParallelHead, vocab_parallel_cross_entropy


@dataclass
class TPSplit:
    """Every split of one TP group, per rank (what ``hcomm plan`` shows)."""
    kv_heads: List[int]
    q_heads: List[int]
    hidden: List[int]
    vocab: List[int]


def tp_split(config, vocab_size: int, fractions: Sequence[float], *, mlp_unit: int = 32,
             vocab_unit: int = 64) -> TPSplit:
    """The sizes ``fractions`` give on this model (ValueError naming the dimension when one cannot split)."""
    fractions = check_fractions(fractions)
    kv = split_sizes(config.kv_heads, fractions, 1, "key/value heads")
    per_kv = config.n_heads // config.kv_heads
    # whole units where they divide and every rank gets one; else single features / rows
    n = len(fractions)
    mlp_unit = mlp_unit if config.hidden_dim % mlp_unit == 0 and config.hidden_dim // mlp_unit >= n else 1
    vocab_unit = vocab_unit if vocab_size % vocab_unit == 0 and vocab_size // vocab_unit >= n else 1
    return TPSplit(kv, [k * per_kv for k in kv], split_sizes(config.hidden_dim, fractions, mlp_unit, "MLP features"),
                   split_sizes(vocab_size, fractions, vocab_unit, "vocabulary rows"))


class SequenceSlices:
    """Sequence parallelism's shared state: the sequence split by the TP fractions (set per forward from
    the batch's length) and the two collectives every module uses with it."""

    def __init__(self, fractions: Sequence[float], shard_ranks: Sequence[int], group):
        # The collectives list slices in group-rank order; the shard at plan position p is held by group
        # rank shard_ranks[p], and its slice is the fraction of that shard.
        self.group, self.sizes = group, []
        self.rank = dist.get_rank(group)
        by_rank = [0.0] * len(fractions)
        for p, k in enumerate(shard_ranks):
            by_rank[k] = fractions[p]
        self.fractions = by_rank

    def set_length(self, seq_len: int) -> None:
        self.sizes = split_sizes(seq_len, self.fractions, 1, "sequence positions")

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        return gather_seq(local, self.sizes, self.rank, self.group)

    def scatter(self, full: torch.Tensor) -> torch.Tensor:
        return scatter_seq(full, self.sizes, self.rank, self.group)


class TensorParallelLlama(nn.Module):
    def __init__(self, model: nn.Module, group, split: TPSplit, index: int, fractions: Sequence[float] = (),
                 sequence_parallel: bool = False, shard_ranks: Optional[Sequence[int]] = None):
        super().__init__()
        rank = index
        self.group, self.split, self.config = group, split, model.config
        self.index, self.fractions = index, list(fractions)   # which shard of which split (re-staging checks)
        ranks = list(shard_ranks) if shard_ranks is not None else list(range(len(fractions)))
        self.shard_ranks = ranks
        self.seq = SequenceSlices(fractions, ranks, group) if sequence_parallel else None
        seq = self.seq
        v0 = sum(split.vocab[:rank])
        self.vocab_start = v0
        self.embed = VocabParallelEmbedding(model.embed, v0, split.vocab[rank], group, seq)
        self.blocks = nn.ModuleList()
        for block in model.blocks:
            block.attn = TPAttention(block.attn, split.kv_heads, rank, group, seq)
            block.ffn = TPFeedForward(block.ffn, split.hidden, rank, group, seq)
            self.blocks.append(block)
        self.norm = model.norm
        self.head = VocabParallelHead(model.head, v0, split.vocab[rank], group, seq)
        if seq is not None:   # norms see only this rank's tokens: their gradients are summed over the group
            for module in self.modules():
                if isinstance(module, RMSNorm):
                    sum_grad_over(module.weight, group)

    # The reference model's own layer_modules and forward: they only read embed, blocks, norm and head,
    # which here are the shards (forward returns this rank's vocabulary slice of the logits, whole sequence).
    layer_modules = Llama.layer_modules

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.seq is not None:
            self.seq.set_length(tokens.shape[1])
        return Llama.forward(self, tokens)

    def loss(self, tokens_with_targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        logits = self(tokens_with_targets[:, :-1])
        return vocab_parallel_cross_entropy(logits, tokens_with_targets[:, 1:], self.vocab_start, self.group,
                                            reduction)


def tensor_parallelize(model: nn.Module, group, fractions: Sequence[float], index: Optional[int] = None,
                       sequence_parallel: bool = False, shard_ranks: Optional[Sequence[int]] = None,
                       **units) -> TensorParallelLlama:
    """This rank's shard ``index`` (default: its rank in ``group``) of ``model`` (a ``hcomm.models.Llama``)
    over ``group``; the model's blocks are reused (their attention and MLP replaced), the other pieces
    rebuilt from its weights.  Shards are in the order of ``fractions``; collectives only sum, so which
    group rank holds which shard is free (a plan lists the fastest rank first); sequence parallelism's
    uneven collectives are not, so ``shard_ranks[p]`` names the group rank holding shard p (default: p)."""
    if getattr(model.config, "tie_embeddings", False):
        raise ValueError("tensor parallelism of tied embeddings is not supported (embedding and head split "
                         "differently)")
    n = dist.get_world_size(group)
    if len(fractions) != n:
        raise ValueError(f"{len(fractions)} TP fractions for a group of {n} ranks")
    if model.config.kv_heads < n:
        raise ValueError(f"{n} TP ranks but the model has {model.config.kv_heads} key/value heads: every rank "
                         f"needs at least one")
    split = tp_split(model.config, model.head.weight.shape[0], fractions, **units)
    index = dist.get_rank(group) if index is None else index
    if not 0 <= index < n:
        raise ValueError(f"TP shard index {index} outside 0..{n - 1}")
    if shard_ranks is not None and sorted(shard_ranks) != list(range(n)):
        raise ValueError(f"shard_ranks must list each of the group's {n} ranks once, got {list(shard_ranks)}")
    if shard_ranks is not None and shard_ranks[index] != dist.get_rank(group):
        raise ValueError(f"shard {index} is held by group rank {shard_ranks[index]}, not this rank "
                         f"({dist.get_rank(group)})")
    return TensorParallelLlama(model, group, split, index, fractions, sequence_parallel, shard_ranks)

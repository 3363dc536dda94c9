"""Putting tensor-parallel shards back together: the whole reference model from its shards.

Training never needs it; the evaluation after a pipeline of TP groups and a
checkpoint in the reference layout do.  Every sharded parameter names the
dimension it was cut along: column-parallel weights and the vocabulary
pieces by rows (dim 0), row-parallel weights by columns (dim 1); norms are
whole on every rank.  The names of a TP piece's parameters are the
reference model's (``blocks.TPAttention`` keeps ``wq``/``wk``/``wv``/``wo``),
so the shards of one name concatenated in shard order are the reference
tensor.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch
from torch import nn

from hcomm.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear
from hcomm.parallel.tensor.vocab import VocabParallelEmbedding, VocabParallelHead

# (shard index, dimension cut along or None for whole, tensor)
Shard = Tuple[int, object, torch.Tensor]


def _cut_dim(module: nn.Module):
    if isinstance(module, (ColumnParallelLinear, VocabParallelEmbedding, VocabParallelHead)):
        return 0
    if isinstance(module, RowParallelLinear):
        return 1
    return None


def piece_shards(piece: nn.Module, index: int) -> Dict[str, Shard]:
    """This rank's parameters of one piece, by reference name, with how they were cut."""
    out: Dict[str, Shard] = {}
    for module_name, module in piece.named_modules():
        for name, p in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            out[full] = (index, _cut_dim(module), p.detach().cpu().clone())
    return out


def join_shards(shards: List[Dict[str, Shard]]) -> Dict[str, torch.Tensor]:
    """One piece's reference state from every shard's ``piece_shards`` (any order)."""
    shards = sorted(shards, key=lambda s: next(iter(s.values()))[0] if s else 0)
    names = list(shards[0])
    state = {}
    for name in names:
        parts = [s[name] for s in shards]
        dim = parts[0][1]
        state[name] = parts[0][2] if dim is None else torch.cat([t for _, _, t in parts], dim=dim)
    return state

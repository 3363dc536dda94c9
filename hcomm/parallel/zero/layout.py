"""Units and uneven shards: which elements of which parameters each rank owns.

A *unit* is one piece of ``model.layer_modules()`` (the embedding, a block,
the final norm, the head): the granularity of gathering and freeing under
ZeRO-3, as FSDP2 wraps one ``fully_shard`` per block.  A unit's trainable
parameters are laid end to end in one flat buffer (registration order), and
each member of the shard group owns one contiguous element range of it, its
length proportional to the member's ``shard_fraction`` (largest remainder,
so the ranges cover the unit exactly).  Nothing is padded: FSDP2's equal
``torch.chunk`` slots are what this replaces.

Shards are cut per unit, not over the whole model, so every rank holds its
fraction of every unit and gathers of different units stay independent.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

from hcomm.parallel.plan import apportion


@dataclass
class Unit:
    index: int
    name: str
    module: nn.Module
    params: List[nn.Parameter]
    names: List[str]                 # the parameters' names in the model (state dicts, checkpoints)
    offsets: List[int]               # where each parameter starts in the unit's flat buffer
    counts: List[int]                # elements owned by each member of the shard group
    member: int                      # this rank's index in the shard group
    starts: List[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.starts = [sum(self.counts[:i]) for i in range(len(self.counts))]

    @property
    def numel(self) -> int:
        return sum(p.numel() for p in self.params)

    @property
    def shard_start(self) -> int:
        return self.starts[self.member]

    @property
    def shard_numel(self) -> int:
        return self.counts[self.member]

    def param_slices(self, start: int, stop: int):
        """For the element range [start, stop) of the flat buffer: (param index, first, last) per
        parameter it touches, positions inside that parameter's flattened elements."""
        out = []
        for i, (p, off) in enumerate(zip(self.params, self.offsets)):
            lo, hi = max(start, off), min(stop, off + p.numel())
            if lo < hi:
                out.append((i, lo - off, hi - off))
        return out


def _piece_name(model: nn.Module, piece: nn.Module, index: int) -> str:
    for name, module in model.named_modules():
        if module is piece:
            return name or "model"
    return f"piece{index}"


def build_units(model: nn.Module, fractions: Sequence[float], member: int,
                pieces: Optional[Sequence[nn.Module]] = None) -> List[Unit]:
    """The model's units and this member's shard of each.

    ``pieces`` defaults to ``model.layer_modules()``; parameters of no piece
    form one last unit (``rest``) so that every trainable parameter is
    sharded.  A parameter shared by two pieces (tied embeddings) is refused:
    each unit frees its own gathered buffer, so a tied weight would be freed
    under the other unit's feet.
    """
    if not fractions or any(f < 0 for f in fractions) or sum(fractions) <= 0:
        raise ValueError(f"shard fractions must be >= 0 with a positive sum, got {list(fractions)}")
    if abs(sum(fractions) - 1.0) > 1e-6:
        raise ValueError(f"shard fractions sum to {sum(fractions):.9g} ({', '.join(f'{f:g}' for f in fractions)}); "
                         f"they must sum to 1 so that every element has exactly one owner")
    if not 0 <= member < len(fractions):
        raise ValueError(f"member {member} is not in a shard group of {len(fractions)}")
    if pieces is None:
        if not hasattr(model, "layer_modules"):
            raise ValueError(f"{type(model).__name__} has no layer_modules(); pass the pieces to shard by")
        pieces = list(model.layer_modules())
    names: Dict[int, str] = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    owner: Dict[int, str] = {}
    groups = []
    for i, piece in enumerate(pieces):
        label = _piece_name(model, piece, i)
        mine = []
        for p in piece.parameters():
            if not p.requires_grad:
                continue
            if id(p) in owner:
                raise ValueError(f"parameter {names.get(id(p), '?')} belongs to both {owner[id(p)]} and {label} "
                                 f"(tied weights); ZeRO shards each unit on its own: untie them "
                                 f"(tie_embeddings: false) or put both modules in one unit")
            owner[id(p)] = label
            mine.append(p)
        groups.append((label, piece, mine))
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in owner]
    if rest:
        groups.append(("rest", model, rest))
    units = []
    for label, piece, params in groups:
        if not params:
            continue
        offsets = [sum(q.numel() for q in params[:k]) for k in range(len(params))]
        numel = sum(p.numel() for p in params)
        units.append(Unit(len(units), label, piece, params, [names[id(p)] for p in params], offsets,
                          apportion(list(fractions), numel), member))
    if not units:
        raise ValueError("the model has no trainable parameters to shard")
    dtypes = {p.dtype for u in units for p in u.params}
    if len(dtypes) > 1:
        raise ValueError(f"ZeRO expects one parameter dtype, the model has {sorted(map(str, dtypes))}")
    return units


def flatten(unit: Unit) -> torch.Tensor:
    """The unit's parameters end to end (a copy)."""
    return torch.cat([p.detach().reshape(-1) for p in unit.params])

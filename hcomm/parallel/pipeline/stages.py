"""Pipeline stages: a contiguous run of a model's pieces, and the loss the schedule backpropagates.

A model that exposes ``layer_modules()`` (``hcomm.models.llama``: ``[embed,
*blocks, norm, head]``, every block self-contained) is cut into stages by
half-open piece ranges ``[first, last)``.  Stage ``s`` runs pieces
``first_s .. last_s - 1`` in order: the first stage takes token ids ``[B, S]``,
the last returns logits ``[B, S, vocab]``, and the ones in between pass
activations ``[B, S, D]``.

The stage module holds the model's own piece modules (no copies), so the
optimizer, checkpoints and tests see the model's parameters.

``check_ranges`` validates a partition before any communication, with errors
that name the stage and the numbers.
"""
from __future__ import annotations

from typing import Callable, Optional, List, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from hcomm.models.llama import layer_modules

Range = Tuple[int, int]


class StageModule(nn.Module):
    """Pieces ``[first, last)`` of a model's ``layer_modules()``, run in order."""

    def __init__(self, pieces: Sequence[nn.Module], first: int, last: int):
        super().__init__()
        self.first, self.last = first, last
        self.pieces = nn.ModuleList(pieces)
        self.compute_dtype: Optional[torch.dtype] = None   # autocast to this (per-device precision); None = fp32
        self.boundary = True   # its output crosses to another stage (False on the last stage: the logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.compute_dtype is None:
            for piece in self.pieces:
                x = piece(x)
            return x
        with torch.autocast(x.device.type, dtype=self.compute_dtype):
            for piece in self.pieces:
                x = piece(x)
        # Stage boundaries carry fp32: neighbours may compute in different dtypes, and torch's stages
        # size their receive buffers (dtype included) once from the first micro-batch.
        return x.float() if self.boundary and x.is_floating_point() else x

    def extra_repr(self) -> str:
        return f"pieces [{self.first}, {self.last})"


def check_ranges(ranges: Sequence[Range], n_pieces: int) -> List[Range]:
    """Ranges as a list of int pairs, or ValueError naming the first bad stage.

    Valid: at least one stage, no more stages than pieces, each stage non-empty,
    stage 0 starts at 0, each stage starts where the previous one ends (no
    overlap, no gap), and the last ends at ``n_pieces``.
    """
    ranges = [tuple(r) for r in ranges]
    if not ranges:
        raise ValueError("a pipeline needs at least one stage; got no piece ranges")
    if len(ranges) > n_pieces:
        raise ValueError(f"{len(ranges)} stages for a model of {n_pieces} pieces: "
                         f"every stage needs at least one piece")
    for s, r in enumerate(ranges):
        if len(r) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in r):
            raise ValueError(f"stage {s}: piece range must be two integers [first, last), got {r!r}")
        first, last = r
        if last <= first:
            raise ValueError(f"stage {s} has no layers: piece range [{first}, {last})")
    if ranges[0][0] != 0:
        raise ValueError(f"stage 0 starts at piece {ranges[0][0]}; it must start at piece 0 "
                         f"(pieces [0, {ranges[0][0]}) would run nowhere)")
    for s in range(1, len(ranges)):
        prev_end, start = ranges[s - 1][1], ranges[s][0]
        if start < prev_end:
            raise ValueError(f"stage {s} starts at piece {start} but stage {s - 1} ends at {prev_end}: "
                             f"pieces [{start}, {prev_end}) overlap")
        if start > prev_end:
            raise ValueError(f"stage {s} starts at piece {start} but stage {s - 1} ends at {prev_end}: "
                             f"pieces [{prev_end}, {start}) are in no stage")
    if ranges[-1][1] != n_pieces:
        s, end = len(ranges) - 1, ranges[-1][1]
        if end > n_pieces:
            raise ValueError(f"stage {s} ends at piece {end} but the model has only {n_pieces} pieces")
        raise ValueError(f"stage {s} (the last) ends at piece {end}; pieces [{end}, {n_pieces}) are in no stage")
    return [(int(a), int(b)) for a, b in ranges]


def build_stages(model: nn.Module, ranges: Sequence[Range]) -> List[StageModule]:
    """Every stage's module (they share the model's piece modules; nothing is copied).

    Raises ValueError for a bad partition, and for a parameter that two stages would
    hold (tied embeddings cut apart: their gradients would need a sum across stages,
    which this runtime does not do).
    """
    pieces = layer_modules(model)
    ranges = check_ranges(ranges, len(pieces))
    stages = [StageModule(pieces[a:b], a, b) for a, b in ranges]
    owner = {}
    for s, stage in enumerate(stages):
        for name, p in stage.named_parameters():
            if id(p) in owner and owner[id(p)][0] != s:
                raise ValueError(f"stage {s} and stage {owner[id(p)][0]} share parameter {name!r} "
                                 f"(tied embeddings?); keep the tied pieces in one stage")
            owner.setdefault(id(p), (s, name))
    return stages


def build_stage(model: nn.Module, first: int, last: int) -> StageModule:
    """The module for pieces ``[first, last)`` of ``model.layer_modules()``."""
    pieces = layer_modules(model)
    if not (0 <= first < last <= len(pieces)):
        raise ValueError(f"piece range [{first}, {last}) is empty or outside the model's {len(pieces)} pieces")
    return StageModule(pieces[first:last], first, last)


class TokenSumLoss:
    """The schedule's loss: next-token cross entropy summed over a micro-batch's tokens / ``token_count``.

    With ``token_count`` = the tokens of the whole batch the pipeline runs this
    step, the micro-batch losses (and their gradients) add up to the batch's mean
    loss and gradient exactly, for any number of micro-batches; torch's schedules
    must then not rescale (``scale_grads=False``).  Cross entropy is taken in fp32,
    as ``causal_lm_loss`` does.
    """

    def __init__(self, token_count: int, cross_entropy: Optional[Callable] = None):
        if token_count <= 0:
            raise ValueError(f"token_count must be positive, got {token_count}")
        self.token_count = int(token_count)
        self.scale = 1.0   # dynamic loss scale (fp16 stages): the loss and every gradient carry it
        # (logits [T, V], targets [T]) -> summed loss; a vocabulary-parallel last stage passes its own
        self.cross_entropy = cross_entropy or (lambda x, t: F.cross_entropy(x.float(), t, reduction="sum"))

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        total = self.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return total * (self.scale / self.token_count)

"""One rank's ZeRO training step, set up from the plan.

Reads the plan's ZeRO part only: every rank's ``zero_stage`` and
``shard_fraction``, the ``dp`` group's ``zero_layout``, ``prefetch`` and
``reshard_after_forward``, and (to keep collectives in step) every rank's
sample count and micro-batch.
"""
from __future__ import annotations

import math
import time
from typing import List, Optional

import torch
import torch.distributed as dist

from hcomm.parallel.zero.engine import ZeroEngine
from hcomm.parallel.zero.layout import build_units

# Optimizers whose update of an element reads only that element's gradient and state:
# stepping a flat shard is then the same as stepping the whole tensors.
ELEMENTWISE = ("SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta", "ASGD",
               "Rprop")
NOT_ELEMENTWISE = {
    "LBFGS": "takes a closure and a line search over all parameters at once",
    "SparseAdam": "needs sparse gradients",
    "Adafactor": "factors the second moment over the rows and columns of each matrix",
    "Muon": "orthogonalises each weight matrix as a whole",
}


def check_optimizer(optimizer: torch.optim.Optimizer, masters: List[torch.nn.Parameter]) -> None:
    """Stage >= 1 steps flat shards: the optimizer must be element-wise and own exactly the shards."""
    name = type(optimizer).__name__
    if name in NOT_ELEMENTWISE:
        raise ValueError(f"ZeRO steps flat shards of each tensor, but torch.optim.{name} {NOT_ELEMENTWISE[name]}; "
                         f"use an element-wise optimizer ({', '.join(ELEMENTWISE)})")
    if name not in ELEMENTWISE and not getattr(optimizer, "zero_elementwise", False):
        raise ValueError(f"ZeRO steps flat shards of each tensor; hcomm cannot tell whether {name} updates each "
                         f"element from its own gradient and state only. Use one of {', '.join(ELEMENTWISE)}, or "
                         f"set optimizer.zero_elementwise = True to vouch for it")
    owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
    if owned != {id(p) for p in masters}:
        raise ValueError("under ZeRO the optimizer must step the shards: build it over ParallelModel.parameters() "
                         "(the fp32 master shards), not model.parameters()")


def members_and_fractions(plan, islands: List[List[int]], rank: int):
    """The shard group (global ranks, in order) this rank belongs to, and their fractions."""
    layout = plan.dp_group().zero_layout
    if layout == "flat":
        members = list(range(plan.world_size))
    else:
        sizes = sorted({len(m) for m in islands})
        if len(sizes) > 1:
            raise ValueError(f"zero_layout 'island' shards inside islands and all-reduces each shard with the same "
                             f"shard of the other islands, so islands must have equal sizes; they have "
                             f"{[len(m) for m in islands]} ranks (use zero_layout 'flat')")
        members = next(list(m) for m in islands if rank in m)
    given = [plan.ranks[r].shard_fraction for r in members]
    if given[0] is None:
        fractions = [1.0 / len(members)] * len(members)
    else:
        total = sum(given)
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"shard fractions of ranks {members} sum to {total:.9g} ({given}); with zero_layout "
                             f"'{layout}' they must sum to 1 within each shard group")
        fractions = list(given)
    if layout == "island":
        for island in islands:
            theirs = [plan.ranks[r].shard_fraction for r in island]
            if theirs[0] is not None and any(abs(a - b) > 1e-9 for a, b in zip(theirs, fractions)):
                raise ValueError(f"zero_layout 'island': the rank at each position of every island must hold the "
                                 f"same fraction (the shards are all-reduced across islands); island {island} has "
                                 f"{theirs}, island {members} has {fractions}")
    return members, fractions


def rounds_per_step(counts: List[int], micro_batches: List[int]) -> int:
    """Micro-batches of the rank that runs the most: every rank runs this many rounds."""
    best = 0
    for n, micro in zip(counts, micro_batches):
        if n:
            best = max(best, math.ceil(n / (micro or n)))
    return max(best, 1)


class ZeroRunner:
    def __init__(self, model, plan, groups, rank: int):
        stage = plan.ranks[rank].zero_stage
        dp = plan.dp_group()
        members, fractions = members_and_fractions(plan, groups.islands, rank)
        units = build_units(model, fractions, members.index(rank))
        gather_group, reduce_group, replicate_group = _zero_groups(plan, groups.islands, members, rank)
        self.model = model
        self.micro_batches = [r.micro_batch for r in plan.ranks]
        self.engine = ZeroEngine(units, stage=stage, gather_group=gather_group, reduce_group=reduce_group,
                                 replicate_group=replicate_group, prefetch=dp.prefetch,
                                 reshard_after_forward=dp.reshard_after_forward,
                                 rounds=rounds_per_step(plan.batch_counts(), self.micro_batches))
        # Gradients only: the island layout's cross-island all-reduce of shards, or the flat layout's
        # reduce-scatters (whose weak tier crosses islands); parameters are always gathered exactly.
        import hcomm

        hcomm.set_compression(dp.compression, group=replicate_group if replicate_group is not None else reduce_group)
        self.global_tokens = float(plan.global_batch * plan.seq_len)
        self._checked: Optional[int] = None

    def parameters(self):
        return self.engine.parameters()

    def resplit(self, counts: List[int]) -> None:
        """New rows per rank (the straggler watch's re-split): only how many rounds every rank runs changes.
        Shards, micro-batches (the plan's memory) and the loss scale (the global token count) stay; a rank
        with fewer rows than rounds runs ghost rounds, which keep the collectives in step."""
        self.engine.rounds = rounds_per_step(counts, self.micro_batches)

    def step(self, rows: torch.Tensor, micro_batch: int, optimizer) -> dict:
        """Forward/backward rounds, reductions, the optimizer on the shards, the post-step gathers."""
        if self._checked != id(optimizer):
            check_optimizer(optimizer, self.engine.parameters())
            self._checked = id(optimizer)
        start = time.perf_counter()
        engine = self.engine
        engine.begin_step()
        chunks = list(rows.split(micro_batch or max(1, rows.shape[0]))) if rows.shape[0] else []
        total = 0.0
        waited = 0.0
        for m in range(engine.rounds):
            if m < len(chunks):
                engine.begin_round(last=m == len(chunks) - 1)
                loss = self.model.loss(chunks[m], reduction="sum")
                total += float(loss.detach())
                (loss / self.global_tokens).backward()
                waited += engine.end_round()
            else:
                waited += engine.ghost_round(last=not chunks and m == engine.rounds - 1)
        rounds_s = time.perf_counter() - start
        t = time.perf_counter()
        optimizer.step()
        optimizer_s = time.perf_counter() - t
        engine.after_step()
        stats = engine.stats()
        exposed = sum(s["exposed_s"] for s in stats)
        tokens = rows.shape[0] * (rows.shape[1] - 1) if rows.shape[0] else 0
        return dict(compute_s=max(0.0, rounds_s - exposed), sync_wait_s=exposed, optimizer_s=optimizer_s,
                    local_loss=total / tokens if tokens else float("nan"), units=stats)

    def finish(self) -> None:
        """Whole parameters on every rank (the final evaluation reads them)."""
        self.engine.consolidate()


def _zero_groups(plan, islands: List[List[int]], members: List[int], rank: int):
    """Gather and reduce-scatter groups over the shard group (two, so their orders are independent and
    they can run at once), and for the island layout the cross-island replicate group.  Collective:
    every rank creates every group in the same order."""
    if plan.dp_group().zero_layout == "flat":
        return dist.new_group(members, backend="hcomm"), dist.new_group(members, backend="hcomm"), None
    mine = []
    for island in islands:
        g, r = dist.new_group(island, backend="hcomm"), dist.new_group(island, backend="hcomm")
        if rank in island:
            mine = [g, r]
    replicate = None
    position = members.index(rank)
    for j in range(len(members)):
        g = dist.new_group([island[j] for island in islands], backend="hcomm")
        if j == position:
            replicate = g
    return mine[0], mine[1], replicate

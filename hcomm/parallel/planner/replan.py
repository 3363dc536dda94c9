"""Re-planning a pipeline after ranks drifted: the same planner on the speeds just measured, and the
price of moving the state there.

The straggler watch (``parallel.straggler``) says how far each rank's seconds per sample moved from
the baseline it showed after the last (re)plan.  The profile stays the shape of each rank's work
(which pieces cost what, at which micro-batch); the drift is a factor on its speed.  So the plans
are predicted on a view whose profiles are each rank's own, slowed (or sped up) by its factor -- the
one cost model, not a second rule -- and ``pipeline.restage`` moves the state to the plan chosen.

A re-plan is not free: the pieces that change hands move with their parameters and AdamW moments
(``pipeline.restage``; 4.6 s for the tiny model across the emulator's islands), and the planner,
free to choose again, may reorder the devices and move nearly every piece.  So the plans below
are weighed for the steps left in the run, each at its predicted step time plus its predicted move:
keeping the cuts (nothing moves); with replicas, splitting their rows again by their speeds (rows
move, no state); cutting again in the current device order and rows (only the pieces at the
shifted boundaries move, between neighbours); and the planner's own new plan.

A pipeline of TP groups is weighed the same way on the view where each group is one device
(``pipeline_tensor.contract`` / ``group_view``: the group at its slowest member's drifted speed); the
groups and their fractions stay, so the state that moves is shards of the same shape, each TP position
sending its own side by side.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from typing import Callable, List, Optional, Sequence

MESSAGES_PER_PIECE = 3   # restage sends a piece's parameters and its two AdamW moments


def slowed_view(view, factors: Sequence[float]):
    """``view`` with rank r's compute and optimizer step ``factors[r]`` times as long."""
    if len(factors) != view.world_size:
        raise ValueError(f"re-planning needs one speed factor per rank: {len(factors)} for {view.world_size}")
    bad = [f for f in factors if not (math.isfinite(f) and f > 0)]
    if bad:
        raise ValueError(f"re-planning: speed factors must be positive and finite, got {bad}")
    return dataclasses.replace(view, profiles=[p.slowed(f) for p, f in zip(view.profiles, factors)],
                               optimizer_s=[s * f for s, f in zip(view.optimizer_s, factors)])


def held_pieces(plan) -> List[List[int]]:
    """Per rank, the model pieces whose training state it holds (the pieces of its stages)."""
    held: List[List[int]] = [[] for _ in plan.ranks]
    for g in plan.pipeline_groups():
        p = len(g.ranks)
        for k in range(len(g.cuts) - 1):
            held[g.ranks[k % p]].extend(range(g.cuts[k], g.cuts[k + 1]))
    return held


def move_seconds(view, old, new, share: float = 1.0) -> float:
    """Predicted seconds of ``restage`` moving ``old``'s state to ``new``: each piece that changes hands
    goes from its lowest old holder to each new one (``restage.transfers``), its parameters and AdamW
    state over the link between them; the sends are blocking, in one global order, so a transfer starts
    when both its ends are done with the ones before it.  On a view of TP groups (``pipeline_tensor``)
    every TP position moves its own shard side by side: ``share`` is the largest shard's fraction (the
    view's links already share an uplink between the positions)."""
    from hcomm.parallel.pipeline.restage import transfers

    n = len(view.profiles[0].layers)
    free = [0.0] * view.world_size
    for piece, src, dst in transfers(held_pieces(old), held_pieces(new), list(range(n))):
        layer = view.profiles[src].layers[piece]
        nbytes = int((layer.param_bytes + layer.optim_bytes) * share)
        start = max(free[src], free[dst])
        free[src] = free[dst] = start + view.p2p_s(src, dst, nbytes) + \
            (MESSAGES_PER_PIECE - 1) * view.p2p_s(src, dst, 0)
    return max(free)


def _predicted(plan, view):
    """``plan`` with its predicted step on ``view``, or None when it does not fit memory there."""
    from hcomm.parallel.planner.simulate import simulate

    sim = simulate(plan, view)
    if not sim.fits:
        return None
    plan.predicted_step_s = sim.step_s
    return plan


def resplit_replicas(plan, view):
    """``plan`` with the rows of its pipeline replicas split again by their predicted seconds per row at
    ``view``'s speeds (twice, as the planner refines them), cuts and devices unchanged: rows move, no
    state.  None with one replica, a replica without rows, or micro-batch counts that differ or do not
    divide the batch."""
    from hcomm.parallel.plan import apportion
    from hcomm.parallel.planner.simulate import replica_steps

    groups = plan.pipeline_groups()
    counts = {g.micro_batches for g in groups}
    if len(groups) < 2 or len(counts) != 1 or plan.global_batch % min(counts):
        return None
    m = counts.pop()
    out = copy.deepcopy(plan)
    speed = [0.0] * len(groups)   # rows per second; a replica left without rows keeps its last
    for _ in range(2):
        for i, (rows, step) in enumerate(replica_steps(out, view)):
            if rows:
                speed[i] = rows / step if step > 0 else 0.0
        if not all(x > 0 for x in speed):
            return None
        rows = [n * m for n in apportion(speed, plan.global_batch // m)]
        for g, n in zip(out.pipeline_groups(), rows):
            out.ranks[g.ranks[0]].batch_share = n / plan.global_batch
    return _predicted(out, view)


def recut_in_place(plan, view):
    """``plan`` with new cuts for ``view`` and nothing else changed (device order, rows, micro-batches,
    schedule): the exact partition search of its largest replica in its own device order; None when
    those cuts do not fit every replica."""
    from hcomm.parallel.pipeline.partition import partition
    from hcomm.parallel.planner import cost
    from hcomm.parallel.planner.pipeline import boundary_bytes
    from hcomm.parallel.planner.pipeline_step import transfer_costs

    counts, leaders = plan.batch_counts(), plan.rows_leaders()
    groups = plan.pipeline_groups()
    lead = max(groups, key=lambda g: counts[leaders[g.ranks[0]]])
    rows = counts[leaders[lead.ranks[0]]]
    dim = cost.model_shape(view.profiles[0])[0]
    try:
        part = partition([view.profiles[r] for r in lead.ranks], micro_batches=lead.micro_batches,
                         micro_batch=rows // lead.micro_batches, schedule=lead.schedule,
                         virtual_stages=lead.virtual_stages, boundary_bytes=boundary_bytes(dim, plan.seq_len),
                         order=list(range(len(lead.ranks))), **transfer_costs(view))
    except ValueError:
        return None
    out = copy.deepcopy(plan)
    for g in out.pipeline_groups():
        g.cuts = list(part.cuts)
        for pos, r in enumerate(g.ranks):
            out.ranks[r].layers = (g.cuts[pos], g.cuts[pos + 1]) if g.virtual_stages == 1 else None
    return _predicted(out, view)


class PipelineReplanner:
    """Makes a pipeline plan again for drifted speeds.  ``make(view, plan)``: the planner call that made
    ``plan`` (same stages, split, pins), on another view.  Keeps the view it planned on last, so a
    second drift is measured against the speeds the first re-plan assumed."""

    def __init__(self, view, make: Callable):
        self.view, self.make = view, make
        self.options: list = []

    def replan(self, plan, factors: Sequence[float], steps_left: Optional[int] = None):
        """The plan to run the ``steps_left`` steps on (None: as many as it takes for any saving to pay
        for its move): the least predicted step time x steps left + move seconds of the options in the
        module docstring.  Its first note says what each would cost.

        A pipeline of TP groups is re-planned as the pipeline of its groups (``pipeline_tensor.contract``,
        each group one device at its slowest member's drifted speed): the groups and their fractions stay,
        so every shard keeps its shape and moves whole between the same TP positions of two groups."""
        from hcomm.parallel.planner import cost
        from hcomm.parallel.planner.pipeline_tensor import contract, expand, group_view

        self.view = slowed_view(self.view, factors)
        inner, view, share, groups, fractions = plan, self.view, 1.0, None, None
        if plan.tensor_groups():
            inner, groups, fractions = contract(plan)
            view = group_view(self.view, groups, [fractions] * len(groups), plan.seq_len,
                              cost.model_shape(self.view.profiles[0])[0])
            share = max(fractions)
        chosen = self._choose(inner, view, share, steps_left)
        if groups is not None:
            expanded = expand(chosen, groups, fractions, self.view)
            expanded.notes, chosen = chosen.notes, expanded
        return keep_identity(plan, chosen)

    def _choose(self, plan, view, share: float, steps_left: Optional[int]):
        """The option of least predicted cost on ``view`` (ranks, or TP groups as devices), its first note
        listing every option."""
        from hcomm.parallel.planner.simulate import simulate

        kept = copy.deepcopy(plan)
        kept.predicted_step_s = simulate(plan, view).step_s
        options = [("keep the cuts", kept, 0.0)]
        rows = resplit_replicas(plan, view)
        if rows is not None:
            options.append(("re-split the rows", rows, 0.0))
        in_place = recut_in_place(plan, view)
        if in_place is not None:
            options.append(("re-cut in place", in_place, move_seconds(view, plan, in_place, share)))
        refused = ""
        try:
            new = self.make(view, plan)
            options.append(("re-plan", new, move_seconds(view, plan, new, share)))
        except ValueError as error:   # the planner finds nothing at these speeds: the other options stand
            refused = f"; re-plan refused: {str(error).splitlines()[0][:200]}"

        chosen, self.options = weigh(options, steps_left, refused)
        return chosen


def keep_identity(plan, chosen):
    """``chosen`` as the run's plan goes on: ``plan``'s name, straggler watch and each rank's dtype (its
    device's)."""
    for old_rank, new_rank in zip(plan.ranks, chosen.ranks):
        new_rank.compute_dtype = old_rank.compute_dtype
    dp, new_dp = plan.dp_group(), chosen.dp_group()
    new_dp.straggler_margin, new_dp.straggler_patience = dp.straggler_margin, dp.straggler_patience
    chosen.name = plan.name
    return chosen


def weigh(options, steps_left: Optional[int], refused: str = ""):
    """The least costly of ``options`` -- (label, plan with its predicted step, predicted move seconds) --
    for ``steps_left`` steps (None: the faster step wins, the smaller move breaks a tie), its first note
    listing what each would cost; and (label, step seconds, move seconds) of each, for the run's record."""
    def total(option):
        _, p, move = option
        return (p.predicted_step_s * steps_left + move, 0.0) if steps_left is not None else \
            (p.predicted_step_s, move)
    what, chosen, _ = min(options, key=total)
    left = f"for the {steps_left} steps left" if steps_left is not None else "per step"
    chosen.notes = [f"{what}: at the drifted speeds, {left}: " + "; ".join(
        f"{label} {p.predicted_step_s * 1e3:.0f} ms per step" + (f" + {move:.2f} s to move" if move else "")
        for label, p, move in options) + refused, *chosen.notes]
    return chosen, [(label, p.predicted_step_s, move) for label, p, move in options]

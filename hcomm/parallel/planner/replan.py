"""Re-planning a pipeline after ranks drifted: the same planner on the speeds just measured.

The straggler watch (``parallel.straggler``) says how far each rank's seconds per sample moved from
the baseline it showed after the last (re)plan.  The profile stays the shape of each rank's work
(which pieces cost what, at which micro-batch); the drift is a factor on its speed.  So the new plan
is the planner's answer on a view whose profiles are each rank's own, slowed (or sped up) by its
factor -- the one cost model, not a second rule -- and ``pipeline.restage`` moves the state there.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence


def slowed_view(view, factors: Sequence[float]):
    """``view`` with rank r's compute and optimizer step ``factors[r]`` times as long."""
    if len(factors) != view.world_size:
        raise ValueError(f"re-planning needs one speed factor per rank: {len(factors)} for {view.world_size}")
    bad = [f for f in factors if not (math.isfinite(f) and f > 0)]
    if bad:
        raise ValueError(f"re-planning: speed factors must be positive and finite, got {bad}")
    return dataclasses.replace(view, profiles=[p.slowed(f) for p, f in zip(view.profiles, factors)],
                               optimizer_s=[s * f for s, f in zip(view.optimizer_s, factors)])


class PipelineReplanner:
    """Makes a pipeline plan again for drifted speeds.  ``make(view, plan)``: the planner call that made
    ``plan`` (same stages, split, pins), on another view.  Keeps the view it planned on last, so a
    second drift is measured against the speeds the first re-plan assumed."""

    def __init__(self, view, make: Callable):
        self.view, self.make = view, make

    def replan(self, plan, factors: Sequence[float]):
        """The new plan; its first note compares it with ``plan`` at the drifted speeds."""
        from hcomm.parallel.planner.simulate import simulate

        self.view = slowed_view(self.view, factors)
        new = self.make(self.view, plan)
        kept_s = simulate(plan, self.view).step_s
        new.notes = [f"predicted at the drifted speeds: {kept_s * 1e3:.0f} ms per step on the old cuts, "
                     f"{new.predicted_step_s * 1e3:.0f} ms on the new", *new.notes]
        for old_rank, new_rank in zip(plan.ranks, new.ranks):   # a rank's dtype is its device's
            new_rank.compute_dtype = old_rank.compute_dtype
        dp, new_dp = plan.dp_group(), new.dp_group()
        new_dp.straggler_margin, new_dp.straggler_patience = dp.straggler_margin, dp.straggler_patience
        new.name = plan.name
        return new

"""Re-planning TP groups after ranks drifted: rows between the groups, or the shards themselves.

A TP group runs at its slowest member (they meet inside every layer).  When one member turns slow,
moving rows to the other groups (``tensor.rows_resplit``; ``train.drift.resplit_rows`` does it from the
measured seconds) leaves that member its shard, so its group keeps waiting for it; the planner's own
call at the drifted speeds gives it a smaller fraction (and may regroup or reorder the members), and
then the state is cut again (``tensor.reshard``: every group gathers its whole state and each rank
keeps its new shard).  Both are weighed for the steps left, at their predicted step times on the
drifted view (``replan.slowed_view``) plus, for the new shards, the predicted move.  The drift is
measured on each rank's own work: a TP member's busy time leaves out the time inside TP collectives,
where it waits for the slow partner (``tensor.comm.waited_s``).
"""
from __future__ import annotations

import copy
from typing import Callable, Optional, Sequence

from hcomm.parallel.planner.replan import slowed_view

ROWS, SHARDS = "re-split the rows", "re-split the shards"


def reshard_seconds(view, plan) -> float:
    """Predicted seconds of ``tensor.reshard`` for ``plan``: inside each TP group every member sends its
    shard of the state (parameters and AdamW's moments) to each other member and receives theirs (one
    gather); the groups gather side by side, the one with the longest exchange on its own links sets
    the time."""
    state = sum(c.param_bytes + c.optim_bytes for c in view.profiles[0].layers)
    worst = 0.0
    for g in plan.tensor_groups():
        fr = [plan.ranks[r].tp_fraction for r in g.ranks]
        for k, r in enumerate(g.ranks):
            peer = g.ranks[(k + 1) % len(g.ranks)]
            moved = max((1.0 - fr[k]) * state, (len(fr) - 1) * fr[k] * state)
            worst = max(worst, view.p2p_s(r, peer, int(moved)) if peer != r else 0.0)
    return worst


class TensorReplanner:
    """Makes a TP plan again for drifted speeds.  ``make(view, plan)``: the planner call that made ``plan``
    on another view.  Keeps the view it planned on last (a second drift is measured against it)."""

    def __init__(self, view, make: Callable):
        self.view, self.make = view, make
        self.options: list = []

    def replan(self, plan, factors: Sequence[float], steps_left: Optional[int] = None):
        """The plan to run the ``steps_left`` steps on (None: the faster step wins); its first note says
        what each option would cost."""
        from hcomm.parallel.planner import cost
        from hcomm.parallel.planner.tensor import rows_resplit

        self.view = slowed_view(self.view, factors)
        dim, n_layers = cost.model_shape(self.view.profiles[0])
        options = [(ROWS, rows_resplit(plan, self.view, dim, n_layers), 0.0)]
        refused = ""
        try:
            options.append((SHARDS, self.make(self.view, plan), reshard_seconds(self.view, plan)))
        except ValueError as error:   # nothing fits at these speeds: the rows stand
            refused = f"; new shards refused: {str(error).splitlines()[0][:200]}"

        def total(option):
            _, p, move = option
            return (p.predicted_step_s * steps_left + move, 0.0) if steps_left is not None else \
                (p.predicted_step_s, move)
        what, chosen, _ = min(options, key=total)
        chosen = copy.deepcopy(chosen)
        self.options = [(label, p.predicted_step_s, move) for label, p, move in options]
        left = f"for the {steps_left} steps left" if steps_left is not None else "per step"
        chosen.notes = [f"{what}: at the drifted speeds, {left}: " + "; ".join(
            f"{label} {p.predicted_step_s * 1e3:.0f} ms per step" + (f" + {move:.2f} s to move" if move else "")
            for label, p, move in options) + refused, *chosen.notes]
        for old_rank, new_rank in zip(plan.ranks, chosen.ranks):   # a rank's dtype is its device's
            new_rank.compute_dtype = old_rank.compute_dtype
        dp, new_dp = plan.dp_group(), chosen.dp_group()
        new_dp.straggler_margin, new_dp.straggler_patience = dp.straggler_margin, dp.straggler_patience
        chosen.name = plan.name
        return chosen

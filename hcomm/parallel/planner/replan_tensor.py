"""Re-planning TP groups after ranks drifted: rows between the groups, or the shards themselves.

A TP group runs at its slowest member (they meet inside every layer).  When one member turns slow,
moving rows to the other groups (``tensor.rows_resplit``; ``train.drift.resplit_rows`` does it from the
measured seconds) leaves that member its shard, so its group keeps waiting for it; the planner's own
call at the drifted speeds gives it a smaller fraction (and may regroup or reorder the members), and
then the state is cut again (``tensor.reshard``: every group gathers its whole state and each rank
keeps its new shard).  Both are weighed for the steps left, at their predicted step times on the
drifted view (``replan.slowed_view``) plus, for the new shards, the predicted move (the wire and the
CPU passes over the state, on a slowed member at its drifted speed).  The drift is
measured on each rank's own work: a TP member's busy time leaves out the time inside TP collectives,
where it waits for the slow partner (``tensor.comm.waited_s``).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from hcomm.parallel.planner.replan import keep_identity, slowed_view, weigh

ROWS, SHARDS = "re-split the rows", "re-split the shards"


# Passes of a rank's own CPU over the whole state in ``tensor.reshard`` besides the wire: packing its
# shards, joining the gathered ones, building and loading the whole model and its moments, cutting them.
# Fitted on the emulator (``bench_straggler.py --tp 2``, 2026-12-06), where the slowed rank's quota sets
# the move: with the shards gathered as bytes the move took 6.91 s where one pass was predicted at 1.10 s
# (6.2 passes; gathered as pickled objects, the launch before: 7.46 s at 1.52 s, 4.9).  On 2 unthrottled
# local ranks the byte gather halved the move (0.77 vs 1.60 s, ``bench_reshard_gather.py``); on the
# quotas it did not: copies and joins at a quarter of a share dominate there, not pickling.
RESHARD_PASSES = 6


def reshard_seconds(view, plan, slowdown: Sequence[float] = ()) -> float:
    """Predicted seconds of ``tensor.reshard`` for ``plan``: inside each TP group every member sends its
    shard of the state (parameters and AdamW's moments) to each other member and receives theirs (one
    gather over its links), and passes over the whole state ``RESHARD_PASSES`` times on its own CPU
    (the measured host time of a message of those bytes on that tier, ``ClusterView.p2p_host_s``, times
    the member's ``slowdown``); the groups work side by side, the slowest member sets the time."""
    state = sum(c.param_bytes + c.optim_bytes for c in view.profiles[0].layers)
    worst = 0.0
    for g in plan.tensor_groups():
        fr = [plan.ranks[r].tp_fraction for r in g.ranks]
        for k, r in enumerate(g.ranks):
            peer = g.ranks[(k + 1) % len(g.ranks)]
            if peer == r:
                continue
            moved = max((1.0 - fr[k]) * state, (len(fr) - 1) * fr[k] * state)
            cpu = RESHARD_PASSES * view.p2p_host_s(r, peer, state) * (slowdown[r] if slowdown else 1.0)
            worst = max(worst, view.p2p_s(r, peer, int(moved)) + cpu)
    return worst


class TensorReplanner:
    """Makes a TP plan again for drifted speeds.  ``make(view, plan)``: the planner call that made ``plan``
    on another view.  Keeps the view it planned on last (a second drift is measured against it)."""

    def __init__(self, view, make: Callable):
        self.view, self.make = view, make
        self.options: list = []
        self.slowdown = [1.0] * view.world_size   # every drift so far, per rank (the view's speeds)

    def replan(self, plan, factors: Sequence[float], steps_left: Optional[int] = None):
        """The plan to run the ``steps_left`` steps on (None: the faster step wins); its first note says
        what each option would cost."""
        from hcomm.parallel.planner import cost
        from hcomm.parallel.planner.tensor import rows_resplit

        self.view = slowed_view(self.view, factors)
        self.slowdown = [s * f for s, f in zip(self.slowdown, factors)]
        dim, n_layers = cost.model_shape(self.view.profiles[0])
        options = [(ROWS, rows_resplit(plan, self.view, dim, n_layers), 0.0)]
        refused = ""
        try:
            options.append((SHARDS, self.make(self.view, plan), reshard_seconds(self.view, plan, self.slowdown)))
        except ValueError as error:   # nothing fits at these speeds: the rows stand
            refused = f"; new shards refused: {str(error).splitlines()[0][:200]}"

        chosen, self.options = weigh(options, steps_left, refused)
        return keep_identity(plan, chosen)

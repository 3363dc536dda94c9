"""The ZeRO step in the one cost model: gathers and reduce-scatters against per-unit compute.

Same measured parts as cost.py: per-piece forward/backward seconds of each
rank (its profile; the pieces are ZeRO's units) and the comm layer's own
predictions of ``all_gather_v`` and ``reduce_scatter_v`` over the shard
group (sampled by ``cluster.discover``; half an all-reduce each where a view
has none), plus, for the island layout, the all-reduce of each shard across
islands.

One round (micro-batch) is simulated on two streams, as the engine runs it:
the gather stream issues unit j's gather ``prefetch`` units ahead of its
compute, in forward then backward order (stage 3; stages 1-2 gather every
unit once after the optimizer step, ahead of the next forward); the reduce
stream takes unit j's reduce-scatter when its backward ends.  Compute of a
unit starts when the previous unit's compute ended and its gather arrived.
Every rank waits for the slowest in each collective, so per unit the
slowest rank's compute is used.
"""
from __future__ import annotations

import math
from typing import List, Sequence, Tuple


def _unit_times(view, plan) -> Tuple[List[float], List[float], int]:
    """Slowest rank's (forward, backward) seconds per unit for one round, and rounds per step."""
    counts = plan.batch_counts()
    fwd = [0.0] * len(view.profiles[0].layers)
    bwd = list(fwd)
    rounds = 1
    for r, n in zip(plan.ranks, counts):
        if not n:
            continue
        m = min(r.micro_batch or n, n)
        rounds = max(rounds, math.ceil(n / m))
        p = view.profiles[r.rank]
        for u, c in enumerate(p.layers):
            fwd[u] = max(fwd[u], c.fwd_s * m / p.micro_batch)
            bwd[u] = max(bwd[u], c.bwd_s * m / p.micro_batch)
    return fwd, bwd, rounds


def _collective_times(view, dp):
    """bytes of a unit -> seconds of its gather and of its gradient reduction, for the plan's layout.

    The comm layer's own predictions of ``all_gather_v`` / ``reduce_scatter_v`` where the view
    sampled them; otherwise half an all-reduce each (a ring all-reduce is one of each)."""
    if dp.zero_layout == "flat":
        gather = view.gather_s or (lambda b: 0.5 * view.allreduce_s(b))
        scatter = view.reduce_scatter_s or (lambda b: 0.5 * view.allreduce(dp.compression)(b))
        return gather, scatter
    size = max(len(m) for m in view.islands)
    inner_g = view.island_gather_s or [lambda b, f=f: 0.5 * f(b) for f in view.island_allreduce_s]
    inner_r = view.island_reduce_scatter_s or [lambda b, f=f: 0.5 * f(b) for f in view.island_allreduce_s]
    across = view.allreduce(dp.compression)   # each shard, with the same shard of the other islands
    return (lambda b: max(f(b) for f in inner_g),
            lambda b: max(f(b) for f in inner_r) + across(b // size))


def choose_layout(view, plan) -> Tuple[str, List[str]]:
    """Flat or island layout, whichever the cost model predicts faster (island needs equal islands)."""
    import copy

    sizes = {len(m) for m in view.islands}
    if len(view.islands) < 2 or len(sizes) > 1:
        return "flat", []
    times = {}
    for layout in ("flat", "island"):
        trial = copy.deepcopy(plan)
        trial.dp_group().zero_layout = layout
        times[layout] = zero_step_s(view, trial)[0]
    best = min(times, key=times.get)
    other = "island" if best == "flat" else "flat"
    return best, [f"ZeRO layout {best} predicted {times[best] * 1e3:.0f} ms, {other} {times[other] * 1e3:.0f} ms"]


def zero_step_s(view, plan) -> Tuple[float, str]:
    """Predicted seconds per step of a ZeRO plan, and a one-line account of them."""
    stage = plan.ranks[0].zero_stage
    dp = plan.dp_group()
    layers = view.profiles[0].layers
    gather, scatter = _collective_times(view, dp)
    half = [gather(c.param_bytes) for c in layers]
    reduce = [scatter(c.param_bytes) for c in layers]
    fwd, bwd, rounds = _unit_times(view, plan)
    units = len(layers)
    ahead = dp.prefetch if stage == 3 else units
    kept = {units - 1} if dp.reshard_after_forward else set(range(units))
    total = 0.0
    for m in range(rounds):
        t, gather_free, reduce_free = 0.0, 0.0, 0.0
        arrive = {}
        gathers = [(u, "f") for u in range(units)] if (stage == 3 or m == 0) else []
        if stage == 3:
            gathers += [(u, "b") for u in reversed(range(units)) if u not in kept]
        issue_at = {}
        # forward: unit u's gather is issued when unit u - ahead starts computing
        starts = []
        for u in range(units):
            for g in [x for x in gathers if x[1] == "f" and x[0] <= u + ahead and x not in issue_at]:
                issue_at[g] = t
                gather_free = max(gather_free, t) + half[g[0]]
                arrive[g] = gather_free
            t = max(t, arrive.get((u, "f"), 0.0))
            starts.append(t)
            t += fwd[u]
        for u in reversed(range(units)):
            for g in [x for x in gathers if x[1] == "b" and x[0] >= u - ahead and x not in issue_at]:
                issue_at[g] = t
                gather_free = max(gather_free, t) + half[g[0]]
                arrive[g] = gather_free
            t = max(t, arrive.get((u, "b"), 0.0))
            t += bwd[u]
            if stage >= 2 or m == rounds - 1:
                reduce_free = max(reduce_free, t) + reduce[u]
        total += max(t, reduce_free)
    fractions = [1.0 / plan.world_size if r.shard_fraction is None else r.shard_fraction for r in plan.ranks]
    optimizer = max(o * f for o, f in zip(view.optimizer_s, fractions))
    compute = sum(fwd) + sum(bwd)
    step = total + optimizer
    note = (f"ZeRO-{stage} predicted {step * 1e3:.0f} ms: {rounds} round(s) of slowest compute "
            f"{compute * 1e3:.0f} ms each, {sum(half) * 1e3:.0f} ms per pass of gathers or reduce-scatters, "
            f"prefetch {dp.prefetch}, optimizer on the largest shard {optimizer * 1e3:.0f} ms")
    return step, note

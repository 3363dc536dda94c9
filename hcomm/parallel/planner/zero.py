"""The ZeRO step in the one cost model: gathers and reduce-scatters against per-unit compute.

Same measured parts as cost.py: per-piece forward/backward seconds of each
rank (its profile; the pieces are ZeRO's units) and the comm layer's own
predictions of ``all_gather_v`` and ``reduce_scatter_v`` over the shard
group (sampled by ``cluster.discover``; half an all-reduce each where a view
has none), plus, for the island layout, the all-reduce of each shard across
islands (every position at once, sharing the uplinks).

One round (micro-batch) is simulated on two streams, as the engine runs it:
the gather stream issues unit j's gather ``prefetch`` units ahead of its
compute, in forward then backward order (stage 3; stages 1-2 gather every
unit once after the optimizer step, ahead of the next forward); the reduce
stream takes unit j's reduce-scatter when its backward ends.  Compute of a
unit starts when the previous unit's compute ended and its gather arrived;
a backward also waits for the reduce-scatter ``GRAD_BUFFERS_IN_FLIGHT``
units back (the engine holds no more whole-unit gradient buffers).
Every rank waits for the slowest in each collective, so per unit the
slowest rank's compute is used.
"""
from __future__ import annotations

import math
from typing import List, Tuple

from hcomm.parallel.planner.cost import beside_compute, side_by_side_allreduce_s
from hcomm.parallel.zero.memory import GRAD_BUFFERS_IN_FLIGHT


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
    # each shard with the same shard of the other islands: the positions all-reduce side by side, through
    # the same uplinks
    positions = [[m[j] for m in view.islands] for j in range(size)]
    across = None if dp.compression in ("", "none") else view.allreduce(dp.compression)
    return (lambda b: max(f(b) for f in inner_g),
            lambda b: max(f(b) for f in inner_r) + side_by_side_allreduce_s(view, [(p, b // size) for p in positions],
                                                                              across))


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
    # collectives issued while the round still computes run slower beside it (the view's measured
    # slowdown; the round's compute alone is where it ends at the earliest)
    busy, slowdown = sum(fwd) + sum(bwd), view.overlap_slowdown
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
                begin = max(gather_free, t)
                gather_free = begin + beside_compute(half[g[0]], begin, busy, slowdown)
                arrive[g] = gather_free
            t = max(t, arrive.get((u, "f"), 0.0))
            starts.append(t)
            t += fwd[u]
        reduced = {}
        for u in reversed(range(units)):
            for g in [x for x in gathers if x[1] == "b" and x[0] >= u - ahead and x not in issue_at]:
                issue_at[g] = t
                begin = max(gather_free, t)
                gather_free = begin + beside_compute(half[g[0]], begin, busy, slowdown)
                arrive[g] = gather_free
            t = max(t, arrive.get((u, "b"), 0.0))
            # the engine holds at most GRAD_BUFFERS_IN_FLIGHT whole-unit gradient buffers: unit u's waits
            # for the reduce-scatter that many units back to hand its buffer over
            if stage >= 2:
                t = max(t, reduced.get(u + GRAD_BUFFERS_IN_FLIGHT, 0.0))
            t += bwd[u]
            if stage >= 2 or m == rounds - 1:
                begin = max(reduce_free, t)
                reduce_free = begin + beside_compute(reduce[u], begin, busy, slowdown)
                reduced[u] = reduce_free
        total += max(t, reduce_free)
    fractions = [1.0 / plan.world_size if r.shard_fraction is None else r.shard_fraction for r in plan.ranks]
    optimizer = max(o * f for o, f in zip(view.optimizer_s, fractions))
    compute = sum(fwd) + sum(bwd)
    step = total + optimizer
    note = (f"ZeRO-{stage} predicted {step * 1e3:.0f} ms: {rounds} round(s) of slowest compute "
            f"{compute * 1e3:.0f} ms each, {sum(half) * 1e3:.0f} ms per pass of gathers or reduce-scatters, "
            f"prefetch {dp.prefetch}, optimizer on the largest shard {optimizer * 1e3:.0f} ms")
    return step, note


def apply_zero(plan, view, stage: int, base: str, *, layout: str = "auto", prefetch: int = 1) -> None:
    """Turn a data-parallel plan into a ZeRO one: stage, shard fractions, layout, prefetch.

    ``layout`` "auto" takes the flat or island layout, whichever the cost
    model predicts faster (island only for equal-sized islands)."""
    import copy

    dp = plan.dp_group()
    for r in plan.ranks:
        r.zero_stage = stage
    if base == "uniform":
        plan.backend = "fsdp2-gloo" if stage >= 2 else "ddp-gloo"
        torch_name = "FSDP2 (fully_shard per piece, even shards)" if stage >= 2 else \
            "DDP + ZeroRedundancyOptimizer"
        plan.notes = [f"homogeneous baseline: equal batches, ZeRO-{stage} as torch does it: {torch_name} over gloo"]
        return
    dp.prefetch = prefetch
    candidates = [layout] if layout != "auto" else (
        ["flat", "island"] if len(view.islands) > 1 and len({len(m) for m in view.islands}) == 1 else ["flat"])
    trials = []
    for choice in candidates:
        trial = copy.deepcopy(plan)
        _shard(trial, view, stage, base, choice, prefetch)
        trials.append(trial)
    best = min(trials, key=lambda t: t.predicted_step_s)
    plan.ranks, plan.groups, plan.notes, plan.predicted_step_s = best.ranks, best.groups, best.notes, \
        best.predicted_step_s
    for other in trials:
        if other is not best:
            plan.notes.append(f"beat ZeRO layout {other.dp_group().zero_layout}: predicted "
                              f"{other.predicted_step_s * 1e3:.0f} ms")


def _shard(plan, view, stage: int, base: str, layout: str, prefetch: int) -> None:
    from hcomm.parallel.zero.memory import memory_fractions

    plan.dp_group().zero_layout = layout
    if layout == "island" and view.island_names:   # memory.check_zero_fits counts shard groups by label
        for r in plan.ranks:
            r.island = r.island or view.island_names[view.island_of(r.rank)]
    if base == "auto":
        counts = plan.batch_counts()
        in_flight = [min(r.micro_batch or n, n) for r, n in zip(plan.ranks, counts)]
        groups = [list(m) for m in view.islands] if layout == "island" else [list(range(plan.world_size))]
        for members in groups:
            fractions = memory_fractions(view.profiles, stage=stage, micro_samples=in_flight, prefetch=prefetch,
                                         members=members)
            # rounded for a readable plan, to enough digits that the rounding of thousands of shards
            # stays far below any one of them; the remainder goes to the largest shard (exact sum)
            digits = 6 + max(0, math.ceil(math.log10(len(members) / 100)))
            for r, f in zip(members, fractions):
                plan.ranks[r].shard_fraction = round(f, digits)
            largest = max(members, key=lambda r: plan.ranks[r].shard_fraction)
            plan.ranks[largest].shard_fraction = round(
                1.0 - sum(plan.ranks[r].shard_fraction for r in members if r != largest), digits + 3)
        if layout == "island":   # the island layout all-reduces shards position by position
            _align_positions(plan, view)
        plan.notes.append(f"ZeRO-{stage} ({layout}): shards sized by the memory left after activations: "
                          + ", ".join(f"rank {r.rank} {r.shard_fraction:.3f}" for r in plan.ranks))
    _predict_zero(plan, view)


def _align_positions(plan, view) -> None:
    """Island layout: the rank at position j of every island must hold the same fraction; take the
    smallest over the islands at each position (memory-safe), renormalised."""
    size = len(view.islands[0])
    low = [min(plan.ranks[m[j]].shard_fraction for m in view.islands) for j in range(size)]
    total = sum(low)
    fractions = [x / total for x in low] if total > 0 else [1.0 / size] * size
    fractions = [round(f, 9) for f in fractions[:-1]] + [round(1.0 - sum(round(f, 9) for f in fractions[:-1]), 9)]
    for members in view.islands:
        for j, r in enumerate(members):
            plan.ranks[r].shard_fraction = fractions[j]


def _predict_zero(plan, view) -> None:
    plan.predicted_step_s, note = zero_step_s(view, plan)
    plan.notes.append(note)

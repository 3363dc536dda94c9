"""Holding the search to measurement: the few best predicted plans each run a few real steps, and the
fastest measured one is trained (a near tie goes to the faster predicted: ``pick``).

The simulator ranks plans from profiles and link models; where a cost it does not model dominates
(on the emulator: small collectives cost ~3x their alpha-beta time under CPU quotas, and a pipeline of
TP groups issues hundreds of them per step) its order can be wrong, and a plan predicted 2x faster
can measure slower.  A trial costs seconds: ``TRIAL_STEPS`` steps of each of ``TRIAL_PLANS``
candidates (distinct kinds: the best ZeRO plan, the best pipeline, the best TP plan, ...) plus the
best plain data-parallel plan, every rank taking part, step time = the slowest rank's.  The steps are thrown away (a fresh model trains
the winner), so the losses of the run are the winner's alone.
"""
from __future__ import annotations

import statistics
import time
from typing import List, Tuple

import torch
import torch.distributed as dist

from hcomm.train.release import release_memory

TRIAL_PLANS = 3
TRIAL_STEPS = 4   # the first is left out (first-call costs)
# A pipeline's variant with fewer, larger micro-batches rides along when predicted within this factor
# of the search's best: the simulator's error on one-sample micro-batches was measured at 20-24 %.
VARIANT_WITHIN = 1.3
# Trial measurements this close to the fastest are a tie, and the simulator's order breaks it: a few steps
# on a shared box are not that exact (uneven, 2026-12-07: pp=2 x tp=3 1756 ms beat pp=2's 1769 in the
# trial, and pp=2 then trained at 1433-1464 ms where the other measured 1750).
TIE_WITHIN = 0.03


def distinct_kinds(candidates, k: int = TRIAL_PLANS) -> List:
    """The ``k`` fastest usable candidates of a search, at most one per kind of plan (the kinds differ
    in what the simulator might misjudge; two ZeRO stages do not); the best plain data-parallel plan
    as well when it fits: the kind the simulator predicts best, so the trial never loses to it; and
    each picked pipeline's variant of fewer micro-batches (``search.coarser``) when it is predicted
    within ``VARIANT_WITHIN`` of the best: how many micro-batches is the call it gets most wrong."""
    usable = [c for c in candidates if c.usable]
    picked, kinds = [], set()
    for c in usable:
        if c.sim.kind not in kinds and len(picked) < k and not c.variant_of:
            picked.append(c)
            kinds.add(c.sim.kind)
    plain = next((c for c in usable if c.sim.kind == "data"), None)
    if plain is not None and "data" not in kinds:
        picked.append(plain)
    labels = {c.label for c in picked}
    if usable:
        picked += [c for c in usable if c.variant_of in labels and c.step_s <= VARIANT_WITHIN * usable[0].step_s]
    return picked


def measure(args, plan, build_model, groups, train_tokens, steps: int = TRIAL_STEPS) -> float:
    """Median wall seconds per step of ``plan`` after its first step, the slowest rank's (the same
    number on every rank)."""
    from hcomm.parallel.parallelize import parallelize
    from hcomm.train.data import GlobalBatches
    from hcomm.train.loop import make_optimizer

    model = build_model()
    batches = GlobalBatches(train_tokens, plan.seq_len, plan.global_batch, seed=args.seed)
    pm = parallelize(model, plan, groups)
    optimizer = pm.make_optimizer(make_optimizer, args.lr)
    seconds = []
    try:
        for step in range(steps):
            dist.barrier(group=groups.default)
            start = time.perf_counter()
            pm.train_step(lambda offset, count: batches.rows(step, offset, count), optimizer)
            t = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=groups.default)
            seconds.append(float(t))
    finally:
        del optimizer
        pm.close()
        del pm, model
        release_memory()   # hooks hold the engine and the model in cycles: free them before the next plan
    return statistics.median(seconds[1:] or seconds)


def choose(args, plans, build_model, groups, train_tokens, rank: int) -> Tuple[int, List[float]]:
    """(index of the plan to train, ``pick``'s choice; every plan's measured seconds per step)."""
    measured = [measure(args, plan, build_model, groups, train_tokens) for plan in plans]
    best = pick(measured, [p.predicted_step_s for p in plans])
    if rank == 0:
        print("hcomm train: trial of the search's best plans (measured vs predicted ms per step): "
              + "; ".join(f"{p.name} {m * 1e3:.0f} vs {p.predicted_step_s * 1e3:.0f}"
                          for p, m in zip(plans, measured)) + f"; chosen: {plans[best].name}"
              + ("" if measured[best] == min(measured) else
                 f" (within {TIE_WITHIN:.0%} of the fastest measured, faster predicted)"), flush=True)
    return best, measured


def pick(measured: List[float], predicted: List[float]) -> int:
    """The fastest measured plan; among those measured within ``TIE_WITHIN`` of it, the fastest predicted."""
    fastest = min(measured)
    ties = [i for i, m in enumerate(measured) if m <= fastest * (1 + TIE_WITHIN)]
    return min(ties, key=lambda i: (predicted[i], measured[i]))

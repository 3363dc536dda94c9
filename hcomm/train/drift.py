"""What the training loop does when a rank's speed drifts (``parallel.straggler`` decides when).

- Data parallelism -- plain, ZeRO (shards stay, each rank runs more or fewer rounds of its micro-batch)
  or across TP groups (a group's rows move as one) -- re-splits the batch by the seconds per sample just
  measured: only rows move.  TP groups may instead get new shards (``reshard_tensor``: the slow member a
  smaller fraction, the state cut again), when the planner predicts that pays for the move.
- A pipeline -- of ranks, or of TP groups (each group one device, its shards keeping their shapes) --
  is cut again by the planner on the drifted speeds (``planner.replan``) and its state -- parameters
  and AdamW's moments of the pieces that change hands -- moves there in memory (``pipeline.restage``),
  at the step boundary: nothing is lost, the next step trains on the new cuts.

Also the rehearsal hook ``HCOMM_TRAIN_SLOW``: a rank that turns slow mid-run, on any box.
"""
from __future__ import annotations

import math
import time
from typing import List

import torch
import torch.distributed as dist

from hcomm.settings import declare

HCOMM_TRAIN_SLOW = declare(
    "HCOMM_TRAIN_SLOW", "",
    "test hook for hcomm train: 'RANK:STEP:SECONDS' makes rank RANK sleep SECONDS per sample in the forward of "
    "every piece it computes from step STEP (0-based) on, to rehearse a device that turned slow mid-run")


def per_sample_everywhere(busy_s: float, samples: int, group, rank: int, world: int):
    """(every rank's busy seconds per sample of this step, nan where it ran none; every rank's
    samples), the same on every rank: one all-reduce of a vector where each rank fills its own slots
    (adding zeros is exact, so every rank takes the same decision without a broadcast)."""
    mine = torch.zeros(2 * world, dtype=torch.float64)
    mine[rank], mine[world + rank] = busy_s, samples
    dist.all_reduce(mine, group=group)
    seconds, counts = mine[:world].tolist(), [int(n) for n in mine[world:].tolist()]
    return [s / n if n else math.nan for s, n in zip(seconds, counts)], counts


def _said(drift: List[float], drifted: List[int]) -> str:
    return f"rank(s) {drifted} drifted " + ", ".join(f"{drift[r]:+.0%}" for r in drifted)


def resplit_rows(pm, per_sample: List[float], old: List[int], drift: List[float], drifted: List[int],
                 after: int, plan, rank: int) -> dict:
    """Data parallelism (plain, ZeRO, or across TP groups): re-split by the seconds per sample just
    measured (ranks that ran no samples stay out).  ``old``: every rank's rows this step.

    The unit that holds rows is a rank, or a TP group (its ranks compute its rows together and wait for
    each other inside every layer, so the group runs at its slowest member's seconds per sample); the plan's
    convention puts a group's rows on its first rank, the others hold 0."""
    from hcomm.parallel.planner.data import rebalanced_counts

    leaders = plan.rows_leaders()
    slowest = {u: math.nan for u in leaders}   # one pass: a unit's slowest measured member
    for u, s in zip(leaders, per_sample):
        if not math.isnan(s) and not s <= slowest[u]:
            slowest[u] = s
    units = sorted(slowest)
    unit_new = rebalanced_counts([1.0 if math.isnan(slowest[u]) else slowest[u] for u in units],
                                 plan.global_batch, [old[u] for u in units])
    new = [0] * len(old)
    for u, n in zip(units, unit_new):
        new[u] = n
    old = [n if leaders[r] == r else 0 for r, n in enumerate(old)]   # the plan's convention too
    if new != old:
        pm.resplit(new)
    if rank == 0:
        print(f"hcomm train: {_said(drift, drifted)} from their seconds per sample for "
              f"{plan.dp_group().straggler_patience} steps: re-split after step {after}: {old} -> {new}", flush=True)
    return {"after_steps": after, "drifted": drifted, "drift": [drift[r] for r in drifted],
            "ms_per_sample": [s * 1e3 for s in per_sample], "from": old, "to": new}


def recut_pipeline(pm, optimizer, replanner, per_sample: List[float], drift: List[float], drifted: List[int],
                   after: int, steps_left: int, build_optimizer, lr: float, rank: int):
    """A pipeline: rank 0 weighs keeping the cuts, re-cutting in place and a new plan for the
    ``steps_left`` steps (``planner.replan``; every rank gets the choice, or its ValueError), the state
    moves to the plan chosen.  (ParallelModel, optimizer, record)."""
    from hcomm.parallel.pipeline.restage import restage

    old = pm.plan
    plan, options = _replanned(replanner, old, drift, steps_left, rank)
    cuts, new_cuts = _layout(old), _layout(plan)
    moved_s = 0.0
    if new_cuts != cuts:
        start = time.perf_counter()
        pm, optimizer = restage(pm, optimizer, plan, build_optimizer, lr)
        moved_s = time.perf_counter() - start
    what = "re-cut" if new_cuts != cuts else "kept"
    if rank == 0:
        done = (f"re-cut the pipeline after step {after} (ranks, piece cuts, rows, micro-batches): {cuts} -> "
                f"{new_cuts}" if what == "re-cut" else f"kept the pipeline's cuts after step {after}")
        print(f"hcomm train: {_said(drift, drifted)} from their busy seconds per sample for "
              f"{old.dp_group().straggler_patience} steps: {done}; {plan.notes[0]}"
              + (f"; state moved in {moved_s * 1e3:.0f} ms" if what == "re-cut" else ""), flush=True)
    record = {"after_steps": after, "drifted": drifted, "drift": [drift[r] for r in drifted], "what": what,
              "choice": plan.notes[0].split(":", 1)[0],
              "ms_per_sample": [s * 1e3 for s in per_sample], "from": cuts, "to": new_cuts,
              "predicted_ms": (plan.predicted_step_s or math.nan) * 1e3, "moved_s": moved_s}
    if rank == 0:
        record["options"] = options
    return pm, optimizer, record


def _replanned(replanner, old, drift: List[float], steps_left: int, rank: int):
    """Rank 0's re-plan of ``old`` at the drifted speeds, on every rank (or its ValueError), and on rank 0
    each option's predicted step and move (where the choice was made; [] elsewhere)."""
    from hcomm.parallel.plan import Plan
    from hcomm.train.worker import _on_rank0

    factors = [1.0 + d if math.isfinite(d) else 1.0 for d in drift]
    plan = Plan.from_yaml(_on_rank0(lambda: replanner.replan(old, factors, steps_left).to_yaml(), rank))
    options = [{"what": w, "step_ms": s * 1e3, "move_s": m} for w, s, m in replanner.options] if rank == 0 else []
    return plan, options


def reshard_tensor(pm, optimizer, replanner, per_sample: List[float], counts: List[int], drift: List[float],
                   drifted: List[int], after: int, steps_left: int, build_optimizer, lr: float, rank: int):
    """TP groups: rank 0 weighs re-splitting the rows against new shards for the ``steps_left`` steps
    (``planner.replan_tensor``; every rank gets the choice); new shards move the state
    (``tensor.reshard``), the rows re-split by the seconds just measured (``resplit_rows``).
    (ParallelModel, optimizer, record)."""
    from hcomm.parallel.planner.replan_tensor import SHARDS
    from hcomm.parallel.tensor.reshard import reshard

    old = pm.plan
    plan, options = _replanned(replanner, old, drift, steps_left, rank)
    if not plan.notes[0].startswith(SHARDS):
        record = resplit_rows(pm, per_sample, counts, drift, drifted, after, old, rank)
        return pm, optimizer, dict(record, what="re-split", options=options)
    start = time.perf_counter()
    pm, optimizer = reshard(pm, optimizer, plan, build_optimizer, lr)
    moved_s = time.perf_counter() - start
    before, now = _tp_layout(old), _tp_layout(plan)
    if rank == 0:
        print(f"hcomm train: {_said(drift, drifted)} from their own seconds per sample (TP waits left out) for "
              f"{old.dp_group().straggler_patience} steps: new TP shards after step {after} (groups, fractions, "
              f"rows): {before} -> {now}; {plan.notes[0]}; state moved in {moved_s * 1e3:.0f} ms", flush=True)
    return pm, optimizer, {"after_steps": after, "drifted": drifted, "drift": [drift[r] for r in drifted],
                           "what": "re-sharded", "ms_per_sample": [s * 1e3 for s in per_sample], "from": before,
                           "to": now, "predicted_ms": (plan.predicted_step_s or math.nan) * 1e3,
                           "moved_s": moved_s, "options": options,
                           "phases_s": getattr(pm, "reshard_phases", {})}


def _tp_layout(plan) -> List[list]:
    """Per TP group: [its ranks in shard order, their fractions, its rows]."""
    counts = plan.batch_counts()
    return [[g.ranks, [plan.ranks[r].tp_fraction for r in g.ranks], counts[g.ranks[0]]]
            for g in plan.tensor_groups()]


def _layout(plan) -> List[list]:
    """Per pipeline replica: [its ranks in stage order, its piece cuts, its rows, its micro-batches]."""
    counts = plan.batch_counts()
    return [[g.ranks, g.cuts, counts[g.ranks[0]], g.micro_batches] for g in plan.pipeline_groups()]


def slow_hook(model, rank: int):
    """The ``HCOMM_TRAIN_SLOW`` rehearsal on ``model``'s pieces: (a callable the loop tells each step's
    index, the hook handles to remove), or (None, []) when unset or for another rank."""
    value = HCOMM_TRAIN_SLOW.get()
    if not value:
        return None, []
    try:
        who, start, seconds = value.split(":")
        who, start, seconds = int(who), int(start), float(seconds)
    except ValueError:
        raise ValueError(f"HCOMM_TRAIN_SLOW={value!r}: expected RANK:STEP:SECONDS, e.g. 1:4:0.05") from None
    if who != rank:
        return None, []
    from hcomm.models.llama import layer_modules

    now = {"step": 0}

    def sleep(module, inputs):
        if now["step"] >= start:
            time.sleep(seconds * inputs[0].shape[0])

    handles = [piece.register_forward_pre_hook(sleep) for piece in layer_modules(model)]
    return (lambda step: now.__setitem__("step", step)), handles

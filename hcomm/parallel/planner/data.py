"""Choosing the data-parallel part of a plan: batch shares, micro-batches, buckets.

The search, all through the one cost model (``cost.dp_step``):

- micro-batch per rank: the most samples whose activations fit the rank's
  memory budget next to its parameters, gradients and optimizer state (a
  rank whose state alone does not fit is an error: plain data parallelism
  keeps a full replica on every rank);
- batch counts: identical samples on machines of different speeds, so
  handing out samples one at a time to the rank that would finish first is
  optimal for the compute makespan (LPT on uniform machines); candidates
  also drop the slowest ranks to share 0, and the equal split;
- bucket size: every power of two from 256 KiB to 256 MiB, and one bucket;
- what changes the numerics (weak-tier compression, sync every H > 1) is
  only used when asked for; the notes say what it would have gained.

The best predicted candidate becomes the plan; the others are kept as the
alternatives it beat.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import List, Optional, Sequence

from hcomm.parallel.cluster import ClusterView
from hcomm.parallel.plan import GroupPlan, Plan, RankPlan, apportion
from hcomm.parallel.planner import cost

BUCKET_CANDIDATES = [1 << k for k in range(18, 29)]  # 256 KiB .. 256 MiB
MAX_MICRO_BATCH = 64


class PlanningError(ValueError):
    """No plan can run: the message names the rank and the numbers."""


@dataclass
class Candidate:
    label: str
    counts: List[int]
    bucket_bytes: int
    estimate: cost.StepEstimate

    @property
    def step_s(self) -> float:
        return self.estimate.step_s


def micro_batch_limits(view: ClusterView, extra_state_bytes: int = 0, zero_stage: int = 0) -> List[int]:
    """Largest micro-batch each rank's memory holds (raises if the model itself does not fit).

    Under ZeRO only what stays whole is counted (zero/memory.py at fraction 0): the shards are
    sized later by the memory left, and the plan with its fractions is checked then."""
    limits = []
    for rank, p in enumerate(view.profiles):
        if zero_stage:
            from hcomm.parallel.zero.memory import zero_memory

            state = sum(zero_memory(p, stage=zero_stage, fraction=0.0, micro_samples=0).values())
        else:
            state = p.state_bytes()
        state += extra_state_bytes
        free = p.memory_budget_bytes - state
        per_sample = max(1, sum(c.act_bytes_per_sample for c in p.layers))
        if free < per_sample:
            raise PlanningError(
                f"the model does not fit rank {rank} ({view.devices[rank]}): parameters, gradients and "
                f"optimizer state need {state / 2**30:.2f} GiB plus {per_sample / 2**20:.1f} MiB of activations "
                f"per sample; its memory budget is {p.memory_budget_bytes / 2**30:.2f} GiB")
        limits.append(min(MAX_MICRO_BATCH, free // per_sample))
    return limits


def lpt_counts(seconds_per_sample: Sequence[float], total: int, allowed: Sequence[bool]) -> List[int]:
    """Samples per rank minimising the slowest rank's time: each sample to the rank finishing first."""
    counts = [0] * len(seconds_per_sample)
    heap = [(s, r) for r, s in enumerate(seconds_per_sample) if allowed[r]]
    if not heap:
        raise PlanningError("no rank may take samples")
    heapq.heapify(heap)
    for _ in range(total):
        finish, r = heapq.heappop(heap)
        counts[r] += 1
        heapq.heappush(heap, (finish + seconds_per_sample[r], r))
    return counts


def rebalanced_counts(seconds_per_sample: Sequence[float], global_batch: int,
                      current: Sequence[int]) -> List[int]:
    """Counts from per-sample seconds measured in training (LPT); ranks that had no samples stay at 0
    (nothing was measured for them, and the plan chose to leave them out)."""
    allowed = [n > 0 for n in current]
    return lpt_counts([s if a else 1.0 for s, a in zip(seconds_per_sample, allowed)], global_batch, allowed)


def _seconds_per_sample(view: ClusterView) -> List[float]:
    return [(p.fwd_s + p.bwd_s) / p.micro_batch for p in view.profiles]


MAX_DROP_CANDIDATES = 32


def _drop_counts(per_sample: Sequence[float], by_speed: Sequence[int]) -> List[int]:
    """How many of the slowest ranks to try leaving out of the compute (they still reduce): every count
    on a small cluster; on a large one only whole speed classes (a step of more than 2 % in seconds per
    sample), at most MAX_DROP_CANDIDATES of them evenly spaced -- a 1,024-rank cluster of three kinds
    needs 2 tries, not 1,023 (each costs a step estimate per bucket size)."""
    world = len(by_speed)
    if world <= 16:
        return list(range(1, world))
    cuts = [k for k in range(1, world)
            if per_sample[by_speed[k - 1]] > 1.02 * per_sample[by_speed[k]]]
    if len(cuts) > MAX_DROP_CANDIDATES:
        cuts = [cuts[round(i * (len(cuts) - 1) / (MAX_DROP_CANDIDATES - 1))] for i in range(MAX_DROP_CANDIDATES)]
    return cuts


def _share_candidates(view: ClusterView, global_batch: int, pinned: Optional[Sequence[float]]):
    if pinned is not None:
        yield "pinned shares", apportion(list(pinned), global_batch)
        return
    world = view.world_size
    per_sample = _seconds_per_sample(view)
    yield "shares by measured speed", lpt_counts(per_sample, global_batch, [True] * world)
    by_speed = sorted(range(world), key=lambda r: -per_sample[r])  # slowest first
    for dropped in _drop_counts(per_sample, by_speed):
        allowed = [r not in by_speed[:dropped] for r in range(world)]
        if sum(allowed) == 0 or global_batch < sum(allowed):
            break
        names = ", ".join(str(r) for r in sorted(by_speed[:dropped]))
        yield f"speed shares, ranks {names} reduce only", lpt_counts(per_sample, global_batch, allowed)
    yield "equal shares", apportion([1.0] * world, global_batch)


def _estimate(view: ClusterView, counts, bucket_bytes, micro, sync_every: int, compression: str = "none",
              outer_overlap: bool = False):
    if sync_every <= 1:
        return cost.dp_step(view.profiles, counts, bucket_bytes, view.allreduce(compression), micro_batches=micro,
                            optimizer_s=max(view.optimizer_s), overlap_slowdown=view.overlap_slowdown,
                            compute_weights=view.cpu_share or None)
    # Islands step on their own between outer syncs: the slowest island sets the pace, and the
    # outer all-reduce of the parameters crosses the weak tier once every H steps.
    per_island = []
    for i, members in enumerate(view.islands):
        per_island.append(cost.dp_step([view.profiles[r] for r in members], [counts[r] for r in members],
                                       bucket_bytes, view.island_allreduce_s[i],
                                       micro_batches=[micro[r] for r in members],
                                       optimizer_s=max(view.optimizer_s[r] for r in members)))
    worst = max(per_island, key=lambda e: e.step_s)
    outer = view.allreduce(compression)(view.profiles[0].param_bytes)
    if outer_overlap:  # hidden behind the next H inner steps, except what exceeds them
        outer = max(0.0, outer - sync_every * worst.step_s)
    worst.outer_s = outer / sync_every
    worst.step_s += worst.outer_s
    worst.compute_s = [0.0] * view.world_size
    for i, members in enumerate(view.islands):
        for k, r in enumerate(members):
            worst.compute_s[r] = per_island[i].compute_s[k]
    return worst


def plan_data_parallel(view: ClusterView, global_batch: int, seq_len: int, *,
                       shares: Optional[Sequence[float]] = None, bucket_bytes: Optional[int] = None,
                       sync_every: int = 1, compression: str = "none", outer_overlap: bool = False,
                       rebalance_after: int = 0, name: str = "auto", zero_stage: int = 0) -> tuple:
    """(plan, candidates sorted by predicted step time) for data parallelism on ``view``."""
    if global_batch < 1:
        raise PlanningError(f"global_batch must be >= 1, got {global_batch}")
    extra = 2 * view.profiles[0].param_bytes if sync_every > 1 else 0  # outer anchor + momentum
    limits = micro_batch_limits(view, extra, zero_stage)
    buckets = [bucket_bytes] if bucket_bytes else BUCKET_CANDIDATES + [view.profiles[0].param_bytes + 4]
    candidates: List[Candidate] = []
    for label, counts in _share_candidates(view, global_batch, shares):
        for b in buckets:
            est = _estimate(view, counts, b, limits, sync_every, compression, outer_overlap)
            candidates.append(Candidate(label, counts, b, est))
    candidates.sort(key=lambda c: c.step_s)
    best = candidates[0]
    plan = _to_plan(view, best, limits, global_batch, seq_len, sync_every, compression, name)
    plan.dp_group().outer_overlap = outer_overlap
    plan.dp_group().rebalance_after = rebalance_after if shares is None and sync_every == 1 else 0
    if plan.dp_group().rebalance_after:
        plan.notes.append(f"after {rebalance_after} steps the batch is re-split by the compute each rank shows "
                          f"in training (the profile times layers alone)")
    plan.notes = _notes(view, best, candidates, limits, sync_every, compression)
    return plan, candidates


def _to_plan(view, best: Candidate, limits, global_batch, seq_len, sync_every, compression, name) -> Plan:
    total = sum(best.counts)
    ranks = [RankPlan(rank=r, batch_share=best.counts[r] / total, device=view.devices[r],
                      island=view.island_names[view.island_of(r)] if view.island_names else "",
                      micro_batch=int(limits[r]))
             for r in range(view.world_size)]
    group = GroupPlan(name="dp", ranks=list(range(view.world_size)), bucket_bytes=int(best.bucket_bytes),
                      compression=compression, sync_every=sync_every)
    plan = Plan(global_batch=global_batch, seq_len=seq_len, ranks=ranks, groups=[group], name=name,
                backend="hcomm", predicted_step_s=best.step_s)
    return plan.validate(view.world_size)


def _notes(view, best: Candidate, candidates: List[Candidate], limits, sync_every, compression) -> List[str]:
    e = best.estimate
    notes = [f"chose {best.label}, {best.bucket_bytes / 2**20:g} MiB buckets: predicted {e.step_s * 1e3:.0f} ms "
             f"(slowest compute {max(e.compute_s) * 1e3:.0f} ms, exposed comm {e.comm_exposed_s * 1e3:.0f} ms of "
             f"{e.comm_total_s * 1e3:.0f} ms in {e.buckets} buckets, optimizer {e.optimizer_s * 1e3:.0f} ms"
             + (f", outer sync {e.outer_s * 1e3:.0f} ms/step" if e.outer_s else "") + f"; {e.bottleneck}-bound)"]
    seen = {best.label}
    for c in candidates[1:]:
        if c.label in seen:
            continue
        seen.add(c.label)
        notes.append(f"beat {c.label} {c.counts} (best bucket {c.bucket_bytes / 2**20:g} MiB): "
                     f"{c.step_s * 1e3:.0f} ms, {c.step_s / best.step_s:.2f}x slower")
    same_shares = [c for c in candidates if c.label == best.label]
    worst_bucket = max(same_shares, key=lambda c: c.step_s)
    notes.append(f"bucket sizes for these shares: {best.step_s * 1e3:.0f} ms at {best.bucket_bytes / 2**20:g} MiB "
                 f".. {worst_bucket.step_s * 1e3:.0f} ms at {worst_bucket.bucket_bytes / 2**20:g} MiB")
    notes.append("micro-batch limits from memory: " + ", ".join(f"rank {r}: {m}" for r, m in enumerate(limits)))
    if sync_every == 1 and len(view.islands) > 1:
        outer = _estimate(view, best.counts, best.bucket_bytes, limits, 8, compression)
        notes.append(f"not taken (changes the numerics): cross-island sync every 8 steps would predict "
                     f"{outer.step_s * 1e3:.0f} ms ({best.step_s / outer.step_s:.2f}x); ask with --sync-every")
    return notes

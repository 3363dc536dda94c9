"""Pipeline plans: which ranks form each pipeline replica, in which order, which pieces every stage
holds, how many rows each replica takes, and the schedule and micro-batch count.

One cost model: ``pipeline.partition`` simulates the schedule from the measured per-piece costs of
each stage's own device and the links between them (``ClusterView.p2p_s``); replicas of a stage
sync their gradients with the all-reduce the comm layer predicts; the optimizer step is the rank's
measured one, scaled to the parameters it holds.

Splits (``split``):

- ``auto``: the exact partition and device order (``schedule_choice.choose_schedule``), over the
  schedules and micro-batch counts allowed; with several replicas, the ranks are grouped into
  replicas two ways (every replica the same mix of devices; or like devices together, rows by
  speed) and the faster prediction wins;
- ``uniform``: Megatron's split, equal blocks per stage, ranks in order, equal rows;
- ``parameters``: DeepSpeed's ``partition_method='parameters'``, otherwise as ``uniform``.

Replicas of a stage must hold the same pieces (their gradients are all-reduced position by
position), so one replica (the leader) chooses the cuts and the others take the best device order
and micro-batch count for those cuts.  The leader's fastest plan alone is not always the grouping's
(the others run its cuts on other devices and all share uplinks and stage sync), so its best plan per
micro-batch count (``LEADS``) is tried for the whole grouping.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from hcomm.parallel.pipeline.partition import MAX_NODES, MAX_ORDER_DEVICES, evaluate, parameter_cuts, uniform_cuts
from hcomm.parallel.pipeline.schedule_choice import ScheduleChoice, choose_schedule, micro_batch_counts
from hcomm.parallel.pipeline.schedule_cost import SCHEDULES, step_time
from hcomm.parallel.plan import GroupPlan, Plan, RankPlan, apportion
from hcomm.parallel.planner.pipeline_step import replicas_step_s, transfer_costs, uplink_floor_s

SPLITS = ("auto", "uniform", "parameters")
# Up to this many devices the replica groupings by island are tried beside those by speed (each grouping
# is a full pipeline search: above it the joint search's time bar on 4,096 devices wins).
ISLAND_GROUPINGS_UP_TO = 16
MAX_MICRO_BATCHES = 16
# With several replicas the leader's own fastest plan is not the grouping's: the others take its cuts and
# micro-batch count on other devices, and all share the uplinks and the stage sync.  On `uneven` (3
# replicas of 2 stages) the leader's best ran 8 micro-batches of 1 and the grouping predicted 1683 ms; its
# best at 2 micro-batches of 4 gave the grouping 1373 ms (auto@pp=2 measured 1240).  So the leader's best
# plan per micro-batch count, up to LEADS of them within LEAD_WITHIN of its best, is tried for the whole.
LEADS = 4
LEAD_WITHIN = 1.5


@dataclass(frozen=True)
class Effort:
    """How hard the partition search works per (schedule, micro-batch count).  The defaults are exact on
    the pipelines a live job runs; the joint search over a large cluster lowers them (``partition``
    then reports ``exact=False`` and the gap it could not close).  Pipelines longer than
    ``MAX_ORDER_DEVICES`` keep their replica's device order (the order search is exhaustive)."""
    max_micro_batches: int = MAX_MICRO_BATCHES
    max_nodes: int = MAX_NODES
    schedules: Tuple[str, ...] = tuple(SCHEDULES)
    most_counts: int = 0   # > 0: only this many micro-batch counts, the largest (fewest bubbles, least memory)
    bound_only: bool = False   # rank partitions by their proven lower bound, simulate only the best
    follow_leader: bool = False   # other replicas take the leader's device order by class (no order search)
    refine_rows: bool = True      # predict again with rows inverse to each replica's predicted time per row
    leads: int = LEADS            # the leader's best plans (one per micro-batch count) tried for the whole grouping

    def counts(self, rows: int, stages: int) -> Optional[List[int]]:
        if not self.most_counts:
            return None
        every = micro_batch_counts(rows, self.max_micro_batches)
        deep = [m for m in every if m >= stages] or every
        return deep[-self.most_counts:]


EXACT = Effort()


def boundary_bytes(dim: int, seq_len: int, element_bytes: int = 4) -> int:
    """Bytes per sample crossing a stage boundary: one hidden state per token (fp32)."""
    return dim * seq_len * element_bytes


_SECONDS: Dict[int, Tuple[list, float]] = {}   # id(profile.layers) -> (the list, its fwd + bwd seconds)


def model_seconds(profile) -> float:
    """Forward + backward seconds of the whole model at the profile's micro-batch.  Cached per piece
    list: a large cluster shares one list per device class, and the planners ask once per rank."""
    hit = _SECONDS.get(id(profile.layers))
    if hit is None or hit[0] is not profile.layers:   # (keeping the list alive keeps its id unique)
        hit = _SECONDS[id(profile.layers)] = (profile.layers, sum(c.fwd_s + c.bwd_s for c in profile.layers))
    return hit[1]


def rank_speed(profile) -> float:
    """Samples per second of forward and backward of the whole model on this rank."""
    return profile.micro_batch / max(1e-12, model_seconds(profile))


def replica_groupings(view, stages: int, split: str) -> List[Tuple[str, List[List[int]]]]:
    """Candidate replica groupings (each a list of replicas, each a list of global ranks)."""
    world = view.world_size
    if stages < 1 or world % stages:
        raise ValueError(f"--pp {stages}: the {world} ranks do not form equal pipelines of {stages} stages")
    count = world // stages
    in_order = [list(range(i * stages, (i + 1) * stages)) for i in range(count)]
    if split != "auto" or count == 1:
        return [("ranks in order", in_order)]
    fastest = sorted(range(world), key=lambda r: (-rank_speed(view.profiles[r]), r))
    mixed: List[List[int]] = [[] for _ in range(count)]
    for i, r in enumerate(fastest):   # snake order: every replica gets a like mix of speeds
        lap, j = divmod(i, count)
        mixed[j if lap % 2 == 0 else count - 1 - j].append(r)
    alike = [fastest[i * stages:(i + 1) * stages] for i in range(count)]
    out = [("each replica the same mix of devices", mixed), ("like devices together", alike)]
    if len(view.islands) > 1 and world <= ISLAND_GROUPINGS_UP_TO:
        # Where the islands are, not only the speeds: devices of equal speed in two islands fall into
        # either grouping above by the noise of their profiles, and the two cost very differently -- a
        # replica across the islands sends its activations over the uplinks, replicas inside islands
        # sync their stages over them (two-islands, pp=2: 743 ms vs 1615 ms measured).
        by_island = [sorted(m, key=fastest.index) for m in view.islands]
        dealt = [r for turn in itertools.zip_longest(*by_island) for r in turn if r is not None]
        packed = [r for m in by_island for r in m]
        out += [("each replica across the islands", [dealt[i * stages:(i + 1) * stages] for i in range(count)]),
                ("each replica inside an island", [packed[i * stages:(i + 1) * stages] for i in range(count)])]
    seen, unique = set(), []
    for label, replicas in out:
        key = frozenset(frozenset(m) for m in replicas)
        if key not in seen:
            seen.add(key)
            unique.append((label, [sorted(m) for m in replicas]))
    return unique


class _Replica:
    """One replica's prediction for given cuts: device order, micro-batches, step seconds."""

    def __init__(self, ranks: List[int], rows: int, part, order: List[int]):
        self.ranks, self.rows, self.part = ranks, rows, part
        self.order = order          # global ranks in pipeline order

    @property
    def step_s(self) -> float:
        return self.part.step_s if self.part is not None else 0.0


def plan_pipeline(view, global_batch: int, seq_len: int, *, stages: int, boundary: int, split: str = "auto",
                  schedule: Optional[str] = None, micro_batches: Optional[int] = None, name: str = "",
                  bucket_bytes: Optional[int] = None, compression: str = "none", effort: Effort = EXACT) -> Plan:
    """The pipeline plan for ``stages`` stages per replica (see the module docstring)."""
    if split not in SPLITS:
        raise ValueError(f"pipeline split must be one of {', '.join(SPLITS)}, got {split!r}")
    if schedule is not None and schedule not in SCHEDULES:
        raise ValueError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    n_pieces = len(view.profiles[0].layers)
    if stages > n_pieces:
        raise ValueError(f"--pp {stages}: the model has only {n_pieces} pieces (embedding, blocks, norm, head); "
                         f"every stage needs at least one")
    trials = []
    for label, replicas in replica_groupings(view, stages, split):
        if micro_batches is not None and global_batch % micro_batches:
            raise ValueError(f"--microbatches {micro_batches} does not divide --global-batch {global_batch}")
        trials.append((label, *_plan_grouping(view, replicas, global_batch, boundary, split, schedule,
                                              micro_batches, effort)))
    trials.sort(key=lambda t: t[1])
    label, step_s, replicas, choice, sync_s, opt_s = trials[0]
    plan = _to_plan(view, replicas, choice, global_batch, seq_len, name or split, bucket_bytes)
    plan.dp_group().compression = compression   # the stage replicas' gradient all-reduce, weak tier only
    plan.predicted_step_s = step_s
    lead = replicas[0].part
    plan.notes = [f"pipeline ({split} split): {len(replicas)} replica(s) of {stages} stages, {label}; "
                  f"rows {[r.rows for r in replicas]}; predicted step {step_s * 1e3:.0f} ms = slowest replica "
                  f"{max(r.step_s for r in replicas) * 1e3:.0f} ms (uplinks' load "
                  f"{uplink_floor_s(view, replicas, boundary) * 1e3:.0f} ms) + stage gradient sync "
                  f"{sync_s * 1e3:.0f} ms + optimizer {opt_s * 1e3:.0f} ms",
                  f"balanced ideal of replica 0 (every stage the same time: work split continuously by speed, "
                  f"free links, same schedule; uneven stages can beat it under interleaving): "
                  f"{balanced_ideal_s(view, replicas[0].order, lead) * 1e3:.0f} ms",
                  *str(lead).splitlines()]
    if choice is not None:
        plan.notes += [line for line in str(choice).splitlines()[len(str(lead).splitlines()):][:8]]
    for other in trials[1:]:
        plan.notes.append(f"beat grouping '{other[0]}': predicted {other[1] * 1e3:.0f} ms")
    return plan


def balanced_ideal_s(view, order: Sequence[int], part) -> float:
    """The step of a perfectly balanced pipeline on these devices: the work of one micro-batch split so
    every stage takes the same time (fractions inverse to each device's time), free links, the same
    schedule and micro-batch count.  The issue's reference point, not a lower bound: with interleaving,
    unequal chunks (a light first one) can shrink the bubble below it."""
    if part is None:
        return 0.0
    mb = part.micro_batch
    fwd = [sum(c.fwd_at(mb, view.profiles[r].micro_batch) for c in view.profiles[r].layers) for r in order]
    bwd = [sum(c.bwd_at(mb, view.profiles[r].micro_batch) for c in view.profiles[r].layers) for r in order]
    share = 1.0 / sum(1.0 / (f + b) for f, b in zip(fwd, bwd))   # each device's fraction x_d = share / w_d
    k = len(order) * part.virtual_stages
    f_ratio = sum(fwd) / (sum(fwd) + sum(bwd))
    per_stage = share / part.virtual_stages
    t, _, _ = step_time([per_stage * f_ratio] * k, [per_stage * (1 - f_ratio)] * k, [0.0] * (k - 1), part.micro_batches,
                        part.schedule, part.virtual_stages)
    return t


def _plan_grouping(view, replicas: List[List[int]], global_batch: int, boundary: int, split: str,
                   schedule: Optional[str], micro_batches: Optional[int], effort: Effort = EXACT):
    """(step seconds, replicas, the leader's ScheduleChoice, sync seconds, optimizer seconds) of one grouping."""
    unit = micro_batches or 1
    if split == "auto":
        weights = [sum(rank_speed(view.profiles[r]) for r in ranks) for ranks in replicas]
    else:
        weights = [1.0] * len(replicas)
    starts = [[n * unit for n in apportion(weights, global_batch // unit)]]
    if split == "auto" and len(replicas) > 1 and effort.leads > 1 and global_batch % (unit * len(replicas)) == 0:
        # Equal rows as a second start: rows by speed can be counts no good micro-batch count divides
        # (uneven's devices, 3 replicas of 2 stages: rows 8, 5, 11 left the leader 1 or 11 micro-batches,
        # 5.34 s; equal rows run 8 each, 4.26 s -- test_equal_rows_are_tried_beside_rows_by_speed).
        starts.append([global_batch // len(replicas)] * len(replicas))
    best = None
    choices: Dict[tuple, ScheduleChoice] = {}
    # Each way of choosing the leader's plan refines the rows from its own first prediction (the rows it
    # re-splits to differ), so the leader's best alone is kept as a path of its own: trying more leads
    # never ends slower than trying one.
    for leads, first in itertools.product(sorted({1, effort.leads if len(replicas) > 1 else 1}), starts):
        rows = first
        for _ in range(2 if split == "auto" and len(replicas) > 1 and effort.refine_rows else 1):
            result = _predict(view, replicas, rows, boundary, split, schedule, micro_batches,
                              dataclasses.replace(effort, leads=leads), choices)
            if best is None or result[0] < best[0]:
                best = result
            # rows inverse to the predicted time per row, then predict again
            per_row = [r.step_s / r.rows if r.rows else 0.0 for r in result[1]]
            speed = [1.0 / t if t and math.isfinite(t) else 0.0 for t in per_row]
            if not sum(speed) > 0:
                # no replica predicted a finite time for its rows (e.g. one has none and the other's
                # pieces do not fit): nothing to re-split by; keep the first prediction
                break
            rows = [n * unit for n in apportion(speed, global_batch // unit)]
    return best


def _predict(view, replicas, rows, boundary, split, schedule, micro_batches, effort: Effort = EXACT,
             choices: Optional[Dict[tuple, ScheduleChoice]] = None):
    """``choices``: the leader's schedule choices already made, by (its ranks, its rows)."""
    kw = dict(boundary_bytes=boundary, **transfer_costs(view))
    leader = max(range(len(replicas)), key=lambda i: rows[i])
    profiles = [view.profiles[r] for r in replicas[leader]]
    stages = len(replicas[leader])
    choice = None
    if split == "auto":
        order = list(range(stages)) if stages > MAX_ORDER_DEVICES else None
        if micro_batches is None:
            key = (tuple(replicas[leader]), rows[leader])
            choice = (choices or {}).get(key) or choose_schedule(
                profiles, global_batch=rows[leader], max_micro_batches=effort.max_micro_batches,
                schedules=[schedule] if schedule else effort.schedules, order=order, max_nodes=effort.max_nodes,
                counts=effort.counts(rows[leader], stages), bound_only=effort.bound_only, **kw)
            if choices is not None:
                choices[key] = choice
            leads = _leads(choice, effort.leads if len(replicas) > 1 else 1)
        else:
            leads = [_pinned_partition(profiles, rows[leader], micro_batches, schedule, order=order,
                                       max_nodes=effort.max_nodes, **kw)]
        best, picked = _best_lead(view, replicas, rows, leader, leads, split, schedule, micro_batches, boundary,
                                  effort, kw)
        if not _fits(best[1]) and effort.follow_leader and micro_batches is None:
            # At scale the others take the leader's cuts in its device order; a replica on devices with
            # less memory (4,096 devices: the 910Bs' 57.6 GiB under an H800 leader's 72) cannot hold them.
            # The leader chooses again, each position held to the smallest budget any replica has there.
            tight = _tightest_budgets(view, replicas, picked)
            if tight is not None:
                key = (tuple(replicas[leader]), rows[leader], "tight")
                try:
                    retry = (choices or {}).get(key) or choose_schedule(
                        [view.profiles[r] for r in picked.ranks], global_batch=rows[leader],
                        max_micro_batches=effort.max_micro_batches,
                        schedules=[schedule] if schedule else effort.schedules, order=list(range(stages)),
                        budgets=tight, max_nodes=effort.max_nodes, counts=effort.counts(rows[leader], stages),
                        bound_only=effort.bound_only, **kw)
                except ValueError:
                    retry = None   # nothing fits the tightest budgets either: keep the first answer
                if retry is not None:
                    if choices is not None:
                        choices[key] = retry
                    again, lead = _best_lead(view, replicas, rows, leader, _leads(retry, effort.leads),
                                             split, schedule, micro_batches, boundary, effort, kw)
                    if _fits(again[1]):
                        best, picked, choice = again, lead, retry
        if choice is not None and picked is not choice.best:
            choice = dataclasses.replace(choice, best=picked)
        return best[0], best[1], choice, best[2], best[3]
    sched = schedule or "1f1b"
    v = 2 if sched == "interleaved-1f1b" else 1
    n = len(profiles[0].layers)
    cuts = uniform_cuts(n, stages * v) if split == "uniform" else \
        parameter_cuts([c.param_bytes for c in profiles[0].layers], stages * v)
    step, out, sync_s, opt_s = _replicas_for(view, replicas, rows, leader, cuts, None, split, schedule,
                                             micro_batches, boundary, effort, kw)
    return step, out, None, sync_s, opt_s


def _best_lead(view, replicas, rows, leader, leads, split, schedule, micro_batches, boundary, effort, kw):
    """((step, replicas, sync s, optimizer s), lead) of the leader's plan that serves the grouping best:
    plans that fit every replica first, then the fastest."""
    best = picked = None
    for i, lead in enumerate(leads):
        try:
            result = _replicas_for(view, replicas, rows, leader, lead.cuts, lead, split, schedule,
                                   micro_batches, boundary, effort, kw)
        except ValueError:
            if i == 0:
                raise   # the leader's best cannot serve the others: as before, that is the answer
            continue
        if best is None or (not _fits(result[1]), result[0]) < (not _fits(best[1]), best[0]):
            best, picked = result, lead
    return best, picked


def _fits(replicas: Sequence["_Replica"]) -> bool:
    return all(r.part is None or r.part.fits for r in replicas)


def _tightest_budgets(view, replicas, lead) -> Optional[List[int]]:
    """Per position of the leader's device order, the smallest memory budget of the device any replica
    puts there (``_like``, as ``follow_leader`` places them); None when no replica has less than the leader."""
    pattern = [view.profiles[r] for r in lead.ranks]
    budgets = [p.memory_budget_bytes for p in pattern]
    for ranks in replicas:
        for k, r in enumerate(_like(view, list(ranks), pattern)):
            budgets[k] = min(budgets[k], view.profiles[r].memory_budget_bytes)
    return None if budgets == [p.memory_budget_bytes for p in pattern] else budgets


def _leads(choice: ScheduleChoice, most: int) -> list:
    """The leader's best partition per micro-batch count, fastest first: up to ``most`` of them, within
    ``LEAD_WITHIN`` of its best."""
    seen, leads = set(), []
    for t in choice.trials:   # fastest first, those that cannot run last
        if len(leads) >= most or t.partition is None or t.step_s > LEAD_WITHIN * choice.best.step_s:
            break
        if t.micro_batches in seen:
            continue
        seen.add(t.micro_batches)
        leads.append(t.partition)
    return leads or [choice.best]


def _replicas_for(view, replicas, rows, leader, cuts, lead, split, schedule, micro_batches, boundary,
                  effort: Effort, kw) -> tuple:
    """(step, replicas, sync seconds, optimizer seconds) with every replica on ``cuts`` (``lead``: the
    leader's partition, whose micro-batch count the others follow; None for the fixed splits)."""
    out = []
    memo: Dict[tuple, tuple] = {}   # replicas of the same device classes share their best order
    for i, ranks in enumerate(replicas):
        if rows[i] == 0:
            out.append(_Replica(ranks, 0, None, list(ranks)))
            continue
        fixed_order = split != "auto" or len(ranks) > MAX_ORDER_DEVICES
        if effort.follow_leader and lead is not None:   # at scale: the leader's device order, by class
            ranks, fixed_order = _like(view, ranks, [view.profiles[r] for r in lead.ranks]), True
        part = _best_for_cuts(view, ranks, rows[i], cuts, lead, schedule, micro_batches, fixed_order, memo=memo,
                              **kw)
        out.append(_Replica(ranks, rows[i], part, [ranks[d] for d in _order_of(part, ranks, view)]))
    if split == "auto" and len(out) > 1 and len(view.islands) > 1 and view.world_size <= ISLAND_GROUPINGS_UP_TO:
        out = _aligned_if_faster(view, out, leader, cuts, lead, schedule, micro_batches, boundary, kw)
    if split != "auto" and not all(r.part is None or r.part.fits for r in out):
        bad = next(r for r in out if r.part is not None and not r.part.fits)
        raise ValueError(f"the {split} split does not fit memory: " + "; ".join(
            f"rank {st.rank} needs {m / 2**20:.0f} MiB of {b / 2**20:.0f} MiB"
            for st, m, b in zip(bad.part.stages, bad.part.memory_bytes, bad.part.budget_bytes) if m > b))
    step, _, sync_s, opt_s = replicas_step_s(view, out, boundary)
    return step, out, sync_s, opt_s


def replica_key(view, ranks: Sequence[int]) -> tuple:
    """What a replica's prediction depends on besides cuts, rows and schedule: its devices' piece costs,
    budgets and islands, position by position (replicas of one key predict the same, other ranks)."""
    cached = view.__dict__.get("_replica_signature")   # per rank, once per view: thousands of replicas ask
    if cached is None or cached[0] is not view.profiles or cached[1] is not view.islands:
        cached = (view.profiles, view.islands, [(id(p.layers), p.memory_budget_bytes, view.island_of(r))
                                                for r, p in enumerate(view.profiles)])
        view.__dict__["_replica_signature"] = cached
    signature = cached[2]
    return tuple(signature[r] for r in ranks)


def moved(old_ranks: Sequence[int], part, ranks: Sequence[int]):
    """``part`` (predicted for ``old_ranks``) for ``ranks`` of the same ``replica_key``."""
    where = {r: i for i, r in enumerate(old_ranks)}
    stages = []
    for st in part.stages:   # copy and set: dataclasses.replace costs 5x more, and 4,096 devices move ~10^5 stages
        st = copy.copy(st)
        st.rank = ranks[where[st.rank]]
        stages.append(st)
    return dataclasses.replace(part, stages=stages)


def _like(view, ranks: List[int], pattern: Sequence) -> List[int]:
    """``ranks`` in the order of ``pattern``'s device classes (a rank of the same piece costs where there
    is one, the others after in their order)."""
    pool: Dict[int, List[int]] = {}
    for r in ranks:
        pool.setdefault(id(view.profiles[r].layers), []).append(r)
    placed = [pool[id(p.layers)].pop(0) if pool.get(id(p.layers)) else None for p in pattern]
    rest = [r for r in ranks if r not in placed]
    return [r if r is not None else rest.pop(0) for r in placed]


def _pinned_partition(profiles, rows: int, m: int, schedule: Optional[str], **kw):
    """The best partition with the micro-batch count pinned (over the schedules allowed)."""
    from hcomm.parallel.pipeline.partition import partition

    found, errors = [], []
    for sched in ([schedule] if schedule else SCHEDULES):
        try:
            found.append(partition(profiles, micro_batches=m, micro_batch=rows // m, schedule=sched,
                                   virtual_stages=2 if sched == "interleaved-1f1b" else 1, **kw))
        except ValueError as e:
            errors.append(f"{sched}: {e}")
    if not found:
        raise ValueError(f"no schedule can run {m} micro-batches of {rows // m} rows: " + "; ".join(errors))
    return min(found, key=lambda p: p.step_s)


def _best_for_cuts(view, ranks, rows, cuts, lead, schedule, micro_batches, fixed_order, memo=None, **kw):
    """The best device order and micro-batch count of one replica for fixed cuts (evaluated exhaustively:
    at most 8! orders, and orders that only swap devices of one class count once).  ``memo``: replicas
    of the same classes and rows take the order found for the first."""
    profiles = [view.profiles[r] for r in ranks]
    classes = tuple(id(p.layers) for p in profiles)
    key = (replica_key(view, ranks), rows, fixed_order)
    if memo is not None and key in memo:
        return moved(*memo[key], ranks)
    sched = lead.schedule if lead is not None else (schedule or "1f1b")
    v = lead.virtual_stages if lead is not None else (2 if sched == "interleaved-1f1b" else 1)
    if micro_batches:
        counts = [micro_batches]
    elif lead is not None and rows % lead.micro_batches == 0:
        counts = [lead.micro_batches]
    else:
        counts = micro_batch_counts(rows, MAX_MICRO_BATCHES)
        if lead is None:   # the baselines: Megatron's advice, at least as many micro-batches as stages
            counts = [max(counts, key=lambda m: (m <= 4 * len(ranks), m))]
    if fixed_order:
        orders = [list(range(len(ranks)))]
    else:
        seen, orders = set(), []
        for order in itertools.permutations(range(len(ranks))):
            sequence = tuple(classes[i] for i in order)
            if sequence not in seen:
                seen.add(sequence)
                orders.append(list(order))
    best = None
    for m in counts:
        for order in orders:
            try:
                part = evaluate(profiles, cuts, micro_batches=m, micro_batch=rows // m, schedule=sched,
                                virtual_stages=v, order=order, label="auto" if lead is not None else "given", **kw)
            except ValueError:
                continue
            # A fixed order keeps a part that does not fit (the fixed splits report it), but never over one
            # that does: 4,096 devices, pp=16 x tp=4, a replica of 85 rows took 17 micro-batches of 5 (267
            # GiB of 72) over a count that fit, and the search dropped the shape.
            if fixed_order or part.fits:
                if best is None or (not part.fits, part.step_s) < (not best.fits, best.step_s):
                    best = part
    if best is None:
        raise ValueError(f"pipeline replica {ranks}: no device order and micro-batch count fits memory with "
                         f"cuts {cuts}")
    if memo is not None:
        memo[key] = (list(ranks), best)
    return best


def _aligned_if_faster(view, out: List[_Replica], leader: int, cuts, lead, schedule, micro_batches, boundary, kw):
    """``out`` with every other replica in the leader's island pattern (position k on a rank of the
    island the leader's position k is on, ``_island_like``), when that predicts a faster step.  Each
    replica's own best order ignores the stage sync: two replicas across two islands, each fastest in
    either direction, can put the stage replicas in different islands and sync over the uplink
    (two-islands, pp=2: 884 ms of sync against 35 ms aligned)."""
    aligned = list(out)
    for i, r in enumerate(out):
        if i == leader or r.part is None:
            continue
        order = _island_like(view, r.ranks, out[leader].order)
        if order != r.order:
            try:
                part = _best_for_cuts(view, order, r.rows, cuts, lead, schedule, micro_batches, True, **kw)
            except ValueError:
                return out
            aligned[i] = _Replica(order, r.rows, part, order)
    if aligned == out:   # (by identity: nothing was re-ordered)
        return out
    return aligned if replicas_step_s(view, aligned, boundary)[0] < replicas_step_s(view, out, boundary)[0] else out


def _island_like(view, ranks: Sequence[int], pattern: Sequence[int]) -> List[int]:
    """``ranks`` ordered like ``pattern``'s islands: at each position a rank of the island the pattern's
    rank is on, of its piece costs where there is one (the rest after, in their order)."""
    pool = list(ranks)
    placed = []
    for p in pattern:
        same = [r for r in pool if view.island_of(r) == view.island_of(p)]
        pick = next((r for r in same if view.profiles[r].layers is view.profiles[p].layers), None)
        pick = pick if pick is not None else (same[0] if same else None)
        placed.append(pick)
        if pick is not None:
            pool.remove(pick)
    return [r if r is not None else pool.pop(0) for r in placed]


def _order_of(part, ranks, view) -> List[int]:
    """Indices into ``ranks`` in pipeline order, from the partition's stage ranks."""
    return [ranks.index(r) for r in part.ranks]


def _to_plan(view, replicas, choice: Optional[ScheduleChoice], global_batch: int, seq_len: int, name: str,
             bucket_bytes: Optional[int]) -> Plan:
    world = view.world_size
    ranks = [RankPlan(r, 0.0, device=view.devices[r]) for r in range(world)]
    first = next(rep.part for rep in replicas if rep.part is not None)
    cuts, v = first.cuts, first.virtual_stages
    groups = [GroupPlan("dp", list(range(world)), **({"bucket_bytes": bucket_bytes} if bucket_bytes else {}))]
    for i, rep in enumerate(replicas):
        m = rep.part.micro_batches if rep.part is not None else 1
        groups.append(GroupPlan(f"pp:{i}", list(rep.order), micro_batches=m, schedule=first.schedule,
                                virtual_stages=v, cuts=list(cuts),
                                **({"bucket_bytes": bucket_bytes} if bucket_bytes else {})))
        for pos, r in enumerate(rep.order):
            ranks[r].stage = pos
            ranks[r].layers = (cuts[pos], cuts[pos + 1]) if v == 1 else None
        ranks[rep.order[0]].batch_share = rep.rows / global_batch
    plan = Plan(global_batch, seq_len, ranks, groups, name=name)
    want = {rep.order[0]: rep.rows for rep in replicas}
    got = plan.batch_counts()
    if any(got[r] != n for r, n in want.items()):   # float shares must give back the exact rows
        raise AssertionError(f"pipeline rows {want} came back as {got}")
    return plan.validate(world)

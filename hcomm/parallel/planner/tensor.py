"""Tensor-parallel plans: TP groups, each rank's share of every split, each group's rows.

``auto`` gives each rank of a TP group a fraction of every split in
proportion to its measured speed (so all finish their shard together),
capped by what its memory holds (``memory_capped``), and
each group rows in proportion to its throughput; ``uniform`` is Megatron's:
equal shards, equal rows.  TP groups are consecutive ranks in island order
(TP talks every layer: it belongs on the fast links), members fastest first
so position p holds the same fraction in every group (ranks at one position
all-reduce the same shard's gradients).

Predicted step: the slowest group's compute (each rank's profile scaled by
its rows and fraction; the slowest member sets the pace), plus the TP
all-reduces (two per block forward, two backward, one for the embedding and
one for the head's input gradient, each of rows x seq x dim fp32, and the
spread of the members' arrivals at each: ``cost.meeting_s``), plus what the
gradient all-reduce across groups leaves exposed, plus the optimizer.  The
gradient sync is ``GradSync``'s buckets, launched as the backward fills
them (the same hooks as data parallelism's): each bucket starts when every
group has finished its pieces, the ranks of each TP position reduce their
shard side by side, and the buckets follow one another as ``cost.dp_step``
has them, slowed beside the computation (``cost.beside_compute``).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from hcomm.parallel.plan import GroupPlan, Plan, RankPlan, apportion
from hcomm.parallel.planner.cost import (beside_compute, bucket_plan, gradient_layout, group_allreduce_s, meeting_s,
                                         side_by_side_allreduce_s)
from hcomm.parallel.planner.pipeline import model_seconds, rank_speed

# The vocabulary-parallel cross entropy sums three per-token fp32 vectors forward: the max, the sum of
# exponentials and the target logit (``tensor/vocab.py``).
LOSS_ALLREDUCES = 3

SPLITS = ("auto", "uniform")


def tensor_groups(view, tp: int, split: str) -> List[List[int]]:
    world = view.world_size
    if tp < 1 or world % tp:
        raise ValueError(f"--tp {tp}: the {world} ranks do not form equal tensor-parallel groups of {tp}")
    ordered = [r for members in view.islands for r in members]
    groups = [ordered[i:i + tp] for i in range(0, world, tp)]
    if split == "auto":
        groups = [sorted(g, key=lambda r: (-rank_speed(view.profiles[r]), r)) for g in groups]
    return groups


def speed_fractions(view, groups: List[List[int]]) -> List[float]:
    """Per position, the mean over groups of that member's share of its group's speed, summing to 1
    exactly after rounding (the remainder goes to position 0)."""
    tp = len(groups[0])
    speeds = [[rank_speed(view.profiles[r]) for r in g] for g in groups]   # once per rank: 4,096 ranks in tp^2 sums took 1.3 s
    per = [sum(s[p] / sum(s) for s in speeds) / len(groups) for p in range(tp)]
    rounded = [round(f, 4) for f in per[1:]]
    return [round(1.0 - sum(rounded), 4), *rounded]


def even_fractions(tp: int) -> List[float]:
    """Megatron's split: 1/tp each, rounded, summing to 1 exactly."""
    rest = [round(1.0 / tp, 6)] * (tp - 1)
    return [round(1.0 - sum(rest), 6), *rest]


def plan_tensor(view, global_batch: int, seq_len: int, *, tp: int, dim: int, n_layers: int, split: str = "auto",
                fractions: Optional[Sequence[float]] = None, name: str = "",
                bucket_bytes: Optional[int] = None, compression: str = "none",
                sequence_parallel: bool = False) -> Plan:
    if split not in SPLITS:
        raise ValueError(f"TP split must be one of {', '.join(SPLITS)}, got {split!r}")
    groups = tensor_groups(view, tp, split)
    if fractions is not None:
        fr = [float(f) for f in fractions]
        if len(fr) != tp or abs(sum(fr) - 1) > 1e-6 or min(fr) <= 0:
            raise ValueError(f"TP fractions {list(fractions)}: need {tp} values > 0 summing to 1")
    elif split == "auto":
        fr = speed_fractions(view, groups)
    else:
        fr = even_fractions(tp)
    rows = speed_rows(view, groups, fr, global_batch, seq_len, dim, n_layers) if split == "auto" else \
        apportion([1.0] * len(groups), global_batch)
    capped = memory_capped(view, groups, fr, rows)
    if capped != fr:
        if split != "auto" or fractions is not None:
            raise ValueError(f"TP fractions {fr} do not fit memory: at most {capped} by position")
        fr = capped
    world = view.world_size
    ranks = [RankPlan(r, 0.0, device=view.devices[r]) for r in range(world)]
    plan_groups = [GroupPlan("dp", list(range(world)), **({"bucket_bytes": bucket_bytes} if bucket_bytes else {}),
                             compression=compression)]
    for i, g in enumerate(groups):
        plan_groups.append(GroupPlan(f"tp:{i}", list(g), sequence_parallel=sequence_parallel))
        for pos, r in enumerate(g):
            ranks[r].tp_group, ranks[r].tp_fraction = i, fr[pos]
        ranks[g[0]].batch_share = rows[i] / global_batch
    plan = Plan(global_batch, seq_len, ranks, plan_groups, name=name or split)
    got = plan.batch_counts()
    if [got[g[0]] for g in groups] != rows:
        raise AssertionError(f"TP rows {rows} came back as {got}")
    plan.predicted_step_s, account = tensor_step_s(view, plan, dim, n_layers)
    plan.notes = [f"tensor parallel ({split}): {len(groups)} group(s) of {tp}, fractions {fr}, rows {rows}; "
                  f"predicted step {account}"]
    return plan.validate(world)


def tensor_step_s(view, plan, dim: int, n_layers: int) -> Tuple[float, str]:
    """Predicted seconds per step of a plan of TP groups (no pipelines), and its account: the slowest
    group's compute and TP all-reduces, the gradient all-reduce across groups (each position's ranks reduce
    their shard side by side: ``cost.side_by_side_allreduce_s``) and the optimizer on the largest shard."""
    groups = [g.ranks for g in plan.tensor_groups()]
    fr = [plan.ranks[r].tp_fraction for r in groups[0]]
    counts = plan.batch_counts()
    parts = [_group_seconds(view, g, fr, counts[g[0]], plan.seq_len, dim, n_layers) for g in groups]
    slowest = max(range(len(groups)), key=lambda i: parts[i][1] + parts[i][2])
    compute, comm = parts[slowest][1], parts[slowest][2]
    busy = compute + comm
    sync_total = exposed = 0.0
    if len(groups) > 1:
        # each group's piece times, scaled to end at its busy seconds (its per-segment maxima can add up
        # to a little more than its slowest member's whole)
        done = [_backward_done(view, g, fr, counts[g[0]], plan.seq_len, dim) for g in groups]
        ready = [max(d[i] * (p[1] + p[2]) / d[-1] if d[-1] else 0.0 for d, p in zip(done, parts))
                 for i in range(len(done[0]))]
        seconds = {}
        end = 0.0
        for nbytes, piece in bucket_plan(gradient_layout(view.profiles[0]), plan.dp_group().bucket_bytes):
            t = seconds.get(nbytes)
            if t is None:
                t = seconds[nbytes] = side_by_side_allreduce_s(
                    view, [([g[p] for g in groups], int(nbytes * f)) for p, f in enumerate(fr)])
            sync_total += t
            start = max(ready[piece], end)
            end = start + beside_compute(t, start, busy, view.overlap_slowdown)
        exposed = max(0.0, end - busy)
    opt = max(view.optimizer_s[r] * plan.ranks[r].tp_fraction for g in groups for r in g)
    step = busy + exposed + opt
    return step, (f"{step * 1e3:.0f} ms = compute {compute * 1e3:.0f} + TP all-reduces {comm * 1e3:.0f} + "
                  f"exposed gradient sync {exposed * 1e3:.0f} (of {sync_total * 1e3:.0f}) + optimizer "
                  f"{opt * 1e3:.0f} ms")


def memory_capped(view, groups: List[List[int]], fractions: Sequence[float], rows: Sequence[int]) -> List[float]:
    """``fractions`` with each position's share capped by the smallest memory at that position (over the
    groups), the excess moved to the others in proportion (water-filling); ValueError when the group
    cannot hold the model at all.

    A rank holds its fraction of the training state (parameters, gradients, AdamW state: all but the
    norms are split) and, conservatively, the activations of its group's rows whole (the residual
    stream is replicated in TP; the split attention and MLP intermediates are counted in full too).
    """
    caps = []
    for p in range(len(fractions)):
        room = []
        for g, n in zip(groups, rows):
            prof = view.profiles[g[p]]
            room.append((prof.memory_budget_bytes - prof.activation_bytes(n)) / max(1, prof.state_bytes()))
        caps.append(max(0.0, min(room)))
    if sum(caps) < 1.0 - 1e-9:
        raise ValueError(f"the TP group cannot hold the model: by position its ranks fit at most fractions "
                         f"{[round(c, 4) for c in caps]} of the training state (sum {sum(caps):.3f} < 1)")
    out = list(fractions)
    fixed = [False] * len(out)
    while True:
        over = [i for i in range(len(out)) if not fixed[i] and out[i] > caps[i] + 1e-12]
        if not over:
            break
        for i in over:
            out[i], fixed[i] = caps[i], True
        free = [i for i in range(len(out)) if not fixed[i]]
        left = 1.0 - sum(out[i] for i in range(len(out)) if fixed[i])
        base = sum(fractions[i] for i in free)
        for i in free:
            out[i] = left * fractions[i] / base
    if out == list(fractions):
        return out
    rounded = [round(f, 4) for f in out[1:]]
    return [round(1.0 - sum(rounded), 4), *rounded]


def _group_seconds(view, group: Sequence[int], fractions: Sequence[float], rows: int, seq_len: int, dim: int,
                   n_layers: int) -> Tuple[float, float, float]:
    """(seconds per row of the slowest member, compute seconds, TP all-reduce seconds) of one group.

    A member computes the group's rows in one micro-batch: its fixed part whole (every member runs every
    piece, however thin its shard; 0 where not measured) plus its fraction of the per-row part.  The
    all-reduces: two per block forward and two backward, the embedding's forward, the head's input
    gradient (rows x seq x dim fp32 each), and the loss's three per-token sums (rows x seq fp32); each
    between computations a meeting point of the members (``cost.meeting_s``; the loss's three back to back
    one meeting)."""
    compute = [_member_seconds(view.profiles[r], rows, f) for r, f in zip(group, fractions)]
    comm = ((4 * n_layers + 2) * group_allreduce_s(view, group, rows * seq_len * dim * 4)
            + LOSS_ALLREDUCES * group_allreduce_s(view, group, rows * seq_len * 4)
            + (4 * n_layers + 3) * meeting_s(view, group)) if len(group) > 1 and rows else 0.0
    return (max(compute) + comm) / max(rows, 1), max(compute), comm


def _backward_done(view, group: Sequence[int], fractions: Sequence[float], rows: int, seq_len: int,
                   dim: int) -> List[float]:
    """When each piece's backward ends in one group's step (pieces in backward order, as
    ``cost.gradient_layout``): the forward whole, then each piece's backward, each piece as
    ``pipeline_tensor.group_profile`` times it at the group's rows (the slowest member's share, the TP
    collectives and meetings where they run)."""
    from hcomm.parallel.planner.pipeline_tensor import group_profile   # (which imports this module)

    if not rows:
        return [0.0] * len(view.profiles[group[0]].layers)
    if len(group) > 1:
        timed = [(c.fwd_s, c.bwd_s) for c in group_profile(view, group, fractions, 0, seq_len, dim, rows).layers]
    else:
        mb = view.profiles[group[0]].micro_batch
        timed = [(c.fwd_at(rows, mb), c.bwd_at(rows, mb)) for c in view.profiles[group[0]].layers]
    t = sum(f for f, _ in timed)
    done = []
    for _, b in reversed(timed):
        t += b
        done.append(t)
    return done


def _member_seconds(profile, rows: int, fraction: float) -> float:
    if not rows:
        return 0.0
    fixed = sum(c.fwd_fixed_s + c.bwd_fixed_s for c in profile.layers)
    return fixed + (model_seconds(profile) - fixed) * rows / profile.micro_batch * fraction


def speed_rows(view, groups: List[List[int]], fractions: Sequence[float], global_batch: int, seq_len: int,
               dim: int, n_layers: int) -> List[int]:
    """Each group's rows in proportion to its throughput, by its seconds per row at an even share of the
    batch (at one row a group's fixed costs would count as per-row)."""
    even = max(1, round(global_batch / len(groups)))
    per_row = [_group_seconds(view, g, fractions, even, seq_len, dim, n_layers)[0] for g in groups]
    return apportion([1.0 / s for s in per_row], global_batch)


def rows_resplit(plan, view, dim: int, n_layers: int):
    """``plan`` (TP groups, no pipeline) with its groups' rows apportioned again by their speed on ``view``
    (``speed_rows``, as ``plan_tensor`` does), groups and fractions unchanged: rows move, no state."""
    import copy

    groups = [g.ranks for g in plan.tensor_groups()]
    fr = [plan.ranks[r].tp_fraction for r in groups[0]]
    rows = speed_rows(view, groups, fr, plan.global_batch, plan.seq_len, dim, n_layers)
    out = copy.deepcopy(plan)
    for g, n in zip(groups, rows):
        for r in g:
            out.ranks[r].batch_share = n / plan.global_batch if r == g[0] else 0.0
    out.predicted_step_s = tensor_step_s(view, out, dim, n_layers)[0]
    return out

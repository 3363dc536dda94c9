"""Pipelines of tensor-parallel groups: a TP group per stage (Megatron's 3-D layout, uneven in all of it).

The TP groups are formed as for tensor parallelism alone (``tensor.tensor_groups``: consecutive ranks in
island order, fastest first; TP talks every layer, so it stays on the fast links), each with the same
fractions (``speed_fractions``: every stage's position k all-reduces the same shard shape across
replicas).  Each group then acts as ONE device of a pipeline: its cost per piece is the slowest member's
share of the piece plus the piece's TP all-reduces, its memory what its tightest member allows.  The
pipeline planner (``planner.pipeline``) runs unchanged on that view of groups -- partition, device order,
schedule, micro-batches, rows per replica -- and the plan it returns is expanded back to ranks: stage
s of replica j is TP group ``order[s]``, and pipeline ``j*tp + k`` links position k of those groups.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from hcomm.parallel.cluster import ClusterView
from hcomm.parallel.plan import GroupPlan, Plan, RankPlan
from hcomm.parallel.planner.cost import group_allreduce_s, meeting_s
from hcomm.parallel.planner.pipeline import plan_pipeline
from hcomm.parallel.planner.tensor import LOSS_ALLREDUCES, even_fractions, speed_fractions, tensor_groups
from hcomm.parallel.profile import DeviceProfile, LayerCost

# TP all-reduces per piece (forward, backward) of the reference model's split (``tensor/blocks.py``,
# ``tensor/vocab.py``): embedding sums its vocabulary slices; a block sums attention and MLP outputs
# forward and their input gradients backward; the head's input gradient is summed backward.
ALLREDUCES = {"embed": (1, 0), "block": (2, 2), "norm": (0, 0), "head": (0, 1)}

# Share of a block's saved activations every TP rank holds whole (without sequence parallelism): the
# residual stream, norms and the inputs of the column-parallel projections -- 10 of the 34 bytes per
# token and hidden unit in Korthikanti et al. 2022 ("Reducing Activation Recomputation", table 2);
# the other 24 (attention and MLP intermediates) split with the heads and features.
REPLICATED_ACTIVATIONS = 10 / 34


def activation_scale(fractions: Sequence[float]) -> float:
    """The factor on a piece's whole activations that makes the group's memory check safe for every
    member: member k holds (r + (1 - r) f_k) of them and is checked as f_k of the group's."""
    r = REPLICATED_ACTIVATIONS
    return max((r + (1 - r) * f) / f for f in fractions)


def member_activation_share(fractions: Sequence[float], k: int) -> float:
    """Member k's activations as a share of what the group profile counts."""
    r = REPLICATED_ACTIVATIONS
    return (r + (1 - r) * fractions[k]) / activation_scale(fractions)


def _kind(index: int, n_pieces: int) -> str:
    return "embed" if index == 0 else "head" if index == n_pieces - 1 else "norm" if index == n_pieces - 2 \
        else "block"


def group_profile(view, group: Sequence[int], fractions: Sequence[float], index: int, seq_len: int,
                  dim: int, samples: Optional[int] = None) -> DeviceProfile:
    """One TP group as a device: per piece, the slowest member's share plus the piece's all-reduces (of
    micro_batch x seq x dim fp32; the head's loss adds three of micro_batch x seq fp32) and a meeting of
    the members at each (``cost.meeting_s``); memory: the
    budget is the tightest member's over its fraction, the activations scaled so that each member's own
    share fits it (``activation_scale``).

    A member's share of a piece is its fixed part whole (kernel launches, Python: every member runs every
    piece, however thin its shard; ``LayerCost.fwd_fixed_s``, 0 where not measured) plus its fraction of
    the rest.  ``samples``: the micro-batch to time it at (default: the members' profiled one)."""
    profiles = [view.profiles[r] for r in group]
    mb = samples or profiles[0].micro_batch
    full, small, loss = (group_allreduce_s(view, group, n) for n in (mb * seq_len * dim * 4, 1024,
                                                                      mb * seq_len * 4))
    meet = meeting_s(view, group)
    n = len(profiles[0].layers)
    layers = []
    for i, base in enumerate(profiles[0].layers):
        fwd_n, bwd_n = ALLREDUCES[_kind(i, n)]
        fwd_loss = LOSS_ALLREDUCES if _kind(i, n) == "head" else 0
        fwd_meets, bwd_meets = fwd_n + (fwd_loss > 0), bwd_n   # the loss's sums back to back: one meeting
        cost = [(p.layers[i], p.micro_batch) for p in profiles]
        fwd = (max(c.fwd_fixed_s + (c.fwd_at(mb, m) - c.fwd_fixed_s) * f for (c, m), f in zip(cost, fractions))
               + fwd_n * full + fwd_loss * loss + fwd_meets * meet)
        bwd = (max(c.bwd_fixed_s + (c.bwd_at(mb, m) - c.bwd_fixed_s) * f for (c, m), f in zip(cost, fractions))
               + bwd_n * full + bwd_meets * meet)
        layers.append(LayerCost(
            f"{base.name}/tp{len(group)}", fwd_s=fwd, bwd_s=bwd,
            param_bytes=base.param_bytes, grad_bytes=base.grad_bytes, optim_bytes=base.optim_bytes,
            act_bytes_per_sample=int(base.act_bytes_per_sample * activation_scale(fractions)),
            # launches, an all-reduce's latency and the members' meeting do not shrink with the rows; at most
            # the whole time (a 1 KiB all-reduce can be priced above the piece's own: the loss's 128 bytes,
            # or a calibrated curve; the line must not fall with more samples -- LayerCost refuses it)
            fwd_fixed_s=min(fwd, max(c.fwd_fixed_s for c, _ in cost) + (fwd_n + fwd_loss) * small + fwd_meets * meet),
            bwd_fixed_s=min(bwd, max(c.bwd_fixed_s for c, _ in cost) + bwd_n * small + bwd_meets * meet)))
    budget = min(p.memory_budget_bytes / f for p, f in zip(profiles, fractions))
    return DeviceProfile(rank=index, device="+".join(p.device for p in profiles), micro_batch=mb, seq_len=seq_len,
                         layers=layers, memory_budget_bytes=int(budget), baseline_bytes=0,
                         budget_source="TP group", seconds_spent=0.0, source="TP group of " + str(list(group)))


def group_view(view, groups: List[List[int]], fractions: Sequence[Sequence[float]], seq_len: int,
               dim: int) -> ClusterView:
    """The cluster as the pipeline planner sees it when every TP group is one device (``fractions[i]``:
    group i's split)."""
    largest = max(max(f) for f in fractions)

    # Replicas of a stage sync each (stage, TP position) shard side by side.  Inside an island each shard
    # moves between its own ranks, so the largest sets the time; across islands the shards of every
    # position share the uplinks, so together they cost the whole stage's bytes (the curves as they are).
    def scaled(cost):
        return None if cost is None else (lambda nbytes: cost(int(nbytes * largest)))

    island_of = [view.island_of(g[0]) for g in groups]
    islands = [[i for i, isl in enumerate(island_of) if isl == k] for k in range(len(view.islands))]
    keep = [k for k, members in enumerate(islands) if members]
    return ClusterView(
        devices=["+".join(view.devices[r] for r in g) for g in groups],
        islands=[islands[k] for k in keep],
        profiles=_group_profiles(view, groups, fractions, seq_len, dim),
        allreduce_s=view.allreduce_s,
        island_allreduce_s=[scaled(view.island_allreduce_s[k]) for k in keep],
        optimizer_s=[max(view.optimizer_s[r] * x for r, x in zip(g, f)) for g, f in zip(groups, fractions)],
        island_names=[view.island_names[k] for k in keep] if view.island_names else [],
        compressed_allreduce_s=dict(view.compressed_allreduce_s),
        links=_shared_links(view.links, len(groups[0]), keep), calibration=dict(view.calibration),
        overlap_slowdown=view.overlap_slowdown,
        # a group's sends and receives wait for its slowest host
        cpu_share=[min(view.cpu_share[r] for r in g) for g in groups] if view.cpu_share else [])


def _shared_links(links, tp: int, keep: List[int]):
    """The links as a pipeline of TP groups uses them: every TP position runs its own pipeline and sends
    the whole (replicated) boundary tensor, so across islands ``tp`` transfers share the uplink at once;
    inside an island they go between different ranks.  An island's own uplink (``inter@<island>``) is
    renamed by the island's place among those ``keep`` holds (the islands with a group)."""
    out = {}
    for tier, (alpha, beta) in links.items():
        if tier.startswith("inter@"):
            island = int(tier.split("@")[1])
            if island in keep:
                out[f"inter@{keep.index(island)}"] = (alpha, beta / tp)
        else:
            out[tier] = (alpha, beta / tp if tier == "inter" else beta)
    return out


def _group_profiles(view, groups, fractions, seq_len: int, dim: int) -> List[DeviceProfile]:
    """``group_profile`` of every group, computed once per (member classes, fractions, island): a large
    cluster has thousands of groups of a few kinds."""
    import dataclasses

    done = {}
    out = []
    for i, (g, f) in enumerate(zip(groups, fractions)):
        key = (tuple(id(view.profiles[r].layers) for r in g), tuple(f), view.island_of(g[0]))
        if key not in done:
            done[key] = group_profile(view, g, f, i, seq_len, dim)
        out.append(dataclasses.replace(done[key], rank=i, source=f"TP group of {list(g)}"))
    return out


def plan_pipeline_tensor(view, global_batch: int, seq_len: int, *, stages: int, tp: int, dim: int, boundary: int,
                         split: str = "auto", schedule: Optional[str] = None, micro_batches: Optional[int] = None,
                         name: str = "", bucket_bytes: Optional[int] = None, compression: str = "none",
                         effort=None) -> Plan:
    """``stages`` stages per replica, each a TP group of ``tp`` ranks (see the module docstring);
    ``split`` "uniform": equal fractions and Megatron's pipeline split (the baseline)."""
    if split not in ("auto", "uniform"):
        raise ValueError(f"a pipeline of TP groups splits auto or uniform, got {split!r}")
    if view.world_size % (stages * tp):
        raise ValueError(f"--pp {stages} --tp {tp}: the {view.world_size} ranks do not form pipelines of "
                         f"{stages} TP groups of {tp}")
    groups = tensor_groups(view, tp, split)
    fractions = speed_fractions(view, groups) if split == "auto" else even_fractions(tp)
    grouped = group_view(view, groups, [fractions] * len(groups), seq_len, dim)
    inner = plan_pipeline(grouped, global_batch, seq_len, stages=stages, boundary=boundary, split=split,
                          schedule=schedule, micro_batches=micro_batches, name=name or split,
                          bucket_bytes=bucket_bytes, compression=compression, **({"effort": effort} if effort else {}))
    plan = expand(inner, groups, fractions, view)
    shown = ", ".join(str(g) for g in groups[:4]) + (", ..." if len(groups) > 4 else "")
    plan.notes = [f"pipeline of TP groups ({split}): {len(groups)} TP group(s) of {tp} ({shown}), fractions "
                  f"{fractions}; each group is one pipeline device below", *inner.notes]
    return plan


def expand(inner: Plan, groups: List[List[int]], fractions: Sequence[float], view) -> Plan:
    """A plan over TP groups (rank i = group i) as a plan over ranks."""
    tp = len(groups[0])
    world = sum(len(g) for g in groups)
    ranks = [RankPlan(r, 0.0, device=view.devices[r]) for r in range(world)]
    for i, g in enumerate(groups):
        inner_rank = inner.ranks[i]
        for pos, r in enumerate(g):
            ranks[r].stage, ranks[r].layers = inner_rank.stage, inner_rank.layers
            ranks[r].tp_group, ranks[r].tp_fraction = i, fractions[pos]
        ranks[g[0]].batch_share = inner_rank.batch_share
    dp = inner.dp_group()
    out = [GroupPlan("dp", list(range(world)), bucket_bytes=dp.bucket_bytes, compression=dp.compression)]
    out += [GroupPlan(f"tp:{i}", list(g)) for i, g in enumerate(groups)]
    for j, pipe in enumerate(inner.pipeline_groups()):
        for k in range(tp):
            out.append(GroupPlan(f"pp:{j * tp + k}", [groups[i][k] for i in pipe.ranks],
                                 bucket_bytes=pipe.bucket_bytes, micro_batches=pipe.micro_batches,
                                 schedule=pipe.schedule, virtual_stages=pipe.virtual_stages, cuts=list(pipe.cuts)))
    plan = Plan(inner.global_batch, inner.seq_len, ranks, out, name=inner.name,
                predicted_step_s=inner.predicted_step_s)
    return plan.validate(world)


def contract(plan: Plan) -> Tuple[Plan, List[List[int]], List[float]]:
    """``expand``'s inverse: a pipeline of TP groups as the plan over its groups (group i as rank i, a group's
    rows, stage and layers those of its first rank; the pipelines of TP position 0 stand for their
    replicas), with the groups and their fractions -- what a re-plan that keeps every shard's shape
    (``planner.replan``) re-cuts.  ValueError when the groups' fractions differ (no one group view)."""
    groups = [list(g.ranks) for g in plan.tensor_groups()]
    fractions = [plan.ranks[r].tp_fraction for r in groups[0]]
    odd = [g for g in groups if [plan.ranks[r].tp_fraction for r in g] != fractions]
    if odd:
        raise ValueError(f"plan {plan.name!r}: TP groups {odd} split by other fractions than {groups[0]} "
                         f"({fractions}); a pipeline of TP groups re-plans with one split in every group")
    group_of = {r: i for i, g in enumerate(groups) for r in g}
    ranks = [RankPlan(i, plan.ranks[g[0]].batch_share, device="+".join(plan.ranks[r].device for r in g),
                      stage=plan.ranks[g[0]].stage, layers=plan.ranks[g[0]].layers) for i, g in enumerate(groups)]
    dp = plan.dp_group()
    out = [GroupPlan("dp", list(range(len(groups))), bucket_bytes=dp.bucket_bytes, compression=dp.compression,
                     straggler_margin=dp.straggler_margin, straggler_patience=dp.straggler_patience)]
    firsts = {g[0] for g in groups}
    for pipe in plan.pipeline_groups():
        if pipe.ranks[0] in firsts:   # TP position 0: one per replica
            out.append(GroupPlan(f"pp:{len(out) - 1}", [group_of[r] for r in pipe.ranks],
                                 bucket_bytes=pipe.bucket_bytes, micro_batches=pipe.micro_batches,
                                 schedule=pipe.schedule, virtual_stages=pipe.virtual_stages, cuts=list(pipe.cuts)))
    inner = Plan(plan.global_batch, plan.seq_len, ranks, out, name=plan.name, predicted_step_s=plan.predicted_step_s)
    return inner.validate(len(groups)), groups, fractions

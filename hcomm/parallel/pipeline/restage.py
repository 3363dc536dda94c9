"""Moving a pipeline's training state onto new layer ranges, mid-run, without losing a step.

When a rank's speed drifts (``train.loop``'s straggler watch), the planner cuts the layers again for
the speeds just measured; the pieces that change hands must arrive with their parameters *and* their
optimizer state (AdamW's step count and moments), or the next steps train something else.  torch's
pipelining has no re-partitioning, and DCP's resharding needs a file system every rank sees and
the same parameter names on every rank: here the state moves in memory, over the job's own
process group, piece by piece from the rank that holds it.

``restage(pm, optimizer, plan, build_optimizer, lr)`` returns the new plan's ``ParallelModel`` and
optimizer.  A parameter a rank steps under the new plan and did not before comes with its optimizer
state from the lowest rank that held it (replicas of a stage hold the same values: their gradients
are all-reduced), point to point; what stays put does not move, and a rank keeps only the state of
what it now steps.  The values are copied bit for bit: a re-staged run trains what an uninterrupted
run with the new cuts from that step on would.  (Pieces a rank no longer holds keep stale values in
its copy of the model; ``ParallelModel.finish`` gathers the stages for the evaluation as always.)

A pipeline of TP groups re-stages when its groups and their fractions stay (``planner.replan`` keeps
them): every rank keeps its shard of every piece, and a piece that changes hands moves shard by shard
between the same TP position of the two groups (position k's shards have one shape everywhere).
Untied embeddings only (a tied weight lives on the first and the last stage: two ranks would both
own it).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import torch
import torch.distributed as dist


def check_restageable(plan, model) -> None:
    """ValueError naming why ``plan``'s state cannot be moved to other layer ranges."""
    if not plan.pipeline_groups():
        raise ValueError(f"plan {plan.name!r}: re-staging moves a pipeline's layer ranges; this plan has none")
    if getattr(getattr(model, "config", None), "tie_embeddings", False):
        raise ValueError("re-staging a pipeline needs untied embeddings (tie_embeddings: false): a tied weight "
                         "sits on the first and the last stage")


def check_same_shards(old, new) -> None:
    """ValueError unless ``old`` and ``new`` split the model the same way: the same TP groups with the same
    fractions (or no TP in either), so every rank's shards keep their shapes."""
    def split(plan):
        return [(tuple(g.ranks), tuple(plan.ranks[r].tp_fraction for r in g.ranks)) for g in plan.tensor_groups()]
    if split(old) != split(new):
        raise ValueError(f"re-staging keeps every TP shard's shape: plan {new.name!r} has TP groups and fractions "
                         f"{split(new)}, the running plan {split(old)}")


def _held(model, params) -> List[str]:
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for p in params]


def transfers(old_held: List[List[str]], new_held: List[List[str]], names: List[str]) -> List[Tuple[str, int, int]]:
    """(parameter, from rank, to rank) for every piece of state a rank needs and does not have: from
    the lowest rank that held it (replicas hold the same values), to each rank that holds it now and
    did not before; in the model's parameter order, the one order every rank walks."""
    out = []
    for name in names:
        before = [r for r, held in enumerate(old_held) if name in held]
        if not before:
            raise ValueError(f"re-staging: no rank holds parameter {name!r}")
        out += [(name, before[0], r) for r, held in enumerate(new_held) if name in held and r not in before]
    return out


def move_state(model, optimizer, old_params, new_params, group, shard: int = 0,
               shards: int = 1) -> Dict[str, Dict[str, torch.Tensor]]:
    """Each rank's ``{name: optimizer state}`` for ``new_params`` (what it steps under the new plan),
    the parameters it did not hold before received in place.  Only what changes hands moves, point to
    point, from one old holder to each new one: no rank allocates state it will not step.  With TP
    groups of ``shards`` ranks, this rank holds shard ``shard`` of its pieces: a parameter is known as
    ``"<shard>/<name>"``, so it moves only between ranks holding the same shard.

    Blocking sends and receives in one global order cannot deadlock: the earliest unfinished transfer
    has both ends past everything before it, so it completes."""
    me, world = dist.get_rank(group), dist.get_world_size(group)
    old = [f"{shard}/{n}" for n in _held(model, old_params)]
    new = [f"{shard}/{n}" for n in _held(model, new_params)]
    mine = {name: optimizer.state.get(p, {}) for name, p in zip(old, old_params)}
    # who held and holds what, and what each held tensor of state looks like (the receivers allocate it)
    layout = {n: {k: (tuple(v.shape), v.dtype) for k, v in s.items() if torch.is_tensor(v)} for n, s in mine.items()}
    everyone: List = [None] * world
    dist.all_gather_object(everyone, (old, new, layout), group=group)
    params = {f"{shard}/{n}": p for n, p in model.named_parameters()}
    states = {name: mine[name] for name in new if name in mine}
    every_name = [f"{k}/{n}" for k in range(shards) for n, _ in model.named_parameters()]
    for name, src, dst in transfers([e[0] for e in everyone], [e[1] for e in everyone], every_name):
        if me not in (src, dst):
            continue
        peer = dist.get_global_rank(group, dst if me == src else src)
        keys = sorted(everyone[src][2][name].items())
        if me == src:
            dist.send(params[name].data, peer, group=group)
            for key, _ in keys:
                dist.send(mine[name][key].contiguous(), peer, group=group)
            continue
        dist.recv(params[name].data, peer, group=group)
        states[name] = {}
        for key, (shape, dtype) in keys:
            states[name][key] = torch.empty(shape, dtype=dtype, device=params[name].device)
            dist.recv(states[name][key], peer, group=group)
    return {name.split("/", 1)[1]: state for name, state in states.items()}


def restage(pm, optimizer, plan, build_optimizer: Callable, lr: float) -> Tuple[object, torch.optim.Optimizer]:
    """``pm``'s training state re-laid for ``plan`` (same world, same model): (new ParallelModel, new
    optimizer).  Every rank calls it with the same plan; the old ``pm`` is closed."""
    from hcomm.parallel.parallelize import parallelize

    check_restageable(pm.plan, pm.model)
    check_restageable(plan, pm.model)
    check_same_shards(pm.plan, plan)
    old_params = pm.parameters()
    scale = pm.precision.loss_scale if pm.precision is not None else None
    pm.close()
    # the new stages are built on the model's modules (values arrive below, before any step)
    new = parallelize(pm.model, plan, pm.groups)
    new.steps = pm.steps
    if new.precision is not None and scale is not None and new.precision.loss_scale is not None:
        new.precision.loss_scale = scale   # an fp16 run's dynamic loss scale goes on where it was
    tp = pm.plan.tensor_group_of(pm.rank)
    states = move_state(pm.model, optimizer, old_params, new.parameters(), pm.groups.default,
                        shard=tp.ranks.index(pm.rank) if tp else 0, shards=len(tp.ranks) if tp else 1)
    new_optimizer = build_optimizer(new.parameters(), lr)
    for name, p in zip(_held(pm.model, new.parameters()), new.parameters()):
        if states.get(name):
            new_optimizer.state[p] = states[name]
    return new, new_optimizer

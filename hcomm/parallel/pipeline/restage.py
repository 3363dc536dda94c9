"""Moving a pipeline's training state onto new layer ranges, mid-run, without losing a step.

When a rank's speed drifts (``train.loop``'s straggler watch), the planner cuts the layers again for
the speeds just measured; the pieces that change hands must arrive with their parameters *and* their
optimizer state (AdamW's step count and moments), or the next steps train something else.  torch's
pipelining has no re-partitioning, and DCP's resharding needs a file system every rank sees and
the same parameter names on every rank: here the state moves in memory, over the job's own
process group, piece by piece from the rank that holds it.

``restage(pm, optimizer, plan, build_optimizer, lr)`` returns the new plan's ``ParallelModel`` and
optimizer.  Every parameter and every optimizer state tensor is broadcast from the lowest rank that
holds it (replicas of a stage hold the same values: their gradients are all-reduced), so every rank
ends with the whole model, as ``ParallelModel.finish`` gathers it for the evaluation; then the new
plan's stages are built on it and each rank's new optimizer takes the moved state of the parameters
it now steps.  The values are copied bit for bit: a re-staged run trains what an uninterrupted run
with the new cuts from that step on would.

Pipelines without tensor parallelism only (a TP shard's state is split across ranks) and untied
embeddings (a tied weight lives on the first and the last stage: two ranks would both own it).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import torch
import torch.distributed as dist


def check_restageable(plan, model) -> None:
    """ValueError naming why ``plan``'s state cannot be moved to other layer ranges."""
    if not plan.pipeline_groups():
        raise ValueError(f"plan {plan.name!r}: re-staging moves a pipeline's layer ranges; this plan has none")
    if plan.tensor_groups():
        raise ValueError(f"plan {plan.name!r}: re-staging a pipeline of tensor-parallel groups is not supported "
                         f"(each TP shard's optimizer state is split across its group)")
    if getattr(getattr(model, "config", None), "tie_embeddings", False):
        raise ValueError("re-staging a pipeline needs untied embeddings (tie_embeddings: false): a tied weight "
                         "sits on the first and the last stage")


def _owners(local: List[str], group) -> Dict[str, int]:
    """Each parameter name -> the lowest rank that holds it (every rank agrees)."""
    held: List = [None] * dist.get_world_size(group)
    dist.all_gather_object(held, local, group=group)
    owners: Dict[str, int] = {}
    for rank, names in enumerate(held):
        for name in names:
            owners.setdefault(name, rank)
    return owners


def gather_state(model, optimizer, local_params, group) -> Dict[str, Dict[str, torch.Tensor]]:
    """Every rank: the whole model's parameters in place, and ``{name: optimizer state}`` of every
    parameter, each from its owner.  ``local_params``: what this rank's optimizer steps."""
    names = {id(p): n for n, p in model.named_parameters()}
    local = [names[id(p)] for p in local_params]
    owners = _owners(local, group)
    missing = [n for n in names.values() if n not in owners]
    if missing:
        raise ValueError(f"re-staging: no rank holds parameter(s) {missing[:3]}")
    mine = {names[id(p)]: optimizer.state.get(p, {}) for p in local_params}
    # what each state tensor looks like (shape, dtype), from its owner: the others allocate it
    layout = {n: {k: (tuple(v.shape), v.dtype) for k, v in s.items() if torch.is_tensor(v)} for n, s in mine.items()}
    layouts: List = [None] * dist.get_world_size(group)
    dist.all_gather_object(layouts, layout, group=group)
    me = dist.get_rank(group)
    states: Dict[str, Dict[str, torch.Tensor]] = {}
    for name, param in model.named_parameters():
        owner = owners[name]
        dist.broadcast(param.data, src=dist.get_global_rank(group, owner), group=group)
        state = {}
        for key, (shape, dtype) in sorted(layouts[owner][name].items()):
            tensor = mine[name][key].detach().clone() if me == owner else torch.empty(shape, dtype=dtype,
                                                                                        device=param.device)
            dist.broadcast(tensor, src=dist.get_global_rank(group, owner), group=group)
            state[key] = tensor
        states[name] = state
    return states


def restage(pm, optimizer, plan, build_optimizer: Callable, lr: float) -> Tuple[object, torch.optim.Optimizer]:
    """``pm``'s training state re-laid for ``plan`` (same world, same model): (new ParallelModel, new
    optimizer).  Every rank calls it with the same plan; the old ``pm`` is closed."""
    from hcomm.parallel.parallelize import parallelize

    check_restageable(pm.plan, pm.model)
    check_restageable(plan, pm.model)
    group = pm.groups.default
    states = gather_state(pm.model, optimizer, pm.parameters(), group)
    scale = pm.precision.loss_scale if pm.precision is not None else None
    pm.close()
    new = parallelize(pm.model, plan, pm.groups)
    new.steps = pm.steps
    if new.precision is not None and scale is not None and new.precision.loss_scale is not None:
        new.precision.loss_scale = scale   # an fp16 run's dynamic loss scale goes on where it was
    new_optimizer = build_optimizer(new.parameters(), lr)
    names = {id(p): n for n, p in pm.model.named_parameters()}
    for p in new.parameters():
        if states[names[id(p)]]:
            new_optimizer.state[p] = states[names[id(p)]]
    return new, new_optimizer

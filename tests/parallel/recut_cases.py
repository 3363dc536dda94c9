"""A pipeline whose layers are cut again mid-run (``pipeline.restage``), for test_pipeline_recut.py:
the real ``ParallelModel`` on every rank of a bare pool, plan A for the first steps, plan B after."""
from __future__ import annotations

import torch
import torch.distributed as dist

from tests.parallel import dp_cases
from tests.parallel import test_pipeline_runtime as rt

LR = {"sgd": 0.1, "adamw": 3e-3}


def build_optimizer(kind: str):
    """SGD with momentum (its buffer is state to move, and the update stays linear in the gradients) or
    AdamW as ``hcomm train`` makes it."""
    if kind == "sgd":
        return lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9)
    return lambda params, lr: torch.optim.AdamW(params, lr=lr, weight_decay=0.1)


def reference(global_batch: int, steps: int, kind: str):
    """One process, the whole global batch every step."""
    model = rt.build()
    opt = build_optimizer(kind)(model.parameters(), LR[kind])
    losses = dp_cases.train_whole_batches(model, opt, global_batch, steps)
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def _local_states(model, pm, optimizer):
    """``{"<TP position>/<name>": state}`` of what this rank steps (position 0 without TP: a TP shard's
    state is its position's, the same name holds another shard at another position)."""
    if pm.zero is not None:   # flat shards of many parameters: the losses and the model say
        return {}
    names = {id(p): n for n, p in model.named_parameters()}
    return {f"{pm.tp_position}/{names[id(p)]}": {k: v.clone() for k, v in optimizer.state[p].items()}
            for p in pm.parameters() if p in optimizer.state}


def _global_loss(t, pm) -> float:
    """The step's global-batch loss: the runtime's where it reports one, else (ZeRO reports each rank's
    mean) the rows-weighted sum over ranks, as ``hcomm train`` computes it."""
    import math

    if not math.isnan(t.global_loss) or pm.zero is None:
        return t.global_loss
    part = torch.tensor([pm.samples / pm.plan.global_batch * t.local_loss if pm.samples else 0.0],
                        dtype=torch.float64)
    dist.all_reduce(part)
    return float(part)


def _through_checkpoint(ctx, pm, opt, second, make, lr: float, path: str, step: int):
    """Plan B's model and optimizer from a checkpoint plan A's ranks wrote (``train.checkpoint``): a
    fresh model, its parameters zeroed first, so only what the files hold can train on."""
    from hcomm.parallel.parallelize import parallelize
    from hcomm.train import checkpoint

    checkpoint.save(path, step, pm, opt, [], {}, ctx.rank, ctx.world, pm.groups.default)
    groups = pm.groups
    pm.close()
    model = rt.build()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    fresh = parallelize(model, second, groups)
    fresh_opt = make(fresh.parameters(), lr)
    checkpoint.load(f"{path}/step-{step}", fresh, fresh_opt, ctx.rank, ctx.world, groups.default, rows=False)
    return fresh, fresh_opt


def case_restage(ctx, plan_a: str, plan_b: str, steps: int, switch_at: int, kind: str, move: str = "restage",
                 path: str = ""):
    """(global loss per step where known else nan, whole model at the end, every moved state equal
    bit for bit, parameter names this rank steps under plan B).  ``move``: "restage" (a pipeline's
    layers), "checkpoint" (plan A's state saved to ``path``, loaded into plan B on a fresh model: a
    checkpoint is layout-free), or "reshard" (a TP split: shards change shape, so only the losses and
    the model say)."""
    from hcomm.parallel.parallelize import parallelize
    from hcomm.parallel.pipeline.restage import restage
    from hcomm.parallel.plan import Plan
    from hcomm.parallel.tensor.reshard import reshard

    groups = dp_cases._init(ctx, None)
    try:
        first, second = Plan.from_yaml(plan_a), Plan.from_yaml(plan_b)
        model = rt.build()
        make = build_optimizer(kind)
        pm = parallelize(model, first, groups)
        opt = make(pm.parameters(), LR[kind])
        data = dp_cases.batches(first.global_batch)
        losses, exact, mine = [], None, []
        for step in range(steps):
            if step == switch_at:
                held = [None] * ctx.world
                dist.all_gather_object(held, _local_states(pm.model, pm, opt))
                before = {n: s for states in reversed(held) for n, s in states.items()}
                if move == "checkpoint":
                    pm, opt = _through_checkpoint(ctx, pm, opt, second, make, LR[kind], path, step)
                else:
                    pm, opt = (restage if move == "restage" else reshard)(pm, opt, second, make, LR[kind])
                after = _local_states(pm.model, pm, opt)
                mine = sorted(n.split("/", 1)[1] for n in after)
                shards = bool(first.tensor_groups() or second.tensor_groups())   # other shapes: keys only
                exact = bool(after) and all(after[n].keys() == before[n].keys() and
                                            all(torch.equal(v, before[n][k]) for k, v in after[n].items())
                                            for n in after) if move != "reshard" and not shards else \
                    bool(after) and all(after[n].keys() == before[n].keys() for n in after if n in before)
            t = pm.train_step(lambda off, n: data.rows(step, off, n), opt)
            losses.append(_global_loss(t, pm))
        pm.finish()   # the stages (and a pipeline TP group's shards) come together on every rank
        model = pm.model
        if not pm.plan.pipeline_groups() and pm.plan.tensor_groups():   # TP alone stays in shards
            from hcomm.parallel.tensor.reshard import whole_model

            model = whole_model(pm.model)
        pm.close()
        return losses, {n: p.detach().clone() for n, p in model.named_parameters()}, exact, mine
    finally:
        dist.destroy_process_group()


def case_gather_flat(ctx, backend: str):
    """``tensor.reshard._gather_flat`` over every rank of the pool on a ``backend`` group: rank r sends
    uneven shards (r + 1 rows), an odd-length bf16 tensor before an fp32 one (the buffer's alignment)
    and a plain value; returns what it got, as plain lists."""
    from hcomm.parallel.tensor.reshard import _gather_flat

    dp_cases._init(ctx, None)
    try:
        group = dist.new_group(backend=backend)
        r = ctx.rank
        odd = torch.arange(2 * r + 3, dtype=torch.bfloat16)
        rows = torch.full((r + 1, 3), float(r)) + torch.arange(3.0)
        mine = {0: ({"w": (r, 0, rows), "n": (r, None, odd)}, {"w": {"m": (r, 0, -rows), "step": 7 + r}})}
        got = _gather_flat(mine, group)
        return [{"w": g[0][0]["w"][:2] + (g[0][0]["w"][2].tolist(), g[0][0]["w"][2].dtype),
                 "n": g[0][0]["n"][:2] + (g[0][0]["n"][2].tolist(), g[0][0]["n"][2].dtype),
                 "m": g[0][1]["w"]["m"][2].tolist(), "step": g[0][1]["w"]["step"]} for g in got]
    finally:
        dist.destroy_process_group()

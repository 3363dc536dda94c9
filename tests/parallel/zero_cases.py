"""Cases for the ZeRO tests, run on every rank of a bare pool (see dp_cases for the model and data)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from tests.parallel.dp_cases import _init, batches, build, make_optimizer


def case_zero_train(ctx, plan_yaml: str, steps: int, optimizer: str = "sgd", islands=None, kind: str = "llama"):
    """Train under a ZeRO plan; (global-batch losses, whole parameters after consolidation, per-step stats)."""
    from hcomm.parallel.parallelize import parallelize
    from hcomm.parallel.plan import Plan

    groups = _init(ctx, islands)
    try:
        plan = Plan.from_yaml(plan_yaml)
        model = build(kind)
        pm = parallelize(model, plan, groups)
        opt = make_optimizer(pm.parameters(), optimizer)
        data = batches(plan.global_batch)
        weighted, stats = [], []
        for step in range(steps):
            t = pm.train_step(lambda off, n: data.rows(step, off, n), opt)
            weighted.append(pm.samples / plan.global_batch * t.local_loss if pm.samples else 0.0)
            stats.append({**{k: v for k, v in t.zero.items() if k != "units"}, "compute_s": t.compute_s,
                          "block_allocations": pm.zero.engine.pool.block_allocations,
                          "tensor_allocations": pm.zero.engine.pool.tensor_allocations,
                          "grad_buffers_peak": pm.zero.engine.grad_buffers_peak,
                          "units": len(pm.zero.engine.units)})
        losses = torch.tensor(weighted, dtype=torch.float64)
        dist.all_reduce(losses, group=groups.default)
        pm.finish()
        pm.close()
        return losses.tolist(), [p.detach().clone() for p in model.parameters()], stats
    finally:
        dist.destroy_process_group()


def case_zero_error(ctx, plan_yaml: str, what: str):
    """Set up a ZeRO plan in a way that must fail; the error text on this rank."""
    from hcomm.parallel.parallelize import parallelize
    from hcomm.parallel.plan import Plan

    groups = _init(ctx, None)
    try:
        plan = Plan.from_yaml(plan_yaml)
        model = build()
        if what == "tied":
            model.head.weight = model.embed.weight
        try:
            pm = parallelize(model, plan, groups)
            data = batches(plan.global_batch)
            if what == "lbfgs":
                opt = torch.optim.LBFGS(pm.parameters())
            elif what == "model-params":
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
            else:
                opt = torch.optim.SGD(pm.parameters(), lr=0.1)
            pm.train_step(lambda off, n: data.rows(0, off, n), opt)
        except ValueError as e:
            return str(e)
        return None
    finally:
        dist.destroy_process_group()


def case_zero_resume(ctx, plan_a: str, plan_b: str, path: str, steps_a: int, steps_b: int, phases=(0, 1)):
    """Train ``steps_a`` AdamW steps under plan A, save, load into a fresh model under plan B, train on.
    ``phases`` (0 = train and save, 1 = load and train on) lets the two run in pools of other sizes.
    Returns (global losses of the steps run, whole parameters at the end of phase 1)."""
    from hcomm.parallel.parallelize import parallelize
    from hcomm.parallel.plan import Plan
    from hcomm.parallel.zero import state

    groups = _init(ctx, None)
    try:
        losses, params = [], None
        for which, (text, first, count) in enumerate([(plan_a, 0, steps_a), (plan_b, steps_a, steps_b)]):
            if which not in phases:
                continue
            plan = Plan.from_yaml(text)
            model = build()
            if which == 1:
                with torch.no_grad():      # a different start, so only the checkpoint can make it right
                    for p in model.parameters():
                        p.add_(1.0)
            pm = parallelize(model, plan, groups)
            opt = make_optimizer(pm.parameters(), "adamw")
            if which == 1:
                state.load(path, pm.zero.engine, opt, group=groups.default)
            data = batches(plan.global_batch)
            for step in range(first, first + count):
                t = pm.train_step(lambda off, n, step=step: data.rows(step, off, n), opt)
                part = torch.tensor([pm.samples / plan.global_batch * t.local_loss if pm.samples else 0.0],
                                    dtype=torch.float64)
                dist.all_reduce(part, group=groups.default)
                losses.append(float(part))
            if which == 0:
                state.save(path, pm.zero.engine, opt, group=groups.default, extra={"step": first + count})
            else:
                pm.finish()
                params = [p.detach().clone() for p in model.parameters()]
            pm.close()
        return losses, params
    finally:
        dist.destroy_process_group()


def case_fsdp2_over_hcomm(ctx, plan_yaml: str, steps: int):
    """torch's FSDP2 (even shards) with the hcomm backend underneath: the global losses per step."""
    from hcomm.parallel.plan import Plan
    from hcomm.parallel.zero.baseline import shard_with_fsdp2

    groups = _init(ctx, None)
    try:
        plan = Plan.from_yaml(plan_yaml)
        model = shard_with_fsdp2(build(), groups.hcomm, 3)
        opt = make_optimizer(model.parameters(), "sgd")
        data = batches(plan.global_batch)
        n = plan.global_batch // ctx.world
        losses = []
        for step in range(steps):
            opt.zero_grad()
            loss = model.loss(data.rows(step, ctx.rank * n, n), reduction="mean")
            loss.backward()
            opt.step()
            part = torch.tensor([float(loss.detach()) / ctx.world], dtype=torch.float64)
            dist.all_reduce(part, group=groups.default)
            losses.append(float(part))
        return losses
    finally:
        dist.destroy_process_group()

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
            stats.append({k: v for k, v in t.zero.items() if k != "units"})
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

"""A rank that turns slow mid-run, for the straggler test: the real trainer loop (hcomm.train.loop)
on every rank of a bare pool, with one rank's first block sleeping per sample from a given step on."""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

from tests.parallel import dp_cases


def case_straggler(ctx, plan_yaml: str, steps: int, slow_rank: int, slow_from: int, sleep_per_sample: float):
    """(replans, per-step global losses, samples per rank at the end, parameters) on every rank."""
    from hcomm.parallel.plan import Plan
    from hcomm.train.loop import train_plan

    groups = dp_cases._init(ctx, None)
    try:
        plan = Plan.from_yaml(plan_yaml)
        model = dp_cases.build()
        seen = {"samples": 0}
        per_step = plan.batch_counts()[slow_rank]

        def slow_down(module, inputs):
            # steps counted by the samples this rank has forwarded (micro-batches may split a step)
            if ctx.rank == slow_rank and seen["samples"] >= slow_from * per_step:
                time.sleep(sleep_per_sample * inputs[0].shape[0])
            seen["samples"] += inputs[0].shape[0]

        model.blocks[0].register_forward_pre_hook(slow_down)
        g = torch.Generator().manual_seed(11)   # dp_cases.batches' tokens, so the reference sees the same rows
        tokens = torch.randint(0, dp_cases.VOCAB, (20_000,), generator=g, dtype=torch.int32)
        args = argparse.Namespace(steps=steps, warmup_steps=1, lr=3e-3, seed=dp_cases.SEED, eval_batches=1)
        result = train_plan(args, plan, model, groups, tokens, tokens, ctx.rank, ctx.world)
        losses = [s["loss"] for s in result.steps] if ctx.rank == 0 else None
        return result.replans, losses, result.counts, [p.detach().clone() for p in model.parameters()]
    finally:
        dist.destroy_process_group()


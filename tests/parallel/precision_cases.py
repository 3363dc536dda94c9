"""Cases for the per-device precision tests, run on every rank of a bare pool.

The model is the ``tiny`` config (vocab cut to dp_cases' 97 tokens) on
dp_cases' global batches; the single-process fp32 reference is computed in
the test process with the same builder and data.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from tests.parallel import dp_cases

VOCAB = dp_cases.VOCAB
SEQ = dp_cases.SEQ


def build():
    from hcomm.models import build_model, get_config

    return build_model(get_config("tiny"), vocab_size=VOCAB, seed=5)


def reference(global_batch: int, steps: int, optimizer: str = "sgd"):
    """Single process, fp32: per-step mean loss over the whole global batch."""
    model = build()
    return dp_cases.train_whole_batches(model, dp_cases.make_optimizer(model.parameters(), optimizer),
                                        global_batch, steps)


def local_losses(global_batch: int, counts, offsets, dtypes, step: int = 0):
    """Each rank's mean loss over its own rows of batch ``step`` from the initial weights, computed here
    under ``torch.autocast`` in the given dtype ("fp32": none) -- what that rank should report."""
    import contextlib

    from hcomm.parallel.precision import TORCH_DTYPES

    model = build()
    rows = dp_cases.batches(global_batch).rows
    out = []
    with torch.no_grad():
        for n, o, dtype in zip(counts, offsets, dtypes):
            ctx = contextlib.nullcontext() if dtype == "fp32" else torch.autocast("cpu", dtype=TORCH_DTYPES[dtype])
            with ctx:
                out.append(float(model.loss(rows(step, o, n), reduction="sum") / float(n * SEQ)))
    return out


def _flat_grads(params):
    return torch.cat([p.grad.detach().reshape(-1).clone() for p in params])


def case_grad_scale(ctx, counts, scales):
    """One backward per scale setting on the same weights: rank r runs backward on ``loss * S_r`` with
    ``GradSync.grad_scale = S_r``.  Returns (reduced gradient, global loss) for S = 1 everywhere, then
    for ``scales``."""
    from hcomm.parallel.data import GradSync

    groups = dp_cases._init(ctx, None)
    try:
        total, offset = sum(counts), sum(counts[: ctx.rank])
        model = build()
        sync = GradSync(model, groups.hcomm, weight=counts[ctx.rank] / total, bucket_bytes=64 << 10)
        rows = dp_cases.batches(total).rows(0, offset, counts[ctx.rank])
        out = []
        for setting in ([1.0] * ctx.world, scales):
            scale = setting[ctx.rank]
            sync.zero_grad()
            sync.grad_scale = scale
            loss = model.loss(rows, reduction="mean")
            sync.add_loss(float(loss.detach()))
            (loss * scale if scale != 1.0 else loss).backward()
            sync.wait()
            out.append((_flat_grads(sync.params), sync.global_loss()))
        sync.remove()
        return out
    finally:
        dist.destroy_process_group()


def _nonfinite_hook(ctx, state, rank, step):
    def hook(module, inputs, output):
        if ctx.rank == rank and state["step"] == step:
            return output * float("inf")   # an fp16 overflow, as it would surface: inf activations
        return None
    return hook


def case_train(ctx, plan_yaml: str, steps: int, optimizer: str = "sgd", bad_rank: int = -1, bad_step: int = -1):
    """Train under the plan; per step: global and local loss, skipped, the loss scale the step ran with,
    and the flat parameters after it.  ``bad_rank``/``bad_step``: a forward hook on the first block of
    that rank makes its activations infinite at that step only."""
    from hcomm.parallel.parallelize import parallelize
    from hcomm.parallel.plan import Plan

    groups = dp_cases._init(ctx, None)
    try:
        plan = Plan.from_yaml(plan_yaml)
        model = build()
        pm = parallelize(model, plan, groups)
        state = {"step": -1}
        handle = model.blocks[0].register_forward_hook(_nonfinite_hook(ctx, state, bad_rank, bad_step))
        # The dtype a matmul produced in training: proof that the rank's autocast was on.
        matmul_dtypes = set()
        first_linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        witness = first_linear.register_forward_hook(lambda m, i, out: matmul_dtypes.add(str(out.dtype)))
        opt = dp_cases.make_optimizer(model.parameters(), optimizer)
        data = dp_cases.batches(plan.global_batch)
        record = dict(global_loss=[], local_loss=[], skipped=[], loss_scale=[], params=[])
        for step in range(steps):
            state["step"] = step
            t = pm.train_step(lambda off, n: data.rows(step, off, n), opt)
            record["global_loss"].append(t.global_loss)
            record["local_loss"].append(t.local_loss)
            record["skipped"].append(t.skipped)
            record["loss_scale"].append(t.loss_scale)
            record["params"].append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone())
        handle.remove()
        witness.remove()
        record["matmul_dtypes"] = sorted(matmul_dtypes)
        record["dtype"] = pm.precision.dtype if pm.precision is not None else None
        record["final_scale"] = pm.precision.scale if pm.precision is not None else None
        record["skipped_steps"] = pm.precision.skipped_steps if pm.precision is not None else None
        record["optimizer_steps"] = [int(s["step"]) for s in opt.state.values() if "step" in s][:1]
        record["param_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
        record["grad_dtypes"] = sorted({str(p.grad.dtype) for p in model.parameters() if p.grad is not None})
        pm.close()
        return record
    finally:
        dist.destroy_process_group()


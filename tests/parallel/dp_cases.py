"""Cases for the data-parallel equivalence tests, run on every rank of a bare pool.

Each case sets up its own groups (islands from HCOMM_ISLAND, chosen per
rank), trains a small Llama on the same global batches as a single process
would, and returns losses and parameters; the test compares them with a
reference computed in the test process.
"""
from __future__ import annotations

import datetime
import os
from typing import List, Optional

import torch
import torch.distributed as dist

MODEL = dict(dim=32, n_layers=2, n_heads=4, max_seq_len=32)
VOCAB = 97
SEQ = 16
SEED = 3


def batches(global_batch: int):
    from hcomm.train.data import GlobalBatches

    g = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, VOCAB, (20_000,), generator=g, dtype=torch.int32)
    return GlobalBatches(tokens, SEQ, global_batch, seed=SEED)


def build(kind: str = "llama"):
    from hcomm.models import LlamaConfig, build_hf_llama, build_model

    if kind == "hf":  # Hugging Face LlamaForCausalLM from the same config (no download)
        return build_hf_llama(LlamaConfig(vocab_size=VOCAB, **MODEL), seed=1)
    return build_model(LlamaConfig(vocab_size=VOCAB, **MODEL), seed=1)


def make_optimizer(params, kind: str):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.5)
    return torch.optim.AdamW(params, lr=3e-3, weight_decay=0.1)


def train_whole_batches(model, opt, global_batch: int, steps: int):
    """One process trains ``model`` on the whole global batch of every step; the per-step mean losses."""
    data = batches(global_batch)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        loss = model.loss(data.global_batch_rows(step), reduction="mean")
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def reference(global_batch: int, steps: int, optimizer: str = "sgd", kind: str = "llama"):
    """Single process: mean loss over the whole global batch, one optimizer."""
    model = build(kind)
    losses = train_whole_batches(model, make_optimizer(model.parameters(), optimizer), global_batch, steps)
    return losses, [p.detach().clone() for p in model.parameters()]


def _init(ctx, islands: Optional[List[str]]):
    import hcomm  # noqa: F401
    from hcomm.parallel.parallelize import make_groups

    if islands:
        os.environ["HCOMM_ISLAND"] = islands[ctx.rank]
    os.environ["HCOMM_PROFILE"] = "off"
    # A fresh store file per case: every rank counts its cases alike.
    ctx.state["inits"] = ctx.state.get("inits", 0) + 1
    dist.init_process_group("gloo", init_method=f"file://{ctx.tmp}/store-{ctx.state['inits']}",
                            rank=ctx.rank, world_size=ctx.world, timeout=datetime.timedelta(seconds=60))
    return make_groups()


def case_train(ctx, plan_yaml: str, steps: int, optimizer: str = "sgd", islands=None, kind: str = "llama"):
    """Train ``steps`` steps under the plan; (carried global losses, parameters) on every rank."""
    from hcomm.parallel.parallelize import parallelize
    from hcomm.parallel.plan import Plan

    groups = _init(ctx, islands)
    try:
        plan = Plan.from_yaml(plan_yaml)
        model = build(kind)
        pm = parallelize(model, plan, groups)
        opt = make_optimizer(model.parameters(), optimizer)
        data = batches(plan.global_batch)
        losses, local = [], []
        for step in range(steps):
            t = pm.train_step(lambda off, n: data.rows(step, off, n), opt)
            losses.append(t.global_loss)
            local.append(t.local_loss)
        pm.close()
        return losses, [p.detach().clone() for p in model.parameters()]
    finally:
        dist.destroy_process_group()


def case_outer(ctx, plan_yaml: str, steps: int, every: int, lr: float, momentum: float, islands, overlap=False):
    """GradSync inside each island + OuterSync across islands, set up by hand so H may be 1."""
    from hcomm.parallel.data import GradSync
    from hcomm.parallel.outer import OuterSync
    from hcomm.parallel.plan import Plan

    groups = _init(ctx, islands)
    try:
        plan = Plan.from_yaml(plan_yaml)
        counts, offsets = plan.batch_counts(), plan.batch_offsets()
        members = groups.islands[groups.island_index]
        island_samples = sum(counts[r] for r in members)
        model = build()
        sync = GradSync(model, groups.island, weight=counts[ctx.rank] / island_samples, bucket_bytes=1 << 20)
        outer = OuterSync(model, groups.hcomm, every=every, island_weight=island_samples / plan.global_batch,
                          island_size=len(members), lr=lr, momentum=momentum, overlap=overlap)
        opt = make_optimizer(model.parameters(), "sgd")
        data = batches(plan.global_batch)
        island_losses, snapshots = [], []
        for step in range(steps):
            sync.zero_grad()
            rows = data.rows(step, offsets[ctx.rank], counts[ctx.rank])
            loss = model.loss(rows, reduction="mean")
            sync.add_loss(float(loss.detach()))
            loss.backward()
            sync.wait()
            island_losses.append(sync.global_loss())
            opt.step()
            if outer.due(step):
                outer.step()
            snapshots.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
        outer.finish(steps)
        return island_losses, [p.detach().clone() for p in model.parameters()], snapshots
    finally:
        dist.destroy_process_group()

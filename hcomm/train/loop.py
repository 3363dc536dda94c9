"""Training one plan: the plain ``for step`` loop, its records, the final eval.

Per step every rank records its own seconds (compute, sync wait, optimizer,
outer sync, whole step) and its mean loss; nothing extra is communicated in
the loop but, when the plan watches for stragglers, one all-reduce of 2 x
world numbers (each rank's compute and samples).  After the last step one gather brings every rank's records to
rank 0, and one all-reduce of the ranks' loss vectors weighted by their
sample counts gives the exact global-batch loss of every step, the same way
for every plan (DDP, hcomm, islands with outer sync).

Time split per rank and step (from what each rank measured):
  compute = forward + backward of its samples;
  idle    = slowest rank's compute - its compute (waiting for peers);
  comm    = sync wait - idle, plus the outer sync (communication not hidden).
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List

import torch
import torch.distributed as dist

from hcomm.parallel.parallelize import parallelize
from hcomm.parallel.straggler import StragglerWatch


@dataclass
class PlanResult:
    name: str
    steps: List[dict] = field(default_factory=list)   # one record per step (see module docstring)
    tokens_per_s: float = 0.0
    measured_step_s: float = 0.0                     # median wall seconds per step after warm-up
    wall_s: float = 0.0
    eval_loss: float = float("nan")
    predicted_step_s: float = float("nan")
    # the simulator's step for the plan its measured steps ran, where a re-split moved rows before the
    # warm-up ended (``predicted_as_run``); nan otherwise (the plan's own prediction holds)
    predicted_as_run_s: float = float("nan")
    counts: List[int] = field(default_factory=list)  # samples per rank at the end (after any re-split)
    resplit: dict = field(default_factory=dict)      # what re-splitting by measured compute changed
    replans: List[dict] = field(default_factory=list)  # re-splits / pipeline re-cuts after a rank drifted (drift.py)


def make_optimizer(params, lr: float) -> torch.optim.Optimizer:
    """AdamW, fused where torch has it (4x faster than the foreach path on CPU here); the same for every plan."""
    params = list(params)
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.1, fused=True)
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.1)


def _progress(total: int, rank: int):
    if rank != 0:
        return None
    if sys.stdout.isatty():
        from tqdm import tqdm

        return tqdm(total=total, unit="step", dynamic_ncols=True)
    return None


def _evaluate(model, eval_tokens: torch.Tensor, batches: int, global_batch: int, seq_len: int) -> float:
    from hcomm.train.data import GlobalBatches

    held_out = GlobalBatches(eval_tokens, seq_len, global_batch, seed=12345)
    losses = []
    with torch.no_grad():
        for i in range(batches):
            losses.append(float(model.loss(held_out.global_batch_rows(i), reduction="mean")))
    return sum(losses) / len(losses)


def train_plan(args, plan, model, groups, train_tokens, eval_tokens, rank: int, world: int,
               replanner=None) -> PlanResult:
    """``replanner``: what cuts a watched pipeline again, or gives TP groups new shards
    (``plans.replanner_for``); data parallelism re-splits its rows without one."""
    from hcomm.train import drift
    from hcomm.train.data import GlobalBatches

    batches = GlobalBatches(train_tokens, plan.seq_len, plan.global_batch, seed=args.seed)
    pm = parallelize(model, plan, groups)
    optimizer = pm.make_optimizer(make_optimizer, args.lr)
    tokens_per_step = plan.global_batch * plan.seq_len
    mine: List[dict] = []
    resplit: dict = {}
    replans: List[dict] = []
    dp = plan.dp_group()
    if dp.straggler_margin and pm.pipe is not None and replanner is None:
        raise ValueError(f"plan {plan.name!r} watches a pipeline for stragglers but nothing can re-plan it "
                         f"(hcomm train makes its replanner; a plan file's pipeline cannot be re-cut)")
    watch = StragglerWatch(dp.straggler_margin, dp.straggler_patience) if dp.straggler_margin else None
    # on the pieces this rank runs: a TP plan's are its shards (the embedding and head rebuilt)
    tell_step, slow_handles = drift.slow_hook(pm.model if plan.tensor_groups() else model, rank)
    first, every = _resume(args, plan, pm, optimizer, mine, groups.default, rank, world)
    bar = _progress(args.steps, rank)
    dist.barrier(group=groups.default)
    loop_start = time.perf_counter()
    timed_from = loop_start
    for step in range(first, args.steps):
        if step == args.warmup_steps:
            timed_from = time.perf_counter()
        if every:
            from hcomm.train.checkpoint import fault_hook

            fault_hook(rank, step)
        if tell_step is not None:
            tell_step(step)
        t = pm.train_step(lambda offset, count: batches.rows(step, offset, count), optimizer)
        mine.append(dict(asdict(t), end=time.perf_counter() - loop_start, samples=pm.samples))
        _show(bar, rank, step, args.steps, t, tokens_per_step)
        if step + 1 == dp.rebalance_after and step + 1 < args.steps:
            resplit = _resplit(pm, mine, plan, groups.default, rank, world)
        elif watch is not None and step >= max(1, dp.rebalance_after) and step + 1 < args.steps:
            # step 0 has first-call costs; the watch's baseline starts after the first re-split
            per_sample, counts = drift.per_sample_everywhere(t.busy_s, pm.samples, groups.default, rank, world)
            drifted = watch.observe(per_sample)
            if drifted and pm.pipe is not None:
                pm, optimizer, record = drift.recut_pipeline(pm, optimizer, replanner, per_sample,
                                                             watch.drift(per_sample), drifted, step + 1,
                                                             args.steps - step - 1, make_optimizer, args.lr, rank)
                replans.append(record)
            elif drifted and replanner is not None:   # TP groups: rows, or new shards
                pm, optimizer, record = drift.reshard_tensor(pm, optimizer, replanner, per_sample, counts,
                                                             watch.drift(per_sample), drifted, step + 1,
                                                             args.steps - step - 1, make_optimizer, args.lr, rank)
                replans.append(record)
                if slow_handles and record["what"] == "re-sharded":   # the rehearsal follows the new modules
                    for handle in slow_handles:
                        handle.remove()
                    tell_step, slow_handles = drift.slow_hook(pm.model, rank)
                    tell_step(step)
            elif drifted:
                replans.append(drift.resplit_rows(pm, per_sample, counts, watch.drift(per_sample), drifted,
                                                  step + 1, pm.plan, rank))
            if drifted:
                watch.reset()
        if every and (step + 1) % every == 0 and step + 1 < args.steps:
            # after any re-split of this step: a resumed run starts from the shares it had
            from hcomm.train.checkpoint import fingerprint, save

            path = save(args.checkpoint_dir, step + 1, pm, optimizer, mine, fingerprint(args, pm.plan), rank,
                        world, groups.default)   # the plan as it runs now: a re-cut pipeline resumes re-cut
            if rank == 0:
                print(f"hcomm train: checkpoint after step {step + 1}: {path}", flush=True)
    for handle in slow_handles:
        handle.remove()
    del optimizer  # ZeRO: its shard state goes before finish() gathers whole parameters for the eval
    if mine:
        mine[-1]["outer_s"] += pm.finish()  # islands that sync every H steps agree before the eval
    dist.barrier(group=groups.default)
    timed = time.perf_counter() - timed_from
    wall = time.perf_counter() - loop_start
    if bar is not None:
        bar.close()
    pm.close()
    result = PlanResult(plan.name, predicted_step_s=plan.predicted_step_s or float("nan"), wall_s=wall,
                        resplit=resplit, replans=replans)
    result.tokens_per_s = tokens_per_step * (args.steps - max(first, args.warmup_steps)) / timed
    losses = _global_losses(mine, plan, groups.default, rank)
    gathered: List = [None] * world
    dist.all_gather_object(gathered, mine, group=groups.default)
    result.counts = [r[-1]["samples"] for r in gathered]
    if rank == 0 or pm.collective_eval:
        result.eval_loss = _evaluate(pm.model, eval_tokens, args.eval_batches, plan.global_batch, plan.seq_len)
    if rank == 0:
        result.steps = _records(gathered, losses, tokens_per_step)
        walls = sorted(r["seconds"] for r in result.steps[args.warmup_steps:])
        result.measured_step_s = walls[len(walls) // 2]
    return result


def _resume(args, plan, pm, optimizer, mine: List[dict], group, rank: int, world: int):
    """(first step to run, checkpoint period or 0): from the newest checkpoint of this run, if any
    (rank 0 looks, every rank loads what it found, its records so far into ``mine``)."""
    every = getattr(args, "checkpoint_every", 0) or 0
    if not every:
        return 0, 0
    from hcomm.train.checkpoint import fingerprint, latest, load, unsupported

    why = unsupported(plan)
    if why:
        raise ValueError(why)
    from hcomm.train.worker import _on_rank0   # rank 0 decides; its ValueError is raised on every rank

    replan = getattr(args, "replan_on_resume", False)
    shape = fingerprint(args, plan)
    if replan:   # the state moves into whatever plan this start made
        shape.pop("plan")
    found = _on_rank0(lambda: latest(args.checkpoint_dir, shape, world), rank)
    if found is None:
        return 0, every
    steps_done, path = found
    moved = ""
    if replan:
        from hcomm.train.checkpoint import check_movable, saved_plan

        saved = _on_rank0(lambda: check_movable(saved_plan(args.checkpoint_dir), plan, path), rank)
        moved = f" (saved under plan '{saved}', moved into plan '{plan.name}')"
    mine.extend(load(path, pm, optimizer, rank, world, group, rows=not replan))
    if rank == 0:
        print(f"hcomm train: resumed from {path}: steps 1-{steps_done} done, continuing at step "
              f"{steps_done + 1} of {args.steps}{moved}", flush=True)
    return steps_done, every


def _show(bar, rank: int, step: int, total: int, t, tokens_per_step: int) -> None:
    if rank != 0:
        return
    loss = t.global_loss if not math.isnan(t.global_loss) else t.local_loss
    text = (f"loss {loss:.4f}  " if not math.isnan(loss) else "") + \
        f"{tokens_per_step / t.step_s:,.0f} tok/s  {t.step_s * 1e3:.0f} ms/step"
    if bar is not None:
        bar.set_postfix_str(text)
        bar.update(1)
    elif step == 0 or (step + 1) % max(1, total // 10) == 0 or step + 1 == total:
        print(f"  step {step + 1:>4}/{total}  {text}", flush=True)


def _resplit(pm, mine: List[dict], plan, group, rank: int, world: int) -> dict:
    """Re-split the batch by the compute each rank really showed in the steps so far.

    The profile times pieces in isolation before training; in training a
    rank's speed also depends on what shares its device (on the emulator,
    its own communication threads share its CPU quota).  Step 0 is left out
    (first-call costs).  Every rank gets rank 0's decision.
    """
    from hcomm.parallel.planner.data import rebalanced_counts

    steps = mine[1:] or mine
    mine_per_sample = sum(r["compute_s"] for r in steps) / max(1, sum(r["samples"] for r in steps))
    per_sample: List = [None] * world
    dist.all_gather_object(per_sample, mine_per_sample if pm.samples else 0.0, group=group)
    old = [None] * world
    dist.all_gather_object(old, pm.samples, group=group)
    box = [rebalanced_counts(per_sample, plan.global_batch, old) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0, group=group)
    new = box[0]
    if new != old:
        pm.resplit(new)
    if rank == 0:
        print(f"hcomm train: re-split after {len(mine)} steps by measured ms/sample "
              f"{[round(s * 1e3) for s in per_sample]}: {old} -> {new}", flush=True)
    return {"after_steps": len(mine), "ms_per_sample": [s * 1e3 for s in per_sample], "from": old, "to": new}


def predicted_as_run(plan, result: PlanResult, view, warmup_steps: int) -> float:
    """The simulator's step time for the plan the measured steps ran: a re-split by measured compute
    (``_resplit``) before the warm-up ends moves rows, so the plan predicted before training is not the
    one the measurement times -- its prediction is the plan's with the new rows.  nan when nothing moved
    or some measured step ran before the move."""
    split = result.resplit
    if not split or split["to"] == split["from"] or split["after_steps"] > warmup_steps:
        return math.nan
    import copy

    from hcomm.parallel.planner.simulate import simulate

    moved = copy.deepcopy(plan)
    for rank, count in zip(moved.ranks, split["to"]):
        rank.batch_share = count / plan.global_batch
    return simulate(moved.validate(), view).step_s


def _global_losses(mine: List[dict], plan, group, rank: int) -> List[float]:
    """Exact global-batch loss per step: sum over ranks of (n_r / N) * local mean loss.

    A pipeline's loss is known on its last stage only (nan elsewhere): there n_r is the replica's rows."""
    local = torch.tensor([r["samples"] / plan.global_batch * r["local_loss"]
                          if r["samples"] and not math.isnan(r["local_loss"]) else 0.0
                          for r in mine], dtype=torch.float64)
    dist.all_reduce(local, group=group)
    return local.tolist()


def _records(per_rank: List[List[dict]], losses: List[float], tokens_per_step: int) -> List[Dict]:
    records = []
    for step, loss in enumerate(losses):
        ranks = [r[step] for r in per_rank]
        slowest = max(r["compute_s"] for r in ranks)
        split = [dict(compute_s=r["compute_s"], busy_s=r.get("busy_s", r["compute_s"]),
                      idle_s=min(r["sync_wait_s"], slowest - r["compute_s"]) if r["sync_wait_s"] else 0.0,
                      comm_s=0.0, optimizer_s=r["optimizer_s"], outer_s=r["outer_s"],
                      **({"zero": r["zero"]} if r.get("zero") else {})) for r in ranks]
        for s, r in zip(split, ranks):
            s["comm_s"] = max(0.0, r["sync_wait_s"] - s["idle_s"]) + r["outer_s"]
        records.append(dict(step=step, loss=loss, tokens=tokens_per_step,
                            seconds=max(r["step_s"] for r in ranks), ranks=split,
                            skipped=any(r.get("skipped") for r in ranks),
                            loss_scales=[r.get("loss_scale", 1.0) for r in ranks]))
    return records

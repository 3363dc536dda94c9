"""Checkpoints of ``hcomm train --checkpoint-every N``, and resuming from the newest one.

A training job on a heterogeneous cluster loses a rank sooner or later; under
torchrun's elastic restarts (``--max-restarts``) every rank is started again,
and ``hcomm train`` then continues from the newest complete checkpoint in
``--checkpoint-dir`` instead of step 0, with the same losses as a run that
was never interrupted (tested bitwise, tests/train/test_checkpoint_restart.py).

What a checkpoint holds, written after every N-th step:
  * the model's parameters and the optimizer's state, through
    torch.distributed.checkpoint (DCP), keyed by the whole model's parameter
    names (the optimizer's flattened: one key per parameter and value): in
    data parallelism they are replicated, and DCP writes each tensor once,
    from one rank; in a pipeline each rank gives what its stages step (stage
    replicas agree, one of them writes), so the files hold every parameter
    once, whatever the cuts, and load into other cuts as they are; TP
    groups gather their shards into the whole tensors first and cut what
    they load (``parallel.tensor.checkpoint``), so the same files serve
    every layout but ZeRO's;
  * under ZeRO, the same in ``zero/`` (``parallel.zero.state``): each rank
    writes only its uneven ranges of every parameter and moment, and any
    other fractions or ZeRO stage load them;
  * per rank (``rank-<r>.pt``): its step records so far (the global losses
    are computed from them after the last step), its batch share (after any
    re-split by measured speed) and its loss scale (fp16 ranks);
  * the marker ``hcomm_train_checkpoint.json``, written last: the step, the
    world size, the plan's YAML and the arguments that shape training.

Atomic on a file system every rank sees: ranks write into ``.step-<n>.tmp``;
after a barrier rank 0 writes the marker and renames the directory to
``step-<n>``, then removes older ones.  A rank killed mid-save leaves a
``.tmp`` without a marker, never loaded; the previous checkpoint is whole.

Resuming needs the same plan and arguments (the marker says which differ)
and the same world size; with ``--replan-on-resume`` the plan may differ:
the run plans again and the state moves into the new plan (``check_movable``
says which files a plan can read).  Data needs nothing saved: every step's global
batch is a function of (seed, step) (``GlobalBatches``).  The marker keeps the
plan as it runs when saved: a pipeline cut again for a straggler resumes with
its new cuts.  Plans covered: data parallelism (hcomm's, uneven shares,
ZeRO-1/2/3, per-device precision), the DDP baseline, pipelines of ranks
(any schedule, replicas, per-device precision), TP groups and pipelines of
them (their uneven shards through the reference layout,
``parallel.tensor.checkpoint``).  Refused before training, naming the plan:
outer sync (each island's anchor and outer momentum: not written yet) and
torch's ZeRO baselines (ZeroRedundancyOptimizer, FSDP2).
"""
from __future__ import annotations

import glob
import json
import os
import shutil
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist

from hcomm.settings import declare

HCOMM_TRAIN_FAULT = declare(
    "HCOMM_TRAIN_FAULT", "",
    "test hook for hcomm train: 'RANK:STEP' makes rank RANK kill itself (SIGKILL) as step STEP begins, on the "
    "first attempt only (torchrun's TORCHELASTIC_RESTART_COUNT 0), to rehearse a lost rank")

MARKER = "hcomm_train_checkpoint.json"
ZERO_DIR = "zero"   # a ZeRO plan's shards, in ``parallel.zero.checkpoint``'s format
# Arguments that change what training computes: a checkpoint taken under
# other values cannot continue this run.
SHAPING_ARGS = ("model", "hf", "seed", "lr", "global_batch", "seq_len", "data", "tokenizer", "vocab", "data_bytes")


def unsupported(plan) -> Optional[str]:
    """Why ``plan``'s state cannot be checkpointed here, or None."""
    dp = plan.dp_group()
    zero = max(r.zero_stage for r in plan.ranks)
    what = ("FSDP2" if plan.backend == "fsdp2-gloo" else
            "torch's ZeroRedundancyOptimizer" if zero and plan.backend != "hcomm" else
            f"outer sync every {dp.sync_every} steps" if dp.sync_every > 1 else None)
    if what is None:
        return None
    return _not_covered(plan.name, what)


def _not_covered(name: str, what: str) -> str:
    return (f"--checkpoint-every: plan '{name}' uses {what}; checkpoints cover data-parallel plans "
            f"(hcomm's, with or without ZeRO, or the DDP baseline), pipelines and TP groups in this version")


def refused_before_launch(args) -> Optional[str]:
    """Why ``--checkpoint-every`` cannot run, as far as the arguments alone tell, or None.

    The launcher asks before any rank starts (a refusal from the ranks costs a
    whole launch: profiles, calibration, plan).  What needs the built plan (a
    plan file's kind, the world size, the plan's YAML) is checked again by rank 0
    in ``latest`` and ``unsupported``."""
    if not getattr(args, "checkpoint_every", 0):
        return None
    from hcomm.train.plans import parse_entry

    base, pins = parse_entry(args.plan)
    zero, sync = int(pins.get("zero", args.zero or 0)), int(pins.get("sync_every", args.sync_every))
    baseline = {1: "torch's ZeroRedundancyOptimizer", 2: "FSDP2", 3: "FSDP2"}   # uniform@zero=N
    what = (baseline.get(zero) if base == "uniform" and zero else
            f"outer sync every {sync} steps" if sync > 1 else None)
    if what:
        return _not_covered(args.plan, what)
    newest = _newest(args.checkpoint_dir)
    if newest is None:
        return None
    path, saved = newest
    differ = [k for k in SHAPING_ARGS if saved.get(k) != getattr(args, k, None)]
    if differ:
        return _another_run(args.checkpoint_dir, path, differ)
    return None


def _another_run(directory: str, path: str, differ: List[str]) -> str:
    return (f"--checkpoint-dir {directory}: {path} is of another run (it differs in {', '.join(differ)}); "
            f"give another --checkpoint-dir or remove it")


def fingerprint(args, plan) -> dict:
    return {"plan": plan.to_yaml(), **{k: getattr(args, k, None) for k in SHAPING_ARGS}}


def _steps(directory: str) -> List[int]:
    """Steps of the complete checkpoints in ``directory``, oldest first."""
    done = []
    for path in glob.glob(os.path.join(directory, "step-*")):
        name = os.path.basename(path)[len("step-"):]
        if name.isdigit() and os.path.exists(os.path.join(path, MARKER)):
            done.append(int(name))
    return sorted(done)


def _held(pm) -> Optional[set]:
    """Names of the parameters this rank steps when it holds part of the model (a pipeline's stages);
    None when it steps the whole model.  Every rank keeps a whole model object, but the pieces of other
    stages hold stale values there: only what a rank steps is its to write."""
    if pm.pipe is None:
        return None
    names = {id(p): n for n, p in pm.model.named_parameters()}
    return {names[id(p)] for p in pm.pipe.parameters()}


def _tensor(pm) -> bool:
    """TP groups (alone or as pipeline stages): this rank holds uneven shards of the reference tensors."""
    return bool(pm.plan.tensor_groups())


def _tensor_state_dicts(pm, optimizer):
    """The whole model's state from the TP group's shards (``tensor.checkpoint``), on every member."""
    from hcomm.parallel.tensor import checkpoint as tensor_checkpoint

    return tensor_checkpoint.state_dicts(pm.model, optimizer)


# Optimizer state keyed by parameter name, param_groups included ("param_groups.<name>.lr"): ranks that
# step different parameters (pipeline stages) then write different keys instead of one "param_groups" list
# each, which DCP would keep from one rank only; and a checkpoint loads into any other cut or plan.
OPTIONS = dict(flatten_optimizer_state_dict=True)


def _state_dicts(pm, optimizer):
    """DCP's (model, optimizer) state dicts of what this rank steps, keyed by the whole model's parameter
    names; the optimizer's state created if it has none yet.

    torch creates it with a zero-lr step on zero gradients, but only where no
    parameter has a ``.grad``, and then sets them to None; hcomm's gradient
    sync points every ``.grad`` at a view of its bucket from the start, so
    without this the state would stay empty (a resumed AdamW would restart
    its moments) or the views would be lost (gradients left unreduced)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(**OPTIONS)
    params = list(pm.model.parameters())
    grads = [p.grad for p in params]
    if not optimizer.state:
        for p in params:
            p.grad = None
    try:
        model_state, optim_state = get_state_dict(pm.model, optimizer, options=options)
    finally:
        for p, g in zip(params, grads):
            p.grad = g
    held = _held(pm)
    if held is not None:   # the optimizer's keys are already only what it steps
        model_state = {k: v for k, v in model_state.items() if k in held}
    return model_state, optim_state


def save(directory: str, steps_done: int, pm, optimizer, records: List[dict], shape: dict, rank: int,
         world: int, group) -> str:
    """Every rank calls this after step ``steps_done - 1``; returns the checkpoint's path."""
    import torch.distributed.checkpoint as dcp

    tmp = os.path.join(directory, f".step-{steps_done}.tmp")
    final = os.path.join(directory, f"step-{steps_done}")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    dist.barrier(group=group)
    if pm.zero is not None:   # uneven 1-D shards: each rank writes its own ranges (``parallel.zero.state``)
        from hcomm.parallel.zero import state as zero_state

        zero_state.save(os.path.join(tmp, ZERO_DIR), pm.zero.engine, optimizer, group=group)
    else:
        model_state, optim_state = _tensor_state_dicts(pm, optimizer) if _tensor(pm) else _state_dicts(pm, optimizer)
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=tmp, process_group=group)
    # rows by the plan's convention: a TP group's or a pipeline replica's on its first rank, 0 on the others
    rows = pm.samples if pm.plan.rows_leader(rank) == rank else 0
    mine = {"records": records, "samples": rows,
            "loss_scale": vars(pm.precision.loss_scale) if pm.precision is not None and
            pm.precision.loss_scale is not None else None,
            "skipped_steps": pm.precision.skipped_steps if pm.precision is not None else 0}
    torch.save(mine, os.path.join(tmp, f"rank-{rank}.pt"))
    dist.barrier(group=group)   # every rank's files are written
    if rank == 0:
        with open(os.path.join(tmp, MARKER), "w") as f:
            json.dump({"steps_done": steps_done, "world_size": world, **shape}, f)
            f.flush()
            os.fsync(f.fileno())
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in _steps(directory):
            if old < steps_done:
                shutil.rmtree(os.path.join(directory, f"step-{old}"), ignore_errors=True)
    dist.barrier(group=group)   # no rank runs ahead of the rename
    return final


def _newest(directory: str) -> Optional[Tuple[str, dict]]:
    """(path, marker) of the newest complete checkpoint in ``directory``, or None."""
    done = _steps(directory) if directory and os.path.isdir(directory) else []
    if not done:
        return None
    path = os.path.join(directory, f"step-{done[-1]}")
    with open(os.path.join(path, MARKER)) as f:
        return path, json.load(f)


def saved_plan(directory: str) -> Optional[str]:
    """The plan YAML of the newest complete checkpoint in ``directory``, or None."""
    newest = _newest(directory)
    return newest[1]["plan"] if newest else None


def _zero(plan) -> bool:
    return plan.backend == "hcomm" and any(r.zero_stage for r in plan.ranks)


def check_movable(saved_yaml: str, plan, path: str) -> str:
    """The saved plan's name, or ValueError when its files cannot load into ``plan`` (``--replan-on-resume``):
    ZeRO's uneven 1-D shards load into any ZeRO plan, the name-keyed files into any other kind."""
    from hcomm.parallel.plan import Plan

    saved = Plan.from_yaml(saved_yaml)
    if _zero(saved) != _zero(plan):
        has, new = ("ZeRO shards", "is not ZeRO") if _zero(saved) else ("whole tensors by name", "is ZeRO")
        raise ValueError(f"--replan-on-resume: {path} holds {has} (plan '{saved.name}') and the new plan "
                         f"'{plan.name}' {new}: pin the kind in --plan (say auto@zero=1, or auto) or resume the "
                         f"saved plan without --replan-on-resume")
    return saved.name


def latest(directory: str, shape: dict, world: int) -> Optional[Tuple[int, str]]:
    """(steps done, path) of the newest complete checkpoint, or None; ValueError if it belongs to another run."""
    newest = _newest(directory)
    if newest is None:
        return None
    path, saved = newest
    if saved["world_size"] != world:
        raise ValueError(f"--checkpoint-dir {directory}: {path} was saved by {saved['world_size']} ranks, "
                         f"this run has {world}")
    differ = [k for k in shape if saved.get(k) != shape[k]]
    if differ:
        raise ValueError(_another_run(directory, path, differ))
    return saved["steps_done"], path


def load(path: str, pm, optimizer, rank: int, world: int, group, rows: bool = True) -> List[dict]:
    """Restore model, optimizer, batch shares and loss scale from ``path``; this rank's records so far.
    ``rows``: take the rows the saved run had re-split its batch to (the same plan resuming; False to
    load the state into another plan, which keeps its own)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    if pm.zero is not None:
        from hcomm.parallel.zero import state as zero_state

        zero_state.load(os.path.join(path, ZERO_DIR), pm.zero.engine, optimizer, group=group)
    elif _tensor(pm):
        from hcomm.parallel.tensor import checkpoint as tensor_checkpoint

        tensor_checkpoint.load(path, pm.model, optimizer, group)
    else:
        model_state, optim_state = _state_dicts(pm, optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        dcp.load(state, checkpoint_id=path, process_group=group)
        set_state_dict(pm.model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                       options=StateDictOptions(strict=_held(pm) is None, **OPTIONS))
    per_rank = [torch.load(os.path.join(path, f"rank-{r}.pt"), weights_only=False) for r in range(world)]
    counts = [p["samples"] for p in per_rank]
    # re-split by measured speed before the checkpoint (a pipeline is cut again instead: its cuts are
    # in the saved plan, every member of a replica runs the replica's rows)
    if rows and pm.pipe is None and counts != pm.plan.batch_counts():
        pm.resplit(counts)
    mine = per_rank[rank]
    if pm.precision is not None:
        if mine["loss_scale"] is not None and pm.precision.loss_scale is not None:
            for key, value in mine["loss_scale"].items():
                setattr(pm.precision.loss_scale, key, value)
        pm.precision.skipped_steps = mine["skipped_steps"]
    return mine["records"]


def fault_hook(rank: int, step: int) -> None:
    """HCOMM_TRAIN_FAULT: this rank dies here on the first attempt, as a lost node would (no clean-up)."""
    spec = HCOMM_TRAIN_FAULT.get()
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    try:
        who, when = (int(x) for x in spec.split(":"))
    except ValueError:
        raise ValueError(f"HCOMM_TRAIN_FAULT must be RANK:STEP, got {spec!r}") from None
    if (who, when) == (rank, step):
        import signal
        import sys

        print(f"hcomm train: HCOMM_TRAIN_FAULT: rank {rank} kills itself at step {step}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

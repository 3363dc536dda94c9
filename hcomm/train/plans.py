"""The plans ``--plan`` asks for: ``auto``, ``uniform``, ``equal``, a YAML file, with pins.

``--plan`` takes a comma list, each entry ``BASE[@key=value]...``:

- ``auto``: the planner's choice; the command line's ``--dp-shares``,
  ``--bucket-mb``, ``--sync-every`` and ``--compress`` pin those parts;
- ``equal``: hcomm's data parallelism with equal batches (auto's other choices);
- ``uniform``: the homogeneous baseline, torch DDP at its defaults over gloo;
- a path: a plan written by hand or by ``hcomm plan``.

Pins after ``@`` override the command line for that entry only, so one run
can compare variants on the same cluster and data, e.g.
``--plan auto,auto@bucket_mb=1,auto@sync_every=8,auto@compress=bf16,uniform``.
Keys: ``bucket_mb``, ``sync_every``, ``compress``, ``shares`` (``equal`` or
numbers separated by ``:``), ``overlap`` (1: the outer all-reduce runs behind
the next inner steps), ``resplit`` (re-split the batch by the compute measured
in the first N steps; 0 = never), ``zero`` (ZeRO stage; also on ``uniform``:
torch's ZeroRedundancyOptimizer or FSDP2), ``prefetch`` (ZeRO-3 gathers ahead),
``pp`` (pipeline stages per replica), ``tp`` (tensor-parallel group size), ``sp``
(1: sequence parallelism inside the TP groups), ``split`` (pipeline pieces: ``auto``,
``uniform`` = Megatron's equal blocks, ``parameters`` = DeepSpeed's parameter
balance), ``schedule`` and ``microbatches``.

With ``--pp N`` (or ``@pp=N``), ``auto`` is hcomm's pipeline plan (replicas,
device order, pieces, rows, schedule and micro-batches by the cost model) and
``uniform`` the Megatron-like baseline on the same runtime: equal blocks per
stage, ranks in order, equal rows, 1F1B.

With ZeRO, ``auto`` sizes every rank's shard by the memory it has left after
its activations and unsharded buffers; ``equal`` shards evenly.
"""
from __future__ import annotations

import copy
import os
from typing import Dict, List, Tuple

from hcomm.parallel.planner.zero import apply_zero  # noqa: F401  (planning ZeRO lives with its cost model)
from hcomm.train.trial import TRIAL_PLANS, distinct_kinds

KEYS = ("bucket_mb", "sync_every", "compress", "shares", "overlap", "resplit", "straggler", "trial", "zero",
        "prefetch", "pp", "split", "schedule", "microbatches", "precision", "tp", "sp")
PIPELINE_KEYS = ("pp", "split", "schedule", "microbatches", "tp", "sp")
DP_STRAGGLER_MARGIN = 0.3   # auto data parallelism re-splits on drift by default: only rows move
SEARCH_KEYS = {"precision", "trial", "straggler"}
SEARCH_PINS = "search chooses every dimension (it takes @precision, @trial and @straggler only)"


def parse_entry(entry: str) -> Tuple[str, Dict[str, str]]:
    """``"auto@bucket_mb=4@compress=bf16"`` -> ``("auto", {"bucket_mb": "4", "compress": "bf16"})``."""
    base, *pins = entry.split("@")
    if base not in ("auto", "equal", "uniform", "search") and not os.path.isfile(base):
        raise ValueError(f"--plan {entry}: {base!r} is not auto, search, equal, uniform or a readable plan file")
    out: Dict[str, str] = {}
    for pin in pins:
        key, sep, value = pin.partition("=")
        if not sep or key not in KEYS:
            raise ValueError(f"--plan {entry}: {pin!r} is not KEY=VALUE with KEY one of {', '.join(KEYS)}")
        out[key] = value
    if set(out) - {"zero", *PIPELINE_KEYS} and base not in ("auto", "equal"):
        if not (base == "search" and set(out) <= SEARCH_KEYS):
            raise ValueError(f"--plan {entry}: pins other than zero and the pipeline's apply to auto and equal only"
                             + (f"; {SEARCH_PINS}" if base == "search" else ""))
    if base == "search" and set(out) - SEARCH_KEYS:
        raise ValueError(f"--plan {entry}: {SEARCH_PINS}")
    if "trial" in out and not out["trial"].isdigit():
        raise ValueError(f"--plan {entry}: trial must be a number of plans to measure (0 = none), got {out['trial']!r}")
    for key in ("pp", "microbatches", "tp"):
        if key in out and not (out[key].isdigit() and int(out[key]) >= 1):
            raise ValueError(f"--plan {entry}: {key} must be a positive integer, got {out[key]!r}")
    if out.get("split", "auto") not in ("auto", "uniform", "parameters"):
        raise ValueError(f"--plan {entry}: split must be auto, uniform or parameters, got {out['split']!r}")
    if out.get("precision", "fp32") not in ("fp32", "per-device", "fp8", "search"):
        raise ValueError(f"--plan {entry}: precision must be fp32, per-device, fp8 or search, "
                         f"got {out['precision']!r}")
    if out.get("precision") == "search" and base != "search":
        raise ValueError(f"--plan {entry}: precision=search chooses dtypes with the joint search; "
                         f"use search@precision=search")
    if out.get("schedule", "1f1b") not in ("gpipe", "1f1b", "interleaved-1f1b"):
        raise ValueError(f"--plan {entry}: schedule must be gpipe, 1f1b or interleaved-1f1b, got {out['schedule']!r}")
    if "zero" in out and out["zero"] not in ("0", "1", "2", "3"):
        raise ValueError(f"--plan {entry}: zero must be 0, 1, 2 or 3, got {out['zero']!r}")
    return base, out


def dtypes_searched(args) -> bool:
    """Whether any plan asks ``precision=search`` (then every rank also profiles in low precision)."""
    return getattr(args, "precision", "fp32") == "search" or any(
        parse_entry(entry)[1].get("precision") == "search" for entry in args.plan.split(","))


def compressions_asked(args) -> List[str]:
    """Every weak-tier wire format the plans will use (the cost model is sampled for each)."""
    found = {args.compress}
    for entry in args.plan.split(","):
        _, pins = parse_entry(entry)
        found.add(pins.get("compress", args.compress))
    return sorted(found)


def baseline_asked(args) -> bool:
    """Whether some plan is torch DDP over gloo (``uniform`` as data parallelism, ZeRO-1 included): then
    the view times torch's all-reduce on the default group, the baseline's, to price it."""
    for entry in args.plan.split(","):
        base, pins = parse_entry(entry)
        if (base == "uniform" and _zero_stage(args, pins) <= 1 and int(pins.get("tp", getattr(args, "tp", 1))) == 1
                and _pipeline_stages(args, pins) == 1):
            return True
    return False


def any_zero(args) -> bool:
    """Whether some plan asked for shards ZeRO (then a rank need not hold the whole training state)."""
    return any(_zero_stage(args, parse_entry(entry)[1]) for entry in args.plan.split(","))


def any_pipeline(args) -> bool:
    """Whether some plan pipelines (then a rank holds only its stages' training state)."""
    return any(_pipeline_stages(args, parse_entry(entry)[1]) > 1 or int(parse_entry(entry)[1].get("tp", args.tp)) > 1
               for entry in args.plan.split(","))


def _pinned(args, pins: Dict[str, str], world: int, base: str) -> dict:
    shares = args.dp_shares
    if "shares" in pins:
        shares = None if pins["shares"] == "auto" else (
            [1.0] * world if pins["shares"] == "equal" else [float(x) for x in pins["shares"].split(":")])
    if base == "equal":
        shares = [1.0] * world
    return dict(shares=shares, bucket_bytes=_bucket_bytes(args, pins),
                sync_every=int(pins.get("sync_every", args.sync_every)),
                compression=pins.get("compress", args.compress),
                outer_overlap=pins.get("overlap", "1" if args.outer_overlap else "0") in ("1", "true", "yes"),
                rebalance_after=int(pins.get("resplit", args.resplit_after)),
                zero_stage=_zero_stage(args, pins))


def _zero_stage(args, pins: Dict[str, str]) -> int:
    return int(pins.get("zero", getattr(args, "zero", 0)))


def make_plans(args, view) -> List:
    """Every plan ``args.plan`` names, on ``view`` (rank 0 calls this; the YAML goes to all)."""
    plans = []
    for entry in args.plan.split(","):
        base, pins = parse_entry(entry)
        tp = int(pins.get("tp", getattr(args, "tp", 1)))
        if base == "search":
            plan = searched_plan(args, view, entry, int(pins.get("trial", TRIAL_PLANS)),
                                 pins.get("precision", getattr(args, "precision", "fp32")) == "search")
        elif base in ("auto", "equal", "uniform") and tp > 1 and _pipeline_stages(args, pins) > 1:
            plan = pipeline_tensor_plan(args, view, entry, base, pins)
        elif base in ("auto", "equal", "uniform") and tp > 1:
            plan = tensor_plan(args, view, entry, base, pins)
        elif base in ("auto", "equal", "uniform") and _pipeline_stages(args, pins) > 1:
            plan = pipeline_plan(args, view, entry, base, pins)
        else:   # data parallelism, ZeRO, the torch baselines, or a plan file
            plan = _data_plan(args, view, entry, base, pins)
        precision = pins.get("precision", getattr(args, "precision", "fp32"))
        if precision == "search" and base in ("auto", "equal"):
            raise ValueError(f"--plan {entry}: --precision search chooses dtypes with the joint search; "
                             f"this plan is not searched (use --plan search)")
        if base in ("auto", "equal", "search") and precision != "search":   # search: its own dtypes
            apply_precision(plan, view, precision)
        if plan.predicted_step_s is None:   # the baselines and plan files: the same simulator predicts them
            from hcomm.parallel.planner.simulate import simulate

            plan.predicted_step_s = simulate(plan, view).step_s
        plans.append(plan)
    return plans


def searched_plan(args, view, entry: str, trial: int = 0, dtypes_searched: bool = False):
    """The joint search's winner (``hcomm.parallel.planner.search``), its table of runners-up in the notes;
    with ``trial`` > 1 the best predicted plans of distinct kinds ride along as ``plan.trial_plans`` (the
    worker measures them and trains the fastest, a near tie going to the faster predicted:
    ``hcomm.train.trial``).  ``dtypes_searched``: the search runs on each dtype assignment too
    (``planner.dtypes``); its plans carry the winning assignment's."""
    from hcomm.models import get_config
    from hcomm.parallel.planner import dtypes as per_device
    from hcomm.parallel.planner.search import search

    config = get_config(args.model)
    kw = dict(dim=config.dim, kv_heads=config.kv_heads, allow_async=args.sync_every > 1,
              compressions=[c for c in (args.compress,) if c != "none"] or ("bf16",))
    dtype_notes = []
    if dtypes_searched:
        result, _, dtype_notes = per_device.search_dtypes(view, args.global_batch, args.seq_len, **kw)
    else:
        result = search(view, args.global_batch, args.seq_len, **kw)
    plan = result.best.plan
    plan.name = entry
    if plan.tensor_groups():
        _note_shards(plan, view, config)
    plan.notes = [*dtype_notes, *result.notes, "candidates (-> chosen):",
                  *result.table(args.global_batch * args.seq_len), *plan.notes]
    plan.trial_plans = []
    if trial > 1:
        for c in distinct_kinds(result.candidates, trial):
            candidate = copy.deepcopy(c.plan)   # the winner itself is among them
            candidate.name, candidate.predicted_step_s = f"{entry} -> {c.label}", c.sim.step_s
            if candidate.tensor_groups() and c.plan is not plan:   # (the winner has its shard note)
                _note_shards(candidate, view, config)
            plan.trial_plans.append(candidate)
    pins = parse_entry(entry)[1]
    for p in [plan, *plan.trial_plans]:   # whichever the trial keeps trains watched, as auto's of its kind
        watch_by_kind(args, p, pins)
    return plan


def watch_by_kind(args, plan, pins: Dict[str, str]) -> None:
    """How an auto or searched plan follows drift: data parallelism (plain, ZeRO, across TP groups) re-splits
    its rows by default (only rows move); a pipeline re-cuts its layers only when asked (``--straggler-margin``
    / ``@straggler=``: it moves state); islands with an outer sync are not watched."""
    dp = plan.dp_group()
    if dp.sync_every == 1:
        dp.straggler_margin = _straggler_margin(args, pins, 0.0 if plan.pipeline_groups() else DP_STRAGGLER_MARGIN)


def searched_shape(plan) -> Dict[str, str]:
    """The pins that make the auto planner's call of a searched plan's shape (``replanner_for``): its stages
    per pipeline or its TP degree, and the compression its gradient sync runs (the search chose it)."""
    pins = {"compress": plan.dp_group().compression}
    if plan.pipeline_groups():
        pins["pp"] = str(len(plan.pipeline_groups()[0].ranks))
    if plan.tensor_groups():
        pins["tp"] = str(len(plan.tensor_groups()[0].ranks))
        pins["sp"] = "1" if plan.tensor_groups()[0].sequence_parallel else "0"
    return pins


def _data_plan(args, view, entry: str, base: str, pins: Dict[str, str]):
    from hcomm.parallel.plan import Plan
    from hcomm.parallel.planner.data import micro_batch_limits, plan_data_parallel

    if base in ("auto", "equal"):
        plan, _ = plan_data_parallel(view, args.global_batch, args.seq_len, name=entry,
                                     **_pinned(args, pins, view.world_size, base))
    elif base == "uniform":
        plan = Plan.uniform(view.world_size, args.global_batch, args.seq_len)
        plan.name = entry   # as auto's and the pipelines': "uniform@zero=1" and "uniform" stay apart
        plan.backend = "ddp-gloo"
        limit = int(min(micro_batch_limits(view, zero_stage=_zero_stage(args, pins))))
        for r in plan.ranks:
            r.device = view.devices[r.rank]
            r.micro_batch = limit
        plan.notes = ["homogeneous baseline: equal batches, torch DDP at its defaults over gloo"]
    else:
        plan = Plan.load(base)
        plan.name = plan.name or os.path.basename(base)
    if base == "auto" and args.dp_shares is None and "shares" not in pins:   # shares not pinned: follow drift
        watch_by_kind(args, plan, pins)
    if base in ("auto", "equal", "uniform") and _zero_stage(args, pins):
        apply_zero(plan, view, _zero_stage(args, pins), base, layout=getattr(args, "zero_layout", "auto"),
                   prefetch=int(pins.get("prefetch", getattr(args, "prefetch", 1))))
    check_memory(plan, view)
    return plan


def _bucket_bytes(args, pins: Dict[str, str]):
    bucket_mb = float(pins["bucket_mb"]) if "bucket_mb" in pins else args.bucket_mb
    return int(bucket_mb * 2**20) if bucket_mb else None


def _rows_from_planner(args, entry: str, pins: Dict[str, str], whose: str, flag: str) -> None:
    """Pipelines and TP groups take their rows from the planner: refuse pinned batch shares."""
    if args.dp_shares is not None or "shares" in pins:
        raise ValueError(f"--plan {entry}: {whose} come from the planner; --dp-shares / @shares do not apply "
                         f"with {flag}")


def _pipeline_stages(args, pins: Dict[str, str]) -> int:
    return int(pins.get("pp", getattr(args, "pp", 1)))


def pipeline_plan(args, view, entry: str, base: str, pins: Dict[str, str]):
    """The pipeline plan of one ``--plan`` entry (``hcomm.parallel.planner.pipeline``)."""
    from hcomm.models import get_config
    from hcomm.parallel.planner.pipeline import boundary_bytes, plan_pipeline

    if base == "equal" or _zero_stage(args, pins) or int(pins.get("sync_every", args.sync_every)) > 1:
        raise ValueError(f"--plan {entry}: a pipeline runs as auto or uniform, without zero or sync_every")
    _rows_from_planner(args, entry, pins, "a pipeline's rows per replica", "--pp")
    split = pins.get("split", "uniform" if base == "uniform" else "auto")
    micro = pins.get("microbatches", getattr(args, "microbatches", None))
    plan = plan_pipeline(view, args.global_batch, args.seq_len, stages=_pipeline_stages(args, pins), split=split,
                         boundary=boundary_bytes(get_config(args.model).dim, args.seq_len),
                         schedule=pins.get("schedule", getattr(args, "schedule", None)),
                         micro_batches=int(micro) if micro else None, name=entry,
                         bucket_bytes=_bucket_bytes(args, pins),
                         compression=pins.get("compress", args.compress))
    if base == "auto":   # re-cut the layers on drift (off unless asked: it moves state)
        watch_by_kind(args, plan, pins)
    return plan


def _straggler_margin(args, pins: Dict[str, str], default: float) -> float:
    """The ``@straggler=`` pin, else ``--straggler-margin``, else ``default``."""
    given = getattr(args, "straggler_margin", None)
    return float(pins.get("straggler", default if given is None else given))


def replanner_for(args, view, plan):
    """What re-plans ``plan`` when its ranks drift (``train.loop``), or None when nothing watches it.
    Plain data parallelism re-splits its rows without one; a pipeline is cut again by the same planner
    call that made it, on the drifted speeds (``planner.replan``).  A pipeline of TP groups is cut again
    by the same pipeline planner on the view where each group is one device (its groups and fractions
    stay: the replanner hands this call that view).  TP groups alone may get new shards from the same
    tensor planner call (``planner.replan_tensor``).  A searched plan is re-planned by the auto planner's
    call for the shape the search chose (``searched_shape``): the search's other shapes would move the whole
    state between layouts, which no re-plan here prices."""
    if not plan.dp_group().straggler_margin or not (plan.pipeline_groups() or plan.tensor_groups()):
        return None
    from hcomm.parallel.planner.replan import PipelineReplanner
    from hcomm.parallel.planner.replan_tensor import TensorReplanner

    base, pins = parse_entry(plan.name)
    if base == "search":   # the auto planner's call for the shape the search chose
        base, pins = "auto", searched_shape(plan)
    if base != "auto":   # a plan file: no planner call to repeat
        return None
    if not plan.pipeline_groups():   # TP groups: the same planner call gives the shards at the drifted speeds
        return TensorReplanner(view, lambda v, old: tensor_plan(args, v, old.name, base, pins))
    pins = dict(pins, pp=str(len(plan.pipeline_groups()[0].ranks)))   # as many stages as it runs now
    return PipelineReplanner(view, lambda v, old: pipeline_plan(args, v, old.name, base, pins))


def tensor_plan(args, view, entry: str, base: str, pins: Dict[str, str]):
    """The tensor-parallel plan of one ``--plan`` entry (``hcomm.parallel.planner.tensor``)."""
    from hcomm.models import get_config
    from hcomm.parallel.planner.tensor import plan_tensor

    if base == "equal" or _zero_stage(args, pins) or int(pins.get("sync_every", args.sync_every)) > 1:
        raise ValueError(f"--plan {entry}: tensor parallelism runs as auto or uniform, without zero or sync_every")
    _rows_from_planner(args, entry, pins, "a TP group's rows", "--tp")
    config = get_config(args.model)
    plan = plan_tensor(view, args.global_batch, args.seq_len, tp=int(pins.get("tp", args.tp)), dim=config.dim,
                       n_layers=config.n_layers, split="uniform" if base == "uniform" else "auto", name=entry,
                       bucket_bytes=_bucket_bytes(args, pins),
                       compression=pins.get("compress", args.compress),
                       sequence_parallel=pins.get("sp", "1" if getattr(args, "sequence_parallel", False) else "0")
                       in ("1", "true", "yes"))
    _note_shards(plan, view, config)
    if base == "auto":   # the groups' rows follow drift (only rows move)
        watch_by_kind(args, plan, pins)
    return plan


def _note_shards(plan, view, config) -> None:
    """The TP split on this model (refused here, before any rank starts, when it cannot be cut)."""
    from hcomm.parallel.tensor.parallelize import tp_split

    group = plan.tensor_groups()[0].ranks
    vocab = view.profiles[0].layers[-1].param_bytes // (4 * config.dim)   # the head: vocab x dim fp32
    split = tp_split(config, vocab, [plan.ranks[r].tp_fraction for r in group])
    plan.notes.append(f"shards by position: query heads {split.q_heads} (KV {split.kv_heads}), MLP features "
                      f"{split.hidden}, vocabulary rows {split.vocab}")


def pipeline_tensor_plan(args, view, entry: str, base: str, pins: Dict[str, str]):
    """A pipeline of TP groups (``--pp N --tp T``; ``hcomm.parallel.planner.pipeline_tensor``)."""
    from hcomm.models import get_config
    from hcomm.parallel.planner.pipeline import boundary_bytes
    from hcomm.parallel.planner.pipeline_tensor import plan_pipeline_tensor

    if base == "equal" or _zero_stage(args, pins) or int(pins.get("sync_every", args.sync_every)) > 1 or \
            pins.get("sp", "1" if getattr(args, "sequence_parallel", False) else "0") in ("1", "true", "yes"):
        raise ValueError(f"--plan {entry}: a pipeline of TP groups runs as auto or uniform, without zero, "
                         f"sync_every or sequence parallelism")
    _rows_from_planner(args, entry, pins, "a pipeline's rows per replica", "--pp with --tp")
    config = get_config(args.model)
    micro = pins.get("microbatches", getattr(args, "microbatches", None))
    plan = plan_pipeline_tensor(view, args.global_batch, args.seq_len, stages=_pipeline_stages(args, pins),
                                tp=int(pins.get("tp", args.tp)), dim=config.dim,
                                boundary=boundary_bytes(config.dim, args.seq_len),
                                split="uniform" if base == "uniform" else "auto",
                                schedule=pins.get("schedule", getattr(args, "schedule", None)),
                                micro_batches=int(micro) if micro else None, name=entry,
                                bucket_bytes=_bucket_bytes(args, pins), compression=pins.get("compress", args.compress))
    _note_shards(plan, view, config)
    if base == "auto":   # re-cut the groups' layers on drift (off unless asked: it moves state)
        watch_by_kind(args, plan, pins)
    return plan


def apply_precision(plan, view, precision: str) -> None:
    """``per-device``: every rank computes in its device kind's best dtype (``parallel/precision.py``);
    ``fp8``: the same, with fp8 matmuls on the kinds that have them (H100/H800)."""
    if precision == "fp32":
        return
    from hcomm.parallel.devices import supports
    from hcomm.parallel.precision import per_device_dtypes

    for r, dtype in zip(plan.ranks, per_device_dtypes(view.devices)):
        r.compute_dtype = "fp8" if precision == "fp8" and supports(view.devices[r.rank], "fp8") else dtype
    plan.notes.append("per-device precision: " + ", ".join(f"rank {r.rank} {view.devices[r.rank]} {r.compute_dtype}"
                                                           for r in plan.ranks)
                      + "; fp32 parameters, optimizer state and gradient reduction; fp16 ranks scale the loss")
    plan.validate(view.world_size)


def check_memory(plan, view) -> None:
    """A plan whose samples in flight do not fit a rank's budget is refused before it runs."""
    if plan.ranks[0].zero_stage:
        if plan.backend == "hcomm":
            from hcomm.parallel.zero.memory import check_zero_fits

            check_zero_fits(plan, view.profiles, view.devices)
        # torch's ZeRO baselines keep their own layout: what they need is what they really use
        # (a rank that runs out is OOM-killed and reported by the emulator), not hcomm's model of it
        return
    counts = plan.batch_counts()
    for rank, (r, p) in enumerate(zip(plan.ranks, view.profiles)):
        in_flight = min(r.micro_batch or counts[rank], counts[rank])
        extra = 2 * p.param_bytes if plan.dp_group().sync_every > 1 else 0
        need = p.memory_needed(in_flight) + extra
        if need > p.memory_budget_bytes:
            raise ValueError(
                f"plan {plan.name!r}: rank {rank} ({view.devices[rank]}) would need {need / 2**30:.2f} GiB "
                f"(state {(p.state_bytes() + extra) / 2**30:.2f} GiB + activations of {in_flight} samples at once) "
                f"but its memory budget is {p.memory_budget_bytes / 2**30:.2f} GiB; "
                f"lower its micro_batch or share")

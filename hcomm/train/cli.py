"""``hcomm train``: train a Llama-style model with hcomm's plan on a (possibly emulated) cluster.

With no arguments it is the main job: on the default emulated cluster it
trains hcomm's plan (``search``: every dimension searched, the best few
measured) and the homogeneous baseline (``uniform``: equal batches, torch
DDP at its defaults over gloo) on the same data for the same steps, prints
both side by side with the speed-up at equal loss, and draws which device
does what (``hcomm-plans.png``).

Under ``torchrun`` or ``hcomm emulate run`` it uses the launcher's ranks;
otherwise it brings the emulated cluster up itself (as ``hcomm demo``
does), or, where the emulator cannot run, local unshaped ranks.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

MAIN_JOB = dict(model="small", steps=30, global_batch=24, seq_len=64, lr=2e-3)
# hcomm's plan: the joint search, its best plans of distinct kinds measured for a few steps and the
# fastest trained (train/trial.py); the baseline: equal batches, torch DDP at its defaults over gloo
MAIN_JOB_PLANS = "search,uniform"


def parse(argv: List[str], prog: str = "hcomm train") -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--cluster", default=None, help="emulator preset or spec file (default: the default preset)")
    p.add_argument("--model", default=None, help=f"named config or YAML file (default {MAIN_JOB['model']})")
    p.add_argument("--hf", action="store_true", help="train the Hugging Face LlamaForCausalLM of the same config")
    p.add_argument("--plan", default=None,
                   help="auto, search, equal, uniform, a plan YAML, or a comma list to compare, each with optional "
                        "@key=value pins (see hcomm.train.plans; default: search,uniform)")
    p.add_argument("--steps", type=int, default=None, help=f"optimizer steps (default {MAIN_JOB['steps']})")
    p.add_argument("--warmup-steps", type=int, default=None,
                   help="steps left out of tokens/s (first-call costs; default 2, or steps-1 if fewer)")
    p.add_argument("--global-batch", type=int, default=None, help=f"samples per step (default {MAIN_JOB['global_batch']})")
    p.add_argument("--seq-len", type=int, default=None, help=f"tokens per sample (default {MAIN_JOB['seq_len']})")
    p.add_argument("--lr", type=float, default=None, help=f"AdamW learning rate (default {MAIN_JOB['lr']})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=None, help="text file, folder, or datasets folder (default: Python's stdlib)")
    p.add_argument("--tokenizer", default="bpe", choices=["bpe", "bytes"])
    p.add_argument("--vocab", type=int, default=2048, help="BPE vocabulary size")
    p.add_argument("--data-bytes", type=int, default=4 << 20, help="most corpus bytes to tokenise")
    p.add_argument("--dp-shares", default=None, help="pin the batch shares, e.g. 0.4,0.4,0.1,0.1")
    p.add_argument("--bucket-mb", type=float, default=None, help="pin the gradient bucket size (MiB)")
    p.add_argument("--sync-every", type=int, default=1, help="cross-island sync period H (DiLoCo outer steps)")
    p.add_argument("--outer-overlap", action="store_true",
                   help="with --sync-every: run the cross-island all-reduce behind the next inner steps")
    p.add_argument("--resplit-after", type=int, default=3,
                   help="auto: re-split the batch by the compute measured in the first N steps (0 = never)")
    p.add_argument("--straggler-margin", type=float, default=None,
                   help="auto: re-plan whenever a rank's seconds per sample drift more than this fraction from "
                        "what it showed after the last (re)plan, 3 steps in a row (0 = never): data parallelism "
                        "(plain, ZeRO, across TP groups) re-splits the batch (default 0.3), a pipeline re-cuts "
                        "its layers and moves their state (default off: set it where speeds drift)")
    p.add_argument("--compress", default="none", help="inter-island wire format: none, bf16, fp16, fp8e4m3[:ef], ...")
    p.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3],
                   help="ZeRO stage: 1 optimizer state, 2 + gradients, 3 + parameters sharded (uniform: torch's "
                        "ZeroRedundancyOptimizer / FSDP2 with even shards)")
    p.add_argument("--zero-layout", default="auto", choices=["auto", "flat", "island"],
                   help="ZeRO shards over every rank (flat) or inside each island, replicated across (island); "
                        "auto: whichever the cost model predicts faster")
    p.add_argument("--prefetch", type=int, default=1, help="ZeRO-3: gathers issued this many units ahead")
    p.add_argument("--precision", default="fp32", choices=["fp32", "per-device", "fp8", "search"],
                   help="per-device: each rank computes in its device kind's best dtype (bf16 on A100/H800/910B, "
                        "fp16 with loss scaling on V100); fp8: the same with fp8 matmuls on H100/H800; search "
                        "(with --plan search): every rank profiles fp32 and its low dtype, and the search chooses "
                        "each kind's dtype by measured speed; parameters, optimizer state and reductions stay fp32")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel group size (ranks / TP groups of data parallelism); auto splits heads, MLP "
                        "features and vocabulary by measured speed, uniform evenly (Megatron)")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="with --tp: norms and residuals hold only each rank's (uneven) slice of the sequence")
    p.add_argument("--pp", type=int, default=1,
                   help="pipeline stages per replica (ranks / STAGES replicas); auto places pieces by measured "
                        "speed and memory, uniform splits blocks evenly (Megatron)")
    p.add_argument("--schedule", default=None, choices=["gpipe", "1f1b", "interleaved-1f1b"],
                   help="pipeline schedule (default: auto chooses by the cost model; uniform uses 1f1b)")
    p.add_argument("--microbatches", type=int, default=None,
                   help="pipeline micro-batches per replica and step (default: auto chooses)")
    p.add_argument("--profile-budget", type=float, default=10.0, help="seconds each rank may spend profiling")
    p.add_argument("--eval-batches", type=int, default=4, help="held-out batches for the final eval loss")
    p.add_argument("--json", default=None, help="write one record per step, the plans, machine and versions")
    p.add_argument("--plot", default=None, help="draw loss vs time and the per-rank time breakdown (PNG)")
    p.add_argument("--picture", default=None,
                   help="draw which device does what in each plan (PNG; the main job writes hcomm-plans.png)")
    p.add_argument("--save-plan", default=None,
                   help="write the plan as YAML (several plans: PATH with -1, -2, ... before the extension); "
                        "hcomm train --plan PATH runs it")
    p.add_argument("--print-plan-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--local", action="store_true", help="unshaped local ranks, no emulated cluster")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="save a checkpoint every N steps into --checkpoint-dir, and resume from its newest one "
                        "when started again (one plan: data parallelism with or without ZeRO, a pipeline, "
                        "TP groups)")
    p.add_argument("--checkpoint-dir", default="hcomm-checkpoints",
                   help="folder of the checkpoints, on a file system every rank sees (default %(default)s)")
    p.add_argument("--replan-on-resume", action="store_true",
                   help="when resuming, plan again for the cluster as measured now (a replaced node of another "
                        "kind, another speed) and move the saved state into the new plan, instead of training "
                        "the saved plan (same world size; ZeRO's checkpoints into ZeRO plans)")
    p.add_argument("--max-restarts", type=int, default=0,
                   help="restart every rank up to N times when one fails (torchrun's elastic restarts; with "
                        "--checkpoint-every the job continues from the last checkpoint)")
    args = p.parse_args(argv)
    compare_default = args.plan is None
    for key, value in MAIN_JOB.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if compare_default:
        args.plan = MAIN_JOB_PLANS
        if args.picture is None and not args.print_plan_only:
            args.picture = "hcomm-plans.png"
    if args.warmup_steps is None:
        args.warmup_steps = max(0, min(2, args.steps - 1))
    _check(p, args)
    return args


def _check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Errors a user can fix, named, before any cluster comes up."""
    if args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    if args.global_batch < 1:
        p.error(f"--global-batch must be >= 1, got {args.global_batch}")
    if args.seq_len < 1:
        p.error(f"--seq-len must be >= 1, got {args.seq_len}")
    if not args.lr > 0:
        p.error(f"--lr must be > 0, got {args.lr}")
    if args.resplit_after < 0:
        p.error(f"--resplit-after must be >= 0, got {args.resplit_after}")
    if args.straggler_margin is not None and not args.straggler_margin >= 0:
        p.error(f"--straggler-margin must be >= 0 (0 = never), got {args.straggler_margin}")
    if args.sync_every < 1:
        p.error(f"--sync-every must be >= 1, got {args.sync_every}")
    if args.prefetch < 0:
        p.error(f"--prefetch must be >= 0, got {args.prefetch}")
    if args.tp < 1:
        p.error(f"--tp must be >= 1, got {args.tp}")
    if args.tp > 1 and (args.zero or args.sync_every > 1):
        p.error(f"--tp {args.tp} runs with data parallelism or pipelines across TP groups: not with --zero or "
                f"--sync-every (yet)")
    if args.tp > 1 and args.pp > 1 and args.sequence_parallel:
        p.error("--sequence-parallel does not run with --pp (stage boundaries carry whole sequences)")
    if args.pp < 1:
        p.error(f"--pp must be >= 1, got {args.pp}")
    if args.microbatches is not None and args.microbatches < 1:
        p.error(f"--microbatches must be >= 1, got {args.microbatches}")
    if args.pp > 1 and args.microbatches and args.global_batch % args.microbatches:
        p.error(f"--microbatches {args.microbatches} does not divide --global-batch {args.global_batch}")
    if args.pp > 1 and (args.zero or args.sync_every > 1):
        p.error(f"--pp {args.pp} runs with plain data parallelism across replicas: not with --zero or --sync-every")
    if args.zero and args.sync_every > 1:
        p.error(f"--zero {args.zero} shards one optimizer over every rank; it cannot run with --sync-every "
                f"{args.sync_every}")
    if args.checkpoint_every < 0:
        p.error(f"--checkpoint-every must be >= 0 (0 = never), got {args.checkpoint_every}")
    if args.replan_on_resume and not args.checkpoint_every:
        p.error("--replan-on-resume moves a checkpoint's state into a new plan; give --checkpoint-every N")
    if args.checkpoint_every and "," in args.plan:
        p.error(f"--checkpoint-every trains one plan and resumes it; --plan lists {len(args.plan.split(','))} "
                f"({args.plan})")
    if args.checkpoint_every and "," not in args.plan:
        from hcomm.train.checkpoint import refused_before_launch

        try:
            why = refused_before_launch(args)
        except ValueError:
            why = None   # a malformed --plan is named by the entry check below
        if why:
            p.error(why)
    if args.max_restarts < 0:
        p.error(f"--max-restarts must be >= 0, got {args.max_restarts}")
    if args.warmup_steps < 0 or args.warmup_steps >= args.steps:
        p.error(f"--warmup-steps must be in [0, steps), got {args.warmup_steps} with --steps {args.steps}")
    if args.data is not None and not os.access(args.data, os.R_OK):
        p.error(f"--data {args.data}: no such file or folder, or not readable")
    if args.bucket_mb is not None and args.bucket_mb * 2**20 < 1024:
        p.error(f"--bucket-mb must be at least 1 KiB, got {args.bucket_mb}")
    if args.dp_shares is not None:
        try:
            args.dp_shares = [float(x) for x in args.dp_shares.split(",")]
        except ValueError:
            p.error(f"--dp-shares must be comma-separated numbers, got {args.dp_shares!r}")
    from hcomm.train.plans import parse_entry

    for entry in args.plan.split(","):
        try:
            parse_entry(entry)
        except ValueError as e:
            p.error(str(e))
    try:
        from hcomm.models import get_config

        get_config(args.model)
    except ValueError as e:
        p.error(f"--model: {e}")
    from hcomm.compress import parse as parse_compression

    try:
        parse_compression(args.compress)
    except ValueError as e:
        p.error(f"--compress: {e}")


def _worker_argv(argv: List[str]) -> List[str]:
    return [sys.executable, "-m", "hcomm.train.worker", *argv]


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(argv or [])
    args = parse(argv)
    if "RANK" in os.environ:  # torchrun / hcomm emulate run: we are one rank
        from hcomm.train.worker import main as rank_main

        return rank_main(argv)
    from hcomm.emulate import DEFAULT_PRESET, load_spec, run as run_emulated
    from hcomm.emulate.preflight import message, missing

    spec = load_spec(args.cluster or DEFAULT_PRESET)
    lacking = [] if args.local else missing()
    unshaped = bool(args.local or lacking)
    if lacking:
        print(f"hcomm train: the emulator cannot run here ({message(lacking)}); running {spec.world_size} "
              f"unshaped local ranks instead (speeds, memory and links are NOT emulated)", file=sys.stderr)
    where = "unshaped local ranks" if unshaped else "emulated cluster"
    print(f"hcomm train: {args.plan.replace(',', ' vs ')} on {where} '{spec.name}' ({spec.world_size} ranks: "
          + ", ".join(f"{r.device}@{r.speed:g}" for r in spec.ranks) + ")", flush=True)
    return run_emulated(spec, _worker_argv(argv), unshaped=unshaped, max_restarts=args.max_restarts,
                        defer_quota=True,   # the worker enters its quota before it computes
                        show_cpu_plan=True)

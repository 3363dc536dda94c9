"""One rank of ``hcomm train``: build, measure, plan, then train each plan asked for.

Read top to bottom: the process's memory baseline, the process groups, the
data (rank 0 tokenises, the others read its cache), the model, this rank's
profile and everyone's, the cluster view, the plans (rank 0 plans, every
rank gets the same YAML), then for each plan a fresh model from the same
seed trained on the same global batches (``loop.train_plan``), and finally
rank 0's report.  Every error that input can cause is raised here, on every
rank, before the first step.
"""
from __future__ import annotations

import datetime
import os
import sys
import time
from typing import List, Optional

import torch
import torch.distributed as dist

import hcomm  # noqa: F401  (registers the backend)
from hcomm.parallel.profile import process_rss_bytes
from hcomm.train.release import release_memory

# The process's own cost (interpreter, torch, hcomm), before any model or data:
# what a plan may use is the rank's memory minus this.
_BASELINE_BYTES = process_rss_bytes()


def _log(rank: int, text: str) -> None:
    if rank == 0:
        print(f"hcomm train: {text}", flush=True)


def _on_rank0(fn, rank: int):
    """``fn()`` on rank 0, its result on every rank; a ValueError there is raised on every rank
    (the others must learn it, not wait out a timeout)."""
    box = [None]
    if rank == 0:
        try:
            box[0] = ("ok", fn())
        except ValueError as e:
            box[0] = ("error", str(e))
    dist.broadcast_object_list(box, src=0)
    status, value = box[0]
    if status == "error":
        raise ValueError(value)
    return value


def load_data(args, rank: int):
    """Tokens split into training and held-out parts (rank 0 fills the cache first)."""
    from hcomm.train.data import load_tokens

    def load():
        return load_tokens(args.data, tokenizer=args.tokenizer, vocab_size=args.vocab, max_bytes=args.data_bytes)

    # Rank 0 trains the tokenizer and fills the cache; then every rank reads it (0.01 s on a hit).
    _on_rank0(lambda: load().source, rank)
    data = load()
    held_out = (args.eval_batches * args.global_batch + 1) * args.seq_len + 1
    if data.tokens.numel() < 4 * held_out:
        raise ValueError(f"the corpus has {data.tokens.numel()} tokens; {args.eval_batches} held-out batches of "
                         f"{args.global_batch} x {args.seq_len} need {held_out} and training needs more "
                         f"(lower --global-batch/--seq-len/--eval-batches or give more --data)")
    return data, data.tokens[:-held_out], data.tokens[-held_out:]


def build(args, vocab_size: int):
    from hcomm.models import build_hf_llama, build_model, get_config

    config = get_config(args.model)
    if args.seq_len > config.max_seq_len:
        raise ValueError(f"--seq-len {args.seq_len} exceeds the model's max_seq_len {config.max_seq_len}")
    if args.hf:
        return build_hf_llama(config, vocab_size=vocab_size, seed=args.seed), config
    return build_model(config, vocab_size=vocab_size, seed=args.seed), config


def optimizer_seconds(model, lr: float, reps: int = 3, most_elements: int = 4 << 20) -> float:
    """Median AdamW step over this model's parameter count, timed on at most ``most_elements``
    elements and scaled (the fused step is linear in elements).  Bounded so that timing it never
    needs the whole model's optimizer state: under ZeRO that state does not fit one rank."""
    total = sum(p.numel() for p in model.parameters())
    n = min(total, most_elements)
    param = torch.nn.Parameter(torch.randn(n))
    param.grad = torch.zeros_like(param)
    from hcomm.train.loop import make_optimizer

    opt = make_optimizer([param], lr)
    times = []
    for _ in range(reps + 1):
        t = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t)
    del opt, param
    return sorted(times[1:])[reps // 2] * total / n


def check_state_fits(n_params: int, groups, rank: int, world: int, zero: int = 0) -> None:
    """Refuse before profiling (which itself needs memory) if some rank cannot hold the model's state.

    Plain data parallelism keeps parameters, gradients and AdamW's two fp32
    states on every rank: 16 bytes per fp32 parameter, counted from the config
    before any model is built.  Under ZeRO or pipelining every rank still
    builds the whole fp32 model once before sharding or splitting it (4 bytes
    per parameter); whether its shards or stages fit is checked per plan once
    the profiles are known.  Every rank
    checks its own budget and every rank learns who failed.
    """
    from hcomm.parallel.devices import local_device_name
    from hcomm.parallel.profile import memory_budget

    state = (4 if zero else 16) * n_params
    budget, _, source = memory_budget(_BASELINE_BYTES)
    mine = None if state <= budget else (rank, local_device_name(), budget, source)
    everyone: List = [None] * world
    dist.all_gather_object(everyone, mine, group=groups.default)
    failed = [f for f in everyone if f is not None]
    if failed:
        r, device, budget, source = failed[0]
        what = "building the whole model before sharding it needs" if zero else \
            "parameters, gradients and AdamW state need"
        raise ValueError(f"the model does not fit rank {r} ({device}): {what} "
                         f"{state / 2**30:.2f} GiB; its memory budget is {budget / 2**30:.2f} GiB ({source}, after "
                         f"the process's own baseline)" + (f"; also ranks {[f[0] for f in failed[1:]]}"
                                                            if len(failed) > 1 else ""))


KEY_PREFIX_LOW = "hcomm/model-profile-low-precision"   # the store keys of the second gather


def profile_cluster(args, model, config, vocab_size: int, groups, rank: int, world: int):
    from hcomm.parallel.cluster import discover
    from hcomm.parallel.profile_store import gather_profiles, model_signature, resolve_profile

    micro = max(1, min(4, args.global_batch // world))
    signature = model_signature({**config.to_dict(), "hf": args.hf}, vocab_size)
    topo = hcomm.topology(groups.hcomm)
    from hcomm.train.plans import any_pipeline, dtypes_searched

    def local_profile(compute_dtype: str):
        mine = resolve_profile(model, model_signature=signature, cluster_signature=topo.signature(),
                               micro_batch=micro, seq_len=args.seq_len, vocab_size=vocab_size, rank=rank,
                               budget_s=args.profile_budget, baseline_bytes=_BASELINE_BYTES,
                               compute_dtype=compute_dtype)
        if any_pipeline(args) and micro > 1:   # pipelines run small micro-batches: measure each piece's fixed cost
            one = resolve_profile(model, model_signature=signature, cluster_signature=topo.signature(),
                                  micro_batch=1, seq_len=args.seq_len, vocab_size=vocab_size, rank=rank,
                                  budget_s=args.profile_budget / 2, baseline_bytes=_BASELINE_BYTES,
                                  compute_dtype=compute_dtype)
            mine = mine.with_fixed_costs(one)
        return mine

    store = dist.distributed_c10d._get_default_store()
    timeout_s = max(120.0, 6 * args.profile_budget)
    profiles = gather_profiles(local_profile("fp32"), store, rank, world, timeout_s=timeout_s)
    low_profiles = []
    if dtypes_searched(args):   # the same pieces under the autocast of this kind's best low dtype
        from hcomm.parallel.devices import local_device_name
        from hcomm.parallel.precision import per_device_dtypes

        low_profiles = gather_profiles(local_profile(per_device_dtypes([local_device_name()])[0]), store, rank,
                                       world, timeout_s=timeout_s, key_prefix=KEY_PREFIX_LOW)
    opt_s = [None] * world
    dist.all_gather_object(opt_s, optimizer_seconds(model, args.lr))
    from hcomm.train.plans import baseline_asked, compressions_asked

    view = discover(groups.default, groups.hcomm, groups.island, profiles, opt_s, compressions_asked(args),
                    baseline=baseline_asked(args))
    view.low_precision_profiles = low_profiles
    if view.calibration:
        from hcomm.parallel.calibration import describe

        _log(rank, describe(view.calibration))
    return view


def plans_for(args, view, rank: int) -> List:
    """The plans to run, made on rank 0 and sent to all (every rank then validates its copy); a searched
    plan's trial candidates travel with it (``plan.trial_plans``)."""
    from hcomm.parallel.plan import Plan
    from hcomm.train.plans import make_plans

    texts = _on_rank0(lambda: [(p.to_yaml(), [t.to_yaml() for t in getattr(p, "trial_plans", [])])
                               for p in make_plans(args, view)], rank)
    plans = []
    for text, trials in texts:
        plan = Plan.from_yaml(text).validate(view.world_size)
        plan.trial_plans = [Plan.from_yaml(t).validate(view.world_size) for t in trials]
        plans.append(plan)
    return plans


def settle_trials(args, plans: List, vocab_size: int, groups, train_tokens, rank: int) -> List:
    """Each searched plan with trial candidates becomes the one its trial chooses (``trial.choose``: the
    fastest measured, a near tie going to the faster predicted), under the search entry's name, its notes
    saying what was measured."""
    from hcomm.train.trial import choose

    out = []
    for plan in plans:
        if len(plan.trial_plans) > 1:
            best, measured = choose(args, plan.trial_plans, lambda: build(args, vocab_size)[0], groups,
                                    train_tokens, rank)
            winner = plan.trial_plans[best]
            winner.notes = [f"trial ({len(measured)} plans x a few steps), measured vs predicted ms per step: "
                            + "; ".join(f"{p.name.split('-> ')[-1]} {m * 1e3:.0f} vs {p.predicted_step_s * 1e3:.0f}"
                                        for p, m in zip(plan.trial_plans, measured)), *winner.notes]
            winner.name = plan.name
            plan = winner
        out.append(plan)
    return out


def resumed_plan(args, rank: int, world: int):
    """The plan of the newest checkpoint when resuming (--checkpoint-every): the run continues with the
    plan it was saved under, not a new one (a new profile or trial could choose another); with
    ``--replan-on-resume`` None: plan again, and the state moves into the new plan (``loop._resume``)."""
    if not args.checkpoint_every or getattr(args, "replan_on_resume", False):
        return None
    from hcomm.parallel.plan import Plan
    from hcomm.train.checkpoint import saved_plan

    text = _on_rank0(lambda: saved_plan(args.checkpoint_dir), rank)
    if text is None:
        return None
    _log(rank, f"resuming: the plan of the newest checkpoint in {args.checkpoint_dir}")
    return Plan.from_yaml(text).validate(world)


def save_plans(plans: List, path: str) -> None:
    """Each plan's YAML: ``path`` for one plan, ``stem-1.ext``, ``stem-2.ext``, ... for several."""
    stem, ext = os.path.splitext(path)
    for i, plan in enumerate(plans):
        target = path if len(plans) == 1 else f"{stem}-{i + 1}{ext}"
        plan.save(target)
        print(f"hcomm train: wrote plan '{plan.name}' to {target}", flush=True)


def _init_process_group(timeout: datetime.timedelta) -> None:
    """The default group; under torchrun, on keys of this start of the job only.

    torchrun keeps its store across elastic restarts, and the keys torch and
    hcomm write (each rank's gloo address, island groups, the topology) have
    the same names in every round: a restarted rank could read a dead
    process's address from the failed round and time out connecting to it
    (seen with a plain gloo new_group under torchrun --max-restarts).  So the
    group's store gets a prefix per round.  TORCHELASTIC_RESTART_COUNT cannot
    name the round: it counts one agent's restarts, and an agent whose own
    ranks were healthy restarts them without counting.  But every round starts
    every rank once, so the number of times this RANK has started, counted in
    the store, is the same on all ranks of a round."""
    if "TORCHELASTIC_RESTART_COUNT" not in os.environ or "MASTER_ADDR" not in os.environ:
        dist.init_process_group("gloo", timeout=timeout)
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    hosts = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=hosts,
                          timeout=timeout)
    start = store.add(f"hcomm/starts/rank-{rank}", 1)
    dist.init_process_group("gloo", store=dist.PrefixStore(f"hcomm/start-{start}", store), rank=rank,
                            world_size=world, timeout=timeout)


def run(args) -> int:
    from hcomm.parallel.parallelize import make_groups
    from hcomm.train.loop import predicted_as_run, train_plan
    from hcomm.train.plans import replanner_for
    from hcomm.train.report import report

    _init_process_group(datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        groups = make_groups()
        data, train_tokens, eval_tokens = load_data(args, rank)
        _log(rank, f"data: {data.source}, {data.tokenizer} vocab {data.vocab_size}, "
                   f"{train_tokens.numel():,} training tokens")
        from hcomm.models import get_config, param_count

        from hcomm.train.plans import any_pipeline, any_zero

        check_state_fits(param_count(get_config(args.model), vocab_size=data.vocab_size), groups, rank, world,
                         zero=any_zero(args) or any_pipeline(args))
        model, config = build(args, data.vocab_size)
        n_params = sum(p.numel() for p in model.parameters())
        _log(rank, f"model: {args.model}{' (Hugging Face)' if args.hf else ''}, {n_params / 1e6:.2f}M parameters")
        view = profile_cluster(args, model, config, data.vocab_size, groups, rank, world)
        if rank == 0:
            from hcomm.parallel.profile import format_profiles

            print(format_profiles(view.profiles), flush=True)
        resumed = resumed_plan(args, rank, world)
        plans = [resumed] if resumed else plans_for(args, view, rank)
        del model   # (the profiled copy: trials and plans build their own)
        if not args.print_plan_only and not resumed:
            plans = settle_trials(args, plans, data.vocab_size, groups, train_tokens, rank)
        if args.save_plan and rank == 0:
            save_plans(plans, args.save_plan)
        if args.picture and rank == 0:
            from hcomm.train.plan_picture import draw

            draw(args.picture, plans, view.profiles[0].layers,
                 [view.island_names[view.island_of(r)] for r in range(view.world_size)] if view.island_names else ())
            print(f"hcomm train: wrote {args.picture} (which device does what in each plan)", flush=True)
        if args.print_plan_only:
            for plan in plans:
                _log(rank, f"plan '{plan.name}':\n{plan}")
            return 0
        results = []
        for plan in plans:
            _log(rank, f"plan '{plan.name}':\n{plan}")
            model, _ = build(args, data.vocab_size)
            results.append(train_plan(args, plan, model, groups, train_tokens, eval_tokens, rank, world,
                                      replanner=replanner_for(args, view, plan)))
            results[-1].predicted_as_run_s = predicted_as_run(plan, results[-1], view, args.warmup_steps)
            del model
            release_memory()   # a small-memory rank needs the plan's memory back for the next (release.py)
        if rank == 0:
            report(args, plans, results, view, data, n_params)
        dist.barrier()
        return 0
    finally:
        dist.destroy_process_group()


def _start_up() -> None:
    """Import what the run needs, then enter the emulated device's CPU quota (a no-op elsewhere): start-up
    is host work (``rankwrap.enter_cpu_quota``), and every measurement comes after this."""
    import torch._dynamo  # noqa: F401  (the meta model's init and torch.optim's first step import it: ~1 s)

    import hcomm.parallel.parallelize  # noqa: F401
    import hcomm.train.loop  # noqa: F401
    import hcomm.train.report  # noqa: F401
    from hcomm.emulate.rankwrap import enter_cpu_quota

    enter_cpu_quota()


def main(argv: Optional[List[str]] = None) -> int:
    from hcomm.train.cli import parse

    args = parse(list(sys.argv[1:] if argv is None else argv))
    _start_up()
    try:
        return run(args)
    except ValueError as e:  # bad input: one line per rank, no traceback
        print(f"hcomm train: error: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        from hcomm.emulate.rankwrap import leave_cpu_quota

        leave_cpu_quota()


if __name__ == "__main__":
    sys.exit(main())

"""Checks for :mod:`hcomm.parallel.plan`: field types when a plan is read from a
dict (YAML), and the rules a plan must satisfy before any dimension reads it.

Every message starts with the field path (``ranks[2].batch_share``,
``groups[0].bucket_bytes``) so a person editing a YAML file finds the line.
No torch here: a plan is checked on machines and in tools that have none.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from collections import Counter
from typing import Any, Dict, List, Optional

COMPUTE_DTYPES = ("fp32", "bf16", "fp16", "fp8")
BACKENDS = ("hcomm", "ddp-gloo", "fsdp2-gloo")
ZERO_LAYOUTS = ("flat", "island")
# The wire formats hcomm.compress.parse accepts (its WIRE_DTYPES keys, kept in
# step by a test); repeated here because hcomm.compress imports torch.
WIRE_FORMATS = ("none", "fp32", "bf16", "fp16", "fp8e4m3", "fp8e5m2")
MIN_BUCKET_BYTES = 1024


class PlanError(ValueError):
    """A plan that cannot run; the message names the field path and the rank."""


# --- reading a dict into dataclasses -------------------------------------------------

def build(cls: type, data: Any, where: str) -> Any:
    """``cls(**data)`` with unknown keys, missing keys and wrong types reported by path."""
    if not isinstance(data, dict):
        raise PlanError(f"{where}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            raise PlanError(f"{_join(where, key)}: unknown key (known: {', '.join(fields)})")
    kwargs = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = convert(data[name], hints[name], _join(where, name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise PlanError(f"{where or 'plan'}: missing required key {name!r}")
    return cls(**kwargs)


def convert(value: Any, hint: Any, where: str) -> Any:
    """``value`` as type ``hint`` (int, float, str, Optional, List, Tuple, dataclass)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:  # Optional[X]
        if value is None:
            return None
        return convert(value, next(a for a in args if a is not type(None)), where)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise PlanError(f"{where}: expected a list, got {value!r}")
        if origin is tuple:
            if len(value) != len(args):
                raise PlanError(f"{where}: expected {len(args)} items, got {value!r}")
            return tuple(convert(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
        return [convert(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(hint):
        return build(hint, value, where)
    if hint is float:
        # PyYAML reads "1e-3" (no dot) as a string; accept what float() reads.
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is str:
        if isinstance(value, str):
            return value
    elif hint is bool:
        if isinstance(value, bool):
            return value
    else:
        raise TypeError(f"plan field type {hint!r} has no converter")  # a new field needs one
    raise PlanError(f"{where}: expected {hint.__name__}, got {value!r}")


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


# --- the rules ----------------------------------------------------------------------

def check_plan(plan: Any, world_size: Optional[int]) -> None:
    """Raises :class:`PlanError` for the first rule ``plan`` breaks."""
    _check_top(plan)
    _check_rank_numbering(plan.ranks, world_size)
    _check_shares(plan)
    for i, r in enumerate(plan.ranks):
        _check_rank(r, f"ranks[{i}]")
    _check_groups(plan.groups, len(plan.ranks))
    _check_zero(plan)
    _check_pipeline(plan)
    _check_tensor(plan)
    _check_sequence_parallel_groups(plan)
    _check_precision(plan)
    _check_stragglers(plan)


def _check_stragglers(plan: Any) -> None:
    """Re-planning on drift re-splits the rows of hcomm's data parallelism (plain, ZeRO, across TP
    groups: no state moves), or re-cuts a pipeline's layers -- of ranks or of TP groups -- and moves
    their state (``pipeline.restage``); torch's baselines have neither.  Outer sync is refused in
    ``_check_group`` (its island weights hold between outer steps)."""
    watched = [g.name for g in plan.groups if g.straggler_margin]
    if watched and plan.backend != "hcomm":
        raise PlanError(f"groups {watched}: straggler_margin re-splits the rows of hcomm's data parallelism "
                        f"(plain, ZeRO, TP groups) or re-cuts a pipeline's layers, not with backend {plan.backend}")


def _check_top(plan: Any) -> None:
    if plan.backend not in BACKENDS:
        raise PlanError(f"backend: must be one of {', '.join(BACKENDS)}, got {plan.backend!r}")
    if plan.global_batch < 1:
        raise PlanError(f"global_batch: must be >= 1, got {plan.global_batch}")
    if plan.seq_len < 1:
        raise PlanError(f"seq_len: must be >= 1, got {plan.seq_len}")
    if plan.predicted_step_s is not None and not (math.isfinite(plan.predicted_step_s)
                                                  and plan.predicted_step_s >= 0):
        raise PlanError(f"predicted_step_s: must be a finite number >= 0 or None, got {plan.predicted_step_s}")


def _check_rank_numbering(ranks: List[Any], world_size: Optional[int]) -> None:
    n = len(ranks)
    if n == 0:
        raise PlanError("ranks: the plan has no ranks")
    numbers = [r.rank for r in ranks]
    missing = sorted(set(range(n)) - set(numbers))
    seen = Counter(numbers)   # (list.count per rank was quadratic: plans of thousands of ranks)
    duplicates = sorted(x for x, k in seen.items() if k > 1)
    extra = sorted({x for x in numbers if not 0 <= x < n})
    if missing or duplicates or extra:
        problems = [f"{label} {', '.join(map(str, xs))}" for label, xs in
                    (("missing", missing), ("duplicated", duplicates), ("out of range", extra)) if xs]
        raise PlanError(f"ranks: must be numbered 0..{n - 1} once each; {'; '.join(problems)}")
    for i, x in enumerate(numbers):
        if x != i:  # consumers index plan.ranks[rank]
            raise PlanError(f"ranks[{i}].rank: is {x}; list the ranks in order 0..{n - 1}")
    if world_size is not None and world_size != n:
        raise PlanError(f"plan has {n} ranks, the job has {world_size}")


def _check_shares(plan: Any) -> None:
    shares = [r.batch_share for r in plan.ranks]
    for i, s in enumerate(shares):
        if not math.isfinite(s):
            raise PlanError(f"ranks[{i}].batch_share: must be finite, got {s}")
        if s < 0:
            raise PlanError(f"ranks[{i}].batch_share: must be >= 0, got {s}")
    total = sum(shares)
    if abs(total - 1.0) > 1e-6:
        listed = ", ".join(f"{s:g}" for s in shares)
        raise PlanError(f"batch shares sum to {total:.9g} (ranks 0..{len(shares) - 1}: {listed}); "
                        f"they must sum to 1")
    working = [i for i, s in enumerate(shares) if s > 0]
    if plan.global_batch < len(working):
        raise PlanError(f"global_batch {plan.global_batch} is smaller than the {len(working)} ranks with a "
                        f"non-zero share (ranks {', '.join(map(str, working))})")
    counts = plan.batch_counts()
    for i in working:
        if counts[i] == 0:
            raise PlanError(f"ranks[{i}].batch_share: {shares[i]:g} of global_batch {plan.global_batch} rounds "
                            f"to 0 samples; a rank with a non-zero share needs at least 1 (a share of 0 "
                            f"makes it reduction-only)")


def _check_rank(r: Any, where: str) -> None:
    if r.compute_dtype not in COMPUTE_DTYPES:
        raise PlanError(f"{where}.compute_dtype: must be one of {', '.join(COMPUTE_DTYPES)}, "
                        f"got {r.compute_dtype!r}")
    if r.micro_batch < 0:
        raise PlanError(f"{where}.micro_batch: must be >= 0 (0 = all samples at once), got {r.micro_batch}")
    if r.stage < 0:
        raise PlanError(f"{where}.stage: must be >= 0, got {r.stage}")
    if r.layers is not None:
        if len(r.layers) != 2 or not 0 <= r.layers[0] < r.layers[1]:
            raise PlanError(f"{where}.layers: must be a half-open pair [start, end) with 0 <= start < end, "
                            f"got {tuple(r.layers)}")
    if r.tp_group < 0:
        raise PlanError(f"{where}.tp_group: must be >= 0, got {r.tp_group}")
    if not 0 < r.tp_fraction <= 1:   # a rank of a TP group holds a shard
        raise PlanError(f"{where}.tp_fraction: must be in (0, 1], got {r.tp_fraction}")
    if r.zero_stage not in (0, 1, 2, 3):
        raise PlanError(f"{where}.zero_stage: must be 0, 1, 2 or 3, got {r.zero_stage}")
    if r.shard_fraction is not None and not 0 <= r.shard_fraction <= 1:
        raise PlanError(f"{where}.shard_fraction: must be in [0, 1] or None, got {r.shard_fraction}")


def _check_groups(groups: List[Any], n_ranks: int) -> None:
    seen: Dict[str, int] = {}
    for i, g in enumerate(groups):
        where = f"groups[{i}]"
        if not g.name:
            raise PlanError(f"{where}.name: must not be empty")
        if g.name in seen:
            raise PlanError(f"{where}.name: duplicate group name {g.name!r} (also groups[{seen[g.name]}])")
        seen[g.name] = i
        _check_group(g, where, n_ranks)
    if "dp" not in seen:
        names = ", ".join(repr(g.name) for g in groups) or "none"
        raise PlanError(f"groups: a group named 'dp' is required (groups: {names})")
    uncovered = sorted(set(range(n_ranks)) - set(groups[seen["dp"]].ranks))
    if uncovered:
        raise PlanError(f"groups[{seen['dp']}].ranks: the 'dp' group must cover every rank; "
                        f"missing {', '.join(map(str, uncovered))}")


def _check_group(g: Any, where: str, n_ranks: int) -> None:
    if not g.ranks:
        raise PlanError(f"{where}.ranks: must not be empty")
    if len(set(g.ranks)) != len(g.ranks) or min(g.ranks) < 0 or max(g.ranks) >= n_ranks:
        listed = Counter(g.ranks)   # (only to name the first bad rank: plans of 4,096 ranks have ~5,000 groups)
        for r in g.ranks:
            if not 0 <= r < n_ranks:
                raise PlanError(f"{where}.ranks: rank {r} does not exist (the plan has ranks 0..{n_ranks - 1})")
            if listed[r] > 1:
                raise PlanError(f"{where}.ranks: rank {r} is listed {listed[r]} times")
    if g.bucket_bytes < MIN_BUCKET_BYTES:
        raise PlanError(f"{where}.bucket_bytes: must be >= {MIN_BUCKET_BYTES} (1 KiB), got {g.bucket_bytes}")
    check_compression(g.compression, f"{where}.compression")
    if g.sync_every < 1:
        raise PlanError(f"{where}.sync_every: must be >= 1, got {g.sync_every}")
    if g.rebalance_after < 0:
        raise PlanError(f"{where}.rebalance_after: must be >= 0 (0 = never), got {g.rebalance_after}")
    if not (math.isfinite(g.straggler_margin) and g.straggler_margin >= 0):
        raise PlanError(f"{where}.straggler_margin: must be >= 0 (0 = never re-plan), got {g.straggler_margin}")
    if g.straggler_patience < 1:
        raise PlanError(f"{where}.straggler_patience: must be >= 1, got {g.straggler_patience}")
    for key in ("rebalance_after", "straggler_margin"):
        if getattr(g, key) and g.sync_every > 1:
            raise PlanError(f"{where}.{key}: re-splitting the batch is not supported with sync_every "
                            f"{g.sync_every} (island weights would change between outer steps)")
    if not (math.isfinite(g.outer_lr) and g.outer_lr > 0):
        raise PlanError(f"{where}.outer_lr: must be > 0, got {g.outer_lr}")
    if not 0 <= g.outer_momentum < 1:
        raise PlanError(f"{where}.outer_momentum: must be in [0, 1), got {g.outer_momentum}")
    if g.micro_batches < 1:
        raise PlanError(f"{where}.micro_batches: must be >= 1, got {g.micro_batches}")
    if g.zero_layout not in ZERO_LAYOUTS:
        raise PlanError(f"{where}.zero_layout: must be one of {', '.join(ZERO_LAYOUTS)}, got {g.zero_layout!r}")
    if g.prefetch < 0:
        raise PlanError(f"{where}.prefetch: must be >= 0 (0 = gather on demand), got {g.prefetch}")
    if g.virtual_stages < 1:
        raise PlanError(f"{where}.virtual_stages: must be >= 1, got {g.virtual_stages}")


def _check_zero(plan: Any) -> None:
    """One ZeRO stage for the whole job; shard fractions all given or all even, covering every element."""
    stages = sorted({r.zero_stage for r in plan.ranks})
    if len(stages) > 1:
        by = ", ".join(f"rank {r.rank}: {r.zero_stage}" for r in plan.ranks)
        raise PlanError(f"zero_stage: every rank must use the same ZeRO stage ({by})")
    given = [r.shard_fraction is not None for r in plan.ranks]
    if stages[0] == 0:
        if plan.backend == "fsdp2-gloo":
            raise PlanError("backend 'fsdp2-gloo' shards: give every rank zero_stage 2 or 3")
        if any(given):
            raise PlanError(f"ranks[{given.index(True)}].shard_fraction: set, but zero_stage is 0 (nothing is sharded)")
        return
    torch_stages = {"ddp-gloo": (1,), "fsdp2-gloo": (2, 3)}   # the torch baselines (zero/baseline.py)
    if plan.backend in torch_stages:
        if stages[0] not in torch_stages[plan.backend]:
            raise PlanError(f"backend {plan.backend!r} runs ZeRO stage {torch_stages[plan.backend]}, not "
                            f"{stages[0]} (ddp-gloo: ZeroRedundancyOptimizer; fsdp2-gloo: FSDP2)")
        if any(given):
            raise PlanError(f"backend {plan.backend!r} shards evenly; shard_fraction is hcomm's")
    dp = next((g for g in plan.groups if g.name == "dp"), None)
    if dp is not None and dp.sync_every > 1:
        raise PlanError(f"zero_stage {stages[0]}: ZeRO shards one optimizer over every rank; it cannot be combined "
                        f"with sync_every {dp.sync_every} (islands stepping on their own)")
    if any(given) and not all(given):
        raise PlanError(f"ranks[{given.index(False)}].shard_fraction: missing; give every rank a shard_fraction "
                        f"or none (even shards)")
    if all(given) and (dp is None or dp.zero_layout == "flat"):
        total = sum(r.shard_fraction for r in plan.ranks)
        if abs(total - 1.0) > 1e-6:
            listed = ", ".join(f"{r.shard_fraction:g}" for r in plan.ranks)
            raise PlanError(f"shard fractions sum to {total:.9g} ({listed}); they must sum to 1 so that every "
                            f"element of every sharded tensor has exactly one owner")


def check_compression(text: str, where: str) -> None:
    """The grammar of ``hcomm.compress.parse``: a wire format, optionally ``:ef``."""
    name, _, suffix = text.strip().lower().partition(":")
    if name not in WIRE_FORMATS:
        raise PlanError(f"{where}: unknown wire format {name!r} in {text!r}; expected one of "
                        f"{', '.join(w for w in WIRE_FORMATS if w != 'fp32')}, optionally with ':ef'")
    if suffix not in ("", "ef"):
        raise PlanError(f"{where}: unknown suffix {suffix!r} in {text!r}; only ':ef' is defined")
    if suffix and name in ("none", "fp32"):
        raise PlanError(f"{where}: error feedback ({text!r}) needs a compressed wire format, not {name!r}")


def _each_rank_once(plan: Any, groups: List[Any], kind: str, none: str) -> None:
    """Every rank in exactly one of ``groups`` (pairs of index and group)."""
    owner: Dict[int, str] = {}
    for i, g in groups:
        for r in g.ranks:
            if r in owner:
                raise PlanError(f"groups[{i}].ranks: rank {r} is in {kind} {owner[r]!r} too; each rank is in one")
            owner[r] = g.name
    lacking = sorted(set(range(len(plan.ranks))) - set(owner))
    if lacking:
        raise PlanError(f"groups: ranks {', '.join(map(str, lacking))} are in no {none}")


def _check_pipeline(plan: Any) -> None:
    """Pipeline replicas ("pp:*" groups): same depth and stage cuts, every rank in one, stage = position,
    the batch rows given to each replica's first rank, a schedule that can run its micro-batches."""
    from hcomm.parallel.pipeline.schedule_cost import check_schedule

    pipes = [(i, g) for i, g in enumerate(plan.groups) if g.name.startswith("pp:")]
    if not pipes:
        for i, r in enumerate(plan.ranks):
            if r.stage != 0 or r.layers is not None:
                raise PlanError(f"ranks[{i}]: stage {r.stage} / layers {r.layers} set, but the plan has no "
                                f"pipeline ('pp:*') groups")
        return
    _each_rank_once(plan, pipes, "pipeline", "pipeline ('pp:*') group; with pipelining every rank holds a stage")
    if plan.backend != "hcomm" or plan.ranks[0].zero_stage or plan.dp_group().sync_every > 1:
        raise PlanError("pipeline groups run on backend 'hcomm' with zero_stage 0 and sync_every 1 "
                        f"(got backend {plan.backend!r}, zero_stage {plan.ranks[0].zero_stage}, "
                        f"sync_every {plan.dp_group().sync_every})")
    first_i, first = pipes[0]
    counts = plan.batch_counts()
    leaders = plan.rows_leaders()
    for i, g in pipes:
        where = f"groups[{i}]"
        if (len(g.ranks), g.cuts, g.virtual_stages) != (len(first.ranks), first.cuts, first.virtual_stages):
            raise PlanError(f"{where}: pipeline {g.name!r} has {len(g.ranks)} ranks, cuts {g.cuts}, virtual_stages "
                            f"{g.virtual_stages}; {first.name!r} has {len(first.ranks)}, {first.cuts}, "
                            f"{first.virtual_stages}: replicas of a stage must hold the same pieces")
        stages = len(g.ranks) * g.virtual_stages
        if len(g.cuts) != stages + 1 or g.cuts[0] != 0 or any(a >= b for a, b in zip(g.cuts, g.cuts[1:])):
            raise PlanError(f"{where}.cuts: {len(g.ranks)} ranks x {g.virtual_stages} virtual stages need "
                            f"{stages + 1} rising cuts from 0 (first piece of each stage, then the piece count), "
                            f"got {g.cuts}")
        try:
            check_schedule(g.schedule, g.micro_batches, len(g.ranks), g.virtual_stages)
        except ValueError as e:
            raise PlanError(f"{where} ({g.name}): {e}") from None
        for pos, r in enumerate(g.ranks):
            rp = plan.ranks[r]
            if rp.stage != pos:
                raise PlanError(f"ranks[{r}].stage: is {rp.stage}, but rank {r} is at position {pos} of {g.name!r}")
            if rp.layers is not None and (g.virtual_stages != 1 or tuple(rp.layers) != tuple(g.cuts[pos:pos + 2])):
                raise PlanError(f"ranks[{r}].layers: {tuple(rp.layers)} disagrees with {g.name!r} cuts {g.cuts} "
                                f"(stage {pos} holds pieces [{g.cuts[pos]}, {g.cuts[pos + 1]}))"
                                if g.virtual_stages == 1 else f"ranks[{r}].layers: leave it out with "
                                f"virtual_stages {g.virtual_stages} (the cuts say which pieces)")
            if pos and rp.batch_share:
                raise PlanError(f"ranks[{r}].batch_share: {rp.batch_share:g}, but only a pipeline's first rank "
                                f"(rank {g.ranks[0]} of {g.name!r}) takes a share: it is the replica's rows")
        rows = counts[leaders[g.ranks[0]]]
        if rows % g.micro_batches:
            raise PlanError(f"{where}.micro_batches: {g.name!r} gets {rows} rows per step, which do not split "
                            f"into {g.micro_batches} equal micro-batches")
    if all(counts[leaders[g.ranks[0]]] == 0 for _, g in pipes):
        raise PlanError(f"groups[{first_i}]: no pipeline gets rows" + (" (the only pipeline gets none)"
                                                                        if len(pipes) == 1 else ""))


def _check_precision(plan: Any) -> None:
    """Compute dtypes the rank's device kind has; low precision only on hcomm's plain data parallelism."""
    from hcomm.parallel.devices import DEVICE_KINDS

    for i, r in enumerate(plan.ranks):
        kind = DEVICE_KINDS.get(r.device.strip().upper()) if r.device else None
        if kind is not None and r.compute_dtype not in kind.dtypes:
            raise PlanError(f"ranks[{i}].compute_dtype: {kind.name} cannot compute in {r.compute_dtype} "
                            f"({kind.notes}); it supports {', '.join(kind.dtypes)}")
    low = [i for i, r in enumerate(plan.ranks) if r.compute_dtype != "fp32"]
    if not low:
        return
    fp8 = [i for i in low if plan.ranks[i].compute_dtype == "fp8"]
    if fp8 and (plan.pipeline_groups() or plan.tensor_groups()):
        # every rank must learn this before the first collective, not only the fp8 rank: pipeline stages
        # autocast on their own and the TP layers do their own matmuls, neither routed through fp8 yet
        raise PlanError(f"ranks[{fp8[0]}].compute_dtype: fp8 runs on plain data parallelism for now "
                        f"(not with pipeline or tensor parallelism); use bf16")
    if plan.backend != "hcomm" or plan.ranks[0].zero_stage or any(g.sync_every > 1 for g in plan.groups):
        raise PlanError(f"ranks[{low[0]}].compute_dtype: {plan.ranks[low[0]].compute_dtype} runs on hcomm's "
                        f"synchronous data parallelism and pipelines for now (not with ZeRO, sync_every or a torch "
                        f"backend)")


def _check_tensor(plan: Any) -> None:
    """Tensor-parallel groups ("tp:<i>"): every rank in one, tp_group = i, fractions > 0 summing to 1 and the
    same at each position in every group (ranks at one position all-reduce the same shard), the rows given
    to each group's first rank."""
    groups = [(i, g) for i, g in enumerate(plan.groups) if g.name.startswith("tp:")]
    if not groups:
        for i, r in enumerate(plan.ranks):
            if r.tp_group != 0 or r.tp_fraction != 1.0:
                raise PlanError(f"ranks[{i}]: tp_group {r.tp_group} / tp_fraction {r.tp_fraction:g} set, but the plan "
                                f"has no tensor-parallel ('tp:*') groups")
        return
    _each_rank_once(plan, groups, "TP group", "tensor-parallel ('tp:*') group")
    if plan.backend != "hcomm" or plan.ranks[0].zero_stage or plan.dp_group().sync_every > 1:
        raise PlanError("tensor-parallel groups run on backend 'hcomm' without ZeRO or sync_every > 1")
    # Ranks at one position of the TP groups that are replicas of each other all-reduce the same shard:
    # every group without pipelines, the groups of one stage with them (stages may split differently).
    stage_of = {g.name: plan.ranks[g.ranks[0]].stage for _, g in groups}
    firsts = {}
    for i, g in groups:
        index = g.name.split(":", 1)[1]
        fractions = [plan.ranks[r].tp_fraction for r in g.ranks]
        for pos, r in enumerate(g.ranks):
            rp = plan.ranks[r]
            if str(rp.tp_group) != index:
                raise PlanError(f"ranks[{r}].tp_group: is {rp.tp_group}, but rank {r} is in {g.name!r}")
            if pos and rp.batch_share:
                raise PlanError(f"ranks[{r}].batch_share: {rp.batch_share:g}, but only a TP group's first rank "
                                f"(rank {g.ranks[0]} of {g.name!r}) takes a share: it is the group's rows")
        if g.sequence_parallel != groups[0][1].sequence_parallel:
            raise PlanError(f"groups[{i}] ({g.name}): sequence_parallel differs from {groups[0][1].name!r}'s")
        if abs(sum(fractions) - 1.0) > 1e-6:
            raise PlanError(f"groups[{i}] ({g.name}): the ranks' tp_fraction {fractions} sum to {sum(fractions):.9g}, "
                            f"not 1")
        first_name, first = firsts.setdefault(stage_of[g.name], (g.name, fractions))
        if fractions != first:
            raise PlanError(f"groups[{i}] ({g.name}): tp_fraction {fractions} differ from those of {first_name!r} "
                            f"{first}: ranks at one position of every TP group" +
                            (" of a stage" if plan.pipeline_groups() else "") + " hold the same shard")
    if plan.pipeline_groups():
        _check_pipeline_tensor(plan, groups)


def _check_pipeline_tensor(plan: Any, groups: List[Any]) -> None:
    """Pipelines of TP groups: a TP group is one stage of one replica, and pipeline k of a replica links
    the ranks at TP position k of its stages (they pass each other whole activations)."""
    for i, g in groups:
        stages = {plan.ranks[r].stage for r in g.ranks}
        if len(stages) != 1:
            raise PlanError(f"groups[{i}] ({g.name}): ranks {g.ranks} sit at pipeline positions {sorted(stages)}; "
                            f"a TP group is one stage (all its ranks at one position)")
        if g.sequence_parallel:
            raise PlanError(f"groups[{i}] ({g.name}): sequence parallelism does not run with pipelines (stage "
                            f"boundaries carry whole sequences)")
    along = {}
    tp_of = {r: g for _, g in groups for r in g.ranks}
    for j, p in enumerate(plan.pipeline_groups()):
        tps = [tp_of[r] for r in p.ranks]
        positions = {t.ranks.index(r) for t, r in zip(tps, p.ranks)}
        if len(positions) != 1 or len({len(t.ranks) for t in tps}) != 1:
            raise PlanError(f"pipeline {p.name!r}: its ranks {p.ranks} hold TP positions "
                            f"{[t.ranks.index(r) for t, r in zip(tps, p.ranks)]} in groups of sizes "
                            f"{[len(t.ranks) for t in tps]}; a pipeline links one TP position of equal groups")
        key = tuple(t.name for t in tps)
        along.setdefault(key, []).append(p)
    for key, pipes in along.items():
        if len({(p.micro_batches, p.schedule) for p in pipes}) != 1:
            raise PlanError(f"pipelines {[p.name for p in pipes]} run the same TP groups {list(key)} but differ in "
                            f"micro_batches / schedule; they run one replica together")


def _check_sequence_parallel_groups(plan: Any) -> None:
    for i, g in enumerate(plan.groups):
        if g.sequence_parallel and not g.name.startswith("tp:"):
            raise PlanError(f"groups[{i}].sequence_parallel: only tensor-parallel ('tp:*') groups split the "
                            f"sequence, not {g.name!r}")

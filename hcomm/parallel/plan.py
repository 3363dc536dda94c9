"""The plan: every parallel decision for one training job, in one object.

The planner writes a :class:`Plan`, every dimension reads only its own part
(data parallelism: batch shares and the ``dp`` group; ZeRO: ``zero_stage`` and
``shard_fraction``; pipeline: ``stage``/``layers`` and the group's
``micro_batches``/``schedule``; ...), a person can write one by hand in YAML,
and ``hcomm plan`` prints it with ``str(plan)``.

A hand-written plan can be as short as::

    global_batch: 64
    seq_len: 512
    shares: [0.5, 0.3, 0.2]      # instead of a ranks: list
    # groups: left out = one "dp" group of every rank

Fields at their defaults may be left out (``to_yaml`` leaves them out too).
No torch here: plans are read and checked by tools that have none.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

from hcomm.parallel.plan_check import PlanError, build, check_plan

__all__ = ["Plan", "RankPlan", "GroupPlan", "PlanError", "apportion"]

DEFAULT_BUCKET_BYTES = 25 * 2**20  # torch DDP's bucket_cap_mb default


@dataclass
class RankPlan:
    """What one rank does.  Later-dimension fields default to "not used"."""

    rank: int
    batch_share: float  # fraction of the global batch; 0 = takes part in reduction only
    device: str = ""  # device kind label, e.g. "A100" (informational)
    island: str = ""  # informational: islands are the topology's business
    compute_dtype: str = "fp32"  # fp32, bf16, fp16 or fp8
    micro_batch: int = 0  # most samples per forward pass (memory); 0 = all of the rank's samples at once
    stage: int = 0  # pipeline position in its "pp:*" group (= its stage with one stage per rank)
    layers: Optional[Tuple[int, int]] = None  # half-open piece range of its stage (one stage per rank); None = all
    tp_group: int = 0
    tp_fraction: float = 1.0  # this rank's fraction of each tensor-parallel split
    zero_stage: int = 0  # 0..3
    shard_fraction: Optional[float] = None  # fraction of each sharded tensor in its ZeRO group; None = even


@dataclass
class GroupPlan:
    """How a group of ranks communicates."""

    name: str  # "dp", "island:a", ...
    ranks: List[int]
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    compression: str = "none"  # weak-tier wire format, as HCOMM_COMPRESS: e.g. "bf16", "fp8e4m3:ef"
    sync_every: int = 1  # cross-island sync period H; 1 = fully synchronous
    outer_lr: float = 0.7  # DiLoCo outer Nesterov step
    outer_momentum: float = 0.9
    outer_overlap: bool = False  # the outer all-reduce runs behind the next H inner steps (applied one period late)
    rebalance_after: int = 0  # re-split the batch by compute measured in the first N steps (0 = never)
    straggler_margin: float = 0.0  # re-split when a rank's s/sample drifts this far from its baseline (0 = never)
    straggler_patience: int = 3  # ... for this many steps in a row (hcomm/parallel/straggler.py)
    # Pipeline (read only from "pp:*" groups, one per pipeline replica, ranks in pipeline order)
    micro_batches: int = 1
    schedule: str = "1f1b"  # gpipe, 1f1b or interleaved-1f1b (hcomm/parallel/pipeline/schedule_cost.py)
    virtual_stages: int = 1  # stages per rank (interleaved-1f1b: >= 2)
    cuts: List[int] = field(default_factory=list)  # first piece of every stage, then the piece count
    # Tensor parallelism (read only from "tp:*" groups)
    sequence_parallel: bool = False  # norms and residuals hold only this rank's slice of the sequence
    # ZeRO (read only when the ranks' zero_stage > 0)
    zero_layout: str = "flat"  # "flat": shard over every rank; "island": shard inside islands, replicate across (HSDP)
    prefetch: int = 1  # ZeRO-3: gathers issued this many units ahead, forward and backward (0 = on demand)
    reshard_after_forward: bool = True  # ZeRO-3: free gathered units after forward (False: keep them for backward)


@dataclass
class Plan:
    """Every parallel decision of one job.  ``validate()`` before use."""

    global_batch: int  # samples per optimizer step, all ranks together
    seq_len: int
    ranks: List[RankPlan]
    groups: List[GroupPlan]
    name: str = ""  # "auto", "uniform", ...
    backend: str = "hcomm"  # "hcomm", or "ddp-gloo" for the torch baseline
    predicted_step_s: Optional[float] = None
    notes: List[str] = field(default_factory=list)  # why the planner chose it, what it beat

    # --- constructors ------------------------------------------------------------

    @classmethod
    def uniform(cls, world_size: int, global_batch: int, seq_len: int, **group_kwargs: Any) -> "Plan":
        """Equal shares on ``world_size`` ranks: the homogeneous baseline."""
        return cls.from_shares([1.0 / max(world_size, 1)] * world_size, global_batch, seq_len, name="uniform",
                               **group_kwargs)

    @classmethod
    def from_shares(cls, shares: Sequence[float], global_batch: int, seq_len: int, name: str = "",
                    **group_kwargs: Any) -> "Plan":
        """Data parallelism with these batch shares and one ``dp`` group of every rank."""
        ranks = [RankPlan(i, float(s)) for i, s in enumerate(shares)]
        groups = [GroupPlan("dp", list(range(len(ranks))), **group_kwargs)]
        return cls(global_batch, seq_len, ranks, groups, name=name).validate()

    # --- derived -----------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def shares(self) -> List[float]:
        return [r.batch_share for r in self.ranks]

    def batch_counts(self) -> List[int]:
        """Samples per rank per step: proportional to the shares, summing to ``global_batch``."""
        return apportion(self.shares(), self.global_batch)

    def samples_computed(self) -> List[int]:
        """Samples each rank computes per step: every rank of a pipeline or TP replica runs the rows its
        replica's first rank holds the share of (the others hold share 0)."""
        counts = self.batch_counts()
        for g in self.pipeline_groups() + self.tensor_groups():
            counts = [counts[g.ranks[0]] if r in g.ranks else n for r, n in enumerate(counts)]
        return counts

    def batch_offsets(self) -> List[int]:
        """Where each rank's samples start in the global batch (exclusive prefix sums)."""
        offsets, start = [], 0
        for n in self.batch_counts():
            offsets.append(start)
            start += n
        return offsets

    def group(self, name: str) -> GroupPlan:
        for g in self.groups:
            if g.name == name:
                return g
        known = ", ".join(repr(g.name) for g in self.groups) or "none"
        raise PlanError(f"groups: no group named {name!r} (the plan has: {known})")

    def dp_group(self) -> GroupPlan:
        return self.group("dp")

    def pipeline_groups(self) -> List[GroupPlan]:
        """The pipeline replicas ("pp:*" groups, ranks in pipeline order); empty without pipelining."""
        return [g for g in self.groups if g.name.startswith("pp:")]

    def pipeline_of(self, rank: int) -> Optional[GroupPlan]:
        return next((g for g in self.pipeline_groups() if rank in g.ranks), None)

    def tensor_groups(self) -> List[GroupPlan]:
        """The tensor-parallel groups ("tp:<i>", ranks in shard order); empty without TP."""
        return [g for g in self.groups if g.name.startswith("tp:")]

    def tensor_group_of(self, rank: int) -> Optional[GroupPlan]:
        return next((g for g in self.tensor_groups() if rank in g.ranks), None)

    def rows_leader(self, rank: int) -> int:
        """The rank whose batch share is ``rank``'s rows: the first rank of its pipeline, of that rank's TP
        group (with both: stage 0's TP position 0 of its replica), or itself."""
        return self.rows_leaders()[rank]

    def rows_leaders(self) -> List[int]:
        """``rows_leader`` of every rank, in one pass over the groups (plans of thousands of ranks)."""
        first_of_pipe = {r: g.ranks[0] for g in self.pipeline_groups() for r in g.ranks}
        first_of_tp = {r: g.ranks[0] for g in self.tensor_groups() for r in g.ranks}
        out = []
        for rank in range(len(self.ranks)):
            first = first_of_pipe.get(rank, rank)
            out.append(first_of_tp.get(first, first))
        return out

    def validate(self, world_size: Optional[int] = None) -> "Plan":
        """Raises :class:`PlanError` naming the field and rank of the first problem; returns self."""
        check_plan(self, world_size)
        return self

    # --- dict / YAML ---------------------------------------------------------------

    def to_dict(self) -> Dict[str, Any]:
        """Plain data in reading order; fields at their defaults are left out."""
        d = _fields_dict(self, required=("global_batch", "seq_len"))
        d["ranks"] = [_fields_dict(r, required=("rank", "batch_share")) for r in self.ranks]
        d["groups"] = [_fields_dict(g, required=("name", "ranks")) for g in self.groups]
        order = ("name", "backend", "global_batch", "seq_len", "predicted_step_s", "ranks", "groups", "notes")
        return {k: d[k] for k in order if k in d}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Plan":
        """The inverse of :meth:`to_dict`, validated.

        Also reads ``shares: [...]`` in place of ``ranks:``, and a missing
        ``groups:`` as one ``dp`` group of every rank.
        """
        if not isinstance(d, dict):
            raise PlanError(f"plan: expected a mapping, got {d!r}")
        d = dict(d)
        if "shares" in d:
            if "ranks" in d:
                raise PlanError("shares: give either shares or ranks, not both")
            shares = d.pop("shares")
            if not isinstance(shares, list):
                raise PlanError(f"shares: expected a list, got {shares!r}")
            d["ranks"] = [{"rank": i, "batch_share": s} for i, s in enumerate(shares)]
        if "groups" not in d and isinstance(d.get("ranks"), list):
            d["groups"] = [{"name": "dp", "ranks": list(range(len(d["ranks"])))}]
        return build(cls, d, "").validate()

    def to_yaml(self) -> str:
        header = (f"# hcomm parallel plan{f' {self.name!r}' if self.name else ''}: {self.world_size} ranks, "
                  f"global batch {self.global_batch} x seq {self.seq_len}\n"
                  f"# fields left out take their defaults (hcomm/parallel/plan.py)\n")
        return header + yaml.dump(self.to_dict(), Dumper=_Dumper, sort_keys=False, width=100)

    @classmethod
    def from_yaml(cls, text: str) -> "Plan":
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise PlanError(f"plan: not valid YAML: {e}") from None
        return cls.from_dict(data)

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            f.write(self.to_yaml())

    @classmethod
    def load(cls, path: str) -> "Plan":
        try:
            with open(path) as f:
                text = f.read()
        except OSError as e:
            raise PlanError(f"plan file {path}: cannot read it ({e.strerror or e})") from None
        try:
            return cls.from_yaml(text)
        except PlanError as e:
            raise PlanError(f"plan file {path}: {e}") from None

    # --- printing ----------------------------------------------------------------

    def __str__(self) -> str:
        head = f"plan {self.name or '(unnamed)'}: {self.world_size} ranks, global batch {self.global_batch} " \
               f"x seq {self.seq_len}, backend {self.backend}"
        if self.predicted_step_s is not None:
            head += f", predicted step {self.predicted_step_s:.4g} s"
        lines = [head, *_rank_table(self), "groups:", *_group_table(self.groups)]
        if self.notes:
            lines += ["notes:", *(f"  - {note}" for note in self.notes)]
        return "\n".join(lines)


def apportion(shares: Sequence[float], total: int) -> List[int]:
    """Integers proportional to ``shares`` summing exactly to ``total`` (largest remainder).

    Each count is the floor of its ideal ``total * share / sum(shares)``; the
    samples left over go to the largest fractional parts, ties to the lower
    rank.  A zero share always gets 0.
    """
    norm = sum(shares)
    if not norm > 0:
        raise ValueError(f"apportion: the shares {list(shares)} have no positive sum to divide {total} by")
    ideal = [total * s / norm for s in shares]
    counts = [math.floor(x) for x in ideal]
    left = total - sum(counts)
    candidates = sorted((i for i, s in enumerate(shares) if s > 0), key=lambda i: (counts[i] - ideal[i], i))
    # left < len(candidates) in exact arithmetic; cycling keeps the sum exact under float rounding too
    for k in range(left):
        counts[candidates[k % len(candidates)]] += 1
    return counts


# --- helpers -----------------------------------------------------------------------

def _fields_dict(obj: Any, required: Tuple[str, ...]) -> Dict[str, Any]:
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if f.name in required or value != default:
            out[f.name] = list(value) if isinstance(value, (list, tuple)) else value
    return out


class _Dumper(yaml.SafeDumper):
    """Lists of numbers on one line (``ranks: [0, 1, 2]``); everything else in block style."""


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    numbers = all(isinstance(x, (int, float)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=numbers)


_Dumper.add_representer(list, _represent_list)


def _rank_table(plan: Plan) -> List[str]:
    ranks, counts = plan.ranks, plan.samples_computed()
    columns = [("rank", [str(r.rank) for r in ranks]),
               ("device", [r.device or "-" for r in ranks]),
               ("island", [r.island or "-" for r in ranks]),
               ("share", [f"{r.batch_share:.4f}" for r in ranks]),
               ("samples", [str(n) for n in counts]),
               ("micro", [str(r.micro_batch) if r.micro_batch else "all" for r in ranks]),
               ("dtype", [r.compute_dtype for r in ranks]),
               ("stage", [str(r.stage) for r in ranks]),
               ("layers", ["all" if r.layers is None else f"[{r.layers[0]},{r.layers[1]})" for r in ranks]),
               ("tp", [f"{r.tp_group}:{r.tp_fraction:g}" for r in ranks]),
               ("zero", [f"{r.zero_stage}" + ("" if r.shard_fraction is None else f" ({r.shard_fraction:g})")
                         for r in ranks])]
    always = {"rank", "device", "share", "samples"}
    defaults = {"micro": "all", "island": "-", "dtype": "fp32", "stage": "0", "layers": "all", "tp": "0:1", "zero": "0"}
    return _table([(h, v) for h, v in columns if h in always or any(x != defaults[h] for x in v)])


def _group_table(groups: List[GroupPlan]) -> List[str]:
    columns = [("name", [g.name for g in groups]),
               ("ranks", [",".join(map(str, g.ranks)) if g.name.startswith(("pp:", "tp:")) else _compact_ranks(g.ranks)
                          for g in groups]),   # a pipeline's ranks in pipeline order
               ("bucket MiB", [f"{g.bucket_bytes / 2**20:g}" for g in groups]),
               ("compression", [g.compression for g in groups]),
               ("sync every", [str(g.sync_every) for g in groups])]
    if any(g.sync_every > 1 for g in groups):  # the outer optimizer only runs when syncs are spaced out
        columns.append(("outer lr/mom", [f"{g.outer_lr:g}/{g.outer_momentum:g}" + (" overlapped" if g.outer_overlap else "")
                                         for g in groups]))
    if any((g.zero_layout, g.prefetch, g.reshard_after_forward) != ("flat", 1, True) for g in groups):
        columns.append(("zero layout/prefetch", [f"{g.zero_layout}/{g.prefetch}" +
                                                 ("" if g.reshard_after_forward else " keep") for g in groups]))
    if any((g.micro_batches, g.schedule, g.virtual_stages) != (1, "1f1b", 1) for g in groups):
        columns.append(("micro x schedule", [f"{g.micro_batches} x {g.schedule}"
                                             + (f" x{g.virtual_stages}" if g.virtual_stages > 1 else "")
                                             for g in groups]))
    if any(g.sequence_parallel for g in groups):
        columns.append(("seq parallel", ["yes" if g.sequence_parallel else "-" for g in groups]))
    if any(g.cuts for g in groups):
        columns.append(("cuts", [" ".join(map(str, g.cuts)) or "-" for g in groups]))
    return _table(columns)


def _table(columns: List[Tuple[str, List[str]]]) -> List[str]:
    widths = [max([len(h), *(len(x) for x in values)]) for h, values in columns]
    rows = [[h for h, _ in columns], *zip(*(values for _, values in columns))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _compact_ranks(ranks: List[int]) -> str:
    """``[0, 1, 2, 3, 6]`` -> ``"0-3,6"``."""
    runs: List[List[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)

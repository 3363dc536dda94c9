"""Running one training step of a pipeline over a process group (usually an hcomm group).

``Pipeline(model, ranges, group, schedule=..., n_microbatches=...)`` builds
this rank's stage(s) from piece ranges (see ``stages.py``) and a schedule from
``torch.distributed.pipelining``; ``pipeline.step(rows)`` runs forward and
backward over the rows of one batch and leaves in ``.grad`` of the local stages'
parameters the gradient of the batch's mean loss.  The optimizer is the
caller's.

Schedules (``SCHEDULES``):

- ``gpipe``, ``1f1b``: torch's ``ScheduleGPipe`` / ``Schedule1F1B``; one stage
  per rank, stage ``r`` on group rank ``r``.
- ``interleaved``: torch's ``ScheduleInterleaved1F1B`` with
  ``virtual_stages`` stages per rank, stage ``s`` on group rank ``s % ranks``.
- ``custom``: an explicit per-rank order of actions, ``order[rank] =
  ["0F0", "0F1", "0B0", ...]`` (torch's ``_Action`` notation: stage, ``F`` or
  ``B``, micro-batch).  The stage-to-rank placement is read from the order, so
  a rank may hold any stages (a V shape, a fast rank holding two).  This is
  what a cost-aware scheduler emits: torch's own schedules give every stage
  the same time slots, which a mixed cluster does not have.

Custom orders run on torch's ``_PipelineScheduleRuntime`` (private; read in torch
2.13): its ``_prepare_schedule_with_comms`` lowers a compute-only order
into one with SEND/RECV actions by simulating every rank in lockstep (and
rejects an order that cannot be lowered, i.e. one that would deadlock), and its
executor already handles adjacent stages on one rank, loss bookkeeping and
the stages' metadata exchange.  Writing our own loop would duplicate all of
that; the price is a private API, so ``_lower_order`` is the one place that
touches it, and a torch upgrade that moves it fails there loudly.

Data parallelism over replicas of a stage: with ``dp_group`` (the ranks that
hold the same stages in the other pipeline replicas) each replica runs the
pipeline on its own share of the global batch (shares may differ, even be 0),
and the local stages' gradients are reduced in that group by
``hcomm.parallel.data.GradSync`` with weight ``rows / global_batch``: each
replica's loss is the mean over its own tokens, so the weighted sum is the
global-batch mean gradient.  Buckets launch during the stages' last backward
(torch passes ``last_backward``; earlier micro-batches only accumulate) and
always in bucket order, so every replica issues the same collectives in the
same order whatever its schedule's timing.

Every check that can fail (ranges, schedule, micro-batch count, custom order,
batch rows) raises ValueError naming the stage and numbers before any
communication.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from hcomm.models.llama import layer_modules
from hcomm.parallel.groups import replica_groups as make_pipeline_groups  # noqa: F401  (its old home)
from hcomm.parallel.pipeline.stages import Range, StageModule, TokenSumLoss, build_stages, check_ranges
from hcomm.parallel.tensor import comm as tp_comm

SCHEDULES = {
    "gpipe": "torch ScheduleGPipe: all forwards, then all backwards; one stage per rank",
    "1f1b": "torch Schedule1F1B: one forward, one backward in steady state; one stage per rank; micro-batches >= stages",
    "interleaved": "torch ScheduleInterleaved1F1B: virtual_stages stages per rank, stage s on rank s % ranks",
    "custom": "an explicit per-rank order of F/B actions, run by torch's _PipelineScheduleRuntime",
}

# Other modules' name for a schedule -> the name here (schedule_cost.py says "interleaved-1f1b").
ALIASES = {"interleaved-1f1b": "interleaved"}

Action = Union[str, Tuple[int, str, int], None]
Order = Union[Mapping[int, Sequence[Action]], Sequence[Sequence[Action]]]

DEFAULT_BUCKET_BYTES = 25 * 2**20


@dataclass
class PipelineStep:
    """What one ``Pipeline.step`` measured and computed on this rank."""

    loss: float = float("nan")         # this pipeline's mean loss over its rows (ranks holding the last stage)
    global_loss: float = float("nan")  # the global batch's mean loss (last-stage ranks; = loss without DP)
    compute_s: float = 0.0             # the schedule: forward, backward and the pipeline's own sends/receives
    busy_s: float = 0.0                # inside this rank's forwards and backwards only (no waiting for peers,
                                       # nor for TP partners inside their collectives)
    sync_wait_s: float = 0.0           # after the schedule until every gradient bucket is reduced (DP only)


def parse_order(order: Order, n_ranks: int) -> Dict[int, List[Tuple[int, str, int]]]:
    """``{rank: [(stage, "F" | "B", micro_batch), ...]}``; None/"" skipped.

    An action is a string in torch's notation (``"1F0"``: stage 1, forward,
    micro-batch 0), a tuple ``(stage, kind, micro_batch)``, or an object with
    ``stage``, ``kind`` and ``microbatch`` (``schedule_cost.Action``).
    """
    if isinstance(order, Mapping):
        rows = dict(order)
    else:
        rows = dict(enumerate(order))
    if sorted(rows) != list(range(n_ranks)):
        raise ValueError(f"custom order gives actions for ranks {sorted(rows)}; the group has ranks 0..{n_ranks - 1}")
    parsed = {}
    for rank in range(n_ranks):
        actions = []
        for i, a in enumerate(rows[rank]):
            if a is None or a == "":
                continue
            if isinstance(a, str):
                stage, kind, mb = _parse_action(a.strip(), rank, i)
            elif all(hasattr(a, f) for f in ("kind", "microbatch", "stage")):  # schedule_cost.Action
                stage, kind, mb = a.stage, a.kind, a.microbatch
            else:
                try:
                    stage, kind, mb = a
                except (TypeError, ValueError):
                    raise ValueError(f"custom order, rank {rank}, action {i}: expected 'sFm' or (stage, 'F'|'B', "
                                     f"micro_batch), got {a!r}") from None
            if kind not in ("F", "B") or not all(isinstance(v, int) and v >= 0 for v in (stage, mb)):
                raise ValueError(f"custom order, rank {rank}, action {i}: {a!r} is not (stage >= 0, 'F' or 'B', "
                                 f"micro-batch >= 0)")
            actions.append((stage, kind, mb))
        parsed[rank] = actions
    return parsed


def _parse_action(text: str, rank: int, i: int) -> Tuple[int, str, int]:
    m = re.fullmatch(r"(\d+)([A-Z_]+)(\d+)", text)
    if not m:
        raise ValueError(f"custom order, rank {rank}, action {i}: {text!r} is not '<stage>F<mb>' or '<stage>B<mb>'")
    if m.group(2) not in ("F", "B"):
        raise ValueError(f"custom order, rank {rank}, action {i}: {text!r}: only F (forward) and B (full backward) "
                         f"actions are supported, got {m.group(2)!r}")
    return int(m.group(1)), m.group(2), int(m.group(3))


def check_order(order: Dict[int, List[Tuple[int, str, int]]], n_stages: int) -> Tuple[int, Dict[int, int]]:
    """Micro-batch count and stage -> rank placement of a parsed custom order, or ValueError.

    Every stage runs on exactly one rank, every rank holds a stage, and each
    stage runs F then B exactly once for each of the micro-batches 0..M-1.
    Whether the order can run without deadlock is checked when it is lowered.
    """
    placement: Dict[int, int] = {}
    seen: Dict[Tuple[int, str], List[int]] = {}
    for rank, actions in order.items():
        for i, (stage, kind, mb) in enumerate(actions):
            if stage >= n_stages:
                raise ValueError(f"custom order, rank {rank}: action {stage}{kind}{mb} names stage {stage}, "
                                 f"but there are {n_stages} stages (0..{n_stages - 1})")
            if placement.setdefault(stage, rank) != rank:
                raise ValueError(f"custom order: stage {stage} has actions on rank {placement[stage]} and rank {rank}; "
                                 f"a stage runs on one rank")
            done = seen.setdefault((stage, kind), [])
            if mb in done:
                raise ValueError(f"custom order, rank {rank}: {stage}{kind}{mb} appears twice")
            if kind == "B" and mb not in seen.get((stage, "F"), []):
                raise ValueError(f"custom order, rank {rank}: {stage}B{mb} (backward) comes before {stage}F{mb}")
            done.append(mb)
    missing = [s for s in range(n_stages) if s not in placement]
    if missing:
        raise ValueError(f"custom order: stage(s) {missing} have no actions; every one of the {n_stages} stages "
                         f"needs F and B for each micro-batch")
    idle = [r for r, actions in order.items() if not actions]
    if idle:
        raise ValueError(f"custom order: rank(s) {idle} hold no stage; every rank of the group must hold one")
    counts = {len(seen.get((s, "F"), [])) for s in range(n_stages)}
    n_mb = max(counts)
    for s in range(n_stages):
        for kind in ("F", "B"):
            got = sorted(seen.get((s, kind), []))
            if got != list(range(n_mb)):
                lacking = sorted(set(range(n_mb)) - set(got))
                raise ValueError(f"custom order: stage {s} runs {kind} for micro-batches {got}, expected 0..{n_mb - 1}"
                                 + (f" (missing {lacking})" if lacking else ""))
    return n_mb, placement


def check_schedule(schedule: str, n_stages: int, n_ranks: int, n_microbatches: int, virtual_stages: int = 1) -> None:
    """ValueError, naming the numbers, for a schedule torch cannot run with these counts."""
    schedule = ALIASES.get(schedule, schedule)
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; one of {sorted(SCHEDULES)}")
    if isinstance(n_microbatches, bool) or not isinstance(n_microbatches, int) or n_microbatches < 1:
        raise ValueError(f"n_microbatches must be a positive integer, got {n_microbatches!r}")
    if schedule == "custom":
        return
    if schedule == "interleaved":
        if isinstance(virtual_stages, bool) or not isinstance(virtual_stages, int) or virtual_stages < 1:
            raise ValueError(f"virtual_stages must be a positive integer, got {virtual_stages!r}")
        if n_stages != n_ranks * virtual_stages:
            raise ValueError(f"interleaved with {virtual_stages} virtual stages per rank on {n_ranks} ranks needs "
                             f"{n_ranks * virtual_stages} stages, got {n_stages} piece ranges")
        rounds = max(1, n_microbatches // n_ranks)
        if n_microbatches % rounds:
            raise ValueError(f"interleaved on {n_ranks} ranks cannot run {n_microbatches} micro-batches: they form "
                             f"{rounds} rounds ({n_microbatches} // {n_ranks}) and {n_microbatches} is not a multiple "
                             f"of {rounds}; use a multiple of {n_ranks} or fewer than {2 * n_ranks}")
        return
    if virtual_stages != 1:
        raise ValueError(f"{schedule} runs one stage per rank; virtual_stages={virtual_stages} needs 'interleaved'")
    if n_stages != n_ranks:
        raise ValueError(f"{schedule} runs one stage per rank: {n_stages} piece ranges for {n_ranks} ranks")
    if schedule == "1f1b" and n_microbatches < n_stages:
        raise ValueError(f"1f1b needs at least as many micro-batches as stages: {n_microbatches} micro-batches "
                         f"for {n_stages} stages")


class _TimedStage(PipelineStage):
    """torch's PipelineStage, counting the seconds spent inside its forwards and backwards.

    The schedule's wall time is the same on every rank of a pipeline (each waits for the slowest);
    only the time inside a stage's own chunks says which rank got slower (``train.loop``'s straggler
    watch re-partitions the layers by it).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.busy_s = 0.0

    def _timed(self, chunk, *args, **kwargs):
        # a TP stage's collectives wait for the slowest partner: that part is not this rank's own work
        start, waited = time.perf_counter(), tp_comm.waited_s()
        try:
            return chunk(*args, **kwargs)
        finally:
            self.busy_s += (time.perf_counter() - start) - (tp_comm.waited_s() - waited)

    def forward_one_chunk(self, *args, **kwargs):
        return self._timed(super().forward_one_chunk, *args, **kwargs)

    def backward_one_chunk(self, *args, **kwargs):
        return self._timed(super().backward_one_chunk, *args, **kwargs)


class _SyncedStage(_TimedStage):
    """A timed stage with one more override: GradSync's accumulate/launch switch.

    ``backward_one_chunk`` is where every torch schedule says whether this is the
    stage's last backward of the step; earlier micro-batches run inside
    ``GradSync.accumulating()`` (DDP's no_sync), the last one lets the hooks
    launch buckets.  The micro-batch's loss (last stage only) is added first, so
    the last bucket carries the replica's mean loss.
    """

    def __init__(self, *args, grad_sync, **kwargs):
        super().__init__(*args, **kwargs)
        self.grad_sync = grad_sync

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
        if loss is not None:   # the loss as computed, i.e. times the loss scale: carried unscaled
            self.grad_sync.add_loss(float(loss.detach()) / self.grad_sync.grad_scale)
        if last_backward:
            return super().backward_one_chunk(bwd_chunk_id, loss, full_backward, last_backward)
        with self.grad_sync.accumulating():
            return super().backward_one_chunk(bwd_chunk_id, loss, full_backward, last_backward)


def _make_stage(module, stage_index, n_stages, device, group, sync) -> PipelineStage:
    if sync is None:
        return _TimedStage(module, stage_index, n_stages, torch.device(device), group=group)
    return _SyncedStage(module, stage_index, n_stages, torch.device(device), group=group, grad_sync=sync)


class Pipeline:
    """This rank's part of one pipeline replica: its stage module(s) and a torch schedule.

    Every rank of ``group`` constructs it with the same ``ranges``, ``schedule``,
    ``n_microbatches`` and ``order``; each calls ``step`` with the same rows.
    """

    def __init__(self, model: nn.Module, ranges: Sequence[Range], group, *, schedule: str = "1f1b",
                 n_microbatches: int = 1, virtual_stages: int = 1, order: Optional[Order] = None,
                 dp_group=None, bucket_bytes: int = DEFAULT_BUCKET_BYTES, device: Union[str, torch.device] = "cpu",
                 positions: Optional[Sequence[int]] = None, compute_dtype: str = "fp32",
                 cross_entropy=None):
        n_ranks, rank = dist.get_world_size(group), dist.get_rank(group)
        if rank < 0:
            raise ValueError("this rank is not a member of the pipeline group")
        self.ranges = check_ranges(ranges, len(layer_modules(model)))
        n_stages = len(self.ranges)
        schedule = ALIASES.get(schedule, schedule)
        if positions is not None and schedule != "custom" and order is None:
            order = _placed_order(schedule, n_stages, n_ranks, n_microbatches, virtual_stages, positions)
            if order is not None:
                schedule = "custom"
        self.schedule_name = schedule
        if schedule == "custom":
            if order is None:
                raise ValueError("schedule 'custom' needs an order: order[rank] = ['0F0', '0F1', '0B0', ...]")
            if not isinstance(n_microbatches, int) or isinstance(n_microbatches, bool) or n_microbatches < 1:
                raise ValueError(f"n_microbatches must be a positive integer, got {n_microbatches!r}")
            self._order = parse_order(order, n_ranks)
            n_mb, placement = check_order(self._order, n_stages)
            if n_mb != n_microbatches:
                raise ValueError(f"the custom order runs {n_mb} micro-batches per stage, but n_microbatches="
                                 f"{n_microbatches}")
            local = sorted(s for s, r in placement.items() if r == rank)
        else:
            if order is not None:
                raise ValueError(f"an explicit order needs schedule='custom', not {schedule!r}")
            check_schedule(schedule, n_stages, n_ranks, n_microbatches, virtual_stages)
            self._order = None
            local = list(range(rank, n_stages, n_ranks))
        self.n_microbatches = n_microbatches
        self.n_stages = n_stages
        self.group, self.rank, self.n_ranks = group, rank, n_ranks
        self.device = device
        all_modules = build_stages(model, self.ranges)
        self.stage_indices = local
        self.modules: List[StageModule] = [all_modules[s] for s in local]
        self.holds_first, self.holds_last = 0 in local, n_stages - 1 in local
        if compute_dtype != "fp32":   # per-device precision: autocast inside, fp32 across the boundaries
            from hcomm.parallel.precision import TORCH_DTYPES

            for module, index in zip(self.modules, local):
                module.compute_dtype, module.boundary = TORCH_DTYPES[compute_dtype], index != n_stages - 1
        self.loss_fn = TokenSumLoss(1, cross_entropy)   # cross_entropy: (logits, targets) -> sum (TP: vocab-parallel)
        self.sync = None
        if dp_group is not None:
            from hcomm.parallel.data import GradSync

            self.sync = GradSync(nn.ModuleList(self.modules), dp_group, weight=1.0, bucket_bytes=bucket_bytes)
        self._schedule = None
        self._stages: List[_TimedStage] = []
        self._shape = None
        if self._order is not None:
            self._build_schedule()  # lowers the order now: an order that would deadlock fails here, not mid-step

    # -- public ----------------------------------------------------------------------------
    def parameters(self) -> List[nn.Parameter]:
        """The local stages' parameters (what this rank's optimizer updates)."""
        return [p for m in self.modules for p in m.parameters()]

    def step(self, rows: torch.Tensor, global_batch: Optional[int] = None) -> PipelineStep:
        """Forward and backward of this pipeline's ``rows`` [n, S+1]; the optimizer is the caller's.

        Every rank of the pipeline passes the same rows (only the first and last
        stages read them).  With ``dp_group``, ``global_batch`` is the rows of all
        replicas together (n may be 0 on a replica); afterwards ``.grad`` holds the
        global batch's mean gradient on every replica.
        """
        if rows.dim() != 2 or rows.shape[1] < 2:
            raise ValueError(f"rows must be [n, S+1] token ids with S >= 1, got shape {tuple(rows.shape)}")
        n, seq = rows.shape[0], rows.shape[1] - 1
        if self.sync is not None:
            if global_batch is None or global_batch < max(n, 1):
                raise ValueError(f"with a dp_group, step needs global_batch >= this replica's {n} rows, "
                                 f"got {global_batch!r}")
        elif n == 0:
            raise ValueError("a pipeline without data parallelism needs at least one row")
        if n and (n < self.n_microbatches or n % self.n_microbatches):
            raise ValueError(f"{n} rows cannot be split into {self.n_microbatches} equal micro-batches "
                             f"(torch's stages size their receive buffers from the first micro-batch)")
        result = PipelineStep()
        start = time.perf_counter()
        scale = self.loss_fn.scale   # the caller's loss scale (1.0 unless a stage computes in fp16)
        if self.sync is not None:
            self.sync.grad_scale = scale
        self._zero_grad()
        if n == 0:
            self.sync.weight = 0.0
            self.sync.sync_without_backward()
        else:
            if self.sync is not None:
                self.sync.weight = n / global_batch
            self._ensure_schedule((n // self.n_microbatches, seq))
            for stage in self._stages:
                stage.busy_s = 0.0
            self.loss_fn.token_count = n * seq
            losses: List[torch.Tensor] = []
            args = (rows[:, :-1],) if self.holds_first else ()
            target = rows[:, 1:] if self.holds_last else None
            self._schedule.step(*args, target=target, losses=losses if self.holds_last else None,
                                return_outputs=False)
            if self.holds_last:
                result.loss = float(sum(float(l.detach()) for l in losses)) / scale
            if self.sync is None and scale != 1.0:   # no reduction to unscale in: do it here
                for p in self.parameters():
                    if p.grad is not None:
                        p.grad.div_(scale)
        result.compute_s = time.perf_counter() - start
        result.busy_s = sum(stage.busy_s for stage in self._stages) if n else 0.0
        if self.sync is not None:
            result.sync_wait_s = self.sync.wait()
            if self.holds_last:
                result.global_loss = self.sync.global_loss()
        else:
            result.global_loss = result.loss
        return result

    def close(self) -> None:
        if self.sync is not None:
            self.sync.remove()

    # -- internals -------------------------------------------------------------------------
    def _zero_grad(self) -> None:
        if self.sync is not None:
            self.sync.zero_grad()
            return
        for p in self.parameters():
            p.grad = None

    def _ensure_schedule(self, micro_shape) -> None:
        # torch sizes receive buffers from the first step's micro-batch: a new shape needs new stages.
        if self._shape == micro_shape:
            return
        if self._schedule is None or self._shape is not None:  # a custom order's first schedule is built already
            self._build_schedule()
        self._shape = micro_shape

    def _build_schedule(self) -> None:
        stages = [_make_stage(m, s, self.n_stages, self.device, self.group, self.sync)
                  for m, s in zip(self.modules, self.stage_indices)]
        self._stages = stages
        common = dict(loss_fn=self.loss_fn, scale_grads=False)  # TokenSumLoss already divides by the batch's tokens
        if self.schedule_name == "gpipe":
            self._schedule = ScheduleGPipe(stages[0], self.n_microbatches, **common)
        elif self.schedule_name == "1f1b":
            self._schedule = Schedule1F1B(stages[0], self.n_microbatches, **common)
        elif self.schedule_name == "interleaved":
            self._schedule = ScheduleInterleaved1F1B(stages, self.n_microbatches, **common)
        else:
            self._schedule = _lower_order(stages, self.n_microbatches, self._order, common)


def _placed_order(schedule: str, n_stages: int, n_ranks: int, n_microbatches: int, virtual_stages: int,
                  positions: Sequence[int]) -> Optional[Dict[int, list]]:
    """A named schedule as an explicit order when torch's class cannot run it as asked, else None.

    torch's schedule classes put stage s on group rank ``s % ranks``, and a group's ranks are its
    members in ascending global order; a planned pipeline puts the fastest devices where the cost
    model wants them (``positions[i]``: the group rank at pipeline position i), and 1F1B may be
    planned with fewer micro-batches than stages, which ``Schedule1F1B`` refuses.  Both run the
    same actions in the same order per position (``schedule_cost.action_orders``, a transcription
    of torch's), lowered by the custom path.
    """
    from hcomm.parallel.pipeline.schedule_cost import action_orders

    positions = list(positions)
    if sorted(positions) != list(range(n_ranks)):
        raise ValueError(f"positions must list each of the group's {n_ranks} ranks once, got {positions}")
    check_schedule(schedule, n_stages, n_ranks, max(n_microbatches, n_stages) if schedule == "1f1b" else
                   n_microbatches, virtual_stages)
    torch_runs_it = positions == list(range(n_ranks)) and not (schedule == "1f1b" and n_microbatches < n_stages)
    if torch_runs_it:
        return None
    cost_name = {"interleaved": "interleaved-1f1b"}.get(schedule, schedule)
    orders = action_orders(cost_name, n_ranks, n_microbatches, virtual_stages)
    return {positions[pos]: [(a.stage, a.kind, a.microbatch) for a in actions] for pos, actions in enumerate(orders)}


def _lower_order(stages, n_microbatches: int, order: Dict[int, List[Tuple[int, str, int]]], common):
    """torch's runtime for an explicit compute order (the one place that uses its private API)."""
    from torch.distributed.pipelining.schedules import _Action, _ComputationType, _PipelineScheduleRuntime

    kinds = {"F": _ComputationType.FORWARD, "B": _ComputationType.FULL_BACKWARD}
    actions = {rank: [_Action(s, kinds[k], mb) for s, k, mb in acts] for rank, acts in order.items()}
    runtime = _PipelineScheduleRuntime(stages, n_microbatches, **common)
    try:
        runtime._prepare_schedule_with_comms(actions)
    except AssertionError as error:
        raise ValueError(f"custom order cannot run: {error} (a rank waits for an action that comes later in "
                         f"another rank's order)") from None
    runtime.pipeline_order = actions
    return runtime

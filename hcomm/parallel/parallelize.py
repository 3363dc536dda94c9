"""Applying a plan to a model on one rank: ``parallelize(model, plan, groups)``.

Each dimension reads only its own part of the plan: data parallelism this
rank's sample count and micro-batch and the "dp" group's bucket size,
weak-tier compression and cross-island sync period; ZeRO the ranks'
zero_stage and shard fractions (``zero/runner.py``); pipelines the "pp:*"
groups (``_pipeline``); tensor parallelism the "tp:*" groups (``_tensor``);
precision each rank's compute_dtype.  The ``ddp-gloo`` / ``fsdp2-gloo``
backends are the homogeneous baselines: torch's DDP / FSDP2 over gloo,
equal batches.

``ParallelModel.train_step(rows_fn)`` runs one optimizer step: forward and
backward over this rank's rows in micro-batches, the gradient sync, the
optimizer, and (every H steps) the outer sync; it returns the rank's
seconds split into compute, sync wait and optimizer.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import torch
import torch.distributed as dist

from hcomm.parallel.data import GradSync
from hcomm.parallel.outer import OuterSync
from hcomm.parallel.plan import Plan
from hcomm.parallel.tensor import comm as tp_comm


@dataclass
class Groups:
    """The process groups a plan runs over (every rank builds them together: see ``make_groups``)."""

    default: object                 # gloo: control, the DDP baseline
    hcomm: object                   # every rank, hcomm backend
    island: object                  # this rank's island, hcomm backend
    islands: List[List[int]]        # global ranks of each island
    island_index: int


def make_groups(default_group=None) -> Groups:
    """The hcomm group of every rank and one hcomm group per island (collective)."""
    import hcomm

    everyone = dist.new_group(backend="hcomm")
    topo = hcomm.topology(everyone)
    rank = dist.get_rank()
    mine, index = None, 0
    for i, members in enumerate(topo.islands):
        g = dist.new_group(ranks=members, backend="hcomm")
        if rank in members:
            mine, index = g, i
    return Groups(default_group or dist.group.WORLD, everyone, mine, [list(m) for m in topo.islands], index)


@dataclass
class StepTimes:
    compute_s: float = 0.0      # forward + backward of this rank's samples
    # inside its own forwards and backwards: a pipeline's compute_s also holds waiting for the other
    # stages (every rank's is the slowest's); elsewhere the same as compute_s
    busy_s: float = 0.0
    sync_wait_s: float = 0.0    # after backward until every bucket is reduced (exposed comm + waiting for peers)
    optimizer_s: float = 0.0
    outer_s: float = 0.0        # cross-island outer sync (0 on inner steps)
    step_s: float = 0.0
    zero: dict = field(default_factory=dict)  # ZeRO: bytes moved, exposed and overlapped seconds (per unit)
    skipped: bool = False              # a non-finite gradient somewhere: no optimizer step on any rank
    loss_scale: float = 1.0            # fp16 ranks: the dynamic loss scale this step ran with
    local_loss: float = float("nan")   # this rank's mean loss over its samples (nan with no samples)
    global_loss: float = float("nan")  # the plan's global-batch loss when the sync carried it


@dataclass
class ParallelModel:
    model: torch.nn.Module
    plan: Plan
    rank: int
    samples: int
    offset: int
    micro_batch: int
    seq_len: int
    sync: Optional[GradSync] = None
    outer: Optional[OuterSync] = None
    ddp: Optional[torch.nn.Module] = None
    zero: Optional[object] = None           # hcomm.parallel.zero.runner.ZeroRunner
    pipe: Optional[object] = None           # hcomm.parallel.pipeline.runtime.Pipeline
    precision: Optional[object] = None      # hcomm.parallel.precision.Precision (DP with a low compute dtype)
    groups: Optional[Groups] = None
    tp_position: int = 0                    # this rank's position in its tensor-parallel group
    steps: int = 0
    notes: List[str] = field(default_factory=list)

    def train_step(self, rows_for: Callable[[int, int], torch.Tensor], optimizer) -> StepTimes:
        """One optimizer step; ``rows_for(offset, count)`` gives this rank's rows of the global batch."""
        times = StepTimes()
        start = time.perf_counter()
        tp_waited = tp_comm.waited_s()
        rows = rows_for(self.offset, self.samples)
        if self.zero is not None:
            done = self.zero.step(rows, self.micro_batch, optimizer)
            units = done.pop("units")
            for key, value in done.items():
                setattr(times, key, value)
            times.busy_s = times.compute_s   # rounds less the waits for collectives: what the watch reads
            times.zero = {key: sum(u[key] for u in units) for key in ("gather_bytes", "reduce_bytes",
                                                                       "exposed_s", "overlapped_s", "issue_s")}
            times.zero["units"] = units
            self.steps += 1
            times.step_s = time.perf_counter() - start
            return times
        if self.pipe is not None:
            # local_loss stays nan except where the last stage runs: only there is the loss known
            if self.precision is not None:
                self.pipe.loss_fn.scale = times.loss_scale = self.precision.scale
            done = self.pipe.step(rows, self.plan.global_batch)
            times.compute_s, times.sync_wait_s, times.busy_s = done.compute_s, done.sync_wait_s, done.busy_s
            times.local_loss, times.global_loss = done.loss, done.global_loss
            if self.tp_position:   # a TP group's loss is counted once, on its first rank
                times.local_loss = float("nan")
        elif self.ddp is not None:
            times.local_loss = self._ddp_forward_backward(rows)
            times.compute_s = times.busy_s = time.perf_counter() - start
        else:
            self.sync.zero_grad()
            if self.precision is not None:
                self.sync.grad_scale = times.loss_scale = self.precision.scale
            if self.samples == 0:
                self.sync.sync_without_backward()
            else:
                times.local_loss = self._forward_backward(rows)
                if self.tp_position:   # the TP group's loss is counted once, on its first rank
                    times.local_loss = float("nan")
            times.compute_s = times.busy_s = time.perf_counter() - start
            times.busy_s -= tp_comm.waited_s() - tp_waited   # a TP member's own work: not its waits for partners
            times.sync_wait_s = self.sync.wait()
            times.global_loss = self.sync.global_loss()
        t = time.perf_counter()
        if self.precision is not None and self.precision.overflow((p.grad for p in self.parameters()),
                                                                  self.groups.default):
            times.skipped = True   # every rank agrees: the same step is skipped everywhere
        else:
            optimizer.step()
        times.optimizer_s = time.perf_counter() - t
        if self.outer is not None and self.outer.due(self.steps):
            times.outer_s = self.outer.step()
        self.steps += 1
        times.step_s = time.perf_counter() - start
        return times

    def _chunks(self, rows: torch.Tensor) -> List[torch.Tensor]:
        size = self.micro_batch or rows.shape[0]
        return list(rows.split(size))

    def _forward_backward(self, rows: torch.Tensor) -> float:
        # Sum over the rank's tokens / its token count = its mean loss, exact across micro-batches.
        denominator = float(rows.shape[0] * self.seq_len)
        chunks = self._chunks(rows)
        total = 0.0
        autocast = self.precision.autocast if self.precision is not None else contextlib.nullcontext
        scale = self.sync.grad_scale
        for i, chunk in enumerate(chunks):
            with autocast():   # a low compute dtype: matmuls in it, parameters and .grad stay fp32
                loss = self.model.loss(chunk, reduction="sum") / denominator
            value = float(loss.detach())
            total += value
            self.sync.add_loss(value)   # before the last backward: the last bucket carries it
            last = i == len(chunks) - 1
            with (contextlib.nullcontext() if last else self.sync.accumulating()):
                (loss * scale if scale != 1.0 else loss).backward()
        return total

    def _ddp_forward_backward(self, rows: torch.Tensor) -> float:
        from hcomm.models.llama import causal_lm_loss

        self.model.zero_grad(set_to_none=True)
        chunks = self._chunks(rows)
        total = 0.0
        for i, chunk in enumerate(chunks):
            loss = causal_lm_loss(self.ddp, chunk, reduction="sum") / float(rows.shape[0] * self.seq_len)
            total += float(loss.detach())
            last = i == len(chunks) - 1
            if hasattr(self.ddp, "no_sync"):
                with (contextlib.nullcontext() if last else self.ddp.no_sync()):
                    loss.backward()
            else:  # FSDP2: reduce-scatter every micro-batch (ZeRO-2/3 keep no whole gradients)
                loss.backward()
        return total

    def make_optimizer(self, build: Callable, lr: float) -> torch.optim.Optimizer:
        """``build(params, lr)`` over what this rank steps; the ZeRO-1 baseline wraps it in torch's
        ZeroRedundancyOptimizer."""
        if self.plan.backend == "ddp-gloo" and self.plan.ranks[self.rank].zero_stage == 1:
            from hcomm.parallel.zero.baseline import zero_redundancy_optimizer

            return zero_redundancy_optimizer(self.model.parameters(), self.ddp.process_group, lr)
        return build(self.parameters(), lr)

    @property
    def collective_eval(self) -> bool:
        """FSDP2's and tensor parallelism's forward talk to other ranks: then every rank runs the evaluation."""
        tp_alone = bool(self.plan.tensor_groups()) and not self.plan.pipeline_groups()   # pipelines gather whole
        return self.plan.backend == "fsdp2-gloo" or tp_alone

    def parameters(self) -> List[torch.nn.Parameter]:
        """What the optimizer steps: the model's parameters, or under ZeRO this rank's fp32 master shards."""
        if self.pipe is not None:
            return self.pipe.parameters()
        return self.zero.parameters() if self.zero is not None else list(self.model.parameters())

    def resplit(self, counts: List[int]) -> None:
        """New sample counts for every rank (same global batch; as in the plan, a TP group's rows are its
        first rank's); the gradient weights follow exactly.  hcomm's data parallelism, plain, ZeRO or across
        TP groups: only rows move.  A pipeline is cut again instead (``train.drift.recut_pipeline``)."""
        if self.outer is not None or self.ddp is not None or self.pipe is not None:
            raise ValueError("re-splitting the batch needs hcomm's data parallelism (plain, ZeRO or across TP "
                             "groups): not outer sync, a torch baseline or a pipeline")
        owner = self.plan.rows_leader(self.rank)
        self.samples, self.offset = counts[owner], sum(counts[:owner])
        if self.zero is not None:   # every rank's loss is already over the global token count
            self.zero.resplit(counts)
        else:
            self.sync.weight = self.samples / sum(counts)

    def finish(self) -> float:
        """After the last step: the outer sync brings every rank to the same parameters; seconds."""
        if self.zero is not None:
            start = time.perf_counter()
            self.zero.finish()
            return time.perf_counter() - start
        if self.pipe is not None:
            # not training time: the stages only come together for the eval (and a checkpoint)
            if self.plan.tensor_groups():
                self.model = _gather_tensor_stages(self, self.groups.default)
            else:
                _gather_stages(self.model, self.plan, self.groups.default)
            return 0.0
        return self.outer.finish(self.steps) if self.outer is not None else 0.0

    def close(self) -> None:
        if self.sync is not None:
            self.sync.remove()
        if self.zero is not None:
            self.zero.engine.remove()
        if self.pipe is not None:
            self.pipe.close()


def parallelize(model: torch.nn.Module, plan: Plan, groups: Groups) -> ParallelModel:
    """Wrap ``model`` for this rank as ``plan`` says (every rank calls it with the same plan)."""
    import hcomm

    rank = dist.get_rank()
    plan.validate(dist.get_world_size())
    counts, offsets = plan.batch_counts(), plan.batch_offsets()
    me = plan.ranks[rank]
    dp = plan.dp_group()
    pm = ParallelModel(model, plan, rank, counts[rank], offsets[rank], me.micro_batch, plan.seq_len, groups=groups)
    if plan.pipeline_groups():
        _pipeline(pm, dp.bucket_bytes, dp.compression)
        return pm
    if plan.tensor_groups():
        _tensor(pm, dp.bucket_bytes, dp.compression)
        return pm
    if plan.backend in ("ddp-gloo", "fsdp2-gloo"):
        if len(set(counts)) != 1:
            raise ValueError(f"the {plan.backend} baseline averages over ranks and needs equal batches; "
                             f"the plan gives {counts}")
        if plan.backend == "fsdp2-gloo":
            from hcomm.parallel.zero.baseline import shard_with_fsdp2

            pm.ddp = shard_with_fsdp2(model, groups.default, me.zero_stage)
            return pm
        from torch.nn.parallel import DistributedDataParallel

        pm.ddp = DistributedDataParallel(model, process_group=groups.default)
        return pm
    global_batch = sum(counts)
    if me.zero_stage > 0:
        from hcomm.parallel.zero.runner import ZeroRunner

        pm.zero = ZeroRunner(model, plan, groups, rank)
        return pm
    if dp.sync_every > 1:
        members = groups.islands[groups.island_index]
        island_samples = sum(counts[r] for r in members)
        weight = counts[rank] / island_samples if island_samples else 0.0
        pm.sync = GradSync(model, groups.island, weight=weight, bucket_bytes=dp.bucket_bytes)
        pm.outer = OuterSync(model, groups.hcomm, every=dp.sync_every, island_weight=island_samples / global_batch,
                             island_size=len(members), lr=dp.outer_lr, momentum=dp.outer_momentum,
                             overlap=dp.outer_overlap)
    else:
        pm.sync = GradSync(model, groups.hcomm, weight=counts[rank] / global_batch, bucket_bytes=dp.bucket_bytes)
    # Only traffic between islands is compressed: every step's gradients, or the outer sync's deltas.
    hcomm.set_compression(dp.compression, group=groups.hcomm)
    pm.precision = _precision(pm, shared_scale=False)   # each rank unscales its own part of the reduction
    return pm


def _precision(pm: ParallelModel, shared_scale: bool):
    """This rank's ``Precision``, or None when every rank computes in fp32.  ``shared_scale``: ranks whose
    gradients come from one loss (pipeline stages, a TP group) all scale it when any of them is fp16."""
    plan = pm.plan
    if all(r.compute_dtype == "fp32" for r in plan.ranks):
        return None
    from hcomm.parallel.devices import local_device_name
    from hcomm.parallel.precision import Precision

    fp16 = any(r.compute_dtype == "fp16" for r in plan.ranks)
    precision = Precision(plan.ranks[pm.rank].compute_dtype, rank=pm.rank, device=local_device_name(),
                          device_type=next(pm.model.parameters()).device.type,
                          loss_scaling=fp16 if shared_scale else None)
    precision.prepare(pm.model)   # fp8: the linears' matmuls in fp8, the same Parameters
    return precision


def _pipeline(pm: ParallelModel, bucket_bytes: int, compression: str) -> None:
    """This rank's stages of its pipeline replica; replicas of a stage sync gradients in their own group.

    Every rank of a replica runs the replica's rows (the plan gives them to its first rank).  The
    pipeline group's ranks are its members in ascending order; ``positions`` tells the runtime which
    of them runs each pipeline position (the planner's device order).
    """
    from hcomm.parallel.groups import replica_groups
    from hcomm.parallel.pipeline.runtime import Pipeline

    plan = pm.plan
    pipes = plan.pipeline_groups()
    cross_entropy = None
    if plan.tensor_groups():
        pipe_group, dp_group, cross_entropy = _tensor_stages(pm, pipes)
    else:
        pipe_group, dp_group = replica_groups([g.ranks for g in pipes])
    if dp_group is not None:   # replicas of a stage: only their traffic between islands is compressed
        import hcomm

        hcomm.set_compression(compression, group=dp_group)
    mine = plan.pipeline_of(pm.rank)
    leader = plan.rows_leader(pm.rank)
    pm.samples, pm.offset = plan.batch_counts()[leader], plan.batch_offsets()[leader]
    members = sorted(mine.ranks)
    dtype = plan.ranks[pm.rank].compute_dtype
    pm.pipe = Pipeline(pm.model, list(zip(mine.cuts, mine.cuts[1:])), pipe_group, schedule=mine.schedule,
                       n_microbatches=mine.micro_batches, virtual_stages=mine.virtual_stages, dp_group=dp_group,
                       bucket_bytes=bucket_bytes, positions=[members.index(r) for r in mine.ranks],
                       compute_dtype=dtype, cross_entropy=cross_entropy)
    pm.precision = _precision(pm, shared_scale=True)   # one loss, its gradients cross every stage


def _tensor_stages(pm: ParallelModel, pipes):
    """A pipeline of TP groups (Megatron's layout, uneven): this rank's shard of the model in its stage's TP
    group, and the pipeline of its TP position -- ranks at position k of consecutive stages pass each
    other the whole activations, so the T pipelines of a replica run side by side and meet in their
    stages' TP all-reduces.  Replicas sync the gradients of one (stage, position) shard among themselves.
    Returns (pipeline group, gradient group, the last stage's vocabulary-parallel cross entropy)."""
    from hcomm.parallel.groups import replica_groups
    from hcomm.parallel.tensor.parallelize import TensorParallelLlama, tensor_parallelize
    from hcomm.parallel.tensor.vocab import vocab_parallel_cross_entropy

    plan = pm.plan
    mine = plan.tensor_group_of(pm.rank)
    pm.tp_position = mine.ranks.index(pm.rank)
    fractions = [plan.ranks[r].tp_fraction for r in mine.ranks]
    if isinstance(pm.model, TensorParallelLlama):
        # re-staged (``pipeline.restage``): the same groups and fractions, so this rank's shards stay
        if pm.model.fractions != fractions or pm.model.index != pm.tp_position:
            raise ValueError(f"rank {pm.rank}: its model is already split for TP fractions {pm.model.fractions} "
                             f"at position {pm.model.index}; the plan asks {fractions} at {pm.tp_position}")
        tp_group = pm.model.group
    else:
        tp_group, _ = replica_groups([g.ranks for g in plan.tensor_groups()], across=False)
        members = sorted(mine.ranks)
        pm.model = tensor_parallelize(pm.model, tp_group, fractions, index=pm.tp_position,
                                      shard_ranks=[members.index(r) for r in mine.ranks])
    by_position = {}
    for g in pipes:
        by_position.setdefault(plan.tensor_group_of(g.ranks[0]).ranks.index(g.ranks[0]), []).append(g.ranks)
    pipe_group = dp_group = None
    for k in sorted(by_position):   # collective: every rank builds every position's groups, in one order
        p, d = replica_groups(by_position[k])
        pipe_group = p if p is not None else pipe_group
        dp_group = d if d is not None else dp_group
    start = pm.model.vocab_start
    return pipe_group, dp_group, lambda logits, targets: vocab_parallel_cross_entropy(logits, targets, start,
                                                                                      tp_group, "sum")


def _gather_tensor_stages(pm: ParallelModel, group) -> torch.nn.Module:
    """The whole reference model on every rank from the first replica's shards (one gather of Python
    objects: the eval and checkpoint path, not training)."""
    from hcomm.models.llama import Llama, layer_modules
    from hcomm.parallel.tensor.unshard import join_shards, piece_shards

    plan = pm.plan
    first = plan.pipeline_groups()[0]
    contributors = {r for s in first.ranks for r in plan.tensor_group_of(s).ranks}
    mine = {}
    if pm.rank in contributors:
        for module in pm.pipe.modules:
            for i, piece in enumerate(module.pieces):
                mine[module.first + i] = piece_shards(piece, pm.tp_position)
    gathered: List = [None] * plan.world_size
    dist.all_gather_object(gathered, mine, group=group)
    with torch.random.fork_rng():   # building the reference model draws initial weights: not from training's RNG
        whole = Llama(pm.model.config)
    for i, piece in enumerate(layer_modules(whole)):
        piece.load_state_dict(join_shards([g[i] for g in gathered if i in g]), strict=False)
    return whole


def _gather_stages(model: torch.nn.Module, plan: Plan, group) -> None:
    """Every rank gets the whole trained model: each stage's pieces from its rank in the first replica
    (replicas agree: their gradients were all-reduced)."""
    from hcomm.models.llama import layer_modules

    first = plan.pipeline_groups()[0]
    pieces = layer_modules(model)
    depth = len(first.ranks)
    for k, (a, b) in enumerate(zip(first.cuts, first.cuts[1:])):
        owner = first.ranks[k % depth]
        for piece in pieces[a:b]:
            for tensor in [*piece.parameters(), *piece.buffers()]:
                dist.broadcast(tensor.data, src=owner, group=group)


def _tensor(pm: ParallelModel, bucket_bytes: int, compression: str) -> None:
    """This rank's shard of the model in its TP group; ranks at one position of every group sync gradients.

    Every rank of a TP group runs the group's rows (the plan gives them to its first rank)."""
    import hcomm
    from hcomm.parallel.groups import replica_groups
    from hcomm.parallel.tensor.parallelize import tensor_parallelize

    plan = pm.plan
    groups = plan.tensor_groups()
    # groups[i].ranks[p] -> (this rank's TP group, its position's group)
    tp_group, position_group = replica_groups([g.ranks for g in groups])
    if position_group is None:   # one TP group: each position syncs with itself (nothing crosses a link)
        singles = [dist.new_group([r], backend="gloo") for r in range(plan.world_size)]
        position_group = singles[pm.rank]
    else:   # replicas of a shard: only their traffic between islands is compressed
        hcomm.set_compression(compression, group=position_group)
    mine = next(g for g in groups if pm.rank in g.ranks)
    pm.tp_position = mine.ranks.index(pm.rank)
    counts, offsets = plan.batch_counts(), plan.batch_offsets()
    pm.samples, pm.offset = counts[mine.ranks[0]], offsets[mine.ranks[0]]
    fractions = [plan.ranks[r].tp_fraction for r in mine.ranks]
    # shards follow the plan's order (fastest first), whatever order torch numbers the group's ranks in
    members = sorted(mine.ranks)   # torch numbers a group's ranks in ascending global order
    pm.model = tensor_parallelize(pm.model, tp_group, fractions, index=pm.tp_position,
                                  sequence_parallel=mine.sequence_parallel,
                                  shard_ranks=[members.index(r) for r in mine.ranks])
    pm.sync = GradSync(pm.model, position_group, weight=pm.samples / plan.global_batch, bucket_bytes=bucket_bytes)
    pm.precision = _precision(pm, shared_scale=True)   # the ranks of a TP group compute one loss together

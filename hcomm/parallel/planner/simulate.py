"""One simulator for every plan: ``simulate(plan, view)`` -> predicted step seconds and bytes per rank.

It reads only the plan and the view (profiles, the comm layer's collective costs, links), never how
the plan was made, and it is the same model the builders choose with:

- data parallelism (hcomm or the torch DDP baseline): ``cost.dp_step`` -- the buckets of the last
  micro-batch's backward, in order, behind the slowest rank; islands with an outer sync every H steps
  step on their own and pay the outer all-reduce once per H (``data._estimate``);
- ZeRO 1-3 (and FSDP2's even shards): ``zero.zero_step_s`` -- gathers and reduce-scatters per unit
  with prefetch, per micro-batch round;
- pipelines: ``partition.evaluate`` per replica -- the schedule simulated action by action from each
  stage device's piece costs and the links between them -- plus the replicas' stage-gradient
  all-reduce and the optimizer on the largest stage (``pipeline_step.stage_sync_s`` / ``optimizer_s``);
- tensor parallelism: ``tensor.tensor_step_s`` -- the slowest group's share plus its all-reduces;
- pipelines of TP groups: every TP group becomes one device (``pipeline_tensor.group_view``) and the
  pipeline model runs on that view.

Memory per rank is the same accounting the builders' fit checks use (profile state x the rank's
share of it + activations of the samples it holds at once).  ``hcomm.parallel.simulate`` is this.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from hcomm.parallel.planner import cost


@dataclass
class Simulation:
    step_s: float
    memory_bytes: List[int]          # per rank, at its peak
    budget_bytes: List[int]          # per rank, what it may use
    kind: str                        # data, zero, pipeline, tensor, pipeline+tensor, ddp (torch baseline)
    account: str = ""                # where the seconds go, one line
    notes: List[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return all(m <= b for m, b in zip(self.memory_bytes, self.budget_bytes))

    def over_budget(self) -> List[int]:
        return [r for r, (m, b) in enumerate(zip(self.memory_bytes, self.budget_bytes)) if m > b]


def simulate(plan, view, *, dim: Optional[int] = None) -> Simulation:
    """Predicted step and per-rank memory of ``plan`` on ``view``; ``dim``: the model's hidden size
    (default: read from the profile's norm piece, exact for measured profiles of the reference model)."""
    plan.validate(view.world_size)
    if dim is None:
        dim = cost.model_shape(view.profiles[0])[0]
    budgets = [p.memory_budget_bytes for p in view.profiles]
    if plan.pipeline_groups():
        step, memory, account = (_pipeline_tensor(plan, view, dim) if plan.tensor_groups()
                                 else _pipelines(plan, view, dim))
        kind = "pipeline+tensor" if plan.tensor_groups() else "pipeline"
    elif plan.tensor_groups():
        from hcomm.parallel.planner.tensor import tensor_step_s

        step, account = tensor_step_s(view, plan, dim, len(view.profiles[0].layers) - 3)
        memory, kind = _tensor_memory(plan, view), "tensor"
    elif plan.ranks[0].zero_stage and plan.backend != "ddp-gloo":
        from hcomm.parallel.planner.zero import zero_step_s

        step, account = zero_step_s(view, plan)
        memory, kind = _zero_memory(plan, view), "zero"
    else:
        step, account, memory = _data(plan, view)
        kind = "ddp" if plan.backend == "ddp-gloo" else "data"
    return Simulation(step, memory, budgets, kind, account)


# --- data parallelism ---------------------------------------------------------------------------

def _in_flight(plan) -> List[int]:
    counts = plan.batch_counts()
    return [min(r.micro_batch or n, n) for r, n in zip(plan.ranks, counts)]


def _data(plan, view):
    from hcomm.parallel.planner.data import _estimate

    dp = plan.dp_group()
    counts = plan.batch_counts()
    micro = [r.micro_batch for r in plan.ranks]
    if plan.backend == "ddp-gloo":   # torch DDP over gloo: its ring all-reduce, every step
        ring = view.baseline_allreduce_s or view.allreduce_s
        est = cost.dp_step(view.profiles, counts, dp.bucket_bytes, ring, micro_batches=micro,
                           optimizer_s=max(view.optimizer_s))
    else:
        est = _estimate(view, counts, dp.bucket_bytes, micro, dp.sync_every, dp.compression, dp.outer_overlap)
    extra = 2 * view.profiles[0].param_bytes if dp.sync_every > 1 else 0   # outer anchor + momentum
    memory = [p.memory_needed(n) + extra for p, n in zip(view.profiles, _in_flight(plan))]
    account = (f"{est.step_s * 1e3:.0f} ms = slowest compute {max(est.compute_s) * 1e3:.0f} + exposed comm "
               f"{est.comm_exposed_s * 1e3:.0f} (of {est.comm_total_s * 1e3:.0f} in {est.buckets} buckets) + "
               f"optimizer {est.optimizer_s * 1e3:.0f}" + (f" + outer {est.outer_s * 1e3:.0f}" if est.outer_s else "")
               + " ms")
    return est.step_s, account, memory


def _zero_memory(plan, view) -> List[int]:
    from hcomm.parallel.zero.memory import _shard_group_size, is_replicated, zero_memory

    dp = plan.dp_group()
    even = 1.0 / _shard_group_size(plan)
    return [sum(zero_memory(p, stage=r.zero_stage, fraction=even if r.shard_fraction is None else r.shard_fraction,
                            micro_samples=n, prefetch=dp.prefetch,
                            reshard_after_forward=dp.reshard_after_forward, replicated=is_replicated(plan)).values())
            for r, p, n in zip(plan.ranks, view.profiles, _in_flight(plan))]


# --- tensor parallelism ----------------------------------------------------------------------------

def _tensor_memory(plan, view) -> List[int]:
    """A rank holds its fraction of the training state and (conservatively, as the planner's memory
    cap) its group's activations whole."""
    counts = plan.batch_counts()
    leaders = plan.rows_leaders()
    out = []
    for r, p in zip(plan.ranks, view.profiles):
        rows = counts[leaders[r.rank]]
        out.append(int(p.state_bytes() * r.tp_fraction) + p.activation_bytes(min(r.micro_batch or rows, rows)))
    return out


# --- pipelines ----------------------------------------------------------------------------------------

def _replicas(plan, view, pipes, dim: int):
    """Each pipeline's prediction (``pipeline._Replica``) from its ranks in order, cuts and schedule."""
    from hcomm.parallel.pipeline.partition import evaluate
    from hcomm.parallel.planner.pipeline import _Replica, boundary_bytes, moved, replica_key
    from hcomm.parallel.planner.pipeline_step import transfer_costs

    out = []
    done = {}   # thousands of replicas of a few device patterns: each pattern simulated once
    links = transfer_costs(view)
    for ranks, rows, g in pipes:
        if rows == 0:
            out.append(_Replica(list(ranks), 0, None, list(ranks)))
            continue
        key = (replica_key(view, ranks), rows, tuple(g.cuts), g.micro_batches, g.schedule, g.virtual_stages)
        if key in done:
            part = moved(*done[key], ranks)
        else:
            part = evaluate([view.profiles[r] for r in ranks], g.cuts, micro_batches=g.micro_batches,
                            micro_batch=rows // g.micro_batches, schedule=g.schedule,
                            virtual_stages=g.virtual_stages, boundary_bytes=boundary_bytes(dim, plan.seq_len),
                            **links)
            done[key] = (list(ranks), part)
        out.append(_Replica(list(ranks), rows, part, list(ranks)))
    return out


def replica_steps(plan, view, dim: Optional[int] = None) -> List[tuple]:
    """(rows, predicted step seconds) of each pipeline replica of ``plan`` (pipelines without TP groups),
    each alone: what the rows of the replicas are split by."""
    dim = dim if dim is not None else cost.model_shape(view.profiles[0])[0]
    counts, leaders = plan.batch_counts(), plan.rows_leaders()
    pipes = [(g.ranks, counts[leaders[g.ranks[0]]], g) for g in plan.pipeline_groups()]
    return [(rep.rows, rep.step_s) for rep in _replicas(plan, view, pipes, dim)]


def _pipeline_totals(view, replicas, boundary: int):
    from hcomm.parallel.planner.pipeline_step import replicas_step_s

    step, slowest, sync, opt = replicas_step_s(view, replicas, boundary)
    return step, (f"{step * 1e3:.0f} ms = slowest replica (or the uplinks' load) {slowest * 1e3:.0f} + "
                  f"stage gradient sync {sync * 1e3:.0f} + optimizer {opt * 1e3:.0f} ms")


def _stage_memory(replicas, members_of, world: int) -> List[int]:
    """Bytes per rank from each replica's per-position memory; ``members_of(position_rank)`` -> the
    (rank, share of the state) pairs that hold it (one rank, or a TP group)."""
    memory = [0] * world
    for rep in replicas:
        if rep.part is None:
            continue
        held: Dict[int, int] = {}
        for st in rep.part.stages:
            held[st.rank] = held.get(st.rank, 0) + st.state_bytes
        for pos, holder in enumerate(rep.part.ranks):
            state = held[holder]
            act = rep.part.memory_bytes[pos] - state
            for r, share, act_scale in members_of(holder):
                memory[r] = int(state * share + act * act_scale)
    return memory


def _pipelines(plan, view, dim: int):
    from hcomm.parallel.planner.pipeline import boundary_bytes

    counts = plan.batch_counts()
    leaders = plan.rows_leaders()
    pipes = [(g.ranks, counts[leaders[g.ranks[0]]], g) for g in plan.pipeline_groups()]
    replicas = _replicas(plan, view, pipes, dim)
    step, account = _pipeline_totals(view, replicas, boundary_bytes(dim, plan.seq_len))
    return step, _stage_memory(replicas, lambda r: [(r, 1.0, 1.0)], plan.world_size), account


def _pipeline_tensor(plan, view, dim: int):
    """Each TP group as one device; the pipelines of TP position 0 stand for their replicas."""
    from hcomm.parallel.planner.pipeline import boundary_bytes
    from hcomm.parallel.planner.pipeline_tensor import group_view, member_activation_share

    groups = plan.tensor_groups()
    index = {g.name: i for i, g in enumerate(groups)}
    fractions = [[plan.ranks[r].tp_fraction for r in g.ranks] for g in groups]
    grouped = group_view(view, [g.ranks for g in groups], fractions, plan.seq_len, dim)
    counts = plan.batch_counts()
    leaders = plan.rows_leaders()
    group_of = {r: g for g in groups for r in g.ranks}
    pipes = []
    for g in plan.pipeline_groups():
        if group_of[g.ranks[0]].ranks[0] != g.ranks[0]:
            continue   # position k > 0: runs beside position 0 of its replica
        pipes.append(([index[group_of[r].name] for r in g.ranks], counts[leaders[g.ranks[0]]], g))
    replicas = _replicas(plan, grouped, pipes, dim)
    step, account = _pipeline_totals(grouped, replicas, boundary_bytes(dim, plan.seq_len))

    def members(i):   # the group profile scales activations up (activation_scale): each member's share
        return [(r, f, member_activation_share(fractions[i], k)) for k, (r, f) in
                enumerate(zip(groups[i].ranks, fractions[i]))]
    return step, _stage_memory(replicas, members, plan.world_size), account

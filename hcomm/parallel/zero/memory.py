"""What a ZeRO plan needs on each rank, by category, and shard fractions sized by memory.

Built from the rank's profile (per-piece parameter, gradient, optimizer and
activation bytes; the pieces are ZeRO's units) and the engine's behaviour
(engine.py):

- parameters: whole on every rank for stages 1-2; under stage 3 only the
  units gathered at once: ``prefetch + 1`` in flight plus the last unit kept
  for backward (all of them without ``reshard_after_forward``);
- master shard: the fp32 copy of this rank's fraction the optimizer steps;
- gradients: stage 1 keeps the whole flat gradient; stages 2-3 keep the
  shard's gradient plus the whole-unit buffers whose reductions are in flight
  (two units, the largest: the engine waits for the older reduce-scatter
  before it takes a third) and the results of those reduce-scatters (one
  shard of the largest unit each); in the island layout (HSDP) a result
  stays until its all-reduce across islands ends, which the engine starts
  when the reduce-scatter ends and waits for after backward, so every unit's
  result is counted (the shard's size again);
- optimizer: the state of this rank's fraction (AdamW: two fp32 per element);
- activations: what one micro-batch saves for backward.

Estimates, not measurements: ``benchmarks/train/bench_zero.py`` holds them
to the emulator's memory limits.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

MiB = 1 << 20


GRAD_BUFFERS_IN_FLIGHT = 2   # stages 2-3: whole-unit gradient buffers counted at once (the largest)


def whole_param_bytes(unit_bytes: Sequence[int], *, stage: int, prefetch: int = 1,
                      reshard_after_forward: bool = True) -> int:
    """Bytes of parameters a rank holds whole at once: every unit for stages 1-2 (and for stage 3 without
    ``reshard_after_forward``); under stage 3 ``prefetch + 2`` of the largest (the engine's pool keeps
    its parameter blocks within this too)."""
    params = sum(unit_bytes)
    if stage < 3 or not reshard_after_forward:
        return params
    return min(params, (prefetch + 2) * max(unit_bytes))


def zero_memory(profile, *, stage: int, fraction: float, micro_samples: int, prefetch: int = 1,
                reshard_after_forward: bool = True, replicated: bool = False) -> Dict[str, int]:
    """Bytes this rank needs, by category (see the module docstring); ``replicated``: shards are
    all-reduced across islands (the island layout with more than one island)."""
    units = profile.layers
    params = sum(u.param_bytes for u in units)
    grads = sum(u.grad_bytes for u in units)
    optim = sum(u.optim_bytes for u in units)
    largest_grad = max(u.grad_bytes for u in units)
    whole_params = whole_param_bytes([u.param_bytes for u in units], stage=stage, prefetch=prefetch,
                                     reshard_after_forward=reshard_after_forward)
    if stage >= 2:
        results = int(fraction * grads) if replicated else GRAD_BUFFERS_IN_FLIGHT * int(fraction * largest_grad)
        gradients = int(fraction * grads) + min(grads, GRAD_BUFFERS_IN_FLIGHT * largest_grad) + results
    else:
        gradients = grads + int(fraction * grads)
    return {
        "parameters": whole_params,
        "master shard": int(fraction * params),
        "gradients": gradients,
        "optimizer": int(fraction * optim),
        "activations": int(sum(u.act_bytes_per_sample for u in units) * micro_samples),
    }


def memory_fractions(profiles: Sequence, *, stage: int, micro_samples: Sequence[int], prefetch: int = 1,
                     reshard_after_forward: bool = True, members: Sequence[int] = ()) -> List[float]:
    """Shard fractions proportional to what each member has left once its unsharded needs are met.

    ``members`` (global ranks, default all) is the shard group; the budget
    left after the fraction-independent bytes (whole parameters, unit
    buffers, activations) is what the shard may fill.  A member with nothing
    left gets 0; if nobody has anything left the fractions are even (the
    memory check then names who does not fit).
    """
    members = list(members) or list(range(len(profiles)))
    free = []
    for r in members:
        p = profiles[r]
        fixed = sum(zero_memory(p, stage=stage, fraction=0.0, micro_samples=micro_samples[r], prefetch=prefetch,
                                reshard_after_forward=reshard_after_forward).values())
        free.append(max(0, p.memory_budget_bytes - fixed))
    total = sum(free)
    if total <= 0:
        return [1.0 / len(members)] * len(members)
    return [f / total for f in free]


def check_zero_fits(plan, profiles: Sequence, devices: Sequence[str]) -> None:
    """Refuse a ZeRO plan some rank cannot hold, naming rank, device and bytes by category."""
    counts = plan.batch_counts()
    dp = plan.dp_group()
    even = 1.0 / _shard_group_size(plan)
    for rank, (r, p) in enumerate(zip(plan.ranks, profiles)):
        fraction = even if r.shard_fraction is None else r.shard_fraction
        in_flight = min(r.micro_batch or counts[rank], counts[rank])
        need = zero_memory(p, stage=r.zero_stage, fraction=fraction, micro_samples=in_flight, prefetch=dp.prefetch,
                           reshard_after_forward=dp.reshard_after_forward, replicated=is_replicated(plan))
        total = sum(need.values())
        if total > p.memory_budget_bytes:
            parts = ", ".join(f"{k} {v / MiB:.1f}" for k, v in need.items())
            raise ValueError(f"plan {plan.name!r}: rank {rank} ({devices[rank]}) would need {total / MiB:.1f} MiB "
                             f"under ZeRO-{r.zero_stage} with shard fraction {fraction:.3f} ({parts} MiB) but its "
                             f"memory budget is {p.memory_budget_bytes / MiB:.1f} MiB; lower its shard_fraction or "
                             f"micro_batch, or raise the ZeRO stage")


def _shard_group_size(plan) -> int:
    if plan.dp_group().zero_layout == "island":
        labels = [r.island for r in plan.ranks]
        if all(labels):
            return labels.count(labels[0])
    return plan.world_size


def is_replicated(plan) -> bool:
    """Whether the plan's shards are all-reduced across islands (island layout, more than one island)."""
    return _shard_group_size(plan) < plan.world_size

"""Which schedule and micro-batch count a pipeline runs: every (schedule, M) tried, each with its best
partition (``partition.partition``), the fastest kept, the others reported as alternatives."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

from hcomm.parallel.pipeline.partition import MAX_NODES, Partition, partition
from hcomm.parallel.pipeline.costs import HostTime, LinkTime, LinksOf
from hcomm.parallel.pipeline.schedule_cost import SCHEDULES, check_schedule


@dataclass
class Trial:
    schedule: str
    micro_batches: int
    virtual_stages: int
    micro_batch: int
    partition: Optional[Partition]
    error: str = ""        # why it cannot run, when partition is None

    @property
    def step_s(self) -> float:
        return self.partition.step_s if self.partition is not None else math.inf


@dataclass
class ScheduleChoice:
    best: Partition
    trials: List[Trial]    # every combination tried, fastest first, those that cannot run last

    def __str__(self) -> str:
        lines = [str(self.best), "  alternatives:"]
        for t in self.trials:
            name = t.schedule + (f" x{t.virtual_stages}" if t.virtual_stages > 1 else "")
            what = (f"{t.step_s * 1e3:9.1f} ms {t.step_s / self.best.step_s:6.2f}x  cuts {t.partition.cuts} ranks "
                    f"{t.partition.ranks}" + ("" if t.partition.exact else " (budget)")
                    if t.partition is not None else f"  cannot: {t.error}")
            lines.append(f"    {name:<20} M={t.micro_batches:<4} micro-batch {t.micro_batch:<5}{what}")
        return "\n".join(lines)


def micro_batch_counts(rows: int, most: int) -> List[int]:
    """Micro-batch counts to try for ``rows``: every divisor up to ``most``, and above it one divisor per
    doubling (the largest below each power of two, and ``rows`` itself): a large replica batch still
    reaches micro-batches small enough for its memory, in a handful of tries."""
    small = [m for m in range(1, min(most, rows) + 1) if rows % m == 0]
    divisors = [d for d in range(most + 1, rows + 1) if rows % d == 0]
    large = {max(d for d in divisors if d <= 1 << k) for k in range(most.bit_length(), rows.bit_length() + 1)
             if any(d <= 1 << k for d in divisors)}
    return small + sorted(large | ({rows} if divisors else set()))


def choose_schedule(profiles: Sequence, *, global_batch: int, schedules: Sequence[str] = SCHEDULES,
                    max_micro_batches: int = 32, virtual_stages: Sequence[int] = (2,),
                    counts: Optional[Sequence[int]] = None,
                    boundary_bytes: Union[int, Sequence[int]] = 0, link_s: Optional[LinkTime] = None,
                    budgets: Optional[Sequence[int]] = None, order: Optional[Sequence[int]] = None,
                    max_nodes: int = MAX_NODES, bound_only: bool = False,
                    host_s: Optional[HostTime] = None, links_of: Optional[LinksOf] = None) -> ScheduleChoice:
    """The fastest (schedule, micro-batch count M, partition) over ``schedules`` (interleaved with each of
    ``virtual_stages``) and the M of ``counts`` (default every M <= ``max_micro_batches`` dividing
    ``global_batch``; a micro-batch is global_batch / M samples).  Ties go to less peak memory, then fewer micro-batches."""
    if global_batch < 1:
        raise ValueError(f"global_batch must be >= 1, got {global_batch}")
    for schedule in schedules:
        check_schedule(schedule, 1, 1, 2 if schedule == "interleaved-1f1b" else 1)  # the names
    trials: List[Trial] = []
    every = [m for m in range(1, min(max_micro_batches, global_batch) + 1) if global_batch % m == 0]
    for m in (counts if counts is not None else every):
        for schedule in schedules:
            for v in (virtual_stages if schedule == "interleaved-1f1b" else (1,)):
                try:
                    part = partition(profiles, micro_batches=m, micro_batch=global_batch // m, schedule=schedule,
                                     virtual_stages=v, boundary_bytes=boundary_bytes, link_s=link_s, budgets=budgets,
                                     order=order, max_nodes=max_nodes, bound_only=bound_only, host_s=host_s,
                                     links_of=links_of)
                    trials.append(Trial(schedule, m, v, global_batch // m, part))
                except ValueError as e:
                    trials.append(Trial(schedule, m, v, global_batch // m, None, str(e)))
    trials.sort(key=lambda t: (t.step_s, max(t.partition.memory_bytes) if t.partition else 0, t.micro_batches))
    if not trials or trials[0].partition is None:
        raise ValueError("no schedule and micro-batch count can run: " + "; ".join(
            f"{t.schedule} M={t.micro_batches}: {t.error}" for t in trials[:4]))
    return ScheduleChoice(trials[0].partition, trials)

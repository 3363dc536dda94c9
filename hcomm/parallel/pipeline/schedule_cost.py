"""Predicted step time of a pipeline whose stages run at different speeds.

The textbook bubble ``(p-1)/(M+p-1)`` assumes every stage takes the same
time; on a mixed cluster they do not, so this module simulates the schedule
instead.  Each rank runs its own ordered list of actions (``F``/``B`` of one
micro-batch on one stage); an action starts when its rank is free and its
input has arrived:

- ``F(k, m)`` needs stage k-1's output of micro-batch m, moved across the
  boundary (stage 0 reads its data at time 0);
- ``B(k, m)`` needs stage k+1's input gradient of m, moved back (the last
  stage needs only its own ``F(k, m)``: the loss is part of the head's cost).

A transfer starts when its producer ends and its link is free: each ordered
pair of ranks is one first-in-first-out channel (full duplex: the two
directions are separate), so a slow link carrying many micro-batches becomes
the bottleneck it really is; where ranks sit in islands, every transfer out of
an island takes that island's uplink out and the other island's uplink in
(``costs.PipelineCosts`` with ``links_of``), which the pipeline's other transfers
between the same islands share.  The wire is asynchronous (the producer goes on
computing), but each end of a transfer spends some of its own time on it:
``PipelineCosts`` adds ``host_s(a, b, bytes)`` to an action for every message
it sends or receives (a message's CPU work competes with the computation
beside it).  The step ends when the last backward ends; the optimizer step,
data loading and the loss reduction are not included.

Schedules and the in-flight activations they imply (micro-batches whose
forward has run on a stage and whose backward has not, per rank):

==================  ====================================================
``gpipe``           all forwards, then all backwards in the same order
                    (torch ``ScheduleGPipe``); every stage holds M.
``1f1b``            stage s of p runs ``min(p - s, M)`` forwards, then
                    alternates one backward, one forward, then the rest of
                    the backwards (torch ``Schedule1F1B``); stage s holds
                    ``min(p - s, M)``.
``interleaved-1f1b``  v stages per rank: stage k runs on rank ``k % p``.
                    The order is torch's ``ScheduleInterleaved1F1B``
                    (torch 2.13, ``_get_1f1b_rank_ops``): rounds
                    ``R = max(1, M // p)``, ``mpr = M // R`` micro-batches per
                    round, rank r first runs ``W_r = min((v-1)*mpr +
                    2*(p-1-r), v*M)`` forwards, then pairs (F, B), then the
                    remaining backwards.  Rank r holds at most
                    ``min(W_r + 1, v*M)`` (stage, micro-batch) activations.
==================  ====================================================

``lower_bound`` gives proven lower bounds of the simulated time (dependency
paths), which the partitioner prunes with; ``costs.PipelineCosts`` turns device
profiles, link times and memory budgets into the per-stage numbers above.

torch requires ``M % R == 0`` for the interleaved schedule (its "flex"
rule, which relaxes Megatron's ``M % p == 0``), and its ``Schedule1F1B``
class refuses ``M < p``; the orders here are valid for any ``M >= 1`` and can
be run as a custom ``pipeline_order``, so only the interleaved rule is
enforced.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Dict, Hashable, List, NamedTuple, Optional, Sequence, Tuple

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


class Action(NamedTuple):
    """One step of a rank's order: forward or backward of one micro-batch on one stage."""
    kind: str        # "F" or "B"
    microbatch: int
    stage: int       # pipeline (virtual) stage; runs on rank ``stage % num_ranks``


def check_schedule(schedule: str, micro_batches: int, num_ranks: int, virtual_stages: int = 1) -> None:
    """Raise ValueError unless ``schedule`` can run ``micro_batches`` on ``num_ranks`` ranks."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; supported: {', '.join(SCHEDULES)}")
    if num_ranks < 1:
        raise ValueError(f"a pipeline needs at least 1 rank, got {num_ranks}")
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
    if schedule == "interleaved-1f1b":
        if virtual_stages < 2:
            raise ValueError(f"interleaved-1f1b needs virtual_stages >= 2 stages per rank, got {virtual_stages}; "
                             f"with one stage per rank use 1f1b")
        rounds = max(1, micro_batches // num_ranks)
        if micro_batches % rounds:
            ok = [m for m in range(max(1, micro_batches - num_ranks), micro_batches + num_ranks + 1)
                  if m % max(1, m // num_ranks) == 0]
            raise ValueError(f"interleaved-1f1b on {num_ranks} ranks cannot run {micro_batches} micro-batches: "
                             f"torch's ScheduleInterleaved1F1B splits them into max(1, M // {num_ranks}) = "
                             f"{rounds} rounds and needs M divisible by that (nearby allowed M: "
                             f"{', '.join(map(str, ok))})")
    elif virtual_stages != 1:
        raise ValueError(f"{schedule} runs one stage per rank; virtual_stages must be 1, got {virtual_stages}")


def allowed_micro_batches(schedule: str, micro_batches: int, num_ranks: int, virtual_stages: int = 1) -> bool:
    try:
        check_schedule(schedule, micro_batches, num_ranks, virtual_stages)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------- orders

# An op is an action as the simulation reads it: (is forward, stage, micro-batch).  The orders are
# built as ops and turned into ``Action``s only when asked (at 4,096 devices the planner simulates
# ~10^6 actions; building each as a named tuple cost more than simulating it).
Op = Tuple[bool, int, int]


def _gpipe(stage: int, m: int) -> List[Op]:
    return [(True, stage, i) for i in range(m)] + [(False, stage, i) for i in range(m)]


def _one_f_one_b(stage: int, p: int, m: int) -> List[Op]:
    warmup = min(m, p - stage)
    order = [(True, stage, i) for i in range(warmup)]
    for b in range(m):                  # torch's "1B1F": a backward, then the next forward if any
        order.append((False, stage, b))
        if warmup + b < m:
            order.append((True, stage, warmup + b))
    return order


def interleaved_warmup(rank: int, p: int, m: int, v: int) -> int:
    """Forwards rank ``rank`` runs before its first backward in torch's Interleaved1F1B."""
    per_round = m // max(1, m // p)
    return min((v - 1) * per_round + 2 * (p - 1 - rank), m * v)


def _interleaved(rank: int, p: int, m: int, v: int) -> List[Op]:
    # A transcription of torch's ScheduleInterleaved1F1B._calculate_single_rank_operations and
    # _get_1f1b_rank_ops (torch 2.13) without the no-op padding: the same actions in the same order.
    per_round = m // max(1, m // p)
    warmup = interleaved_warmup(rank, p, m, v)
    steady = m * v - warmup
    fwd_next: Dict[int, int] = {}
    bwd_next: Dict[int, int] = {}
    order: List[Op] = []

    def forward(op: int) -> None:
        stage = ((op // per_round) % v) * p + rank
        fwd_next[stage] = fwd_next.get(stage, 0) + 1
        order.append((True, stage, fwd_next[stage] - 1))

    def backward(op: int) -> None:
        stage = (v - 1 - ((op - warmup) // per_round) % v) * p + rank
        bwd_next[stage] = bwd_next.get(stage, 0) + 1
        order.append((False, stage, bwd_next[stage] - 1))

    for op in range(warmup + steady + warmup):
        if op < warmup:
            forward(op)
        elif op < warmup + steady:
            forward(op)
            backward(op)
        else:
            backward(op)
    return order


class Orders:
    """Each rank's ordered ops, with what the simulation and the memory model read from them: the peak
    in-flight counts, per rank and per stage.  ``actions``: the same orders as ``Action``s."""

    def __init__(self, ops: List[List[Op]], rank_peak: Optional[List[int]] = None,
                 actions: Optional[Sequence[Sequence[Action]]] = None):
        self.ops = ops
        self._actions = actions
        self.rank_peak = rank_peak if rank_peak is not None else [int(x) for x in rank_in_flight(self.actions)]
        stages = [{op[1] for op in order} for order in ops]
        self.only_stage = [next(iter(s)) if len(s) == 1 else None for s in stages]
        self._stage_peak: Dict[int, List[int]] = {}

    @classmethod
    def of(cls, actions: Sequence[Sequence[Action]]) -> "Orders":
        return cls([[(kind == "F", stage, mb) for kind, mb, stage in order] for order in actions], actions=actions)

    @property
    def actions(self) -> Sequence[Sequence[Action]]:
        if self._actions is None:
            new = tuple.__new__   # Action's own constructor parses its arguments in Python: 3x slower
            self._actions = tuple(tuple(new(Action, ("F" if fwd else "B", mb, stage)) for fwd, stage, mb in order)
                                  for order in self.ops)
        return self._actions

    def stage_peak(self, num_stages: int) -> List[int]:
        if num_stages not in self._stage_peak:
            self._stage_peak[num_stages] = stage_in_flight(self.actions, num_stages)
        return self._stage_peak[num_stages]

    def weighted_peak(self, weights: Sequence[float]) -> List[float]:
        """``rank_in_flight(actions, weights)``; a rank that runs one stage holds count x its weight."""
        if all(s is not None for s in self.only_stage):
            return [weights[s] * n for s, n in zip(self.only_stage, self.rank_peak)]
        return rank_in_flight(self.actions, weights)


@lru_cache(maxsize=256)
def standard(schedule: str, p: int, m: int, v: int = 1) -> Orders:
    """The schedule's own orders (valid arguments: ``check_schedule``), their peaks from the closed forms
    (the tests hold those to the orders)."""
    if schedule == "gpipe":
        ops = [_gpipe(s, m) for s in range(p)]
    elif schedule == "1f1b":
        ops = [_one_f_one_b(s, p, m) for s in range(p)]
    else:
        ops = [_interleaved(r, p, m, v) for r in range(p)]
    orders = Orders(ops, [in_flight_formula(schedule, r, p, m, v) for r in range(p)])
    if v == 1:
        orders._stage_peak[p] = list(orders.rank_peak)    # one stage per rank, stage k on rank k
    return orders


def action_orders(schedule: str, num_ranks: int, micro_batches: int, virtual_stages: int = 1) -> List[List[Action]]:
    """Each rank's ordered actions (rank r = pipeline position r): what a runtime executes."""
    check_schedule(schedule, micro_batches, num_ranks, virtual_stages)
    return [list(order) for order in standard(schedule, num_ranks, micro_batches, virtual_stages).actions]


def stage_in_flight(orders: Sequence[Sequence[Action]], num_stages: int) -> List[int]:
    """Most micro-batches each stage holds activations for at once (forward run, backward not yet)."""
    peak = [0] * num_stages
    for order in orders:
        held: Dict[int, int] = {}
        for a in order:
            held[a.stage] = held.get(a.stage, 0) + (1 if a.kind == "F" else -1)
            peak[a.stage] = max(peak[a.stage], held[a.stage])
    return peak


def rank_in_flight(orders: Sequence[Sequence[Action]], weights: Optional[Sequence[float]] = None) -> List[float]:
    """Per rank, the peak over its order of the in-flight (stage, micro-batch) activations,
    each weighted by ``weights[stage]`` (bytes per micro-batch); counts when ``weights`` is None."""
    out = []
    for order in orders:
        held = peak = 0
        for a in order:
            w = 1 if weights is None else weights[a.stage]
            held += w if a.kind == "F" else -w
            peak = max(peak, held)
        out.append(peak)
    return out


def in_flight_formula(schedule: str, rank: int, num_ranks: int, micro_batches: int, virtual_stages: int = 1) -> int:
    """The closed forms of the module docstring (the tests check them against the orders)."""
    p, m, v = num_ranks, micro_batches, virtual_stages
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(p - rank, m)
    return min(interleaved_warmup(rank, p, m, v) + 1, v * m)


# ---------------------------------------------------------------- simulation

@dataclass
class Simulation:
    step_s: float
    busy_s: List[float]            # per rank: seconds of forward + backward compute
    peak_in_flight: List[int]      # per rank: (stage, micro-batch) activations held at once
    simulated: Orders = field(repr=False)
    start_s: Dict[Action, float] = field(default_factory=dict)
    end_s: Dict[Action, float] = field(default_factory=dict)

    @property
    def orders(self) -> List[List[Action]]:
        """Per rank, the order simulated."""
        return [list(o) for o in self.simulated.actions]

    @property
    def bubble_fraction(self) -> float:
        """Share of rank-seconds spent idle: (p-1)/(M+p-1) for equal stages without transfers."""
        if self.step_s <= 0:
            return 0.0
        return 1.0 - sum(self.busy_s) / (len(self.busy_s) * self.step_s)


def simulate(fwd_s: Sequence[float], bwd_s: Sequence[float], send_s: Sequence[float], micro_batches: int,
             schedule: str = "1f1b", virtual_stages: int = 1, grad_send_s: Optional[Sequence[float]] = None,
             orders: Optional[Sequence[Sequence[Action]]] = None, timeline: bool = False,
             channels: Optional[Callable[[int, int], Tuple[Hashable, ...]]] = None) -> Simulation:
    """Simulate one step.

    ``fwd_s[k]``/``bwd_s[k]``: seconds of one micro-batch on stage k (``len = ranks * virtual_stages``;
    stage k on rank ``k % ranks``).  ``send_s[k]``: seconds to move one micro-batch's activation from
    stage k to k+1; ``grad_send_s[k]`` the gradient back (default: the same).  ``orders`` replaces the
    schedule's own orders (the schedule then only names the rank count rule).  ``timeline`` keeps each
    action's start and end.  ``channels(src, dst)``: the links a transfer from rank src to rank dst
    occupies, each carrying one transfer at a time in the order they are sent (default: its own link per
    ordered pair; transfers between islands share the islands' uplinks, ``PipelineCosts.channels``).
    """
    stages = len(fwd_s)
    v = virtual_stages
    if stages < 1 or stages % v or len(bwd_s) != stages:
        raise ValueError(f"need forward and backward seconds for ranks x {v} stages; got {len(fwd_s)} and {len(bwd_s)}")
    if len(send_s) != stages - 1:
        raise ValueError(f"{stages} stages have {stages - 1} boundaries; got {len(send_s)} send times")
    grad = list(send_s) if grad_send_s is None else list(grad_send_s)
    if len(grad) != stages - 1:
        raise ValueError(f"{stages} stages have {stages - 1} boundaries; got {len(grad)} gradient send times")
    p, m = stages // v, micro_batches
    if orders is None:
        check_schedule(schedule, m, p, v)
        run_orders = standard(schedule, p, m, v)
    else:
        run_orders = Orders.of(orders)

    # Each boundary's transfer, both ways: the channel indices it occupies and its seconds (None: it
    # is instant, both stages on one rank or nothing to send).  Channels are FIFO in the order sent.
    index: Dict[Hashable, int] = {}

    def route(src: int, dst: int, seconds: float) -> Optional[Tuple[Tuple[int, ...], float]]:
        if src == dst or seconds <= 0:
            return None
        links = channels(src, dst) if channels is not None else ((src, dst),)
        return tuple(index.setdefault(c, len(index)) for c in links), seconds

    ahead = [route(k % p, (k + 1) % p, send_s[k]) for k in range(stages - 1)] + [None]
    back = [None] + [route((k + 1) % p, k % p, grad[k]) for k in range(stages - 1)]
    # Everything the result depends on, the channels as the sharing pattern they make: the planner asks
    # for the same standard-order step again and again (40 % of its simulated actions at 4,096 devices)
    key = None if orders is not None or timeline else \
        (schedule, p, m, v, tuple(fwd_s), tuple(bwd_s), tuple(ahead), tuple(back))
    if key in _SEEN:
        _SEEN.move_to_end(key)
        last, busy = _SEEN[key]
        return Simulation(last, list(busy), list(run_orders.rank_peak), run_orders)
    sim = _run(run_orders, fwd_s, bwd_s, ahead, back, len(index), m, timeline)
    if key is not None:
        _SEEN[key] = (sim.step_s, list(sim.busy_s))
        if len(_SEEN) > SEEN_SIZE:
            _SEEN.popitem(last=False)
    return sim


SEEN_SIZE = 1024
_SEEN: "OrderedDict[tuple, Tuple[float, List[float]]]" = OrderedDict()   # least recently used first


def _run(run_orders: Orders, fwd_s: Sequence[float], bwd_s: Sequence[float], ahead: list, back: list,
         n_channels: int, m: int, timeline: bool) -> Simulation:
    """The event loop: ranks in turn run their next actions whose inputs have arrived."""
    stages, p = len(fwd_s), len(run_orders.ops)
    channel_free = [0.0] * n_channels
    last_stage = stages - 1

    # flat per (stage, micro-batch): index k * m + mb
    f_in: List[Optional[float]] = [0.0] * m + [None] * (m * (stages - 1))
    b_in: List[Optional[float]] = [None] * (m * stages)
    f_end: List[Optional[float]] = [None] * (m * stages)
    free, busy, pos = [0.0] * p, [0.0] * p, [0] * p
    starts: Dict[Action, float] = {}
    ends: Dict[Action, float] = {}
    last = 0.0

    remaining = sum(len(o) for o in run_orders.ops)
    while remaining:
        progressed = False
        for r in range(p):
            ops, i = run_orders.ops[r], pos[r]
            first = i
            while i < len(ops):
                fwd, k, mb = ops[i]
                at = k * m + mb
                if fwd:
                    ready = f_in[at]
                else:   # a backward listed before its forward is an invalid order: it never gets ready
                    ready = f_end[at]
                    if ready is not None and k != last_stage:
                        ready = b_in[at]
                if ready is None:
                    break
                begin = free[r] if free[r] > ready else ready
                dur = fwd_s[k] if fwd else bwd_s[k]
                free[r] = end = begin + dur
                busy[r] += dur
                if fwd:
                    f_end[at] = end
                    hop, target, to = ahead[k], f_in, at + m
                else:
                    hop, target, to = back[k], b_in, at - m
                if k != (last_stage if fwd else 0):
                    if hop is None:
                        target[to] = end
                    else:
                        links, seconds = hop
                        start = end
                        for c in links:
                            if channel_free[c] > start:
                                start = channel_free[c]
                        target[to] = done = start + seconds
                        for c in links:
                            channel_free[c] = done
                if timeline:
                    a = run_orders.actions[r][i]
                    starts[a], ends[a] = begin, end
                if end > last:
                    last = end
                i += 1
            if i > first:
                remaining -= i - first
                pos[r] = i
                progressed = True
        if not progressed:
            stuck = ", ".join(f"rank {r} at {run_orders.actions[r][pos[r]]}" for r in range(p)
                              if pos[r] < len(run_orders.ops[r]))
            raise ValueError(f"the action order deadlocks: {stuck}")
    return Simulation(last, busy, list(run_orders.rank_peak), run_orders, starts, ends)


def step_time(fwd_s: Sequence[float], bwd_s: Sequence[float], send_s: Sequence[float], micro_batches: int,
              schedule: str = "1f1b", virtual_stages: int = 1,
              grad_send_s: Optional[Sequence[float]] = None) -> Tuple[float, List[float], List[int]]:
    """(step seconds, per-rank busy seconds, per-rank peak in-flight micro-batches); see ``simulate``."""
    sim = simulate(fwd_s, bwd_s, send_s, micro_batches, schedule, virtual_stages, grad_send_s)
    return sim.step_s, sim.busy_s, sim.peak_in_flight


# ---------------------------------------------------------------- lower bounds

def path_terms(schedule: str, stage: int, num_ranks: int, micro_batches: int, f: float, b: float) -> Tuple[float, float]:
    """(one, two) for stage s of p (one stage per rank, forward f and backward b per micro-batch):
    with A the work and transfers of the stages before s and RT the round trip of one micro-batch
    from s to the last stage and back (their work and transfers), ``T >= A + RT + one`` and
    ``T >= A + 2*RT + two``.  Both are paths through the dependency graph:

    - ``one``: the stage's last forward waits for every action before it in its order, then its
      micro-batch makes the round trip; or its first backward waits for micro-batch 0's round trip
      and every later action follows it.  GPipe: (M-1)*max(f, b); 1F1B past its warm-up of
      W = min(p-s, M): max((M-1)f + (M-W)b, (M-1)b + (M-W)f);
    - ``two`` (1F1B, M > W): forward W+j follows backward j, which waits for micro-batch j's round
      trip, so the last forward waits two round trips: (M-W-1)*(f+b); -inf where there is no such path.
    """
    m, warm = micro_batches, min(num_ranks - stage, micro_batches)
    if schedule == "1f1b" and m > warm:
        return max((m - 1) * f + (m - warm) * b, (m - 1) * b + (m - warm) * f), (m - warm - 1) * (f + b)
    return (m - 1) * max(f, b), -math.inf


def lower_bound(fwd_s: Sequence[float], bwd_s: Sequence[float], send_s: Sequence[float], micro_batches: int,
                schedule: str = "1f1b", virtual_stages: int = 1, grad_send_s: Optional[Sequence[float]] = None) -> float:
    """A proven lower bound of ``simulate(...).step_s`` (same arguments), from dependency paths only:

    - rank r: ``A_r + M * (its stages' f + b)``: it cannot start before micro-batch 0 reaches its first
      stage (A_r: the work and transfers of the stages before it), and after its last backward the
      gradient still crosses those stages;
    - boundary k: ``A_k + f_k + b_k + max(M*cf + cb, cf + M*cb)``: M transfers each way on a FIFO link;
    - one stage per rank: ``path_terms``; GPipe, every stage running all forwards before any
      backward: ``sum(f + b + transfers) + (M-1) * (max f + max b)``.
    """
    stages, v, m = len(fwd_s), virtual_stages, micro_batches
    p = stages // v
    grad = list(send_s) if grad_send_s is None else list(grad_send_s)
    if p == 1:   # every stage on one rank: nothing crosses a link (as in simulate)
        send_s, grad = [0.0] * (stages - 1), [0.0] * (stages - 1)
    w = [f + b for f, b in zip(fwd_s, bwd_s)]
    hop = [cf + cb for cf, cb in zip(send_s, grad)] + [0.0]
    trip = [0.0] * (stages + 1)
    for k in range(stages - 1, -1, -1):
        trip[k] = w[k] + hop[k] + trip[k + 1]
    bound = A = 0.0
    for k in range(stages):
        if k < p:
            bound = max(bound, A + m * sum(w[k::p]))
        if k < stages - 1:
            bound = max(bound, A + w[k] + max(m * send_s[k] + grad[k], send_s[k] + m * grad[k]))
        if v == 1:
            one, two = path_terms(schedule, k, p, m, fwd_s[k], bwd_s[k])
            bound = max(bound, A + trip[k] + one, A + 2 * trip[k] + two)
        A += w[k] + hop[k]
    if schedule == "gpipe":
        bound = max(bound, A + (m - 1) * (max(fwd_s) + max(bwd_s)))
    return bound

"""The step-time model every choice is made with.

Built from measured parts only: each rank's per-piece forward/backward
seconds (``DeviceProfile``, at its real speed), and the comm layer's own
prediction of each collective (``hcomm.plan``: alpha-beta per tier, the
algorithm hcomm would pick).  Nothing here knows about a particular cluster.

A data-parallel step on rank r with ``n_r`` samples in micro-batches of
``m_r``: forward+backward of every micro-batch (linear in samples: the
profile's per-sample cost; a simplification that is exact for the matmuls
and slightly pessimistic for tiny batches), then the optimizer.  Gradient
buckets are filled in backward order during the *last* micro-batch's
backward; bucket j can start when every rank has filled it, and buckets go
out one after another (one stream per group, as hcomm's executor runs them):

    start_j = max(ready_j, end_{j-1}),  end_j = start_j + allreduce(bytes_j)
    step    = max(max_r compute_r, end_last) + optimizer

so a bucket size trades latency per bucket (many small ones) against
overlap (one big one waits for the whole backward).  A rank with no samples
is ready at once.  A bucket reduced while ranks still compute runs slower
(the measured slowdown beside computation), by as much of it as the ranks
still computing press on the CPU (``slowdown_phases``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

AllReduceTime = Callable[[int], float]  # bytes -> seconds on the group


@dataclass
class StepEstimate:
    step_s: float
    compute_s: List[float]          # per rank, forward + backward of all its samples
    comm_total_s: float             # sum of the bucket all-reduces
    comm_exposed_s: float           # what the slowest rank's compute did not hide
    optimizer_s: float
    outer_s: float = 0.0            # amortised cross-island outer sync (DiLoCo), per step
    buckets: int = 0
    detail: List[str] = field(default_factory=list)

    @property
    def bottleneck(self) -> str:
        if self.comm_exposed_s + self.outer_s > 0.25 * self.step_s:
            return "communication"
        return "compute"


def model_shape(profile) -> Tuple[int, int]:
    """(dim, blocks) of the reference model a profile measured: its pieces are [embed, *blocks, norm,
    head] and the norm holds one fp32 weight per feature."""
    return profile.layers[-2].param_bytes // 4, len(profile.layers) - 3


def per_sample(profile) -> Tuple[List[float], List[float]]:
    """(forward, backward) seconds per sample of each piece."""
    mb = float(profile.micro_batch)
    return [c.fwd_s / mb for c in profile.layers], [c.bwd_s / mb for c in profile.layers]


def gradient_layout(profile) -> List[int]:
    """Gradient bytes of each piece in the order backward produces them (last piece first)."""
    return [c.grad_bytes for c in reversed(profile.layers)]


def bucket_plan(grad_bytes_backward: Sequence[int], bucket_bytes: int) -> List[Tuple[int, int]]:
    """(bytes, index of the piece whose backward completes the bucket) per bucket.

    Pieces are split across buckets at ``bucket_bytes`` boundaries, which is
    what packing parameters gives for pieces made of many parameters.
    """
    out: List[Tuple[int, int]] = []
    filled = 0
    for piece, nbytes in enumerate(grad_bytes_backward):
        if filled:   # top up the open bucket first
            take = min(nbytes, bucket_bytes - filled)
            filled += take
            nbytes -= take
            if filled >= bucket_bytes:
                out.append((filled, piece))
                filled = 0
        full, filled_now = divmod(nbytes, bucket_bytes)   # then whole buckets at once (a 7B model has ~10^4)
        out.extend([(bucket_bytes, piece)] * full)
        filled += filled_now
    if filled:
        out.append((filled, len(grad_bytes_backward) - 1))
    return out


def rank_compute(profile, samples: int, micro_batch: int) -> Tuple[float, List[float]]:
    """(forward+backward seconds, time each backward piece finishes in the last micro-batch)."""
    if samples <= 0:
        return 0.0, [0.0] * len(profile.layers)
    fwd, bwd = per_sample(profile)
    m = max(1, min(micro_batch or samples, samples))
    last = samples - m * (math.ceil(samples / m) - 1)
    total = samples * (sum(fwd) + sum(bwd))
    t = total - last * sum(bwd)
    done = []
    for b in reversed(bwd):
        t += last * b
        done.append(t)
    return total, done


def beside_compute(t: float, start: float, compute_end: float, slowdown: float) -> float:
    """Seconds a collective of ``t`` seconds alone takes when it starts at ``start`` and the computation
    beside it ends at ``compute_end``: ``slowdown`` times slower until then, at full speed after."""
    return beside_phases(t, start, [(compute_end, slowdown)])


def beside_phases(t: float, start: float, phases: Sequence[Tuple[float, float]]) -> float:
    """``beside_compute`` with a slowdown that changes as ranks finish computing: ``phases`` are (until,
    slowdown) in time order, full speed after the last."""
    now, left = start, t
    for until, slowdown in phases:
        if now >= until:
            continue
        slowdown = max(1.0, slowdown)
        span = until - now
        if left * slowdown <= span:
            return now + left * slowdown - start
        left -= span / slowdown
        now = until
    return now + left - start


def slowdown_phases(compute: Sequence[float], slowdown: float,
                    weights: Optional[Sequence[float]] = None) -> List[Tuple[float, float]]:
    """(until, slowdown) while the ranks compute: the measured slowdown of collectives beside computation
    (every rank computing: ``calibration.overlap_slowdown``) scaled by the share of ``weights`` (each
    rank's fraction of a core, ``ClusterView.cpu_share``; equal when not measured) still computing.

    Where communication is slowed by the computation's demand on the CPU (an emulated rank's quota, a
    host-staged transfer on a busy host), ranks that have finished their backward no longer press on it.
    Measured on ``mixed``, equal batches (the A100s done at ~0.8 s, the V100s at ~1.65 s): 106-130 ms of
    the sync exposed, where the full slowdown to the V100s' end predicted 449 ms; with data parallelism
    by speed (every rank computing to the end) 530-543 ms against 619."""
    if slowdown <= 1.0 or not compute:
        return []
    w = list(weights) if weights else [1.0] * len(compute)
    total = sum(w) or 1.0
    computing, phases = total, []
    for r in sorted(range(len(compute)), key=lambda r: compute[r]):
        if compute[r] > (phases[-1][0] if phases else 0.0):
            phases.append((compute[r], 1.0 + (slowdown - 1.0) * computing / total))
        computing -= w[r]
    return phases


def group_allreduce_s(view, ranks: Sequence[int], nbytes: int, spanning: Optional[AllReduceTime] = None,
                      uplink_bytes: Optional[Dict[int, int]] = None) -> float:
    """Seconds of one all-reduce of ``nbytes`` over ``ranks``: inside one island its island's curve; over
    every rank, or with a curve given (``spanning``: a compressed weak tier), the whole group's; over
    some ranks of several islands a ring through them in island order on the measured point-to-point
    links (2 (n - 1) steps of nbytes / n, each as slow as the slowest hop).  The whole group's curve is
    the comm layer's plan for all the islands (every rank, every uplink); a TP pair or a stage's
    replicas across two islands run a two- or three-rank collective over one or two of the links.
    ``uplink_bytes``: per island, the bytes all the groups reducing at once push through its uplink;
    with each island's own uplink measured (``inter@<island>``) a hop between two islands takes as long
    as the busier of its two uplinks needs for its share, else every hop moves the share of the busiest
    uplink the group uses at the slowest pair's link."""
    islands = {view.island_of(r) for r in ranks}
    if len(islands) == 1:
        return view.island_allreduce_s[next(iter(islands))](nbytes)
    load = uplink_bytes or {}
    busiest = max([nbytes, *(load.get(i, 0) for i in islands)])
    if spanning is not None or len(ranks) == view.world_size or not view.links:
        return (spanning or view.allreduce_s)(busiest)
    ring = sorted(ranks, key=lambda r: (view.island_of(r), r))
    n = len(ring)
    own = {i: view.links.get(f"inter@{i}") for i in islands}

    def hop(a: int, b: int) -> float:
        ia, ib = view.island_of(a), view.island_of(b)
        if ia == ib:
            return view.p2p_s(a, b, -(-nbytes // n))
        if not (own[ia] and own[ib]):
            return view.p2p_s(a, b, -(-busiest // n))
        return max(own[ia][0], own[ib][0]) + max(max(nbytes, load.get(i, 0)) / n / own[i][1] for i in (ia, ib))

    return 2 * (n - 1) * max(hop(a, b) for a, b in zip(ring, ring[1:] + ring[:1]))


def meeting_s(view, ranks: Sequence[int]) -> float:
    """Seconds each meeting point of ``ranks`` (a TP collective between their computations) costs beyond
    the collective: the measured spread of their arrivals (``calibration.meeting_s``), the worst of their
    islands'; 0 where not measured."""
    if len(ranks) < 2 or not view.island_meeting_s:
        return 0.0
    return max(view.island_meeting_s[view.island_of(r)] for r in ranks)


def side_by_side_allreduce_s(view, jobs: Sequence[Tuple[Sequence[int], int]],
                             spanning: Optional[AllReduceTime] = None) -> float:
    """Seconds until the last of several all-reduces issued at the same time finishes; ``jobs``: (ranks,
    bytes) per group (the replicas of each pipeline stage, the ranks at each TP position).

    A group inside one island takes its island's curve (the groups hold different ranks, which move
    their bytes at once).  Groups that span islands share the islands' uplinks: each is charged its own
    all-reduce (``group_allreduce_s``) with the bytes that all spanning groups together push through
    each uplink (measured on ``two-islands``, pp=2: two stage groups across the one link took 0.91 s,
    one of them alone is predicted at 0.49 s): each hop at its own two uplinks' loads where every
    island's uplink was measured, else every hop at the busiest one's.  ``spanning``: the whole group's
    curve to charge instead (the compressed one where the weak tier compresses).
    """
    crossing = [(ranks, nbytes, {view.island_of(r) for r in ranks}) for ranks, nbytes in jobs]
    load: Dict[int, int] = {}
    for _, nbytes, islands in crossing:
        if len(islands) > 1:
            for i in islands:
                load[i] = load.get(i, 0) + nbytes
    worst = 0.0
    for ranks, nbytes, islands in crossing:
        if not nbytes:
            continue
        worst = max(worst, group_allreduce_s(view, ranks, nbytes, spanning, uplink_bytes=load))
    return worst


def dp_step(profiles: Sequence, counts: Sequence[int], bucket_bytes: int, allreduce_s: AllReduceTime, *,
            micro_batches: Optional[Sequence[int]] = None, optimizer_s: float = 0.0,
            outer_every: int = 1, outer_s: float = 0.0, overlap_slowdown: float = 1.0,
            compute_weights: Optional[Sequence[float]] = None) -> StepEstimate:
    """Predicted seconds of one data-parallel step (see the module docstring); ``compute_weights``: each
    rank's weight in the slowdown beside computation while it computes (``slowdown_phases``)."""
    if len(profiles) != len(counts):
        raise ValueError(f"{len(profiles)} profiles for {len(counts)} ranks")
    micro = list(micro_batches or [0] * len(counts))
    # ranks of one device class share their piece list (a large cluster): compute each (class, samples,
    # micro-batch) once
    seen: Dict[tuple, Tuple[float, List[float]]] = {}
    per_rank = []
    for p, n, m in zip(profiles, counts, micro):
        key = (id(p.layers), p.micro_batch, n, m)
        if key not in seen:
            seen[key] = rank_compute(p, n, m)
        per_rank.append(seen[key])
    compute = [c for c, _ in per_rank]
    buckets = bucket_plan(gradient_layout(profiles[0]), bucket_bytes)
    # A large model has thousands of buckets of a few sizes: the ready time per piece and the all-reduce
    # time per size are computed once (the planner calls this hundreds of times per plan).
    ready_at = [max(ts) for ts in zip(*(done for _, done in seen.values()))]
    seconds: Dict[int, float] = {}
    end = 0.0
    comm_total = 0.0
    slowest = max(compute)
    phases = slowdown_phases(compute, overlap_slowdown, compute_weights)
    for nbytes, piece in buckets:
        ready = ready_at[piece]
        t = seconds.get(nbytes)
        if t is None:
            t = seconds[nbytes] = allreduce_s(nbytes)
        comm_total += t
        start = max(ready, end)
        end = start + beside_phases(t, start, phases)

    amortised_outer = outer_s / outer_every if outer_every > 1 else 0.0
    step = max(slowest, end) + optimizer_s + amortised_outer
    return StepEstimate(step, compute, comm_total, max(0.0, end - slowest), optimizer_s, amortised_outer,
                        len(buckets))

"""The comm layer's collective predictions held to a measurement of the same collectives on the live groups.

The planner's view samples the comm layer's alpha-beta model of each group (``cluster.discover``).  A
collective also costs CPU time per call and per byte (the Python call, the executor's hand-off, copies
and reductions, polling a peer), which a model of links alone does not hold, and on a rank with a
fraction of a core (an emulated device, a CPU-bound host) that CPU time *is* the collective's time.
Measured on ``mixed`` (2026-12-04, means over back-to-back calls): across the 50 MB/s link the model is
within 8 % of the measurement from 64 KiB to 16 MiB, while inside an island (shared memory, ranks with
0.45 and 0.22 of a core) a 64 KiB all-reduce took 2.2 / 3.3 ms against 0.05 ms predicted (the CPU time
per call, 0.7-0.8 ms, divided by the quota), 16 MiB 2.8x / 5.2x the model.

So at discovery every group the plans price runs each collective the planner uses (all_reduce,
all_gather_v, reduce_scatter_v) at ``CALIBRATION_BYTES``; the ratio measured / predicted at each size is
a correction the view applies to the model's curve, interpolated in log-bytes between the sizes and
held at the end values outside.  The model keeps the shape (which algorithm at which size, how time
grows with bytes); the measurement sets the level.

Why a mean over a window, not a median of a few calls: an emulated rank's CPU quota is enforced per
period (4-7 ms), so a short call either fits in the period's budget (fast) or waits for the next one (slow):
a median of three calls landed anywhere between the two (corrections of 8-50x in an earlier attempt).
Calls back to back for at least ``WINDOW_S`` span many periods, and their mean is what a call adds to a
training step on that rank.  Every rank of a group runs the same number of calls (agreed first: a
collective count that differed between ranks would hang) and takes the slowest rank's mean (a
collective ends for all when the slowest ends), so every rank gets the same view.
"""
from __future__ import annotations

import bisect
import math
import time
from typing import Callable, Dict, List, Sequence, Tuple

import torch

from hcomm.settings import declare

AllReduceTime = Callable[[int], float]
OPS = ("all_reduce", "all_gather_v", "reduce_scatter_v")
# torch's own all-reduce on the group it is given (the baseline's: torch DDP over the default gloo group).
# The view priced it with hcomm's ring model uncorrected; measured on ``uneven`` (6 ranks, uplinks of 150,
# 100 and 50 MB/s) gloo took 0.68-0.72x that model from 1 to 25 MiB and 2.1x at 64 KiB, and the baseline
# plan was predicted 16-27 % slow in every accuracy record.
BASELINE_OP = "ddp all_reduce"
# total bytes of the buffer each collective is timed on: per-call costs dominate the first, bandwidth the last
CALIBRATION_BYTES = (64 << 10, 1 << 20, 8 << 20)
MIN_CALLS = 3
MAX_CALLS = 200
# A correction outside this range says the measurement went wrong (a stall of seconds), not the model.
BOUNDS = (0.1, 500.0)

HCOMM_CALIBRATE_S = declare(
    "HCOMM_CALIBRATE_S", 0.1,
    "seconds of back-to-back calls per collective and size when hcomm train holds the comm model's "
    "predictions to measurement on its groups, and about 8x that of an island's TP meeting rounds (0: no "
    "calibration, the model as it is)", float)


def window_s() -> float:
    value = HCOMM_CALIBRATE_S.get()
    if value < 0:
        raise ValueError(f"HCOMM_CALIBRATE_S must be >= 0 seconds, got {value}")
    return value


def _call(op: str, group, nbytes: int) -> Callable[[], None]:
    import torch.distributed as dist

    import hcomm

    known = OPS + (BASELINE_OP,)
    if op not in known:
        raise ValueError(f"no calibration for collective {op!r}; known: {', '.join(known)}")
    n = dist.get_world_size(group)
    if op == BASELINE_OP:
        whole = torch.ones(max(1, nbytes // 4))
        return lambda: dist.all_reduce(whole, group=group)
    share = max(1, nbytes // 4 // n)
    if op == "all_reduce":
        t = torch.ones(share * n)
        return lambda: hcomm.all_reduce(t, group=group)
    if op == "all_gather_v":
        out, mine = torch.empty(share * n), torch.ones(share)
        return lambda: hcomm.all_gather_v(out, mine, [share] * n, group=group)
    whole, mine = torch.ones(share * n), torch.empty(share)
    return lambda: hcomm.reduce_scatter_v(mine, whole, [share] * n, group=group)


def _slowest(value: float, group) -> float:
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _call_count(window: float, per_call: float) -> int:
    """Calls that fill ``window`` at ``per_call`` seconds each, within [MIN_CALLS, MAX_CALLS]; from a
    time every rank agrees on, so every rank makes the same number of calls."""
    return max(MIN_CALLS, min(MAX_CALLS, int(window / max(per_call, 1e-6))))


def measure(op: str, group, nbytes: int, window: float) -> float:
    """Mean seconds per call of ``op`` on ``group`` over a ``nbytes`` buffer, calls back to back for about
    ``window`` seconds, the slowest rank's mean (every rank returns the same)."""
    call = _call(op, group, nbytes)
    start = time.perf_counter()
    call()   # warm-up (connections, scratch buffers), and a first estimate of the call's length
    first = _slowest(time.perf_counter() - start, group)
    calls = _call_count(window, first)
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return _slowest((time.perf_counter() - start) / calls, group)


def corrections(group, curves: Sequence[Tuple[str, AllReduceTime]], window: float) -> List[List[float]]:
    """Per (op, model curve): measured / predicted at each of ``CALIBRATION_BYTES``, within ``BOUNDS``."""
    out = []
    for op, curve in curves:
        ratios = []
        for nbytes in CALIBRATION_BYTES:
            ratio = measure(op, group, nbytes, window) / max(curve(nbytes), 1e-9)
            ratios.append(min(max(ratio, BOUNDS[0]), BOUNDS[1]))
        out.append(ratios)
    return out


def corrected(curve: AllReduceTime, ratios: Sequence[float]) -> AllReduceTime:
    """``curve`` times the measured correction, interpolated in log-bytes between ``CALIBRATION_BYTES``
    (held at the end values outside them)."""
    if all(r == 1.0 for r in ratios):
        return curve
    logs = [math.log(n) for n in CALIBRATION_BYTES]
    logr = [math.log(r) for r in ratios]

    def predict(nbytes: int) -> float:
        x = math.log(max(nbytes, 1))
        if x <= logs[0]:
            factor = logr[0]
        elif x >= logs[-1]:
            factor = logr[-1]
        else:
            i = bisect.bisect_right(logs, x) - 1
            w = (x - logs[i]) / (logs[i + 1] - logs[i])
            factor = logr[i] + w * (logr[i + 1] - logr[i])
        return curve(nbytes) * math.exp(factor)

    return predict


def _sizes(sizes: Sequence[int]) -> str:
    return "/".join(f"{n >> 10} KiB" if n < (1 << 20) else f"{n >> 20} MiB" for n in sizes)


def describe(factors: Dict[str, Sequence[float]]) -> str:
    """One line: each calibrated curve's measured / predicted ratios at ``CALIBRATION_BYTES`` (point to
    point links at ``P2P_BYTES``)."""
    return f"collectives measured / predicted at {_sizes(CALIBRATION_BYTES)}: " + "; ".join(
        f"{name} " + "/".join(f"{r:.2f}" for r in ratios) + (
            f" (at {_sizes(P2P_BYTES)})" if name.startswith("p2p@") else
            f" (ms at {_sizes(P2P_BYTES)})" if name.startswith("host@") else
            " (ms per meeting)" if name.startswith("meeting@") else
            " (of a core, per rank)" if name == "cpu share" else "")
        for name, ratios in factors.items())


# --- point to point (pipeline boundaries) ------------------------------------------------------------

P2P_BYTES = (64 << 10, 1 << 20)
P2P_ROUND_TRIPS = (48, 16)   # a 64 KiB fit from 16 round trips moved 4-21x between runs (CPU-quota periods)


def _one_way_s(group, me: int, peer: int, nbytes: int, round_trips: int) -> Tuple[float, float]:
    """Mean one-way seconds of ``nbytes`` between this rank and ``peer`` (global ranks, both in ``group``),
    sent and received through the group as a pipeline stage does (the lower rank leads), and the CPU
    seconds this process spent per message it sent or received (every thread: the backend's too)."""
    import torch.distributed as dist

    buf = torch.ones(max(1, nbytes // 4))
    lead = me < peer

    def trip():
        if lead:
            dist.send(buf, peer, group=group)
            dist.recv(buf, peer, group=group)
        else:
            dist.recv(buf, peer, group=group)
            dist.send(buf, peer, group=group)

    trip()   # warm-up: the pair's connection
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(round_trips):
        trip()
    return (time.perf_counter() - start) / (2 * round_trips), (time.process_time() - cpu) / (2 * round_trips)


def cpu_share(seconds: float) -> float:
    """The fraction of a core this process gets while every rank computes (a one-thread busy loop's CPU
    seconds over its wall seconds; 1 on a free core, the quota or the fair share of a crowded host
    below): what turns a message's CPU seconds into seconds of the rank's time."""
    wall, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall < seconds:
        sum(range(1000))
    return min(1.0, max(1e-3, (time.process_time() - cpu) / (time.perf_counter() - wall)))


def _fit(times: Sequence[float]) -> Tuple[float, float]:
    """(alpha, beta) through the two sizes' one-way times: the line the link model is."""
    (n1, n2), (t1, t2) = P2P_BYTES, times
    beta = (n2 - n1) / (t2 - t1) if t2 > t1 else float("inf")
    return max(0.0, t1 - n1 / beta), beta


SHARE_MIN_WINDOW_S = 0.1


def cpu_shares(default_group, window: float = 0.1) -> List[float]:
    """Every rank's ``cpu_share``, measured on all ranks at once (for ``window`` / 2), on every rank: what a
    message's CPU seconds cost each rank (``ClusterView.p2p_host_s``).  On ``mixed`` the V100 ranks get
    about half the A100s' share, and their pipeline actions' sends and receives took twice as long.

    The ranks start together (a barrier: a rank that loops while others still finish the last collective
    has a core to itself) and loop at least ``SHARE_MIN_WINDOW_S`` / 2, whatever the window: with 0.03 s
    windows (the tests' launches) 4 unshaped ranks on 2 cores read 0.96 / 0.66 / 0.24 / 0.61."""
    import torch.distributed as dist

    dist.barrier(group=default_group)
    mine = torch.tensor([cpu_share(max(window, SHARE_MIN_WINDOW_S) / 2)], dtype=torch.float64)
    shares = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size(default_group))]
    dist.all_gather(shares, mine, group=default_group)
    return [float(x) for x in shares]


def p2p_links(topo, group, default_group, window: float = 0.1) -> Dict[str, Tuple[float, float]]:
    """Measured (alpha, beta) of the "intra" tier (ranks 0 and 1 of every island at once; the slowest
    island's) and the "inter" tier (island 0's first rank with each other island's, in turn; the
    slowest pair's), every rank getting the same.  The comm layer's link probe's pairs
    (``hcomm.profiling.probe_pairs``), but timed through ``send``/``recv`` on the group with everything a
    pipeline's transfer costs on top of the wire.

    Also "host@intra" and "host@inter": the (alpha, beta) of the CPU seconds one end of such a transfer
    spends on it (what it takes of a rank's time is that over the rank's share of a core,
    ``cpu_shares``).  Measured 2026-12-04 per 64 KiB message, over the share: 0.5-0.9 ms of a 1 ms
    one-way time between two emulated ranks sharing memory, 0.07-0.14 ms of 1.2 ms across a TCP link."""
    import torch.distributed as dist

    from hcomm.profiling import probe_pairs

    rank = dist.get_rank()
    n = len(topo.islands)
    # per island: intra (alpha, beta, host alpha, host beta); then the same for inter
    slots = torch.zeros(8 * n, dtype=torch.float64)

    def probe(peer: int, slot: int, record: bool):
        timed = [_one_way_s(group, rank, peer, b, k) for b, k in zip(P2P_BYTES, P2P_ROUND_TRIPS)]
        alpha, beta = _fit([wall for wall, _ in timed])
        host_alpha, host_beta = _fit([cpu for _, cpu in timed])
        if record:
            slots[slot:slot + 4] = torch.tensor([alpha, min(beta, 1e15), host_alpha, min(host_beta, 1e15)],
                                                dtype=torch.float64)

    for tier, i, peer, lead in probe_pairs(topo, rank):
        probe(peer, 4 * i if tier == "intra" else 4 * n + 4 * i, lead)
    dist.all_reduce(slots, group=default_group)
    links: Dict[str, Tuple[float, float]] = {}
    inter = [slots[4 * n + 4 * j:4 * n + 4 * j + 4].tolist() for j in range(1, n)]
    for tier, fits in (("intra", [slots[4 * i:4 * i + 4].tolist() for i in range(n) if slots[4 * i + 1] > 0]),
                       ("inter", inter)):
        if fits:   # the slowest pair's: largest alpha, smallest beta
            links[tier] = (max(f[0] for f in fits), min(f[1] for f in fits))
            links[f"host@{tier}"] = (max(f[2] for f in fits), min(f[3] for f in fits))
    if n > 2:   # each island's own (``ClusterView.p2p_s``): island j's from its pair with island 0, which
        # then has at least the fastest pair's (a pair runs at the slower of its two uplinks)
        for j, f in enumerate(inter, start=1):
            links[f"inter@{j}"] = (f[0], f[1])
        links["inter@0"] = (min(f[0] for f in inter), max(f[1] for f in inter))
    return links


def link_ratios(model: Tuple[float, float], measured: Tuple[float, float]) -> List[float]:
    """measured / model one-way time at each of ``P2P_BYTES`` (for the record)."""
    return [(measured[0] + n / measured[1]) / (model[0] + n / model[1]) for n in P2P_BYTES]


# --- communication beside computation ----------------------------------------------------------------

OVERLAP_BYTES = 1 << 20
OVERLAP_BOUNDS = (1.0, 10.0)


def overlap_slowdown(group, window: float) -> float:
    """How much slower the group's all-reduces run while every rank computes beside them: mean seconds per
    call issued asynchronously with a matmul loop running until they finish, over the same calls with
    nothing else running (the slowest rank's, every rank gets the same).

    Gradient buckets are reduced while backward still runs.  Where the communication needs the CPU the
    computation saturates (an emulated rank's fraction of a core, a host-staged transfer on a busy
    host), it runs slower then than alone; where computation runs elsewhere (a GPU) the ratio is ~1."""
    import torch.distributed as dist

    alone = measure("all_reduce", group, OVERLAP_BYTES, 2 * window)
    calls = _call_count(2 * window, alone)   # agreed: every rank has the same slowest mean
    tensors = [torch.ones(OVERLAP_BYTES // 4) for _ in range(2)]
    x = torch.randn(96, 96)
    start = time.perf_counter()
    works = [dist.all_reduce(tensors[k % 2], group=group, async_op=True) for k in range(calls)]
    while not all(w.is_completed() for w in works):
        x = torch.tanh(x @ x)   # the computation a backward would be doing
    for w in works:
        w.wait()
    beside = _slowest((time.perf_counter() - start) / calls, group)
    return min(max(beside / max(alone, 1e-9), OVERLAP_BOUNDS[0]), OVERLAP_BOUNDS[1])


# --- meeting points (a TP group's collectives between its members' computation) -----------------------

MEETING_BYTES = 512 << 10     # the order of a TP all-reduce of the small model (8 rows x 64 tokens x 384 fp32: 768 KiB)
MEETING_COMPUTE_S = 0.02      # a member's computation between two meetings (traced on the small model: ~25 ms)
MEETING_ROUNDS = (16, 64)
MEETING_BOUNDS = (0.0, 0.1)


def meeting_s(group, window: float, allreduce_s: AllReduceTime) -> float:
    """Seconds one meeting point of ``group`` costs beyond the computation and ``allreduce_s`` (the view's
    all-reduce curve for the group): rounds of "compute about ``MEETING_COMPUTE_S`` at this rank's own
    speed, then all-reduce ``MEETING_BYTES``", the mean round less the slowest member's mean computation
    in those same rounds and the curve at ``MEETING_BYTES`` (every rank gets the same).

    A TP group meets in every layer (4 all-reduces per block and step), each member's computation cut to
    end with the others'.  Where the members' time is shared out in slices (an emulated rank's CPU quota
    per 4-7 ms period, a crowded host's scheduler) they do not arrive together: the first waits for the
    last, and an all-reduce that starts with the quota spent waits for the next period; the all-reduce
    timed back to back sees neither.  Traced on ``mixed`` (pipeline of TP groups, 2026-12-06): chunks
    1-13 ms per meeting above their computation and all-reduces.  The computation is timed inside the
    rounds, not from a separate rate: on 0.2-0.5 of a core a rate measured apart moved by more than the
    effect (meetings of -3.8 to +8.8 ms from one loop).  On devices that run their kernels alone the
    rounds equal their parts and this is ~0."""
    import hcomm

    x = torch.randn(256, 256)

    def work():
        nonlocal x
        x = torch.tanh(x @ x)

    start, done = time.perf_counter(), 0
    while time.perf_counter() - start < window / 2 or done < 2:   # a rough rate: how many per round
        work()
        done += 1
    iters = max(1, round(done / (time.perf_counter() - start) * MEETING_COMPUTE_S))
    t = torch.ones(MEETING_BYTES // 4)
    lo, hi = MEETING_ROUNDS
    rounds = max(lo, min(hi, int(8 * window / _slowest(MEETING_COMPUTE_S + allreduce_s(MEETING_BYTES), group))))
    computing = 0.0
    start = time.perf_counter()
    for _ in range(rounds):
        began = time.perf_counter()
        for _ in range(iters):
            work()
        computing += time.perf_counter() - began
        hcomm.all_reduce(t, group=group)
    per_round = _slowest((time.perf_counter() - start) / rounds, group)
    excess = per_round - _slowest(computing / rounds, group) - allreduce_s(MEETING_BYTES)
    return min(max(excess, MEETING_BOUNDS[0]), MEETING_BOUNDS[1])

"""What the planner knows about the cluster: ranks, islands, profiles, link costs.

``ClusterView`` is plain data plus cost callables, so planning is a pure
function that tests can drive with synthetic profiles.  ``discover`` builds
it on a live job: the hcomm group's topology (islands, devices), every
rank's measured ``DeviceProfile`` (exchanged through the store), and the
comm layer's own all-reduce predictions for the global group and for each
island's group.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

AllReduceTime = Callable[[int], float]


@dataclass
class ClusterView:
    devices: List[str]                       # device kind per rank
    islands: List[List[int]]                 # global ranks of each island
    profiles: List                           # DeviceProfile per rank
    allreduce_s: AllReduceTime               # bytes -> seconds over every rank (hcomm)
    island_allreduce_s: List[AllReduceTime]  # per island, over its ranks
    optimizer_s: List[float]                 # measured optimizer step per rank
    baseline_allreduce_s: Optional[AllReduceTime] = None  # the torch baseline's (gloo ring) for comparison
    island_names: List[str] = field(default_factory=list)
    compressed_allreduce_s: Dict[str, AllReduceTime] = field(default_factory=dict)  # by weak-tier wire format
    # ZeRO's collectives, by the total bytes of the gathered (or reduced) buffer; every rank / per island
    gather_s: Optional[AllReduceTime] = None
    reduce_scatter_s: Optional[AllReduceTime] = None
    island_gather_s: List[AllReduceTime] = field(default_factory=list)
    island_reduce_scatter_s: List[AllReduceTime] = field(default_factory=list)
    # point to point (pipeline boundaries): tier -> (alpha seconds, beta bytes/s), "intra" and "inter"
    links: Dict[str, tuple] = field(default_factory=dict)
    # measured / predicted per collective at calibration.CALIBRATION_BYTES, by "op" (every rank) and
    # "op@<island>"; the curves above already carry them (empty: the model uncorrected)
    calibration: Dict[str, List[float]] = field(default_factory=dict)
    # how much slower the whole group's all-reduces run beside computation than alone (measured; 1: no
    # measurement): the gradient buckets that overlap backward pay it
    overlap_slowdown: float = 1.0
    # each rank's profile measured again under the autocast of its kind's best low-precision dtype
    # (``--precision search``; empty when not measured): ``planner.dtypes`` weighs the two
    low_precision_profiles: List = field(default_factory=list)
    # per island, the seconds a meeting point of its ranks costs beyond the computation and the collective
    # (``calibration.meeting_s``; empty: not measured, nothing): every TP collective pays it
    island_meeting_s: List[float] = field(default_factory=list)
    # per rank, the fraction of a core it gets while every rank computes (``calibration.cpu_shares``; empty:
    # not measured, a whole core): a message's CPU seconds over it are that rank's time
    cpu_share: List[float] = field(default_factory=list)

    def p2p_s(self, a: int, b: int, nbytes: int) -> float:
        """Seconds to send ``nbytes`` from rank a to rank b: the alpha-beta model of the tier joining them
        (the comm layer's measured or configured link; no links known: free).  Between islands whose own
        uplinks were measured (``inter@<island>``: three islands or more, ``calibration.p2p_links``) the
        slower of the two, else the slowest pair's ``inter``: on ``uneven`` (uplinks of 150, 100 and 50
        MB/s) every hop was priced at the 910B island's 50 MB/s."""
        if a == b or not self.links:
            return 0.0
        ia, ib = self.island_of(a), self.island_of(b)
        tier = "intra" if ia == ib else "inter"
        own = [self.links.get(f"inter@{i}") for i in (ia, ib)] if tier == "inter" else [None]
        if all(own):
            alpha, beta = max(own[0][0], own[1][0]), min(own[0][1], own[1][1])
        else:
            alpha, beta = self.links.get(tier) or self.links.get("flat") or next(iter(self.links.values()))
        return alpha + nbytes / beta

    def transfer_links(self, a: int, b: int) -> tuple:
        """The links a point-to-point transfer from rank a to rank b occupies, one transfer at a time each:
        inside an island its own pair's; between islands the sending island's uplink out and the receiving
        island's uplink in, which every transfer between those islands shares (a node's NIC; on the
        emulator the node's shaped uplink, both ways at its bandwidth).  Measured on ``two-islands``
        (pp=4, 16 micro-batches of 1, every boundary across the islands): the ranks computed 220-718 ms
        of a 950 ms step; with a channel per pair the schedule predicted 889 ms."""
        ia, ib = self.island_of(a), self.island_of(b)
        return ((a, b),) if ia == ib else (("out", ia), ("in", ib))

    def p2p_host_s(self, a: int, b: int, nbytes: int) -> float:
        """Seconds of rank a's own time its end of one pipeline transfer of ``nbytes`` between a and b
        costs it while the ranks compute: the measured CPU seconds of a message on that tier
        (``calibration.p2p_links``, "host@intra" / "host@inter") over rank a's share of a core
        (``cpu_share``; unmeasured: a whole core), times the measured slowdown of communication beside
        computation.  Without that measurement: nothing.  On ``two-islands`` a schedule that charged no
        host time predicted 815 ms for a measured 964 ms (pp=4, 16 micro-batches of 1: 64 messages per
        rank); on ``mixed`` one share for every rank (the lead's) charged the V100 ranks, with half the
        A100s' share, half their time outside the chunks."""
        if a == b:
            return 0.0
        tier = "intra" if self.island_of(a) == self.island_of(b) else "inter"
        fit = self.links.get(f"host@{tier}")
        if fit is None:
            return 0.0
        alpha, beta = fit
        share = self.cpu_share[a] if self.cpu_share else 1.0
        return (alpha + nbytes / beta) / share * self.overlap_slowdown

    def allreduce(self, compression: str = "none") -> AllReduceTime:
        """All-reduce time over every rank with ``compression`` on the weak tier."""
        if compression in ("", "none"):
            return self.allreduce_s
        if compression not in self.compressed_allreduce_s:
            raise KeyError(f"no all-reduce prediction sampled for compression {compression!r}")
        return self.compressed_allreduce_s[compression]

    @property
    def world_size(self) -> int:
        return len(self.devices)

    def island_of(self, rank: int) -> int:
        # one dict lookup, the dict rebuilt when the islands list is replaced: the pipeline simulation asks
        # for every transfer (4.7 M calls planning 4,096 devices), and a scan of the islands per call took
        # 3 of its 12 s
        cached = self.__dict__.get("_island_index")
        if cached is None or cached[0] is not self.islands:
            cached = self.__dict__["_island_index"] = (
                self.islands, {r: i for i, members in enumerate(self.islands) for r in members})
        try:
            return cached[1][rank]
        except KeyError:
            raise ValueError(f"rank {rank} is in no island of this view") from None


# Sizes at which the comm layer's model is sampled: every power of two from
# 1 KiB to 4 GiB; in between, log-log interpolation (the model is smooth there).
SAMPLE_BYTES = [1 << k for k in range(10, 33)]


def sample_allreduce(group, algorithm: Optional[str] = None) -> List[float]:
    """The comm layer's predicted all-reduce seconds on ``group`` at ``SAMPLE_BYTES``."""
    import hcomm

    if algorithm:
        return [float(hcomm.predict("all_reduce", n, algorithm, group=group)) for n in SAMPLE_BYTES]
    return [float(hcomm.plan("all_reduce", n, group=group)["predicted_seconds"]) for n in SAMPLE_BYTES]


def interpolated(samples: Sequence[float]) -> AllReduceTime:
    """bytes -> seconds from samples at ``SAMPLE_BYTES`` (log-log; clamped at the ends)."""
    logs = [math.log(n) for n in SAMPLE_BYTES]
    values = [math.log(max(t, 1e-12)) for t in samples]

    def predict(nbytes: int) -> float:
        x = math.log(max(nbytes, SAMPLE_BYTES[0]))
        if x >= logs[-1]:
            # beyond the table the time grows linearly in bytes
            return math.exp(values[-1]) * nbytes / SAMPLE_BYTES[-1]
        i = bisect.bisect_right(logs, x) - 1
        w = (x - logs[i]) / (logs[i + 1] - logs[i])
        return math.exp(values[i] + w * (values[i + 1] - values[i]))

    return predict


def sample_sharded(group, op: str) -> List[float]:
    """Predicted seconds of ``all_gather_v`` or ``reduce_scatter_v`` of a buffer of ``SAMPLE_BYTES``
    in total, shared evenly by the group's ranks (the comm layer's plan, as it would run it)."""
    import torch.distributed as dist

    import hcomm

    n = dist.get_world_size(group)
    return [float(hcomm.plan(op, max(4, b // n), group=group)["predicted_seconds"]) for b in SAMPLE_BYTES]


def sample_compressed(group, compression: str) -> List[float]:
    """Predictions with ``compression`` on the group's weak tier (the cost model counts wire bytes)."""
    import hcomm

    hcomm.set_compression(compression, group=group)
    try:
        return sample_allreduce(group)
    finally:
        hcomm.set_compression("none", group=group)


def discover(default_group, hcomm_group, island_group, profiles: List, optimizer_s: List[float],
             compressions: Sequence[str] = (), calibrate_s: Optional[float] = None,
             baseline: bool = False) -> ClusterView:
    """The view of a live job; every rank calls it and gets the same view.

    A rank can only ask the comm layer about groups it belongs to, so each
    rank samples its own island's group and the samples are exchanged over
    ``default_group``.  With ``calibrate_s`` > 0 (default: ``HCOMM_CALIBRATE_S``) every curve is
    held to a measurement of the same collective on the same group (``calibration.py``): each
    island times its own group's, then every rank the whole group's.  ``baseline``: a plan runs torch
    DDP over ``default_group`` (``uniform``), so torch's all-reduce there is timed too and the baseline's
    ring curve held to it.
    """
    import torch.distributed as dist

    import hcomm
    from hcomm.parallel import calibration

    window = calibration.window_s() if calibrate_s is None else calibrate_s
    topo = hcomm.topology(hcomm_group)
    names = [topo.ranks[m[0]].island for m in topo.islands]
    ops = calibration.OPS
    zeros = [0.0] * len(SAMPLE_BYTES)
    ones = [[1.0] * len(calibration.CALIBRATION_BYTES)] * len(ops)
    mine = [sample_allreduce(island_group), sample_sharded(island_group, "all_gather_v"),
            sample_sharded(island_group, "reduce_scatter_v")] if island_group is not None else [zeros] * 3
    # a one-rank island has nothing to time: its "collectives" are local copies the model prices at ~0,
    # and the ratio hit its bound (500x on uneven's lone 910B) for curves no plan uses
    timed = island_group is not None and window > 0 and dist.get_world_size(island_group) > 1
    island_ratios = calibration.corrections(island_group, list(zip(ops, map(interpolated, mine))), window) \
        if timed else ones
    meeting = calibration.meeting_s(island_group, window, calibration.corrected(interpolated(mine[0]),
                                                                                island_ratios[0])) \
        if timed else 0.0
    gathered: List = [None] * dist.get_world_size(default_group)
    dist.all_gather_object(gathered, (mine, island_ratios, meeting), group=default_group)
    island_predictors = [[calibration.corrected(interpolated(gathered[members[0]][0][k]),
                                                gathered[members[0]][1][k]) for members in topo.islands]
                         for k in range(3)]
    whole = [interpolated(sample_allreduce(hcomm_group)), interpolated(sample_sharded(hcomm_group, "all_gather_v")),
             interpolated(sample_sharded(hcomm_group, "reduce_scatter_v"))]
    ratios = calibration.corrections(hcomm_group, list(zip(ops, whole)), window) if window > 0 else ones
    measured: Dict[str, List[float]] = {}
    links = {tier: (link.alpha, link.beta) for tier, link in topo.links.items()}
    slowdown, shares = 1.0, []
    ring = interpolated(sample_allreduce(hcomm_group, "ring"))   # the torch baseline's, by hcomm's model
    ring_ratios = [1.0] * len(calibration.CALIBRATION_BYTES)
    if window > 0:
        slowdown = calibration.overlap_slowdown(hcomm_group, window)
        measured["all_reduce beside compute"] = [slowdown]
        shares = calibration.cpu_shares(default_group, window)
        measured["cpu share"] = shares
        timed = calibration.p2p_links(topo, hcomm_group, default_group, window)
        for tier, fit in timed.items():
            if tier in links:
                measured[f"p2p@{tier}"] = calibration.link_ratios(links[tier], fit)
            elif tier.startswith("host@"):   # milliseconds at P2P_BYTES, not a ratio
                measured[tier] = [1e3 * (fit[0] + n / fit[1]) for n in calibration.P2P_BYTES]
            links[tier] = fit
        measured.update({op: r for op, r in zip(ops, ratios)})
        if baseline:
            ring_ratios = calibration.corrections(default_group, [(calibration.BASELINE_OP, ring)], window)[0]
            measured[calibration.BASELINE_OP] = ring_ratios
        if island_group is not None:
            measured.update({f"{op}@{names[i]}": gathered[m[0]][1][k] for i, m in enumerate(topo.islands)
                             for k, op in enumerate(ops) if len(m) > 1})
            measured.update({f"meeting@{names[i]}": [1e3 * gathered[m[0]][2]] for i, m in enumerate(topo.islands)
                             if len(m) > 1})
    return ClusterView(
        devices=[r.device for r in topo.ranks], islands=[list(m) for m in topo.islands],
        profiles=list(profiles), allreduce_s=calibration.corrected(whole[0], ratios[0]),
        island_allreduce_s=island_predictors[0], optimizer_s=list(optimizer_s),
        gather_s=calibration.corrected(whole[1], ratios[1]),
        reduce_scatter_s=calibration.corrected(whole[2], ratios[2]),
        island_gather_s=island_predictors[1], island_reduce_scatter_s=island_predictors[2],
        baseline_allreduce_s=calibration.corrected(ring, ring_ratios),
        island_names=names,
        links=links,
        # compression changes the bytes on the weak tier, not the per-call costs: the plain all-reduce's
        # correction is the best measurement there is for it
        compressed_allreduce_s={c: calibration.corrected(interpolated(sample_compressed(hcomm_group, c)), ratios[0])
                                for c in sorted(set(compressions) - {"", "none"})},
        calibration=measured, overlap_slowdown=slowdown,
        island_meeting_s=[gathered[m[0]][2] for m in topo.islands], cpu_share=shares)

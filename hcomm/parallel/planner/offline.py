"""A ``ClusterView`` of a cluster that cannot be measured: from its spec and published figures.

``view_from_spec`` reads the cluster spec (the emulator's YAML format,
``hcomm.emulate.spec``) and builds what ``cluster.discover`` measures on a
live job: per-rank profiles (``figures.analytic_profile``, or a measured
profile per device kind), optimizer seconds, point-to-point links and
closed-form collective costs.  Ranks of one class (device kind, memory,
speed) share one profile object and no cost loops over pairs of ranks, so
a view of thousands of devices takes milliseconds.

A rank's ``speed`` (0 < s <= 1) divides all its times by s, as the
emulator's CPU quota does, so the presets plan as they run.

Collectives: three tiers of rings, alpha-beta (alpha per step, beta bytes/s),
a ring of c members moving S bytes costs (c-1) alpha + (c-1)/c S / beta:

- node: the ranks of a node over the device's intra-node link (NVLink/HCCS);
- island: the nodes of an island over their uplinks (a hop crosses two);
- across: the islands over the uplinks.

A reduce-scatter of B bytes runs them inward out: every node reduce-scatters
B over its n ranks, then each rank's B/n shard is reduce-scattered across
the island's m nodes -- the n concurrent rings of a node share its uplink,
which so carries (m-1)/m B -- then each rank's B/k shard (k ranks in its
island) across the g islands, the uplink carrying n (g-1)/g B/k.  Each tier
takes its slowest member (the smallest bandwidth, the largest alpha):

    RS(B) = max_node[(n-1) a_link + (n-1)/n B / b_link]
          + max_island[(m-1) a_up + (m-1)/m B / b_up_min]
          + (g-1) a_across + (g-1)/g B max_node[n / (k b_up)]
    all-reduce(B) = 2 RS(B)   (the all-gather retraces the reduce-scatter)
    all-gather(B) = RS(B)     (B = the gathered buffer's total bytes, ZeRO's convention)

Per island: the node and island tiers of its own nodes.  With one island and
one node this is the classic ring, 2(n-1) alpha + 2(n-1)/n B / beta.  Compressed
wire formats shrink the across tier's bytes only (``WIRE_RATIO``).  The
comm layer's "hier" all-reduce exchanges the shards directly across islands,
(g-1) shards per owner: the same as this ring for two islands.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Optional, Tuple, Union

from hcomm.emulate.spec import ClusterSpec, NodeSpec, load_spec
from hcomm.models.llama import LlamaConfig
from hcomm.parallel.cluster import ClusterView
from hcomm.parallel.devices import DEVICE_KINDS
from hcomm.parallel.planner.figures import USABLE_FRACTION, DeviceFigures, analytic_profile, figures_for
from hcomm.parallel.profile import DeviceProfile

# Wire bytes per data byte on the across-island tier, by compression (fp32 gradients on the wire otherwise).
WIRE_RATIO = {"bf16": 0.5, "fp16": 0.5, "fp8e4m3": 0.25, "fp8e5m2": 0.25}
# One AdamW step reads parameter, gradient, exp_avg and exp_avg_sq and writes parameter, exp_avg and
# exp_avg_sq, all fp32: 28 B per parameter through HBM (a fused kernel; torch's foreach path makes more passes).
ADAMW_STEP_BYTES = 28


def _kind(name: str) -> str:
    """The table's spelling of a device kind; an unknown label stays as written."""
    known = DEVICE_KINDS.get(name.strip().upper())
    return known.name if known is not None else name


def _ring(count: int, alpha: float, beta: float, nbytes: float) -> float:
    return (count - 1) * alpha + (count - 1) / count * nbytes / beta if count > 1 else 0.0


class _Collectives:
    """The tiered ring model of the module docstring, reduced to a few constants per node shape and island."""

    def __init__(self, spec: ClusterSpec, islands: Dict[str, List[NodeSpec]], link: Dict[str, Tuple[float, float]]):
        def node_shape(node: NodeSpec) -> Tuple[int, float, float]:
            links = [link[_kind(r.device)] for r in node.ranks]
            return len(node.ranks), max(a for a, _ in links), min(b for _, b in links)

        def two_worst(nodes) -> float:   # a hop between two nodes crosses both uplinks
            lat = sorted((n.latency_s for n in nodes), reverse=True)
            return lat[0] + (lat[1] if len(lat) > 1 else lat[0])

        # per island: its distinct node shapes, and its (nodes, uplink alpha, slowest uplink) tier
        self.node_shapes = [sorted({node_shape(n) for n in nodes}) for nodes in islands.values()]
        self.island_tier = [(len(nodes), two_worst(nodes), min(n.uplink_bandwidth_bps for n in nodes))
                            for nodes in islands.values()]
        sizes = [sum(len(n.ranks) for n in nodes) for nodes in islands.values()]
        self.islands = len(islands)
        self.across_alpha = two_worst(spec.nodes)
        # seconds per byte of B on the across tier: the node whose uplink carries the most per byte of bandwidth
        self.across_s_per_byte = max(len(n.ranks) / (k * n.uplink_bandwidth_bps)
                                     for nodes, k in zip(islands.values(), sizes) for n in nodes)

    def _inner(self, i: int, nbytes: float) -> float:
        node = max(_ring(n, a, b, nbytes) for n, a, b in self.node_shapes[i])
        return node + _ring(*self.island_tier[i], nbytes)

    def reduce_scatter(self, nbytes: float, ratio: float = 1.0) -> float:
        g = self.islands
        inner = max(self._inner(i, nbytes) for i in range(g))
        if g == 1:
            return inner
        return inner + (g - 1) * self.across_alpha + (g - 1) / g * nbytes * ratio * self.across_s_per_byte

    def island_reduce_scatter(self, i: int):
        return lambda nbytes: self._inner(i, nbytes)


def _figures(kind: str, figures: Optional[Mapping[str, DeviceFigures]], has_profile: bool) -> DeviceFigures:
    try:
        return figures_for(kind, figures)
    except ValueError:
        if not has_profile:
            raise
        raise ValueError(f"device kind {kind!r}: profiles= gives its compute, but its intra-node link and HBM "
                         f"bandwidth (the optimizer step) still need "
                         f"figures={{{kind!r}: DeviceFigures(...)}}") from None


def _class_profile(kind: str, memory: int, rank: int, config: LlamaConfig, dtype: str, mfu: float, micro_batch: int,
                   seq_len: int, measured: Optional[DeviceProfile], figures: DeviceFigures):
    if measured is not None:
        # A measured profile brings times and sizes; the memory budget is this rank's, as on a live job.
        if len(measured.layers) != config.n_layers + 3:
            raise ValueError(f"profiles[{kind!r}] has {len(measured.layers)} pieces; the model has "
                             f"{config.n_layers + 3} (embed, {config.n_layers} blocks, norm, head)")
        budget = int(memory * USABLE_FRACTION)
        return dataclasses.replace(measured, rank=rank, device=kind, memory_budget_bytes=budget,
                                   baseline_bytes=memory - budget)
    if dtype == "per-device":   # bf16 where the kind has it (no loss scaling), else fp16, as precision.py picks
        dtype = next(d for d in ("bf16", "fp16", "fp32") if d in figures.peak_flops)
    try:
        return analytic_profile(config, figures, micro_batch=micro_batch, seq_len=seq_len,
                                dtype=dtype, mfu=mfu, memory_bytes=memory, rank=rank)
    except ValueError as exc:
        if "cannot compute" in str(exc):
            raise ValueError(f"rank {rank}: {exc} (dtype='per-device' gives each kind its best)") from None
        raise


def view_from_spec(spec: Union[ClusterSpec, str], config: Union[LlamaConfig, str], *, micro_batch: int, seq_len: int,
                   dtype: str = "bf16", mfu: float = 0.45, profiles: Optional[Mapping[str, DeviceProfile]] = None,
                   figures: Optional[Mapping[str, DeviceFigures]] = None) -> ClusterView:
    """The planner's view of ``spec`` (a ``ClusterSpec``, a spec file or a preset name) for ``config``.

    ``dtype``: the compute dtype of every rank, or "per-device" (each kind's best, bf16 else fp16).
    ``profiles``: device kind -> a measured ``DeviceProfile`` used instead of the figures for that kind's
    compute (at the kind's full speed: a rank's ``speed`` still applies).  ``figures``: device kind ->
    ``DeviceFigures`` for kinds the table lacks or to replace its row; every kind needs figures for its
    link and HBM bandwidth (optimizer step), measured profile or not.
    """
    spec = load_spec(spec, max_nodes=None)   # planned for, not emulated: any size
    if isinstance(config, str):
        from hcomm.models.configs import get_config

        config = get_config(config)
    measured = {_kind(k): p for k, p in (profiles or {}).items()}
    ranks = spec.ranks
    kinds = sorted({_kind(r.device) for r in ranks})
    table = {k: _figures(k, figures, k in measured) for k in kinds}   # every kind's, or its error, up front
    classes: Dict[Tuple[str, int, float], DeviceProfile] = {}
    optimizer: Dict[Tuple[str, int, float], float] = {}
    per_rank: List[DeviceProfile] = []
    optimizer_s: List[float] = []
    for r in ranks:
        key = (_kind(r.device), r.memory_bytes, r.speed)
        if key not in classes:
            kind = key[0]
            base = _class_profile(kind, r.memory_bytes, r.rank, config, dtype, mfu, micro_batch, seq_len,
                                  measured.get(kind), table[kind])
            classes[key] = base if r.speed == 1.0 else base.slowed(1.0 / r.speed)   # at its relative speed
            params = base.param_bytes / 4   # fp32 master weights
            optimizer[key] = ADAMW_STEP_BYTES * params / table[kind].hbm_bytes_per_s / r.speed
        shared = classes[key]   # one set of piece costs per class; the rank field is each rank's own (the
        # pipeline planner tells stages apart by it), so each rank gets a shallow copy sharing the pieces
        per_rank.append(shared if shared.rank == r.rank else dataclasses.replace(shared, rank=r.rank))
        optimizer_s.append(optimizer[key])

    islands = spec.islands
    link = {k: (f.link_latency_s, f.link_bytes_per_s) for k, f in table.items()}
    model = _Collectives(spec, islands, link)
    inter_alpha = model.across_alpha
    inter_beta = min(n.uplink_bandwidth_bps for n in spec.nodes)

    def allreduce(ratio: float):
        return lambda nbytes: 2 * model.reduce_scatter(nbytes, ratio)

    island_rs = [model.island_reduce_scatter(i) for i in range(len(islands))]
    return ClusterView(
        devices=[_kind(r.device) for r in ranks],
        islands=[[r.rank for n in nodes for r in n.ranks] for nodes in islands.values()],
        profiles=per_rank, allreduce_s=allreduce(1.0),
        island_allreduce_s=[lambda nbytes, f=f: 2 * f(nbytes) for f in island_rs],
        optimizer_s=optimizer_s, island_names=list(islands),
        # error feedback (":ef") changes the numerics, not the wire bytes
        compressed_allreduce_s={c + ef: allreduce(ratio) for c, ratio in WIRE_RATIO.items() for ef in ("", ":ef")},
        gather_s=model.reduce_scatter, reduce_scatter_s=model.reduce_scatter,
        island_gather_s=list(island_rs), island_reduce_scatter_s=list(island_rs),
        # p2p: one "intra" tier for every island, the slowest kind's link (ClusterView has no node tier)
        links={"intra": (max(a for a, _ in link.values()), min(b for _, b in link.values())),
               "inter": (inter_alpha, inter_beta)})

"""The cluster as hcomm sees it: which ranks share an island, and the links.

Every rank describes itself (host, island, device kind, vendor library,
memory, speed) and the descriptions are exchanged through the group's store
when the group is created.  An *island* is a set of ranks joined by one fast
vendor fabric (NVLink, HCCS, a PCIe switch); islands may differ in size
(3+2+1).  Where a rank's island comes from, first match wins:

1. ``HCOMM_ISLAND`` (set per rank by the user or the launcher);
2. ``HCOMM_EMU_ISLAND`` (set by ``hcomm emulate run``);
3. the host name: one island per host.

``hcomm.topology(group)`` returns the :class:`Topology` of an hcomm group.
"""
from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

from hcomm.settings import declare

HCOMM_ISLAND = declare("HCOMM_ISLAND", "", "this rank's island name (default: the emulator's island, else the host name)")
HCOMM_VENDOR = declare("HCOMM_VENDOR", "", "this rank's vendor library label (default: the emulator's, else nccl on CUDA, gloo on CPU)")
HCOMM_INTER_WEIGHT = declare(
    "HCOMM_INTER_WEIGHT", 1.0,
    "this rank's relative inter-island bandwidth, for bandwidth-proportional shards (HCOMM_PROPORTIONAL_SHARDS)")
HCOMM_PROPORTIONAL_SHARDS = declare(
    "HCOMM_PROPORTIONAL_SHARDS", False,
    "size each rank's shard of the cross-island exchange by its HCOMM_INTER_WEIGHT instead of equally")


@dataclass
class RankInfo:
    rank: int
    host: str
    island: str
    device: str
    vendor: str
    memory_bytes: int
    speed: float = 1.0
    inter_weight: float = 1.0


@dataclass
class Link:
    """alpha-beta model of one tier: ``time(bytes) = alpha + bytes / beta``."""

    alpha: float  # seconds
    beta: float   # bytes per second
    source: str = "default"  # measured | cache | config | emulator-spec | default

    def time(self, nbytes: float) -> float:
        return self.alpha + nbytes / self.beta


@dataclass
class Topology:
    ranks: List[RankInfo]
    islands: List[List[int]]  # global ranks of each island, ascending; islands in order of first rank
    links: Dict[str, Link] = field(default_factory=dict)  # "intra", "inter" (and "flat" on one island)
    # Each island's uplink bandwidth (bytes/s): measured by the link probe, else
    # the emulator's spec; empty when unknown.  The hierarchical all-reduce
    # sizes each island's share of the cross-island reducing by it.
    uplinks: List[float] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def island_of(self, rank: int) -> int:
        for i, members in enumerate(self.islands):
            if rank in members:
                return i
        raise KeyError(rank)

    def uplink_sharing(self) -> List[int]:
        """Per island, the most ranks of it on one host (they share that host's NIC)."""
        out = []
        for members in self.islands:
            hosts: Dict[str, int] = {}
            for r in members:
                hosts[self.ranks[r].host] = hosts.get(self.ranks[r].host, 0) + 1
            out.append(max(hosts.values()))
        return out

    def signature(self) -> str:
        """Identifies the cluster shape, for the link-profile cache."""
        import hashlib

        shape = [[(self.ranks[r].host, self.ranks[r].island, self.ranks[r].vendor) for r in m] for m in self.islands]
        extra = os.environ.get("HCOMM_EMU_CLUSTER", "")
        return hashlib.sha1(json.dumps([shape, extra]).encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        return {"ranks": [asdict(r) for r in self.ranks], "islands": self.islands,
                "links": {k: asdict(v) for k, v in self.links.items()}, "uplinks": list(self.uplinks)}

    def __str__(self) -> str:
        lines = [f"hcomm topology: {self.world_size} ranks in {len(self.islands)} island(s)"]
        for i, members in enumerate(self.islands):
            info = self.ranks[members[0]]
            lines.append(f"  island {i} '{info.island}' ({info.vendor}): ranks {members}")
            for r in members:
                ri = self.ranks[r]
                lines.append(f"    rank {r}: host {ri.host}, {ri.device}, {ri.memory_bytes / 2**30:.1f} GiB, "
                             f"speed {ri.speed:g}")
        for tier, link in self.links.items():
            lines.append(f"  {tier:<6} alpha {link.alpha * 1e6:8.1f} us   beta {link.beta / 1e9:8.3f} GB/s   ({link.source})")
        if self.uplinks:
            lines.append("  uplinks " + ", ".join(f"island {i} {b / 1e9:.3f} GB/s" for i, b in enumerate(self.uplinks)))
        return "\n".join(lines)


def _device_and_memory() -> tuple:
    if os.environ.get("HCOMM_EMU_DEVICE"):
        return os.environ["HCOMM_EMU_DEVICE"], int(os.environ.get("HCOMM_EMU_MEMORY", "0") or 0)
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            return props.name, int(props.total_memory)
    except Exception:  # a broken CUDA install must not stop CPU groups
        pass
    pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return "cpu", int(pages * os.sysconf("SC_PAGE_SIZE")) if pages else 0


def local_info(rank: int) -> RankInfo:
    """This process's description of itself."""
    host = os.environ.get("HCOMM_EMU_NODE") or socket.gethostname()
    island = HCOMM_ISLAND.get() or os.environ.get("HCOMM_EMU_ISLAND") or host
    device, memory = _device_and_memory()
    vendor = HCOMM_VENDOR.get() or os.environ.get("HCOMM_EMU_VENDOR") or ("nccl" if device != "cpu" else "gloo")
    speed = float(os.environ.get("HCOMM_EMU_SPEED", "1.0") or 1.0)
    return RankInfo(rank, host, island, device, vendor, memory, speed, float(HCOMM_INTER_WEIGHT.get()))


def exchange(store, rank: int, size: int) -> Topology:
    """All ranks publish their RankInfo in `store` and read everyone's."""
    store.set(f"hcomm/topo/{rank}", json.dumps(asdict(local_info(rank))))
    ranks = [RankInfo(**json.loads(store.get(f"hcomm/topo/{r}"))) for r in range(size)]
    order: List[str] = []
    members: Dict[str, List[int]] = {}
    for info in ranks:
        if info.island not in members:
            order.append(info.island)
            members[info.island] = []
        members[info.island].append(info.rank)
    return Topology(ranks, [members[name] for name in order])


def from_dict(data: dict) -> Topology:
    return Topology([RankInfo(**r) for r in data["ranks"]], [list(m) for m in data["islands"]],
                    {k: Link(**v) for k, v in data.get("links", {}).items()},
                    [float(b) for b in data.get("uplinks", [])])


def topology(group=None) -> Optional[Topology]:
    """The Topology of an hcomm group (the default group when None): islands,
    per-rank host/device/vendor/memory, and the alpha-beta model of each tier."""
    import torch

    from hcomm.collectives import _backend

    text = _backend(group, torch.device("cpu")).topology_json
    return from_dict(json.loads(text)) if text else None

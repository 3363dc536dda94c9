"""Link profiling: alpha (latency) and beta (bandwidth) of every tier.

Measured at group creation with a short bounded probe (ping-pong for alpha,
a few streamed messages for beta, ``HCOMM_PROFILE_BUDGET`` seconds at most),
cached per cluster signature in ``HCOMM_PROFILE_CACHE``, and overridable:

* ``HCOMM_LINKS="intra=20e-6:5e9,inter=1e-3:1.5e8"`` (alpha seconds : beta bytes/s)
  sets tiers outright;
* ``HCOMM_PROFILE=off`` skips the probe (cache, then the emulator's spec,
  then defaults); ``force`` ignores the cache.

Only groups that span more than one island are probed: one island needs no
hierarchy.  The probe runs over the group's own gloo transports, on every
rank in the same order, so it needs no extra rendezvous.
"""
from __future__ import annotations

import json
import os
import time
from typing import Dict, List, Optional, Tuple

import torch

from hcomm.settings import declare
from hcomm.topology import Link, Topology

HCOMM_PROFILE = declare("HCOMM_PROFILE", "auto",
                        "link probe at group creation: auto (probe unless cached), force, off")
HCOMM_PROFILE_BUDGET = declare("HCOMM_PROFILE_BUDGET", 2.0, "upper bound in seconds on the link probe")
HCOMM_PROFILE_CACHE = declare("HCOMM_PROFILE_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "hcomm"),
                              "folder of cached link profiles, one file per cluster signature")
HCOMM_LINKS = declare("HCOMM_LINKS", "", "tier link models, e.g. 'intra=20e-6:5e9,inter=1e-3:1.5e8' (alpha s : beta B/s)")

DEFAULTS = {"intra": Link(20e-6, 5e9), "inter": Link(200e-6, 1.25e9)}
_TAG = 0x51000


def parse_links(text: str) -> Dict[str, Link]:
    """``intra=20e-6:5e9,inter=1e-3:1.5e8`` -> {tier: Link}; errors name the bad part."""
    out: Dict[str, Link] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            tier, model = part.split("=")
            alpha, beta = (float(x) for x in model.split(":"))
        except ValueError:
            raise ValueError(f"HCOMM_LINKS: cannot parse {part!r}; expected tier=alpha:beta") from None
        if tier not in ("intra", "inter"):
            raise ValueError(f"HCOMM_LINKS: unknown tier {tier!r} (intra, inter)")
        if alpha < 0 or beta <= 0:
            raise ValueError(f"HCOMM_LINKS: {tier} needs alpha >= 0 and beta > 0, got {alpha}, {beta}")
        out[tier] = Link(alpha, beta, "config")
    return out


def uplinks_from_emulator_spec(topo: Topology) -> list:
    """Each island's uplink (bytes/s) as an emulated cluster's spec configures it: its slowest node's."""
    path = os.environ.get("HCOMM_EMU_CLUSTER")
    if not path or not os.path.exists(path):
        return []
    try:
        from hcomm.emulate import load_spec

        spec = load_spec(path)
        names = [topo.ranks[m[0]].island for m in topo.islands]
        out = []
        for name in names:
            nodes = [n for n in spec.nodes if n.island == name]
            if not nodes:
                return []
            out.append(min(float(n.uplink_bandwidth_bps) for n in nodes))
        return out
    except Exception:
        return []


def _from_emulator_spec() -> Dict[str, Link]:
    """The configured inter-island link of an emulated cluster, if any."""
    path = os.environ.get("HCOMM_EMU_CLUSTER")
    if not path or not os.path.exists(path):
        return {}
    try:
        from hcomm.emulate import load_spec

        spec = load_spec(path)
        nodes = spec.nodes
        pairs = [(a, b) for a in nodes for b in nodes if a.island != b.island]
        if not pairs:
            return {}
        alpha = max(spec.path_latency_s(a, b) for a, b in pairs)
        beta = min(spec.path_bandwidth_bps(a, b) for a, b in pairs)
        return {"inter": Link(alpha, beta, "emulator-spec")}
    except Exception:
        return {}


def _cache_path(topo: Topology, variant: str = "") -> str:
    suffix = f"-{variant}" if variant else ""
    return os.path.join(HCOMM_PROFILE_CACHE.get(), f"links-{topo.signature()}{suffix}.json")


def _pingpong(pg, peer: int, nbytes: int, reps: int, leader: bool) -> float:
    """Seconds per one-way message of `nbytes` between `me` and `peer` (leader starts)."""
    buf = torch.zeros(max(nbytes, 1), dtype=torch.uint8)
    start = time.perf_counter()
    for _ in range(reps):
        if leader:
            pg.send([buf], peer, _TAG).wait()
            pg.recv([buf], peer, _TAG).wait()
        else:
            pg.recv([buf], peer, _TAG).wait()
            pg.send([buf], peer, _TAG).wait()
    return (time.perf_counter() - start) / (2 * reps)


def _probe_pair(pg, me: int, peer: int, leader: bool, budget: float) -> Tuple[float, float]:
    """(alpha, beta) between two ranks of `pg`, within about `budget` seconds."""
    _pingpong(pg, peer, 8, 2, leader)  # connect and warm up
    alpha = _pingpong(pg, peer, 8, 10, leader)
    nbytes = 1 << 18
    while True:
        t = _pingpong(pg, peer, nbytes, 2, leader)
        # Grow the message until it takes >= 20 ms (bandwidth-bound) or the
        # next size would eat the budget; the leader decides for both.
        grow = torch.tensor([1 if (t < 0.02 and t * 16 < budget / 4 and nbytes < (64 << 20)) else 0])
        if leader:
            pg.send([grow], peer, _TAG).wait()
        else:
            pg.recv([grow], peer, _TAG).wait()
        if not int(grow.item()):
            break
        nbytes *= 4
    beta = nbytes / max(t - alpha, 1e-9)
    return alpha, beta


def probe_pairs(topo: Topology, rank: int) -> List[Tuple[str, int, int, bool]]:
    """The pairs this rank probes, in order, as (tier, island index, peer's global rank, whether this rank
    leads and records): ranks 0 and 1 of its island ("intra", all islands at once), then island 0's
    leader with each other island's leader ("inter", in turn).  The link probe and the planner's
    calibration take the same pairs."""
    me = topo.island_of(rank)
    members = topo.islands[me]
    out: List[Tuple[str, int, int, bool]] = []
    if len(members) >= 2 and rank in members[:2]:
        out.append(("intra", me, members[1] if rank == members[0] else members[0], rank == members[0]))
    leader0 = topo.islands[0][0]
    for j in range(1, len(topo.islands)):
        other = topo.islands[j][0]
        if rank in (leader0, other):
            out.append(("inter", j, other if rank == leader0 else leader0, rank == leader0))
    return out


def measure(topo: Topology, rank: int, host_pg, island_pg, budget: float) -> Dict[str, Link]:
    """Probe intra (local ranks 0<->1 of each island, concurrently) and inter
    (island 0's leader <-> each other island's leader, in turn).  Every rank
    calls this; results are combined with an all-reduce so all agree."""
    n_islands = len(topo.islands)
    # slots: [intra alpha, intra beta] per island, then [inter alpha, inter beta] per island
    results = torch.zeros(4 * n_islands, dtype=torch.float64)
    share = budget / (1 + n_islands)
    for tier, i, peer, lead in probe_pairs(topo, rank):
        if tier == "intra":
            if island_pg is None:
                continue
            local = topo.islands[i].index(rank)   # the island group numbers its ranks from 0
            a, b = _probe_pair(island_pg, local, 1 - local, lead, share)
            slot = 2 * i
        else:
            a, b = _probe_pair(host_pg, rank, peer, lead, share)
            slot = 2 * n_islands + 2 * i
        if lead:
            results[slot], results[slot + 1] = a, b
    host_pg.allreduce([results]).wait()
    intra = [(results[2 * i].item(), results[2 * i + 1].item()) for i in range(n_islands) if results[2 * i + 1] > 0]
    inter = [(results[2 * n_islands + 2 * j].item(), results[2 * n_islands + 2 * j + 1].item())
             for j in range(1, n_islands)]
    links: Dict[str, Link] = {}
    if intra:  # the slowest island bounds the intra phases
        links["intra"] = Link(max(a for a, _ in intra), min(b for _, b in intra), "measured")
    if inter:
        links["inter"] = Link(max(a for a, _ in inter), min(b for _, b in inter), "measured")
        # Each island's uplink: the pair with island 0 measures min(up_0, up_j);
        # island 0's own is at least its fastest pair (the best this probe can say).
        topo.uplinks = [max(b for _, b in inter)] + [b for _, b in inter]
    return links


def resolve(topo: Topology, rank: int, host_pg, island_pg, variant: str = "") -> Dict[str, Link]:
    """The link model for `topo`: config > measured/cached > emulator spec > defaults.

    Also sets ``topo.uplinks``, each island's uplink bandwidth, from the same
    source (measured or cached, else the emulator's spec).

    ``island_pg`` is what the intra tier really runs on (a shared-memory
    probe group or the island's gloo group); ``variant`` names that choice
    in the cache key, so a profile of one is never used for the other.
    """
    links = dict(DEFAULTS)
    if len(topo.islands) < 2:
        return {"flat": Link(DEFAULTS["intra"].alpha, DEFAULTS["intra"].beta, "default")}
    links.update(_from_emulator_spec())
    topo.uplinks = uplinks_from_emulator_spec(topo)
    n_islands = len(topo.islands)
    mode = HCOMM_PROFILE.get().lower()
    if mode not in ("auto", "force", "off"):
        raise ValueError(f"HCOMM_PROFILE must be auto, force or off, got {mode!r}")
    path = _cache_path(topo, variant)
    cached: Optional[dict] = None
    if mode == "auto" and os.path.exists(path):
        try:
            with open(path) as f:
                cached = json.load(f)
        except (OSError, ValueError):
            cached = None
    # Every rank must take the same branch, so rank 0's cache is what counts:
    # it broadcasts [found, intra alpha, intra beta, inter alpha, inter beta,
    # island uplinks...].
    shared = torch.zeros(5 + n_islands, dtype=torch.float64)
    if rank == 0 and cached is not None:
        try:
            uplinks = [float(b) for b in cached.get("uplinks", [])]
            uplinks = uplinks if len(uplinks) == n_islands else [0.0] * n_islands
            shared = torch.tensor([1.0, cached["intra"]["alpha"], cached["intra"]["beta"],
                                   cached["inter"]["alpha"], cached["inter"]["beta"], *uplinks], dtype=torch.float64)
        except (KeyError, TypeError, ValueError):
            shared = torch.zeros(5 + n_islands, dtype=torch.float64)
    if mode != "off":
        host_pg.broadcast([shared]).wait()
        if shared[0].item() == 1.0:
            links["intra"] = Link(shared[1].item(), shared[2].item(), "cache")
            links["inter"] = Link(shared[3].item(), shared[4].item(), "cache")
            if all(b > 0 for b in shared[5:].tolist()):
                topo.uplinks = shared[5:].tolist()
        else:
            measured = measure(topo, rank, host_pg, island_pg, float(HCOMM_PROFILE_BUDGET.get()))
            links.update(measured)
            if rank == 0 and "inter" in measured:
                try:
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    full = {k: {"alpha": links[k].alpha, "beta": links[k].beta} for k in ("intra", "inter")}
                    full["uplinks"] = list(topo.uplinks)
                    with open(path, "w") as f:
                        json.dump(full, f)
                except OSError:
                    pass  # a read-only home must not fail the job
    links.update(parse_links(HCOMM_LINKS.get()))
    return links


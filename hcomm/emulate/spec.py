"""Cluster specs: the YAML format, its validation and the resolved form.

A spec lists nodes in order; global rank numbers follow that order (node 0's
ranks first), exactly as torchrun numbers them with ``--node-rank``.

```yaml
name: my-cluster
nodes:
  - name: a0            # [A-Za-z0-9_-], at most 12 characters
    island: a           # ranks joined by one fast vendor fabric
    vendor: nccl        # vendor library label: nccl, hccl, gloo, ...
    uplink: {bandwidth: 1gbit, latency: 500us, loss: 0.0}
    ranks:
      - {device: A100, speed: 1.0, memory: 2GiB}
```

``latency`` is the one-way delay of that node's uplink; a packet between two
nodes crosses both uplinks, so node-to-node one-way latency is the sum.
``bandwidth`` limits the uplink in each direction.  Every error names the
field path and the bad value, e.g. ``nodes[1].ranks[0].speed: must be in
(0, 1], got 1.5``.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import yaml

from hcomm.emulate import units

_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,12}")
_LABEL_RE = re.compile(r"[A-Za-z0-9_.+-]{1,32}")
_NODE_KEYS = ("name", "island", "vendor", "uplink", "ranks")
_UPLINK_KEYS = ("bandwidth", "latency", "loss")
_RANK_KEYS = ("device", "speed", "memory", "rank")
_TOP_KEYS = ("name", "description", "nodes")
# A rank process (python + torch + gloo) needs this much before any tensors.
MIN_MEMORY = 256 * 2**20


class SpecError(ValueError):
    """A cluster spec is malformed; the message names the field and value."""


@dataclass(frozen=True)
class RankSpec:
    rank: int            # global rank, in node order
    local_rank: int
    node: str
    island: str
    vendor: str
    device: str
    speed: float         # relative compute speed, 0 < speed <= 1
    memory_bytes: int    # emulated device memory (the rank's cgroup limit)


@dataclass(frozen=True)
class NodeSpec:
    index: int
    name: str
    island: str
    vendor: str
    uplink_bandwidth_bps: float  # BYTES per second (the suffix is historical: B/s)
    latency_s: float             # one-way delay of this node's uplink
    loss: float                  # packet loss probability of the uplink, 0..1
    ranks: Tuple[RankSpec, ...]

    @property
    def uplink_bits_per_s(self) -> float:
        return self.uplink_bandwidth_bps * 8


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    nodes: Tuple[NodeSpec, ...]
    description: str = ""
    source: str = field(default="", compare=False)  # file or preset it came from

    @property
    def ranks(self) -> List[RankSpec]:
        return [r for n in self.nodes for r in n.ranks]

    @property
    def world_size(self) -> int:
        return sum(len(n.ranks) for n in self.nodes)

    @property
    def islands(self) -> Dict[str, List[NodeSpec]]:
        out: Dict[str, List[NodeSpec]] = {}
        for n in self.nodes:
            out.setdefault(n.island, []).append(n)
        return out

    def path_latency_s(self, a: NodeSpec, b: NodeSpec) -> float:
        """One-way latency between two nodes: both uplinks."""
        return a.latency_s + b.latency_s

    def path_bandwidth_bps(self, a: NodeSpec, b: NodeSpec) -> float:
        """Bytes/s between two nodes: the slower uplink limits."""
        return min(a.uplink_bandwidth_bps, b.uplink_bandwidth_bps)

    def to_dict(self) -> Dict[str, Any]:
        """Resolved form (bytes/s, seconds, bytes): what HCOMM_EMU_CLUSTER holds."""
        return {
            "name": self.name,
            "description": self.description,
            "nodes": [
                {
                    "name": n.name, "island": n.island, "vendor": n.vendor,
                    "uplink": {"bandwidth": f"{n.uplink_bandwidth_bps:.0f}B/s",
                               "latency": f"{n.latency_s * 1e6:.3f}us", "loss": n.loss},
                    "ranks": [{"rank": r.rank, "device": r.device, "speed": r.speed,
                               "memory": f"{r.memory_bytes}B"} for r in n.ranks],
                }
                for n in self.nodes
            ],
        }

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def _fail(path: str, message: str) -> SpecError:
    return SpecError(f"{path}: {message}")


def _mapping(value, path: str, allowed) -> dict:
    if not isinstance(value, dict):
        raise _fail(path, f"must be a mapping, got {value!r}")
    for key in value:
        if key not in allowed:
            raise _fail(f"{path}.{key}" if path else str(key),
                        f"unknown field (expected one of: {', '.join(allowed)})")
    return value


def _required(d: dict, key: str, path: str):
    if key not in d or d[key] is None:
        raise _fail(f"{path}.{key}", "is required")
    return d[key]


def _label(value, path: str, regex=_LABEL_RE) -> str:
    if not isinstance(value, (str, int)) or isinstance(value, bool) \
            or not regex.fullmatch(str(value)):
        raise _fail(path, f"must match {regex.pattern}, got {value!r}")
    return str(value)


# what a field without a unit is refused with: the example to copy
_UNIT_EXAMPLES = {units.parse_bandwidth: "1gbit", units.parse_latency: "1ms", units.parse_memory: "16GiB"}


def _unit(parser, value, path: str):
    # a bare number is refused (zero aside): `latency: 1` once meant one second
    # without a word, where the writer most likely meant 1ms
    bare = isinstance(value, (int, float)) and not isinstance(value, bool) or \
        isinstance(value, str) and re.fullmatch(r"\s*[\d.]+(?:[eE][-+]?\d+)?\s*", value) is not None
    if bare and float(value) != 0:
        raise _fail(path, f"needs a unit, got {value!r} (e.g. {path.rsplit('.', 1)[-1]}: "
                    f"{_UNIT_EXAMPLES[parser]})")
    try:
        return parser(value)
    except ValueError as exc:
        raise _fail(path, str(exc)) from None


def _rank(raw, path: str, node, local: int, global_rank: int) -> RankSpec:
    d = _mapping(raw, path, _RANK_KEYS)
    if "rank" in d and d["rank"] != global_rank:
        raise _fail(f"{path}.rank", f"ranks are numbered in node order: expected "
                    f"{global_rank}, got {d['rank']!r}")
    device = _label(_required(d, "device", path), f"{path}.device")
    speed = d.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) \
            or not 0.0 < float(speed) <= 1.0:
        raise _fail(f"{path}.speed", f"must be in (0, 1], got {speed!r}")
    memory = _unit(units.parse_memory, _required(d, "memory", path), f"{path}.memory")
    if memory < MIN_MEMORY:
        raise _fail(f"{path}.memory", f"must be at least {units.fmt_memory(MIN_MEMORY)} "
                    f"(a rank process needs that much), got {d['memory']!r}")
    return RankSpec(global_rank, local, node["name"], node["island"], node["vendor"],
                    device, float(speed), memory)


def _node(raw, path: str, index: int, first_rank: int) -> NodeSpec:
    d = _mapping(raw, path, _NODE_KEYS)
    name = _label(_required(d, "name", path), f"{path}.name", _NAME_RE)
    island = _label(_required(d, "island", path), f"{path}.island")
    vendor = _label(d.get("vendor", "gloo"), f"{path}.vendor")
    up = _mapping(_required(d, "uplink", path), f"{path}.uplink", _UPLINK_KEYS)
    bw = _unit(units.parse_bandwidth, _required(up, "bandwidth", f"{path}.uplink"),
               f"{path}.uplink.bandwidth")
    if bw < 125_000:  # below 1 Mbit/s tbf cannot hold a 64 KiB packet burst sensibly
        raise _fail(f"{path}.uplink.bandwidth", f"must be at least 1mbit, got {up['bandwidth']!r}")
    lat = _unit(units.parse_latency, up.get("latency", 0), f"{path}.uplink.latency")
    if not 0.0 <= lat <= 1.0:
        raise _fail(f"{path}.uplink.latency", f"must be between 0 and 1s, got {up['latency']!r}")
    loss = up.get("loss", 0.0)
    if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not 0.0 <= loss < 1.0:
        raise _fail(f"{path}.uplink.loss", f"must be a probability in [0, 1), got {loss!r}")
    ranks_raw = _required(d, "ranks", path)
    if not isinstance(ranks_raw, list) or not ranks_raw:
        raise _fail(f"{path}.ranks", f"must be a non-empty list, got {ranks_raw!r}")
    partial = {"name": name, "island": island, "vendor": vendor}
    ranks = tuple(_rank(r, f"{path}.ranks[{i}]", partial, i, first_rank + i)
                  for i, r in enumerate(ranks_raw))
    return NodeSpec(index, name, island, vendor, float(bw), float(lat), float(loss), ranks)


EMULATED_MAX_NODES = 150   # one emulated subnet (netns addresses); a spec only planned for may be larger


def parse_spec(data, source: str = "", max_nodes: Optional[int] = EMULATED_MAX_NODES) -> ClusterSpec:
    """Validate a spec already read from YAML (a dict); ``max_nodes=None`` for a spec that is planned
    for (``hcomm plan --offline``), not emulated."""
    d = _mapping(data, "", _TOP_KEYS)
    nodes_raw = d.get("nodes")
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise _fail("nodes", f"must be a non-empty list, got {nodes_raw!r}")
    if max_nodes is not None and len(nodes_raw) > max_nodes:
        raise _fail("nodes", f"at most {max_nodes} nodes fit one emulated subnet, got {len(nodes_raw)} "
                             f"(hcomm plan --offline plans larger clusters)")
    nodes: List[NodeSpec] = []
    seen: Dict[str, int] = {}
    vendors: Dict[str, Tuple[str, int]] = {}
    for i, raw in enumerate(nodes_raw):
        node = _node(raw, f"nodes[{i}]", i, sum(len(n.ranks) for n in nodes))
        if node.name in seen:
            raise _fail(f"nodes[{i}].name", f"duplicate node name {node.name!r} "
                        f"(also nodes[{seen[node.name]}])")
        seen[node.name] = i
        # An island is one vendor fabric; two vendors in one island is a typo.
        other = vendors.setdefault(node.island, (node.vendor, i))
        if other[0] != node.vendor:
            raise _fail(f"nodes[{i}].vendor", f"island {node.island!r} already uses vendor "
                        f"{other[0]!r} (nodes[{other[1]}]), got {node.vendor!r}")
        nodes.append(node)
    name = d.get("name", os.path.splitext(os.path.basename(source))[0] or "cluster")
    return ClusterSpec(str(name), tuple(nodes), str(d.get("description", "")), source)


def load_file(path: str, max_nodes: Optional[int] = EMULATED_MAX_NODES) -> ClusterSpec:
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from None
    try:
        return parse_spec(data, source=path, max_nodes=max_nodes)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None


def load_spec(path_or_preset: Optional[str] = None, max_nodes: Optional[int] = EMULATED_MAX_NODES) -> ClusterSpec:
    """A spec from a YAML file, a preset name, or (None) the default preset."""
    from hcomm.emulate import catalog as _presets

    if isinstance(path_or_preset, ClusterSpec):
        return path_or_preset
    if path_or_preset is None or path_or_preset == "":
        path_or_preset = _presets.DEFAULT_PRESET
    if path_or_preset in _presets.presets():
        return load_file(_presets.preset_path(path_or_preset))
    if os.path.exists(path_or_preset):
        return load_file(path_or_preset, max_nodes)
    raise SpecError(f"--cluster {path_or_preset!r}: neither a file nor a preset "
                    f"(presets: {', '.join(_presets.presets())})")

"""``hcomm emulate show``: the topology as text and as a PNG picture.

The picture: one box per island, nodes inside it, one chip per rank with
kind / speed / memory, and each node's uplink to a central switch labelled
with bandwidth and one-way latency.  matplotlib with the Agg backend, so it
works without a display.
"""
from __future__ import annotations

import math
from hcomm.emulate.spec import ClusterSpec
from hcomm.emulate.units import fmt_bandwidth, fmt_latency, fmt_memory


def describe(spec: ClusterSpec) -> str:
    lines = [f"cluster {spec.name}: {len(spec.nodes)} nodes, {len(spec.islands)} islands, "
             f"{spec.world_size} ranks" + (f"  ({spec.source})" if spec.source else "")]
    if spec.description:
        lines.append(f"  {spec.description}")
    for island, nodes in spec.islands.items():
        lines.append(f"  island {island} (vendor {nodes[0].vendor})")
        for n in nodes:
            loss = f", loss {n.loss:.2%}" if n.loss else ""
            lines.append(f"    node {n.name}: uplink {fmt_bandwidth(n.uplink_bandwidth_bps)}, "
                         f"{fmt_latency(n.latency_s)} one-way{loss}")
            for r in n.ranks:
                lines.append(f"      rank {r.rank} (local {r.local_rank}): {r.device}, "
                             f"speed {r.speed:g}, memory {fmt_memory(r.memory_bytes)}")
    lines.append("  node-to-node one-way latency = sum of both uplinks; bandwidth = "
                 "the slower uplink; ranks of one node share its loopback")
    return "\n".join(lines)


def draw(spec: ClusterSpec, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    nodes = list(spec.nodes)
    n = len(nodes)
    width = max(8.0, 3.4 * n)
    fig, ax = plt.subplots(figsize=(width, 6.5))
    ax.set_xlim(0, width)
    ax.set_ylim(0, 6.5)
    ax.axis("off")
    switch = (width / 2, 5.6)
    ax.add_patch(FancyBboxPatch((switch[0] - 1.0, switch[1] - 0.25), 2.0, 0.5,
                                boxstyle="round,pad=0.05", fc="#dddddd", ec="black"))
    ax.text(*switch, "emulated switch", ha="center", va="center", fontsize=9)
    colors = ["#cfe8ff", "#ffe0c2", "#d9f2d0", "#f3d1f0", "#fff3b0", "#d0f0f0"]
    island_color = {name: colors[i % len(colors)] for i, name in enumerate(spec.islands)}
    slot = width / n
    for i, node in enumerate(nodes):
        x0 = i * slot + 0.2
        w = slot - 0.4
        nrows = math.ceil(len(node.ranks) / 2)
        h = 0.9 + 0.75 * nrows
        y0 = 3.6 - h
        ax.add_patch(FancyBboxPatch((x0, y0), w, h, boxstyle="round,pad=0.05",
                                    fc=island_color[node.island], ec="black"))
        ax.text(x0 + w / 2, y0 + h - 0.25, f"{node.name}  island {node.island}  ({node.vendor})",
                ha="center", va="center", fontsize=9, weight="bold")
        for j, r in enumerate(node.ranks):
            cx = x0 + 0.1 + (j % 2) * (w / 2)
            cy = y0 + h - 0.95 - (j // 2) * 0.75
            ax.add_patch(FancyBboxPatch((cx, cy), w / 2 - 0.2, 0.55, boxstyle="round,pad=0.03",
                                        fc="white", ec="#444444"))
            ax.text(cx + (w / 2 - 0.2) / 2, cy + 0.275,
                    f"rank {r.rank}: {r.device}\nspeed {r.speed:g}, {fmt_memory(r.memory_bytes)}",
                    ha="center", va="center", fontsize=7.5)
        top = (x0 + w / 2, 3.65)
        ax.plot([top[0], switch[0]], [top[1], switch[1] - 0.3], color="#333333",
                lw=1 + 3 * node.uplink_bandwidth_bps / max(m.uplink_bandwidth_bps for m in nodes))
        mid = ((top[0] + switch[0]) / 2, (top[1] + switch[1]) / 2)
        ax.text(mid[0], mid[1], f"{fmt_bandwidth(node.uplink_bandwidth_bps)}\n"
                f"{fmt_latency(node.latency_s)} one-way", ha="center", va="center", fontsize=8,
                bbox=dict(fc="white", ec="none", alpha=0.85))
    ax.set_title(f"{spec.name}: {spec.world_size} ranks on {n} nodes "
                 f"({len(spec.islands)} islands)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


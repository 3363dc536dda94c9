"""busbw vs size, one line per backend (and per hcomm tier when reported)."""
from __future__ import annotations

from typing import Any, Dict, List


def plot(records: List[Dict[str, Any]], backends: List[str], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on cluster nodes; never pick an interactive backend
    import matplotlib.pyplot as plt

    # only tiers hcomm actually timed get a panel (a flat algorithm reports one untimed tier)
    tiered = [r for r in records if any(t.get("gbps") is not None for t in r.get("tiers") or [])]
    ncols = 2 if tiered else 1
    fig, axes = plt.subplots(1, ncols, figsize=(7 * ncols, 4.5), squeeze=False)
    ax = axes[0][0]
    for b in backends:
        mine = sorted((r for r in records if r["backend"] == b), key=lambda r: r["size_bytes"])
        if mine:
            ax.plot([r["size_bytes"] for r in mine], [r["busbw_gbps"] for r in mine], marker="o",
                    markersize=3, label=b)
    ax.set(xscale="log", xlabel="size (bytes)", ylabel="busbw (GB/s)", title=title)
    ax.set_xscale("log", base=2)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    if tiered:
        ax = axes[0][1]
        names = sorted({t["tier"] for r in tiered for t in r["tiers"]})
        for b in backends:
            for name in names:
                pts = sorted((r["size_bytes"], t["gbps"]) for r in tiered if r["backend"] == b
                             for t in r["tiers"] if t["tier"] == name and t.get("gbps") is not None)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=f"{b} {name}")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="size (bytes)", ylabel="achieved tier bandwidth (GB/s)", title="per tier (slowest rank)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

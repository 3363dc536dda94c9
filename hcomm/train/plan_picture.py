"""A picture of a plan: which device does what.

One panel per plan.  Each rank is a row; its bar spans the model pieces it
computes (embedding, blocks, norm + head, as the profiles number them), so a
pipeline shows as a staircase and data parallelism as full-width bars.  A
tensor-parallel rank's bar is as thick as its shard fraction (an uneven split
is visibly uneven); ZeRO shards are hatched.  The label says how many samples
the rank runs per step, in which dtype, and its shard.  Colour is the device
kind, so a reader sees at a glance where the fast and the slow devices went.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

KIND_COLOURS = {"A100": "tab:blue", "H800": "tab:green", "V100": "tab:orange", "910B": "tab:red",
                "H200": "tab:purple", "H100": "tab:olive"}


def rank_labels(plan) -> List[str]:
    """One line per rank: samples, dtype, TP fraction and ZeRO shard where they apply."""
    out = []
    for r, n in zip(plan.ranks, plan.samples_computed()):
        parts = [f"{n} samples", r.compute_dtype]
        pipe = plan.pipeline_of(r.rank)
        if pipe is not None:
            parts[0] = (f"stage {pipe.ranks.index(r.rank) + 1}/{len(pipe.ranks)}, {n} samples in "
                        f"{pipe.micro_batches} x {pipe.schedule}")
        if r.tp_fraction < 1.0:
            parts.append(f"TP {r.tp_fraction:.2f}")
        if r.zero_stage:
            parts.append(f"ZeRO-{r.zero_stage}" + (f" {r.shard_fraction:.2f}" if r.shard_fraction is not None else ""))
        out.append(", ".join(parts))
    return out


def spans(plan, rank: int, n_pieces: int) -> List[Tuple[int, int]]:
    """Half-open piece ranges the rank computes: its own ``layers``, else its pipeline chunks (position
    j of p holds chunks j, j + p, ... of the cuts; interleaving gives several), else the whole model."""
    r = plan.ranks[rank]
    if r.layers is not None:
        return [tuple(r.layers)]
    pipe = plan.pipeline_of(rank)
    if pipe is not None and pipe.cuts:
        p, j = len(pipe.ranks), pipe.ranks.index(rank)
        return [(pipe.cuts[c], pipe.cuts[c + 1]) for c in range(j, len(pipe.cuts) - 1, p)]
    return [(0, n_pieces)]


def draw(path: str, plans: Sequence, pieces: Sequence, islands: Sequence[str] = ()) -> None:
    """Write one PNG with a panel per plan; ``pieces``: the profile's pieces (``LayerCost``), embedding
    to head, which the x axis names; ``islands``: each rank's island name (else the plan's)."""
    n_pieces = len(pieces)
    piece_names = [c.name for c in pieces]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = max(p.world_size for p in plans)
    fig, axes = plt.subplots(len(plans), 1, figsize=(10, 0.55 * rows * len(plans) + 1.2), squeeze=False)
    kinds = []
    for ax, plan in zip(axes[:, 0], plans):
        labels = rank_labels(plan)
        for r in plan.ranks:
            kind = r.device or "?"
            kinds += [kind] if kind not in kinds else []
            ranges = spans(plan, r.rank, n_pieces)
            for start, end in ranges:
                ax.barh(r.rank, end - start, left=start, height=0.8 * r.tp_fraction,
                        color=KIND_COLOURS.get(kind, "tab:gray"), edgecolor="black", linewidth=0.5,
                        hatch="//" if r.zero_stage else None, alpha=0.85)
            ax.text(ranges[0][0] + 0.15, r.rank, f"{kind}: {labels[r.rank]}", va="center", ha="left",
                    fontsize=7.5, color="black")
        ax.set_ylim(plan.world_size - 0.5, -0.5)
        ax.set_xlim(0, n_pieces)
        ax.set_yticks(range(plan.world_size))
        ax.set_yticklabels([f"r{r.rank} ({(islands[r.rank] if r.rank < len(islands) else r.island) or '-'})"
                            for r in plan.ranks], fontsize=8)
        title = f"plan '{plan.name}'"
        if plan.predicted_step_s is not None:
            title += f": predicted {plan.predicted_step_s * 1e3:.0f} ms per step"
        ax.set_title(title, fontsize=10)
    bottom = axes[-1, 0]
    bottom.set_xlabel("model pieces (embedding, blocks, norm + head); bar height = tensor-parallel fraction, "
                      "hatched = ZeRO-sharded")
    bottom.set_xticks([i + 0.5 for i in range(n_pieces)])
    bottom.set_xticklabels(piece_names, rotation=90, fontsize=6)
    fig.legend(handles=[Patch(color=KIND_COLOURS.get(k, "tab:gray"), label=k) for k in kinds],
               loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""``hcomm topo``: measure alpha (latency) and beta (bandwidth) for every pair of ranks.

Independent of ``hcomm.topology`` on purpose: it is the check on what hcomm
believes.  Each pair ping-pongs over gloo send/recv, a small message (its
one-way time is alpha) and a large one; the alpha-beta model
t(m) = alpha + m / beta through the two points gives beta.  Pairs run in
rounds of a round-robin tournament, so every rank is in at most one pair at
a time; ``--serial`` runs one pair at a time instead, which is what you want
when several ranks share one uplink (emulated nodes), since concurrent pairs
would then split its bandwidth.  The large-message repetitions adapt to
``--budget-s`` per pair, so slow links keep the run bounded.

Ranks are grouped into tiers by ``HCOMM_EMU_ISLAND`` (set by ``hcomm
emulate run``) or, without it, by host name.
"""
from __future__ import annotations

import json
import socket
import statistics
import sys
import time
from typing import Dict, List, Optional, Tuple

from hcomm.bench.cli import UsageError, _Parser, parse_size

PROG = "hcomm topo"
Pair = Tuple[int, int]


def rounds(nranks: int, serial: bool = False) -> List[List[Pair]]:
    """Every pair exactly once; within a round no rank appears twice (circle method)."""
    if serial:
        return [[(a, b)] for a in range(nranks) for b in range(a + 1, nranks)]
    ring: List[Optional[int]] = list(range(nranks)) + ([None] if nranks % 2 else [])
    m = len(ring)
    out = []
    for _ in range(m - 1):
        pairs = []
        for i in range(m // 2):
            a, b = ring[i], ring[m - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        out.append(pairs)
        ring = [ring[0], ring[-1]] + ring[1:-1]  # rotate all but the first
    return out


def fit_alpha_beta(small: int, t_small: float, large: int, t_large: float) -> Tuple[float, float]:
    """(alpha seconds, beta bytes/s) of the line through two one-way times."""
    if t_large > t_small and large > small:
        beta = (large - small) / (t_large - t_small)
    else:  # noise made the large message look no slower: bound beta by it alone
        beta = large / max(t_large, 1e-12)
    alpha = max(0.0, t_small - small / beta)
    return alpha, beta


def _pingpong(buf, peer: int, first: bool, reps: int) -> float:
    """Median one-way time of ``reps`` round trips with ``peer``.

    The median, not the mean: on a shared machine one descheduled round trip
    would otherwise dominate a latency of tens of microseconds.
    """
    import torch.distributed as dist

    times = []
    for _ in range(reps):
        start = time.perf_counter()
        if first:
            dist.send(buf, dst=peer)
            dist.recv(buf, src=peer)
        else:
            dist.recv(buf, src=peer)
            dist.send(buf, dst=peer)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / 2


def _measure_pair(peer: int, first: bool, a) -> Tuple[float, float]:
    import torch
    import torch.distributed as dist

    small = torch.zeros(max(1, a.small_bytes), dtype=torch.uint8)
    large = torch.zeros(a.large_bytes, dtype=torch.uint8)
    _pingpong(small, peer, first, 2)  # warm up the connection
    t_small = _pingpong(small, peer, first, a.small_iters)
    probe = _pingpong(large, peer, first, 1)
    # both sides must agree on the repetition count: the first rank decides
    reps = torch.tensor([max(1, min(a.iters, int(a.budget_s / max(2 * probe, 1e-9))))])
    if first:
        dist.send(reps, dst=peer)
    else:
        dist.recv(reps, src=peer)
    t_large = _pingpong(large, peer, first, int(reps.item()))
    return fit_alpha_beta(small.numel(), t_small, large.numel(), t_large)


def _rank_main(rank: int, nranks: int, device, a) -> int:
    import os

    import torch.distributed as dist

    labels: List[Optional[str]] = [None] * nranks
    dist.all_gather_object(labels, os.environ.get("HCOMM_EMU_ISLAND") or socket.gethostname())
    mine: Dict[Pair, Tuple[float, float]] = {}
    start = time.perf_counter()
    for pairs in rounds(nranks, a.serial):
        for lo, hi in pairs:
            if rank in (lo, hi):
                result = _measure_pair(hi if rank == lo else lo, rank == lo, a)
                if rank == lo:
                    mine[(lo, hi)] = result
        dist.barrier()  # a round ends for everyone before the next one starts
    gathered: List[Optional[dict]] = [None] * nranks
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        links = {k: v for part in gathered for k, v in part.items()}
        report(links, labels, nranks, time.perf_counter() - start, a)
    dist.barrier()
    return 0


def tier_of(labels: List[str], a: int, b: int) -> str:
    return "intra" if labels[a] == labels[b] else "inter"


def matrices(links: Dict[Pair, Tuple[float, float]], nranks: int):
    nan = float("nan")
    alpha = [[nan] * nranks for _ in range(nranks)]
    beta = [[nan] * nranks for _ in range(nranks)]
    for (x, y), (al, be) in links.items():
        alpha[x][y] = alpha[y][x] = al * 1e6
        beta[x][y] = beta[y][x] = be / 1e9
    return alpha, beta


def _matrix_lines(title: str, m: List[List[float]], fmt: str) -> List[str]:
    n = len(m)
    lines = [title, "  rank " + "".join(f"{j:>10d}" for j in range(n))]
    for i in range(n):
        cells = "".join(f"{'-':>10}" if i == j else format(m[i][j], fmt).rjust(10) for j in range(n))
        lines.append(f"  {i:4d} {cells}")
    return lines


def tier_summary(links: Dict[Pair, Tuple[float, float]], labels: List[str]) -> Dict[str, dict]:
    tiers: Dict[str, dict] = {}
    for (x, y), (al, be) in sorted(links.items()):
        t = tiers.setdefault(tier_of(labels, x, y), {"pairs": 0, "alpha_us": [], "beta_gbps": []})
        t["pairs"] += 1
        t["alpha_us"].append(al * 1e6)
        t["beta_gbps"].append(be / 1e9)
    return tiers


def report(links, labels, nranks: int, seconds: float, a) -> None:
    alpha, beta = matrices(links, nranks)
    out = [f"# hcomm topo: {nranks} ranks, {len(links)} pairs in {seconds:.1f} s "
           f"({'serial' if a.serial else 'rounds'}; small {a.small_bytes} B, large {a.large_bytes} B)"]
    out += [f"#  Rank {r:3d} island/host {labels[r]}" for r in range(nranks)]
    out += _matrix_lines("alpha (us, one-way latency)", alpha, ".1f")
    out += _matrix_lines("beta (GB/s)", beta, ".3f")
    tiers = tier_summary(links, labels)
    out.append("tiers (median [min..max]):")
    for name, t in tiers.items():
        al, be = t["alpha_us"], t["beta_gbps"]
        out.append(f"  {name:>5}: {t['pairs']:3d} pairs  alpha {statistics.median(al):8.1f} us "
                   f"[{min(al):.1f}..{max(al):.1f}]  beta {statistics.median(be):8.3f} GB/s "
                   f"[{min(be):.3f}..{max(be):.3f}]")
    print("\n".join(out), flush=True)
    if a.json_path:
        doc = {"schema": "hcomm-topo/1", "nranks": nranks, "labels": labels,
               "pairs": [{"a": x, "b": y, "tier": tier_of(labels, x, y), "alpha_s": al, "beta_Bps": be}
                         for (x, y), (al, be) in sorted(links.items())]}
        with open(a.json_path, "w") as f:
            json.dump(doc, f, indent=1)
    if a.heatmap:
        heatmap(alpha, beta, labels, a.heatmap)
        print(f"# heatmap: {a.heatmap}")


def heatmap(alpha, beta, labels, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    n = len(alpha)
    fig, axes = plt.subplots(1, 2, figsize=(5 + 0.6 * n * 2, 3 + 0.5 * n))
    ticks = [f"{i}\n{labels[i]}" if len(set(labels)) > 1 else str(i) for i in range(n)]
    for ax, m, title, fmt in ((axes[0], alpha, "alpha (us)", "{:.0f}"), (axes[1], beta, "beta (GB/s)", "{:.2f}")):
        data = np.array(m, dtype=float)
        im = ax.imshow(data, cmap="viridis")
        for i in range(n):
            for j in range(n):
                if i != j and np.isfinite(data[i, j]):
                    ax.text(j, i, fmt.format(data[i, j]), ha="center", va="center", color="w", fontsize=8)
        ax.set(title=title, xticks=range(n), yticks=range(n), xlabel="rank", ylabel="rank")
        ax.set_xticklabels(ticks, fontsize=7)
        ax.set_yticklabels(ticks, fontsize=7)
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_parser():
    p = _Parser(prog=PROG, description="measured alpha/beta link matrix between every pair of ranks")
    p.add_argument("--nprocs", type=int, default=4, help="local ranks to spawn when not under torchrun")
    p.add_argument("--small-bytes", default="8", help="message for alpha (default 8)")
    p.add_argument("--large-bytes", default="4M", help="message for beta (default 4M)")
    p.add_argument("--small-iters", type=int, default=50, help="round trips of the small message")
    p.add_argument("--iters", type=int, default=10, help="at most this many large round trips per pair")
    p.add_argument("--budget-s", type=float, default=0.5, help="target seconds of large round trips per pair")
    p.add_argument("--serial", action="store_true", help="one pair at a time (shared uplinks)")
    # no default path: a measurement must not drop files into the current folder unasked
    p.add_argument("--heatmap", default=None, metavar="PATH", help="also write the alpha/beta heatmap as a PNG")
    p.add_argument("--json", dest="json_path", help="write the pairs as JSON")
    return p


def parse(argv: List[str]):
    a = build_parser().parse_args(argv)
    a.small_bytes = parse_size(a.small_bytes, "--small-bytes")
    a.large_bytes = parse_size(a.large_bytes, "--large-bytes")
    if a.large_bytes <= a.small_bytes:
        raise UsageError(f"--large-bytes ({a.large_bytes}) must be larger than --small-bytes ({a.small_bytes})")
    if a.small_iters < 1 or a.iters < 1:
        raise UsageError("--small-iters and --iters must be at least 1")
    if a.budget_s <= 0:
        raise UsageError(f"--budget-s ({a.budget_s}) must be positive")
    if a.heatmap:
        from hcomm.bench.cli import _check_output_path

        _check_output_path(a.heatmap, "--heatmap")
    from hcomm.bench.spawn import under_launcher

    if not under_launcher() and a.nprocs < 2:
        raise UsageError(f"--nprocs ({a.nprocs}) must be at least 2: a link needs two ends")
    return a


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        a = parse(argv)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    from hcomm.bench import spawn

    return spawn.run(_rank_main, a.nprocs, "cpu", a)


if __name__ == "__main__":
    sys.exit(main())

"""Uneven split sizes: integers in proportion to fractions, in units the kernels like.

Megatron and DTensor split every dimension into equal parts; on a TP group
of an A100 and a V100 the A100 then waits half the time.  Here each rank's
part is proportional to its fraction (by default its measured speed),
counted in whole units (one KV head with its query heads for attention, a
multiple of 8 or 32 columns for the MLP, of 64 rows for the vocabulary) so
every local matmul keeps a friendly shape.
"""
from __future__ import annotations

import math
from typing import List, Sequence


def check_fractions(fractions: Sequence[float], where: str = "tp fractions") -> List[float]:
    values = [float(f) for f in fractions]
    if not values:
        raise ValueError(f"{where}: no ranks")
    for i, f in enumerate(values):
        if not math.isfinite(f) or f <= 0:
            raise ValueError(f"{where}: rank {i} has fraction {f}; every rank of a TP group holds a shard (> 0)")
    if abs(sum(values) - 1.0) > 1e-6:
        raise ValueError(f"{where}: {values} sum to {sum(values):.9g}, not 1")
    return values


def split_sizes(total: int, fractions: Sequence[float], unit: int = 1, what: str = "columns") -> List[int]:
    """Sizes summing to ``total``, each a multiple of ``unit`` and at least one unit, closest to
    ``total * fraction`` (largest remainder over whole units).

    Raises ValueError naming ``what`` when ``total`` is not a multiple of ``unit`` or there are fewer
    units than ranks (a rank would hold nothing)."""
    fractions = check_fractions(fractions, f"split of {total} {what}")
    if unit < 1 or total % unit:
        raise ValueError(f"{total} {what} do not split into units of {unit}")
    units = total // unit
    ranks = len(fractions)
    if units < ranks:
        raise ValueError(f"{total} {what} make {units} units of {unit}: fewer than the {ranks} TP ranks, so a rank "
                         f"would hold none")
    # one unit each first, then the rest by largest remainder on what is left
    ideal = [units * f for f in fractions]
    counts = [max(1, math.floor(x)) for x in ideal]
    while sum(counts) > units:   # floors of 1 pushed the sum over: take from the largest excess above one unit
        i = max((r for r in range(ranks) if counts[r] > 1), key=lambda r: (counts[r] - ideal[r], counts[r]))
        counts[i] -= 1
    order = sorted(range(ranks), key=lambda r: (counts[r] - ideal[r], r))
    for k in range(units - sum(counts)):
        counts[order[k % ranks]] += 1
    return [c * unit for c in counts]


def offsets(sizes: Sequence[int]) -> List[int]:
    out, start = [], 0
    for s in sizes:
        out.append(start)
        start += s
    return out

"""Hostile split sizes for the uneven (`_v`) collectives, and what hcomm must say about them.

Shared by the thread tier (tests/core/test_thread_hostile_sizes.py, the C++
core alone) and the process tier (tests/torch/test_hostile_sizes.py, the
torch backend and the Python wrapper).  `problem` is a reference model of
the checks in csrc/core/validate.cpp (and hcomm.collectives._counts), in the
same order, so tests can compare whole messages rather than fragments.
"""
from __future__ import annotations

from typing import List, Optional

from hypothesis import strategies as st

INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
MAX_TOTAL = 12  # tensors stay tiny: the sizes are what is hostile


def wrap64(x: int) -> int:
    """`x` as a two's-complement int64 (what an unchecked C++ sum yields)."""
    return (x - INT64_MIN) % 2**64 + INT64_MIN


def problem(name: str, counts: List[int], total: int, what: str, world: int,
            unit: str = "elements") -> Optional[str]:
    """The message tail for `counts` split over a `total`-long `what` ("input"/"output"), or None if fine."""
    if len(counts) != world:
        return f"{name} has {len(counts)} entries but the group has {world} ranks"
    for i, c in enumerate(counts):
        if c < 0:
            return f"{name} has a negative entry {c} at index {i}"
    for i, c in enumerate(counts):
        if c > total:
            return f"{name}[{i}] = {c} exceeds the {what}'s {total} {unit}"
    if sum(counts) != total:
        return f"{name} sums to {sum(counts)} {unit} but the {what} has {total}"
    return None


def fits(n: int) -> int:
    """A tensor length for a rank whose own entry is `n`: `n` itself when that is small, else 1."""
    return n if 0 <= n <= MAX_TOTAL else 1


_plausible = st.integers(0, MAX_TOTAL)
_negative = st.one_of(st.sampled_from([-1, INT64_MIN, INT64_MIN + 1, -2**62]), st.integers(INT64_MIN, -1))
_huge = st.one_of(st.sampled_from([MAX_TOTAL + 1, 10**6, 2**32, 2**62, INT64_MAX - 1, INT64_MAX]),
                  st.integers(MAX_TOTAL + 1, INT64_MAX))
_beyond_int64 = st.sampled_from([INT64_MAX + 1, 2**64, 2**64 + 10, 2**70, INT64_MIN - 1])
KINDS = ("negative", "huge", "wrap", "length", "sum", "mixed")


@st.composite
def sizes(draw, world: int, total: int, beyond_int64: bool = False) -> List[int]:
    """Per-rank sizes for a `total`-long tensor that no rank should accept, of one drawn kind:
    a negative entry, a huge entry, entries whose int64 sum wraps to exactly `total` (what an
    unchecked sum lets through), the wrong number of entries, plausible entries with the wrong
    sum, or a mix of all of these.  `beyond_int64` adds values no int64 holds (only the Python
    wrapper can be handed those).  Rarely the draw is valid after all: filter with `problem`."""
    kind = draw(st.sampled_from(KINDS))
    bad = st.one_of(_huge, _beyond_int64) if beyond_int64 else _huge
    n = world
    if kind == "length":
        n = draw(st.sampled_from([w for w in (0, world - 1, world + 1, world + 5) if w >= 0 and w != world]))
    counts = draw(st.lists(_plausible, min_size=n, max_size=n))
    at = draw(st.integers(0, max(n - 1, 0)))
    if kind == "negative" and n:
        counts[at] = draw(_negative)
    elif kind == "huge" and n:
        counts[at] = draw(bad)
    elif kind == "wrap" and n >= 2:
        for i in draw(st.sets(st.integers(0, n - 2), min_size=1)):
            counts[i] = draw(st.sampled_from([INT64_MAX, INT64_MAX - 1, 2**62, 2**63 - 2**32]))
        counts[-1] = wrap64(total - sum(counts[:-1]))
    elif kind == "mixed":
        counts = draw(st.lists(st.one_of(_plausible, _negative, bad), min_size=n, max_size=n))
    return counts

"""The host-staged bridge between islands (HCOMM_FORCE_STAGING's path) on thread ranks.

A staged rank stands for a device island: its buffers reach the cross-island
tier only through the emulated copy engine (copies up into separate staging
blocks on a copy thread, chunks on the host transport, copies down), exactly
as a GPU island's would.  Every hierarchical collective run that way must
give bitwise the result of the same algorithm unstaged (which the hier tests
hold to exact references), for all islands staged, for only some (islands
of different vendors: one stages, one does not), for messages cut into many
bridge chunks (sizes that are not multiples of the element), and must
report what it staged.  A rank that dies mid-collective fails every survivor
within the timeout.
"""
import time

import numpy as np
import pytest

import hcomm  # noqa: F401  (loads torch before the extension)
from hcomm import _C

K, D, O = _C.OP_KINDS, _C.DTYPES, _C.REDUCE_OPS
SHAPES = {"2x2": [[0, 1], [2, 3]], "3+1": [[0, 1, 2], [3]], "1+3": [[0], [1, 2, 3]],
          "3+2+1": [[0, 1, 2], [3, 4], [5]]}
NP = {"float32": np.float32, "float64": np.float64, "int32": np.int32, "int16": np.int16, "uint8": np.uint8,
      "bool": np.bool_, "int64": np.int64}


def world(islands):
    return sum(map(len, islands))


def staged_sets(islands):
    """All ranks, the first island only, and the last island only."""
    return {"all": list(range(world(islands))), "first": list(islands[0]), "last": list(islands[-1])}


def values(n, rank, dtype, seed=0):
    if dtype == "bool":
        return (np.arange(n) + rank + seed) % 3 == 0
    rng = np.random.default_rng(1000 * seed + rank)
    if dtype.startswith("float"):
        return rng.standard_normal(n).astype(NP[dtype])
    return rng.integers(0, 4, n).astype(NP[dtype])


def run(islands, kind, dtype, op, ins, outs, staged=(), chunk=0, root=0, in_counts=None, out_counts=None, algo="",
        stage_beta=0.0):
    w = world(islands)
    return _C.local_run(w, K[kind], D[dtype], O[op], root, ins, outs,
                        [list(in_counts)] * w if in_counts else [], [list(out_counts)] * w if out_counts else [],
                        algorithm=algo, islands=islands, staged_ranks=list(staged), bridge_chunk=chunk,
                        stage_beta=stage_beta)


def both(islands, kind, dtype, op, make_in, make_out, staged, chunk, **kw):
    """The same collective unstaged and staged: (records, outputs) for each."""
    got = []
    for s, c in (((), 0), (staged, chunk)):
        ins, outs = make_in(), make_out()
        recs = run(islands, kind, dtype, op, ins, outs, staged=s, chunk=c, **kw)
        got.append((recs, ins if kind in ("all_reduce", "broadcast") else outs))
    return got


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("which", ["all", "first", "last"])
@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("float64", "max"), ("int32", "product"),
                                      ("int16", "sum"), ("uint8", "min"), ("bool", "bor"), ("float32", "avg")])
@pytest.mark.parametrize("n", [0, 1, 7, 1001])
def test_staged_all_reduce_equals_unstaged_bitwise(shape, which, dtype, op, n):
    islands = SHAPES[shape]
    w, staged = world(islands), staged_sets(islands)[which]
    (plain, a), (bridged, b) = both(islands, "all_reduce", dtype, op,
                                    lambda: [values(n, r, dtype) for r in range(w)], lambda: [None] * w,
                                    staged, 1000, algo="hier")
    assert {r["algorithm"] for r in bridged} == {"hier"}
    for r in range(w):
        np.testing.assert_array_equal(a[r], b[r])
        np.testing.assert_array_equal(b[r], b[0])
    # Each island's staged ranks together copy every element up and down once.
    esize = np.dtype(NP[dtype]).itemsize
    for members in islands:
        if set(members) <= set(staged):
            assert sum(bridged[r]["staged_bytes"] for r in members) == 2 * n * esize
        if not set(members) & set(staged):
            assert all(bridged[r]["staged_bytes"] == 0 for r in members)
    assert [t["tier"] for t in bridged[0]["tiers"]] == [t["tier"] for t in plain[0]["tiers"]]


def test_large_staged_all_reduce_is_pipelined_in_chunks_and_exact():
    """4 MiB over 3+2+1 with copies as slow as the wire (100 MB/s): the cost model cuts it into chunks
    whose copies overlap each other's wire time; integer-valued floats keep the sums exact."""
    islands = SHAPES["3+2+1"]
    n = 1 << 20
    ins = [np.arange(n, dtype=np.float32) % 97 + r for r in range(6)]
    bridged = run(islands, "all_reduce", "float32", "sum", ins, [None] * 6, staged=range(6), algo="hier",
                  stage_beta=1e8)
    b = ins
    ref = (np.arange(n) % 97) * 6.0 + 15
    assert 0 < bridged[0]["chunk_bytes"] < 4 * n, bridged[0]
    for r in range(6):
        np.testing.assert_array_equal(b[r], ref)
    for members in islands:
        assert sum(bridged[r]["staged_bytes"] for r in members) == 2 * 4 * n


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("which", ["all", "first", "last"])
@pytest.mark.parametrize("chunk", [0, 1001, 1 << 20])
def test_staged_all_gather_v_and_reduce_scatter_v_equal_unstaged(shape, which, chunk):
    """Uneven counts (one rank empty), bridge chunks that cut messages mid-element and whole."""
    islands = SHAPES[shape]
    w, staged = world(islands), staged_sets(islands)[which]
    counts = [(3001 * (r + 1)) % 4001 for r in range(w)]
    counts[1] = 0
    total = sum(counts)
    (_, a), (bridged, b) = both(islands, "all_gather_v", "float64", "sum",
                                lambda: [values(counts[r], r, "float64") for r in range(w)],
                                lambda: [np.zeros(total) for _ in range(w)], staged, chunk,
                                out_counts=counts, algo="hier_ag")
    ref = np.concatenate([values(counts[r], r, "float64") for r in range(w)])
    assert {r["algorithm"] for r in bridged} == {"hier_ag"}
    for r in range(w):
        np.testing.assert_array_equal(b[r], ref)
        np.testing.assert_array_equal(a[r], b[r])
    assert all(bridged[r]["staged_bytes"] == 0 for r in range(w) if r not in staged)
    if which == "all":  # every island copies down the other islands' ranges once, and copies up what it sends
        down = sum(total - sum(counts[m] for m in members) for members in islands) * 8
        up = sum(t["bytes"] for rec in bridged for t in rec["tiers"] if t["tier"] == "inter")
        assert down <= sum(rec["staged_bytes"] for rec in bridged) <= down + up

    (_, a), (bridged, b) = both(islands, "reduce_scatter_v", "int32", "sum",
                                lambda: [values(total, r, "int32", seed=1) for r in range(w)],
                                lambda: [np.zeros(c, np.int32) for c in counts], staged, chunk,
                                in_counts=counts, algo="hier_rs")
    full = sum(values(total, r, "int32", seed=1).astype(np.int64) for r in range(w))
    off = np.cumsum([0] + counts)
    assert {r["algorithm"] for r in bridged} == {"hier_rs"}
    for r in range(w):
        np.testing.assert_array_equal(b[r], full[off[r]:off[r + 1]])
        np.testing.assert_array_equal(a[r], b[r])
    for r in range(w):
        if r not in staged:
            assert bridged[r]["staged_bytes"] == 0


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("root", [0, 3])
def test_staged_broadcast_copies_the_root_buffer_up_once(shape, root):
    islands = SHAPES[shape]
    w = world(islands)
    n = 25_001
    (_, a), (bridged, b) = both(islands, "broadcast", "float64", "sum",
                                lambda: [values(n, r, "float64") for r in range(w)], lambda: [None] * w,
                                list(range(w)), 4096, root=root, algo="hier_bcast")
    for r in range(w):
        np.testing.assert_array_equal(b[r], values(n, root, "float64"))
        np.testing.assert_array_equal(a[r], b[r])
    root_island = next(i for i, m in enumerate(islands) if root in m)
    leaders = [root if i == root_island else m[0] for i, m in enumerate(islands)]
    for r in range(w):
        # The root stages once for every other island's leader; each leader copies it down once.
        expected = 8 * n if (r == root or r in leaders) else 0
        assert bridged[r]["staged_bytes"] == expected, (r, [x["staged_bytes"] for x in bridged])


def test_a_rank_dying_inside_a_staged_collective_fails_every_survivor_within_the_timeout():
    islands = SHAPES["3+2+1"]
    n = 300_000
    ins = [np.ones(n, np.float32) for _ in range(6)]
    t0 = time.monotonic()
    errors = _C.local_run(6, K["all_reduce"], D["float32"], O["sum"], 0, ins, [None] * 6, [], [],
                          algorithm="hier", islands=islands, staged_ranks=list(range(6)), bridge_chunk=4096,
                          timeout_ms=2000, kill_rank=4, all_errors=True)
    waited = time.monotonic() - t0
    assert errors[4] is None  # it never joined
    for r in (0, 1, 2, 3, 5):
        assert errors[r] is not None and ("timed out" in errors[r] or "failed" in errors[r]), errors
    assert waited < 10, waited

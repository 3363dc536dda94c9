"""The owner exchange of the hierarchical all-reduce (hier_owner.cpp) on thread ranks.

Across islands the all-reduce is a reduce-scatter + all-gather: island j reduces its share f_j of each
chunk and sends the results back, so an island moves (1 + (k-2) f_j) x B each way instead of the direct
exchange's (k-1) x B, and a slow uplink gets a small share.  Each element is still reduced once in island
order, so at the same chunking the results must equal the direct exchange's bit for bit (random floats,
every op, odd sizes, 2 to 4 islands of uneven sizes, staged or not; where the cost model cuts the two
into different chunks, floats agree to rounding and integers exactly), every rank must hold the same
bits, and the bytes each rank sends must follow the shares:
with uplinks 150 / 100 / 50 MB/s on 3+2+1 the 50 MB/s island reduces nothing and sends B once.
"""
import numpy as np
import pytest

import hcomm  # noqa: F401  (loads torch before the extension)
from hcomm import _C

K, D, O = _C.OP_KINDS, _C.DTYPES, _C.REDUCE_OPS
AUTO, DIRECT, OWNER = 0, 1, 2
SHAPES = {"2x2": [[0, 1], [2, 3]], "3+2+1": [[0, 1, 2], [3, 4], [5]], "1+1+1+1": [[0], [1], [2], [3]],
          "2+1+3": [[0, 1], [2], [3, 4, 5]], "interleaved": [[0, 2, 4], [1, 3], [5]]}
NP = {"float32": np.float32, "float64": np.float64, "int32": np.int32, "int16": np.int16, "bool": np.bool_}


def world(islands):
    return sum(map(len, islands))


def inputs(n, w, dtype, seed=0):
    out = []
    for r in range(w):
        rng = np.random.default_rng(100 * seed + r)
        if dtype == "bool":
            out.append(rng.integers(0, 2, n).astype(bool))
        elif dtype.startswith("float"):
            out.append(rng.standard_normal(n).astype(NP[dtype]))
        else:
            out.append(rng.integers(-3, 4, n).astype(NP[dtype]))
    return out


def all_reduce(islands, dtype, op, ins, exchange, betas=(), staged=()):
    w = world(islands)
    return _C.local_run(w, K["all_reduce"], D[dtype], O[op], 0, ins, [None] * w, [], [], algorithm="hier",
                        islands=islands, island_betas=list(betas), exchange=exchange, staged_ranks=list(staged))


def inter_bytes(rec):
    return next(t["bytes"] for t in rec["tiers"] if t["tier"] == "inter")


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("float64", "max"), ("float32", "min"), ("int32", "product"),
                                      ("int16", "sum"), ("bool", "bor"), ("float32", "avg"), ("float64", "avg")])
@pytest.mark.parametrize("n", [0, 1, 7, 1001, 65_537])
@pytest.mark.parametrize("betas", [(), "uneven"])
def test_owner_exchange_equals_the_direct_one_bitwise(shape, dtype, op, n, betas):
    islands = SHAPES[shape]
    w = world(islands)
    b = [] if betas == () else [1.5e8 / (i + 1) for i in range(len(islands))]
    direct, owner = inputs(n, w, dtype), inputs(n, w, dtype)
    rd = all_reduce(islands, dtype, op, direct, DIRECT, b)
    ro = all_reduce(islands, dtype, op, owner, OWNER, b)
    for r in range(w):
        np.testing.assert_array_equal(owner[r], owner[0])
        if rd[0]["chunk_bytes"] == ro[0]["chunk_bytes"] or not dtype.startswith("float"):
            np.testing.assert_array_equal(owner[r], direct[r])
        else:
            # The cost model cut the two into different chunks (the owner exchange pipelines its two phases),
            # so the intra-island rings sum in another order: equal to rounding.
            tol = 1e-5 if dtype == "float32" else 1e-13
            np.testing.assert_allclose(owner[r], direct[r], rtol=tol, atol=tol)


@pytest.mark.parametrize("staged", ["all", "last island"])
def test_owner_exchange_through_the_staging_bridge(staged):
    islands = SHAPES["3+2+1"]
    n = 300_001
    ranks = range(6) if staged == "all" else [5]
    # integer-valued floats: exact whatever chunks the cost model picks with and without the copies
    direct = [a.astype(np.float32) for a in inputs(n, 6, "int32", seed=3)]
    owner = [a.copy() for a in direct]
    all_reduce(islands, "float32", "sum", direct, DIRECT)
    recs = all_reduce(islands, "float32", "sum", owner, OWNER, staged=ranks)
    for r in range(6):
        np.testing.assert_array_equal(owner[r], direct[r])
    assert recs[5]["staged_bytes"] == 2 * 4 * n  # island c's one rank stages the whole buffer


def test_shares_follow_the_uplinks_and_spare_the_slowest_island():
    """3+2+1 with uplinks 150 / 100 / 50 MB/s: island c (one rank) owns nothing, so it sends its partial
    once (B) and receives the results once; islands a and b reduce 80% / 20% (equal times:
    (1 + 0.8) / 150 = (1 + 0.2) / 100).  The direct exchange would have c send 2 B."""
    islands = SHAPES["3+2+1"]
    n = 300_000
    betas = [1.5e8, 1e8, 5e7]
    owner = all_reduce(islands, "float32", "sum", inputs(n, 6, "float32"), OWNER, betas)
    direct = all_reduce(islands, "float32", "sum", inputs(n, 6, "float32"), DIRECT, betas)
    B = 4 * n
    assert inter_bytes(direct[5]) == 2 * B
    assert inter_bytes(owner[5]) == B
    island_a = sum(inter_bytes(owner[r]) for r in (0, 1, 2))
    island_b = sum(inter_bytes(owner[r]) for r in (3, 4))
    assert island_a == pytest.approx(1.8 * B, rel=1e-3) and island_b == pytest.approx(1.2 * B, rel=1e-3)
    # Equal uplinks: every island owns a third and moves 4/3 B.
    equal = all_reduce(islands, "float32", "sum", inputs(n, 6, "float32"), OWNER, [1e8] * 3)
    assert inter_bytes(equal[5]) == pytest.approx(4 / 3 * B, rel=1e-3)


def test_the_cost_model_takes_the_owner_exchange_from_three_islands_up_for_large_buffers():
    n = 1_000_000
    B = 4 * n
    three = all_reduce(SHAPES["3+2+1"], "float32", "sum", inputs(n, 6, "float32"), AUTO, [1.5e8, 1e8, 5e7])
    assert inter_bytes(three[5]) == B  # owner: the slow island sends its partial once
    two = all_reduce(SHAPES["2x2"], "float32", "sum", inputs(n, 4, "float32"), AUTO)
    assert inter_bytes(two[0]) == B // 2  # direct: each rank sends its half-shard once to the other island
    small = all_reduce(SHAPES["3+2+1"], "float32", "sum", inputs(8, 6, "float32"), AUTO, [1.5e8, 1e8, 5e7])
    assert inter_bytes(small[5]) == 2 * 32  # a tiny buffer: one round of messages beats two

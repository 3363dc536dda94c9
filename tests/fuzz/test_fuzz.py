"""Bounded fuzz (issue 18, item 4): random sequences of every collective against an exact reference.

4 worker processes; ~3,000 operations over a flat group of 4 (cost model, and
every algorithm forced in turn at random), a flat group of 3 (odd world),
islands 2+2, uneven 3+1 and interleaved {0,2}{1,3}.  Every result is compared
byte for byte with a reference each rank computes from every rank's
deterministic input (tests/fuzz/fuzz_ops.py).  The long run is
benchmarks/reliability/fuzz_soak.py.

Bugs the fuzz found have a test each at the end (both fixed: an empty
receive from any source, non-canonical bools from gloo's SUM).
"""
import collections
import datetime

import pytest
import torch
import torch.distributed as dist

from tests.fuzz import fuzz_ops
from tests.helpers.mp import Pool

WORLD = 4
MAX_N = 1 << 20

# (configuration, seed, operations, force algorithms)
RUNS = [
    ("flat", 11, 600, False),
    ("flat", 12, 600, True),
    ("flat3", 13, 450, True),
    ("islands_2_2", 14, 450, True),
    ("islands_3_1", 15, 450, True),
    ("islands_interleaved", 16, 450, True),
]


@pytest.fixture(scope="module")
def fuzz_pool():
    p = Pool(WORLD, setup="groups", env={"HCOMM_PROFILE": "off"}, timeout_s=300, group_timeout_s=60)
    yield p
    p.close()


_totals = collections.Counter()


@pytest.mark.parametrize("config, seed, n_ops, forced", RUNS, ids=[f"{r[0]}-{'forced' if r[3] else 'model'}"
                                                                     for r in RUNS])
def test_fuzz_sequence_matches_exact_reference(fuzz_pool, config, seed, n_ops, forced):
    results = [r for r in fuzz_pool.run(fuzz_ops.case_fuzz, config, seed, n_ops, MAX_N, forced, timeout_s=300)
               if r is not None]
    bad = sum(r["mismatches"] for r in results)
    first = [line for r in results for line in r["first"]]
    _totals["ops"] += n_ops
    _totals["mismatches"] += bad
    print(f"\nfuzz {config} seed {seed}: {n_ops} ops x {len(results)} ranks, {bad} mismatches, "
          f"{max(r['seconds'] for r in results):.1f} s; totals so far {_totals['ops']} ops, "
          f"{_totals['mismatches']} mismatches; per op {results[0]['per_op']}")
    assert bad == 0, "\n".join(first)
    # Every rank ran the same sequence.
    assert all(r["per_op"] == results[0]["per_op"] for r in results)
    if forced and config.startswith("islands"):
        # The hierarchical algorithms did run on the island groups (hier_rs / hier_ag take contiguous
        # islands only: on the interleaved layout they fall back).
        ran = {k.split(":")[1] for k in results[0]["algorithms"]}
        want = {"hier", "hier_bcast"} if config == "islands_interleaved" else {"hier", "hier_rs", "hier_ag", "hier_bcast"}
        assert want <= ran, ran


def test_sequences_cover_every_op_dtype_and_size_class():
    """The drawn plans alone (no communication): every op kind, dtype, reduce op, the sizes 0 and 1, odd sizes,
    sizes >= 2**20 - 3, roots on every rank, both sync and async."""
    import random

    import hcomm  # noqa: F401

    ops, dtypes, reds, roots, asyncs, sizes = set(), set(), set(), set(), set(), set()
    for config, seed, n_ops, forced in RUNS:
        rng = random.Random(seed)
        for _ in range(n_ops):
            p = fuzz_ops.draw_plan(rng, 3 if config == "flat3" else WORLD, MAX_N, [""])
            ops.add(p["op"])
            dtypes.add(p.get("dtype"))
            reds.add(p.get("red"))
            roots.add(p["root"])
            asyncs.add(p["async"])
            sizes.update(x for x in [p.get("n"), p.get("k")] if x is not None)
    assert ops == set(fuzz_ops.OPS)
    assert set(fuzz_ops.MOVE_DTYPES) <= dtypes
    assert set(fuzz_ops.REDUCE_OPS) <= reds
    assert roots == set(range(WORLD)) and asyncs == {True, False}
    assert {0, 1} <= sizes and any(s % 2 and s > 1 for s in sizes) and max(sizes) >= (1 << 20) - 3


def test_comparison_is_bytewise():
    a = fuzz_ops.move_input(1, 2, 3, 64, torch.float32)
    b = a.clone()
    assert fuzz_ops.same_bits(a, b)
    b.view(torch.uint8)[17] ^= 1
    assert not fuzz_ops.same_bits(a, b)
    z = torch.zeros(3)
    assert not fuzz_ops.same_bits(z, -z)  # -0.0 is not 0.0 here, though torch.equal says it is
    assert not fuzz_ops.same_bits(torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int64))


# ----------------------------------------------------------------- bugs the fuzz found

def case_bool_sum_bytes(ctx, algorithm: str):
    import hcomm

    h = ctx.groups[3][1]
    if h is None:
        return None
    hcomm.set_algorithm(algorithm, h)
    try:
        t = torch.tensor([True, True, False, True])  # three ranks: True + True + True
        hcomm.all_reduce(t, group=h)
        return {"bytes": t.view(torch.uint8).tolist(), "algorithm": hcomm.last_op(h)["algorithm"]}
    finally:
        hcomm.set_algorithm("", h)


def test_bool_sum_on_hcomm_kernels_is_canonical(fuzz_pool):
    for r in fuzz_pool.run(case_bool_sum_bytes, "ring")[:3]:
        assert r["algorithm"] == "ring" and r["bytes"] == [1, 1, 0, 1]


def test_bool_sum_on_native_path_is_canonical(fuzz_pool):
    for r in fuzz_pool.run(case_bool_sum_bytes, "native")[:3]:
        assert r["algorithm"] == "native"
        assert r["bytes"] == [1, 1, 0, 1]


def case_zero_any_source(ctx):
    import hcomm

    dist.init_process_group("hcomm", init_method=f"file://{ctx.tmp}/zero-any", rank=ctx.rank, world_size=2,
                            timeout=datetime.timedelta(seconds=3))
    if ctx.rank == 0:
        hcomm.send(torch.zeros(0, dtype=torch.int64), 1, tag=7)
    else:
        hcomm.recv(torch.zeros(0, dtype=torch.int64), None, tag=7)  # any source
    return "ok"  # the worker exits with os._exit, so the group is never torn down


def test_zero_element_any_source_receive():
    p = Pool(2, setup="bare", timeout_s=60)
    try:
        p.run(case_zero_any_source)
    finally:
        p.close()

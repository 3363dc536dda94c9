"""Thread-rank tier: the non-reducing algorithms on every dtype (fp8 included).

ring_ag (all_gather, all_gather_v), tree (broadcast), pairwise (all_to_all,
all_to_all_v), direct (gather, scatter), dissemination (barrier); worlds
1-4, sizes 0, 1, 7, plus one million-element case each.
"""
import pytest
import torch

from tests.helpers import local
from tests.helpers.ref import ALL_DTYPES, make_input, same

WORLDS = [1, 2, 3, 4]
SIZES = [0, 1, 7]
DTYPE_IDS = [str(d).split(".")[-1] for d in ALL_DTYPES]


def _inp(r, world, n, dtype, salt=0):
    # fp8 holds small integers exactly (e4m3 up to 16 without rounding, e5m2 up to 8).
    return make_input(r, world, n, dtype, "sum", salt)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=DTYPE_IDS)
def test_ring_all_gather_concatenates_in_rank_order(dtype):
    for world in WORLDS:
        for n in SIZES:
            inputs = [_inp(r, world, n, dtype) for r in range(world)]
            outs = [torch.zeros(n * world, dtype=dtype) for _ in range(world)]
            recs = local.run(world, "all_gather", dtype, inputs, outs, algorithm="ring_ag")
            expected = torch.cat(inputs)
            for r in range(world):
                assert same(outs[r], expected), (world, n, r)
            assert recs[0]["algorithm"] == "ring_ag"


@pytest.mark.parametrize("counts", [[3, 0, 5, 1], [0, 0, 0], [2], [0, 7], [1, 1, 4]])
def test_ring_all_gather_v_uneven_and_empty_contributions(counts):
    world, dtype = len(counts), torch.int16
    inputs = [_inp(r, world, counts[r], dtype, salt=r) for r in range(world)]
    outs = [torch.full((sum(counts),), -1, dtype=dtype) for _ in range(world)]
    local.run(world, "all_gather_v", dtype, inputs, outs, output_counts=[counts] * world, algorithm="ring_ag")
    for r in range(world):
        assert same(outs[r], torch.cat(inputs)), (counts, r)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=DTYPE_IDS)
def test_tree_broadcast_from_every_root(dtype):
    for world in WORLDS:
        for n in SIZES:
            for root in range(world):
                bufs = [_inp(r, world, n, dtype, salt=r + 1) for r in range(world)]
                expected = bufs[root].clone()
                local.run(world, "broadcast", dtype, bufs, root=root, algorithm="tree")
                for r in range(world):
                    assert same(bufs[r], expected), (world, n, root, r)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=DTYPE_IDS)
def test_pairwise_all_to_all_equal_blocks(dtype):
    for world in WORLDS:
        for block in SIZES:
            inputs = [_inp(r, world, block * world, dtype, salt=r) for r in range(world)]
            outs = [torch.zeros(block * world, dtype=dtype) for _ in range(world)]
            local.run(world, "all_to_all", dtype, inputs, outs, algorithm="pairwise")
            for r in range(world):
                expected = torch.cat([inputs[s][r * block:(r + 1) * block] for s in range(world)])
                assert same(outs[r], expected), (world, block, r)


def test_pairwise_all_to_all_v_uneven_matrix():
    # send[s][d]: elements rank s sends to rank d (zeros included).
    send = [[0, 2, 1], [3, 0, 0], [1, 1, 5]]
    world, dtype = 3, torch.float64
    inputs = [_inp(s, world, sum(send[s]), dtype, salt=s) for s in range(world)]
    recv = [[send[s][d] for s in range(world)] for d in range(world)]
    outs = [torch.full((sum(recv[d]),), -1.0, dtype=dtype) for d in range(world)]
    local.run(world, "all_to_all_v", dtype, inputs, outs, input_counts=send, output_counts=recv,
              algorithm="pairwise")
    for d in range(world):
        parts = []
        for s in range(world):
            off = sum(send[s][:d])
            parts.append(inputs[s][off:off + send[s][d]])
        assert same(outs[d], torch.cat(parts)), d


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=DTYPE_IDS)
def test_direct_gather_and_scatter_every_root(dtype):
    for world in WORLDS:
        for n in SIZES:
            for root in range(world):
                inputs = [_inp(r, world, n, dtype, salt=r) for r in range(world)]
                outs = [torch.zeros(n * world if r == root else 0, dtype=dtype) for r in range(world)]
                local.run(world, "gather", dtype, inputs, outs, root=root, algorithm="direct")
                assert same(outs[root], torch.cat(inputs)), ("gather", world, n, root)

                full = _inp(root, world, n * world, dtype, salt=9)
                ins = [full.clone() if r == root else torch.zeros(0, dtype=dtype) for r in range(world)]
                outs = [torch.zeros(n, dtype=dtype) for _ in range(world)]
                local.run(world, "scatter", dtype, ins, outs, root=root, algorithm="direct")
                for r in range(world):
                    assert same(outs[r], full[r * n:(r + 1) * n]), ("scatter", world, n, root, r)


def test_dissemination_barrier_completes_on_every_world_size():
    for world in range(1, 6):
        recs = local.run(world, "barrier", torch.uint8, [None] * world, algorithm="dissemination")
        assert [rec["algorithm"] for rec in recs] == ["dissemination"] * world
        assert [rec["op"] for rec in recs] == ["barrier"] * world


def test_million_element_data_movement():
    world, n = 3, 1_000_003
    dtype = torch.bfloat16
    inputs = [_inp(r, world, n, dtype, salt=r) for r in range(world)]
    outs = [torch.empty(n * world, dtype=dtype) for _ in range(world)]
    local.run(world, "all_gather", dtype, inputs, outs, algorithm="ring_ag")
    for r in range(world):
        assert same(outs[r], torch.cat(inputs))
    bufs = [t.clone() for t in inputs]
    local.run(world, "broadcast", dtype, bufs, root=2, algorithm="tree")
    for r in range(world):
        assert same(bufs[r], inputs[2])
    m = (n // world) * world
    ins = [t[:m].clone() for t in inputs]
    outs = [torch.empty(m, dtype=dtype) for _ in range(world)]
    local.run(world, "all_to_all", dtype, ins, outs, algorithm="pairwise")
    b = m // world
    for r in range(world):
        assert same(outs[r], torch.cat([ins[s][r * b:(r + 1) * b] for s in range(world)]))

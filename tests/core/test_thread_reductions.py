"""Thread-rank tier: hcomm's reducing algorithms (ring, ring_rs, direct reduce) on every dtype x op.

Each case runs on worlds 1-4 and sizes 0, 1, 7 and checks exact values
against tests.helpers.ref, and that every rank ends bitwise identical.
"""
import pytest
import torch

from tests.helpers import local
from tests.helpers.ref import OPS, REDUCE_DTYPES, make_input, op_applies, reduce_ref, same

WORLDS = [1, 2, 3, 4]
SIZES = [0, 1, 7]
CASES = [(d, op) for d in REDUCE_DTYPES for op in OPS if op_applies(op, d)]
IDS = [f"{str(d).split('.')[-1]}-{op}" for d, op in CASES]


@pytest.mark.parametrize("dtype,op", CASES, ids=IDS)
def test_ring_all_reduce_is_exact_and_identical_on_every_rank(dtype, op):
    for world in WORLDS:
        for n in SIZES:
            inputs = [make_input(r, world, n, dtype, op) for r in range(world)]
            expected = reduce_ref(inputs, op)
            bufs = [t.clone() for t in inputs]
            records = local.run(world, "all_reduce", dtype, bufs, reduce=op, algorithm="ring")
            for r in range(world):
                assert same(bufs[r], expected), (world, n, r, bufs[r], expected)
            assert all(rec["algorithm"] == "ring" for rec in records)


@pytest.mark.parametrize("dtype,op", CASES, ids=IDS)
def test_direct_reduce_lands_on_root_for_every_root(dtype, op):
    for world in WORLDS:
        for n in (0, 7):
            inputs = [make_input(r, world, n, dtype, op) for r in range(world)]
            expected = reduce_ref(inputs, op)
            for root in range(world):
                bufs = [t.clone() for t in inputs]
                records = local.run(world, "reduce", dtype, bufs, reduce=op, root=root, algorithm="direct")
                assert same(bufs[root], expected), (world, n, root)
                assert records[root]["algorithm"] == "direct"


@pytest.mark.parametrize("dtype,op", CASES, ids=IDS)
def test_ring_reduce_scatter_equal_blocks_exact_and_input_untouched(dtype, op):
    for world in WORLDS:
        for block in SIZES:
            inputs = [make_input(r, world, block * world, dtype, op) for r in range(world)]
            full = reduce_ref(inputs, op)
            bufs = [t.clone() for t in inputs]
            outs = [torch.empty(block, dtype=dtype) for _ in range(world)]
            local.run(world, "reduce_scatter", dtype, bufs, outs, reduce=op, algorithm="ring_rs")
            for r in range(world):
                assert same(outs[r], full[r * block:(r + 1) * block]), (world, block, r)
                assert same(bufs[r], inputs[r]), "reduce_scatter must not modify its input"


def test_reduce_scatter_v_uneven_blocks_including_empty_ones():
    dtype, op = torch.int32, "sum"
    for counts in ([3, 0, 5, 1], [0, 0, 0, 2], [1, 2, 3], [0, 4]):
        world = len(counts)
        total = sum(counts)
        inputs = [make_input(r, world, total, dtype, op) for r in range(world)]
        full = reduce_ref(inputs, op)
        outs = [torch.full((counts[r],), -1, dtype=dtype) for r in range(world)]
        local.run(world, "reduce_scatter_v", dtype, [t.clone() for t in inputs], outs, reduce=op,
                  input_counts=[counts] * world, algorithm="ring_rs")
        off = [sum(counts[:r]) for r in range(world)]
        for r in range(world):
            assert same(outs[r], full[off[r]:off[r] + counts[r]]), (counts, r)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64, torch.float32, torch.bfloat16])
def test_avg_rounds_integers_towards_zero_and_divides_floats(dtype):
    world = 3
    # Sums that are not multiples of 3, negative and positive: ints truncate towards zero.
    vals = [torch.tensor([1, -1, 2, -2, 4, -4, 0], dtype=torch.int64) + r for r in range(world)]
    inputs = [v.to(dtype) for v in vals]
    sums = sum(v for v in vals)  # [3, 0, 6, -3, 15, -9, 3] shifted: exact in every dtype here
    if dtype.is_floating_point:
        expected = (sums.to(dtype) / world) if dtype != torch.bfloat16 else (sums.float() / world).to(dtype)
    else:
        expected = torch.div(sums, world, rounding_mode="trunc").to(dtype)
    for algo, kind in (("ring", "all_reduce"), ("direct", "reduce")):
        bufs = [t.clone() for t in inputs]
        local.run(world, kind, dtype, bufs, reduce="avg", root=1, algorithm=algo)
        check = range(world) if kind == "all_reduce" else [1]
        for r in check:
            assert same(bufs[r], expected), (algo, r, bufs[r], expected)


def test_float_sum_is_bitwise_identical_across_ranks_with_inexact_values():
    # Values whose sum depends on order: every rank must still hold the same bits,
    # because each block is reduced once by its owner and then copied.
    world, n = 4, 1001
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(n, generator=g, dtype=torch.float32) * 1e3 for _ in range(world)]
    bufs = [t.clone() for t in inputs]
    local.run(world, "all_reduce", torch.float32, bufs, reduce="sum", algorithm="ring")
    for r in range(1, world):
        assert torch.equal(bufs[r].view(torch.int32), bufs[0].view(torch.int32))
    assert torch.allclose(bufs[0], sum(inputs), rtol=1e-5, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_ring_all_reduce_million_elements(dtype):
    world, n = 4, 1_000_003
    inputs = [make_input(r, world, n, dtype, "sum") for r in range(world)]
    expected = reduce_ref(inputs, "sum")
    bufs = [t.clone() for t in inputs]
    local.run(world, "all_reduce", dtype, bufs, reduce="sum", algorithm="ring")
    for r in range(world):
        assert same(bufs[r], expected)


def test_ring_reduce_scatter_million_elements_uneven():
    world = 3
    counts = [333_334, 333_335, 333_334]
    total = sum(counts)  # 1000003
    inputs = [make_input(r, world, total, torch.float32, "max") for r in range(world)]
    full = reduce_ref(inputs, "max")
    outs = [torch.empty(c, dtype=torch.float32) for c in counts]
    local.run(world, "reduce_scatter_v", torch.float32, inputs, outs, reduce="max",
              input_counts=[counts] * world, algorithm="ring_rs")
    off = [0, counts[0], counts[0] + counts[1]]
    for r in range(world):
        assert same(outs[r], full[off[r]:off[r] + counts[r]])

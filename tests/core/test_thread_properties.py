"""Thread-rank tier, property-based: random uneven counts and splits for the `_v` collectives.

Hypothesis draws world sizes 1-4 and per-rank counts (zeros included);
every result is checked exactly against a concatenation/reduction done in torch.
"""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import local
from tests.helpers.ref import make_input, reduce_ref, same

counts_st = st.integers(1, 4).flatmap(lambda w: st.lists(st.integers(0, 9), min_size=w, max_size=w))
dtype_st = st.sampled_from([torch.float32, torch.int16, torch.bfloat16, torch.uint8, torch.float64])


@settings(max_examples=30, deadline=None)
@given(counts=counts_st, dtype=dtype_st)
def test_all_gather_v_random_counts(counts, dtype):
    world = len(counts)
    inputs = [make_input(r, world, counts[r], dtype, salt=r) for r in range(world)]
    outs = [torch.zeros(sum(counts), dtype=dtype) for _ in range(world)]
    local.run(world, "all_gather_v", dtype, inputs, outs, output_counts=[counts] * world, algorithm="ring_ag")
    for r in range(world):
        assert same(outs[r], torch.cat(inputs))


@settings(max_examples=30, deadline=None)
@given(counts=counts_st, dtype=dtype_st, op=st.sampled_from(["sum", "max", "min", "product"]))
def test_reduce_scatter_v_random_counts(counts, dtype, op):
    world = len(counts)
    inputs = [make_input(r, world, sum(counts), dtype, op) for r in range(world)]
    full = reduce_ref(inputs, op)
    outs = [torch.zeros(counts[r], dtype=dtype) for r in range(world)]
    local.run(world, "reduce_scatter_v", dtype, [t.clone() for t in inputs], outs, reduce=op,
              input_counts=[counts] * world, algorithm="ring_rs")
    off = 0
    for r in range(world):
        assert same(outs[r], full[off:off + counts[r]])
        off += counts[r]


@settings(max_examples=30, deadline=None)
@given(data=st.data(), world=st.integers(1, 4))
def test_all_to_all_v_random_split_matrix(data, world):
    send = [data.draw(st.lists(st.integers(0, 6), min_size=world, max_size=world)) for _ in range(world)]
    recv = [[send[s][d] for s in range(world)] for d in range(world)]
    inputs = [torch.arange(sum(send[s]), dtype=torch.int32) + 1000 * s for s in range(world)]
    outs = [torch.full((sum(recv[d]),), -1, dtype=torch.int32) for d in range(world)]
    local.run(world, "all_to_all_v", torch.int32, inputs, outs, input_counts=send, output_counts=recv,
              algorithm="pairwise")
    for d in range(world):
        parts = [inputs[s][sum(send[s][:d]):sum(send[s][:d + 1])] for s in range(world)]
        assert same(outs[d], torch.cat(parts))


@settings(max_examples=20, deadline=None)
@given(world=st.integers(1, 4), n=st.integers(0, 50), root=st.integers(0, 3))
def test_reduce_and_broadcast_random_sizes_and_roots(world, n, root):
    root %= world
    inputs = [make_input(r, world, n, torch.int64, "sum", salt=n) for r in range(world)]
    bufs = [t.clone() for t in inputs]
    local.run(world, "reduce", torch.int64, bufs, reduce="sum", root=root, algorithm="direct")
    assert same(bufs[root], reduce_ref(inputs, "sum"))
    bufs = [t.clone() for t in inputs]
    local.run(world, "broadcast", torch.int64, bufs, root=root, algorithm="tree")
    assert all(same(b, inputs[root]) for b in bufs)

"""The data check of every definition, with collectives simulated in one process.

Each test builds every rank's buffers exactly as a run would, performs the
collective's semantics by hand (reducing in the benchmark dtype, in a
shuffled rank order, as an algorithm might), and requires 0 wrong; then it
breaks one element of the data and requires the check to notice.
"""
import random

import pytest
import torch

from hcomm.bench import definitions
from hcomm.bench.base import DTYPES, Context, redop_problem, split_offsets

CPU = torch.device("cpu")


def contexts(n, dtype="float", redop="sum", root=0):
    return [Context(r, n, dtype, redop, root, CPU, "gloo") for r in range(n)]


def reduce_all(tensors, redop, order):
    acc = tensors[order[0]].clone()
    for r in order[1:]:
        x = tensors[r]
        if redop in ("sum", "avg"):
            acc = acc + x
        elif redop == "prod":
            acc = acc * x
        elif redop == "max":
            acc = torch.maximum(acc, x)
        else:
            acc = torch.minimum(acc, x)
    if redop == "avg":
        acc = acc / len(tensors)
    return acc.to(tensors[0].dtype)


def simulate(name, ctxs, bufs, order):
    n, redop, root = len(ctxs), ctxs[0].redop, ctxs[0].root
    ins = [b.inp.clone() for b in bufs]
    if name in ("all_reduce", "reduce"):
        total = reduce_all(ins, redop, order)
        for r, b in enumerate(bufs):
            if name == "all_reduce" or r == root:
                b.out.copy_(total)
    elif name == "broadcast":
        for b in bufs:
            b.out.copy_(ins[root])
    elif name in ("all_gather", "all_gather_v"):
        for b in bufs:
            b.out.copy_(torch.cat(ins))
    elif name in ("reduce_scatter", "reduce_scatter_v"):
        total = reduce_all(ins, redop, order)
        counts = [b.out.numel() for b in bufs]
        for off, c, b in zip(split_offsets(counts), counts, bufs):
            b.out.copy_(total[off: off + c])
    elif name == "all_to_all":
        for p, b in enumerate(bufs):
            b.out.copy_(torch.cat([x.chunk(n)[p] for x in ins]))
    elif name == "all_to_all_v":
        send = bufs[0].extra["send"]
        offs = split_offsets(send)
        for p, b in enumerate(bufs):
            b.out.copy_(torch.cat([x[offs[p]: offs[p] + send[p]] for x in ins]))
    elif name in ("pingpong", "unidir"):
        for r in range(0, n - 1, 2):
            bufs[r + 1].out.copy_(ins[r])
    else:
        raise AssertionError(f"no simulation for {name}")


def run_case(name, n, dtype="float", redop="sum", root=0, nbytes=4096, seed=0):
    op = definitions.get(name)
    ctxs = contexts(n, dtype, redop, root)
    count = op.count_for(nbytes, ctxs[0].elsize, n)
    bufs = [op.prepare(c, count) for c in ctxs]
    order = list(range(n))
    random.Random(seed).shuffle(order)
    simulate(name, ctxs, bufs, order)
    return op, ctxs, bufs


@pytest.mark.parametrize("name", definitions.op_names())
@pytest.mark.parametrize("n", [2, 3, 4])
def test_correct_collective_has_no_wrong_elements(name, n):
    op, ctxs, bufs = run_case(name, n)
    assert [op.wrong(c, b) for c, b in zip(ctxs, bufs)] == [0] * n


@pytest.mark.parametrize("name", definitions.op_names())
def test_one_corrupted_output_element_is_counted(name):
    op, ctxs, bufs = run_case(name, 4)
    victim = 1 if name not in ("reduce",) else 0  # reduce: only the root's output is checked
    out = bufs[victim].out
    out[3] = out[3] + 1
    assert sum(op.wrong(c, b) for c, b in zip(ctxs, bufs)) == 1


@pytest.mark.parametrize("name", ["all_gather", "all_to_all", "all_gather_v", "all_to_all_v"])
def test_chunks_delivered_in_the_wrong_order_are_caught(name):
    # the hashed pattern makes every rank's chunk distinct, so a misrouted chunk counts
    op, ctxs, bufs = run_case(name, 4, nbytes=1 << 14)
    for b in bufs:
        b.out.copy_(b.out.flip(0))
    assert sum(op.wrong(c, b) for c, b in zip(ctxs, bufs)) > 0


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("redop", ["sum", "prod", "max", "min", "avg"])
@pytest.mark.parametrize("n", [2, 5, 8])
def test_reductions_are_exact_in_every_dtype_and_order(dtype, redop, n):
    if redop_problem(dtype, redop):
        pytest.skip(redop_problem(dtype, redop))
    for seed in range(3):
        op, ctxs, bufs = run_case("all_reduce", n, dtype, redop, nbytes=1 << 13, seed=seed)
        assert sum(op.wrong(c, b) for c, b in zip(ctxs, bufs)) == 0, (dtype, redop, n, seed)


def test_inputs_depend_on_rank_so_a_missing_contribution_is_caught():
    op, ctxs, bufs = run_case("all_reduce", 4)
    partial = reduce_all([b.inp for b in bufs[:3]], "sum", [0, 1, 2])  # rank 3 left out
    bufs[0].out.copy_(partial)
    assert op.wrong(ctxs[0], bufs[0]) > bufs[0].out.numel() // 2


def test_broadcast_non_root_starts_poisoned():
    op = definitions.get("broadcast")
    ctx = contexts(2)[1]
    buf = op.prepare(ctx, 256)
    assert op.wrong(ctx, buf) == 256  # nothing received yet: every element wrong

"""Hierarchical algorithms on in-process thread ranks: every algorithm
against exact expected values, for 1, 2 and 3 islands of uneven size,
all dtypes and ops, odd sizes, with results bitwise identical on all ranks."""
import numpy as np
import pytest
import torch

import hcomm  # noqa: F401  (loads torch before the extension)
from hcomm import _C

K, D, O = _C.OP_KINDS, _C.DTYPES, _C.REDUCE_OPS

SHAPES = {
    "one": [[0, 1, 2]],
    "2x2": [[0, 1], [2, 3]],
    "3+1": [[0, 1, 2], [3]],
    "1+3": [[0], [1, 2, 3]],
    "3+2+1": [[0, 1, 2], [3, 4], [5]],
}
SIZES = [0, 1, 7, 1001]

NP = {"float32": np.float32, "float64": np.float64, "int8": np.int8, "int16": np.int16, "int32": np.int32,
      "int64": np.int64, "uint8": np.uint8, "bool": np.bool_}


def world_of(islands):
    return sum(len(m) for m in islands)


def values(n, rank, dtype):
    """Small per-rank values whose sums/products are exact in every dtype."""
    if dtype == "bool":
        return ((np.arange(n) + rank) % 3 == 0)
    v = (np.arange(n) % 5 + rank % 3 + 1)
    return v.astype(NP.get(dtype, np.float32))


def reduce_ref(arrays, op, dtype):
    acc = arrays[0].astype(np.float64) if dtype not in ("bool",) and not dtype.startswith("int") and dtype != "uint8" \
        else arrays[0].copy()
    for a in arrays[1:]:
        if op == "sum":
            acc = (acc | a) if dtype == "bool" else acc + a
        elif op == "product":
            acc = (acc & a) if dtype == "bool" else acc * a
        elif op == "min":
            acc = np.minimum(acc, a)
        elif op == "max":
            acc = np.maximum(acc, a)
        elif op == "band":
            acc = acc & a
        elif op == "bor":
            acc = acc | a
        elif op == "bxor":
            acc = acc ^ a
    return acc


def run(islands, kind, dtype, op, ins, outs, in_counts=(), out_counts=(), algo="", root=0):
    w = world_of(islands)
    return _C.local_run(w, K[kind], D[dtype], O[op], root, ins, outs, [list(c) for c in in_counts],
                        [list(c) for c in out_counts], algorithm=algo,
                        islands=islands if len(islands) > 1 else [])


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("float64", "max"), ("int32", "product"),
                                      ("int16", "sum"), ("int64", "bxor"), ("uint8", "min"), ("bool", "bor"),
                                      ("float32", "avg")])
def test_hier_all_reduce_matches_reference_and_is_identical_on_all_ranks(shape, n, dtype, op):
    islands = SHAPES[shape]
    w = world_of(islands)
    ins = [values(n, r, dtype) for r in range(w)]
    if op == "avg":
        expected = (sum(a.astype(np.float64) for a in ins) / w).astype(np.float32)
    else:
        expected = reduce_ref([a.copy() for a in ins], op, dtype).astype(ins[0].dtype)
    recs = run(islands, "all_reduce", dtype, op, ins, [None] * w, algo="hier")
    for r in range(w):
        np.testing.assert_array_equal(ins[r], expected)
        assert ins[r].tobytes() == ins[0].tobytes()
    if len(islands) > 1:
        assert recs[0]["algorithm"] == "hier"
        assert {t["tier"] for t in recs[0]["tiers"]} == {"intra", "inter"}


def test_hier_all_reduce_large_buffer_is_pipelined_in_chunks():
    islands = SHAPES["2x2"]
    n = 3_000_001
    ins = [np.full(n, r + 1, np.float32) for r in range(4)]
    recs = run(islands, "all_reduce", "float32", "sum", ins, [None] * 4, algo="hier")
    assert all((a == 10).all() for a in ins)
    assert recs[0]["chunk_bytes"] > 0


def test_hier_bf16_fp16_accumulate_exactly_for_representable_sums():
    islands = SHAPES["3+1"]
    for dt in (torch.bfloat16, torch.float16):
        ins = [torch.full((513,), float(r + 1), dtype=dt).view(torch.int16).numpy().copy() for r in range(4)]
        run(islands, "all_reduce", str(dt).split(".")[1], "sum", ins, [None] * 4, algo="hier")
        for a in ins:
            assert torch.equal(torch.from_numpy(a).view(dt), torch.full((513,), 10.0, dtype=dt))


@pytest.mark.parametrize("shape", ["2x2", "3+1", "1+3", "3+2+1"])
@pytest.mark.parametrize("uneven", [False, True])
def test_hier_reduce_scatter_v_and_all_gather_v(shape, uneven):
    islands = SHAPES[shape]
    w = world_of(islands)
    counts = [(r * 3 + 1) % 5 for r in range(w)] if uneven else [4] * w
    total, off = sum(counts), np.cumsum([0] + counts)
    ins = [np.arange(total, dtype=np.int64) * (r + 1) for r in range(w)]
    outs = [np.zeros(c, np.int64) for c in counts]
    kind = "reduce_scatter_v" if uneven else "reduce_scatter"
    recs = run(islands, kind, "int64", "sum", ins, outs, in_counts=[counts] * w if uneven else ())
    assert recs[0]["algorithm"] == "hier_rs"
    for r in range(w):
        np.testing.assert_array_equal(outs[r], np.arange(off[r], off[r + 1]) * (w * (w + 1) // 2))
        np.testing.assert_array_equal(ins[r], np.arange(total, dtype=np.int64) * (r + 1))  # input untouched
    ins = [np.full(counts[r], r + 7, np.int32) for r in range(w)]
    outs = [np.zeros(total, np.int32) for _ in range(w)]
    kind = "all_gather_v" if uneven else "all_gather"
    recs = run(islands, kind, "int32", "sum", ins, outs, out_counts=[counts] * w if uneven else ())
    assert recs[0]["algorithm"] == "hier_ag"
    expected = np.concatenate([np.full(c, r + 7, np.int32) for r, c in enumerate(counts)])
    for r in range(w):
        np.testing.assert_array_equal(outs[r], expected)


@pytest.mark.parametrize("shape", ["2x2", "3+1", "3+2+1"])
@pytest.mark.parametrize("root", [0, 3])
def test_hier_broadcast_from_any_island(shape, root):
    islands = SHAPES[shape]
    w = world_of(islands)
    ins = [np.full(9, -1.0 if r != root else 4.5, np.float64) for r in range(w)]
    recs = run(islands, "broadcast", "float64", "sum", ins, [None] * w, root=root)
    assert recs[0]["algorithm"] == "hier_bcast"
    assert all((a == 4.5).all() for a in ins)


def test_hier_gather_family_falls_back_to_rings_when_islands_interleave():
    islands = [[0, 2], [1, 3]]
    ins = [np.full(3, r, np.int32) for r in range(4)]
    outs = [np.zeros(12, np.int32) for _ in range(4)]
    recs = run(islands, "all_gather", "int32", "sum", ins, outs)
    assert recs[0]["algorithm"] == "ring_ag"
    assert all((o == np.repeat(np.arange(4), 3)).all() for o in outs)
    # all-reduce does not need contiguous islands
    ins = [np.full(5, r + 1, np.float32) for r in range(4)]
    recs = run(islands, "all_reduce", "float32", "sum", ins, [None] * 4, algo="hier")
    assert recs[0]["algorithm"] == "hier" and all((a == 10).all() for a in ins)


def test_bandwidth_proportional_shards_change_the_split_not_the_result():
    islands = SHAPES["3+1"]
    ins = [np.arange(1000, dtype=np.float64) * (r + 1) for r in range(4)]
    recs = _C.local_run(4, K["all_reduce"], D["float64"], O["sum"], 0, ins, [None] * 4, [], [],
                        algorithm="hier", islands=islands, weights=[4.0, 1.0, 1.0, 1.0])
    for a in ins:
        np.testing.assert_array_equal(a, np.arange(1000) * 10.0)
    inter = {r: next(t["bytes"] for t in recs[r]["tiers"] if t["tier"] == "inter") for r in range(3)}
    # Weights 4:1:1 split 1000 elements 666/166/166, the 2 left over go to the
    # first ranks: rank 0 carries 2/3 of its island's cross-island traffic.
    assert (inter[0], inter[1], inter[2]) == (8 * 667, 8 * 167, 8 * 166)


def test_forced_algorithm_that_cannot_run_falls_back():
    ins = [np.ones(4, np.float32) for _ in range(3)]
    recs = _C.local_run(3, K["all_reduce"], D["float32"], O["sum"], 0, ins, [None] * 3, [], [], algorithm="hier")
    assert recs[0]["algorithm"] == "ring"  # one island: hier does not apply
    assert all((a == 3).all() for a in ins)


def test_debug_check_names_mismatched_all_to_all_v_splits():
    # rank 0 sends 2 elements to rank 1, but rank 1 expects 3 from rank 0
    send = [[1, 2], [1, 1]]
    recv = [[1, 1], [3, 1]]
    ins = [np.zeros(sum(s), np.float32) for s in send]
    outs = [np.zeros(sum(r), np.float32) for r in recv]
    with pytest.raises(hcomm.HCommError, match="rank 0 sends 2 elements to rank 1, which expects 3"):
        _C.local_run(2, K["all_to_all_v"], D["float32"], O["sum"], 0, ins, outs, send, recv, debug=True,
                     timeout_ms=3000)
    # consistent splits pass the check and move the data
    send, recv = [[1, 2], [3, 1]], [[1, 3], [2, 1]]
    ins = [np.arange(sum(s), dtype=np.float32) + 10 * r for r, s in enumerate(send)]
    outs = [np.zeros(sum(r), np.float32) for r in recv]
    _C.local_run(2, K["all_to_all_v"], D["float32"], O["sum"], 0, ins, outs, send, recv, debug=True)
    np.testing.assert_array_equal(outs[1], np.array([1, 2, 13], np.float32))

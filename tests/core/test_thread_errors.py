"""Thread-rank tier: bad arguments, dead peers and HCOMM_DEBUG mismatches.

Bad arguments raise hcomm.HCommValueError naming the problem on the calling
rank before any communication; a rank that never joins makes the others
fail within the timeout; debug checks name the disagreeing rank.
"""
import time

import pytest
import torch

import hcomm
from hcomm import _C
from tests.helpers import local


def _z(n, dtype=torch.float32):
    return torch.zeros(n, dtype=dtype)


def _raises_value(match, world, kind, dtype, inputs, outputs=None, **kw):
    with pytest.raises(hcomm.HCommValueError, match=match) as info:
        local.run(world, kind, dtype, inputs, outputs, **kw)
    assert isinstance(info.value, ValueError)
    return str(info.value)


def test_all_gather_output_not_world_times_input():
    msg = _raises_value(r"expected world size 3 x input 4 = 12", 3, "all_gather", torch.float32,
                        [_z(4)] * 3, [_z(11) for _ in range(3)])
    assert "all_gather(float32 x 4 -> 11)" in msg


def test_reduce_scatter_input_not_world_times_output():
    _raises_value(r"input has 7 elements; expected world size 2 x output 3 = 6", 2, "reduce_scatter",
                  torch.int32, [_z(7, torch.int32)] * 2, [_z(3, torch.int32) for _ in range(2)])


@pytest.mark.parametrize("kind,counts_kw,match", [
    ("all_gather_v", {"output_counts": [[1, 2]] * 2}, r"output_split_sizes sums to 3 elements but the output has 4"),
    ("all_gather_v", {"output_counts": [[1, 1, 2]] * 2}, r"output_split_sizes has 3 entries but the group has 2"),
    ("all_gather_v", {"output_counts": [[5, -1]] * 2}, r"negative entry -1"),
    ("reduce_scatter_v", {"input_counts": [[2, 1]] * 2}, r"input_split_sizes sums to 3 elements but the input has 4"),
    ("all_to_all_v", {"input_counts": [[1, 1]] * 2, "output_counts": [[2, 2]] * 2},
     r"input_split_sizes sums to 2 elements but the input has 4"),
])
def test_split_sizes_that_do_not_match_the_tensor(kind, counts_kw, match):
    _raises_value(match, 2, kind, torch.float32, [_z(4), _z(4)], [_z(4), _z(4)], **counts_kw)


def test_all_gather_v_own_count_must_match_input():
    _raises_value(r"output_split_sizes\[0\] is 1 but this rank's input has 3", 2, "all_gather_v", torch.int64,
                  [_z(3, torch.int64), _z(3, torch.int64)], [_z(4, torch.int64), _z(4, torch.int64)],
                  output_counts=[[1, 3]] * 2)


@pytest.mark.parametrize("kind", ["broadcast", "reduce", "gather", "scatter"])
@pytest.mark.parametrize("root", [3, -1])
def test_root_out_of_range(kind, root):
    _raises_value(rf"root {root} is out of range for a group of 3", 3, kind, torch.float32,
                  [_z(3)] * 3, [_z(9) for _ in range(3)], root=root)


def test_all_to_all_that_does_not_split_evenly():
    _raises_value(r"5 elements do not split evenly over 2 ranks", 2, "all_to_all", torch.float32,
                  [_z(5), _z(5)], [_z(5), _z(5)])


@pytest.mark.parametrize("op", ["band", "bor", "bxor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_bitwise_op_on_float_names_op_and_dtype(op, dtype):
    name = str(dtype).split(".")[-1]
    _raises_value(rf"reduce op {op} is not supported for dtype {name}", 2, "all_reduce", dtype,
                  [_z(2, dtype), _z(2, dtype)], reduce=op)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter"])
def test_fp8_reduction_is_refused_naming_the_dtype(dtype, kind):
    name = str(dtype).split(".")[-1]
    outs = [_z(1, dtype), _z(1, dtype)] if kind == "reduce_scatter" else None
    _raises_value(rf"reduce op sum is not supported for dtype {name}", 2, kind, dtype,
                  [_z(2, dtype), _z(2, dtype)], outs)


def test_reduce_supported_binding_matches_validation():
    ok, why = _C.reduce_supported(_C.DTYPES["float16"], _C.REDUCE_OPS["bxor"])
    assert (ok, "bxor" in why and "float16" in why) == (False, True)
    assert _C.reduce_supported(_C.DTYPES["bool"], _C.REDUCE_OPS["bxor"]) == (True, "")
    assert _C.reduce_supported(_C.DTYPES["int16"], _C.REDUCE_OPS["avg"])[0] is True


def test_only_the_bad_rank_is_named_when_one_rank_passes_a_wrong_size():
    outs = [_z(8), _z(8), _z(7), _z(8)]
    msg = _raises_value(r"on rank 2: output has 7 elements", 4, "all_gather", torch.float32, [_z(2)] * 4, outs)
    assert "rank 0" not in msg


def test_forced_algorithm_that_cannot_run_the_op_falls_back_to_one_that_can():
    bufs = [torch.ones(5) for _ in range(2)]
    recs = local.run(2, "all_reduce", torch.float32, bufs, algorithm="tree")
    assert [r["algorithm"] for r in recs] == ["ring", "ring"]
    assert all(torch.equal(b, torch.full((5,), 2.0)) for b in bufs)


@pytest.mark.parametrize("kind,algorithm", [("all_reduce", "ring"), ("broadcast", "tree"),
                                            ("all_gather", "ring_ag"), ("barrier", "dissemination")])
def test_root_that_never_joins_makes_the_others_time_out(kind, algorithm):
    world, timeout_ms = 3, 300
    ins = [_z(6) for _ in range(world)] if kind != "barrier" else [None] * world
    outs = [_z(18) for _ in range(world)] if kind == "all_gather" else None
    t0 = time.monotonic()
    with pytest.raises(hcomm.HCommError, match="timed out after 300 ms") as info:
        local.run(world, kind, torch.float32, ins, outs, algorithm=algorithm, timeout_ms=timeout_ms, kill_rank=0)
    elapsed = time.monotonic() - t0
    assert not isinstance(info.value, ValueError)
    # Each waiting rank gives up after one timeout; allow scheduling slack on a busy box.
    assert elapsed < 3 * timeout_ms / 1000 + 2.0, elapsed


def test_debug_check_names_the_rank_with_a_different_count():
    bufs = [_z(5), _z(5), _z(6), _z(5)]
    with pytest.raises(hcomm.HCommError) as info:
        local.run(4, "all_reduce", torch.float32, bufs, debug=True, timeout_ms=5000)
    # The first rank's error is the one raised: rank 0's.
    assert str(info.value) == ("hcomm (HCOMM_DEBUG): collective mismatch seen on rank 0 (running "
                               "all_reduce(float32 x 5, sum)): rank 2 calls all_reduce with 6 elements, rank 0 with 5")


def test_debug_check_names_reduce_ops_as_torch_spells_them():
    bufs = [_z(4) for _ in range(3)]
    errors = _C.local_run(3, _C.OP_KINDS["all_reduce"], local.dtype_code(torch.float32), _C.REDUCE_OPS["sum"], 0,
                          [b.numpy() for b in bufs], [None] * 3, [], [], debug=True, timeout_ms=5000,
                          reduce_per_rank=[_C.REDUCE_OPS[op] for op in ("sum", "sum", "max")], all_errors=True)
    for rank, err in enumerate(errors):
        assert err == (f"hcomm (HCOMM_DEBUG): collective mismatch seen on rank {rank} (running all_reduce(float32 x 4, "
                       f"{'max' if rank == 2 else 'sum'})): rank 2 calls all_reduce with reduce op MAX, rank 0 with SUM")


def test_debug_check_names_a_split_size_disagreement():
    # Each rank's call is valid on its own (its block matches its output) but the splits differ.
    ins = [_z(4), _z(4)]
    outs = [_z(2), _z(3)]
    with pytest.raises(hcomm.HCommError) as info:
        local.run(2, "reduce_scatter_v", torch.float32, ins, outs, input_counts=[[2, 2], [1, 3]],
                  debug=True, timeout_ms=5000)
    assert str(info.value) == ("hcomm (HCOMM_DEBUG): collective mismatch seen on rank 0 (running "
                               "reduce_scatter_v(float32 x 4 -> 2, sum)): rank 1 passes counts [1, 3], rank 0 [2, 2]")


def test_debug_check_lets_every_rank_learn_that_one_rank_rejected_its_call():
    # Rank 2's block count does not match its input: only it can tell, yet
    # every rank raises at once instead of waiting out the 5 s timeout.
    ins = [_z(2), _z(2), _z(2)]
    outs = [_z(6), _z(6), _z(7)]
    t0 = time.monotonic()
    errors = _C.local_run(3, _C.OP_KINDS["all_gather_v"], local.dtype_code(torch.float32), 0, 0,
                          [t.numpy() for t in ins], [t.numpy() for t in outs], [],
                          [[2, 2, 2], [2, 2, 2], [2, 2, 3]], debug=True, timeout_ms=5000, all_errors=True)
    assert time.monotonic() - t0 < 3.0
    for rank in (0, 1):
        assert errors[rank] == (f"hcomm (HCOMM_DEBUG): collective mismatch seen on rank {rank} (running "
                                "all_gather_v(float32 x 2 -> 6)): rank 2 rejected its all_gather_v call as invalid "
                                "(rank 2's own error says why)")
    assert errors[2].startswith("hcomm: all_gather_v(float32 x 2 -> 7) on rank 2: ") and "HCOMM_DEBUG" not in errors[2], errors[2]


def test_debug_check_numbers_collectives_so_a_rank_that_fell_behind_is_named():
    # Rank 1 arrives late for collective #1: rank 0's all_reduce times out and
    # it goes on to #2, a broadcast.  Rank 1's #1 (a broadcast) then meets
    # rank 0's #2: each rank says who is at which collective.
    ar, bc = _C.OP_KINDS["all_reduce"], _C.OP_KINDS["broadcast"]
    errors = _C.local_sequence(2, [[(ar, 4, 0, 0), (bc, 4, 0, 0)], [(bc, 4, 0, 1400)]], debug=True, timeout_ms=1000)
    assert errors[0][0] == "hcomm: rank 0 timed out after 1000 ms waiting for a message from rank 1"
    prefix = "hcomm (HCOMM_DEBUG): collective mismatch seen on rank %d (running broadcast(float32 x 4, root 0)): "
    assert errors[0][1] == prefix % 0 + "rank 1 is at collective #1 (broadcast), rank 0 at #2 (broadcast)"
    assert errors[1] == [prefix % 1 + "rank 1 is at collective #1 (broadcast), rank 0 at #1 (all_reduce); "
                         "a rank skipped a collective or called them in a different order"]

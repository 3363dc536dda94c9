"""Multi-process: bad calls raise ValueError on the calling rank before any communication.

Every rank makes the same bad call (so nobody is left waiting), then a good
collective proves the group is still in step.  Also: unsupported dtypes and
ops name themselves, and an HCOMM_DEBUG group names the rank whose call differs.
"""
import os

import pytest
import torch
import torch.distributed as dist


def _err(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return type(e).__name__, isinstance(e, ValueError), str(e).splitlines()[0]
    return None


def _still_in_step(h, world):
    t = torch.ones(2)
    dist.all_reduce(t, group=h)
    return torch.equal(t, torch.full((2,), float(world)))


BAD_CALLS = {
    "all_gather_into_tensor_wrong_output": (
        lambda h, w, r: dist.all_gather_into_tensor(torch.zeros(3 * w + 1), torch.zeros(3), group=h),
        r"output has \d+ elements; expected world size 4 x input 3 = 12"),
    "all_gather_list_wrong_length": (
        lambda h, w, r: dist.all_gather([torch.zeros(3)] * (w - 1), torch.zeros(3), group=h),
        r"output list has 3 tensors but the group has 4 ranks"),
    "all_gather_list_wrong_sizes": (
        lambda h, w, r: dist.all_gather([torch.zeros(2)] * w, torch.zeros(3), group=h),
        r"output tensors have 2 elements but the input has 3"),
    "reduce_scatter_tensor_wrong_input": (
        lambda h, w, r: dist.reduce_scatter_tensor(torch.zeros(2), torch.zeros(2 * w - 1), group=h),
        r"input has 7 elements; expected world size 4 x output 2 = 8"),
    "reduce_scatter_list_wrong_length": (
        lambda h, w, r: dist.reduce_scatter(torch.zeros(2), [torch.zeros(2)] * (w + 1), group=h),
        r"reduce_scatter needs one list of 4 input tensors"),
    "all_to_all_splits_not_summing": (
        lambda h, w, r: dist.all_to_all_single(torch.zeros(w), torch.zeros(w), [1] * w, [2] * w, group=h),
        r"input_split_sizes sums to 8 elements but the input has 4"),
    "all_to_all_uneven_rows": (
        lambda h, w, r: dist.all_to_all_single(torch.zeros(w + 1), torch.zeros(w + 1), group=h),
        r"does not split evenly over 4 ranks"),
    "all_to_all_list_wrong_count": (
        lambda h, w, r: dist.all_to_all([torch.zeros(1)] * w, [torch.zeros(1)] * (w - 1), group=h),
        r"all_to_all needs 4 input and output tensors"),
    "broadcast_root_out_of_range": (
        lambda h, w, r: h.broadcast([torch.zeros(2)], _opts(dist.BroadcastOptions, rootRank=w)),
        r"root 4 is out of range for a group of 4"),
    "reduce_root_out_of_range": (
        lambda h, w, r: h.reduce([torch.zeros(2)], _opts(dist.ReduceOptions, rootRank=-1)),
        r"root -1 is out of range for a group of 4"),
    "gather_root_out_of_range": (
        lambda h, w, r: h.gather([[torch.zeros(2)] * w], [torch.zeros(2)], _opts(dist.GatherOptions, rootRank=w + 2)),
        r"gather root 6 is out of range"),
    "scatter_root_out_of_range": (
        lambda h, w, r: h.scatter([torch.zeros(2)], [[torch.zeros(2)] * w], _opts(dist.ScatterOptions, rootRank=w)),
        r"scatter root 4 is out of range"),
    "allreduce_two_tensors": (
        lambda h, w, r: h.allreduce([torch.zeros(2), torch.zeros(2)], dist.AllreduceOptions()),
        r"allreduce takes exactly one tensor per call, got 2"),
    "complex_dtype": (
        # Straight to the backend: dist.all_reduce would first view complex sums as real pairs.
        lambda h, w, r: h.allreduce([torch.zeros(2, dtype=torch.complex64)], dist.AllreduceOptions()),
        r"dtype ComplexFloat is not supported"),
    "uint16_dtype": (
        lambda h, w, r: dist.all_reduce(torch.zeros(2, dtype=torch.uint16), group=h),
        r"dtype UInt16 is not supported"),
    "premul_sum_op": (
        lambda h, w, r: dist.all_reduce(torch.zeros(2), op=dist._make_nccl_premul_sum(2.0), group=h),
        r"PREMUL_SUM or unknown\) is not supported for dtype Float"),
    "bitwise_on_float": (
        lambda h, w, r: dist.all_reduce(torch.zeros(2), op=dist.ReduceOp.BXOR, group=h),
        r"reduce op bxor is not supported for dtype float32"),
    "fp8_sum": (
        lambda h, w, r: dist.all_reduce(torch.zeros(2, dtype=torch.float8_e4m3fn), group=h),
        r"reduce op sum is not supported for dtype float8_e4m3fn"),
    "mixed_dtypes": (
        lambda h, w, r: dist.all_gather_into_tensor(torch.zeros(4 * w), torch.zeros(4, dtype=torch.float64), group=h),
        r"input dtype Double differs from output dtype Float"),
    "send_to_self": (
        lambda h, w, r: h.send([torch.zeros(1)], r, 0).wait(),
        r"cannot send to or receive from itself"),
    "sparse_tensor": (
        lambda h, w, r: h.allreduce([torch.zeros(2, 2).to_sparse()], dist.AllreduceOptions()),
        r"must be a dense tensor"),
}


def _opts(cls, **kw):
    o = cls()
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def case_bad_call(ctx, name):
    fn, _ = BAD_CALLS[name]
    err = _err(lambda: fn(ctx.hcomm, ctx.world, ctx.rank))
    return err, _still_in_step(ctx.hcomm, ctx.world)


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_bad_call_raises_value_error_on_every_rank_and_group_stays_usable(pool, name):
    import re

    for err, in_step in pool.run(case_bad_call, name):
        assert err is not None, f"{name} did not raise"
        type_name, is_value_error, msg = err
        assert is_value_error, (type_name, msg)
        assert re.search(BAD_CALLS[name][1], msg), msg
        assert in_step


def case_debug_mismatch(ctx, what):
    """An HCOMM_DEBUG=1 group: rank 2 makes a different call than the others."""
    import hcomm  # noqa: F401

    h = ctx.state.get("debug_group")
    if h is None:
        os.environ["HCOMM_DEBUG"] = "1"
        try:
            h = ctx.state["debug_group"] = dist.new_group(backend="hcomm")
        finally:
            del os.environ["HCOMM_DEBUG"]
    odd = ctx.rank == 2
    if what == "count":
        call = lambda: dist.all_reduce(torch.zeros(5 if odd else 4), group=h)  # noqa: E731
    elif what == "dtype":
        call = lambda: dist.all_reduce(torch.zeros(4, dtype=torch.float64 if odd else torch.float32), group=h)  # noqa: E731
    elif what == "op":
        call = lambda: dist.all_reduce(torch.zeros(4), op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM, group=h)  # noqa: E731
    elif what == "root":
        call = lambda: dist.broadcast(torch.zeros(4), src=1 if odd else 0, group=h)  # noqa: E731
    elif what == "shape":  # same element count, different shape
        call = lambda: dist.all_reduce(torch.zeros(2, 2) if odd else torch.zeros(4), group=h)  # noqa: E731
    elif what == "kind":
        call = lambda: (dist.broadcast(torch.zeros(4), src=0, group=h) if odd  # noqa: E731
                        else dist.all_reduce(torch.zeros(4), group=h))
    else:
        call = lambda: dist.all_reduce(torch.zeros(4), group=h)  # noqa: E731
    err = _err(call)
    return err, _still_in_step(h, ctx.world)


# What every rank is told, in the words the call was written in.
DEBUG_MESSAGES = {
    "count": r"rank 2 passes shape \[5\], rank 0 \[4\]",
    "dtype": r"rank 2 calls all_reduce with dtype float64, rank 0 with float32",
    "op": r"rank 2 calls all_reduce with reduce op MAX, rank 0 with SUM",
    "root": r"rank 2 calls broadcast with root 1, rank 0 with root 0",
    "shape": r"rank 2 passes shape \[2, 2\], rank 0 \[4\]",
    "kind": (r"rank 2 is at collective #(\d+) \(broadcast\), rank 0 at #\1 \(all_reduce\); "
             r"a rank skipped a collective or called them in a different order"),
}


@pytest.mark.parametrize("what", sorted(DEBUG_MESSAGES))
def test_hcomm_debug_names_the_disagreeing_rank(pool, what):
    import re

    res = pool.run(case_debug_mismatch, what)
    for rank, (err, in_step) in enumerate(res):
        assert err is not None, f"rank {rank} did not notice the mismatch"
        type_name, is_value_error, msg = err
        assert re.fullmatch(r"hcomm \(HCOMM_DEBUG\): collective mismatch seen on rank %d \(running [^)]*\)\): %s"
                            % (rank, DEBUG_MESSAGES[what]), msg), msg
        assert not is_value_error
        assert in_step


def case_debug_after_uneven_p2p(ctx):
    """Point-to-point traffic differs per rank; the next collective must still pass the debug check."""
    h = ctx.state.get("debug_group")
    if ctx.rank == 0:
        for peer in range(1, ctx.world):
            dist.send(torch.full((2,), float(peer)), dst=peer, group=h)
        got = [float(peer) for peer in range(1, ctx.world)]
    else:
        t = torch.zeros(2)
        dist.recv(t, src=0, group=h)
        got = t.tolist()
    err = _err(lambda: dist.all_reduce(torch.zeros(3), group=h))
    return err, got


def test_hcomm_debug_ignores_point_to_point_counts_when_comparing_collectives(pool):
    pool.run(case_debug_mismatch, "none")  # creates the debug group
    res = pool.run(case_debug_after_uneven_p2p)
    for rank, (err, got) in enumerate(res):
        assert err is None, f"rank {rank}: {err}"
        assert got == ([1.0, 2.0, 3.0] if rank == 0 else [float(rank)] * 2)


def test_hcomm_debug_agreeing_calls_pass(pool):
    for err, in_step in pool.run(case_debug_mismatch, "none"):
        assert err is None and in_step

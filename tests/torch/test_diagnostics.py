"""Multi-process: what a failure tells the user (issue 19).

A failed collective is recorded as failed in ``hcomm.history()``; a timeout
names the peers this rank was still waiting for; under HCOMM_DEBUG a call
only one rank can see is invalid (an uneven ``all_gather`` list) makes every
rank raise at once instead of leaving the others to wait out the timeout.
"""
import datetime
import os
import re
import time

import torch
import torch.distributed as dist


def _msg(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return type(e).__name__, isinstance(e, ValueError), str(e).splitlines()[0]
    return None


def _debug_group(ctx):
    import hcomm  # noqa: F401

    h = ctx.state.get("diag_debug_group")
    if h is None:
        os.environ["HCOMM_DEBUG"] = "1"
        try:
            h = ctx.state["diag_debug_group"] = dist.new_group(backend="hcomm")
        finally:
            del os.environ["HCOMM_DEBUG"]
    return h


def case_history_records_failure(ctx):
    import hcomm

    h = _debug_group(ctx)
    err = _msg(lambda: dist.all_reduce(torch.zeros(5 if ctx.rank == 2 else 4), group=h))
    failed = hcomm.last_op(group=h)
    dist.all_reduce(torch.zeros(4), group=h)
    ok = hcomm.last_op(group=h)
    pick = lambda r: {k: r[k] for k in ("op", "ok", "error", "tiers")}  # noqa: E731
    return err, pick(failed), pick(ok)


def test_history_records_a_failed_collective_with_its_message(pool):
    for rank, (err, failed, ok) in enumerate(pool.run(case_history_records_failure)):
        assert err is not None
        assert failed["op"] == "all_reduce" and failed["ok"] is False, failed
        assert failed["error"].startswith(f"hcomm (HCOMM_DEBUG): collective mismatch seen on rank {rank} "), failed
        assert failed["error"] in err[2] or err[2] in failed["error"], (failed, err)
        assert ok["ok"] is True and ok["error"] is None and ok["op"] == "all_reduce", ok


def case_invalid_all_gather_on_one_rank(ctx, wrong):
    h = _debug_group(ctx)
    outs = [torch.zeros(3) for _ in range(ctx.world)]
    if ctx.rank == 2 and wrong == "sizes":
        outs[2] = torch.zeros(4)  # this rank's own block no longer matches its input
    if ctx.rank == 2 and wrong == "length":
        outs = outs[:-1]
    t0 = time.monotonic()
    if wrong == "tensor":  # all_gather_into_tensor, rank 2's output one element too long
        out = torch.zeros(3 * ctx.world + (1 if ctx.rank == 2 else 0))
        err = _msg(lambda: dist.all_gather_into_tensor(out, torch.zeros(3), group=h))
    else:
        err = _msg(lambda: dist.all_gather(outs, torch.zeros(3), group=h))
    elapsed = time.monotonic() - t0
    t = torch.ones(2)
    dist.all_reduce(t, group=h)
    return err, elapsed, torch.equal(t, torch.full((2,), float(ctx.world)))


def test_an_all_gather_only_one_rank_sees_is_invalid_reaches_every_rank_at_once_under_debug(pool):
    for wrong, op, own in (("sizes", "all_gather_v", r"hcomm: all_gather_v\(float32 x 3 -> 13\) on rank 2: "),
                           ("length", "all_gather", r"hcomm: allgather on rank 2: output list has 3 tensors"),
                           ("tensor", "all_gather", r"hcomm: all_gather_into_tensor output has 13 elements")):
        for rank, (err, elapsed, in_step) in enumerate(pool.run(case_invalid_all_gather_on_one_rank, wrong)):
            assert err is not None, f"{wrong}: rank {rank} did not raise"
            _, is_value_error, msg = err
            if rank == 2:  # its own, precise error
                assert is_value_error and re.match(own, msg), msg
            else:
                assert not is_value_error
                assert msg == (f"hcomm (HCOMM_DEBUG): collective mismatch seen on rank {rank} (running "
                               f"all_gather(float32 x 3 -> 12)): rank 2 rejected its {op} call as invalid "
                               "(rank 2's own error says why)"), msg
            assert elapsed < 5.0, (wrong, rank, elapsed)  # the pool's groups time out after far longer
            assert in_step


def case_skipped_collective_times_out(ctx):
    import hcomm

    g = dist.new_group(backend="hcomm", timeout=datetime.timedelta(seconds=1))
    hcomm.set_algorithm("ring", group=g)  # hcomm's own ring: it knows which receive is pending
    if ctx.rank == 3:
        return None  # this rank skips the collective
    return _msg(lambda: dist.all_reduce(torch.ones(64), group=g))


def test_timeout_names_the_peer_that_had_not_answered(pool):
    res = pool.run(case_skipped_collective_times_out)
    assert res[3] is None
    # Ring all-reduce, step by step: rank 0 waits for its first block from
    # rank 3 (which skipped); rank 2's first send to rank 3 is never taken;
    # rank 1 got its first block but waits for rank 0's second.  Either the
    # work's timeout or the transport's may fire first: both name the peer.
    # A rank whose peer gave up first may instead see gloo close the
    # connection, which names the peer too.
    expected = {0: r"(a message from|recv from) rank 3\b", 1: r"(a message from|recv from) rank 0\b",
                2: r"(rank 3 to take a message|send to rank 3\b)"}
    for rank in (0, 1, 2):
        _, is_value_error, msg = res[rank]
        assert not is_value_error
        assert "imed out" in msg or (rank != 0 and "closed by peer" in msg), msg
        assert re.search(expected[rank], msg), msg


def case_invalid_call_on_one_rank(ctx, op):
    """One rank (2) passes an argument only it can see is wrong."""
    h = _debug_group(ctx)
    w, bad = ctx.world, ctx.rank == 2
    calls = {
        # rank 2 is the root and lists one output too few
        "gather": lambda: dist.gather(torch.zeros(3), [torch.zeros(3) for _ in range(w - bad)] if bad else None,
                                      dst=2, group=h),
        # rank 2 is the root and gives an input one element too long
        "scatter": lambda: dist.scatter(torch.zeros(3), [torch.zeros(3 + (i == 0)) for i in range(w)] if bad
                                        else None, src=2, group=h),
        # rank 2's own input block disagrees with its output
        "reduce_scatter": lambda: dist.reduce_scatter(torch.zeros(3), [torch.zeros(3 + (bad and i == 2))
                                                                       for i in range(w)], group=h),
        # rank 2's splits do not sum to its input's rows
        "all_to_all_single": lambda: dist.all_to_all_single(
            torch.zeros(w, 2), torch.zeros(w, 2), output_split_sizes=[1] * w,
            input_split_sizes=[1] * (w - 1) + [1 + bad], group=h),
        # rank 2 lists one input too few
        "all_to_all": lambda: dist.all_to_all([torch.zeros(2) for _ in range(w)],
                                              [torch.zeros(2) for _ in range(w - bad)], group=h),
        # rank 2 passes two tensors to broadcast
        "broadcast": lambda: h.broadcast([torch.zeros(2)] * (1 + bad)).wait(),
    }
    t0 = time.monotonic()
    err = _msg(calls[op])
    elapsed = time.monotonic() - t0
    t = torch.ones(2)
    dist.all_reduce(t, group=h)
    return err, elapsed, torch.equal(t, torch.full((2,), float(ctx.world)))


def test_every_torch_entry_point_shares_a_one_rank_rejection_under_debug(pool):
    # Each op: a rejection only rank 2 can see makes the others raise at once
    # (not after the pool group's long timeout), and the group still works.
    for op in ("gather", "scatter", "reduce_scatter", "all_to_all_single", "all_to_all", "broadcast"):
        for rank, (err, elapsed, in_step) in enumerate(pool.run(case_invalid_call_on_one_rank, op)):
            assert err is not None, f"{op}: rank {rank} did not raise"
            _, is_value_error, msg = err
            if rank == 2:
                assert is_value_error and msg.startswith("hcomm: "), (op, msg)
            else:
                assert not is_value_error, (op, msg)
                assert re.match(rf"hcomm \(HCOMM_DEBUG\): collective mismatch seen on rank {rank} \(running "
                                r".*\): rank 2 rejected its \w+ call as invalid \(rank 2's own error says why\)$",
                                msg), (op, msg)
            assert elapsed < 5.0, (op, rank, elapsed)
            assert in_step, op


def case_wrapper_rejection_on_one_rank(ctx):
    """hcomm.all_gather_v's Python checks refuse rank 2's sizes before C++ sees the call."""
    import hcomm

    h = _debug_group(ctx)
    w = ctx.world
    counts = [2] * w
    if ctx.rank == 2:
        counts = [2] * w + [3]  # one entry too many
    t0 = time.monotonic()
    err = _msg(lambda: hcomm.all_gather_v(torch.zeros(2 * w), torch.zeros(2), counts, group=h))
    elapsed = time.monotonic() - t0
    t = torch.ones(2)
    dist.all_reduce(t, group=h)
    return err, elapsed, torch.equal(t, torch.full((2,), float(ctx.world)))


def test_a_python_wrapper_rejection_reaches_every_rank_under_debug(pool):
    for rank, (err, elapsed, in_step) in enumerate(pool.run(case_wrapper_rejection_on_one_rank)):
        assert err is not None, rank
        _, is_value_error, msg = err
        if rank == 2:
            assert is_value_error
            assert msg == f"hcomm: all_gather_v on rank 2: output_split_sizes has {pool.world + 1} entries but " \
                          f"the group has {pool.world} ranks", msg
        else:
            assert not is_value_error
            assert msg.endswith("rank 2 rejected its all_gather_v call as invalid (rank 2's own error says why)"), msg
        assert elapsed < 5.0, (rank, elapsed)
        assert in_step


def case_all_to_all_v_own_splits_differ(ctx):
    import hcomm

    w, r = ctx.world, ctx.rank
    send, recv = [1] * w, [1] * w
    send[r] = 2  # sends itself 2 rows, expects 1 back from itself
    return _msg(lambda: hcomm.all_to_all_v(torch.zeros(w), torch.zeros(w + 1), recv, send, group=ctx.hcomm))


def test_all_to_all_v_refuses_own_send_and_receive_that_differ(pool):
    for rank, err in enumerate(pool.run(case_all_to_all_v_own_splits_differ)):
        assert err == ("HCommValueError", True,
                       f"hcomm: all_to_all_v(float32 x {pool.world + 1} -> {pool.world}) on rank {rank}: "
                       f"input_split_sizes[{rank}] = 2 (sent to itself) differs from output_split_sizes[{rank}] = 1 "
                       "(received from itself)"), err


def case_compression_on_one_island(ctx):
    import hcomm

    g = dist.new_group(backend="hcomm")
    hcomm.set_compression("bf16", group=g)  # nothing to act on: accepted
    t = torch.full((5,), 0.25)
    hcomm.all_reduce(t, group=g)
    return torch.equal(t, torch.full((5,), 0.25) * ctx.world) or t.tolist()


def test_compression_on_a_one_island_group_is_accepted_and_leaves_results_exact(pool):
    assert pool.run(case_compression_on_one_island) == [True] * pool.world

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

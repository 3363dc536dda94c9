"""Multi-process: point-to-point, coalescing, barrier and the Work object (async, futures, timeouts)."""
import time

import pytest
import torch
import torch.distributed as dist


def case_send_recv_ring_and_any_source(ctx):
    w, r, h = ctx.world, ctx.rank, ctx.hcomm
    res = {}
    # Blocking send/recv around the ring: even ranks send first (no deadlock with blocking calls).
    x = torch.arange(5, dtype=torch.int16) + 100 * r
    got = torch.zeros(5, dtype=torch.int16)
    right, left = (r + 1) % w, (r - 1) % w
    if r % 2 == 0:
        dist.send(x, dst=right, group=h)
        dist.recv(got, src=left, group=h)
    else:
        dist.recv(got, src=left, group=h)
        dist.send(x, dst=right, group=h)
    res["ring"] = torch.equal(got, torch.arange(5, dtype=torch.int16) + 100 * left)
    # Any-source receive on rank 0: every other rank sends its rank; the sender is reported.
    if r == 0:
        seen = {}
        for _ in range(w - 1):
            t = torch.zeros(2, dtype=torch.float64)
            src = dist.recv(t, group=h)
            seen[src] = t.tolist()
        res["any"] = seen == {s: [float(s), float(s)] for s in range(1, w)}
    else:
        dist.send(torch.full((2,), float(r), dtype=torch.float64), dst=0, group=h)
        res["any"] = True
    # Tags keep messages apart: send tag 7 then tag 3, receive tag 3 first.
    if r == 0:
        dist.send(torch.tensor([7.0]), dst=1, group=h, tag=7)
        dist.send(torch.tensor([3.0]), dst=1, group=h, tag=3)
        res["tags"] = True
    elif r == 1:
        a, b = torch.zeros(1), torch.zeros(1)
        wb = dist.irecv(b, src=0, group=h, tag=3)
        wa = dist.irecv(a, src=0, group=h, tag=7)
        wb.wait()
        wa.wait()
        res["tags"] = (a.item(), b.item()) == (7.0, 3.0)
    else:
        res["tags"] = True
    return res


def test_send_recv_ring_any_source_and_tags(pool):
    for res in pool.run(case_send_recv_ring_and_any_source):
        assert res == {"ring": True, "any": True, "tags": True}


def case_batch_isend_irecv(ctx):
    w, r, h = ctx.world, ctx.rank, ctx.hcomm
    send = torch.arange(4, dtype=torch.float32) + 10 * r
    recv_l, recv_r = torch.zeros(4), torch.zeros(4)
    ops = [dist.P2POp(dist.isend, send, (r + 1) % w, h), dist.P2POp(dist.irecv, recv_l, (r - 1) % w, h),
           dist.P2POp(dist.isend, send * 2, (r - 1) % w, h), dist.P2POp(dist.irecv, recv_r, (r + 1) % w, h)]
    works = dist.batch_isend_irecv(ops)
    for wk in works:
        wk.wait()
    left, right = (r - 1) % w, (r + 1) % w
    return (torch.equal(recv_l, torch.arange(4.0) + 10 * left), torch.equal(recv_r, (torch.arange(4.0) + 10 * right) * 2),
            h._get_backend(torch.device("cpu")).supports_coalescing)


def test_batch_isend_irecv_ring_exchange_uses_backend_coalescing(pool):
    assert pool.run(case_batch_isend_irecv) == [(True, True, True)] * pool.world


def case_async_and_future(ctx):
    w, r, h = ctx.world, ctx.rank, ctx.hcomm
    out = {}
    # async_op=True returns before the op can complete: rank 0 is 1.5 s late, so
    # the others' work cannot have finished when all_reduce returns.
    if r == 0:
        time.sleep(1.5)
    t = torch.full((3,), float(r + 1))
    t0 = time.monotonic()
    work = dist.all_reduce(t, group=h, async_op=True)
    out["returned_fast"] = r == 0 or (time.monotonic() - t0) < 1.0
    out["pending_at_return"] = r == 0 or not work.is_completed()
    fut = work.get_future()
    value = fut.wait()
    work.wait()
    out["completed"] = work.is_completed() and work.is_success()
    total = float(sum(range(1, w + 1)))
    out["value"] = torch.equal(t, torch.full((3,), total)) and torch.equal(value[0], t)
    # Futures chain like DDP's comm hooks.
    t2 = torch.full((2,), float(r))
    fut2 = dist.all_reduce(t2, group=h, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    out["then"] = torch.equal(fut2.wait(), torch.full((2,), 2.0 * sum(range(w))))
    # wait(timeout) on an op that finishes in time.
    t3 = torch.ones(1)
    out["wait_timeout_ok"] = dist.all_reduce(t3, group=h, async_op=True).wait(timeout=__import__("datetime").timedelta(seconds=30))
    # The backend's name as torch reports it.
    out["name"] = h._get_backend(torch.device("cpu")).name()
    out["barrier"] = dist.barrier(group=h) is None
    return out


def test_async_op_returns_before_completion_and_futures_carry_the_result(pool):
    for res in pool.run(case_async_and_future):
        assert res == {"returned_fast": True, "pending_at_return": True, "completed": True, "value": True,
                       "then": True, "wait_timeout_ok": True, "name": "hcomm", "barrier": True}


def case_wait_timeout_expires(ctx):
    """wait(timeout) raises when a peer is late, then the op still completes correctly."""
    import datetime

    r, h = ctx.rank, ctx.hcomm
    t = torch.full((2,), float(r))
    if r == 1:
        time.sleep(1.5)
    work = dist.all_reduce(t, group=h, async_op=True)
    err = None
    if r == 0:
        try:
            work.wait(timeout=datetime.timedelta(milliseconds=200))
        except Exception as e:  # noqa: BLE001
            err = f"{type(e).__name__}: {e}"
    work.wait()
    return err, t.tolist()


def test_wait_with_timeout_raises_on_the_waiting_rank_when_a_peer_is_late(pool):
    res = pool.run(case_wait_timeout_expires)
    err, value = res[0]
    assert err is not None and "timed out after 200 ms" in err and "DistBackendError" in err
    s = float(sum(range(pool.world)))
    assert all(v == [s, s] for _, v in res)
    assert all(e is None for e, _ in res[1:])


def case_barrier_orders_ranks(ctx):
    path = f"{ctx.tmp}/barrier-marks"
    if ctx.rank == 0:
        time.sleep(0.3)
        with open(path, "w") as f:
            f.write("done")
    dist.barrier(group=ctx.hcomm)
    with open(path) as f:
        seen = f.read()
    dist.barrier(group=ctx.hcomm)
    return seen


def test_barrier_waits_for_the_slowest_rank(pool):
    assert pool.run(case_barrier_orders_ranks) == ["done"] * pool.world


def case_uneven_list_forms(ctx):
    """dist.all_gather / dist.reduce_scatter with different sizes per rank run hcomm's `_v` collectives."""
    w, r, h = ctx.world, ctx.rank, ctx.hcomm
    sizes = [q + 1 for q in range(w)]
    outs = [torch.zeros(s, dtype=torch.int64) for s in sizes]
    dist.all_gather(outs, torch.full((sizes[r],), r, dtype=torch.int64), group=h)
    gathered = [o.tolist() for o in outs]
    ins = [torch.full((s,), float(r + 1)) for s in sizes]
    out = torch.zeros(sizes[r])
    dist.reduce_scatter(out, ins, group=h)
    return gathered, out.tolist()


def test_list_forms_with_uneven_sizes(pool):
    w = pool.world
    for r, (gathered, reduced) in enumerate(pool.run(case_uneven_list_forms)):
        assert gathered == [[q] * (q + 1) for q in range(w)]
        assert reduced == [float(w * (w + 1) // 2)] * (r + 1)


def case_irecv_completes_independently(ctx):
    """A receive that has arrived completes even while an earlier receive is still outstanding.

    Rank 0 posts irecv(from 1) then irecv(from 2), waits only for rank 2's,
    then sends to rank 1, which only sends its message after that.
    """
    import datetime

    r, h = ctx.rank, ctx.hcomm
    if r == 0:
        a, b = torch.zeros(1), torch.zeros(1)
        wa = dist.irecv(a, src=1, group=h)
        wb = dist.irecv(b, src=2, group=h)
        err = None
        try:
            wb.wait(timeout=datetime.timedelta(seconds=5))
        except Exception as e:  # noqa: BLE001
            err = str(e).splitlines()[0]
        dist.send(torch.tensor([42.0]), dst=1, group=h)  # unblocks rank 1 either way
        wa.wait()
        return err, a.item(), b.item()
    if r == 1:
        x = torch.zeros(1)
        dist.recv(x, src=0, group=h)
        dist.send(x + 1, dst=0, group=h)
        return None, x.item(), None
    if r == 2:
        dist.send(torch.tensor([7.0]), dst=0, group=h)
    return None, None, None


def test_irecv_completion_is_not_blocked_by_an_earlier_outstanding_irecv(pool):
    res = pool.run(case_irecv_completes_independently)
    assert res[0] == (None, 43.0, 7.0)
    assert res[1] == (None, 42.0, None)


def case_destroy_with_op_in_flight(ctx):
    """Destroying a group while its op is still running waits for it; the Work still reports the result."""
    import gc

    r = ctx.rank
    g = dist.new_group(backend="hcomm")
    t = torch.full((4,), float(r + 1))
    if r == 1:
        time.sleep(0.5)
    work = dist.all_reduce(t, group=g, async_op=True)
    dist.destroy_process_group(g)
    del g
    gc.collect()
    work.wait()
    return t.tolist()


def test_destroying_a_group_with_an_op_in_flight_completes_it(pool):
    s = float(sum(range(1, pool.world + 1)))
    assert pool.run(case_destroy_with_op_in_flight) == [[s] * 4] * pool.world


def case_async_worker_path(ctx, dtype_name):
    """async_op=True also returns at once for ops that run on hcomm's worker (int16: hcomm's ring)."""
    r, h = ctx.rank, ctx.hcomm
    dtype = getattr(torch, dtype_name)
    if r == 0:
        time.sleep(1.5)
    t = torch.full((3,), r + 1, dtype=dtype)
    t0 = time.monotonic()
    work = dist.all_reduce(t, group=h, async_op=True)
    fast = r == 0 or (time.monotonic() - t0) < 1.0
    pending = r == 0 or not work.is_completed()
    work.wait()
    return fast, pending, t.tolist()


@pytest.mark.parametrize("dtype_name", ["int16", "float32"])
def test_async_op_does_not_block_on_either_execution_path(pool, dtype_name):
    s = sum(range(1, pool.world + 1))
    assert pool.run(case_async_worker_path, dtype_name) == [(True, True, [s] * 3)] * pool.world


def case_many_outstanding_messages(ctx, n):
    """Rank 1 posts n receives from rank 0 and n sends to it before rank 0 takes part."""
    import os

    r, h = ctx.rank, ctx.hcomm
    if r > 1:
        dist.barrier(group=ctx.gloo)
        return None
    bufs = [torch.zeros(2) for _ in range(n)]
    before = len(os.listdir("/proc/self/task"))
    if r == 1:
        recvs = [dist.irecv(b, src=0, group=h, tag=3) for b in bufs]
        sends = [dist.isend(torch.tensor([i, -i], dtype=torch.float32), dst=0, group=h, tag=4) for i in range(n)]
        time.sleep(0.3)  # every post handed to its waiter
        peak = len(os.listdir("/proc/self/task"))
        dist.barrier(group=ctx.gloo)
    else:
        dist.barrier(group=ctx.gloo)
        recvs = [dist.irecv(b, src=1, group=h, tag=4) for b in bufs]
        sends = [dist.isend(torch.tensor([i, -i], dtype=torch.float32), dst=1, group=h, tag=3) for i in range(n)]
        peak = None
    for w in reversed(recvs + sends):  # waited in the opposite order to posting
        w.wait()
    ok = all(torch.equal(b, torch.tensor([i, -i], dtype=torch.float32)) for i, b in enumerate(bufs))
    return ok, peak - before if peak is not None else None


def test_many_outstanding_messages_use_a_waiter_per_channel_not_per_message(pool):
    # 600 messages outstanding on rank 1 in two channels (receives from rank 0
    # on tag 3, sends to it on tag 4): one waiter thread each, where a thread
    # per message used 600.  All arrive intact, waited in reverse order.
    res = pool.run(case_many_outstanding_messages, 300)
    assert res[0] == (True, None)
    ok, extra_threads = res[1]
    assert ok
    assert extra_threads <= 4, extra_threads

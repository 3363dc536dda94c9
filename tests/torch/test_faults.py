"""Multi-process faults: a peer that hangs or dies mid-collective makes every survivor fail within the timeout.

A dedicated 3-rank pool (the shared one must stay healthy): the hcomm groups
have a 5 s timeout; rank 2 exits while ranks 0 and 1 are inside a collective.
Both the vendor-native path (float32 sum: gloo's allreduce) and hcomm's own
algorithms over point-to-point (int16 sum: hcomm's ring) must raise, not hang.
"""
import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist

from tests.helpers.mp import Pool

GROUP_TIMEOUT_S = 5.0


def case_init(ctx):
    import hcomm  # noqa: F401

    t = datetime.timedelta(seconds=GROUP_TIMEOUT_S)
    dist.init_process_group("gloo", init_method=f"file://{ctx.tmp}/faults-store", rank=ctx.rank,
                            world_size=ctx.world, timeout=datetime.timedelta(seconds=30))
    ctx.state["native"] = dist.new_group(backend="hcomm", timeout=t)
    ctx.state["ring"] = dist.new_group(backend="hcomm", timeout=t)
    ctx.state["hang_native"] = dist.new_group(backend="hcomm", timeout=t)
    ctx.state["hang_ring"] = dist.new_group(backend="hcomm", timeout=t)
    long = datetime.timedelta(seconds=60)
    ctx.state["retimed_native"] = dist.new_group(backend="hcomm", timeout=long)
    ctx.state["retimed_ring"] = dist.new_group(backend="hcomm", timeout=long)
    x = torch.ones(2)
    dist.all_reduce(x, group=ctx.state["native"])
    return x.tolist()


def _timed(fn):
    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return type(e).__name__, str(e).splitlines()[0][:300], time.monotonic() - t0
    return None, None, time.monotonic() - t0


def case_peer_dies(ctx):
    import hcomm

    if ctx.rank == 2:
        time.sleep(0.5)  # let the others enter the collective first
        os._exit(1)
    native = _timed(lambda: dist.all_reduce(torch.ones(1000), group=ctx.state["native"]))
    ring = _timed(lambda: hcomm.all_reduce(torch.ones(1000, dtype=torch.int16), group=ctx.state["ring"]))
    return native, ring


def case_peer_hangs(ctx):
    """Rank 2 is alive but never joins: the others time out after the group timeout."""
    import hcomm

    if ctx.rank == 2:
        time.sleep(GROUP_TIMEOUT_S + 2.0)
        return None
    t0 = time.monotonic()
    native = dist.all_reduce(torch.ones(10), group=ctx.state["hang_native"], async_op=True)
    ring = hcomm.all_reduce(torch.ones(10, dtype=torch.int16), group=ctx.state["hang_ring"], async_op=True)
    out = []
    for work in (native, ring):
        try:
            work.wait()
            out.append((None, None))
        except Exception as e:  # noqa: BLE001
            out.append((type(e).__name__, str(e).splitlines()[0][:300]))
    return out, time.monotonic() - t0


@pytest.fixture(scope="module")
def fault_pool():
    p = Pool(3, setup="bare")
    assert p.run(case_init) == [[3.0, 3.0]] * 3
    yield p
    p.close()


def test_a_peer_that_never_joins_makes_the_others_time_out(fault_pool):
    res = fault_pool.run(case_peer_hangs, timeout_s=60)
    assert res[2] is None
    for rank in (0, 1):
        (native, ring), seconds = res[rank]
        assert native[0] == "DistBackendError" and "hcomm" in native[1], native
        assert ring[0] == "HCommError" and "hcomm" in ring[1], ring
        assert GROUP_TIMEOUT_S - 0.5 < seconds < GROUP_TIMEOUT_S + 3.0, seconds


def case_retimed_group_hangs(ctx):
    """torchtitan-style: a group created with a long timeout, shortened later.

    torch's _set_pg_timeout only reaches gloo and NCCL backends (it warns for
    others), so this calls what it calls on them, _set_default_timeout, and
    hcomm's own hcomm.collectives.set_timeout.
    """
    import hcomm

    from hcomm.collectives import set_timeout

    short = datetime.timedelta(seconds=2)
    ctx.state["retimed_native"]._get_backend(torch.device("cpu"))._set_default_timeout(short)
    set_timeout(short, group=ctx.state["retimed_ring"])
    if ctx.rank == 2:
        time.sleep(5.0)
        return None
    t0 = time.monotonic()
    works = [dist.all_reduce(torch.ones(10), group=ctx.state["retimed_native"], async_op=True),
             hcomm.all_reduce(torch.ones(10, dtype=torch.int16), group=ctx.state["retimed_ring"], async_op=True)]
    errors = []
    for work in works:
        try:
            work.wait()
            errors.append(None)
        except Exception as e:  # noqa: BLE001
            errors.append(type(e).__name__)
    return errors, time.monotonic() - t0


def test_set_default_timeout_shortens_the_timeout_of_both_paths(fault_pool):
    res = fault_pool.run(case_retimed_group_hangs, timeout_s=30)
    for rank in (0, 1):
        errors, seconds = res[rank]
        assert errors == ["DistBackendError", "HCommError"], errors
        assert seconds < 2.0 + 3.0, seconds


def test_survivors_of_a_dead_peer_raise_within_the_group_timeout(fault_pool):
    res = fault_pool.run(case_peer_dies, expect_dead={2}, timeout_s=60)
    assert res[2] is None
    for rank in (0, 1):
        (n_type, n_msg, n_s), (r_type, r_msg, r_s) = res[rank]
        assert n_type == "DistBackendError", (rank, n_type, n_msg)
        assert r_type == "HCommError", (rank, r_type, r_msg)
        assert "hcomm" in n_msg and "hcomm" in r_msg
        # Within the group timeout, plus slack for a loaded 2-core box.
        assert n_s < GROUP_TIMEOUT_S + 3.0, (rank, n_s, n_msg)
        assert r_s < GROUP_TIMEOUT_S + 3.0, (rank, r_s, r_msg)

"""Multi-process: the shared-memory transport, alone and as an island's intra tier.

Part 1 drives ``_C.ShmTransport`` directly: messages larger than the ring,
tags received out of order, any-source receives, empty messages, a size
mismatch and a silent peer (errors within the timeout), and no name left in
/dev/shm.  Part 2 runs the hcomm backend with two islands of two ranks on
this host (``HCOMM_ISLAND``), where each island's intra tier is shared
memory, and checks exact results, that ``hier`` ran over it, and bitwise
equality with ``HCOMM_SHM=0`` (gloo over loopback).
"""
import datetime
import os
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tests.helpers.mp import Pool

WORLD = 4
RING = 64 << 10  # small, so 1 MB messages wrap the ring many times


@pytest.fixture(scope="module")
def bare():
    p = Pool(WORLD, setup="bare", timeout_s=120)
    yield p
    p.close()


def _transport(ctx, tag: str, size: int, timeout_s: float = 10.0):
    """Ranks [0, size) build a ShmTransport over a FileStore; others return None."""
    from hcomm import _C

    store = dist.FileStore(os.path.join(ctx.tmp, f"shm-{tag}"), size) if ctx.rank < size else None
    if store is None:
        return None, None
    if ctx.rank == 0:
        store.set("name", f"hcomm-test-{os.getpid()}-{tag}")
    name = store.get("name").decode()
    t = _C.ShmTransport(name, ctx.rank, size, datetime.timedelta(seconds=timeout_s), RING)
    store.add("created", 1)
    while int(store.add("created", 0)) < size:
        time.sleep(0.01)
    t.connect()
    store.add("mapped", 1)
    while int(store.add("mapped", 0)) < size:
        time.sleep(0.01)
    t.unlink()
    store.add("unlinked", 1)
    while int(store.add("unlinked", 0)) < size:
        time.sleep(0.01)
    return t, name


def case_messages(ctx):
    t, name = _transport(ctx, "msg", 3)
    if t is None:
        return None
    res = {"left": [f for f in os.listdir("/dev/shm") if f.startswith(name)]}
    big = (np.arange(1_000_003) % 251).astype(np.uint8)
    if ctx.rank == 0:
        t.send(np.full(5, 7, np.uint8), 1, 2)  # tag 2 first ...
        t.send(big, 1, 1)                      # ... then tag 1, 15x the ring
        t.send(np.zeros(0, np.uint8), 1, 3)
        t.send(np.array([1, 2, 3], np.uint8), 2, 9)
        t.send(np.array([4, 5, 6], np.uint8), 2, 9)
    elif ctx.rank == 1:
        time.sleep(0.2)  # everything arrives before a receive is posted: all stashed
        got = np.zeros_like(big)
        t.recv(got, 0, 1)  # received in the other order
        small = np.zeros(5, np.uint8)
        t.recv(small, 0, 2)
        src = t.recv(np.zeros(0, np.uint8), -1, 3)
        res.update(big=bool((got == big).all()), small=small.tolist(), empty_from=src)
        t.send(np.full(4, 1, np.uint8), 2, 4)
    else:
        a, b = np.zeros(3, np.uint8), np.zeros(3, np.uint8)
        t.recv(a, 0, 9)  # same source and tag: in send order
        t.recv(b, 0, 9)
        c = np.zeros(4, np.uint8)
        res.update(order=[a.tolist(), b.tolist()], any_from=t.recv(c, -1, 4))
    return res


def test_shm_messages_match_by_source_and_tag(bare):
    res = bare.run(case_messages)
    assert res[0]["left"] == [] and res[1]["left"] == []  # names gone once all mapped
    assert res[1]["big"] and res[1]["small"] == [7] * 5 and res[1]["empty_from"] == 0
    assert res[2]["order"] == [[1, 2, 3], [4, 5, 6]] and res[2]["any_from"] == 1


def case_errors(ctx):
    from hcomm.errors import HCommError

    t, _ = _transport(ctx, "err", 2, timeout_s=1.0)
    if t is None:
        return None
    res = {}
    if ctx.rank == 0:
        t.send(np.zeros(8, np.uint8), 1, 1)  # rank 1 expects 16: its error, not ours
        t.send(np.zeros(4, np.uint8), 1, 1)
        time.sleep(1.5)  # alive but silent on tag 77 while rank 1 times out
        t.send(np.zeros(RING * 3, np.uint8), 1, 2)  # the stream still works after both errors
    else:
        try:
            t.recv(np.zeros(16, np.uint8), 0, 1)
        except HCommError as e:
            res["mismatch"] = str(e)
        t.recv(np.zeros(4, np.uint8), 0, 1)
        start = time.monotonic()
        try:
            t.recv(np.zeros(4, np.uint8), 0, 77)
        except HCommError as e:
            res["timeout"] = (str(e), time.monotonic() - start)
        t.recv(np.zeros(RING * 3, np.uint8), 0, 2)
        try:
            t.send(np.zeros(4, np.uint8), 5, 0)
        except ValueError as e:
            res["bad_peer"] = str(e)
    return res


def test_shm_errors_name_the_problem_within_the_timeout(bare):
    res = bare.run(case_errors)
    assert "expected 16 bytes from rank 0 (tag 1) but got 8" in res[1]["mismatch"]
    msg, waited = res[1]["timeout"]
    assert "timed out after 1000 ms waiting for a message from rank 0 (tag 77)" in msg
    assert 0.9 <= waited < 3.0
    assert "cannot send to rank 5 in a group of 2" in res[1]["bad_peer"]


def case_dead_receiver(ctx):
    from hcomm.errors import HCommError

    t, _ = _transport(ctx, "dead", 2, timeout_s=1.0)
    if t is None:
        return None
    if ctx.rank == 1:
        os._exit(0)  # dies with its progress thread: nobody drains its rings
    time.sleep(0.3)
    start = time.monotonic()
    try:
        t.send(np.zeros(RING * 4, np.uint8), 1, 0)
    except HCommError as e:
        return str(e), time.monotonic() - start
    return "no error", 0.0


def test_shm_send_to_dead_peer_fails_within_timeout():
    p = Pool(2, setup="bare", timeout_s=60)
    try:
        res = p.run(case_dead_receiver, expect_dead=(1,))
    finally:
        p.close()
    msg, waited = res[0]
    assert "timed out after 1000 ms sending to rank 1" in msg
    assert 0.9 <= waited < 3.0


def case_hier_over_shm(ctx, shm: bool):
    import hcomm

    os.environ["HCOMM_ISLAND"] = "a" if ctx.rank < 2 else "b"
    os.environ["HCOMM_SHM"] = "1" if shm else "0"
    os.environ["HCOMM_PROFILE"] = "off"
    dist.init_process_group("hcomm", init_method=f"file://{ctx.tmp}/hier-{int(shm)}", rank=ctx.rank,
                            world_size=ctx.world, timeout=datetime.timedelta(seconds=60))
    try:
        g = torch.Generator().manual_seed(1234 + ctx.rank)
        out = {}
        for n in (1, 1001, 300_000):
            x = torch.randn(n, generator=g)
            hcomm.set_algorithm("hier")
            dist.all_reduce(x)
            out[f"ar{n}"] = x
            out[f"algo{n}"] = hcomm.last_op()["algorithm"]
        ints = torch.arange(12 * 4, dtype=torch.int64) + 100 * ctx.rank
        rs = torch.zeros(12, dtype=torch.int64)
        dist.reduce_scatter_tensor(rs, ints)
        out["rs"] = rs
        ag = torch.zeros(4 * 5, dtype=torch.float64)
        dist.all_gather_into_tensor(ag, torch.full((5,), float(ctx.rank), dtype=torch.float64))
        out["ag"] = ag
        out["intra"] = hcomm.topology().links["intra"].source
        return out
    finally:
        dist.destroy_process_group()


def test_hier_over_shared_memory_equals_gloo_bitwise(bare):
    with_shm = bare.run(case_hier_over_shm, True)
    without = bare.run(case_hier_over_shm, False)
    for r in range(WORLD):
        assert "shared memory" in with_shm[r]["intra"] and "shared memory" not in without[r]["intra"]
        for n in (1, 1001, 300_000):
            assert with_shm[r][f"algo{n}"] == "hier"
            np.testing.assert_array_equal(with_shm[r][f"ar{n}"], without[r][f"ar{n}"])
            np.testing.assert_array_equal(with_shm[r][f"ar{n}"], with_shm[0][f"ar{n}"])
        # Exact integer reduce-scatter and all-gather.
        ref = sum(np.arange(48) + 100 * q for q in range(WORLD))
        np.testing.assert_array_equal(with_shm[r]["rs"], ref[12 * r:12 * (r + 1)])
        np.testing.assert_array_equal(with_shm[r]["ag"], np.repeat(np.arange(4.0), 5))
    # The sums themselves: all-reduce of N(0,1) inputs equals the float64 reference closely.
    g = [torch.Generator().manual_seed(1234 + q) for q in range(WORLD)]
    for n in (1, 1001, 300_000):
        ref = sum(torch.randn(n, generator=g[q]).double() for q in range(WORLD))
        assert np.allclose(with_shm[0][f"ar{n}"], ref.numpy(), rtol=1e-5, atol=1e-5)

"""Multi-process: a group destroyed with asynchronous work in flight neither hangs nor crashes.

Three ranks, hcomm groups with a 3 s timeout, on hcomm's ring and on gloo's own collective (`native`):

- every rank issues three async in-place all_reduces of one tensor and destroys the group at once: the
  works still complete, in issue order (1 -> 3 -> 9 -> 27, also on the native path, where torch's own gloo
  backend runs async ops on two threads and gets 18 or 9), waited after the destroy, or never waited;
- rank 2 never joins: ranks 0 and 1 destroy the group with the works in flight, return at once, and each
  wait raises DistBackendError within the timeout (no hang, no abort);
- after either, a new hcomm group over the same ranks works.
"""
import datetime
import time

import pytest
import torch
import torch.distributed as dist

from tests.helpers.mp import Pool

TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def pool():
    p = Pool(3, setup="bare", timeout_s=120)
    yield p
    p.close()


def case_destroy(ctx, algo: str, absent: bool, wait: bool):
    import hcomm

    dist.init_process_group("gloo", init_method=f"file://{ctx.tmp}/destroy-{algo}-{absent}-{wait}",
                            rank=ctx.rank, world_size=ctx.world, timeout=datetime.timedelta(seconds=30))
    try:
        g = dist.new_group(backend="hcomm", timeout=datetime.timedelta(seconds=TIMEOUT_S))
        hcomm.set_algorithm(algo, group=g)
        x = torch.ones(1 << 18)
        works = []
        if not (absent and ctx.rank == 2):
            works = [dist.all_reduce(x, group=g, async_op=True) for _ in range(3)]
        t0 = time.monotonic()
        dist.destroy_process_group(g)
        out = {"destroy_s": time.monotonic() - t0, "errors": [], "wait_s": 0.0}
        if wait:
            for w in works:
                try:
                    w.wait()
                except Exception as e:  # noqa: BLE001 - the type is what the test checks
                    out["errors"].append(type(e).__name__)
            out["wait_s"] = time.monotonic() - t0
            out["x"] = float(x[0]) if not out["errors"] else None
        dist.barrier()
        g2 = dist.new_group(backend="hcomm", timeout=datetime.timedelta(seconds=30))
        y = torch.full((1000,), float(ctx.rank))
        dist.all_reduce(y, group=g2)
        out["after"] = float(y[0])
        dist.destroy_process_group(g2)
        return out
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("algo", ["ring", "native"])
@pytest.mark.parametrize("wait", [True, False])
def test_destroy_with_every_rank_in_flight_completes_the_works(pool, algo, wait):
    for out in pool.run(case_destroy, algo, False, wait):
        assert out["destroy_s"] < 1.0 and out["after"] == 3.0, out
        if wait:
            assert out["errors"] == [] and out["x"] == 27.0, out


@pytest.mark.parametrize("algo", ["ring", "native"])
def test_destroy_with_a_missing_peer_errors_every_wait_within_the_timeout(pool, algo):
    res = pool.run(case_destroy, algo, True, True)
    for r, out in enumerate(res):
        assert out["destroy_s"] < 1.0 and out["after"] == 3.0, out
        if r < 2:
            assert out["errors"] == ["DistBackendError"] * 3, out
            assert out["wait_s"] < TIMEOUT_S + 3, out

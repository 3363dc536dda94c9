"""Multi-process: ranks that disagree on a count, without HCOMM_DEBUG, fail by the timeout instead of
aborting the process or filling part of a buffer.

gloo aborts the whole process (EnforceNotMet on its IO thread, SIGABRT) when a message is longer than
the receive buffer, and fills part of the buffer silently when it is shorter.  hcomm's own algorithms
send their messages under tags that carry a hash of the byte count, so a message of another size never
matches: both ranks raise DistBackendError within the group timeout, naming the peer they wait for, and
the process lives on.  (torch's own gloo collective, hcomm's `native` path, still aborts in this case;
HCOMM_DEBUG=1 catches the mismatch before any byte moves, on every path.)
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
    p = Pool(2, setup="bare", timeout_s=120)
    yield p
    p.close()


def case_mismatch(ctx, op: str, algo: str):
    import hcomm

    dist.init_process_group("hcomm", init_method=f"file://{ctx.tmp}/mismatch-{op}-{algo}", rank=ctx.rank,
                            world_size=ctx.world, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    try:
        hcomm.set_algorithm(algo)
        n = 1000 if ctx.rank == 0 else 500  # rank 1's messages are half the length rank 0 expects
        t0 = time.monotonic()
        try:
            if op == "all_reduce":
                dist.all_reduce(torch.ones(n, dtype=torch.int16))  # int16: hcomm's ring, not gloo's
            elif op == "all_gather":
                dist.all_gather_into_tensor(torch.zeros(2 * n), torch.ones(n))
            else:
                if ctx.rank == 0:
                    dist.send(torch.ones(n), 1)
                else:
                    dist.recv(torch.zeros(n), 0)
            return {"error": None, "seconds": time.monotonic() - t0}
        except Exception as e:  # noqa: BLE001 - the type is what the test checks
            return {"error": f"{type(e).__name__}: {e}", "seconds": time.monotonic() - t0}
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("op,algo", [("all_reduce", "ring"), ("all_gather", "ring_ag"), ("send", "")])
def test_ranks_disagreeing_on_a_count_fail_by_timeout_not_abort(pool, op, algo):
    res = pool.run(case_mismatch, op, algo)
    for r, out in enumerate(res):
        if op == "send" and r == 0:
            # A send completes once the bytes are handed to the peer's socket or times out; it must not
            # have "succeeded" into a receive of another size, which only the receiver can tell.
            assert out["error"] is None or "DistBackendError" in out["error"], out
            continue
        assert out["error"] is not None and out["error"].startswith("DistBackendError"), (r, out)
        # The first rank to time out closes its connections; its peer may fail on that a moment earlier.
        assert ("timed out" in out["error"] or "failed" in out["error"]) and "rank" in out["error"], out
        assert out["seconds"] < TIMEOUT_S + 5, out

"""Multi-process: each island's uplink is measured by the link probe, cached, and drives the owner
exchange of the hierarchical all-reduce (HCOMM_HIER_EXCHANGE), whose results equal the direct one's.

Four ranks in three islands on this host (HCOMM_ISLAND: a = ranks 0-1, b = 2, c = 3).  With
HCOMM_PROFILE=force every rank gets the same three positive uplink figures (the probe pairs island 0's
leader with each other island's); a second group with HCOMM_PROFILE=auto takes the very same figures from
the cache.  Groups forced to the direct and the owner exchange give bitwise equal all_reduce results
(random floats, sum and avg), and the owner group's last op moved fewer bytes across islands from the
one-rank islands (B instead of 2 B for three islands of equal uplinks: shares of a third, 4/3 B).
An unknown HCOMM_HIER_EXCHANGE is refused by name.
"""
import datetime
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tests.helpers.mp import Pool

WORLD = 4


@pytest.fixture(scope="module")
def bare():
    p = Pool(WORLD, setup="bare", timeout_s=180)
    yield p
    p.close()


def _group(**env):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return dist.new_group(backend="hcomm")
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def case_uplinks(ctx):
    import hcomm
    from hcomm.errors import HCommValueError

    os.environ.update(HCOMM_ISLAND="a" if ctx.rank < 2 else "b" if ctx.rank == 2 else "c",
                      HCOMM_PROFILE_CACHE=os.path.join(ctx.tmp, "profiles"))
    dist.init_process_group("gloo", init_method=f"file://{ctx.tmp}/uplinks", rank=ctx.rank, world_size=ctx.world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        out = {}
        measured = _group(HCOMM_PROFILE="force")
        out["measured"] = hcomm.topology(measured).uplinks
        cached = _group(HCOMM_PROFILE="auto")
        out["cached"] = hcomm.topology(cached).uplinks
        out["cached_source"] = hcomm.topology(cached).links["inter"].source
        direct = _group(HCOMM_PROFILE="auto", HCOMM_HIER_EXCHANGE="direct")
        owner = _group(HCOMM_PROFILE="auto", HCOMM_HIER_EXCHANGE="owner")
        g = torch.Generator().manual_seed(5 + ctx.rank)
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            x = torch.randn(300_001, generator=g)
            y = x.clone()
            hcomm.set_algorithm("hier", group=direct)
            hcomm.set_algorithm("hier", group=owner)
            dist.all_reduce(x, op=op, group=direct)
            dist.all_reduce(y, op=op, group=owner)
            out[f"equal{int(op == dist.ReduceOp.AVG)}"] = bool(torch.equal(x, y))
        out["inter_direct"] = next(t["bytes"] for t in hcomm.last_op(direct)["tiers"] if t["tier"] == "inter")
        out["inter_owner"] = next(t["bytes"] for t in hcomm.last_op(owner)["tiers"] if t["tier"] == "inter")
        try:
            _group(HCOMM_HIER_EXCHANGE="sideways")
            out["bad"] = "accepted"
        except (HCommValueError, ValueError, RuntimeError) as e:
            out["bad"] = str(e)
        return out
    finally:
        dist.destroy_process_group()


def test_uplinks_are_measured_cached_and_drive_the_owner_exchange(bare):
    res = bare.run(case_uplinks)
    first = res[0]["measured"]
    assert len(first) == 3 and all(b > 0 for b in first), first
    for r, out in enumerate(res):
        assert out["measured"] == first and out["cached"] == first, out
        assert out["cached_source"] == "cache"
        assert out["equal0"] and out["equal1"], out
        assert "HCOMM_HIER_EXCHANGE='sideways' is not one of auto, direct, owner" in out["bad"], out["bad"]
    B = 4 * 300_001
    # Rank 3 is island c alone: the direct exchange sends its whole partial to both other islands.
    assert res[3]["inter_direct"] == 2 * B
    assert res[3]["inter_owner"] < 2 * B, res[3]

"""Multi-process: hcomm groups over non-prefix rank sets translate global and group ranks correctly.

Groups over ranks [1, 3] and [0, 2, 3]: rooted collectives take global
src/dst in torch's API and group ranks in hcomm's direct API; any-source
receives report the sender's global rank.
"""
import torch
import torch.distributed as dist

import hcomm


def _groups(ctx):
    if "odd" not in ctx.state:
        ctx.state["odd"] = dist.new_group(ranks=[1, 3], backend="hcomm")
        ctx.state["three"] = dist.new_group(ranks=[0, 2, 3], backend="hcomm")
    return ctx.state["odd"], ctx.state["three"]


def case_rooted_on_subgroups(ctx):
    odd, three = _groups(ctx)
    r = ctx.rank
    res = {}
    if r in (1, 3):
        t = torch.full((2,), float(r))
        dist.broadcast(t, src=3, group=odd)  # global rank 3 = group rank 1
        res["bcast"] = t.tolist()
        u = torch.full((2,), float(r))
        hcomm.broadcast(u, src=0, group=odd)  # direct API: group rank 0 = global rank 1
        res["bcast_direct"] = u.tolist()
        if r == 1:
            res["from"] = dist.recv(torch.zeros(1), group=odd)
        else:
            dist.send(torch.ones(1), dst=1, group=odd)
    if r in (0, 2, 3):
        x = torch.full((3,), float(r + 1))
        dist.reduce(x, dst=2, group=three)
        if r == 2:
            res["reduce"] = x.tolist()
        lst = [torch.zeros(1) for _ in range(3)] if r == 3 else None
        dist.gather(torch.tensor([float(r)]), lst, dst=3, group=three)
        if r == 3:
            res["gather"] = [v.item() for v in lst]
        out = torch.zeros(1)
        chunks = [torch.tensor([10.0 * q]) for q in range(3)] if r == 0 else None
        dist.scatter(out, chunks, src=0, group=three)
        res["scatter"] = out.item()
        a2a = torch.zeros(3)
        dist.all_to_all_single(a2a, torch.arange(3.0) + 10 * r, output_split_sizes=[1, 1, 1], group=three)
        res["a2a"] = a2a.tolist()
        dist.barrier(group=three)
    return res


def test_rooted_collectives_on_non_prefix_subgroups(pool):
    res = pool.run(case_rooted_on_subgroups)
    assert res[1] == {"bcast": [3.0, 3.0], "bcast_direct": [1.0, 1.0], "from": 3}
    assert res[3]["bcast"] == [3.0, 3.0] and res[3]["bcast_direct"] == [1.0, 1.0]
    assert res[2]["reduce"] == [1.0 + 3.0 + 4.0] * 3
    assert res[3]["gather"] == [0.0, 2.0, 3.0]
    assert [res[q]["scatter"] for q in (0, 2, 3)] == [0.0, 10.0, 20.0]
    # Group rank g receives element g of every member's input, members in group order (0, 2, 3).
    for g, q in enumerate((0, 2, 3)):
        assert res[q]["a2a"] == [g + 10.0 * s for s in (0, 2, 3)]

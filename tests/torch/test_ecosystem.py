"""Multi-process: DDP, FSDP2, functional collectives and DTensor on hcomm give gloo's results.

Every case runs the same computation twice in the same processes, once over
the gloo group and once over the hcomm group of the same ranks, from the
same seed and data, and demands identical results.
"""
import torch
import torch.distributed as dist
import torch.nn as nn


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _data(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def _train_ddp(group, rank, steps=4):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _model(seed=rank)  # different init per rank: DDP must broadcast rank 0's
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.0001)  # tiny buckets: several allreduces per step
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        x, y = _data(rank, step)
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return [p.detach().clone() for p in model.parameters()], losses


def case_ddp(ctx):
    p_gloo, l_gloo = _train_ddp(ctx.gloo, ctx.rank)
    p_hcomm, l_hcomm = _train_ddp(ctx.hcomm, ctx.rank)
    same = all(torch.equal(a, b) for a, b in zip(p_gloo, p_hcomm)) and l_gloo == l_hcomm
    # Every rank holds the same parameters after training.
    flat = torch.cat([p.reshape(-1) for p in p_hcomm])
    ref = flat.clone()
    dist.broadcast(ref, src=0, group=ctx.gloo)
    return same, torch.equal(flat, ref), l_hcomm[0] != l_hcomm[-1]


def test_ddp_training_matches_gloo_bit_for_bit(pool):
    assert pool.run(case_ddp) == [(True, True, True)] * pool.world


def _train_fsdp(group, rank, steps=3):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, "cpu")
    model = _model(seed=0)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        x, y = _data(rank, step)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return [p.full_tensor().detach().clone() for p in model.parameters()], losses


def case_fsdp2(ctx):
    g, h = ctx.groups[2]
    if h is None:
        return None
    p_gloo, l_gloo = _train_fsdp(g, ctx.rank)
    p_hcomm, l_hcomm = _train_fsdp(h, ctx.rank)
    return all(torch.equal(a, b) for a, b in zip(p_gloo, p_hcomm)), l_gloo == l_hcomm, len(p_hcomm)


def test_fsdp2_fully_shard_on_cpu_matches_gloo(pool):
    res = pool.run(case_fsdp2, timeout_s=180)
    assert res[:2] == [(True, True, 4)] * 2 and res[2:] == [None] * (pool.world - 2)


def _functional(group, rank, world):
    import torch.distributed._functional_collectives as fc

    x = torch.arange(6, dtype=torch.float32) + 10 * rank
    ar = fc.all_reduce(x, "sum", group)
    ag = fc.all_gather_tensor(x, 0, group)
    rs = fc.reduce_scatter_tensor(torch.arange(2.0 * world) * (rank + 1), "sum", 0, group)
    a2a = fc.all_to_all_single(torch.arange(world, dtype=torch.float32) + 100 * rank, None, None, group)
    coalesced = fc.all_reduce_coalesced([x, x * 2], "max", group)
    return [fc.wait_tensor(t).clone() for t in (ar, ag, rs, a2a)] + [fc.wait_tensor(t).clone() for t in coalesced]


def case_functional(ctx):
    a = _functional(ctx.gloo, ctx.rank, ctx.world)
    b = _functional(ctx.hcomm, ctx.rank, ctx.world)
    w, r = ctx.world, ctx.rank
    expected_rs = torch.arange(2.0 * r, 2.0 * r + 2) * sum(range(1, w + 1))
    return [torch.equal(x, y) for x, y in zip(a, b)], torch.equal(b[2], expected_rs)


def test_functional_collectives_match_gloo(pool):
    assert pool.run(case_functional) == [([True] * 6, True)] * pool.world


def _dtensor(group, rank):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = DeviceMesh.from_group(group, "cpu")
    torch.manual_seed(0)
    full = torch.arange(24, dtype=torch.float32).view(8, 3)
    d = distribute_tensor(full, mesh, [Shard(0)])
    rep = d.redistribute(mesh, [Replicate()]).to_local()  # all-gather
    s1 = d.redistribute(mesh, [Shard(1)]).full_tensor()  # all-to-all (uneven: 3 columns on the mesh)

    partial = DTensor.from_local(torch.full((2, 2), float(rank + 1)), mesh, [Partial()])
    summed = partial.redistribute(mesh, [Replicate()]).to_local()  # all-reduce
    scattered = partial.redistribute(mesh, [Shard(0)]).to_local()  # reduce-scatter
    mm = (d @ distribute_tensor(torch.ones(3, 2), mesh, [Replicate()])).full_tensor()
    return [rep, s1, summed, scattered, mm]


def case_dtensor(ctx):
    a = _dtensor(ctx.gloo, ctx.rank)
    b = _dtensor(ctx.hcomm, ctx.rank)
    w = ctx.world
    full = torch.arange(24, dtype=torch.float32).view(8, 3)
    return ([torch.equal(x, y) for x, y in zip(a, b)], torch.equal(b[0], full),
            torch.equal(b[2], torch.full((2, 2), float(w * (w + 1) // 2))))


def test_dtensor_redistribute_matches_gloo(pool):
    assert pool.run(case_dtensor) == [([True] * 5, True, True)] * pool.world


def case_object_collectives(ctx):
    h, r, w = ctx.hcomm, ctx.rank, ctx.world
    gathered = [None] * w
    dist.all_gather_object(gathered, {"rank": r, "name": "x" * (r * 50)}, group=h)
    objs = [{"cfg": [1, 2, 3]}, "second"] if r == 1 else [None, None]
    dist.broadcast_object_list(objs, src=1, group=h)
    out = [None]
    dist.scatter_object_list(out, [f"to-{q}" for q in range(w)] if r == 0 else None, src=0, group=h)
    g = [None] * w if r == 3 else None
    dist.gather_object(("from", r), g, dst=3, group=h)
    return gathered, objs, out[0], g


def test_object_collectives_on_hcomm(pool):
    w = pool.world
    res = pool.run(case_object_collectives)
    for r, (gathered, objs, scattered, g) in enumerate(res):
        assert gathered == [{"rank": q, "name": "x" * (q * 50)} for q in range(w)]
        assert objs == [{"cfg": [1, 2, 3]}, "second"]
        assert scattered == f"to-{r}"
        assert g == ([("from", q) for q in range(w)] if r == 3 else None)


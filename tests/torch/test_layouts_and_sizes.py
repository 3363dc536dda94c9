"""Multi-process: non-contiguous tensors, zero-element tensors and million-element tensors.

Strided inputs and outputs must give the same values as their contiguous
copies (written back through the user's view); empty tensors must work for
every collective; a few >= 1M-element ops check the large-message path.
"""
import torch
import torch.distributed as dist

from tests.helpers.ref import make_input, reduce_ref, same

_ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def case_non_contiguous(ctx):
    w, r, h = ctx.world, ctx.rank, ctx.hcomm
    bad = []
    base = lambda q: (torch.arange(12, dtype=torch.float32).view(3, 4) + 100 * q)  # noqa: E731
    # all_reduce on a transposed view: result written back through the view.
    x = base(r).t()
    dist.all_reduce(x, group=h)
    want = sum(base(q) for q in range(w)).t()
    if not (torch.equal(x, want) and not x.is_contiguous()):
        bad.append("all_reduce transposed")
    # broadcast into a strided slice leaves the rest of the storage alone.
    store = torch.full((10,), -1.0)
    view = store[::2]
    view.copy_(torch.arange(5.0) + r)
    dist.broadcast(view, src=1, group=h)
    if not torch.equal(store[::2], torch.arange(5.0) + 1) or not torch.equal(store[1::2], torch.full((5,), -1.0)):
        bad.append("broadcast strided")
    # all_gather_into_tensor from a strided input into a strided output.
    inp = base(r)[:, 1]  # stride 4
    out_store = torch.zeros(3 * w, 2)
    out = out_store[:, 0]
    _ag(out, inp, group=h)
    if not torch.equal(out, torch.cat([base(q)[:, 1] for q in range(w)])) or out_store[:, 1].abs().sum() != 0:
        bad.append("all_gather strided")
    # reduce_scatter_tensor with a transposed input.
    m = (torch.arange(2 * w, dtype=torch.float64).view(2, w) * (r + 1)).t()  # w x 2, non-contiguous
    o = torch.zeros(2, dtype=torch.float64)
    _rs(o, m, group=h)
    full = sum((torch.arange(2 * w, dtype=torch.float64).view(2, w) * (q + 1)).t().reshape(-1) for q in range(w))
    if not torch.equal(o, full[2 * r:2 * r + 2]):
        bad.append("reduce_scatter transposed")
    # all_to_all_single with a non-contiguous input and output.
    src = (torch.arange(2 * w, dtype=torch.int32).view(2, w) + 10 * r).t()  # row d goes to rank d
    dst_store = torch.zeros(w, 2, 2, dtype=torch.int32)
    dst = dst_store[:, :, 0]
    dist.all_to_all_single(dst, src, group=h)
    want = torch.stack([(torch.arange(2 * w, dtype=torch.int32).view(2, w) + 10 * q).t()[r] for q in range(w)])
    if not torch.equal(dst, want) or dst_store[:, :, 1].abs().sum() != 0:
        bad.append("all_to_all strided")
    # reduce on a strided root tensor; recv into a strided tensor.
    y = base(r).t()
    dist.reduce(y, dst=2, group=h)
    if r == 2 and not torch.equal(y, sum(base(q) for q in range(w)).t()):
        bad.append("reduce strided")
    if r == 0:
        dist.send(torch.arange(6.0), dst=1, group=h)
    elif r == 1:
        z = torch.zeros(6, 2)[:, 1]
        dist.recv(z, src=0, group=h)
        if not torch.equal(z, torch.arange(6.0)):
            bad.append("recv strided")
    return bad


def test_non_contiguous_inputs_and_outputs_give_the_contiguous_results(pool):
    assert pool.run(case_non_contiguous) == [[]] * pool.world


def case_zero_elements(ctx):
    w, r, h = ctx.world, ctx.rank, ctx.hcomm
    e = torch.empty(0)
    results = {}
    dist.all_reduce(e, group=h)
    dist.broadcast(e, src=0, group=h)
    dist.reduce(e, dst=0, group=h)
    out = torch.empty(0)
    _ag(out, e, group=h)
    _rs(out, e, group=h)
    dist.all_to_all_single(out, e, group=h)
    dist.all_to_all_single(out, e, [0] * w, [0] * w, group=h)
    lst = [torch.empty(0) for _ in range(w)]
    dist.all_gather(lst, e, group=h)
    dist.gather(e, lst if r == 0 else None, dst=0, group=h)
    dist.scatter(e, lst if r == 0 else None, src=0, group=h)
    if r == 0:
        dist.send(torch.empty(0, 3), dst=1, group=h)
    elif r == 1:
        dist.recv(torch.empty(0, 3), src=0, group=h)
    # Shapes with a zero dimension keep their shape.
    z = torch.empty(3, 0, dtype=torch.int16)
    dist.all_reduce(z, group=h)
    results["shape"] = tuple(z.shape)
    t = torch.ones(1)
    dist.all_reduce(t, group=h)
    results["after"] = t.item()
    return results


def test_zero_element_tensors_work_for_every_collective(pool):
    assert pool.run(case_zero_elements) == [{"shape": (3, 0), "after": float(pool.world)}] * pool.world


def case_million(ctx):
    w, r, h, g = ctx.world, ctx.rank, ctx.hcomm, ctx.gloo
    n = 1_000_003
    bad = []
    for dtype in (torch.float32, torch.bfloat16, torch.int16):
        inputs = [make_input(q, w, n, dtype, "sum") for q in range(w)]
        x = inputs[r].clone()
        dist.all_reduce(x, group=h)
        if not same(x, reduce_ref(inputs, "sum")):
            bad.append(f"all_reduce {dtype}")
        if dtype != torch.int16:
            y = inputs[r].clone()
            dist.all_reduce(y, group=g)
            if not same(x, y):
                bad.append(f"all_reduce {dtype} vs gloo")
    inp = make_input(r, w, n, torch.float32, "sum")
    out = torch.empty(n * w)
    _ag(out, inp, group=h)
    if not torch.equal(out, torch.cat([make_input(q, w, n, torch.float32, "sum") for q in range(w)])):
        bad.append("all_gather 1M")
    big = make_input(r, w, 4 * 250_001, torch.int32, "max")
    o = torch.empty(250_001, dtype=torch.int32)
    _rs(o, big, op=dist.ReduceOp.MAX, group=h)
    full = reduce_ref([make_input(q, w, 4 * 250_001, torch.int32, "max") for q in range(w)], "max")
    if not torch.equal(o, full[r * 250_001:(r + 1) * 250_001]):
        bad.append("reduce_scatter 1M")
    return bad


def test_million_element_collectives_match_expected_and_gloo(pool):
    assert pool.run(case_million) == [[]] * pool.world


def case_scalars_and_offset_views(ctx):
    w, r, h = ctx.world, ctx.rank, ctx.hcomm
    scalar = torch.tensor(float(r + 1))
    dist.all_reduce(scalar, group=h)
    b = torch.tensor(r, dtype=torch.int64)
    dist.broadcast(b, src=2, group=h)
    # A contiguous view that starts inside its storage: only that window changes.
    store = torch.full((10,), -1, dtype=torch.int32)
    store[3:7] = r
    dist.all_reduce(store[3:7], group=h)
    return scalar.item(), tuple(scalar.shape), b.item(), store.tolist()


def test_zero_dim_tensors_and_views_with_a_storage_offset(pool):
    w = pool.world
    s = sum(range(w))
    assert pool.run(case_scalars_and_offset_views) == [
        (float(w * (w + 1) // 2), (), 2, [-1] * 3 + [s] * 4 + [-1] * 3)] * w

"""Multi-process parity: broadcast and the gather/scatter/all-to-all family, every dtype, worlds 1-4.

Exact expected values for every dtype (fp8 included); identical bits to
gloo wherever gloo runs the same call.
"""
import pytest
import torch
import torch.distributed as dist

from tests.helpers.ref import ALL_DTYPES, make_input, same

SIZES = [0, 1, 7]
DTYPE_NAMES = [str(d).split(".")[-1] for d in ALL_DTYPES]


def _inp(r, world, n, dtype, salt=0):
    return make_input(r, world, n, dtype, "sum", salt)


def _gloo_try(fn):
    try:
        return fn()
    except (RuntimeError, ValueError, TypeError):
        return None


def _check(failures, tag, got, expected, gloo=None):
    if not same(got, expected):
        failures.append(f"{tag}: hcomm {got.float().tolist()} != expected {expected.float().tolist()}")
    elif gloo is not None and not same(got, gloo):
        failures.append(f"{tag}: hcomm differs from gloo")


def _worlds(ctx):
    return [(w, g, h) for w, (g, h) in sorted(ctx.groups.items()) if ctx.in_group(w)]


def _broadcast_copy(t, root, group):
    t = t.clone()
    dist.broadcast(t, src=root, group=group)
    return t


def case_broadcast_and_all_gather(ctx, dtype_name):
    dtype = getattr(torch, dtype_name)
    failures = []
    for world, g, h in _worlds(ctx):
        for n in SIZES:
            inputs = [_inp(r, world, n, dtype, salt=r) for r in range(world)]
            for root in range(world):
                x = inputs[ctx.rank].clone()
                dist.broadcast(x, src=root, group=h)
                y = _gloo_try(lambda: _broadcast_copy(inputs[ctx.rank], root, g))
                _check(failures, f"broadcast w={world} n={n} root={root}", x, inputs[root], y)
            # all_gather_into_tensor (_allgather_base)
            out = torch.zeros(n * world, dtype=dtype)
            dist.all_gather_into_tensor(out, inputs[ctx.rank], group=h)
            _check(failures, f"all_gather_into_tensor w={world} n={n}", out, torch.cat(inputs))
            # all_gather (list form)
            outs = [torch.zeros(n, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, inputs[ctx.rank], group=h)

            def on_gloo():
                o = [torch.zeros(n, dtype=dtype) for _ in range(world)]
                dist.all_gather(o, inputs[ctx.rank], group=g)
                return torch.cat(o)
            _check(failures, f"all_gather(list) w={world} n={n}", torch.cat(outs), torch.cat(inputs), _gloo_try(on_gloo))
    return failures


@pytest.mark.parametrize("dtype_name", DTYPE_NAMES)
def test_broadcast_and_all_gather_forms(pool, dtype_name):
    assert pool.run(case_broadcast_and_all_gather, dtype_name) == [[]] * pool.world


def case_gather_scatter(ctx, dtype_name):
    dtype = getattr(torch, dtype_name)
    failures = []
    for world, g, h in _worlds(ctx):
        for n in SIZES:
            inputs = [_inp(r, world, n, dtype, salt=r) for r in range(world)]
            for root in range(world):
                lst = [torch.zeros(n, dtype=dtype) for _ in range(world)] if ctx.rank == root else None
                dist.gather(inputs[ctx.rank], lst, dst=root, group=h)
                if ctx.rank == root:
                    _check(failures, f"gather w={world} n={n} root={root}", torch.cat(lst), torch.cat(inputs))
                full = _inp(root, world, n * world, dtype, salt=11)
                chunks = [full[i * n:(i + 1) * n].clone() for i in range(world)] if ctx.rank == root else None
                out = torch.zeros(n, dtype=dtype)
                dist.scatter(out, chunks, src=root, group=h)

                def on_gloo():
                    o = torch.zeros(n, dtype=dtype)
                    c = [full[i * n:(i + 1) * n].clone() for i in range(world)] if ctx.rank == root else None
                    dist.scatter(o, c, src=root, group=g)
                    return o
                _check(failures, f"scatter w={world} n={n} root={root}", out, full[ctx.rank * n:(ctx.rank + 1) * n],
                       _gloo_try(on_gloo))
    return failures


@pytest.mark.parametrize("dtype_name", DTYPE_NAMES)
def test_gather_and_scatter_every_root(pool, dtype_name):
    assert pool.run(case_gather_scatter, dtype_name) == [[]] * pool.world


def case_all_to_all(ctx, dtype_name):
    dtype = getattr(torch, dtype_name)
    failures = []
    for world, g, h in _worlds(ctx):
        r = ctx.rank
        for b in SIZES:
            inputs = [_inp(s, world, b * world, dtype, salt=s) for s in range(world)]
            want = torch.cat([inputs[s][r * b:(r + 1) * b] for s in range(world)])
            out = torch.zeros(b * world, dtype=dtype)
            dist.all_to_all_single(out, inputs[r], group=h)

            def on_gloo():
                o = torch.zeros(b * world, dtype=dtype)
                dist.all_to_all_single(o, inputs[r], group=g)
                return o
            _check(failures, f"all_to_all_single w={world} b={b}", out, want, _gloo_try(on_gloo))
            outs = [torch.zeros(b, dtype=dtype) for _ in range(world)]
            dist.all_to_all(outs, list(inputs[r].split(b)) if b else [torch.zeros(0, dtype=dtype)] * world, group=h)
            _check(failures, f"all_to_all(list) w={world} b={b}", torch.cat(outs), want)
        # Unequal splits (rows of a 2-D tensor): rank s sends (s + d) % 3 rows to rank d.
        rows = [[(s + d) % 3 for d in range(world)] for s in range(world)]
        inputs = [_inp(s, world, sum(rows[s]) * 2, dtype, salt=s).view(-1, 2) for s in range(world)]
        recv = [rows[s][r] for s in range(world)]
        parts = [inputs[s][sum(rows[s][:r]):sum(rows[s][:r]) + rows[s][r]] for s in range(world)]
        want = torch.cat(parts)
        out = torch.zeros(sum(recv), 2, dtype=dtype)
        dist.all_to_all_single(out, inputs[r], output_split_sizes=recv, input_split_sizes=rows[r], group=h)

        def on_gloo():
            o = torch.zeros(sum(recv), 2, dtype=dtype)
            dist.all_to_all_single(o, inputs[r], output_split_sizes=recv, input_split_sizes=rows[r], group=g)
            return o
        _check(failures, f"all_to_all_single(unequal) w={world}", out, want, _gloo_try(on_gloo))
        outs = [torch.zeros(x, 2, dtype=dtype) for x in recv]
        dist.all_to_all(outs, list(inputs[r].split(rows[r])), group=h)
        _check(failures, f"all_to_all(list, unequal) w={world}", torch.cat(outs), want)
    return failures


@pytest.mark.parametrize("dtype_name", DTYPE_NAMES)
def test_all_to_all_equal_and_unequal_splits(pool, dtype_name):
    assert pool.run(case_all_to_all, dtype_name) == [[]] * pool.world


def case_coalesced_gathers(ctx):
    """allgather_coalesced, allgather_into_tensor_coalesced, reduce_scatter_tensor_coalesced."""
    from torch.distributed.distributed_c10d import _coalescing_manager

    failures = []
    w, r = ctx.world, ctx.rank
    ins = [_inp(r, w, 3, torch.float32, salt=1), _inp(r, w, 2, torch.int16, salt=2)]
    # torch's layout, as dist.all_gather_coalesced passes it: one output list
    # per rank, outs[rank][i] receiving that rank's ins[i] (gloo's too).
    ins_same = [_inp(r, w, 3, torch.float32, salt=1), _inp(r, w, 2, torch.float32, salt=2)]
    gloo_group = ctx.groups[w][0]
    for group, tag in ((ctx.hcomm, "hcomm"), (gloo_group, "gloo")):
        outs = [[torch.zeros(3), torch.zeros(2)] for _ in range(w)]
        dist.all_gather_coalesced(outs, ins_same, group=group)
        for i, n in enumerate((3, 2)):
            want = torch.cat([_inp(s, w, n, torch.float32, salt=i + 1) for s in range(w)])
            _check(failures, f"{tag} all_gather_coalesced[{i}]", torch.cat([outs[s][i] for s in range(w)]), want)
    # The backend method with mixed dtypes (the Python API insists on one).
    outs = [[torch.zeros(3), torch.zeros(2, dtype=torch.int16)] for _ in range(w)]
    ctx.hcomm.allgather_coalesced(outs, ins).wait()
    for i, n in enumerate((3, 2)):
        want = torch.cat([_inp(s, w, n, ins[i].dtype, salt=i + 1) for s in range(w)])
        _check(failures, f"allgather_coalesced[{i}]", torch.cat([outs[s][i] for s in range(w)]), want)
    # Functional collectives and FSDP reach allgather_into_tensor_coalesced / reduce_scatter_tensor_coalesced
    # through the coalescing manager.
    outs = [torch.zeros(3 * w), torch.zeros(5 * w, dtype=torch.int64)]
    with _coalescing_manager(group=ctx.hcomm, device=torch.device("cpu")):
        dist.all_gather_into_tensor(outs[0], ins[0], group=ctx.hcomm)
        dist.all_gather_into_tensor(outs[1], torch.full((5,), r, dtype=torch.int64), group=ctx.hcomm)
    _check(failures, "all_gather coalesced[0]", outs[0], torch.cat([_inp(s, w, 3, torch.float32, salt=1) for s in range(w)]))
    _check(failures, "all_gather coalesced[1]", outs[1], torch.arange(w).repeat_interleave(5))
    rs_out = [torch.zeros(2), torch.zeros(1, dtype=torch.int32)]
    with _coalescing_manager(group=ctx.hcomm, device=torch.device("cpu")):
        dist.reduce_scatter_tensor(rs_out[0], torch.arange(2 * w, dtype=torch.float32), group=ctx.hcomm)
        dist.reduce_scatter_tensor(rs_out[1], torch.full((w,), r + 1, dtype=torch.int32), group=ctx.hcomm)
    _check(failures, "reduce_scatter coalesced[0]", rs_out[0], torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) * w)
    _check(failures, "reduce_scatter coalesced[1]", rs_out[1], torch.tensor([w * (w + 1) // 2], dtype=torch.int32))
    return failures


def test_coalesced_gather_family(pool):
    assert pool.run(case_coalesced_gathers) == [[]] * pool.world

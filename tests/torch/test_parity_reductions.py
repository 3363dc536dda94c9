"""Multi-process parity: reducing collectives on hcomm vs gloo, exact, worlds 1-4.

Every case runs the op on the hcomm group and checks exact expected values
(tests.helpers.ref); where gloo can run the same call it also runs it on the
gloo group over the same ranks and demands identical bits.  Each pytest case
is one round trip to the shared pool that loops over ops x sizes x worlds.
"""
import pytest
import torch
import torch.distributed as dist

from tests.helpers.ref import OPS, REDUCE_DTYPES, make_input, op_applies, reduce_ref, same, torch_op

SIZES = [0, 1, 7]
DTYPE_NAMES = [str(d).split(".")[-1] for d in REDUCE_DTYPES]


def _gloo_try(fn):
    """Run fn on gloo; None if gloo refuses the call (it raises the same way on every rank)."""
    try:
        return fn()
    except (RuntimeError, ValueError, TypeError):
        return None


def _check(failures, tag, got, expected, gloo=None):
    if not same(got, expected):
        failures.append(f"{tag}: hcomm {got.tolist()} != expected {expected.tolist()}")
    elif gloo is not None and not same(got, gloo):
        failures.append(f"{tag}: hcomm {got.tolist()} != gloo {gloo.tolist()}")


def case_all_reduce(ctx, dtype_name, sizes):
    dtype = getattr(torch, dtype_name)
    failures, gloo_ran = [], 0
    for world, (g, h) in sorted(ctx.groups.items()):
        if not ctx.in_group(world):
            continue
        for op in OPS:
            if not op_applies(op, dtype):
                continue
            for n in sizes:
                inputs = [make_input(r, world, n, dtype, op) for r in range(world)]
                expected = reduce_ref(inputs, op)
                x = inputs[ctx.rank].clone()
                dist.all_reduce(x, op=torch_op(op), group=h)

                def on_gloo():
                    y = inputs[ctx.rank].clone()
                    dist.all_reduce(y, op=torch_op(op), group=g)
                    return y
                y = _gloo_try(on_gloo)
                gloo_ran += y is not None
                _check(failures, f"all_reduce w={world} {op} n={n}", x, expected, y)
    return failures, gloo_ran


@pytest.mark.parametrize("dtype_name", DTYPE_NAMES)
def test_all_reduce_matches_expected_and_gloo(pool, dtype_name):
    results = pool.run(case_all_reduce, dtype_name, SIZES)
    for failures, _ in results:
        assert failures == []
    if dtype_name in ("float32", "int64", "float64", "int32"):
        assert results[0][1] > 0, "gloo should have run some of these for comparison"


def case_reduce(ctx, dtype_name, sizes):
    dtype = getattr(torch, dtype_name)
    failures = []
    for world, (g, h) in sorted(ctx.groups.items()):
        if not ctx.in_group(world):
            continue
        for op in OPS:
            if not op_applies(op, dtype):
                continue
            for n in sizes:
                inputs = [make_input(r, world, n, dtype, op) for r in range(world)]
                expected = reduce_ref(inputs, op)
                root = (n + 1) % world  # group rank; dist.reduce takes a global rank == group rank here
                x = inputs[ctx.rank].clone()
                dist.reduce(x, dst=root, op=torch_op(op), group=h)
                want = expected if ctx.rank == root else inputs[ctx.rank]  # non-roots keep their input

                def on_gloo():
                    y = inputs[ctx.rank].clone()
                    dist.reduce(y, dst=root, op=torch_op(op), group=g)
                    return y
                y = _gloo_try(on_gloo)
                _check(failures, f"reduce w={world} {op} n={n} root={root}", x, want,
                       y if ctx.rank == root else None)
    return failures


@pytest.mark.parametrize("dtype_name", DTYPE_NAMES)
def test_reduce_matches_expected_on_root_and_leaves_other_ranks_alone(pool, dtype_name):
    assert pool.run(case_reduce, dtype_name, [0, 7]) == [[]] * pool.world


def case_reduce_scatter(ctx, dtype_name, blocks):
    dtype = getattr(torch, dtype_name)
    failures = []
    for world, (g, h) in sorted(ctx.groups.items()):
        if not ctx.in_group(world):
            continue
        for op in OPS:
            if not op_applies(op, dtype):
                continue
            for b in blocks:
                inputs = [make_input(r, world, b * world, dtype, op) for r in range(world)]
                mine = reduce_ref(inputs, op)[ctx.rank * b:(ctx.rank + 1) * b]
                x = inputs[ctx.rank].clone()
                out = torch.full((b,), 3, dtype=dtype)
                dist.reduce_scatter_tensor(out, x, op=torch_op(op), group=h)
                if not same(x, inputs[ctx.rank]):
                    failures.append(f"reduce_scatter_tensor modified its input w={world} {op}")

                def on_gloo():
                    o = torch.full((b,), 3, dtype=dtype)
                    dist.reduce_scatter_tensor(o, inputs[ctx.rank].clone(), op=torch_op(op), group=g)
                    return o
                _check(failures, f"reduce_scatter_tensor w={world} {op} b={b}", out, mine, _gloo_try(on_gloo))
                # The list form: one input tensor per rank.
                out2 = torch.full((b,), 3, dtype=dtype)
                dist.reduce_scatter(out2, list(inputs[ctx.rank].clone().chunk(world) if b else
                                               [torch.empty(0, dtype=dtype)] * world), op=torch_op(op), group=h)
                _check(failures, f"reduce_scatter(list) w={world} {op} b={b}", out2, mine)
    return failures


@pytest.mark.parametrize("dtype_name", DTYPE_NAMES)
def test_reduce_scatter_tensor_and_list_forms(pool, dtype_name):
    assert pool.run(case_reduce_scatter, dtype_name, [0, 1, 3]) == [[]] * pool.world


def case_allreduce_coalesced(ctx):
    """allreduce_coalesced (via the coalescing manager) on one dtype and on mixed dtypes."""
    from torch.distributed.distributed_c10d import _coalescing_manager

    failures = []
    world = ctx.world
    for dtypes in ([torch.float32, torch.float32, torch.float32], [torch.int16, torch.float64, torch.bool]):
        inputs = [[make_input(r, world, 3 + i, d, "sum", salt=i) for i, d in enumerate(dtypes)] for r in range(world)]
        mine = [t.clone() for t in inputs[ctx.rank]]
        with _coalescing_manager(group=ctx.hcomm, device=torch.device("cpu")):
            for t in mine:
                dist.all_reduce(t, group=ctx.hcomm)
        for i in range(len(dtypes)):
            _check(failures, f"coalesced {dtypes[i]}", mine[i], reduce_ref([inputs[r][i] for r in range(world)], "sum"))
    # The backend method itself, through the ProcessGroup binding.
    ts = [torch.full((2, 3), float(ctx.rank)), torch.arange(4, dtype=torch.float32) * (ctx.rank + 1)]
    opts = dist.AllreduceCoalescedOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    ctx.hcomm.allreduce_coalesced(ts, opts).wait()
    s = sum(range(world))
    _check(failures, "allreduce_coalesced[0]", ts[0], torch.full((2, 3), float(s)))
    _check(failures, "allreduce_coalesced[1]", ts[1], torch.arange(4, dtype=torch.float32) * sum(range(1, world + 1)))
    return failures


def test_allreduce_coalesced_same_and_mixed_dtypes(pool):
    assert pool.run(case_allreduce_coalesced) == [[]] * pool.world


def case_complex_sum_through_real_view(ctx):
    w, r = ctx.world, ctx.rank
    x = torch.tensor([1 + 2j, -3j, 4], dtype=torch.complex64) * (r + 1)
    dist.all_reduce(x, group=ctx.hcomm)
    return torch.equal(x, torch.tensor([1 + 2j, -3j, 4], dtype=torch.complex64) * (w * (w + 1) // 2))


def test_complex_sum_runs_as_real_pairs_with_exact_result(pool):
    assert pool.run(case_complex_sum_through_real_view) == [True] * pool.world

"""Multi-process: the device path of the uneven collectives (csrc/torch/device_uneven.cpp), run over gloo.

On a GPU, `all_gather_v` and `reduce_scatter_v` of CUDA tensors pad every block to the largest count and
run the device library's even collective (NCCL has no uneven all-gather or reduce-scatter).  The same
code takes any c10d backend, so here it runs over a gloo group on CPU tensors and must equal the exact
result for counts with zeros, ones and odd sizes, several dtypes and reduce ops, and refuse bad calls
the way the host path does (mismatched counts, tensors on different devices) with the rank named.
"""
import datetime

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tests.helpers.mp import Pool

WORLD = 3
COUNTS = [[5, 0, 7], [1, 1, 1], [0, 0, 4], [1000, 3, 999]]


@pytest.fixture(scope="module")
def pool():
    p = Pool(WORLD, setup="bare", timeout_s=120)
    yield p
    p.close()


def case_padded(ctx):
    import hcomm  # noqa: F401
    from hcomm import _C

    dist.init_process_group("gloo", init_method=f"file://{ctx.tmp}/padded", rank=ctx.rank, world_size=ctx.world,
                            timeout=datetime.timedelta(seconds=30))
    gloo = dist.group.WORLD._get_backend(torch.device("cpu"))
    try:
        out = {}
        for i, counts in enumerate(COUNTS):
            for dt in (torch.float32, torch.int64, torch.bfloat16):
                x = (torch.arange(counts[ctx.rank]) + 100 * ctx.rank).to(dt)
                y = torch.full((sum(counts),), -1).to(dt)
                _C._padded_all_gather_v(gloo, y, x, counts)
                out[f"ag{i}{dt}"] = y.double().numpy()
            for name, op in (("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX), ("avg", dist.ReduceOp.AVG)):
                x = (torch.arange(sum(counts), dtype=torch.float64) * (ctx.rank + 1)) % 17
                y = torch.full((counts[ctx.rank],), -1.0, dtype=torch.float64)
                _C._padded_reduce_scatter_v(gloo, y, x, counts, int(op.op if hasattr(op, "op") else op))
                out[f"rs{i}{name}"] = y.numpy()
        errors = []
        for call in (lambda: _C._padded_all_gather_v(gloo, torch.zeros(9), torch.zeros(5), [5, 0, 3]),
                     lambda: _C._padded_all_gather_v(gloo, torch.zeros(12), torch.zeros(4, device="meta"), [4, 4, 4])):
            try:
                call()
                errors.append(None)
            except (ValueError, RuntimeError) as e:
                errors.append(f"{type(e).__name__}: {e}")
        out["errors"] = errors
        return out
    finally:
        # Drop the backend before the group: a ProcessGroupGloo that outlives destroy_process_group
        # (held from _get_backend) sometimes aborts the process later ("terminate called without an
        # active exception"), with torch's own calls alone too.
        gloo = None  # noqa: F841
        dist.destroy_process_group()


def test_padded_uneven_collectives_are_exact_and_refuse_bad_calls(pool):
    res = pool.run(case_padded)
    for i, counts in enumerate(COUNTS):
        off = np.cumsum([0] + counts)
        gathered = np.concatenate([np.arange(counts[q]) + 100 * q for q in range(WORLD)])
        full = [(np.arange(sum(counts)) * (q + 1)) % 17 for q in range(WORLD)]
        for r in range(WORLD):
            for dt in (torch.float32, torch.int64, torch.bfloat16):
                ref = gathered if dt != torch.bfloat16 else torch.tensor(gathered).to(dt).double().numpy()
                np.testing.assert_array_equal(res[r][f"ag{i}{dt}"], ref)
            block = slice(off[r], off[r + 1])
            np.testing.assert_array_equal(res[r][f"rs{i}sum"], sum(full)[block])
            np.testing.assert_array_equal(res[r][f"rs{i}max"], np.maximum.reduce(full)[block])
            np.testing.assert_allclose(res[r][f"rs{i}avg"], (sum(full) / WORLD)[block], rtol=1e-15)
    for r in range(WORLD):
        bad_counts, bad_device = res[r]["errors"]
        # rank 0: the counts sum to 8 for an output of 9; ranks 1 and 2: their own count is not their input's 5
        assert bad_counts is not None and "ValueError" in bad_counts and "output_split_sizes" in bad_counts, bad_counts
        assert bad_device is not None and f"rank {r}" in bad_device and "meta" in bad_device, bad_device


def case_device_mix(ctx):
    import hcomm  # noqa: F401
    from hcomm.collectives import _backend

    dist.init_process_group("hcomm", init_method=f"file://{ctx.tmp}/device-mix", rank=ctx.rank,
                            world_size=ctx.world, timeout=datetime.timedelta(seconds=30))
    pg = _backend()
    try:
        errors = {}
        calls = {
            "mixed": lambda: pg._allgather_base(torch.zeros(3 * ctx.world), torch.zeros(3, device="meta")),
            "mixed_v": lambda: pg.all_gather_v(torch.zeros(3 * ctx.world, device="meta"), torch.zeros(3),
                                               [3] * ctx.world),
            "no_backend": lambda: pg.allreduce([torch.zeros(3, device="meta")]),
        }
        for name, call in calls.items():
            try:
                call()
                errors[name] = None
            except (ValueError, RuntimeError) as e:
                errors[name] = f"{type(e).__name__}: {e}"
        x = torch.ones(4)
        dist.all_reduce(x)  # the group is still fine: nothing was sent
        errors["after"] = float(x[0])
        return errors
    finally:
        pg = None  # noqa: F841  (as above: no backend outlives its group)
        dist.destroy_process_group()


def test_tensors_on_two_devices_or_a_device_without_backend_are_refused_naming_the_rank(pool):
    for r, e in enumerate(pool.run(case_device_mix)):
        assert e["mixed"] and e["mixed"].startswith("ValueError") and f"all_gather on rank {r}" in e["mixed"] \
            and "tensors on cpu and meta in one call" in e["mixed"], e
        assert e["mixed_v"] and f"all_gather_v on rank {r}" in e["mixed_v"] and "cpu and meta" in e["mixed_v"], e
        assert e["no_backend"] and f"all_reduce on rank {r}" in e["no_backend"] \
            and "no backend for it" in e["no_backend"], e
        assert e["after"] == WORLD

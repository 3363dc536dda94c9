"""Multi-process: every way of creating an hcomm group.

init_process_group("hcomm") over file:// and tcp://, the "cpu:hcomm" device
string, env:// under a real torchrun launch, new_group(ranks, backend="hcomm")
and init_device_mesh on an hcomm default group.  A 2-rank "bare" pool whose
cases each create and destroy their own default group.
"""
import datetime
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from tests.helpers.mp import Pool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def case_init(ctx, backend, init_method):
    import hcomm
    from hcomm import _C

    if init_method.startswith("env://"):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=init_method.split(":")[-1])
        init_method = "env://"
    dist.init_process_group(backend, init_method=init_method, rank=ctx.rank, world_size=ctx.world,
                            timeout=datetime.timedelta(seconds=30))
    try:
        pg = dist.distributed_c10d._get_default_group()
        res = {"backend": str(dist.get_backend()),
               "is_hcomm": isinstance(pg._get_backend(torch.device("cpu")), _C.ProcessGroupHComm)}
        t = torch.tensor([ctx.rank + 1.0, 2.0])
        dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
        res["product"] = t.tolist()
        # A subgroup of one rank and one of both, created by every rank.
        solo = dist.new_group(ranks=[1], backend="hcomm")
        pair = dist.new_group(ranks=[0, 1], backend="hcomm")
        if ctx.rank == 1:
            s = torch.full((2,), 5.0)
            dist.all_reduce(s, group=solo)
            res["solo"] = s.tolist()
        p = torch.tensor([float(ctx.rank)])
        hcomm.broadcast(p, src=1, group=pair)
        res["pair"] = p.item()
        return res
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def bare_pool():
    p = Pool(2, setup="bare")
    yield p
    p.close()


@pytest.mark.parametrize("backend", ["hcomm", "cpu:hcomm"])
@pytest.mark.parametrize("method", ["file", "tcp", "env"])
def test_init_process_group_with_hcomm(bare_pool, backend, method, tmp_path):
    init = {"file": f"file://{tmp_path}/init", "tcp": f"tcp://127.0.0.1:{_free_port()}",
            "env": f"env://:{_free_port()}"}[method]
    res = bare_pool.run(case_init, backend, init)
    for rank, r in enumerate(res):
        assert r["is_hcomm"] and r["backend"] in ("hcomm", "cpu:hcomm")
        assert r["product"] == [2.0, 4.0]
        assert r["pair"] == 1.0
    assert res[1]["solo"] == [5.0, 5.0]


def case_device_mesh(ctx, init_method):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    import hcomm  # noqa: F401

    dist.init_process_group("hcomm", init_method=init_method, rank=ctx.rank, world_size=ctx.world)
    try:
        mesh = init_device_mesh("cpu", (2,))
        full = torch.arange(12, dtype=torch.float32).view(4, 3)
        d = distribute_tensor(full, mesh, [Shard(0)])
        local = d.to_local().clone()
        rep = d.redistribute(mesh, [Replicate()]).to_local()
        backend = type(mesh.get_group()._get_backend(torch.device("cpu"))).__name__
        return torch.equal(local, full[2 * ctx.rank:2 * ctx.rank + 2]), torch.equal(rep, full), backend
    finally:
        dist.destroy_process_group()


def test_init_device_mesh_on_an_hcomm_default_group(bare_pool, tmp_path):
    assert bare_pool.run(case_device_mesh, f"file://{tmp_path}/mesh") == [(True, True, "ProcessGroupHComm")] * 2


def test_torchrun_env_launch(tmp_path):
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    proc = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2",
                           os.path.join(ROOT, "tests", "torch", "scripts", "torchrun_check.py")],
                          env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "rank 0: ok" in out and "rank 1: ok" in out, out[-3000:]

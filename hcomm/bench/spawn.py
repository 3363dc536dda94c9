"""Starting the ranks: under torchrun (or ``hcomm emulate run``), or locally.

Under a launcher, RANK/WORLD_SIZE/MASTER_ADDR are set and each process is
one rank.  Otherwise ``--nprocs N`` spawns N local processes (spawn start
method: fork would copy a parent that may already hold threads) that meet
in a FileStore in a fresh temporary directory, so no port can collide.

The rank function returns an exit code; all ranks agree on it (the results
it depends on are all-reduced), and the local parent returns rank 0's.
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
import tempfile
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

RankFn = Callable[[int, int, torch.device, Any], int]
_TIMEOUT = datetime.timedelta(minutes=10)


def under_launcher() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def _device(kind: str, local_rank: int) -> torch.device:
    if kind == "cuda":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def _child(rank: int, nranks: int, tmp: str, fn: RankFn, device_kind: str, payload: Any) -> None:
    store = dist.FileStore(os.path.join(tmp, "store"), nranks)
    # the default group is gloo: it carries the bench's own control traffic
    dist.init_process_group("gloo", store=store, rank=rank, world_size=nranks, timeout=_TIMEOUT)
    try:
        rc = fn(rank, nranks, _device(device_kind, rank), payload)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(os.path.join(tmp, "rc.json"), "w") as f:
            json.dump({"rc": int(rc)}, f)


def run(fn: RankFn, nprocs: int, device_kind: str, payload: Any) -> int:
    if under_launcher():
        dist.init_process_group("gloo", timeout=_TIMEOUT)
        try:
            local = int(os.environ.get("LOCAL_RANK", "0"))
            return int(fn(dist.get_rank(), dist.get_world_size(), _device(device_kind, local), payload))
        finally:
            dist.destroy_process_group()
    tmp = tempfile.mkdtemp(prefix="hcomm-bench-")
    try:
        mp.start_processes(_child, args=(nprocs, tmp, fn, device_kind, payload), nprocs=nprocs,
                           start_method="spawn", join=True)
        with open(os.path.join(tmp, "rc.json")) as f:
            return int(json.load(f)["rc"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

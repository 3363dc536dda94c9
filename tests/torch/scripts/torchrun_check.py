"""Launched by tests/torch/test_init_methods.py under `torchrun --standalone --nproc-per-node 2`.

env:// rendezvous with backend "hcomm": checks exact results of a few
collectives and the backend behind the default group, exits 0 on success.
"""
import sys

import torch
import torch.distributed as dist

import hcomm
from hcomm import _C


def main() -> int:
    dist.init_process_group("hcomm")  # env:// from torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    ok = world == 2 and dist.get_backend() == "hcomm"
    ok &= isinstance(dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu")), _C.ProcessGroupHComm)
    t = torch.arange(5, dtype=torch.int16) * (rank + 1)  # int16: hcomm's own ring, gloo cannot
    dist.all_reduce(t)
    ok &= torch.equal(t, torch.arange(5, dtype=torch.int16) * 3)
    out = torch.zeros(3)
    hcomm.all_gather_v(out, torch.full((rank + 1,), float(rank)), [1, 2])
    ok &= out.tolist() == [0.0, 1.0, 1.0]
    print(f"rank {rank}: {'ok' if ok else 'FAILED'}", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

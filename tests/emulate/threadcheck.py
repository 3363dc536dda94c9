"""A job for the emulator's host-threads test: after a gloo and an hcomm all_reduce (their threads
started), every thread of the rank says which cpu cgroup it is in.  Prints one line per rank:
``THREADS <rank> <main thread's group> <sorted (name, group) of the others>``."""
import os
import time

import torch
import torch.distributed as dist

import hcomm  # noqa: F401  (registers backend "hcomm")

dist.init_process_group("gloo")
hc = dist.new_group(backend="hcomm")
t = torch.ones(1 << 14)
dist.all_reduce(t)
dist.all_reduce(t, group=hc)
time.sleep(0.5)   # several of the wrapper's sweeps


def cpu_group(tid: str) -> str:
    with open(f"/proc/self/task/{tid}/cgroup") as f:   # lines of "id:controllers:path"
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "cpu" in controllers.split(","):
                return path.rsplit("/", 1)[-1]
    return "?"


me = str(os.getpid())
others = []
for tid in os.listdir("/proc/self/task"):
    if tid != me:
        with open(f"/proc/self/task/{tid}/comm") as f:
            others.append((f.read().strip(), cpu_group(tid)))
print(f"THREADS {dist.get_rank()} {cpu_group(me)} {sorted(set(others))}", flush=True)
dist.barrier()
dist.destroy_process_group()

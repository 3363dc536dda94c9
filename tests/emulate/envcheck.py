"""A tiny job for emulated runs: report this rank's env and all-reduce once."""
import json
import os
import sys

import torch
import torch.distributed as dist

KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "HCOMM_EMU_NODE", "HCOMM_EMU_ISLAND",
        "HCOMM_EMU_VENDOR", "HCOMM_EMU_DEVICE", "HCOMM_EMU_SPEED", "HCOMM_EMU_MEMORY",
        "HCOMM_EMU_CLUSTER", "GLOO_SOCKET_IFNAME")

dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
n = dist.get_world_size()
assert t.item() == n * (n + 1) / 2, t.item()
print("ENV " + json.dumps({k: os.environ.get(k) for k in KEYS}), flush=True)
dist.destroy_process_group()
if len(sys.argv) > 2 and sys.argv[1] == "exit-on-rank" and os.environ["RANK"] == sys.argv[2]:
    sys.exit(int(sys.argv[3]))

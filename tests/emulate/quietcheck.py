"""A short correct job for the emulator's quiet-output test: one all_reduce per rank.

Run on every rank by ``hcomm emulate run``; prints one line per rank.
"""
import torch
import torch.distributed as dist

import hcomm  # noqa: F401  (registers backend "hcomm")

dist.init_process_group("hcomm")
t = torch.ones(1024)
dist.all_reduce(t)
print(f"QUIET {dist.get_rank()} {int(t[0].item())}", flush=True)
dist.destroy_process_group()

"""A real torch interleaved pipeline between the A100 and the V100 ranks of ``mixed`` (pairs 2-0 and 3-1,
two stages of tanh(Linear(384)) chunks per rank, 12 micro-batches of one 64 x 384 sample: the main job's
96 KiB boundary), against the same chunks run bare on each rank: what one action costs beyond its
computation, in wall and CPU time.  A diagnostic beside ``analyze.py``, not part of hcomm.

    hcomm emulate run --cluster mixed -- python benchmarks/planner/pipeline_trace/pair_probe.py [REPS]

``REPS``: tanh(Linear) layers per chunk (default 4: ~7 ms of CPU per action on this box)."""
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 4
MICRO_BATCHES = 12


class Chunk(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Linear(384, 384)

    def forward(self, x):
        for _ in range(REPS):
            x = torch.tanh(self.w(x))
        return x


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pairs = [[2, 0], [3, 1]]
    groups = [dist.new_group(p) for p in pairs]   # every rank creates every group
    group = groups[next(i for i, p in enumerate(pairs) if rank in p)]
    me = dist.get_rank(group)                     # group ranks follow the sorted global ranks
    stages = [PipelineStage(Chunk(), me + 2 * k, 4, torch.device("cpu"), group=group) for k in range(2)]
    schedule = ScheduleInterleaved1F1B(stages, MICRO_BATCHES, loss_fn=lambda o, t: ((o - t) ** 2).mean())
    x, y = torch.randn(MICRO_BATCHES, 64, 384), torch.randn(MICRO_BATCHES, 64, 384)

    def step():
        schedule.step(x) if me == 0 else schedule.step(target=y, losses=[])

    def bare():
        for m in range(MICRO_BATCHES):
            for s in stages:
                s.submod(x[m:m + 1].requires_grad_()).sum().backward()

    for _ in range(2):
        step()
    actions = 4 * MICRO_BATCHES
    for _ in range(3):
        dist.barrier()
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(2):
            step()
        wall, cpu = (time.perf_counter() - wall) / 2, (time.process_time() - cpu) / 2
        bare_wall, bare_cpu = time.perf_counter(), time.process_time()
        for _ in range(2):
            bare()
        bare_wall, bare_cpu = (time.perf_counter() - bare_wall) / 2, (time.process_time() - bare_cpu) / 2
        print(f"rank {rank}: step {wall * 1e3:.0f} ms (CPU {cpu * 1e3:.0f}), bare {bare_wall * 1e3:.0f} "
              f"(CPU {bare_cpu * 1e3:.0f}); beyond the chunks per action {(wall - bare_wall) / actions * 1e3:.1f} "
              f"ms, CPU {(cpu - bare_cpu) / actions * 1e3:.2f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

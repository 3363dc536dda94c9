"""FSDP2 (torch's ``fully_shard``) training steps over an hcomm group: gloo's own collectives forced
("native", what hcomm chose for every all-gather and reduce-scatter on gloo before 2026-12-06) against
hcomm's choice (its rings where they are faster: ``csrc/core/algo/cost.cpp``), and FSDP2 over plain gloo.

FSDP2 gathers each block's parameters with ``all_gather_into_tensor`` and scatters its gradients with
``reduce_scatter_tensor``: exactly the two collectives whose pricing changed.  Local spawned ranks, the
``small`` model (12M parameters) with every block and the whole model sharded, AdamW; the three setups
run in alternated blocks of steps on the same ranks (one model per setup, the same batches), and each
block's median step is the slowest rank's.  Every setup's losses are printed: they must agree (same
model, same data, the same sums in another order: fp32 within ~1e-5).

    python benchmarks/overhead/bench_fsdp2_flat.py --nprocs 2 --out benchmarks/results/fsdp2-flat-choice.md
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from datetime import date

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SETUPS = ("hcomm, gloo's collectives forced", "hcomm, its choice", "torch gloo")


def _model(group, seed: int = 0):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.device_mesh import DeviceMesh

    from hcomm.models import build_model

    model = build_model("small", vocab_size=4096, seed=seed)
    mesh = DeviceMesh.from_group(group, "cpu")
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _step(model, optimizer, batch) -> float:
    loss = model.loss(batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def _run(rank: int, world: int, init: str, rounds: int, steps: int, out: str):
    import hcomm

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    ref = dist.new_group(backend="gloo")
    groups = [dist.new_group(backend="hcomm"), dist.new_group(backend="hcomm"), dist.new_group(backend="gloo")]
    hcomm.set_algorithm("native", groups[0])
    models = [_model(g) for g in groups]
    gen = torch.Generator().manual_seed(1 + rank)
    batches = [torch.randint(0, 4096, (4, 65), generator=gen) for _ in range(rounds * steps + 1)]
    per = {name: [] for name in SETUPS}
    losses = {name: [] for name in SETUPS}
    for i, (model, opt) in enumerate(models):   # first-call costs out of the way, one step each
        losses[SETUPS[i]].append(_step(model, opt, batches[0]))
    for r in range(rounds):
        order = range(3) if r % 2 == 0 else reversed(range(3))
        for i in order:
            model, opt = models[i]
            times = []
            for s in range(steps):
                dist.barrier(group=ref)
                start = time.perf_counter()
                losses[SETUPS[i]].append(_step(model, opt, batches[1 + r * steps + s]))
                t = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ref)
                times.append(float(t))
            per[SETUPS[i]].append(statistics.median(times))
    chosen = {op: hcomm.plan(op, nbytes, group=groups[1])["algorithm"]
              for op, nbytes in (("all_gather", 1 << 20), ("reduce_scatter", 1 << 20))}
    if rank == 0:
        base = per[SETUPS[0]]
        lines = [f"# FSDP2 over an hcomm group: gloo's collectives vs hcomm's choice, {world} local ranks "
                 f"({date.today().isoformat()})", "",
                 f"Machine: {platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
                 f"torch {torch.__version__}.  Produced by `benchmarks/overhead/bench_fsdp2_flat.py` ({rounds} "
                 f"rounds of {steps} steps per setup, alternated; model small, 4 x 64 tokens per rank and step, "
                 f"every block sharded).  hcomm's choice at 1 MiB per rank: {chosen}.", "",
                 "| setup | median step ms | vs gloo's collectives forced | last loss |", "|---|---|---|---|"]
        for name in SETUPS:
            ratio = statistics.median(a / b for a, b in zip(per[name], base))
            lines.append(f"| {name} | {statistics.median(per[name]) * 1e3:.0f} | {ratio:.2f}x | "
                         f"{losses[name][-1]:.6f} |")
        worst = max(abs(a - b) for name in SETUPS[1:] for a, b in zip(losses[name], losses[SETUPS[0]]))
        lines += ["", f"Largest difference of any step's loss from the forced setup's: {worst:.2e}."]
        text = "\n".join(lines) + "\n"
        print(text, flush=True)
        if out:
            with open(out, "w") as f:
                f.write(text)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    init = "file://" + tempfile.mktemp(prefix="hcomm-fsdp2-")
    mp.spawn(_run, args=(args.nprocs, init, args.rounds, args.steps, args.out), nprocs=args.nprocs)


if __name__ == "__main__":
    main()

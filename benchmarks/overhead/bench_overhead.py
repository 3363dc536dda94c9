"""hcomm's flat all-reduce vs torch's gloo: the overhead hcomm adds.

Both run the same gloo ring (hcomm's `native` algorithm), so the difference
is hcomm's own cost: argument checks, selection, the request and Work
objects, the completion callback.  Shared 2-core VMs are noisy, so blocks of
calls alternate between the two backends for several rounds and the median
of the per-round paired differences is reported, beside each median.

    python benchmarks/overhead/bench_overhead.py --nprocs 2 --out benchmarks/results/overhead-2026-12-02.md
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import tempfile
import time
from datetime import date

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [4, 64, 1024, 4096, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def calls_for(nbytes: int) -> int:
    return 200 if nbytes <= 4096 else max(3, int(64e6 / max(nbytes, 1) / 2))


def rank_main(rank, world, init, rounds, out):
    import hcomm

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    groups = {"gloo": dist.new_group(backend="gloo"), "hcomm": dist.new_group(backend="hcomm")}
    rows = []
    for nbytes in SIZES:
        t = torch.ones(max(1, nbytes // 4))
        calls = calls_for(nbytes)
        per = {"gloo": [], "hcomm": []}
        for r in range(rounds):
            order = ("gloo", "hcomm") if r % 2 == 0 else ("hcomm", "gloo")
            for name in order:
                g = groups[name]
                for _ in range(3):
                    dist.all_reduce(t, group=g)
                dist.barrier(group=groups["gloo"])
                t0 = time.perf_counter()
                for _ in range(calls):
                    dist.all_reduce(t, group=g)
                dt = torch.tensor([(time.perf_counter() - t0) / calls], dtype=torch.float64)
                dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=groups["gloo"])
                per[name].append(dt.item())
        diffs = [h - g for h, g in zip(per["hcomm"], per["gloo"])]
        ratios = [h / g for h, g in zip(per["hcomm"], per["gloo"])]
        algo = hcomm.last_op(groups["hcomm"])["algorithm"]
        rows.append((nbytes, statistics.median(per["gloo"]), statistics.median(per["hcomm"]),
                     statistics.median(diffs), statistics.median(ratios), algo))
        if rank == 0:
            print(f"{nbytes:>10} gloo {rows[-1][1]*1e6:9.1f} us  hcomm {rows[-1][2]*1e6:9.1f} us  "
                  f"diff {rows[-1][3]*1e6:+8.1f} us  ratio {rows[-1][4]:.3f}  ({algo})", flush=True)
    if rank == 0 and out:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        lines = [f"# Flat all-reduce overhead, hcomm vs torch gloo, {world} ranks — {date.today()}", "",
                 f"Machine: {platform.node()}, {os.cpu_count()} cores, {platform.platform()}; torch {torch.__version__}; "
                 f"hcomm {rev}; localhost, one process per rank.", "",
                 f"{rounds} rounds; each round times a block of calls on each backend (order alternating); "
                 "per-call time is the max over ranks. Medians over rounds; `diff` and `ratio` are medians of the "
                 "per-round paired hcomm - gloo differences and hcomm / gloo ratios.", "",
                 "| bytes | gloo µs | hcomm µs | diff µs | hcomm/gloo | hcomm algorithm |",
                 "| ---: | ---: | ---: | ---: | ---: | --- |"]
        for nbytes, g, h, d, r, algo in rows:
            lines.append(f"| {nbytes} | {g*1e6:.1f} | {h*1e6:.1f} | {d*1e6:+.1f} | {r:.3f} | {algo} |")
        with open(out, "w") as f:
            f.write("\n".join(lines) + "\n")
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--out", default="")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(rank_main, args=(a.nprocs, f"file://{tmp}/s", a.rounds, a.out), nprocs=a.nprocs,
                           start_method="spawn")


if __name__ == "__main__":
    main()

"""On one flat group: the vendor's collective ("native") against hcomm's own ring over the vendor's
point-to-point, and hcomm's default choice, for all_gather, reduce_scatter and all_reduce.

The cost model prices "native" and the ring with the same alpha-beta terms, so which runs is decided by
what the model adds to each (copies, reductions).  This measures the algorithms side by side on one
hcomm group (``hcomm.set_algorithm`` between blocks, blocks alternated for several rounds, every block
timed as the slowest rank's mean call) and reports the median of the per-round ratios to native, so a
choice the model makes can be held to the measurement.  Runs on spawned local ranks, or under the
emulator / torchrun when RANK and WORLD_SIZE are set.

    python benchmarks/overhead/bench_flat_choice.py --nprocs 2 --out benchmarks/results/flat-choice-local-2.md
    hcomm emulate run --cluster mixed -- python benchmarks/overhead/bench_flat_choice.py --out ...
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

SIZES = [64 << 10, 1 << 20, 8 << 20, 32 << 20]   # bytes of the whole (gathered / scattered) buffer
RINGS = {"all_gather": "ring_ag", "reduce_scatter": "ring_rs", "all_reduce": "ring"}


def calls_for(nbytes: int) -> int:
    return max(3, min(100, int(48e6 / nbytes)))


def _call(op: str, group, world: int, nbytes: int):
    whole = torch.ones(nbytes // 4)
    part = torch.ones(nbytes // 4 // world)
    if op == "all_gather":
        return lambda: dist.all_gather_into_tensor(whole, part, group=group)
    if op == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(part, whole, group=group)
    return lambda: dist.all_reduce(whole, group=group)


def _block(call, calls: int, group, ref) -> float:
    for _ in range(2):
        call()
    dist.barrier(group=ref)
    start = time.perf_counter()
    for _ in range(calls):
        call()
    t = torch.tensor([(time.perf_counter() - start) / calls], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ref)
    return float(t)


def measure(rank: int, world: int, rounds: int, sizes=SIZES):
    import hcomm

    ref = dist.new_group(backend="gloo")
    gloo = dist.new_group(backend="gloo")
    group = dist.new_group(backend="hcomm")
    rows = []
    for op, ring in RINGS.items():
        for nbytes in sizes:
            hcomm.set_algorithm("", group)
            _call(op, group, world, nbytes)()
            default = hcomm.last_op(group)["algorithm"]
            variants = {"native": ("native", group), ring: (ring, group), "gloo": (None, gloo)}
            per = {name: [] for name in variants}
            for r in range(rounds):
                names = list(variants) if r % 2 == 0 else list(reversed(variants))
                for name in names:
                    algo, g = variants[name]
                    if algo is not None:
                        hcomm.set_algorithm(algo, group)
                    per[name].append(_block(_call(op, g, world, nbytes), calls_for(nbytes), g, ref))
                    if algo is not None:
                        assert hcomm.last_op(group)["algorithm"] == algo, hcomm.last_op(group)
            ratio = statistics.median(a / b for a, b in zip(per[ring], per["native"]))
            gloo_ratio = statistics.median(a / b for a, b in zip(per["gloo"], per["native"]))
            rows.append((op, nbytes, default, statistics.median(per["native"]), statistics.median(per[ring]),
                         statistics.median(per["gloo"]), ratio, gloo_ratio))
            if rank == 0:
                print(f"{op:15s} {nbytes >> 10:7d} KiB default {default:8s} native {rows[-1][3] * 1e3:8.2f} ms  "
                      f"{ring} {rows[-1][4] * 1e3:8.2f} ms ({ratio:.2f}x)  torch gloo {rows[-1][5] * 1e3:8.2f} ms",
                      flush=True)
    hcomm.set_algorithm("", group)
    return rows


def report(rows, world: int, where: str, rounds: int) -> str:
    lines = [f"# hcomm's flat algorithms side by side, {where}, {world} ranks ({date.today().isoformat()})", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
             f"torch {torch.__version__}.  Produced by `benchmarks/overhead/bench_flat_choice.py` ({rounds} rounds "
             "of alternated blocks; a block = the slowest rank's mean call; medians over rounds; ratio = the median "
             "of the per-round ratios to native).", "",
             "| op | bytes | default | native ms | ring ms | ring / native | default / faster | torch gloo ms |",
             "|---|---|---|---|---|---|---|---|"]
    for op, nbytes, default, nat, ring, gl, ratio, _ in rows:
        chosen = nat if default == "native" else ring if default == RINGS[op] else float("nan")
        lines.append(f"| {op} | {nbytes >> 10} KiB | {default} | {nat * 1e3:.2f} | {ring * 1e3:.2f} | "
                     f"{ratio:.2f}x | {chosen / min(nat, ring):.2f}x | {gl * 1e3:.2f} |")
    return "\n".join(lines) + "\n"


def _spawned(rank, world, init, rounds, out, sizes):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    rows = measure(rank, world, rounds, sizes)
    if rank == 0 and out:
        with open(out, "w") as f:
            f.write(report(rows, world, "local ranks", rounds))
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default="")
    parser.add_argument("--where", default="the emulator")
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES),
                        help="comma-separated bytes of the whole buffer")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        rows = measure(rank, world, args.rounds, sizes)
        if rank == 0 and args.out:
            with open(args.out, "w") as f:
                f.write(report(rows, world, args.where, args.rounds))
        dist.destroy_process_group()
        return
    init = "file://" + tempfile.mktemp(prefix="hcomm-flat-")
    mp.spawn(_spawned, args=(args.nprocs, init, args.rounds, args.out, sizes), nprocs=args.nprocs)


if __name__ == "__main__":
    main()

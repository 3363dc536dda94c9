"""``hcomm demo``: the main job until the end-to-end training job exists.

With no arguments it brings up the default emulated cluster (two islands of
two ranks, the link between them ~10x slower than inside them) and runs
``hcomm bench all_reduce`` there, hcomm against torch's gloo side by side,
every result checked.  Where the emulator cannot run (not root, no ``ip``/
``tc``/cgroups) it says why and runs the same comparison on local ranks.
``--local`` asks for the local comparison; under ``torchrun`` or
``hcomm emulate run`` it uses the launcher's ranks.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import timedelta
from typing import List, Optional

import torch
import torch.distributed as dist

DEFAULT_SIZES = [4, 64, 1024, 4096, 65536, 1 << 20, 4 << 20, 16 << 20]


def _parse(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hcomm demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--nprocs", type=int, default=4, help="local ranks to spawn when not under a launcher")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--max-bytes", type=int, default=16 << 20)
    p.add_argument("--local", action="store_true", help="local ranks, no emulated cluster")
    p.add_argument("--cluster", default=None, help="emulator preset or spec (default: the default preset)")
    args = p.parse_args(argv)
    if args.nprocs < 1 or args.iters < 1 or args.warmup < 0:
        p.error("--nprocs and --iters must be >= 1, --warmup >= 0")
    return args


def _timed(fn, iters: int, group) -> float:
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def _rank_main(rank: int, world: int, init: str, args: argparse.Namespace) -> None:
    import hcomm

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    hc = dist.new_group(backend="hcomm")
    rows = []
    for nbytes in [s for s in DEFAULT_SIZES if s <= args.max_bytes]:
        n = max(1, nbytes // 4)
        # Values whose sums are exact in fp32, so any wrong element is caught.
        base = (torch.arange(n, dtype=torch.float32) % 17) * (rank + 1)
        expected = (torch.arange(n, dtype=torch.float32) % 17) * (world * (world + 1) / 2)
        result = {}
        for name, group in (("gloo", gloo), ("hcomm", hc)):
            buf = base.clone()
            dist.all_reduce(buf, group=group)
            wrong = int((buf != expected).sum())
            work = base.clone()
            for _ in range(args.warmup):
                dist.all_reduce(work, group=group)
            seconds = _timed(lambda: dist.all_reduce(work, group=group), args.iters, group)
            t = torch.tensor([seconds], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
            result[name] = (t.item(), wrong)
        algo = (hcomm.last_op(hc) or {}).get("algorithm", "-")
        rows.append((n * 4, result["gloo"], result["hcomm"], algo))
    if rank == 0:
        print(f"all_reduce float32 sum, {world} ranks, {args.iters} iters (max over ranks)")
        print(f"{'bytes':>10} {'gloo us':>10} {'hcomm us':>10} {'hcomm/gloo':>10} {'#wrong':>7} algorithm")
        for nbytes, (tg, wg), (th, wh), algo in rows:
            print(f"{nbytes:>10} {tg * 1e6:>10.1f} {th * 1e6:>10.1f} {th / tg:>10.3f} {wg + wh:>7} {algo}")
        sys.stdout.flush()
    bad = sum(wg + wh for _, (_, wg), (_, wh), _ in rows)
    dist.destroy_process_group()
    if bad:
        raise SystemExit(f"rank {rank}: {bad} wrong elements")


def _spawned(rank: int, world: int, init: str, args: argparse.Namespace) -> None:
    _rank_main(rank, world, init, args)


def _emulated(args: argparse.Namespace) -> Optional[int]:
    """Runs the benchmark on the emulated cluster; None when it cannot."""
    from hcomm.emulate import DEFAULT_PRESET, load_spec, run
    from hcomm.emulate.preflight import message, missing

    lacking = missing()
    if lacking:
        print(f"hcomm demo: the emulator cannot run here ({message(lacking)}); comparing on local ranks instead",
              file=sys.stderr)
        return None
    spec = load_spec(args.cluster or DEFAULT_PRESET)
    print(f"hcomm demo: all_reduce, hcomm vs gloo, on emulated cluster '{spec.name}' "
          f"({spec.world_size} ranks in {len(spec.islands)} islands)", flush=True)
    bench = [sys.executable, "-m", "hcomm", "bench", "all_reduce", "--backends", "gloo,hcomm",
             "--min-bytes", "4K", "--max-bytes", str(args.max_bytes), "--step-factor", "4",
             "--iters", str(args.iters), "--warmup", str(args.warmup), "--no-progress"]
    return run(spec, bench)


def main(argv: Optional[List[str]] = None) -> int:
    args = _parse(list(argv or []))
    if not args.local and "RANK" not in os.environ:
        rc = _emulated(args)
        if rc is not None:
            return rc
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        _rank_main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://", args)
        return 0
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{tmp}/store"
        mp.start_processes(_spawned, args=(args.nprocs, init, args), nprocs=args.nprocs, start_method="spawn")
    return 0
